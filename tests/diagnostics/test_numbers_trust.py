"""Trust in the numbers: scale-free clustering, cancellation-free W2, overflow of the
Gaussian moment equations, and clear errors for bad arguments."""

from __future__ import annotations

import math
import warnings

import numpy as np
import ot
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde import diagnostics as D
from transformer_pde import gaussian as G
from transformer_pde.diagnostics.clustering import SEPARATION
from transformer_pde.errors import ArgumentError, ArgumentTypeError, EarlyStopWarning

BAD = (ArgumentError, ArgumentTypeError)


def _att(kind="softmax", d=2, Q=None):
    return tp.Attention(kind, np.eye(d) if Q is None else Q, np.eye(d), np.eye(d))


# ------------------------------------------------------------------------ 1. clusters
def test_clusters_three_blobs_20_sigma_apart_are_three():
    rng = np.random.default_rng(5)
    for n, d in ((40, 2), (40, 3), (300, 2), (10, 3)):
        C = 6.0 * np.eye(3)[:, :d] if d == 3 else np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
        X = np.concatenate([c + 0.3 * rng.normal(size=(n, d)) for c in C])
        res = D.clusters(X)
        assert res.n_clusters == 3
        assert all(len(set(res.labels[n * k:n * (k + 1)])) == 1 for k in range(3))


def test_clusters_tiny_and_huge_scales():
    rng = np.random.default_rng(6)
    X = np.concatenate([rng.normal(size=(30, 2)) * 0.1, 5.0 + rng.normal(size=(30, 2)) * 0.1])
    for s in (1e-300, 1e-200, 1.0, 1e200, 1e300):
        res = D.clusters(s * X)
        assert res.n_clusters == 2
        # the cut height is in the units of X: between the groups' spread and their gap
        assert 0.01 * s < res.scale < 5.0 * s
    # a single Gaussian blob stays one cluster at any scale
    B = rng.normal(size=(200, 2))
    for s in (1e-300, 1.0, 1e300):
        assert D.clusters(s * B).n_clusters == 1


@settings(max_examples=40)
@given(k=st.integers(2, 5), d=st.integers(1, 3), m=st.integers(8, 25),
       seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-300, 300),
       shift=st.floats(-1e6, 1e6))
def test_clusters_k_separated_blobs_give_k(k, d, m, seed, log_scale, shift):
    """k blobs of diameter D (uniform in a cube of side 2 sigma, corners included, so
    D = 2 sigma sqrt(d)) with centres 4 D apart on a line: k clusters at any scale
    10^-300..10^300 and any translation up to 10^6 separations.  Then the groups are at
    least 3 D >= SEPARATION * D apart, and a coarser grouping has a gap <= 5 D over a
    diameter >= 3 D, so it is less separated."""
    rng = np.random.default_rng(seed)
    sigma = 1.0
    diam = 2 * sigma * math.sqrt(d)
    assert 3 * diam >= SEPARATION * diam
    e = rng.normal(size=d)
    e /= np.linalg.norm(e)
    blobs = []
    for j in range(k):
        P = rng.uniform(-sigma, sigma, size=(m, d))
        P[0], P[1] = sigma, -sigma          # opposite corners: the diameter is exactly D
        blobs.append(4 * diam * j * e + P)
    X = np.concatenate(blobs)
    scale = 10.0 ** log_scale
    Y = scale * (X + shift * 4 * diam * e)
    res = D.clusters(Y)
    assert res.n_clusters == k
    for j in range(k):
        assert len(set(res.labels[m * j:m * (j + 1)].tolist())) == 1


# ------------------------------------------------------------------------------ 2. W2
def test_w2_matches_pot_on_centred_data(rng):
    X = rng.normal(size=(20, 3))
    Y = 0.5 * rng.normal(size=(25, 3)) + [1.0, -2.0, 0.5]
    a = rng.uniform(0.5, 1.5, 20)
    a /= a.sum()
    b = np.full(25, 1 / 25)
    ma, mb = a @ X, b @ Y
    M = ot.dist(X - ma, Y - mb, metric="sqeuclidean")
    ref = math.sqrt(np.sum((ma - mb) ** 2) + ot.emd2(a, b, M))
    assert D.wasserstein(X, Y, weights_x=a, weights_y=b) == pytest.approx(ref, rel=1e-12)


def test_w2_exact_for_tiny_and_far_translated_clouds(rng):
    # dyadic coordinates: every translation and scaling below is exact in float64
    X = np.round(rng.normal(size=(15, 2)) * 2**10) / 2**10
    Y = np.round(rng.normal(size=(15, 2)) * 2**10) / 2**10
    base = D.wasserstein(X, Y)
    T = 2.0**27                               # ~1.3e8: costs formed naively lose everything
    far = D.wasserstein_result(X + T, Y + T)
    assert far.value == pytest.approx(base, rel=1e-12)
    assert 0 < far.resolution < 1e-12 * base
    delta = np.array([3.0, 4.0]) * 2.0**-20   # |delta| = 5 * 2^-20 ~ 4.8e-6
    assert D.wasserstein(X + T, X + T + delta) == pytest.approx(5 * 2.0**-20, rel=1e-12)
    for s in (2.0**-1000, 2.0**1000):        # squares would under/overflow
        assert D.wasserstein(s * X, s * Y) == pytest.approx(s * base, rel=1e-12)
    # two clouds 2e-9 apart (the shifted cloud carries its own rounding, ~1e-16 absolute)
    Z = rng.normal(size=(30, 2))
    assert D.wasserstein(Z, Z + [2e-9, 0.0]) == pytest.approx(2e-9, rel=1e-6)


# ------------------------------------------------------------------- 3. Gaussian overflow
def test_gaussian_solve_rejects_means_whose_square_overflows():
    with pytest.raises(ArgumentError, match=r"mean0.*1e\+100"):
        G.solve(_att(), [1e154, 0.0], np.eye(2), t_max=1.0)
    with pytest.raises(ArgumentError, match="means0"):
        G.solve_batch(_att(), [[1e154, 0.0]], [np.eye(2)], t_max=1.0, use_numba=False)
    with pytest.raises(ArgumentError, match="cov0"):
        G.solve(_att(), [0.0, 0.0], 1e150 * np.eye(2), t_max=1.0, blowup_threshold=1e300)
    with pytest.raises(ArgumentError, match="mean"):
        G.moment_ode(_att(), [1e154, 0.0], np.eye(2))


def test_gaussian_solve_reports_overflow_mid_run():
    # Q = 0: M = 0, the mean grows like e^t and overflows the moment equations near
    # t = 354 (|mean|^2 beyond 1.8e308); the covariance stays the identity
    att = _att(Q=np.zeros((2, 2)))
    with pytest.warns(EarlyStopWarning, match="overflow"):
        tr = G.solve(att, [1.0, 1.0], np.eye(2), t_max=800.0)
    assert tr.status == "nonfinite" and not tr.success
    assert 300 < tr.t_final < 360
    assert np.all(np.isfinite(tr.final_mean)) and np.all(np.isfinite(tr.means))
    # exact solution at the last finite state: mean = e^t (1, 1)
    np.testing.assert_allclose(tr.final_mean, np.exp(tr.t_final) * np.ones(2), rtol=1e-6)


# ------------------------------------------------------------------ 4. clear errors
def test_clear_errors_for_the_reported_arguments():
    att = _att()
    with pytest.raises(ArgumentTypeError, match="use_numba"):
        G.solve_batch(att, [[0.0, 0.0]], [np.eye(2)], t_max=1.0, use_numba="yes")
    with pytest.raises(ArgumentError, match="t_eval.*strictly increasing"):
        G.solve(att, [0.0, 0.0], np.eye(2), t_max=1.0, t_eval=[0.1, 0.5, 0.5])
    with pytest.raises(ArgumentError, match="t_eval.*strictly increasing"):
        G.solve_batch(att, [[0.0, 0.0]], [np.eye(2)], t_max=1.0, t_eval=[0.2, 0.2],
                      use_numba=False)
    with pytest.raises(ArgumentError, match=r"\bt must be finite"):
        G.moment_ode(att, [0.0, 0.0], np.eye(2), t=float("nan"))
    with pytest.raises(ArgumentError, match="eps must be > 0"):
        G.sinkhorn_cross_covariance(np.eye(2), np.eye(2), eps=0)


def test_clear_errors_for_sibling_arguments():
    att = _att()
    m, c = [0.0, 0.0], np.eye(2)
    with pytest.raises(ArgumentTypeError, match="t_max"):
        G.solve(att, m, c, t_max=True)
    with pytest.raises(ArgumentTypeError, match="rtol"):
        G.solve(att, m, c, t_max=1.0, rtol="1e-8")
    with pytest.raises(ArgumentError, match="t_eval"):
        G.solve(att, m, c, t_max=1.0, t_eval=[0.5, float("nan")])
    with pytest.raises(ArgumentError, match="t_eval"):
        G.solve(att, m, c, t_max=1.0, t_eval=[0.5, 2.0])
    with pytest.raises(ArgumentTypeError, match="max_steps"):
        G.solve_batch(att, [m], [c], t_max=1.0, max_steps=True)
    with pytest.raises(ArgumentTypeError, match="t must be a real number"):
        G.affine_field(att, m, c, t=True)
    with pytest.raises(ArgumentTypeError, match="eps"):
        G.sinkhorn_cross_covariance(np.eye(2), c, eps=1j)
    with pytest.raises(ArgumentError, match="eps"):
        G.sinkhorn_cross_covariance(np.eye(2), c, eps=float("inf"))
    with pytest.raises(ArgumentError, match="A"):
        G.sinkhorn_cross_covariance(np.ones((2, 3)), c)
    with pytest.raises(ArgumentTypeError, match="att"):
        G.solve(None, m, c, t_max=1.0)
    with pytest.raises(ArgumentTypeError, match="att"):
        G.solve_batch(3, [m], [c], t_max=1.0)
    # the valid calls still work, and agree with the closed form
    C = G.sinkhorn_cross_covariance(np.zeros((2, 2)), c, eps=1.0)
    np.testing.assert_allclose(C, 0.0, atol=1e-15)


# ------------------------------------------------------------------------- 5. fuzz
JUNK = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1 + 2j, True, False, "x", None,
        [[1.0, 2.0], [3.0]], np.zeros((2, 2, 2)), np.array([np.nan, 1.0]), [1.0, 2.0, 3.0],
        np.ones((2, 2), dtype=complex), 1e300, -1e-300]
GOOD_MEAN = [0.1, -0.2]
GOOD_COV = np.eye(2)


def _fine(value):
    """A result must be finite: never a silent NaN."""
    if isinstance(value, D.clustering.Clusters):
        assert np.all(np.isfinite(value.centres))
        return
    if hasattr(value, "final_mean"):
        assert np.all(np.isfinite(value.final_mean)) and np.all(np.isfinite(value.final_cov))
        return
    if isinstance(value, G.GaussianBatch):
        assert np.all(np.isfinite(value.means)) and np.all(np.isfinite(value.covs))
        return
    for v in (value if isinstance(value, tuple) else (value,)):
        assert np.all(np.isfinite(np.asarray(v, dtype=float)))


CALLS = {
    "clusters.X": lambda v: D.clusters(v),
    "clusters.tol": lambda v: D.clusters(np.eye(3), tol=v),
    "wasserstein.X": lambda v: D.wasserstein(v, np.eye(2)),
    "wasserstein.Y": lambda v: D.wasserstein(np.eye(2), v),
    "solve.mean0": lambda v: G.solve(_att(), v, GOOD_COV, t_max=0.05),
    "solve.cov0": lambda v: G.solve(_att(), GOOD_MEAN, v, t_max=0.05),
    "solve.t_max": lambda v: G.solve(_att(), GOOD_MEAN, GOOD_COV, t_max=v),
    "solve.t_eval": lambda v: G.solve(_att(), GOOD_MEAN, GOOD_COV, t_max=0.05, t_eval=v),
    "solve_batch.use_numba": lambda v: G.solve_batch(_att(), [GOOD_MEAN], [GOOD_COV],
                                                     t_max=0.05, use_numba=v),
    "solve_batch.t_eval": lambda v: G.solve_batch(_att(), [GOOD_MEAN], [GOOD_COV], t_max=0.05,
                                                  t_eval=v, use_numba=False),
    "solve_batch.max_steps": lambda v: G.solve_batch(_att(), [GOOD_MEAN], [GOOD_COV],
                                                     t_max=0.05, max_steps=v, use_numba=False),
    "moment_ode.mean": lambda v: G.moment_ode(_att(), v, GOOD_COV),
    "moment_ode.t": lambda v: G.moment_ode(_att(), GOOD_MEAN, GOOD_COV, t=v),
    "sinkhorn_cross_covariance.A": lambda v: G.sinkhorn_cross_covariance(v, GOOD_COV),
    "sinkhorn_cross_covariance.cov": lambda v: G.sinkhorn_cross_covariance(np.eye(2), v),
    "sinkhorn_cross_covariance.eps": lambda v: G.sinkhorn_cross_covariance(np.eye(2), GOOD_COV,
                                                                           eps=v),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@settings(max_examples=40)
@given(value=st.one_of(st.sampled_from(JUNK), st.floats(), st.complex_numbers(),
                       st.lists(st.floats(), max_size=4)))
def test_fuzz_bad_inputs_give_package_errors(call, value):
    """Every bad value gives the package's ArgumentError / ArgumentTypeError; a value the
    function accepts gives a finite result (never a raw NumPy/SciPy error, never NaN).
    The solves run to t = 0.05 only, so an accepted value cannot take long."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        try:
            out = CALLS[call](value)
        except BAD:
            return
    _fine(out)
