"""The integrator of solve_batch compiled (members side by side in SIMD lanes) against
the same code run by the interpreter in one lane, member by member (``use_numba=False``).

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


def _lane_run(lanes: int, threads: int, kind: str = "softmax"):
    att = Attention(kind, Q / np.sqrt(2), K, np.eye(2))
    covs = _grid(10 if kind == "softmax" else 5)
    B = len(covs)
    sysm = MomentSystem([att], B)
    idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), np.zeros((B, 2)), psd_factor(covs), idx)
    bps = np.zeros(0)
    t_max = 1000.0 if kind == "softmax" else 2.0
    stops = np.array([[t_max], [-1.0], [0.0]])
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
    lockstep.run(Y, Yc, np.empty((B, 1, sysm.n)), h0, prm, con, stops, stops_c, ctl,
                 atol_vec, (DOP853.A, DOP853.b, DOP853.e, DOP853.e_aux), codes,
                 kind in ("l2", "sinkhorn"), threads, lanes)
    return Y, Yc, codes


@pytest.mark.parametrize("kind", ["softmax", "l2"])
def test_results_do_not_depend_on_lanes_or_chunks(kind):
    # a member's arithmetic is the same in every lane and chunk: the same computation
    # (l2: only the lanes that need the field evaluate it, one by one)
    ref = _lane_run(1, 1, kind)
    if kind == "softmax":
        assert np.all(ref[2][:, 0] == 1) and np.all(ref[2][:, 1] >= 0)
    assert np.all(ref[2][:, 2] > 0)
    for lanes, threads in ((5, 1), (64, 1), (4, 2)):
        out = _lane_run(lanes, threads, kind)
        for a, b in zip(out, ref, strict=True):
            np.testing.assert_array_equal(a, b)


# Results of solve_batch at commit c9033c2, before its two integrators (per member:
# l2 / Sinkhorn and interpreted; lockstep: compiled softmax / linear) became one, per case
# (member by member) t_final, Sigma_00, Sigma_dd, mean_0, accepted steps and Sigma_00 at
# the last t_eval.  Both paths, compiled and interpreted, are held to 1e-12 relative: they
# differ from each other by rounding only (below 1e-14 here), and any change of a step
# decision moves these numbers by the integration error (1e-10 and more).  The converging
# members: only the state at t = 5000 (the time of convergence itself moves by 1e-3 with
# the rounding of the rate that crosses the tolerance).
_C2 = np.array([[[0.6, 0.1], [0.1, 0.4]], [[0.3, -0.2], [-0.2, 0.7]], [[0.5, 0.0], [0.0, 0.5]]])
_C3 = np.array([[[0.6, 0.1, 0.0], [0.1, 0.4, 0.1], [0.0, 0.1, 0.5]], np.eye(3) * 0.3])
_GOLDEN = {
    # the paper's softmax field (blow-ups: threshold landing, continuation, T*), with means
    "softmax d=2": ((Attention("softmax", Q / np.sqrt(2), K, np.eye(2)), np.array(
        [[0.1, -0.2], [0.0, 0.3], [0.2, 0.2]]), _C2,
        {"t_max": 100.0, "blowup_threshold": 1e3, "t_eval": [0.0, 0.3]}),
        [0.7392702041945457, 0.6271446302344541, 0.70198914048979, 313.4496044667735,
         31.19936230070728, 86.02985915428063, 686.5503955332226, 968.8006376992917,
         913.970140845719, -8.958888177777654, -3.8066694151194103, 6.622407975548158, 32.0,
         30.0, 30.0, 0.7179270597148643, 0.322729526344229, 0.5398784671802183]),
    # members converging at different times, outputs after the convergence
    "softmax converging": ((Attention("softmax", -np.eye(2), np.eye(2), np.eye(2)),
                            np.zeros((3, 2)), _C2, {"t_max": 1e4, "t_eval": [1.0, 5000.0]}),
                           [9.99826119086274e-05, 9.995884186015458e-05, 9.998000399920861e-05]),
    # one parameter set per member, d = 3, a layer breakpoint
    "linear d=3 layers": (([Attention("linear", np.eye(3) * b, np.eye(3),
                                      Layers(np.stack([np.eye(3), -0.5 * np.eye(3)])))
                            for b in (0.3, 0.6)], np.full((2, 3), 0.1), _C3,
                           {"t_max": 2.0, "t_eval": [0.5, 2.0]}),
                          [2.0, 2.0, 0.7401623625411465, 0.36859071832613494,
                           0.5956738342790368, 0.36859071832613477, 0.11308706244106431,
                           0.11166390612088811, 21.0, 21.0, 0.7401623625411465,
                           0.36859071832613494]),
    "l2 d=2": ((Attention("l2", Q, K, np.eye(2)), np.zeros((3, 2)), _C2, {"t_max": 3.0}),
               [3.0, 3.0, 3.0, 1.1641523265136833, 0.5203307066740253, 0.7299735515155932,
                1.6234659296429717, 3.9046828225441543, 2.283698696026387, 0.0, 0.0, 0.0,
                17.0, 19.0, 18.0]),
    "sinkhorn d=2": ((Attention("sinkhorn", [[0.9, 0.2], [-0.3, 0.7]], np.eye(2),
                                [[0.8, -0.4], [0.3, 0.5]]),
                      np.array([[0.3, -0.2], [0.0, 0.1]]), _C2[:2], {"t_max": 4.0}),
                     [4.0, 4.0, 36.59376964431339, 117.79297841328962, 38.15114366821801,
                      13.791887356487488, 6.390602139237884, -1.6362057195170456, 42.0, 50.0]),
    # the step budget spent (the member is continued by the stiff method)
    "softmax budget": ((Attention("softmax", np.diag([1.0, -30.0]), np.eye(2), np.eye(2)),
                        np.zeros((1, 2)), _C2[:1], {"t_max": 5.0, "max_steps": 30}),
                       [0.8678366119158917, 99993677.6474605, 6322.352539781024, 0.0, 176.0]),
}


@pytest.mark.parametrize("use_numba", [True, False])
@pytest.mark.parametrize("name", list(_GOLDEN))
def test_results_equal_those_before_the_integrators_merged(name, use_numba):
    (att, means, covs, kw), want = _GOLDEN[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        res = g.solve_batch(att, means, covs, use_numba=use_numba, **kw)
    got = [res.t_final, res.covs[:, 0, 0], res.covs[:, -1, -1], res.means[:, 0],
           res.n_steps.astype(float)]
    if res.t_eval is not None:
        got.append(res.traj_covs[:, -1, 0, 0])
    got = np.concatenate(got)
    if name == "softmax converging":
        assert list(res.status) == ["converged"] * 3
        got = got[-3:]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
