"""solve_batch: the package's step-size controller on both paths, exact blow-up times and
limits, parity between the compiled and the interpreted path, results independent of the
thread count.

Tolerances (default rtol = 1e-10): states at common times 1e-8 relative (the global error
of an adaptive pair is a modest multiple of rtol: ~1e2 rtol here); T* 1e-8 relative (it
is measured at tr Sigma = 1e10 by tau/q, exact to O(1/size), so its error is the
integration error of t, ~1e-10 observed); limit shapes 1e-8 absolute; the two paths (one
DOP853 integrator, compiled or interpreted: the same steps, rounding apart) agree to 1e-11
in T* and land on the threshold to the landing tolerance 1e-12 (1e-11 asserted).  Thread
counts: bit for bit.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq

from transformer_pde import gaussian as g
from transformer_pde.attention import Attention
from transformer_pde.errors import ArgumentError, EarlyStopWarning
from transformer_pde.gaussian import lockstep
from transformer_pde.gaussian import member as gaussian_member
from transformer_pde.integrate.controller import PIController, initial_step, pi_factor


@contextlib.contextmanager
def _answer():
    """A blow-up, divergence or convergence is an answer: reported in the status, never
    warned (an EarlyStopWarning inside the block is an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        yield


_Q = np.array([[-0.09678415830991538, 0.42220166048145347],
               [-0.22546156340099752, -0.6379430932117882]])
_K = np.array([[-0.01628630369574242, 1.0442167783791647],
               [-1.0848803286340662, -2.2059248271588077]])


def _paper_grid(n=40):
    """The paper's Fig. 2a grid (trace-one covariances strictly inside the cone), its
    attention (V = I) and A = K^T Q / sqrt(2)."""
    u = np.linspace(-1, 1, n)
    U, W = np.meshgrid(u, u, indexing="ij")
    keep = 1 - U ** 2 > W ** 2
    uu, ww = U[keep], W[keep]
    covs = np.stack([np.stack([(1 + uu) / 2, ww / 2], -1),
                     np.stack([ww / 2, (1 - uu) / 2], -1)], -2)
    return Attention("softmax", _Q / np.sqrt(2), _K, np.eye(2)), covs, _K.T @ _Q / np.sqrt(2)


def _psd_sqrt(S):
    lam, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.maximum(lam, 0))) @ U.T


def _exact_limit(A, S0):
    """Sigma/tr Sigma at T* for V = I: u u^T/|u|^2, u = S0^1/2 w, w the top eigenvector of
    S0^1/2 (A + A^T) S0^1/2 (Sigma(t) = (S0^-1 - t (A + A^T))^-1 loses rank along u)."""
    R = _psd_sqrt(S0)
    _, W = np.linalg.eigh(R @ (A + A.T) @ R)
    u = R @ W[:, -1]
    return np.outer(u, u) / (u @ u)


# ----------------------------------------------------------------------------- controller
def test_pi_rule_vectorised_equals_scalar_rule():
    rng = np.random.default_rng(0)
    err = np.concatenate([10.0 ** rng.uniform(-14, 3, 200), [0.0, 1e-10, 1.0, np.inf, np.nan]])
    prev = np.concatenate([10.0 ** rng.uniform(-12, 0, 200), [1.0] * 5])
    for k in (4, 7):
        ctrl = PIController(k)
        for acc in (np.ones(err.size, bool), np.zeros(err.size, bool), rng.random(err.size) < .5):
            fac, new = ctrl.factors(err, prev, acc)
            ref = np.array([pi_factor(e, p, a, ctrl.alpha, ctrl.beta, ctrl.safety, ctrl.fmin,
                                      ctrl.fmax) for e, p, a in zip(err, prev, acc, strict=True)])
            np.testing.assert_allclose(fac, ref[:, 0], rtol=1e-15, atol=0)
            np.testing.assert_array_equal(new, ref[:, 1])
    # the rule itself: accepted steps grow at most 5x and update the history; rejected ones
    # shrink (at most 5x) and keep it; a non-finite error gives the smallest ratio
    ctrl = PIController(4)
    f, p = ctrl.factors([1e-20, 0.5, 4.0, np.nan], [1.0, 0.5, 0.5, 0.5], [True, True, False, True])
    assert f[0] == 5.0 and p[0] == 1e-10
    assert f[1] == pytest.approx(0.9 * 0.5 ** (-0.7 / 5) * 0.5 ** (0.4 / 5)) and p[1] == 0.5
    assert f[2] == pytest.approx(0.9 * 4.0 ** (-0.7 / 5)) and p[2] == 0.5
    assert f[3] == 0.2 and p[3] == 0.5
    # the object's scalar form walks the same history
    c, hist = PIController(7), 1.0
    for e in (0.3, 2.0, 0.01, 0.7):
        acc = e <= 1.0
        ref, hist = pi_factor(e, hist, acc, c.alpha, c.beta, c.safety, c.fmin, c.fmax)
        assert c.factor(e, acc) == ref and c.prev == hist


def test_initial_step_second_part():
    # y' = lam * y: d1 = |lam| d0-ish, the Euler step gives d2 = lam^2 |y| / s exactly
    lam = np.array([-3.0, 0.5, 20.0])
    y0 = np.array([[1.0], [2.0], [0.5]])

    def f(y):
        return lam[:, None] * y

    rtol, atol = 1e-8, 1e-12
    h = initial_step(y0, f(y0), rtol, atol, h_max=np.inf, f=f, error_order=7)
    s = atol + rtol * np.abs(y0[:, 0])
    d0, d1 = np.abs(y0[:, 0]) / s, np.abs(lam * y0[:, 0]) / s
    h0 = 0.01 * d0 / d1
    d2 = lam ** 2 * np.abs(y0[:, 0]) / s
    np.testing.assert_allclose(h, np.minimum(100 * h0, (0.01 / np.maximum(d1, d2)) ** (1 / 8)),
                               rtol=1e-12)
    first = initial_step(y0, f(y0), rtol, atol, h_max=np.inf)
    np.testing.assert_allclose(first, h0, rtol=1e-12)
    with pytest.raises(ArgumentError, match="error_order"):
        initial_step(y0, f(y0), rtol, atol, f=f)


@pytest.mark.slow  # over 10 s on 2 cores (interpreted path)
def test_both_paths_use_the_package_controller(monkeypatch):
    # both paths size their steps with the PI rule of PIController(DOP853.error_order) (the
    # controller's own exponents): a more cautious controller must change both paths' step
    # counts, and the paths keep taking the same steps
    att, covs, _ = _paper_grid(10)

    class Cautious(PIController):
        def __init__(self, error_order):
            super().__init__(error_order, safety=0.5)

    kw = {"t_max": 10.0, "blowup_threshold": 1e3}
    m0 = np.zeros((len(covs), 2))
    ctl = gaussian_member.controls(1e-10, 1e-12, 0.0, 0.0, 1e-10, 1, 10)
    assert ctl[lockstep.CTL_PI] == 0.7 / 8                     # DOP853: error order 7
    with _answer():
        base_np = g.solve_batch(att, m0, covs, use_numba=False, **kw)
    with _answer():
        base_nb = g.solve_batch(att, m0, covs, **kw)
    monkeypatch.setattr(gaussian_member, "PIController", Cautious)
    with _answer():
        slow_np = g.solve_batch(att, m0, covs, use_numba=False, **kw)
    with _answer():
        slow_nb = g.solve_batch(att, m0, covs, **kw)
    assert slow_np.n_steps.sum() > 1.2 * base_np.n_steps.sum()
    assert slow_nb.n_steps.sum() > 1.2 * base_nb.n_steps.sum()
    np.testing.assert_array_equal(base_np.n_steps, base_nb.n_steps)
    np.testing.assert_array_equal(slow_np.n_steps, slow_nb.n_steps)
    np.testing.assert_allclose(slow_nb.blowup_time, base_nb.blowup_time, rtol=1e-9)


# ----------------------------------------------------------------------------- exact solutions
@pytest.mark.parametrize("use_numba", [True, False])
@pytest.mark.parametrize("d", [2, 3])
def test_exact_blowup_times_states_and_limits(use_numba, d):
    """V = I, A + A^T with a positive eigenvalue: Sigma(t) = (S0^-1 - t (A + A^T))^-1 up to
    T* = 1/lambda_max(S0^1/2 (A + A^T) S0^1/2), rank-one limit (d = 2 runs the kernel
    compiled for d = 2, d = 3 the generic one)."""
    rng = np.random.default_rng(11 + d)
    A = rng.normal(size=(d, d)) + 1.5 * np.eye(d)
    covs = []
    for r in (d, d, d, d - 1):
        F = rng.normal(size=(d, r))
        covs.append(F @ F.T / d)
    covs = np.stack(covs)
    att = Attention("softmax", A, np.eye(d), np.eye(d))
    T = np.array([g.blowup_time_identity_value(A, S) for S in covs])
    assert np.all(np.isfinite(T))
    te = np.linspace(0, 0.98 * T.min(), 7)
    with _answer():
        b = g.solve_batch(att, np.zeros((4, d)), covs, t_max=10 * T.max(), t_eval=te,
                          use_numba=use_numba)
    assert list(b.status) == ["blowup"] * 4
    np.testing.assert_allclose(b.blowup_time, T, rtol=1e-8)
    for i, S0 in enumerate(covs):
        np.testing.assert_allclose(b.limit[i], _exact_limit(A, S0), rtol=0, atol=1e-8)
        for t, S in zip(te, b.traj_covs[i], strict=True):
            ex = g.exact_softmax_identity_value(A, S0, t)
            np.testing.assert_allclose(S, ex, rtol=1e-8, atol=1e-8 * np.abs(ex).max())
        # the final state lies on the threshold (1e8), reached at the exact time tr Sigma(t)
        # = 1e8 (the state itself is ill-conditioned there: dSigma/Sigma = dt/(T* - t))
        np.testing.assert_allclose(np.trace(b.covs[i]), 1e8, rtol=1e-11)
        t_thr = brentq(lambda t, S0=S0: np.log(np.trace(g.exact_softmax_identity_value(A, S0, t)))
                       - np.log(1e8), 0.0, T[i] * (1 - 1e-12), xtol=1e-15, rtol=1e-15)
        assert b.t_final[i] == pytest.approx(t_thr, rel=1e-9)


@pytest.mark.parametrize("use_numba", [True, False])
def test_exact_convergence(use_numba):
    # A = -I, V = I: Sigma' = -2 Sigma^2, Sigma(t) = (S0^-1 + 2t)^-1 -> 0 ("converged" at the
    # time the criterion fires, the state there the exact one)
    att = Attention("softmax", -np.eye(2), np.eye(2), np.eye(2))
    rng = np.random.default_rng(3)
    F = rng.normal(size=(5, 2, 2))
    covs = F @ np.swapaxes(F, 1, 2) + 0.1 * np.eye(2)
    b = g.solve_batch(att, np.zeros((5, 2)), covs, t_max=1e4, use_numba=use_numba)
    assert list(b.status) == ["converged"] * 5
    for i, S0 in enumerate(covs):
        ex = np.linalg.inv(np.linalg.inv(S0) + 2 * b.t_final[i] * np.eye(2))
        np.testing.assert_allclose(b.covs[i], ex, rtol=1e-8, atol=1e-8 * np.abs(ex).max())


@pytest.mark.slow  # 8 s on 2 cores (interpreted path on the paper's grid)
# ----------------------------------------------------------------------------- parity, threads
def test_paths_agree_on_the_paper_grid():
    att, covs, A = _paper_grid(40)
    covs = covs[::9]
    kw = {"t_max": 1000.0, "blowup_threshold": 1e3}
    with _answer():
        nb = g.solve_batch(att, np.zeros((len(covs), 2)), covs, **kw)
    with _answer():
        npy = g.solve_batch(att, np.zeros((len(covs), 2)), covs, use_numba=False, **kw)
    assert list(nb.status) == list(npy.status) == ["blowup"] * len(covs)
    T = np.array([g.blowup_time_identity_value(A, S) for S in covs])
    np.testing.assert_allclose(nb.blowup_time, T, rtol=1e-8)
    np.testing.assert_allclose(npy.blowup_time, T, rtol=1e-8)
    np.testing.assert_array_equal(nb.n_steps, npy.n_steps)
    np.testing.assert_allclose(nb.blowup_time, npy.blowup_time, rtol=1e-11)
    np.testing.assert_allclose(nb.t_final, npy.t_final, rtol=1e-11)
    np.testing.assert_allclose(nb.limit, npy.limit, rtol=0, atol=1e-10)
    for b in (nb, npy):
        np.testing.assert_allclose(np.trace(b.covs, axis1=1, axis2=2), 1e3, rtol=1e-11)


def test_results_do_not_depend_on_the_thread_count():
    numba = pytest.importorskip("numba")
    n_max = numba.config.NUMBA_NUM_THREADS
    if n_max < 2:
        pytest.skip("numba has a single thread")
    att, covs, _ = _paper_grid(30)
    rng = np.random.default_rng(4)
    B = len(covs)
    assert B >= gaussian_member.PAR_MIN_MEMBERS        # the parallel kernel runs
    means = rng.normal(size=(B, 2)) * 0.2
    kw = {"t_max": 1000.0, "blowup_threshold": 1e3, "t_eval": np.linspace(0, 0.3, 4)}
    before = numba.get_num_threads()
    out = {}
    try:
        for n in sorted({1, 2, n_max}):
            numba.set_num_threads(n)
            with _answer():
                out[n] = g.solve_batch(att, means, covs, **kw)
    finally:
        numba.set_num_threads(before)
    ref = out[1]
    for n, b in out.items():
        assert list(b.status) == list(ref.status), n
        for name in ("blowup_time", "t_final", "means", "covs", "limit", "n_steps",
                     "traj_means", "traj_covs"):
            np.testing.assert_array_equal(getattr(b, name), getattr(ref, name), err_msg=name)


# ----------------------------------------------------------------------------- random V
def _square_draws(d, draws, value="random"):
    """The draws of ``paper.rank_sweep("softmax", d, value=value, seed=0)``."""
    from transformer_pde.paper.scalings import paper_attention

    rng = np.random.default_rng([0, d, 0 if value == "identity" else 1])
    atts = []
    for _ in range(draws):
        Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
        V = np.eye(d) if value == "identity" else rng.normal(size=(d, d))
        atts.append(paper_attention("softmax", Q, K, V))
    F = rng.normal(size=(draws, d, d))
    return atts, F @ np.swapaxes(F, -1, -2) / d


def test_limits_are_psd_with_unit_trace_for_random_values():
    # softmax, random V, d = 3: at draw 62 the shape still moves fast at T* (blow-up exponent
    # q = 1.3), so its linear extrapolation to T* leaves the PSD cone (eigenvalue -0.02);
    # such a member keeps the shape measured at tr Sigma = 1e10 (and says so)
    atts, covs = _square_draws(3, 100)
    with _answer():
        b = g.solve_batch(atts, np.zeros((100, 3)), covs, t_max=30.0, blowup_threshold=1e3,
                          rtol=1e-6, atol=1e-9, max_steps=2000)
    assert np.sum(b.status == "blowup") > 30
    lam = np.linalg.eigvalsh(b.limit)
    assert lam[:, 0].min() >= -1e-6
    np.testing.assert_allclose(np.trace(b.limit, axis1=1, axis2=2), 1.0, rtol=1e-12)
    assert b.status[62] == "blowup" and "not positive semi-definite" in b.messages[62]


@pytest.mark.slow  # over 10 s on 2 cores
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_stiff_continuation_with_a_spent_budget_ends_cleanly():
    # softmax, random V, d = 5, draw 50: stiff, handed to the stiff method (LSODA; Radau
    # before), whose continuation past the threshold may spend its step budget: the run
    # ends with a status, without an error from scipy's event root finding (the
    # step-counting event is a function of s only)
    atts, covs = _square_draws(5, 100)
    b = g.solve_batch(atts[50], np.zeros((1, 5)), covs[50:51], t_max=30.0,
                      blowup_threshold=1e3, rtol=1e-6, atol=1e-9, max_steps=2000)
    assert b.status[0] in ("max_steps", "blowup", "diverging"), b.messages[0]
    assert np.all(np.isfinite(b.covs[0])) and np.isfinite(b.t_final[0])


def test_only_members_without_an_answer_warn_and_warn_false_silences(monkeypatch):
    # a blow-up is an answer (status only); a member whose budget runs out is not: one
    # warning for the call, naming the count; warn=False keeps the statuses, drops it
    from transformer_pde.gaussian import trajectory as gaussian_trajectory
    monkeypatch.setattr(gaussian_trajectory, "STIFF_STEPS", 5)
    monkeypatch.setattr(gaussian_trajectory, "IMPLICIT_STEPS", 5)
    att = Attention("softmax", [[1.0, 0.3], [-0.3, 0.5]], np.eye(2), [[0.2, -1.0], [1.0, 0.1]])
    covs = np.stack([0.01 * np.eye(2), 0.02 * np.eye(2)])
    kw = {"t_max": 50.0, "convergence": "relative", "max_steps": 5, "use_numba": False}
    with pytest.warns(EarlyStopWarning, match=r"2 of 2 members ended without an answer"):
        b = g.solve_batch(att, np.zeros((2, 2)), covs, **kw)
    assert list(b.status) == ["max_steps"] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        quiet = g.solve_batch(att, np.zeros((2, 2)), covs, warn=False, **kw)
    assert list(quiet.status) == list(b.status) and quiet.messages == b.messages
    with pytest.raises(TypeError, match="warn must be a bool"):
        g.solve_batch(att, np.zeros((2, 2)), covs, warn=1, **kw)
