"""The lockstep kernel of solve_batch (softmax / linear members side by side in SIMD lanes)
against the per-member integrator run by the interpreter (``use_numba=False``).

Both take the same decisions (steps, stops, landings, convergence tests) with the same
arithmetic up to rounding (the compiled and the interpreted exp / log / sqrt may differ in
the last bit), so statuses agree, step counts up to a decision that rounding flips, and
states to a few ulps per step: the tolerances below (1e-11 relative on T* and states, 1e-9 on the ill-conditioned
t_final on the threshold) leave room for that rounding only, far below the integration
error (rtol 1e-10).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from transformer_pde import gaussian as g
from transformer_pde.attention import Attention, Layers
from transformer_pde.errors import EarlyStopWarning
from transformer_pde.gaussian import lockstep
from transformer_pde.gaussian import member as gaussian_member
from transformer_pde.gaussian.affine import psd_factor
from transformer_pde.gaussian.system import CONVERGENCE_MODES, MomentSystem
from transformer_pde.integrate.tableaux import DOP853

pytestmark = pytest.mark.skipif(not lockstep.AVAILABLE, reason="needs numba")

Q = np.array([[-0.09678415830991538, 0.42220166048145347],
              [-0.22546156340099752, -0.6379430932117882]])
K = np.array([[-0.01628630369574242, 1.0442167783791647],
              [-1.0848803286340662, -2.2059248271588077]])


def _grid(n: int) -> np.ndarray:
    u = np.linspace(-1.0, 1.0, n)
    U, W = np.meshgrid(u, u, indexing="ij")
    keep = 1.0 - U ** 2 > W ** 2
    uu, ww = U[keep], W[keep]
    return np.stack([np.stack([(1 + uu) / 2, ww / 2], -1),
                     np.stack([ww / 2, (1 - uu) / 2], -1)], -2)


def _both(att, means, covs, **kw):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        for use_numba in (True, False):
            out.append(g.solve_batch(att, means, covs, use_numba=use_numba, **kw))
    return out


def _agree(nb, py):
    assert list(nb.status) == list(py.status)
    # the same step decisions; rounding may flip one whose error norm or landing test sits
    # at its bound (as between the compiled and the interpreted per-member integrator)
    assert np.all(np.abs(nb.n_steps - py.n_steps) <= 1)
    np.testing.assert_allclose(nb.blowup_time, py.blowup_time, rtol=1e-11)
    np.testing.assert_allclose(nb.t_final, py.t_final, rtol=1e-9)
    np.testing.assert_allclose(nb.covs, py.covs, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(nb.limit, py.limit, rtol=0, atol=1e-10)
    if nb.t_eval is not None:
        np.testing.assert_allclose(nb.traj_covs, py.traj_covs, rtol=1e-11, atol=1e-15)
        np.testing.assert_allclose(nb.traj_means, py.traj_means, rtol=1e-11, atol=1e-15)


def test_paper_grid_agrees_with_the_per_member_integrator():
    # the paper's d = 2 softmax grid (every member blows up: the threshold landing, the
    # continuation to the classification size and T* all run), with means and outputs
    att = Attention("softmax", Q / np.sqrt(2), K, np.eye(2))
    covs = _grid(8)
    rng = np.random.default_rng(3)
    means = rng.normal(size=(len(covs), 2)) * 0.2
    nb, py = _both(att, means, covs, t_max=1000.0, blowup_threshold=1e3,
                   t_eval=np.linspace(0.0, 0.3, 4))
    assert nb.counts()["blowup"] == len(covs)
    _agree(nb, py)
    # and T* is the exact one (V = I, zero means do not matter for Sigma)
    T = np.array([g.blowup_time_identity_value(K.T @ Q / np.sqrt(2), S) for S in covs])
    assert np.max(np.abs(nb.blowup_time / T - 1)) < 1e-9


def test_linear_kind_per_member_parameters_and_t0_convergence():
    # d = 3 linear attention with one parameter set per member; members 2 and 5 have V = 0
    # (a zero field: converged at t = 0, finished before any step, the lane refilled)
    rng = np.random.default_rng(11)
    d, B = 3, 7
    atts = []
    for i in range(B):
        Qi, Ki, Vi = rng.normal(size=(3, d, d)) * 0.5
        atts.append(Attention("linear", Qi, Ki, np.zeros((d, d)) if i in (2, 5) else Vi))
    means = rng.normal(size=(B, d)) * 0.3
    F = rng.normal(size=(B, d, d)) * 0.4
    covs = F @ np.swapaxes(F, 1, 2) + 0.05 * np.eye(d)
    nb, py = _both(atts, means, covs, t_max=3.0, t_eval=np.linspace(0.0, 3.0, 5))
    assert nb.status[2] == "converged" and nb.status[5] == "converged"
    assert nb.n_steps[2] == 0
    _agree(nb, py)


def test_layers_two_heads_breakpoints_agree():
    # piecewise-constant parameters (a layer breakpoint at t = 0.5 inside the run: the lane
    # waits for the field of the new layer) with two heads
    rng = np.random.default_rng(5)
    d, B = 4, 6
    V = Layers(np.stack([np.eye(d), -0.5 * np.eye(d)]))
    att = Attention("softmax", rng.normal(size=(d, d)) * 0.5, rng.normal(size=(d, d)) * 0.5,
                    V, heads=2, W_O=np.eye(d) + 0.1 * rng.normal(size=(d, d)))
    F = rng.normal(size=(B, d, d)) * 0.4
    covs = F @ np.swapaxes(F, 1, 2) + 0.05 * np.eye(d)
    means = rng.normal(size=(B, d)) * 0.2
    nb, py = _both(att, means, covs, t_max=1.5, t_eval=np.linspace(0.0, 1.5, 7))
    _agree(nb, py)


def _lane_run(lanes: int, threads: int):
    att = Attention("softmax", Q / np.sqrt(2), K, np.eye(2))
    covs = _grid(10)
    B = len(covs)
    sysm = MomentSystem([att], B)
    idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), np.zeros((B, 2)), psd_factor(covs), idx)
    bps = np.zeros(0)
    stops = np.array([[1000.0], [-1.0], [0.0]])
    stops_c = np.array([[math.inf], [-1.0], [0.0]])
    prm, con = gaussian_member.param_table([att], att.kind, bps)
    con[:, 1] = sysm.kappa
    atol_vec = np.full(sysm.n, 1e-12)
    atol_vec[1] = 1e-10
    ctl = gaussian_member.controls(1e-10, 1e-12, math.log(1e3), math.log(1e10), 1e-10,
                                   CONVERGENCE_MODES["auto"], 4000)
    Yc = np.empty_like(Y)
    codes = np.zeros((B, 3), dtype=np.int64)
    h0 = np.full(B, 1e-3)
    lockstep.run_chunks(Y, Yc, np.empty((B, 1, sysm.n)), h0, prm, con, stops, stops_c, ctl,
                        atol_vec, (DOP853.A, DOP853.b, DOP853.e, DOP853.e_aux), codes,
                        threads, lanes)
    return Y, Yc, codes


def test_results_do_not_depend_on_lanes_or_chunks():
    # a member's arithmetic is the same in every lane and chunk: the same computation
    ref = _lane_run(1, 1)
    assert np.all(ref[2][:, 0] == 1) and np.all(ref[2][:, 1] >= 0)
    for lanes, threads in ((5, 1), (64, 1), (4, 2)):
        out = _lane_run(lanes, threads)
        for a, b in zip(out, ref, strict=True):
            np.testing.assert_array_equal(a, b)
