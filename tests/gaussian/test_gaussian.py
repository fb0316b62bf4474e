"""Tests of transformer_pde.gaussian: closed forms, exact references, PSD, blow-up, batches,
Sinkhorn coupling against POT, and the mean-field limit against the particle engine."""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest

from transformer_pde.attention import Attention, Layers
from transformer_pde import gaussian as g
from transformer_pde.errors import EarlyStopWarning
from transformer_pde.gaussian import member as gaussian_member
from transformer_pde.gaussian import trajectory as gaussian_trajectory
from transformer_pde.results import Result, Status


@contextlib.contextmanager
def _answer():
    """A blow-up, divergence or convergence is an answer: reported in the status, never
    warned (an EarlyStopWarning inside the block is an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        yield


def _rot(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


def _rand_spd(rng, d, scale=1.0, rank=None):
    r = d if rank is None else rank
    X = rng.normal(size=(d, r))
    return scale * X @ X.T / d


def _psd_sqrt(S):
    lam, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.maximum(lam, 0))) @ U.T


# ----------------------------------------------------------------------------- affine fields
def test_affine_formulas_single_head_all_kinds():
    rng = np.random.default_rng(0)
    d = 3
    Q, K, V = rng.normal(size=(3, d, d))
    S = _rand_spd(rng, d)
    a = rng.normal(size=d)
    beta = 0.7
    A = K.T @ Q
    M, b = g.affine_field(Attention("softmax", Q, K, V, beta=beta), a, S)
    np.testing.assert_allclose(M, V @ S @ (beta * A), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(b, V @ a, rtol=1e-13)
    M, b = g.affine_field(Attention("linear", Q, K, V, beta=beta), a, S)
    np.testing.assert_allclose(M, V @ (S + np.outer(a, a)) @ (beta * A), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b, 0.0)
    lb = 0.8
    M, b = g.affine_field(Attention("l2", Q, K, V, l2_beta=lb), a, S)
    G = K.T @ K
    I = np.eye(d)
    np.testing.assert_allclose(M, 2 * lb * V @ S @ np.linalg.inv(I + 2 * lb * G @ S) @ A,
                               rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(b, V @ np.linalg.inv(I + 2 * lb * S @ G) @ a, rtol=1e-11,
                               atol=1e-12)
    # sinkhorn: M = V C^T S^-1 with the coupling's cross-covariance C, for invertible S
    eps = 0.6
    M, b = g.affine_field(Attention("sinkhorn", Q, K, V, beta=beta, eps=eps), a, S)
    C = _spec_sinkhorn_C(beta * A, S, eps)
    np.testing.assert_allclose(M, V @ C.T @ np.linalg.inv(S), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(b, V @ a - M @ a, rtol=1e-10, atol=1e-12)
    # the mean of sinkhorn obeys alpha' = V alpha exactly
    np.testing.assert_allclose(M @ a + b, V @ a, rtol=1e-12, atol=1e-12)


def _spec_sinkhorn_C(A, S, eps):
    """The cross-covariance formula, literally: C = 2 S^1/2 (eps I + R)^-1 S^1/2 A^T S."""
    Sh = _psd_sqrt(S)
    R = _psd_sqrt(4 * Sh @ A.T @ S @ A @ Sh + eps ** 2 * np.eye(len(S)))
    return 2 * Sh @ np.linalg.solve(eps * np.eye(len(S)) + R, Sh @ A.T @ S)


@pytest.mark.parametrize("rankA,rankS", [(1, 3), (3, 1), (2, 2), (1, 1)])
def test_sinkhorn_cross_covariance_singular(rankA, rankS):
    """C = S M0^T (no inverse) equals that C for singular A and singular S, and the
    covariance rate V C^T + C V^T matches M S + S M^T."""
    rng = np.random.default_rng(rankA * 10 + rankS)
    d = 3
    Q = rng.normal(size=(rankA, d))
    K = rng.normal(size=(rankA, d))
    V = rng.normal(size=(d, d))
    S = _rand_spd(rng, d, rank=rankS)
    A = K.T @ Q
    C = g.sinkhorn_cross_covariance(A, S, eps=0.9)
    np.testing.assert_allclose(C, _spec_sinkhorn_C(A, S, 0.9), rtol=1e-9, atol=1e-12)
    M, _ = g.affine_field(Attention("sinkhorn", Q, K, V, eps=0.9), np.zeros(d), S)
    C0 = _spec_sinkhorn_C(A, S, 0.9)
    np.testing.assert_allclose(M @ S + S @ M.T, V @ C0.T + C0 @ V.T, rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(M))


def test_one_dimensional_laws():
    """The 1-D l2 and sinkhorn laws follow from the general formulas."""
    for (q, k, v, s, lb, eps) in [(0.7, 1.3, 0.9, 0.4, 0.5, 1.0), (-1.1, 0.6, 1.7, 2.0, 1.0, 0.3)]:
        _, dS = g.moment_ode(Attention("l2", [[q]], [[k]], [[v]], l2_beta=lb), [0.0], [[s]])
        assert dS[0, 0] == pytest.approx(g.l2_variance_rate_1d(v, q, k, s, lb), rel=1e-13)
        assert dS[0, 0] == pytest.approx(4 * lb * v * k * q * s ** 2 / (1 + 2 * lb * k * k * s),
                                         rel=1e-13)
        a = q * k
        _, dS = g.moment_ode(Attention("sinkhorn", [[q]], [[k]], [[v]], eps=eps), [0.3], [[s]])
        spec = (v / a) * (math.sqrt(eps ** 2 + 4 * a * a * s * s) - eps)
        assert dS[0, 0] == pytest.approx(spec, rel=1e-12)
        assert dS[0, 0] == pytest.approx(g.sinkhorn_variance_rate_1d(v, a, s, eps), rel=1e-13)
    # linear kind, alpha = 0: sigma' = 2 v a sigma^2 (same law as softmax)
    dm, dS = g.moment_ode(Attention("linear", [[0.5]], [[1.5]], [[1.2]]), [0.0], [[0.8]])
    assert dS[0, 0] == pytest.approx(2 * 1.2 * 0.75 * 0.8 ** 2, rel=1e-14)
    assert dm[0] == 0.0


def test_multi_head_and_output_projection():
    rng = np.random.default_rng(3)
    d, H = 4, 2
    Q, K, V, W = rng.normal(size=(4, d, d))
    S = _rand_spd(rng, d)
    a = rng.normal(size=d)
    for kind in ("softmax", "linear", "l2", "sinkhorn"):
        att = Attention(kind, Q, K, V, heads=H, W_O=W)
        M, b = g.affine_field(att, a, S)
        Ms, bs = np.zeros((d, d)), np.zeros(d)
        for h in range(H):
            r = slice(2 * h, 2 * h + 2)
            # head h as a one-head attention with (k, d) Q_h, K_h and a d x d value matrix whose
            # rows outside block h are zero
            Vh = np.zeros((d, d))
            Vh[r] = V[r]
            Mh, bh = g.affine_field(Attention(kind, Q[r], K[r], Vh), a, S)
            Ms += Mh
            bs += bh
        np.testing.assert_allclose(M, W @ Ms, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b, W @ bs, rtol=1e-10, atol=1e-12)


def test_time_dependent_parameters_in_affine_field():
    V = Layers(np.array([[[1.0]], [[-2.0]]]))
    att = Attention("softmax", [[1.0]], [[1.0]], V)
    assert g.affine_field(att, [0.0], [[1.0]], t=0.5)[0][0, 0] == 1.0
    assert g.affine_field(att, [0.0], [[1.0]], t=1.5)[0][0, 0] == -2.0


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("mean,cov,match", [
    ([0.0, 0.0], [[1.0, 0.1], [0.0, 1.0]], "cov must be symmetric"),
    ([0.0, 0.0], [[1.0, 0.0], [0.0, -1.0]], "cov must be positive semi-definite"),
    ([0.0, np.nan], np.eye(2), "mean contains NaN"),
    ([0.0, 0.0], [[1.0, np.nan], [np.nan, 1.0]], "cov contains NaN"),
    ([0.0], np.eye(2), r"mean must have shape"),
    ([0.0, 0.0], np.eye(3), r"cov must have shape"),
])
def test_validation_messages(mean, cov, match):
    att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match=match):
        g.affine_field(att, mean, cov)


@pytest.mark.parametrize("kind", ["sigmoid", "relu", "exp"])
def test_rejects_non_affine_kinds(kind):
    att = Attention(kind, np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="not affine on Gaussian"):
        g.affine_field(att, np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="not affine on Gaussian"):
        g.solve(att, np.zeros(2), np.eye(2), t_max=1.0)


def test_rejects_masked_and_bad_args():
    att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True)
    with pytest.raises(ValueError, match="masked"):
        g.solve_batch(att, np.zeros((1, 2)), np.eye(2)[None], t_max=1.0)
    att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="t_max"):
        g.solve(att, np.zeros(2), np.eye(2), t_max=-1.0)
    with pytest.raises(ValueError, match="covs0 must have shape"):
        g.solve_batch(att, np.zeros((2, 2)), np.eye(2)[None], t_max=1.0)
    with pytest.raises(ValueError, match=r"covs0 must be positive semi-definite \(member 1\)"):
        g.solve_batch(att, np.zeros((2, 2)), np.stack([np.eye(2), -np.eye(2)]), t_max=1.0)
    with pytest.raises(TypeError, match="att must be an Attention"):
        g.solve(None, np.zeros(2), np.eye(2), t_max=1.0)


# ----------------------------------------------------------------------------- exact references
@pytest.mark.parametrize("v,a,s0,m0,beta", [(1.3, 0.7, 0.5, 0.4, 1.0), (0.5, 2.0, 3.0, -1.0, 0.3),
                                            (-1.0, -0.4, 0.2, 2.0, 1.0)])
def test_softmax_1d_exact(v, a, s0, m0, beta):
    att = Attention("softmax", [[a]], [[1.0]], [[v]], beta=beta)
    Tstar = g.blowup_time_softmax_1d(v, a, s0, beta)
    te = np.linspace(0, 0.999 * Tstar, 23)
    tr = g.solve(att, [m0], [[s0]], t_max=10.0, t_eval=te)
    mex, sex = g.exact_softmax_1d(v, a, m0, s0, tr.times, beta)
    assert tr.status == "blowup"
    assert abs(tr.blowup_time / Tstar - 1) < 1e-8
    # compare in the well-conditioned variables 1/sigma and alpha/sqrt(sigma)
    np.testing.assert_allclose(s0 / tr.covs[:, 0, 0], s0 / sex, rtol=0, atol=1e-9)
    np.testing.assert_allclose(tr.means[:, 0] / np.sqrt(tr.covs[:, 0, 0]), mex / np.sqrt(sex),
                               rtol=1e-8, atol=1e-12)
    b = g.solve_batch(att, [[m0]], [[[s0]]], t_max=10.0)
    assert b.status[0] == "blowup" and abs(b.blowup_time[0] / Tstar - 1) < 1e-8


def test_identity_value_exact_blowup_and_limit():
    """V = I, A + A^T > 0: Sigma(t) = (Sigma0^-1 - t(A + A^T))^-1, T* and the rank-one limit."""
    rng = np.random.default_rng(7)
    d = 3
    X = rng.normal(size=(d, d))
    A = X + 2.5 * np.eye(d)
    assert np.linalg.eigvalsh(A + A.T)[0] > 0
    covs = np.stack([_rand_spd(rng, d) for _ in range(4)] + [_rand_spd(rng, d, rank=2)])
    att = Attention("softmax", A, np.eye(d), np.eye(d), beta=0.5)
    b = g.solve_batch(att, np.zeros((5, d)), covs, t_max=100.0)
    for i, S0 in enumerate(covs):
        T = g.blowup_time_identity_value(A, S0, beta=0.5)
        assert b.status[i] == "blowup"
        assert abs(b.blowup_time[i] / T - 1) < 1e-8, (i, b.blowup_time[i], T)
        # exact limit direction: Sigma/trSigma -> u u^T/|u|^2, u = S0^1/2 w (top eigenvector)
        R = _psd_sqrt(S0)
        lam, W = np.linalg.eigh(R @ (0.5 * (A + A.T)) @ R)
        u = R @ W[:, -1]
        np.testing.assert_allclose(b.limit[i], np.outer(u, u) / (u @ u), atol=1e-8)
        tr = g.solve(att, np.zeros(d), S0, t_max=100.0, t_eval=np.linspace(0, 0.99 * T, 9))
        assert abs(tr.blowup_time / T - 1) < 1e-8
        for t, S in zip(tr.times, tr.covs, strict=True):
            ex = g.exact_softmax_identity_value(A, S0, t, beta=0.5)
            np.testing.assert_allclose(S, ex, rtol=1e-8, atol=1e-8 * np.abs(ex).max())


def test_commuting_exact():
    rng = np.random.default_rng(11)
    U = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    V = U @ np.diag([1.0, -0.5, 0.8]) @ U.T
    A = U @ np.diag([0.6, 1.2, -0.3]) @ U.T
    S0 = U @ np.diag([0.7, 0.2, 0.0]) @ U.T   # singular on purpose
    m0 = rng.normal(size=3)
    _, _, Tstar = g.exact_softmax_commuting(V, A, m0, S0, 0.0)
    assert Tstar == pytest.approx(1 / (2 * 0.6 * 0.7))
    att = Attention("softmax", A, np.eye(3), V)
    te = np.linspace(0, 0.95 * Tstar, 7)
    tr = g.solve(att, m0, S0, t_max=5.0, t_eval=te)
    assert tr.status == "blowup" and abs(tr.blowup_time / Tstar - 1) < 1e-8
    for t, m, S in zip(tr.times, tr.means, tr.covs, strict=True):
        mex, Sex, _ = g.exact_softmax_commuting(V, A, m0, S0, t)
        np.testing.assert_allclose(S, Sex, rtol=1e-8, atol=1e-9 * np.abs(Sex).max())
        np.testing.assert_allclose(m, mex, rtol=1e-8, atol=1e-9 * np.abs(mex).max())
    with pytest.raises(ValueError, match="do not commute"):
        g.exact_softmax_commuting(V, _rand_sym(rng), m0, S0, 0.1)


def _rand_sym(rng):
    X = rng.normal(size=(3, 3))
    return X + X.T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_one_stays_rank_one(seed):
    rng = np.random.default_rng(seed)
    d = 3
    V = rng.normal(size=(d, d))
    A = rng.normal(size=(d, d))
    u0 = rng.normal(size=d) / 2
    att = Attention("softmax", A, np.eye(d), V)
    b = g.solve_batch(att, np.zeros((1, d)), np.outer(u0, u0)[None], t_max=2.0,
                      t_eval=np.linspace(0, 2.0, 11))
    ok = np.isfinite(b.traj_covs[0, :, 0, 0])
    ts = b.t_eval[ok]
    covs = b.traj_covs[0, ok]
    for S in covs:
        lam = np.linalg.eigvalsh(S)
        assert lam[-2] <= 1e-14 * lam[-1] + 1e-300 and lam[0] >= -1e-14 * lam[-1]
    Tb = b.blowup_time[0] if b.status[0] == "blowup" else np.inf
    near = ts <= 0.9 * Tb          # the reference clock tau(t) itself diverges at T*
    U = g.exact_rank_one_softmax(V, A, u0, ts[near])
    for S, u in zip(covs[near], U, strict=True):
        np.testing.assert_allclose(S, np.outer(u, u), rtol=1e-8, atol=1e-9 * (u @ u))
    # other kinds keep the rank as well (factor integration)
    for kind in ("linear", "l2", "sinkhorn"):
        tr = g.solve(Attention(kind, A, np.eye(d), V), np.zeros(d), np.outer(u0, u0),
                     t_max=1.0, t_eval=np.linspace(0, 1, 5))
        for S in tr.covs:
            lam = np.linalg.eigvalsh(S)
            assert lam[-2] <= 1e-14 * lam[-1] + 1e-300


def test_linear_kind_exact_blowup():
    """Issue 9: the linear kind blows up in finite time; exact 1-D law with a mean."""
    v, a, m0, s0 = 0.9, 1.1, 0.5, 0.6
    att = Attention("linear", [[a]], [[1.0]], [[v]])
    _, _, Tstar = g.exact_linear_1d(v, a, m0, s0, 0.0)
    assert Tstar == pytest.approx(1 / (2 * v * a * (s0 + m0 ** 2)))
    te = np.linspace(0, 0.99 * Tstar, 9)
    tr = g.solve(att, [m0], [[s0]], t_max=10.0, t_eval=te)
    assert tr.status == "blowup" and abs(tr.blowup_time / Tstar - 1) < 1e-8
    mex, sex, _ = g.exact_linear_1d(v, a, m0, s0, tr.times)
    np.testing.assert_allclose(tr.covs[:, 0, 0], sex, rtol=1e-8)
    np.testing.assert_allclose(tr.means[:, 0], mex, rtol=1e-8)
    # alpha = 0: same law as softmax
    b = g.solve_batch(att, [[0.0]], [[[s0]]], t_max=10.0)
    assert abs(b.blowup_time[0] * 2 * v * a * s0 - 1) < 1e-8


def test_piecewise_layers_exact():
    """Layers (V = +1 then -1): exact piecewise 1-D softmax solution."""
    att = Attention("softmax", [[0.4]], [[1.0]], Layers(np.array([[[1.0]], [[-1.0]]])))
    s0 = 0.5
    te = np.array([0.5, 1.0, 1.5, 2.5])
    s1 = s0 / (1 - 2 * 0.4 * s0 * 1.0)
    ex = np.array([s0 / (1 - 0.4 * s0), s1, s1 / (1 + 0.8 * s1 * 0.5), s1 / (1 + 0.8 * s1 * 1.5)])
    tr = g.solve(att, [0.0], [[s0]], t_max=2.5, t_eval=te)
    np.testing.assert_allclose(tr.covs[:, 0, 0], ex, rtol=1e-9)
    b = g.solve_batch(att, [[0.0]], [[[s0]]], t_max=2.5, t_eval=te)
    np.testing.assert_allclose(b.traj_covs[0, :, 0, 0], ex, rtol=1e-9)
    assert tr.status == b.status[0] == "ok"


# ----------------------------------------------------------------------------- PSD, statuses
@pytest.mark.parametrize("kind", ["softmax", "linear", "l2", "sinkhorn"])
def test_covariance_stays_psd(kind):
    rng = np.random.default_rng(5)
    d = 3
    Q, K, V = rng.normal(size=(3, d, d))
    covs = np.stack([_rand_spd(rng, d, 0.5), _rand_spd(rng, d, 0.5, rank=1),
                     _rand_spd(rng, d, 2.0, rank=2)])
    b = g.solve_batch(Attention(kind, Q, K, V, heads=1), rng.normal(size=(3, d)), covs,
                      t_max=3.0, t_eval=np.linspace(0, 3, 31))
    for i in range(3):
        for S in b.traj_covs[i][np.isfinite(b.traj_covs[i, :, 0, 0])]:
            assert np.array_equal(S, S.T)
            lam = np.linalg.eigvalsh(S)
            assert lam[0] >= -1e-14 * np.trace(S)
        # the rank cannot grow (Sigma = F F^T with F' = M F keeps range(F) = M-image of it);
        # it cannot drop at finite t either, but blow-up makes Sigma/tr Sigma nearly rank one
        rank0 = np.linalg.matrix_rank(covs[i], tol=1e-10 * np.trace(covs[i]))
        for S in b.traj_covs[i][np.isfinite(b.traj_covs[i, :, 0, 0])]:
            lam = np.linalg.eigvalsh(S)
            assert np.all(np.abs(lam[:d - rank0]) <= 1e-14 * np.trace(S))


@pytest.mark.parametrize("kind", ["l2", "sinkhorn"])
def test_l2_and_sinkhorn_never_blow_up(kind):
    rng = np.random.default_rng(9)
    d, B = 2, 8
    atts = []
    for _ in range(B):
        Q, K, V = rng.normal(size=(3, d, d)) * 1.5
        atts.append(Attention(kind, Q, K, V))
    covs = np.stack([_rand_spd(rng, d, 2.0) for _ in range(B)])
    b = g.solve_batch(atts, np.zeros((B, d)), covs, t_max=30.0)
    assert not np.any(b.status == "blowup"), b.messages
    assert np.all(np.isnan(b.blowup_time))
    # 1-D: grows exponentially, classified as diverging
    tr = g.solve(Attention(kind, [[1.0]], [[1.0]], [[1.0]]), [0.0], [[1.0]], t_max=200.0)
    assert tr.status == "diverging", tr.message


def test_converged_and_running_statuses():
    att = Attention("softmax", np.array([[0.0, 0.0], [0.0, 1.0]]), np.eye(2), np.eye(2))
    tr = g.solve(att, np.zeros(2), np.diag([1.0, 0.0]), t_max=5.0)
    assert tr.status == "converged"
    att = Attention("softmax", [[1.0]], [[1.0]], [[-1.0]])   # algebraic decay: undecided
    tr = g.solve(att, [0.0], [[1.0]], t_max=5.0)
    assert tr.status == "ok" and tr.t_final == 5.0
    assert tr.covs[-1, 0, 0] == pytest.approx(1 / (1 + 2 * 5.0), rel=1e-9)


# ----------------------------------------------------------------------------- batch vs solve
@pytest.mark.parametrize("kind", ["softmax", "linear", "l2", "sinkhorn"])
def test_batch_matches_solve(kind):
    rng = np.random.default_rng(21)
    d, B = 2, 4
    atts = [Attention(kind, *rng.normal(size=(3, d, d)), beta=1.0) for _ in range(B)]
    means = rng.normal(size=(B, d)) * 0.5
    covs = np.stack([_rand_spd(rng, d, 0.8) for _ in range(B)])
    te = np.linspace(0, 1.0, 6)
    b = g.solve_batch(atts, means, covs, t_max=4.0, t_eval=te)
    for i in range(B):
        tr = g.solve(atts[i], means[i], covs[i], t_max=4.0, t_eval=te)
        assert tr.status == b.status[i]
        if tr.status == "blowup":
            assert abs(tr.blowup_time / b.blowup_time[i] - 1) < 1e-8
        n = len(tr.times)
        sc = np.abs(tr.covs).max()
        np.testing.assert_allclose(b.traj_covs[i, :n], tr.covs, atol=1e-8 * sc)
        np.testing.assert_allclose(b.traj_means[i, :n], tr.means,
                                   atol=1e-8 * max(1, np.abs(tr.means).max()))


# ----------------------------------------------------------------------------- sinkhorn vs POT
def test_sinkhorn_cross_covariance_matches_pot():
    """Empirical entropic coupling of N samples vs the closed-form C.

    For fixed eps the entropic plan between empirical measures converges to the population
    plan at the parametric rate N^-1/2 (Mena & Niles-Weed 2019), so the empirical
    cross-covariance sum_ij pi_ij (x_i - xbar)(x_j - xbar)^T deviates from C by
    O(||Sigma|| N^-1/2); with N = 1500, N^-1/2 = 0.026 and we allow 4 N^-1/2 relative.
    """
    ot = pytest.importorskip("ot")
    rng = np.random.default_rng(2)
    N = 1500
    Q = np.array([[0.8, 0.3], [-0.2, 0.6]])
    K = np.array([[1.0, 0.0], [0.4, 0.7]])
    beta, eps = 0.9, 0.7
    A = beta * K.T @ Q
    S = np.array([[1.0, 0.4], [0.4, 0.6]])
    alpha = np.array([0.5, -0.3])
    X = rng.multivariate_normal(alpha, S, size=N)
    cost = -(X @ A.T @ X.T)          # cost[i, j] = -x_j^T A x_i  (x_i query, x_j key)
    w = np.full(N, 1.0 / N)
    pi = ot.sinkhorn(w, w, cost, eps, method="sinkhorn_log", numItermax=5000, stopThr=1e-10)
    Xc = X - X.mean(0)
    C_emp = Xc.T @ pi @ Xc
    C = g.sinkhorn_cross_covariance(A, np.cov(X.T, bias=True), eps)
    tol = 4 / math.sqrt(N) * np.linalg.norm(S, 2)
    assert np.abs(C_emp - C).max() < tol, (C_emp, C)
    # and the population C differs from the independent coupling (test has power)
    assert np.abs(C).max() > 5 * tol


# ----------------------------------------------------------------------------- mean field
def _mean_field_case(att, alpha, S, N=2000, t_max=0.6, dt=0.1, seed=0):
    """Particles from N(alpha, S) evolved by the particle engine vs the Gaussian ODE started
    from the sample moments. Finite-N field error ~ N^-1/2 per unit time (the finite-N caveat:
    kappa = ||S^1/2 A S^1/2|| <= 0.5 here, far from T*); RK4 at dt = 0.1 is ~1e-5."""
    from transformer_pde.particles import FieldOptions, simulate

    rng = np.random.default_rng(seed)
    X0 = rng.multivariate_normal(alpha, S, size=N)
    m0 = X0.mean(0)
    S0 = np.cov(X0.T, bias=True)
    traj = simulate(att, X0, t_max=t_max, dt=dt, solver="rk4",
                    field=FieldOptions(backend="numpy"))
    assert traj.status in ("ok", "finished", "done") or not str(traj.status).startswith("blow")
    tr = g.solve(att, m0, S0, t_max=t_max, t_eval=traj.times)
    assert len(tr.times) == len(traj.times)
    scale = math.sqrt(np.trace(S0))
    for k in range(len(traj.times)):
        Xk = traj.states[k]
        dm = np.linalg.norm(Xk.mean(0) - tr.means[k]) / scale
        dS = np.linalg.norm(np.cov(Xk.T, bias=True) - tr.covs[k], 2) / np.linalg.norm(tr.covs[k], 2)
        # 3 N^-1/2 = 0.067: a few standard errors of the fluctuating field
        assert dm < 3 / math.sqrt(N) and dS < 3 / math.sqrt(N), (k, dm, dS)


def _kappa_ok(A, S, bound=0.5):
    R = _psd_sqrt(S)
    return np.linalg.norm(R @ A @ R, 2) <= bound


def test_mean_field_softmax():
    Q = 0.6 * np.array([[0.9, 0.2], [-0.3, 0.7]])
    K = np.eye(2)
    V = np.array([[0.8, -0.4], [0.3, 0.5]])
    S = np.array([[0.4, 0.1], [0.1, 0.3]])
    assert _kappa_ok(K.T @ Q, S * 1.5)
    _mean_field_case(Attention("softmax", Q, K, V), np.array([0.3, -0.2]), S)


def test_mean_field_l2():
    Q = np.array([[0.9, 0.2], [-0.3, 0.7]])
    K = np.array([[0.8, 0.1], [0.0, 0.9]])
    V = np.array([[0.8, -0.4], [0.3, 0.5]])
    S = np.array([[0.4, 0.1], [0.1, 0.3]])
    _mean_field_case(Attention("l2", Q, K, V, l2_beta=0.5), np.array([0.3, -0.2]), S)


def test_mean_field_multi_head():
    rng = np.random.default_rng(4)
    d = 4
    Q = rng.normal(size=(d, d)) * 0.4
    K = rng.normal(size=(d, d)) * 0.4
    V = rng.normal(size=(d, d)) * 0.5
    S = 0.3 * np.eye(d)
    nA = max(np.linalg.norm(h.A, 2) for h in Attention("softmax", Q, K, V, heads=2).at(0).heads)
    Q = Q * 0.9 / nA                 # every head: ||S^1/2 A_h S^1/2|| <= 0.3 * 0.9 * 1.5 < 0.5
    att = Attention("softmax", Q, K, V, heads=2)
    for h in att.at(0).heads:
        assert _kappa_ok(h.A, S * 1.5)
    _mean_field_case(att, np.zeros(d) + 0.1, S, t_max=0.5)


@pytest.mark.slow
def test_mean_field_sinkhorn():
    Q = np.array([[0.9, 0.2], [-0.3, 0.7]])
    K = np.eye(2)
    V = np.array([[0.8, -0.4], [0.3, 0.5]])
    S = np.array([[0.4, 0.1], [0.1, 0.3]])
    _mean_field_case(Attention("sinkhorn", Q, K, V, eps=1.0), np.array([0.3, -0.2]), S,
                     N=1500, t_max=0.4, dt=0.1)


# ----------------------------------------------------------------------------- fast path
@pytest.mark.parametrize("kind,H", [("softmax", 1), ("softmax", 2), ("linear", 1), ("linear", 2),
                                    ("l2", 2), ("sinkhorn", 1)])
def test_numba_path_matches_interpreted_path(kind, H):
    # one integrator, compiled or interpreted: the same steps (statuses and step counts
    # equal) and the same states up to rounding (1e-11 relative after a whole run)
    pytest.importorskip("numba")
    rng = np.random.default_rng(32)
    d, B = 4, 4
    Q, K, V, W = rng.normal(size=(4, d, d)) * 0.5
    att = Attention(kind, Q, K, V, heads=H, W_O=W if H == 2 else None,
                    beta=1.0 if kind == "l2" else 0.8)
    means = rng.normal(size=(B, d)) * 0.3
    covs = np.stack([_rand_spd(rng, d) for _ in range(B)])
    te = np.linspace(0, 2, 5)
    b1 = g.solve_batch(att, means, covs, t_max=3.0, t_eval=te)
    b2 = g.solve_batch(att, means, covs, t_max=3.0, t_eval=te, use_numba=False)
    assert list(b1.status) == list(b2.status)
    np.testing.assert_array_equal(b1.n_steps, b2.n_steps)
    np.testing.assert_allclose(b1.blowup_time, b2.blowup_time, rtol=1e-11)
    np.testing.assert_allclose(b1.t_final, b2.t_final, rtol=1e-11)
    np.testing.assert_allclose(b1.traj_covs, b2.traj_covs, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(b1.traj_means, b2.traj_means, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(b1.limit, b2.limit, rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------- growth laws
def _rank_sweep_l2_members(members, d=5, draws=100):
    """The draws of ``cli.rank_sweep("l2", 5, draws=100)`` (seed 0, V = I, paper scaling)."""
    rng = np.random.default_rng([0, d, 0])
    atts = []
    for _ in range(draws):
        Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
        atts.append(Attention("l2", Q / np.sqrt(d), K, np.eye(d), l2_beta=1.0))
    F = rng.normal(size=(draws, d, d))
    covs = F @ np.swapaxes(F, -1, -2) / d
    return [atts[i] for i in members], covs[members]


def test_l2_full_rank_keys_reach_threshold_as_diverging():
    # regression (issue 6): at blowup_threshold=1e3 these members of the l2 rank sweep were
    # classified "blowup" (extrapolated q = 1.13, T* = 18.2) although a full-rank K keeps M
    # bounded (blowup_law = 0): reaching the threshold must read "diverging"
    atts, covs = _rank_sweep_l2_members([4, 22, 99])
    assert all(g.blowup_law(a) == 0.0 for a in atts)
    kw = dict(t_max=30.0, blowup_threshold=1e3, rtol=1e-6, atol=1e-9)
    b = g.solve_batch(atts, np.zeros((3, 5)), covs, max_steps=2000, **kw)
    assert list(b.status) == ["diverging"] * 3, b.messages
    assert np.all(np.isnan(b.blowup_time))
    # limit is the shape Sigma/tr Sigma where the growth was measured (past the threshold,
    # at tr Sigma = 1e10), not an extrapolation: trace one, and the same for another threshold
    np.testing.assert_allclose(np.trace(b.limit, axis1=1, axis2=2), 1.0, rtol=1e-12)
    b5 = g.solve_batch(atts, np.zeros((3, 5)), covs, max_steps=2000,
                       **dict(kw, blowup_threshold=1e5))
    assert list(b5.status) == ["diverging"] * 3
    np.testing.assert_allclose(b5.limit, b.limit, atol=1e-5)   # rtol 1e-6 integration
    tr = g.solve(atts[0], np.zeros(5), covs[0], **kw)
    assert tr.status == "diverging" and math.isnan(tr.blowup_time), tr.message


def test_blowup_law_by_kind():
    rng = np.random.default_rng(3)
    Q, K, V = rng.normal(size=(3, 4, 4))
    assert g.blowup_law(Attention("softmax", Q, K, V, heads=2)) == 1.0
    assert g.blowup_law(Attention("linear", Q, K, V)) == 1.0
    assert g.blowup_law(Attention("sinkhorn", Q, K @ np.diag([1, 1, 1, 0.0]), V)) == 0.0
    assert g.blowup_law(Attention("l2", Q, K, V)) == 0.0
    # rank-deficient keys, and heads (K_h is k x d with k < d): ker K is not damped
    assert g.blowup_law(Attention("l2", Q, K @ np.diag([1, 1, 1, 0.0]), V)) == 0.5
    assert g.blowup_law(Attention("l2", Q, K, V, heads=2)) == 0.5


@pytest.mark.parametrize("u2,extra", [(1.0, 0.0), (2.0, 0.0), (1.0, 0.1)])
def test_l2_singular_keys_blow_up(u2, extra):
    # K = diag(1, 0), Q = e1 e2^T, V = diag(0, 1), beta' = 1/2 (so 2 beta' = 1) and
    # Sigma0 = u u^T, u = (1, u2): M = V Sigma K^T (I + K Sigma K^T)^-1 Q = u1/(1 + u1^2) V u e2^T,
    # u' = M u = u1 u2/(1 + u1^2) (0, u2): u1 stays 1, u2' = u2^2 / 2, so u2 = 2 u2(0)/(2 - u2(0) t),
    # T* = 2/u2(0) exactly and
    # tr Sigma ~ 4/(T* - t)^2 (q -> 1/2, the extremal l2 law): the claim "l2 never blows up"
    # holds only for full-rank K.  (extra > 0: a full-rank Sigma0, T* only checked to exist.)
    att = Attention("l2", [[0.0, 1.0], [0.0, 0.0]], np.diag([1.0, 0.0]), np.diag([0.0, 1.0]))
    S0 = np.outer([1.0, u2], [1.0, u2]) + extra * np.eye(2)
    tr = g.solve(att, np.zeros(2), S0, t_max=10.0)
    b = g.solve_batch(att, np.zeros((1, 2)), S0[None], t_max=10.0)
    assert tr.status == b.status[0] == "blowup", (tr.message, b.messages)
    if extra == 0.0:
        # extrapolation error ~ (T*-t)^3 ~ 1e-11 at tr Sigma = 1e8; rtol 1e-10 integration
        assert tr.blowup_time == pytest.approx(2.0 / u2, rel=1e-8)
        assert b.blowup_time[0] == pytest.approx(2.0 / u2, rel=1e-8)
        np.testing.assert_allclose(tr.limit, [[0, 0], [0, 1.0]], atol=1e-8)
        te = np.array([0.5 / u2, 1.0 / u2])
        tr = g.solve(att, np.zeros(2), S0, t_max=10.0, t_eval=te)
        u = np.stack([np.ones(2), 2 * u2 / (2 - u2 * te)], axis=1)
        np.testing.assert_allclose(tr.covs, u[:, :, None] * u[:, None, :], rtol=1e-9)
    else:
        assert 2.0 < tr.blowup_time < 3.0
        assert abs(tr.blowup_time / b.blowup_time[0] - 1) < 1e-8


def test_parallel_kernel_matches_serial_kernel(monkeypatch):
    # members are independent and each writes only its own rows, so the prange kernel must
    # reproduce the serial one bit for bit (same per-member arithmetic); force it on a
    # small batch (it is otherwise used from PAR_MIN_MEMBERS members on)
    pytest.importorskip("numba")
    rng = np.random.default_rng(8)
    d, B = 3, 6
    atts = [Attention("softmax", *rng.normal(size=(3, d, d)) * 0.7) for _ in range(B)]
    means = rng.normal(size=(B, d)) * 0.3
    covs = np.stack([_rand_spd(rng, d) for _ in range(B)])
    te = np.linspace(0, 1.5, 4)
    ser = g.solve_batch(atts, means, covs, t_max=2.0, t_eval=te)
    monkeypatch.setattr(gaussian_member, "PAR_MIN_MEMBERS", 1)
    par = g.solve_batch(atts, means, covs, t_max=2.0, t_eval=te)
    assert list(par.status) == list(ser.status)
    np.testing.assert_array_equal(par.n_steps, ser.n_steps)
    np.testing.assert_array_equal(par.blowup_time, ser.blowup_time)
    np.testing.assert_array_equal(par.traj_covs, ser.traj_covs)
    np.testing.assert_array_equal(par.covs, ser.covs)


def test_l2_singular_keys_oscillating_growth_is_not_blowup():
    # l2 with a zero key column (blowup_law 0.5): this draw grows exponentially along rotating
    # modes, so q = -dtau/dt oscillates; at tr Sigma = 1e10 it reads q = 0.82 > 1.5 * 0.5,
    # faster than any l2 singularity (q -> 1/p <= 1/2), hence "diverging", not "blowup"
    rng = np.random.default_rng(1)
    d, B = 3, 60
    draws = []
    for _ in range(B):
        Q, K, V = rng.normal(size=(3, d, d))
        K[:, 0] = 0.0
        draws.append((Q / np.sqrt(d), K, V))
    F = rng.normal(size=(B, d, d))
    Q, K, V = draws[53]
    att = Attention("l2", Q, K, V, l2_beta=1.0)
    assert g.blowup_law(att) == 0.5
    tr = g.solve(att, np.zeros(d), F[53] @ F[53].T / d, t_max=30.0, blowup_threshold=1e10)
    assert tr.status == "diverging" and "oscillating" in tr.message, tr.message


# ----------------------------------------------------------------------------- issue 18 defects
_SOFTMAX_1D = dict(Q=[[1.0]], K=[[1.0]], V=[[1.0]])      # sigma' = 2 sigma^2, T* = 1/(2 s0)


@pytest.mark.parametrize("use_numba", [True, False])
def test_final_states_land_on_the_threshold(use_numba):
    # issue 18.3: 1-D sigma' = 2 sigma^2, threshold 1e3: the final variance is 1000 (to the
    # 1e-12 landing tolerance), as for solve (root finding on its terminal event)
    att = Attention("softmax", **_SOFTMAX_1D)
    s0 = np.array([1.0, 0.5, 0.25])
    with _answer():
        b = g.solve_batch(att, np.zeros((3, 1)), s0[:, None, None], t_max=5.0,
                          blowup_threshold=1e3, use_numba=use_numba)
    assert list(b.status) == ["blowup"] * 3
    np.testing.assert_allclose(b.covs[:, 0, 0], 1e3, rtol=1e-11)
    # the final time is the exact time of sigma = 1000: (1 - s0/1000) / (2 s0)
    np.testing.assert_allclose(b.t_final, (1 - s0 / 1e3) / (2 * s0), rtol=1e-9)
    with _answer():
        tr = g.solve(att, [0.0], [[1.0]], t_max=5.0, blowup_threshold=1e3)
    assert tr.covs[-1, 0, 0] == pytest.approx(1e3, rel=1e-11)


def _paper_blowup_grid(step=37):
    """Every ``step``-th matrix of the paper's fig. 2a grid (trace one, inside the cone) and
    its softmax attention (A = K^T Q / sqrt(2), V = I): exact T* for V = I."""
    Q = np.array([[-0.09678415830991538, 0.42220166048145347],
                  [-0.22546156340099752, -0.6379430932117882]])
    K = np.array([[-0.01628630369574242, 1.0442167783791647],
                  [-1.0848803286340662, -2.2059248271588077]])
    u = np.linspace(-1, 1, 40)
    U, W = np.meshgrid(u, u, indexing="ij")
    keep = 1 - U ** 2 > W ** 2
    uu, ww = U[keep][::step], W[keep][::step]
    covs = np.stack([np.stack([(1 + uu) / 2, ww / 2], -1), np.stack([ww / 2, (1 - uu) / 2], -1)],
                    -2)
    return Attention("softmax", Q / np.sqrt(2), K, np.eye(2)), covs, K.T @ Q / np.sqrt(2)


@pytest.mark.parametrize("use_numba", [True, False])
def test_blowup_time_and_limit_do_not_depend_on_threshold(use_numba):
    # issue 18.5: at the paper's threshold 1e3 T* and the limit shape were off by 1.2e-3 and
    # 0.3; they are measured past the drawing threshold now: equal to 1e-8 for 1e3 and 1e8,
    # and T* equal to the exact 1/lambda_max(S0^1/2 (A + A^T) S0^1/2) (V = I)
    att, covs, A = _paper_blowup_grid()
    B = len(covs)
    res = {}
    for thr in (1e3, 1e8):
        with _answer():
            res[thr] = g.solve_batch(att, np.zeros((B, 2)), covs, t_max=30.0,
                                     blowup_threshold=thr, use_numba=use_numba)
    lo, hi = res[1e3], res[1e8]
    assert list(lo.status) == list(hi.status) and np.sum(lo.status == "blowup") >= 5
    blow = lo.status == "blowup"
    np.testing.assert_allclose(lo.blowup_time[blow], hi.blowup_time[blow], rtol=1e-8)
    np.testing.assert_allclose(lo.limit, hi.limit, rtol=0, atol=1e-8)
    exact = np.array([g.blowup_time_identity_value(A, S) for S in covs[blow]])
    np.testing.assert_allclose(lo.blowup_time[blow], exact, rtol=1e-8)
    np.testing.assert_allclose(np.trace(lo.covs[blow], axis1=1, axis2=2), 1e3, rtol=1e-11)
    if use_numba:
        i = int(np.nonzero(blow)[0][0])
        for thr in (1e3, 1e8):
            with _answer():
                tr = g.solve(att, np.zeros(2), covs[i], t_max=30.0, blowup_threshold=thr)
            assert tr.blowup_time == pytest.approx(exact[0], rel=1e-8)
            np.testing.assert_allclose(tr.limit, hi.limit[i], atol=1e-8)


@pytest.mark.parametrize("use_numba", [True, False])
def test_algebraic_convergence_is_converged(use_numba):
    # issue 18.4: sigma' = -2 sigma^2 (sigma = 1/(1 + 2t) -> 0) and a covariance tending to a
    # line (second eigenvalue frozen) approach their limits like 1/t: "converged" under the
    # default criterion, never under the relative one alone
    att = Attention("softmax", np.diag([1.0, 0.0]), np.eye(2), -np.eye(2))
    covs = np.stack([np.diag([1.0, 0.0]), np.diag([1.0, 0.5]), np.array([[1.0, 0.2], [0.2, 0.3]])])
    b = g.solve_batch(att, np.zeros((3, 2)), covs, t_max=1e5, use_numba=use_numba)
    assert list(b.status) == ["converged"] * 3, b.messages
    assert all("algebraic" in m for m in b.messages)
    assert np.all(b.t_final < 5e3) and np.all(b.success)
    # the first eigen-direction decays like 1/(1 + 2t) from 1 (the test has power: at t_final
    # it is still far from 0 relative to its start, so no relative test could pass)
    np.testing.assert_allclose(b.covs[0, 0, 0], 1 / (1 + 2 * b.t_final[0]), rtol=1e-8)
    np.testing.assert_allclose(b.covs[1, 1, 1], 0.5, rtol=1e-9)     # frozen direction
    b = g.solve_batch(att, np.zeros((1, 2)), covs[:1], t_max=1e3, convergence="relative",
                      use_numba=use_numba)
    assert b.status[0] == "ok" and b.t_final[0] == 1e3


def test_algebraic_convergence_solve_and_paper_criteria():
    att = Attention("softmax", **dict(_SOFTMAX_1D, V=[[-1.0]]))
    tr = g.solve(att, [0.0], [[1.0]], t_max=1e5)
    assert tr.status == "converged" and "algebraic" in tr.message and tr.t_final < 5e3
    # the paper's criteria: tr Sigma < tol_low (exactly at t = (1/tol - 1)/2) and
    # |Sigma'|_F = 2 sigma^2 < tol
    tr = g.solve(att, [0.0], [[1.0]], t_max=1e5, convergence="trace", converge_tol=1e-4)
    assert tr.status == "converged" and tr.t_final == pytest.approx((1e4 - 1) / 2, rel=1e-9)
    tr = g.solve(att, [0.0], [[1.0]], t_max=1e5, convergence="absolute", converge_tol=2e-6)
    assert tr.status == "converged" and tr.covs[-1, 0, 0] == pytest.approx(1e-3, rel=1e-8)
    for nb in (True, False):
        b = g.solve_batch(att, [[0.0]], [[[1.0]]], t_max=1e5, convergence="trace",
                          converge_tol=1e-4, use_numba=nb)
        assert b.status[0] == "converged" and b.covs[0, 0, 0] <= 1e-4
        assert b.covs[0, 0, 0] > 0.5e-4            # stopped within a step of the crossing
    with pytest.raises(ValueError, match="convergence must be one of"):
        g.solve(att, [0.0], [[1.0]], t_max=1.0, convergence="paper")


def test_solve_step_budget_is_max_steps_with_warning(monkeypatch):
    # issue 18.6: a solve whose step budget runs out reports it (status, success, warning)
    monkeypatch.setattr(gaussian_trajectory, "STIFF_STEPS", 5)
    monkeypatch.setattr(gaussian_trajectory, "IMPLICIT_STEPS", 5)
    att = Attention("softmax", [[1.0, 0.3], [-0.3, 0.5]], np.eye(2), [[0.2, -1.0], [1.0, 0.1]])
    with pytest.warns(EarlyStopWarning, match="max_steps: stopped at t=.* step budget"):
        tr = g.solve(att, np.zeros(2), 0.01 * np.eye(2), t_max=50.0, convergence="relative")
    assert tr.status == "max_steps" and not tr.success and tr.t_final < 50.0
    # warn=False: the same result, the status its only report
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        quiet = g.solve(att, np.zeros(2), 0.01 * np.eye(2), t_max=50.0,
                        convergence="relative", warn=False)
    assert quiet.status == "max_steps" and quiet.message == tr.message
    with pytest.raises(TypeError, match="warn must be True or False"):
        g.solve(att, np.zeros(2), 0.01 * np.eye(2), t_max=50.0, warn="no")


def test_result_protocol():
    att = Attention("softmax", **_SOFTMAX_1D)
    te = np.linspace(0, 0.4, 5)
    with _answer():
        tr = g.solve(att, [0.0], [[1.0]], t_max=1.0, t_eval=te)
    assert isinstance(tr, Result) and tr.status is Status.BLOWUP and tr.success
    means, covs = tr.moments()
    assert means.shape == (5, 1) and covs.shape == (5, 1, 1)
    tr = g.solve(att, [0.0], [[0.1]], t_max=1.0)
    assert tr.status == "ok" and tr.success and "undecided" in tr.message
    with _answer():
        b = g.solve_batch(att, [[0.0], [0.0]], [[[1.0]], [[0.1]]], t_max=1.0, t_eval=te)
    assert list(b.status) == ["blowup", "ok"] and b.success.tolist() == [True, True]
    assert b.counts()["blowup"] == 1 and b.counts()["ok"] == 1 and "2 members" in b.message
    ms, cs = b.moments()
    assert ms.shape == (2, 5, 1) and cs.shape == (2, 5, 1, 1)
    m0 = b[0]
    assert isinstance(m0, Result) and m0.status == "blowup"
    assert m0.times[-1] == b.t_final[0] and m0.covs[-1, 0, 0] == pytest.approx(1e8, rel=1e-11)
    np.testing.assert_array_equal(b[1].times, np.append(te, 1.0))   # + the final state
    b = g.solve_batch(att, [[0.0]], [[[0.1]]], t_max=1.0)
    with pytest.raises(ValueError, match="t_eval"):
        b.moments()


def test_transient_threshold_crossing_is_not_diverging():
    # the paper's "initial" figure, L2 variant (kernel exp(-|Qx/sqrt 2 - Ky|^2)), grid point 9:
    # tr Sigma crosses 1e3 at t ~ 59.4 and the exact flow then converges (full-rank K: L2
    # cannot blow up): the path stops on the threshold, the status is "converged", not
    # "diverging" (unbounded growth)
    Q = np.array([[0.6764132657544725, 1.5210991859339182],
                  [-0.5118762450490144, 1.150194635377595]])
    K = np.array([[-0.5907168066359194, -0.7687652516461853],
                  [-0.33500916605030867, 0.09299944353450965]])
    V = np.array([[1.8317530059587854, -0.37688784393619434],
                  [0.34811234158600607, -0.11628155656536983]])
    u = np.linspace(-1, 1, 30)
    U, W = np.meshgrid(u, u, indexing="ij")
    keep = 1 - U ** 2 > W ** 2
    uu, ww = U[keep][9], W[keep][9]
    S0 = np.array([[(1 + uu) / 2, ww / 2], [ww / 2, (1 - uu) / 2]])
    att = Attention("l2", Q / np.sqrt(2), K, V, l2_beta=1.0)
    tr = g.solve(att, np.zeros(2), S0, t_max=100.0, blowup_threshold=1e3)
    b = g.solve_batch(att, np.zeros((1, 2)), S0[None], t_max=100.0, blowup_threshold=1e3)
    for status, t_fin, cov, msg in ((tr.status, tr.t_final, tr.final_cov, tr.message),
                                    (b.status[0], b.t_final[0], b.covs[0], b.messages[0])):
        assert status == "converged" and "transiently" in msg, msg
        assert 55 < t_fin < 65 and np.trace(cov) == pytest.approx(1e3, rel=1e-11)
