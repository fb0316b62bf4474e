"""Issue 40 (trust, round 3) for the Gaussian moment solvers: stiff members, output times
after a convergence, and refused covariances.

Tolerances: states of converged runs against the exact 1-D law 1e-8 relative (the global
error of the adaptive pair at the default rtol = 1e-10 is ~1e2 rtol); the threshold time of
the stiff linear member 1e-5 relative against scipy's LSODA on the raw covariance ODE in
``t`` (that reference carries Sigma itself, whose collapsed direction is an eigenvalue of
~1e-13 next to 1e8, so it resolves the time only to ~1e-6: its rtol 1e-10 and 1e-12 runs
differ by 6e-7).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import solve_ivp

from transformer_pde import gaussian as g
from transformer_pde.attention import Attention
from transformer_pde.errors import ArgumentError, EarlyStopWarning
from transformer_pde.gaussian import trajectory as gaussian_trajectory


def _linear_draws(n=40, d=4, seed=1):
    """Linear-attention draws with N(0, 1) Q, K, V and Sigma_0 = F F^T / d: among the first
    40 of seed 1, draws 3, 5, 6, 16, 26, 31 and 36 are stiff (a direction of Sigma
    contracts at a rate ~ tr Sigma while the rest moves at O(1) rates)."""
    rng = np.random.default_rng(seed)
    params, covs = [], []
    for _ in range(n):
        Q, K, V = rng.normal(size=(3, d, d))
        params.append((Q, K, V))
        F = rng.normal(size=(d, d))
        covs.append(F @ F.T / d)
    return params, np.array(covs)


def _raw_threshold_time(Q, K, V, S0, size):
    """Time at which tr Sigma reaches ``size`` for the linear kind (mean 0), by LSODA on the
    raw ODE Sigma' = M Sigma + Sigma M^T, M = V Sigma K^T Q, in t (no factor, no clock)."""
    A = K.T @ Q
    d = S0.shape[0]

    def f(_t, y):
        S = y.reshape(d, d)
        M = V @ S @ A
        return (M @ S + S @ M.T).ravel()

    def jac(_t, y):
        S = y.reshape(d, d)
        M = V @ S @ A
        J = np.empty((d * d, d * d))
        for j in range(d * d):
            E = np.zeros(d * d)
            E[j] = 1.0
            E = E.reshape(d, d)
            dM = V @ E @ A
            J[:, j] = (dM @ S + M @ E + E @ M.T + S @ dM.T).ravel()
        return J

    def ev(_t, y):
        return math.log(np.trace(y.reshape(d, d))) - math.log(size)
    ev.terminal = True
    sol = solve_ivp(f, (0.0, 30.0), S0.ravel(), method="LSODA", rtol=1e-10, atol=1e-14,
                    jac=jac, events=[ev])
    assert sol.status == 1
    return float(sol.t_events[0][0])


# ----------------------------------------------------------------------------- stiff members
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_stiff_linear_member_is_answered_by_the_stiff_method():
    # draw 3: the explicit budget (4000 steps) ends at t ~ 0.40 with M's eigenvalues
    # -3.6e3 ... 14 (ratio ~1e3, growing with tr Sigma); it used to end "max_steps" after
    # 500 Radau steps (seconds per member), now LSODA reaches the threshold: a divergence
    params, covs = _linear_draws()
    Q, K, V = params[3]
    att = Attention("linear", Q, K, V)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        b = g.solve_batch(att, np.zeros((1, 4)), covs[3:4], t_max=30.0)
    assert b.status[0] == "diverging", b.messages[0]
    t_ref = _raw_threshold_time(Q, K, V, covs[3], 1e8)
    assert b.t_final[0] == pytest.approx(t_ref, rel=1e-5)
    assert np.trace(b.covs[0]) == pytest.approx(1e8, rel=1e-10)


def test_stiff_member_stops_early_with_the_stiff_status_and_advice(monkeypatch):
    # a budget too small for the projected steps: the member stops at the second chunk
    # (not at the end of its budget), status max_steps, and the message says why and what
    # to do; the states it reached stay right (t_eval before the stop)
    monkeypatch.setattr(gaussian_trajectory, "IMPLICIT_CHUNK", 20)
    monkeypatch.setattr(gaussian_trajectory, "IMPLICIT_STEPS", 10_000)
    monkeypatch.setattr(gaussian_trajectory, "STIFF_STEPS", 300)
    params, covs = _linear_draws()
    Q, K, V = params[3]
    att = Attention("linear", Q, K, V)
    te = np.array([0.05, 0.1])
    with pytest.warns(EarlyStopWarning, match="stiff"):
        tr = g.solve(att, np.zeros(4), covs[3], t_max=30.0, t_eval=te)
    assert tr.status == "max_steps" and tr.t_final < 30.0
    assert tr.message.startswith("stiff: stopped at t=")
    assert "shorten t_max or loosen rtol" in tr.message and "budget left: " in tr.message
    ref = g.solve(att, np.zeros(4), covs[3], t_max=0.1, t_eval=te)
    np.testing.assert_allclose(tr.covs, ref.covs, rtol=1e-8)


# ----------------------------------------------------------------------------- t_eval
_KINDS = [("softmax", {}), ("linear", {}), ("l2", {"l2_beta": 0.5}), ("sinkhorn", {})]


@pytest.mark.parametrize("kind, kw", _KINDS, ids=[k for k, _ in _KINDS])
@pytest.mark.parametrize("te", [[0.0, 0.5, 2.0], [0.5, 1.0, 2.0]], ids=["from0", "later"])
def test_stationary_from_the_start_reports_every_time(kind, kw, te):
    # zero mean and covariance: the field vanishes (M = 0, b = 0), the state stays; every
    # requested time is reported (it used to return no time at all, or only t = 0)
    rng = np.random.default_rng(5)
    Q, K, V = rng.normal(size=(3, 2, 2))
    att = Attention(kind, Q, K, V, **kw)
    te = np.array(te)
    tr = g.solve(att, np.zeros(2), np.zeros((2, 2)), t_max=2.0, t_eval=te)
    assert tr.status == "converged"
    np.testing.assert_array_equal(tr.times, te)
    assert np.all(tr.covs == 0.0) and np.all(tr.means == 0.0)
    for nb in (True, False):
        b = g.solve_batch(att, np.zeros((1, 2)), np.zeros((1, 2, 2)), t_max=2.0, t_eval=te,
                          use_numba=nb)
        assert np.all(b.traj_covs == 0.0) and np.all(b.traj_means == 0.0)
        np.testing.assert_array_equal(b[0].times, te)


def test_zero_values_hold_any_covariance():
    # V = 0: M = 0 and b = 0 for every state (an equilibrium with Sigma != 0); 1e-14: the
    # round trip through the factor (Sigma = F F^T, F = Sigma^1/2 by eigh)
    S0 = np.array([[1.0, 0.3], [0.3, 0.5]])
    att = Attention("softmax", np.eye(2), np.eye(2), np.zeros((2, 2)))
    te = np.array([0.25, 1.0])
    tr = g.solve(att, [0.4, -1.0], S0, t_max=1.0, t_eval=te)
    np.testing.assert_array_equal(tr.times, te)
    np.testing.assert_allclose(tr.covs, [S0, S0], rtol=1e-14)
    b = g.solve_batch(att, [[0.4, -1.0]], S0[None], t_max=1.0, t_eval=te)
    np.testing.assert_allclose(b.traj_covs[0], [S0, S0], rtol=1e-14)


@pytest.mark.parametrize("convergence, tol", [("trace", 1e-2), ("auto", 1e-10)])
def test_output_times_after_a_convergence_follow_the_flow(convergence, tol):
    # 1-D softmax with v a = -1: sigma(t) = 1/(1 + 2t) (exact_softmax_1d); the run converges
    # (trace: at t = 49.5; algebraic approach: near t = 640) before the last output time:
    # the later times carry the flow's states, not the state at convergence (which would
    # be 1e2 % off at t = 1000 for the trace criterion)
    att = Attention("softmax", -np.eye(1), np.eye(1), np.eye(1))
    te = np.linspace(0.0, 1000.0, 11)
    mean, exact = g.exact_softmax_1d(1.0, -1.0, 0.0, 1.0, te)
    assert np.all(mean == 0.0)      # (a zero mean stays 0, not 0 * e^t = nan)
    tr = g.solve(att, [0.0], [[1.0]], t_max=1000.0, t_eval=te, convergence=convergence,
                 converge_tol=tol)
    assert tr.status == "converged" and tr.t_final < 700.0
    np.testing.assert_array_equal(tr.times, te)
    np.testing.assert_allclose(tr.covs[:, 0, 0], exact, rtol=1e-8)
    for nb in (True, False):
        b = g.solve_batch(att, [[0.0]], [[[1.0]]], t_max=1000.0, t_eval=te,
                          convergence=convergence, converge_tol=tol, use_numba=nb)
        if b.status[0] != "converged":
            continue          # (the batch's algebraic detector may not fire before t_max)
        np.testing.assert_allclose(b.traj_covs[0, :, 0, 0], exact, rtol=1e-8)


# ----------------------------------------------------------------------------- refusals
_BAD = {
    "negative": np.array([[1.0, 0.0], [0.0, -0.2]]),
    "indefinite": np.array([[1.0, 2.0], [2.0, 1.0]]),
    "asymmetric": np.array([[1.0, 0.5], [-0.5, 1.0]]),
}
_A = np.array([[0.5, 0.2], [0.1, -0.3]])


@pytest.mark.parametrize("call, name", [
    (lambda: g.exact_softmax_1d(1.0, 1.0, 0.0, -0.5, [0.1]), "var0"),
    (lambda: g.blowup_time_softmax_1d(1.0, 1.0, -0.5), "var0"),
    (lambda: g.exact_linear_1d(1.0, 1.0, 0.3, -0.5, [0.1]), "var0"),
    (lambda: g.exact_linear_1d(1.0, 1.0, 0.3, 0.0, [0.1]), "var0"),
    (lambda: g.l2_variance_rate_1d(1.0, 1.0, 1.0, -1.0), "var"),
    (lambda: g.sinkhorn_variance_rate_1d(1.0, 1.0, -1.0), "var"),
    (lambda: g.exact_softmax_1d(1.0, 1.0, 0.0, 0.5, [0.1, math.nan]), "t"),
    (lambda: g.exact_softmax_1d(1.0, math.inf, 0.0, 0.5, 0.1), "a"),
], ids=["softmax_1d", "blowup_1d", "linear_1d", "linear_1d_zero", "l2_rate", "sinkhorn_rate",
        "nan_time", "inf_a"])
def test_exact_1d_references_refuse_bad_arguments(call, name):
    with pytest.raises(ArgumentError, match=rf"^{name} (must|contains)"):
        call()


@pytest.mark.parametrize("bad", list(_BAD), ids=list(_BAD))
def test_every_gaussian_entry_point_refuses_a_bad_covariance(bad):
    S = _BAD[bad]
    att = Attention("softmax", _A, np.eye(2), np.eye(2))
    calls = {
        "cov0": [lambda: g.exact_softmax_identity_value(_A, S, 0.1),
                 lambda: g.blowup_time_identity_value(_A, S),
                 lambda: g.exact_softmax_commuting(np.eye(2), np.eye(2), np.zeros(2), S, 0.1),
                 lambda: g.solve(att, np.zeros(2), S, t_max=1.0)],
        "covs0": [lambda: g.solve_batch(att, np.zeros((1, 2)), S[None], t_max=1.0)],
        "cov": [lambda: g.affine_field(att, np.zeros(2), S),
                lambda: g.moment_ode(att, np.zeros(2), S)],
    }
    for name, fs in calls.items():
        for f in fs:
            with pytest.raises(ArgumentError, match=rf"^{name} must be (symmetric|positive)"):
                f()


# ----------------------------------------------------------------------------- fuzz
_EIG = st.sampled_from([-1.0, -1e-3, -1e-14, 0.0, 1e-12, 0.3, 1.0])


@settings(max_examples=25)
@given(lam=st.lists(_EIG, min_size=2, max_size=2), theta=st.floats(0.0, math.pi),
       zero_mean=st.booleans(), t0=st.sampled_from([[0.0], [0.0, 0.05], [0.05, 0.1]]))
def test_fuzz_gaussian_entry_points_on_edge_covariances(lam, theta, zero_mean, t0):
    # covariances with zero, slightly negative (round-off) and negative eigenvalues, t_eval
    # at 0 and later: each entry point refuses exactly the covariances that the package's
    # rule (validation.covariance: lambda_min >= -1e-12 sum |lambda|) refuses, naming the
    # argument; accepted ones give finite PSD results at every requested time
    c, s = math.cos(theta), math.sin(theta)
    U = np.array([[c, -s], [s, c]])
    S = U @ np.diag(lam) @ U.T
    S = 0.5 * (S + S.T)
    ok = min(lam) >= -1e-12 * max(sum(abs(x) for x in lam), 1e-300)
    m0 = np.zeros(2) if zero_mean else np.array([0.2, -0.1])
    att = Attention("softmax", _A, np.eye(2), -np.eye(2))
    te = np.array(t0)
    calls = [("cov0", lambda: g.solve(att, m0, S, t_max=0.1, t_eval=te, warn=False)),
             ("covs0", lambda: g.solve_batch(att, m0[None], S[None], t_max=0.1, t_eval=te,
                                             use_numba=False, warn=False)),
             ("cov", lambda: g.affine_field(att, m0, S)),
             ("cov0", lambda: g.exact_softmax_identity_value(_A, S, 0.05))]
    if lam[0] == lam[1] and lam[0] >= 0:
        calls.append(("var0", lambda: g.exact_softmax_1d(1.0, 0.5, 0.0, lam[0], te)))
    for name, f in calls:
        if not ok:
            with pytest.raises(ArgumentError, match=rf"^{name} must be"):
                f()
            continue
        out = f()
        if name == "cov0" and isinstance(out, gaussian_trajectory.GaussianTrajectory):
            np.testing.assert_array_equal(out.times, te)
            assert np.all(np.isfinite(out.covs))
            assert np.all(np.linalg.eigvalsh(out.covs)[:, 0] >= -1e-12)
        elif name == "covs0":
            assert np.all(np.isfinite(out.traj_covs))


@pytest.mark.slow  # 8 s warm on a loaded 2-core machine (117 s before the stiff hand-off changed)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_stiff_linear_members_of_a_batch_are_answered_or_stopped_early():
    # the case in small: the 7 stiff members among 40 linear d = 4 draws; each
    # used to spend its whole budget (4000 explicit + 500 Radau steps) and end "max_steps";
    # now each is answered (diverging at the threshold, or ok at t_max) or stopped early
    # as stiff, well inside the budget
    params, covs = _linear_draws()
    stiff = [3, 5, 6, 16, 26, 31, 36]
    atts = [Attention("linear", *params[i]) for i in stiff]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        b = g.solve_batch(atts, np.zeros((len(stiff), 4)), covs[stiff], t_max=30.0)
    answered = b.success
    assert answered.sum() >= 6, b.messages
    for j in np.nonzero(~answered)[0]:
        assert b.status[j] == "max_steps" and b.messages[j].startswith("stiff:")
    assert set(b.status[answered]) <= {"diverging", "ok"}
    reached = b.status == "diverging"
    np.testing.assert_allclose(np.trace(b.covs[reached], axis1=1, axis2=2), 1e8, rtol=1e-10)


def test_an_atol_below_float64_is_the_solvers_error_not_a_runtime_error():
    # scipy cannot take a step when atol asks for more than float64 resolves; this was a bare
    # RuntimeError (an internal error, exit 5, in the CLI), it is the library's solver error
    # saying which tolerances to loosen
    from transformer_pde.errors import SolverNotConverged

    I2 = np.eye(2)
    att = Attention("softmax", I2, I2, I2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # scipy's own, on the way to failing
        with pytest.raises(SolverNotConverged, match="atol = 1e-300"):
            g.solve(att, np.zeros(2), np.diag([1.0, 0.5]), t_max=5.0, atol=1e-300)
