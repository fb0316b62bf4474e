"""Tests of transformer_pde.diagnostics against independent references.

References used: closed forms (translates, 1-D quantile coupling, the 1-D softmax variance
law, Brenier maps between Gaussians), scipy's assignment solver and single-linkage
clustering, and hypothesis-generated measures/attentions from transformer_pde.testing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment

import transformer_pde as tp
from transformer_pde import diagnostics as D
from transformer_pde.gaussian import GaussianTrajectory
from transformer_pde.particles import ParticleTrajectory
from transformer_pde.testing import (
    attentions,
    compact_measures,
    measures,
    rotations,
    spd_matrices,
)

FAST = settings(max_examples=25, deadline=None)


def _ptraj(states, times=None, attention=None, status="ok"):
    """A ParticleTrajectory holding ``states`` (T, N, d) with equal weights."""
    states = np.asarray(states, dtype=float)
    T, N = states.shape[:2]
    times = np.arange(T, dtype=float) if times is None else np.asarray(times, dtype=float)
    return ParticleTrajectory(times, states, np.full(N, 1 / N), None, status, "",
                              attention=attention)


def _entropy(w):
    w = np.asarray(w)
    return float(-(w * np.log(w)).sum())


# ----------------------------------------------------------------------------- W2
def test_translates_all_methods():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    delta = np.array([0.3, -0.4])
    # exact and Sinkhorn: W2 of translates is |delta| exactly (Sinkhorn: the translated
    # plan has zero mean displacement, so the debiased divergence is |delta|^2 at
    # convergence; the default marginal tolerance 1e-3 leaves ~2e-4 relative (measured):
    # allow 1e-3; tol = 1e-6 leaves ~1e-7 (measured): allow 1e-5)
    assert D.wasserstein(X, X + delta) == pytest.approx(0.5, rel=1e-9)
    assert D.wasserstein(X, X + delta, method="sinkhorn") == pytest.approx(0.5, rel=1e-3)
    assert D.wasserstein(X, X + delta, method="sinkhorn",
                         rel_reg=0.1, tol=1e-6) == pytest.approx(0.5, rel=1e-5)
    # sliced: sqrt(d) SW2 = |delta| in expectation over directions; with 2000 directions in
    # d = 2 the relative error of the mean of cos^2 is ~ 0.71/sqrt(2000) = 1.6 %: allow 6 %
    assert D.wasserstein(X, X + delta, method="sliced",
                         n_projections=2000) == pytest.approx(0.5, rel=0.06)


def test_auto_uses_exact_for_small_inputs():
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(30, 3)), rng.normal(size=(20, 3))
    assert D.wasserstein(X, Y, method="auto") == D.wasserstein(X, Y, method="exact")


@FAST
@given(n=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_one_dimensional_quantile_coupling(n, seed):
    # in 1-D, equal uniform sizes: the optimal plan matches sorted samples (independent reference)
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=n), rng.normal(size=n) * 2 + 1
    ref = math.sqrt(np.mean((np.sort(x) - np.sort(y)) ** 2))
    assert D.wasserstein(x[:, None], y[:, None]) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    # sliced is exact in d = 1 (every direction is +-1)
    assert D.wasserstein(x[:, None], y[:, None], method="sliced") == pytest.approx(
        ref, rel=1e-9, abs=1e-12)


@FAST
@given(mx=measures(d=(1, 3), n=(1, 7)), seed=st.integers(0, 1000))
def test_exact_matches_assignment(mx, seed):
    # uniform weights, equal sizes: an optimal plan is a permutation (Birkhoff), so exact W2
    # equals the optimal assignment cost from scipy (tolerance: LP round-off)
    rng = np.random.default_rng(seed)
    Y = rng.uniform(-1, 1, size=mx.X.shape)
    C = ((mx.X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    r, c = linear_sum_assignment(C)
    ref = math.sqrt(C[r, c].mean())
    assert D.wasserstein(mx.X, Y) == pytest.approx(ref, rel=1e-8, abs=1e-10)


@settings(max_examples=15, deadline=None)
@given(mx=measures(d=(1, 3), n=(2, 12), weighted=None),
       my=measures(d=3, n=(2, 12), weighted=None))
def test_methods_agree_within_documented_error(mx, my):
    d = mx.d
    X, Y = mx.X, my.X[:, :d] + 0.5
    exact = D.wasserstein(X, Y, weights_x=mx.weights, weights_y=my.weights)
    # sliced: sqrt(d) SW2 <= W2 in expectation; 500 directions give a relative error of the
    # squared estimate ~ sqrt(2/500) = 6 %: allow 10 % on the distance (about 3 sigma)
    sliced = D.wasserstein(X, Y, weights_x=mx.weights, weights_y=my.weights, method="sliced")
    assert sliced <= 1.10 * exact + 1e-12
    # Sinkhorn divergence: the guaranteed bracket of the docstring
    reg = 0.05
    s = D.wasserstein(X, Y, weights_x=mx.weights, weights_y=my.weights, method="sinkhorn",
                      reg=reg, tol=1e-8, max_iter=5000) ** 2
    Ha, Hb = _entropy(mx.w), _entropy(my.w)
    slack = 1e-4  # Sinkhorn stopping error (marginal error times costs <= ~10)
    assert s >= exact ** 2 - 0.5 * reg * (Ha + Hb) - slack
    assert s <= exact ** 2 + reg * min(Ha, Hb) + slack


def test_sinkhorn_converges_at_default_settings(caplog):
    # N = 300 in 2-D at the default rel_reg = 1e-2, tol = 1e-3: the epsilon-scaled,
    # Anderson-accelerated solver converges well within max_iter.
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 2))
    Y = rng.normal(size=(300, 2)) * [1.5, 0.7] + [1.0, 0.0]
    with caplog.at_level("WARNING", logger="transformer_pde.diagnostics"):
        info = D.wasserstein_result(X, Y, method="sinkhorn")
    s = info.value
    assert s == D.wasserstein(X, Y, method="sinkhorn")
    assert info.converged and not caplog.records
    assert max(info.n_iter) < 300
    assert max(info.err) < 1e-3
    # documented bracket (uniform weights: H = log N for both), and the value is much
    # closer in practice: measured 2e-3 relative on the square; allow 1e-2
    exact = D.wasserstein(X, Y)
    H, reg = math.log(300), info.reg
    assert exact ** 2 - reg * H - 1e-3 <= s ** 2 <= exact ** 2 + reg * H + 1e-3
    assert s ** 2 == pytest.approx(exact ** 2, rel=1e-2)
    assert info.divergence == pytest.approx(s ** 2, rel=1e-12)


def test_sinkhorn_converges_on_clustered_clouds():
    # three tight clusters with sampled (so unequal) masses: mass must cross between clusters
    # where the kernel is ~exp(-100): unguarded Anderson acceleration can cycle here; the
    # dual-objective safeguard and per-stage tracking must converge.
    rng = np.random.default_rng(1)
    n = 300
    c = rng.normal(size=(3, 2)) * 3
    X = c[rng.integers(0, 3, n)] + 1e-3 * rng.normal(size=(n, 2))
    Y = c[rng.integers(0, 3, n)] + 1e-3 * rng.normal(size=(n, 2)) + 0.1
    info = D.wasserstein_result(X, Y, method="sinkhorn")
    s = info.value
    assert info.converged and max(info.n_iter) < 500
    exact = D.wasserstein(X, Y)
    H, reg = math.log(n), info.reg
    slack = 0.05  # tol 1e-3 on the marginals times costs up to ~50
    assert exact ** 2 - reg * H - slack <= s ** 2 <= exact ** 2 + reg * H + slack
    # measured 2e-3 relative on the distance: allow 2 %
    assert s == pytest.approx(exact, rel=2e-2)


def test_sinkhorn_far_from_origin():
    # the solver expands |x - y|^2 = |x|^2 - 2 x.y + |y|^2, which would cancel
    # catastrophically 3e5 away from the origin (|x|^2/eps ~ 1e13; measured 1e-6 relative
    # error already at 3e4 uncentred) without the centring:
    # the shifted clouds must give the unshifted value (the centred points differ only by
    # round-off ~1e-11 of the shift, so allow 1e-6 relative)
    rng = np.random.default_rng(5)
    X, Y = rng.normal(size=(80, 2)), rng.normal(size=(70, 2)) + [0.5, 0.0]
    ref = D.wasserstein(X, Y, method="sinkhorn")
    shift = np.array([1e5, -3e5])
    assert D.wasserstein(X + shift, Y + shift, method="sinkhorn") == pytest.approx(ref, rel=1e-6)


def test_sinkhorn_not_converged_is_reported():
    from transformer_pde.errors import ConvergenceWarning

    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(40, 2)), rng.normal(size=(30, 2)) + 1.0
    with pytest.warns(ConvergenceWarning, match="not converged"):
        info = D.wasserstein_result(X, Y, method="sinkhorn", max_iter=3)
    assert not info.converged and max(info.n_iter) == 3
    with pytest.raises(ValueError, match="max_iter"):
        D.wasserstein(X, Y, method="sinkhorn", max_iter=0)


@settings(max_examples=10, deadline=None)
@given(mx=measures(d=(1, 3), n=(2, 30), weighted=None),
       my=measures(d=3, n=(2, 30), weighted=None),
       reg=st.sampled_from([0.05, 0.3, 2.0]))
def test_sinkhorn_cost_matches_pot(mx, my, reg):
    # independent reference: POT's log-domain Sinkhorn plan, converged to 1e-12, and its
    # transport cost <P, C>.  Both plans are the same entropic plan up to their stopping
    # errors (ours: relative marginal error < 1e-9), and costs are <= ~40 here: allow 1e-6.
    import ot

    d = mx.d
    X, Y = mx.X, my.X[:, :d] + 0.5
    a, b = mx.w / mx.w.sum(), my.w / my.w.sum()
    M = ot.dist(X, Y)
    P = ot.sinkhorn(a, b, M, reg, method="sinkhorn_log", stopThr=1e-13, numItermax=100_000)
    run = D.distances._sinkhorn_cost(X, Y, a, b, reg, 20_000, 1e-9)
    assert run.converged
    assert run.cost == pytest.approx(float((P * M).sum()), abs=1e-6)


def test_wasserstein_errors():
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="method"):
        D.wasserstein(X, X, method="nope")
    with pytest.raises(ValueError, match="Y"):
        D.wasserstein(X, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="weights_x"):
        D.wasserstein(X, X, weights_x=[1, -1, 1])
    with pytest.raises(ValueError, match="NaN"):
        D.wasserstein(X, np.full((2, 2), np.nan))


# ----------------------------------------------------------------------------- Bures-Wasserstein
def _bw_reference(m1, S1, m2, S2):
    r1 = scipy.linalg.sqrtm(S1).real
    cross = scipy.linalg.sqrtm(r1 @ S2 @ r1).real
    return math.sqrt(max(np.sum((m1 - m2) ** 2) + np.trace(S1 + S2 - 2 * cross), 0.0))


@FAST
@given(S1=spd_matrices(3), S2=spd_matrices(3), R=rotations(3),
       m=st.lists(st.floats(-1, 1), min_size=3, max_size=3))
def test_bures_wasserstein_formula_and_invariance(S1, S2, R, m):
    m1, m2 = np.zeros(3), np.asarray(m)
    ref = _bw_reference(m1, S1, m2, S2)  # scipy sqrtm: an independent computation
    val = D.bures_wasserstein(m1, S1, m2, S2)
    assert val == pytest.approx(ref, rel=1e-7, abs=1e-7)
    # rotation invariance and symmetry
    assert D.bures_wasserstein(R @ m1, R @ S1 @ R.T, R @ m2, R @ S2 @ R.T) == pytest.approx(
        val, rel=1e-7, abs=1e-7)
    assert D.bures_wasserstein(m2, S2, m1, S1) == pytest.approx(val, rel=1e-7, abs=1e-7)


def test_bures_wasserstein_singular():
    # Dirac masses: distance of the centres
    assert D.bures_wasserstein([0, 0], np.zeros((2, 2)), [3, 4], np.zeros((2, 2))) == 5.0
    # measures on orthogonal lines: every coupling costs E X1^2 + E Y2^2 = 2
    assert D.bures_wasserstein([0, 0], np.diag([1.0, 0]), [0, 0], np.diag([0, 1.0])) == \
        pytest.approx(math.sqrt(2), rel=1e-12)
    # commuting case: sum (sqrt(l) - sqrt(m))^2, with a zero eigenvalue
    val = D.bures_wasserstein([0, 0], np.diag([4.0, 0]), [0, 0], np.diag([1.0, 9.0]))
    assert val == pytest.approx(math.sqrt(1 + 9), rel=1e-12)
    with pytest.raises(ValueError, match="positive semi-definite"):
        D.bures_wasserstein([0], [[-1.0]], [0], [[1.0]])


def test_bures_wasserstein_equals_exact_w2_of_gaussian_samples():
    # The Gaussian OT map T = S1^{-1/2} (S1^{1/2} S2 S1^{1/2})^{1/2} S1^{-1/2} is the gradient of
    # a convex function, hence optimal between any measure and its image (Brenier): for a
    # sample X of N(m1, S1), exact W2(X, T X) must equal the matched cost, and the matched
    # cost converges to BW(N(m1,S1), N(m2,S2)) at the Monte-Carlo rate.
    rng = np.random.default_rng(2)
    S1 = np.array([[1.0, 0.3], [0.3, 0.5]])
    S2 = np.array([[0.4, -0.2], [-0.2, 1.5]])
    m1, m2 = np.array([0.0, 1.0]), np.array([1.0, -0.5])
    r1 = scipy.linalg.sqrtm(S1).real
    r1i = np.linalg.inv(r1)
    T = r1i @ scipy.linalg.sqrtm(r1 @ S2 @ r1).real @ r1i
    X = rng.multivariate_normal(m1, S1, size=400)
    Y = m2 + (X - m1) @ T.T
    matched = np.sum((X - Y) ** 2, axis=1)
    exact = D.wasserstein(X, Y)
    assert exact ** 2 == pytest.approx(matched.mean(), rel=1e-8)  # Brenier optimality
    bw = D.bures_wasserstein(m1, S1, m2, S2)
    se = matched.std() / math.sqrt(len(matched))  # Monte-Carlo standard error of W2^2
    assert abs(exact ** 2 - bw ** 2) < 5 * se
    # independent samples in 1-D: empirical W2 between two samples of size N converges at
    # rate N^-1/2; with N = 2000 and unit scales, 0.08 is > 4 standard deviations
    a = rng.normal(0.5, 2.0, size=2000)
    b = rng.normal(-0.5, 1.0, size=2000)
    bw1 = D.bures_wasserstein([0.5], [[4.0]], [-0.5], [[1.0]])
    assert D.wasserstein(a[:, None], b[:, None]) == pytest.approx(bw1, abs=0.08)


# ----------------------------------------------------------------------------- conditional W2
@FAST
@given(m=measures(d=(1, 3), n=(1, 8), weighted=None, positions=True),
       seed=st.integers(0, 1000))
def test_conditional_wasserstein(m, seed):
    rng = np.random.default_rng(seed)
    Y = m.X + rng.normal(size=m.X.shape)
    val = D.conditional_wasserstein(m.X, Y, m.positions, weights_x=m.weights,
                                    weights_y=m.weights)
    # transport only among tokens at the same position: never more than the matched L2
    # cost, and equal to it when positions are distinct
    matched = math.sqrt(np.sum(m.w * np.sum((m.X - Y) ** 2, axis=1)))
    assert val <= matched * (1 + 1e-9) + 1e-12
    if len(np.unique(m.positions)) == m.n:
        assert val == pytest.approx(matched, rel=1e-12, abs=1e-14)
    # and at least the unconditional W2 (fewer plans)
    assert val >= D.wasserstein(m.X, Y, weights_x=m.weights, weights_y=m.weights) * (1 - 1e-9)
    # relabelling tokens (with their positions and weights) changes nothing
    p = rng.permutation(m.n)
    w = m.w
    assert D.conditional_wasserstein(m.X[p], Y[p], m.positions[p], weights_x=w[p],
                                     weights_y=w[p]) == pytest.approx(val, rel=1e-9, abs=1e-12)


def test_conditional_wasserstein_mismatch():
    X = np.zeros((2, 1))
    with pytest.raises(ValueError, match="position marginals"):
        D.conditional_wasserstein(X, X, [0.0, 0.5], [0.0, 0.6])


# ----------------------------------------------------------------------------- stability
@settings(max_examples=20, deadline=None)
@given(att=attentions(kinds=["softmax"], d=(1, 3), heads=None, output_matrix=None,
                      time_dependent=None),
       mx=compact_measures(d=3, n=(1, 5), weighted=None),
       my=compact_measures(d=3, n=(1, 5), weighted=None))
def test_stability_ratio_never_exceeds_bound(att, mx, my):
    d = att.d
    X0, Y0 = mx.X[:, :d], my.X[:, :d]
    if D.wasserstein(X0, Y0, weights_x=mx.weights, weights_y=my.weights) < 1e-6:
        return
    prof = D.stability_profile(att, X0, Y0, t_max=1.0, dt=0.1, weights_x=mx.weights,
                               weights_y=my.weights)
    assert prof.bound is not None
    # the bound holds for the exact flow; RK4 with dt = 0.1 on these O(1) fields is accurate
    # to ~1e-7 relative, so a 1e-5 margin cannot hide a violation of the theorem
    assert np.all(prof.ratio <= prof.bound * (1 + 1e-5))
    # the a-priori support radius dominates the observed one
    assert np.all(prof.radius <= prof.radius_bound * (1 + 1e-6) + 1e-12)


def test_stability_bound_tight_for_translates():
    # A = 0, V = v I: every token moves with v * mean, so translates stay translates and the
    # ratio is e^{vt}; the bound's constants reduce to L = ||V|| = v: equality
    v = 0.7
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), v * np.eye(2))
    X0 = np.random.default_rng(3).uniform(-0.5, 0.5, size=(10, 2))
    prof = D.stability_profile(att, X0, X0 + [0.1, -0.2], t_max=1.0, dt=0.1)
    np.testing.assert_allclose(prof.ratio, np.exp(v * prof.times), rtol=1e-6)
    np.testing.assert_allclose(prof.bound, np.exp(v * prof.times), rtol=1e-12)


def test_stability_bound_report_simple_case():
    # Q = 0.3 I, V = I, d = 2, cloud in the unit disc: report how loose the bound is.
    att = tp.Attention("softmax", 0.3 * np.eye(2), np.eye(2), np.eye(2))
    rng = np.random.default_rng(4)
    ang = rng.uniform(0, 2 * np.pi, 30)
    X0 = 0.5 * np.c_[np.cos(ang), np.sin(ang)]
    Y0 = X0 + 0.02 * rng.normal(size=X0.shape)
    prof = D.stability_profile(att, X0, Y0, t_max=0.5, dt=0.05)
    slack = prof.bound / prof.ratio
    print(f"ratio at t=0.5: {prof.ratio[-1]:.4f}, bound: {prof.bound[-1]:.4f}, "
          f"bound/ratio: {slack[-1]:.3f}")
    assert np.all(slack >= 1 - 1e-6)
    # for this mild case the bound is within a factor 2.5 at t = 0.5 (measured 1.95: not
    # vacuous; it degrades quickly with t because R(t) enters through exp(|beta| ||A|| R^2))
    assert slack[-1] < 2.5


def test_stability_profile_masked_and_other_kinds():
    rng = np.random.default_rng(5)
    X0, Y0 = rng.uniform(-1, 1, (6, 2)), rng.uniform(-1, 1, (6, 2))
    pos = np.linspace(0, 1, 6)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True)
    prof = D.stability_profile(att, X0, Y0, t_max=0.3, dt=0.1, positions=pos)
    assert prof.bound is None and prof.info["w2_method"] == "conditional"
    # one token per position: conditional W2 is the matched L2 distance of the trajectories
    k = -1
    ref = math.sqrt(np.mean(np.sum((prof.traj_x.states[k] - prof.traj_y.states[k]) ** 2, 1)))
    assert prof.w2[k] == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="same measure"):
        D.stability_profile(att, X0, X0, t_max=0.1, dt=0.1, positions=pos)
    with pytest.raises(ValueError, match="softmax"):
        D.stability_bound(tp.Attention("l2", np.eye(2), np.eye(2), np.eye(2)), 1.0, [0, 1])


def test_gaussian_stability_profile():
    # A = 0, V = I: covariances are frozen, means grow like e^t: BW ratio e^t
    pytest.importorskip("transformer_pde.gaussian")
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), np.eye(2))
    prof = D.gaussian_stability_profile(att, (np.zeros(2), np.eye(2)),
                                        (np.array([1.0, 0.5]), np.diag([1.0, 0.25])),
                                        t_max=1.0, n_times=11)
    # BW^2(t) = e^{2t} |dm|^2 + BW^2(covs) -> ratio^2 = (e^{2t} 1.25 + 0.25) / 1.5
    ref = np.sqrt((np.exp(2 * prof.times) * 1.25 + 0.25) / 1.5)
    np.testing.assert_allclose(prof.ratio, ref, rtol=1e-7)


# ----------------------------------------------------------------------------- rank
def test_rank_values():
    assert D.numerical_rank(np.diag([1.0, 1e-3, 1e-9])) == 2
    assert D.numerical_rank(np.diag([1.0, 1e-3, 1e-9]), rtol=1e-2) == 1
    assert D.numerical_rank(np.zeros((3, 3))) == 0
    assert D.effective_rank(np.eye(4)) == pytest.approx(4.0)
    assert D.effective_rank(np.diag([2.0, 0, 0])) == pytest.approx(1.0)
    assert D.effective_rank(np.diag([1.0, 1.0, 0])) == pytest.approx(2.0)
    assert D.stable_rank(np.diag([4.0, 1.0, 1.0])) == pytest.approx(1.5)
    assert D.stable_rank(np.zeros((2, 2))) == 0.0
    with pytest.raises(ValueError, match="rtol"):
        D.numerical_rank(np.eye(2), rtol=2.0)


@FAST
@given(m=measures(d=3, n=(2, 10)), R=rotations(3), seed=st.integers(0, 1000),
       scale=st.floats(0.1, 10.0))
def test_rank_and_clusters_invariant(m, R, seed, scale):
    rng = np.random.default_rng(seed)
    X = m.X
    Y = scale * X[rng.permutation(m.n)] @ R.T + rng.normal(size=3)
    cx = np.cov(X.T, bias=True)
    cy = np.cov(Y.T, bias=True)
    # numerical rank: invariant unless an eigenvalue ratio sits within a factor 10 of rtol
    # (then round-off of the rotation may move it across the threshold)
    lam = np.linalg.eigvalsh(cx)
    rel = lam / lam[-1] if lam[-1] > 0 else np.zeros_like(lam)
    if lam[-1] > 1e-12 and not np.any((rel > 1e-7) & (rel < 1e-5)):
        # (a cloud of coincident points has a round-off covariance after translation:
        # rank_profile's floor handles it; here we test the scale-free spectral functions)
        assert D.numerical_rank(cy, 1e-6) == D.numerical_rank(cx, 1e-6)
    if lam[-1] > 1e-12:
        assert D.effective_rank(cy) == pytest.approx(D.effective_rank(cx), rel=1e-6)
        assert D.stable_rank(cy) == pytest.approx(D.stable_rank(cx), rel=1e-6)
    # cluster count (and sizes) invariant under rotation, permutation, translation, scaling;
    # avoid draws where some pair distance sits at the threshold (relative 1e-6)
    cl = D.clusters(X, tol=0.3)
    # (scaled first: squares of distances like 1e-192 underflow, and clusters() resolves them)
    big = float(np.abs(X).max()) or 1.0
    dists = big * np.linalg.norm((X[:, None] - X[None]) / big, axis=-1)
    if 0 < dists.max() < 1e-6:
        return  # a cloud below the round-off of the translated coordinates (~1e-16)
    if cl.scale > 0 and np.min(np.abs(dists - cl.scale)) < 1e-6 * cl.scale:
        return
    cl2 = D.clusters(Y, tol=0.3)
    assert cl2.n_clusters == cl.n_clusters
    np.testing.assert_allclose(np.sort(cl2.masses), np.sort(cl.masses), rtol=1e-12)


@FAST
@given(m=measures(d=2, n=(1, 15)), tol=st.floats(0.05, 1.0))
def test_clusters_match_scipy_single_linkage(m, tol):
    X = m.X
    cl = D.clusters(X, tol=tol)
    if m.n == 1 or cl.scale == 0:
        assert cl.n_clusters == 1
        return
    dists = np.linalg.norm(X[:, None] - X[None], axis=-1)
    if np.max(np.abs(X)) < 1e-140:
        return  # squared distances underflow: scipy's linkage (the reference) loses them
    if np.min(np.abs(dists - cl.scale)) < 1e-9 * cl.scale:
        return  # a link exactly at the threshold: < versus <= conventions differ
    ref = fcluster(linkage(X, "single"), t=cl.scale, criterion="distance")
    # same partition: labels are a bijection of each other
    pairs = set(zip(cl.labels.tolist(), ref.tolist(), strict=True))
    assert len(pairs) == cl.n_clusters == len(set(ref.tolist()))
    # centres are the cluster means
    for k in range(cl.n_clusters):
        np.testing.assert_allclose(cl.centres[k], X[cl.labels == k].mean(0), atol=1e-12)


def test_clusters_separated_blobs_and_counts():
    rng = np.random.default_rng(6)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + 0.01 * rng.normal(size=(20, 2)) for c in centres])
    cl = D.clusters(X, tol=0.05)
    assert cl.n_clusters == 3
    np.testing.assert_allclose(np.sort(cl.masses), [1 / 3] * 3)
    traj = _ptraj(np.stack([X, 0 * X + 1.0]))
    np.testing.assert_array_equal(D.cluster_counts(traj, tol=0.05), [3, 1])


def _gaussian_traj(times, covs, means=None, status="ok", blowup_time=float("nan")):
    covs = np.asarray(covs, dtype=float)
    means = np.zeros(covs.shape[:2]) if means is None else np.asarray(means)
    return GaussianTrajectory(np.asarray(times, dtype=float), means, covs, status, blowup_time,
                              covs[-1] / np.trace(covs[-1]), float(np.asarray(times)[-1]), "")


def test_rank_collapse_exact_solution():
    # V = I, A = diag(1, 0.1), Sigma0 = I: Sigma(t) = diag(1/(1-2t), 1/(1-0.2t)) (the
    # exact solution). The numerical rank at rtol drops to 1 once (1-2t)/(1-0.2t) < rtol,
    # i.e. t > (1 - rtol)/(2 - 0.2 rtol).
    rtol = 1e-2
    t = np.linspace(0, 0.4999, 2000)
    covs = np.stack([np.diag([1 / (1 - 2 * s), 1 / (1 - 0.2 * s)]) for s in t])
    rc = D.rank_collapse(_gaussian_traj(t, covs), rtol=rtol)
    t_star = (1 - rtol) / (2 - 0.2 * rtol)
    assert rc.collapsed and rc.initial_rank == 2 and rc.final_rank == 1
    assert t_star <= rc.time <= t_star + (t[1] - t[0])
    assert rc.events == [(rc.time, 1)]
    assert rc.min_effective_rank < 1.1


def test_rank_profile_particles_match_covariance():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, 3))
    X[:, 2] = X[:, 0] + X[:, 1]  # rank 2
    traj = _ptraj(X[None])
    prof = D.rank_profile(traj)
    assert prof.numerical[0] == 2
    assert prof.stable[0] == pytest.approx(D.stable_rank(np.cov(X.T)), rel=1e-10)


# ----------------------------------------------------------------------------- blow-up
def test_classify_synthetic_laws():
    t = np.linspace(0, 0.95, 96)
    T_star = 1 / (2 * 1.0 * 0.5 * 1.0)  # 1-D softmax, v = 1, a = 0.5, sigma0 = 1
    blow = _gaussian_traj(t, (1 / (1 - t / T_star))[:, None, None])
    c = D.classify(blow)
    assert c.kind == "blowup" and c.blowup_time == pytest.approx(T_star, rel=1e-6)
    t = np.linspace(0, 5, 101)
    assert D.classify(_gaussian_traj(t, np.exp(2 * t)[:, None, None])).kind == "diverging"
    conv = _gaussian_traj(t, (1 + np.exp(-5 * t))[:, None, None])
    assert D.classify(conv).kind == "converged"
    t = np.linspace(0, 30, 301)  # collapse to a Dirac mass
    assert D.classify(_gaussian_traj(t, np.exp(-t)[:, None, None])).kind == "converged"
    # rotating covariance of constant size: still moving
    rot = [np.array([[np.cos(s), -np.sin(s)], [np.sin(s), np.cos(s)]]) for s in t]
    covs = [R @ np.diag([2.0, 1.0]) @ R.T for R in rot]
    assert D.classify(_gaussian_traj(t, covs)).kind == "ok"  # undecided
    assert D.classify(_gaussian_traj(t[:3], np.ones((3, 1, 1)))).kind == "ok"


def test_classify_gaussian_solver_runs():
    gaussian = pytest.importorskip("transformer_pde.gaussian")
    # 1-D softmax v = 1, a = 1, sigma0 = 1: T* = 1/2 (exact)
    att = tp.Attention("softmax", np.eye(1), np.eye(1), np.eye(1))
    tr = gaussian.solve(att, [0.0], [[1.0]], t_max=2.0, t_eval=np.linspace(0, 2, 401))
    c = D.classify(tr)
    assert c.kind == "blowup"
    assert c.blowup_time == pytest.approx(0.5, rel=1e-3)
    # A = 0, V = -I: the mean decays like e^{-t}, the covariance is frozen
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), -np.eye(2))
    tr = gaussian.solve(att, [1.0, 0.0], np.eye(2), t_max=20.0, t_eval=np.linspace(0, 20, 201))
    assert D.classify(tr).kind == "converged"


def test_classify_particles_contracting():
    # A = 0, V = -I: x' = -mean, the cloud translates to mean zero (exponentially)
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), -np.eye(2))
    X0 = np.random.default_rng(8).uniform(-1, 1, (15, 2)) + 3.0
    traj = tp.simulate(att, X0, t_max=20.0, dt=0.5)
    assert D.classify(traj).kind == "converged"
    # a collapsed cloud far from the origin has rank 0, not round-off rank
    one = _ptraj(np.full((1, 5, 2), 7.3))
    assert D.rank_profile(one).numerical[0] == 0


# ----------------------------------------------------------------------------- kinetic energy
def test_kinetic_energy_equality_for_straight_constant_speed():
    # A = 0 and V nilpotent (V^2 = 0): Gamma = V mean, mean' = V mean, so V mean is constant:
    # every token moves on a straight line at one common constant velocity (a translation,
    # which is optimal): energy = W2^2 / T exactly
    V = np.array([[0.0, 1.0], [0.0, 0.0]])
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), V)
    X0 = np.random.default_rng(9).normal(size=(12, 2)) + [0.0, 1.0]
    traj = tp.simulate(att, X0, t_max=2.0, dt=0.1)
    ke = D.kinetic_energy(traj)
    assert ke.ratio == pytest.approx(1.0, rel=1e-9)


def test_kinetic_energy_gaussian_matches_particles_formula():
    gaussian = pytest.importorskip("transformer_pde.gaussian")
    # A = 0, V nilpotent: the Gaussian moves by a constant-velocity translation, ratio 1;
    # power = |V alpha|^2 (M = V Sigma A = 0)
    V = np.array([[0.0, 1.0], [0.0, 0.0]])
    att = tp.Attention("softmax", np.zeros((2, 2)), np.eye(2), V)
    tr = gaussian.solve(att, [0.0, 1.0], np.eye(2), t_max=2.0, t_eval=np.linspace(0, 2, 21))
    ke = D.kinetic_energy(tr, att)
    np.testing.assert_allclose(ke.power, 1.0, rtol=1e-9)
    assert ke.ratio == pytest.approx(1.0, rel=1e-8)
    # a blowing-up run (1-D softmax) is far from straight constant-speed transport: ratio > 1
    att = tp.Attention("softmax", np.eye(1), np.eye(1), np.eye(1))
    tr = gaussian.solve(att, [0.0], [[1.0]], t_max=0.4, t_eval=np.linspace(0, 0.4, 401))
    assert D.kinetic_energy(tr, att).ratio > 1.0


@settings(max_examples=15, deadline=None)
@given(att=attentions(kinds=["softmax", "l2", "linear"], d=2),
       m=measures(d=2, n=(2, 6)))
def test_kinetic_energy_at_least_transport_cost(att, m):
    traj = tp.simulate(att, m.X, t_max=1.0, dt=0.02)
    ke = D.kinetic_energy(traj)
    if ke.transport < 1e-14:
        return
    # Benamou-Brenier: ratio >= 1; trapezoidal error with 50 intervals on these smooth O(1)
    # power curves is O(h^2) ~ 1e-3 relative: allow 1 %
    assert ke.ratio >= 0.99


# ----------------------------------------------------------------------------- mean field
def test_mean_field_rate_n_to_minus_half():
    # 1-D softmax, v = 1, a = 0.25, sigma0 = 1, T = 0.5: kappa(T) = a sigma(T) = 0.33 (< 0.5,
    # the regime where particle errors decay like N^-1/2). Reference: the exact law
    # sigma(t) = sigma0 / (1 - 2 v a sigma0 t).  Error: Bures-Wasserstein distance between the
    # empirical moments at T and the exact Gaussian, averaged over 16 seeds.
    v, a, T = 1.0, 0.25, 0.5
    att = tp.Attention("softmax", np.array([[a]]), np.eye(1), np.array([[v]]))
    sig_T = 1.0 / (1 - 2 * v * a * 1.0 * T)
    Ns = [64, 256, 1024]
    errs = []
    for N in Ns:
        e = []
        for seed in range(16):
            X0 = np.random.default_rng(seed).normal(size=(N, 1))
            XT = tp.simulate(att, X0, t_max=T, dt=0.1).final
            e.append(D.bures_wasserstein(XT.mean(0), np.cov(XT.T, bias=True).reshape(1, 1),
                                         [0.0], [[sig_T]]))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(Ns), np.log(errs), 1)[0]
    print(f"mean-field errors {errs}, slope {slope:.3f}")
    # 16 seeds per N: the mean error has ~ 1/sqrt(2*16) = 18 % relative spread, i.e.
    # +-0.13 on a slope fitted over a factor 16 in N: accept [-0.8, -0.3]
    assert -0.8 <= slope <= -0.3


# ------------------------------------------------------------- classify
def _particle_traj(att, t, scale, status="ok"):
    X0 = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    states = scale[:, None, None] * X0[None]
    return _ptraj(states, times=t, attention=att, status=status)


def test_classify_uses_the_results_status_vocabulary():
    from transformer_pde.results import Status

    t = np.linspace(0, 5, 101)
    c = D.classify(_gaussian_traj(t, np.exp(2 * t)[:, None, None]))
    assert isinstance(c.kind, Status) and c.status is c.kind is Status.DIVERGING
    # an undecided run that ended early keeps its own status
    rot = _gaussian_traj(t[:3], np.ones((3, 1, 1)), status="nonfinite")
    assert D.classify(rot).kind is Status.NONFINITE


def test_classify_readme_linear_blowup_with_max_norm_stop():
    # x' = x^3/2 (one token, linear attention), x(0) = 1: x = (1 - t)^(-1/2), T* = 1.  The
    # run stops at max_norm = 100 and saves the overshoot state (4e24 at t = 1.01), which
    # broke the c/(T* - t) fit ("diverging"); it is left out now.
    att = tp.Attention("linear", [[1.0]], [[0.5]], [[1.0]])
    blow = tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01,
                       limits=tp.Limits(max_norm=100.0))
    assert blow.status == "blowup"   # an answer: in the status, with no warning
    c = D.classify(blow)
    assert c.kind == "blowup" and c.evidence["excluded_overshoot"]
    assert c.blowup_time == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("kind", ["softmax", "l2", "sinkhorn"])
def test_classify_normalised_particle_flows_never_blow_up(kind):
    # |Gamma(x)| <= ||V|| max|x| for normalised kinds: at most exponential growth.  A
    # trajectory whose second moment follows c/(T* - t) exactly is fitted best by the
    # blow-up law, but for these kinds it can only be "diverging".
    t = np.linspace(0, 0.9, 91)
    scale = 1 / np.sqrt(1 - t)
    att = tp.Attention(kind, np.eye(2), np.eye(2), 3 * np.eye(2))
    c = D.classify(_particle_traj(att, t, scale))
    assert c.kind == "diverging" and c.blowup_time is None
    assert c.evidence["growth_bound"] == pytest.approx(3.0)
    # stopped at max_norm: still diverging
    assert D.classify(_particle_traj(att, t, scale, status="blowup")).kind == "diverging"
    # the same curve from linear attention (which can blow up) is a blow-up
    lin = tp.Attention("linear", np.eye(2), np.eye(2), 3 * np.eye(2))
    c = D.classify(_particle_traj(lin, t, scale))
    assert c.kind == "blowup" and c.blowup_time == pytest.approx(1.0, rel=1e-6)


def test_exponential_growth_bound():
    from transformer_pde.diagnostics import exponential_growth_bound as bound

    V = np.diag([1.0, 2.0, 3.0, 4.0])
    att = tp.Attention("softmax", np.eye(4), np.eye(4), V, heads=2, W_O=2 * np.eye(4))
    traj = _ptraj(np.zeros((1, 1, 4)), attention=att)
    assert bound(traj) == pytest.approx(2 * math.sqrt(2.0 ** 2 + 4.0 ** 2))
    layers = tp.Layers(np.stack([np.eye(2), 5 * np.eye(2)]))
    traj = _ptraj(np.zeros((1, 1, 2)),
                  attention=tp.Attention("softmax", np.eye(2), np.eye(2), layers))
    assert bound(traj) == pytest.approx(5.0)
    callable_v = tp.Attention("softmax", np.eye(2), np.eye(2), lambda s: np.eye(2) / (1 - s))
    assert bound(_ptraj(np.zeros((1, 1, 2)), attention=callable_v)) is None
    assert bound(_ptraj(np.zeros((1, 1, 2)),
                        attention=tp.Attention("linear", np.eye(2), np.eye(2),
                                               np.eye(2)))) is None
    assert bound(_gaussian_traj([0.0], [[[1.0]]])) is None


# ------------------------------------------------------------- clusters
@pytest.mark.parametrize("spread", [1e-3, 0.05, 0.3])
def test_clusters_default_finds_separated_blobs_at_any_spread(spread):
    rng = np.random.default_rng(11)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + spread * rng.normal(size=(40, 2)) for c in centres])
    res = D.clusters(X)
    assert res.n_clusters == 3
    # each blob is one cluster
    assert all(len(set(res.labels[40 * k:40 * (k + 1)])) == 1 for k in range(3))
    # invariant under rotation, scaling, translation, permutation
    perm = rng.permutation(X.shape[0])
    R = np.array([[0.6, -0.8], [0.8, 0.6]])
    assert D.clusters(7.0 * X[perm] @ R.T - 2.0).n_clusters == 3
    # the fixed scale is still available (and splits moderate blobs)
    if spread == 0.3:
        assert D.clusters(X, tol=1e-2).n_clusters > 3


def test_clusters_default_single_cloud_and_collapsed_tokens():
    rng = np.random.default_rng(12)
    for d in (1, 2, 3):
        assert D.clusters(rng.normal(size=(200, d))).n_clusters == 1
    # tokens collapsed onto three points (round-off apart), and exact duplicates
    C = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert D.clusters(np.repeat(C, 10, axis=0) + 1e-13 * rng.normal(size=(30, 2))).n_clusters == 3
    assert D.clusters(np.repeat(C, 10, axis=0)).n_clusters == 3
    assert D.clusters(np.ones((5, 2))).n_clusters == 1
    assert D.clusters([[1.0, 2.0]]).n_clusters == 1
    # two coincident tokens inside a spread cloud are not a group of their own
    X = rng.normal(size=(100, 2))
    X[1] = X[0]
    assert D.clusters(X).n_clusters == 1


def test_clusters_default_large_clouds_use_the_knn_tree():
    from transformer_pde.diagnostics.clustering import EXACT_MST_MAX, _mst_edges

    rng = np.random.default_rng(13)
    C = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [30.0, 30.0]])
    n = EXACT_MST_MAX // 3
    X = np.concatenate([c + 0.3 * rng.normal(size=(n, 2)) for c in C])
    res = D.clusters(X)
    assert res.n_clusters == 4 and np.allclose(res.masses, 0.25)
    # the k-NN tree with Boruvka joins is the exact minimum spanning tree here
    small = X[rng.choice(X.shape[0], 600, replace=False)]
    exact = np.sort(_mst_edges(small)[2])
    import transformer_pde.diagnostics.clustering as clu
    old = clu.EXACT_MST_MAX
    try:
        clu.EXACT_MST_MAX = 10
        approx = np.sort(_mst_edges(small)[2])
    finally:
        clu.EXACT_MST_MAX = old
    np.testing.assert_allclose(approx, exact, rtol=1e-12)


# ------------------------------------------------------- classification summaries
def test_classification_summary_is_short_and_says_the_right_thing():
    t = np.linspace(0, 5, 101)
    # exp(2t) growth: 1/E|x|^2 = exp(-2t) never reaches 0, so no blow-up law and no T*
    c = D.classify(_gaussian_traj(t, np.exp(2 * t)[:, None, None]))
    text, html_ = repr(c), c._repr_html_()
    assert text.splitlines()[0] == "Classification(kind='diverging')"
    assert len(text) < 320 and len(text.splitlines()) <= 6  # was a 600-character dict
    assert "evidence" not in text and "{" not in text
    assert "T*" not in text.split("message", 1)[0] and "\n  T*" not in text
    assert "inf" not in text and "blow-up law inf" not in str(c)
    assert "no c/(T* - t) law fits" in str(c)
    assert "<table>" in html_ and "diverging" in html_ and "inf" not in html_
    # a finite-time blow-up shows its T*
    T_star = 1.0
    tb = np.linspace(0, 0.95, 96)
    b = D.classify(_gaussian_traj(tb, (1 / (1 - tb / T_star))[:, None, None]))
    rows = dict(line.split(None, 1) for line in repr(b).splitlines()[1:])
    assert repr(b).startswith("Classification(kind='blowup')")
    assert float(rows["T*"]) == pytest.approx(T_star, rel=1e-3)  # 4 significant digits
    # the evidence is a plain dict of Python numbers (no np.float64 reprs)
    assert type(b.evidence["blowup_fit_time"]) is float
