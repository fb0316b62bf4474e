"""The particle engine: layers as Euler steps, convergence orders, blow-up, I/O, dtypes.

References are independent of the library: residual attention layers written in plain
NumPy, and an exact solution of the 1-D linear-attention flow.  With Q = K = V = 1 (score
``a x y``), dx_i/dt = a x_i m2 where m2 = sum_j w_j x_j^2, so m2' = 2 a m2^2 and

    m2(t) = m2(0) / (1 - 2 m2(0) int_0^t a),   x_i(t) = x_i(0) sqrt(m2(t) / m2(0)).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings

import transformer_pde as tp
from transformer_pde.attention import Layers
from transformer_pde.backends import BACKENDS, register_backend
from transformer_pde.testing import attention_problems


# --------------------------------------------------------------------------- references
def residual_softmax_layer(X, Q, K, V):
    """x_i <- x_i + V sum_j softmax_j(<Q x_i, K x_j>) x_j, in plain NumPy."""
    logits = (X @ Q.T) @ (X @ K.T).T
    P = np.exp(logits - logits.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return X + (P @ X) @ V.T


def linear_1d_exact(x0, t, a_integral):
    """Exact 1-D linear-attention flow (module docstring); a_integral = int_0^t a."""
    m0 = np.mean(x0 ** 2)
    return x0 * np.sqrt(1.0 / (1.0 - 2.0 * m0 * a_integral))


def linear_1d(a=0.5):
    return tp.Attention("linear", [[1.0]], [[a]], [[1.0]])


X0_1D = np.array([[0.3], [-0.8], [1.0]])  # m2(0) = 0.5767: no blow-up before t = 1.73 (a = 1/2)


def fitted_order(errors, dts):
    return np.polyfit(np.log(dts), np.log(errors), 1)[0]


# --------------------------------------------------------------------------- layers
def test_euler_dt1_is_a_stack_of_residual_attention_layers(rng):
    X0 = rng.normal(size=(6, 3))
    Q, K, V = rng.normal(size=(3, 3, 3)) * 0.5
    traj = tp.simulate(tp.Attention("softmax", Q, K, V), X0, t_max=4, dt=1, solver="euler")
    X = X0
    for layer in range(4):
        X = residual_softmax_layer(X, Q, K, V)
        # only summation order differs from the library: round-off level
        np.testing.assert_allclose(traj.states[layer + 1], X, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(traj.times, [0, 1, 2, 3, 4])


def test_euler_on_layers_table_equals_distinct_hand_written_layers(rng):
    L = 4
    X0 = rng.normal(size=(5, 2))
    Qs, Ks, Vs = (rng.normal(size=(L, 2, 2)) * 0.6 for _ in range(3))
    att = tp.Attention("softmax", Layers(Qs), Layers(Ks), Layers(Vs))
    traj = tp.simulate(att, X0, t_max=L, dt=1, solver="euler")
    X = X0
    for layer in range(L):
        X = residual_softmax_layer(X, Qs[layer], Ks[layer], Vs[layer])
        np.testing.assert_allclose(traj.states[layer + 1], X, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method,tol", [
    ("rk4", 1e-13),                                      # identical arithmetic, round-off only
    (tp.Dopri5(rtol=1e-10, atol=1e-12), 1e-8),  # two adaptive runs, each ~1e-10 accurate
])
def test_sub_layer_steps_never_mix_layers(method, tol, rng):
    # a Layers table with layer_time 1 and steps of 1/4: every step stays inside one layer,
    # so the run equals chaining runs with each layer's constant parameters
    L = 3
    X0 = rng.normal(size=(4, 2))
    Qs, Ks, Vs = (rng.normal(size=(L, 2, 2)) * 0.6 for _ in range(3))
    att = tp.Attention("softmax", Layers(Qs), Layers(Ks), Layers(Vs))
    traj = tp.simulate(att, X0, t_max=L, dt=0.25, solver=method)
    X = X0
    chained_steps = 0
    for layer in range(L):
        const = tp.Attention("softmax", Qs[layer], Ks[layer], Vs[layer])
        part = tp.simulate(const, X, t_max=1.0, dt=0.25, solver=method)
        X, chained_steps = part.final, chained_steps + part.info["n_steps"]
        i = int(np.argmin(np.abs(traj.times - (layer + 1))))
        assert traj.times[i] == pytest.approx(layer + 1, abs=1e-12)
        np.testing.assert_allclose(traj.states[i], X, rtol=tol, atol=tol)
    # no extra work at layer boundaries (a first-same-as-last stage reused across a
    # boundary is the old layer's field: the controller then rejects step after step)
    assert traj.info["n_steps"] <= chained_steps + 5


def test_dopri5_lands_on_layer_boundaries_between_save_points(rng):
    # save points 0.3, 0.6, ... miss the boundaries t = 1, 2: an adaptive step across a
    # jump of the parameters is inaccurate at any tolerance, so steps must stop there
    L = 3
    X0 = rng.normal(size=(4, 2))
    Qs, Ks, Vs = (rng.normal(size=(L, 2, 2)) * 0.6 for _ in range(3))
    kw = {"solver": tp.Dopri5(rtol=1e-9, atol=1e-11)}
    X, chained_steps = X0, 0
    for layer in range(L):
        part = tp.simulate(tp.Attention("softmax", Qs[layer], Ks[layer], Vs[layer]), X,
                           t_max=1.0, dt=0.25, **kw)
        X, chained_steps = part.final, chained_steps + part.info["n_steps"]
    att = tp.Attention("softmax", Layers(Qs), Layers(Ks), Layers(Vs))
    for dt in (0.3, 1.5):
        traj = tp.simulate(att, X0, t_max=L, dt=dt, **kw)
        np.testing.assert_allclose(traj.times[-1], L)
        # both runs ~1e-9 accurate (stepping over the jumps instead gives ~1e-8 here and
        # ~1e-5 at rtol = 1e-6, with three times as many steps)
        np.testing.assert_allclose(traj.final, X, rtol=0, atol=3e-9)
        assert traj.info["n_steps"] <= chained_steps + 10


def test_callable_parameters_follow_exact_solution():
    # a(t) = (1 + t)/4 through a callable K: int_0^t a = (t + t^2/2)/4
    att = tp.Attention("linear", [[1.0]], lambda t: [[(1 + t) / 4]], [[1.0]])
    traj = tp.simulate(att, X0_1D, t_max=1.0, dt=0.01, solver="rk4")
    for t, X in zip(traj.times, traj.states, strict=True):
        want = linear_1d_exact(X0_1D, t, (t + t * t / 2) / 4)
        # RK4 with h = 0.01 on an O(1) smooth solution: global error ~1e-10
        np.testing.assert_allclose(X, want, rtol=1e-9)


# --------------------------------------------------------------------------- orders
@pytest.mark.parametrize("method,order,dts", [
    ("euler", 1, [1 / 40, 1 / 80, 1 / 160, 1 / 320]),
    ("rk4", 4, [1 / 4, 1 / 8, 1 / 16, 1 / 32]),
])
def test_observed_order_on_exact_solution(method, order, dts):
    errors = []
    for dt in dts:
        traj = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=dt, solver=method)
        errors.append(np.abs(traj.final - linear_1d_exact(X0_1D, 1.0, 0.5)).max())
    slope = fitted_order(errors, dts)
    # asymptotic regime: the fitted slope of log(error) against log(dt) is the order
    assert abs(slope - order) < 0.3, (slope, errors)


def test_rk4_order_on_2d_softmax_against_fine_reference(rng):
    X0 = rng.normal(size=(4, 2))
    Q, K, V = rng.normal(size=(3, 2, 2)) * 0.7
    att = tp.Attention("softmax", Q, K, V)
    ref = tp.simulate(att, X0, t_max=1.0, dt=1 / 512, solver="rk4").final  # error ~1e-13
    dts = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    errors = [np.abs(tp.simulate(att, X0, t_max=1.0, dt=dt, solver="rk4").final - ref).max()
              for dt in dts]
    assert abs(fitted_order(errors, dts) - 4) < 0.3, errors


@pytest.mark.parametrize("rtol", [1e-5, 1e-7, 1e-9])
def test_dopri5_meets_its_tolerance(rtol):
    traj = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=0.1,
                       solver=tp.Dopri5(rtol=rtol, atol=rtol * 1e-3))
    want = linear_1d_exact(X0_1D, 1.0, 0.5)
    err = np.abs(traj.final - want).max()
    # the controller bounds the local error per step by rtol |x|; over t in [0, 1] of this
    # non-stiff flow the global error stays within a small multiple of it
    assert err <= 10 * rtol * np.abs(want).max(), err
    assert traj.status == "ok"
    np.testing.assert_allclose(traj.times, np.linspace(0, 1, 11), rtol=0, atol=1e-12)
    for t, X in zip(traj.times, traj.states, strict=True):  # every saved state, not only the last
        assert np.abs(X - linear_1d_exact(X0_1D, t, 0.5 * t)).max() <= 10 * rtol * 1.6


@pytest.mark.parametrize("kind", ["softmax", "l2", "sinkhorn"])
def test_single_token_flow_is_matrix_exponential(kind, rng):
    # normalised kinds: Gamma_{delta_x}(x) = V x, so x(t) = expm(t V) x(0)
    V = np.array([[0.1, -0.6], [0.5, -0.2]])
    Q, K = rng.normal(size=(2, 2, 2))
    x0 = np.array([[0.7, -0.4]])
    traj = tp.simulate(tp.Attention(kind, Q, K, V), x0, t_max=2.0, dt=0.05)
    for t, X in zip(traj.times, traj.states, strict=True):
        # RK4 with h = 0.05 on a linear ODE with |V| < 1, |x| < 1: global error ~1e-9
        np.testing.assert_allclose(X[0], scipy.linalg.expm(t * V) @ x0[0], rtol=1e-7, atol=1e-8)


def test_sinkhorn_mean_moves_exactly_with_v(rng):
    # doubly stochastic coupling: sum_i w_i Gamma(x_i) = V sum_j w_j x_j, so the mean
    # obeys alpha' = V alpha and alpha(t) = expm(t V) alpha(0) exactly (docs/conventions.md)
    X0 = rng.normal(size=(6, 2))
    Q, K = rng.normal(size=(2, 2, 2)) * 0.5
    V = np.array([[0.2, -0.5], [0.4, 0.1]])
    traj = tp.simulate(tp.Attention("sinkhorn", Q, K, V), X0, t_max=1.0, dt=0.05)
    want = scipy.linalg.expm(V) @ X0.mean(axis=0)
    # RK4 error on a linear mean ODE with h = 0.05 (~1e-8) plus Sinkhorn's 1e-9 stopping rule
    np.testing.assert_allclose(traj.final.mean(axis=0), want, rtol=1e-6, atol=1e-8)


def test_partial_last_step_lands_on_t_max_and_save_every():
    traj = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=0.3, solver="rk4")
    np.testing.assert_allclose(traj.times, [0, 0.3, 0.6, 0.9, 1.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(traj.final, linear_1d_exact(X0_1D, 1.0, 0.5), rtol=1e-4)
    traj = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=0.1, saveat=tp.SaveAt(every=4),
                       solver="euler")
    np.testing.assert_allclose(traj.times, [0, 0.4, 0.8, 1.0], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- blow-up
def test_blowup_stops_cleanly():
    # one token, linear attention with a = 1/2: x' = x^3 / 2, x(t) = (1 - t)^{-1/2}, T* = 1
    traj = tp.simulate(linear_1d(), np.array([[1.0]]), t_max=5.0, dt=0.01,
                       limits=tp.Limits(max_norm=100.0))
    # a detected blow-up answers the question: success, with an EarlyStopWarning
    assert traj.status == "blowup" and traj.success
    assert np.all(np.isfinite(traj.states))
    # the offending state is the last one saved; all earlier ones are below max_norm
    assert np.all(np.abs(traj.states[:-1]) <= 100.0) and np.abs(traj.final).max() > 100.0
    assert np.all(np.diff(traj.times) > 0)
    # |x| = 100 at t = 1 - 1e-4; RK4 with h = 0.01 tracks the solution up to a step or two
    assert 0.97 < traj.t_final < 1.03
    assert f"t={traj.t_final:.6g}" in traj.message and "max_norm" in traj.message
    # states before the stop follow the exact solution
    early = traj.times < 0.9
    np.testing.assert_allclose(traj.states[early, 0, 0], (1 - traj.times[early]) ** -0.5,
                               rtol=1e-5)


def test_exp_attention_overflow_stops_cleanly():
    # unnormalised exp attention, one token: x' = x e^{x^2}; T* = E1(1)/2 = 0.1097.  RK4
    # stages overflow before |x| reaches max_norm: either clean status is acceptable
    att = tp.Attention("exp", [[1.0]], [[1.0]], [[1.0]])
    traj = tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01,
                       limits=tp.Limits(max_norm=1e3))
    assert traj.status in ("blowup", "nonfinite")
    assert np.all(np.isfinite(traj.states)) and 0.09 < traj.t_final < 0.12
    assert f"t={traj.t_final:.6g}" in traj.message


def test_nonfinite_stops_cleanly_and_keeps_earlier_states():
    att = tp.Attention("exp", [[1.0]], [[1.0]], [[1.0]])
    # Euler h = 0.1 from x = 3: x_1 = 3 + 0.3 e^9 = 2434.0, then e^{2434^2} overflows
    traj = tp.simulate(att, np.array([[3.0]]), t_max=1.0, dt=0.1, solver="euler",
                       limits=tp.Limits(max_norm=1e300))
    assert traj.status == "nonfinite"
    np.testing.assert_allclose(traj.times, [0.0, 0.1])
    np.testing.assert_allclose(traj.final, [[3 + 0.3 * np.exp(9.0)]], rtol=1e-13)
    assert "t=0.1" in traj.message and "t=0.2" in traj.message


def test_dopri5_blowup_stops_cleanly():
    att = tp.Attention("exp", [[1.0]], [[1.0]], [[1.0]])
    traj = tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01, solver="dopri5",
                       limits=tp.Limits(max_norm=1e3))
    assert traj.status in ("blowup", "nonfinite")
    assert np.all(np.isfinite(traj.states)) and traj.t_final < 0.12
    assert "t=" in traj.message


# --------------------------------------------------------------------------- I/O
def _assert_same_attention(a, b):
    assert (a.kind, a.heads, a.masked, a.beta, a.eps, a.l2_beta, a.d) == \
        (b.kind, b.heads, b.masked, b.beta, b.eps, b.l2_beta, b.d)
    for name in ("Q", "K", "V", "W_O"):
        u, v = getattr(a, name), getattr(b, name)
        if isinstance(u, Layers):
            assert isinstance(v, Layers)
            np.testing.assert_array_equal(u.values, v.values)
            assert (u.layer_time, u.t0) == (v.layer_time, v.t0)
        elif u is None:
            assert v is None
        else:
            np.testing.assert_array_equal(u, v)


def _assert_same_trajectory(a, b):
    for name in ("times", "states", "weights", "positions"):
        u, v = getattr(a, name), getattr(b, name)
        if u is None:
            assert v is None
        else:
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)
    assert (a.status, a.message, a.info) == (b.status, b.message, b.info)


def test_save_load_roundtrip_exact(tmp_path, rng):
    X0 = rng.normal(size=(5, 4))
    Qs = Layers(rng.normal(size=(2, 4, 4)) * 0.3, layer_time=0.5, t0=0.25)
    att = tp.Attention("softmax", Qs, rng.normal(size=(4, 4)) * 0.3, np.eye(4), heads=2,
                       masked=True, beta=1.5, W_O=rng.normal(size=(4, 4)))
    traj = tp.simulate(att, X0, t_max=1.0, dt=0.25, weights=rng.random(5) + 0.1,
                       positions=rng.random(5))
    back = tp.load(traj.save(tmp_path / "traj.npz"))
    _assert_same_trajectory(traj, back)
    _assert_same_attention(traj.attention, back.attention)
    for t in (0.0, 0.6, 2.0):  # the rebuilt attention gives the same field
        np.testing.assert_array_equal(
            tp.velocity(back.attention, X0, t=t, positions=traj.positions),
            tp.velocity(att, X0, t=t, positions=traj.positions))


def test_save_load_sinkhorn_float32_blowup_and_callables(tmp_path, rng):
    # sinkhorn: info carries per-evaluation iteration counts
    att = tp.Attention("sinkhorn", np.eye(2), np.eye(2), np.eye(2), eps=0.7)
    traj = tp.simulate(att, rng.normal(size=(4, 2)), t_max=0.2, dt=0.1)
    back = tp.load(traj.save(tmp_path / "s.npz"))
    _assert_same_trajectory(traj, back)
    _assert_same_attention(att, back.attention)
    # float32 stays float32 through the file
    traj = tp.simulate(linear_1d(), X0_1D.astype(np.float32), t_max=0.3, dt=0.1)
    back = tp.load(traj.save(tmp_path / "f.npz"))
    assert back.states.dtype == np.float32
    _assert_same_trajectory(traj, back)
    # an interrupted run keeps status and message
    traj = tp.simulate(linear_1d(), np.array([[1.0]]), t_max=2.0, dt=0.01,
                       limits=tp.Limits(max_norm=10.0))
    back = tp.load(traj.save(tmp_path / "b.npz"))
    assert back.status == "blowup"
    _assert_same_trajectory(traj, back)
    # callables cannot be stored: the attention comes back as None, the rest exactly
    att = tp.Attention("softmax", lambda t: np.eye(2) * (1 + t), np.eye(2), np.eye(2))
    traj = tp.simulate(att, rng.normal(size=(3, 2)), t_max=0.2, dt=0.1)
    back = tp.load(traj.save(tmp_path / "c.npz"))
    assert back.attention is None
    _assert_same_trajectory(traj, back)


def test_load_rejects_foreign_npz(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(3))
    with pytest.raises(ValueError, match="not a transformer-pde trajectory"):
        tp.load(path)


# --------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("kind", ["softmax", "sinkhorn"])
@pytest.mark.parametrize("method", ["euler", "rk4", "dopri5"])
def test_float32_simulation_stays_float32(method, kind, rng):
    X0 = rng.normal(size=(5, 2))
    att = tp.Attention(kind, np.eye(2) * 0.5, np.eye(2), np.eye(2) * 0.5)
    solver = tp.Dopri5(rtol=1e-4, atol=1e-6) if method == "dopri5" else method
    kw = dict(t_max=1.0, dt=0.1, solver=solver)
    t32 = tp.simulate(att, X0.astype(np.float32), **kw)
    t64 = tp.simulate(att, X0, **kw)
    assert t32.states.dtype == np.float32
    assert t32.info["dtype"] == "float32"
    # single precision round-off accumulated over ~10-40 steps of an O(1) flow
    np.testing.assert_allclose(t32.final, t64.final, rtol=1e-4, atol=1e-4)
    # explicit dtype override
    assert tp.simulate(att, X0, field=tp.FieldOptions(dtype=np.float32),
                       **kw).states.dtype == np.float32


@settings(max_examples=15)
@given(problem=attention_problems(heads=None, masked=None, weighted=None))
def test_one_euler_step_is_x_plus_dt_velocity(problem):
    att, m = problem
    traj = tp.simulate(att, m.X, t_max=0.1, dt=0.1, solver="euler", **m.kwargs)
    want = m.X + 0.1 * tp.velocity(att, m.X, **m.kwargs)
    np.testing.assert_allclose(traj.final, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=15)
@given(problem=attention_problems(heads=None, masked=None, weighted=None, scale=0.5,
                                  time_dependent=None))
def test_rk4_and_dopri5_agree_on_random_problems(problem):
    # two integrators of different orders and step rules; with layer_time = 1 and
    # h = 1/20 both respect the layer boundaries; RK4's global error ~ h^4 ~ 1e-6 at most
    att, m = problem
    a = tp.simulate(att, m.X, t_max=2.0, dt=0.05, solver="rk4", **m.kwargs)
    b = tp.simulate(att, m.X, t_max=2.0, dt=0.5, solver=tp.Dopri5(rtol=1e-9, atol=1e-11),
                    **m.kwargs)
    assert a.status == b.status == "ok"
    np.testing.assert_allclose(a.final, b.final, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- validation
def test_simulate_validation_errors():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X = np.zeros((3, 2))
    cases = [
        (dict(solver="leapfrog"), ValueError, "solver must be one of"),
        (dict(solver=None), TypeError, "solver must be a solver name"),
        (dict(t_max=0.0), ValueError, "t_max must be > 0"),
        (dict(t_max=np.inf), ValueError, "t_max must be finite"),
        (dict(dt=-0.1), ValueError, "dt must be > 0"),
        (dict(dt="x"), TypeError, "dt must be a real number"),
        (dict(saveat=3), TypeError, "saveat must be a transformer_pde.SaveAt"),
        (dict(block="sphere"), TypeError, "block must be a transformer_pde.Block"),
        (dict(field=dict(backend="numpy")), TypeError, "field must be a transformer_pde.Field"),
        (dict(monitor=1), TypeError, "monitor must be"),
        (dict(field=tp.FieldOptions(sinkhorn_tol=1e-6)), ValueError,
         r"sinkhorn_tol=\.\.\.\) applies only to kind='sinkhorn'"),
        (dict(solver=tp.Dopri5(), block=tp.Block(normalization="pre")), ValueError,
         "need a fixed-step solver"),
        (dict(field=tp.FieldOptions(backend="nope")), ValueError, "backend must be one of"),
        (dict(X0=np.zeros((3, 3))), ValueError, "X0 must have shape"),
        (dict(X0=np.full((3, 2), np.nan)), ValueError, "X0 contains NaN"),
        (dict(weights=[1, 2]), ValueError, "weights must have shape"),
    ]
    for kw, exc, msg in cases:
        args = {"X0": X, "t_max": 1.0, "dt": 0.1, **kw}
        with pytest.raises(exc, match=msg):
            tp.simulate(att, args.pop("X0"), **args)
    # option objects check their values when built
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        tp.Limits(max_norm=0)
    with pytest.raises(TypeError, match="max_steps must be an integer"):
        tp.Limits(max_steps=None)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        tp.FieldOptions(dtype=np.int64)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        tp.FieldOptions(dtype="foo")
    with pytest.raises(ValueError, match="SaveAt: every must be an integer"):
        tp.SaveAt(every=0)
    with pytest.raises(ValueError, match="SaveAt: every must be an integer"):
        tp.SaveAt(every=1.5)
    with pytest.raises(ValueError, match="give every or ts, not both"):
        tp.SaveAt(every=2, ts=[0.5])
    with pytest.raises(ValueError, match="strictly increasing"):
        tp.SaveAt(ts=[0.5, 0.2])
    with pytest.raises(TypeError, match="rtol must be a real number"):
        tp.Dopri5(rtol="x")
    with pytest.raises(ValueError, match="resume=True needs checkpoint"):
        tp.Monitor(resume=True)
    with pytest.raises(ValueError, match="masked attention needs positions"):
        tp.simulate(att.replace(masked=True), X, t_max=1.0, dt=0.1)
    with pytest.raises(TypeError, match="att must be"):
        tp.simulate(None, X, t_max=1.0, dt=0.1)
    register_backend("_missing_sim", "transformer_pde_no_such_module:Backend")
    try:
        with pytest.raises(tp.BackendNotAvailable, match="_missing_sim"):
            tp.simulate(att, X, t_max=1.0, dt=0.1,
                        field=tp.FieldOptions(backend="_missing_sim"))
    finally:
        BACKENDS.pop("_missing_sim", None)


def test_progress_reporting_does_not_change_the_run(caplog):
    plain = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=0.1)
    with caplog.at_level(logging.INFO, logger="transformer_pde"):
        shown = tp.simulate(linear_1d(), X0_1D, t_max=1.0, dt=0.1,
                            monitor=tp.Monitor(progress=True))
    np.testing.assert_array_equal(shown.states, plain.states)
    try:
        import tqdm  # noqa: F401
    except ImportError:  # without tqdm, progress goes to logging at INFO level
        assert any("simulate: t =" in r.getMessage() for r in caplog.records)
