"""The DOP853 integrator of solve_batch (transformer_pde.gaussian.lockstep): one code,
compiled by numba (members in lanes) or run by the interpreter member by member
(``use_numba=False``).

Rules: on one step sequence the two runs of one member differ by rounding only (the
interpreter's and the compiled exp / log / sqrt may differ in the last bit): at most 1e-13
relative (infinity norm of the packed state) after 12 steps; whole runs
at the default rtol 1e-10 take the same steps (codes, statuses and step counts equal) and
agree to 1e-11 at common times on every kind and on stable, blowing-up, converging,
degenerate-covariance and layered members.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest

from transformer_pde import gaussian as g
from transformer_pde.attention import Attention, Layers
from transformer_pde.errors import EarlyStopWarning
from transformer_pde.gaussian import lockstep, member
from transformer_pde.gaussian.affine import psd_factor
from transformer_pde.gaussian.system import CONVERGENCE_MODES, MomentSystem, layer_breakpoints
from transformer_pde.integrate.tableaux import DOP853

pytest.importorskip("numba")


def _rot(theta):
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


# name: (attention, mean, covariance)
MEMBERS = {
    "softmax stable (rotation)": (Attention("softmax", np.eye(2), np.eye(2), _rot(1.4) * 0.3),
                                  np.array([0.2, -0.1]), np.array([[0.5, 0.1], [0.1, 0.3]])),
    "softmax blow-up": (Attention("softmax", np.eye(2), np.eye(2), np.eye(2)), np.zeros(2),
                        np.array([[1.0, 0.3], [0.3, 0.5]])),
    "softmax converging": (Attention("softmax", -np.eye(2), np.eye(2), np.eye(2)), np.zeros(2),
                           np.array([[1.0, 0.3], [0.3, 0.5]])),
    "softmax rank one, d = 3": (Attention("softmax", np.diag([1.0, 0.5, -0.2]), np.eye(3),
                                          np.eye(3)), np.zeros(3),
                                np.outer([1.0, 0.5, -0.3], [1.0, 0.5, -0.3])),
    "linear with a mean": (Attention("linear", np.eye(2) * 0.5, np.eye(2), np.eye(2)),
                           np.array([0.3, 0.1]), np.array([[0.4, 0.0], [0.0, 0.2]])),
    "l2 singular keys (blow-up)": (Attention("l2", [[0.0, 1.0], [0.0, 0.0]], np.diag([1.0, 0.0]),
                                             np.diag([0.0, 1.0])), np.zeros(2),
                                   np.outer([1.0, 1.0], [1.0, 1.0]) + 1e-3 * np.eye(2)),
    "l2 two heads": (Attention("l2", np.diag([0.3, -0.2, 0.5, 0.1]), np.eye(4), np.eye(4),
                               heads=2), np.full(4, 0.1), np.eye(4) * 0.5),
    "sinkhorn": (Attention("sinkhorn", np.array([[0.9, 0.2], [-0.3, 0.7]]), np.eye(2),
                           np.array([[0.8, -0.4], [0.3, 0.5]])), np.array([0.3, -0.2]),
                 np.array([[0.4, 0.1], [0.1, 0.3]])),
    "sinkhorn singular covariance": (Attention("sinkhorn", np.eye(2), np.eye(2), np.eye(2)),
                                     np.zeros(2), np.outer([1.0, 0.5], [1.0, 0.5])),
    "layers (V = +1 then -1)": (Attention("softmax", [[0.4]], [[1.0]],
                                          Layers(np.array([[[1.0]], [[-1.0]]]))),
                                np.zeros(1), np.array([[0.5]])),
}


def _setup(att, mean, cov, *, t_max, budget, rtol, atol, h0, blowup_threshold=1e8):
    """The arguments of lockstep.run for one member, as solve_batch builds them."""
    sysm = MomentSystem([att], 1)
    idx = np.zeros(1, dtype=int)
    Y = sysm.pack(np.zeros(1), mean[None], psd_factor(cov[None]), idx)
    bps = layer_breakpoints([att], 0.0, math.inf)
    stops = np.concatenate([bps[bps < t_max], [t_max]])
    stop_tab = np.stack([stops, np.full(stops.size, -1.0), np.searchsorted(bps, stops)])
    stops_c = np.concatenate([bps, [math.inf]])
    cont_tab = np.stack([stops_c, np.full(stops_c.size, -1.0), np.searchsorted(bps, stops_c)])
    prm, con = member.param_table([att], att.kind, bps)
    con[:, 1] = sysm.kappa
    atol_vec = np.full(sysm.n, atol)
    atol_vec[1] = rtol
    ctl = member.controls(rtol, atol, math.log(blowup_threshold), math.log(1e10), 1e-10,
                          CONVERGENCE_MODES["auto"], budget)
    tab = (DOP853.A, DOP853.b, DOP853.e, DOP853.e_aux)
    return (Y, np.empty_like(Y), np.empty((1, 1, sysm.n)), np.array([h0]), prm, con,
            stop_tab, cont_tab, ctl, atol_vec, tab, np.zeros((1, 3), dtype=np.int64),
            att.kind in ("l2", "sinkhorn"))


@pytest.mark.parametrize("name", list(MEMBERS))
def test_compiled_and_interpreted_steps_agree_to_rounding(name):
    att, mean, cov = MEMBERS[name]
    # the same step sequence on both paths: with tolerances of 1e3 every step passes and its
    # error norm is floored, so the PI rule grows the steps by a fixed ratio (2.13) from h0
    # (with error estimates near rounding level, rounding would steer the step sizes and
    # the states after N steps would differ with them)
    n_steps = 12
    kw = {"t_max": 50.0, "budget": n_steps, "rtol": 1e3, "atol": 1e3, "h0": 1e-4}
    a_nb = _setup(att, mean, cov, **kw)
    a_py = _setup(att, mean, cov, **kw)
    lockstep.run(*a_nb, compiled=True)
    lockstep.run(*a_py, compiled=False)
    codes_nb, codes_py = a_nb[11], a_py[11]
    np.testing.assert_array_equal(codes_nb, codes_py)
    y_nb, y_py = a_nb[0][0], a_py[0][0]
    assert np.all(np.isfinite(y_nb))
    assert np.max(np.abs(y_nb - y_py)) <= 1e-13 * np.max(np.abs(y_nb))
    assert y_nb[0] > 0.0                              # it moved


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "sinkhorn singular covariance" else n
    for n in MEMBERS])  # that member: over 10 s on 2 cores
def test_whole_runs_take_the_same_steps(name):
    att, mean, cov = MEMBERS[name]
    kw = {"t_max": 10.0, "t_eval": np.linspace(0.0, 0.2, 3)}
    out = {}
    for use_numba in (True, False):
        with _quiet():
            out[use_numba] = g.solve_batch(att, mean[None], cov[None], use_numba=use_numba, **kw)
    nb, py = out[True], out[False]
    assert list(nb.status) == list(py.status)
    # the same step decisions; rounding may flip one where an error norm or a landing test
    # sits at its bound (the singular-covariance Sinkhorn member: 162 and 163 steps)
    assert np.all(np.abs(nb.n_steps - py.n_steps) <= 1)
    # t_final on the threshold is ill-conditioned (d log nu / dt large): 1e-9
    np.testing.assert_allclose(nb.t_final, py.t_final, rtol=1e-9)
    np.testing.assert_allclose(nb.blowup_time, py.blowup_time, rtol=1e-11)
    np.testing.assert_allclose(nb.traj_covs, py.traj_covs, rtol=1e-11, atol=1e-15)
    # (the limit shape is measured after the continuation to tr Sigma = 1e10: where one step
    # decision flipped, it moves by the integration error there)
    np.testing.assert_allclose(nb.limit, py.limit, rtol=0, atol=1e-8)


@pytest.mark.slow  # over 10 s on 2 cores (interpreted path on every member)
def test_step_counts_are_equal_on_the_table():
    same = 0
    for att, mean, cov in MEMBERS.values():
        with _quiet():
            n = [g.solve_batch(att, mean[None], cov[None], t_max=10.0, use_numba=u).n_steps[0]
                 for u in (True, False)]
        same += n[0] == n[1]
    assert same >= len(MEMBERS) - 1


@contextlib.contextmanager
def _quiet():
    """Early stops (blow-ups) are the subject here, not their warnings."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", EarlyStopWarning)
        yield


@pytest.mark.slow  # over 10 s on 2 cores (interpreted path on every member)
def test_member_statuses_on_the_table():
    # the outcome of each member of the table on both paths: (t_max, status)
    expected = {"softmax stable (rotation)": (10.0, "ok"), "softmax blow-up": (10.0, "blowup"),
                "softmax converging": (1e4, "converged"),
                "softmax rank one, d = 3": (10.0, "blowup"),
                "linear with a mean": (10.0, "blowup"),
                "l2 singular keys (blow-up)": (10.0, "blowup"), "l2 two heads": (10.0, "ok"),
                "sinkhorn": (10.0, "ok"), "sinkhorn singular covariance": (10.0, "diverging"),
                "layers (V = +1 then -1)": (10.0, "ok")}
    for name, (t_max, want) in expected.items():
        att, mean, cov = MEMBERS[name]
        for use_numba in (True, False):
            with _quiet():
                b = g.solve_batch(att, mean[None], cov[None], t_max=t_max, use_numba=use_numba)
            assert b.status[0] == want, (name, use_numba, b.messages[0])


def test_callable_parameters_are_integrated_by_solve():
    # parameters that are callables of t have no table of constant segments: such members
    # are integrated by solve's integrator (the same result as solve)
    att = Attention("softmax", np.eye(2), np.eye(2), lambda t: np.eye(2) * (1.0 + 0.1 * t))
    S0 = np.array([[1.0, 0.3], [0.3, 0.5]])
    with _quiet():
        b = g.solve_batch(att, np.zeros((1, 2)), S0[None], t_max=5.0)
        tr = g.solve(att, np.zeros(2), S0, t_max=5.0)
    assert b.status[0] == tr.status == "blowup"
    np.testing.assert_allclose(b.blowup_time[0], tr.blowup_time, rtol=1e-8)
