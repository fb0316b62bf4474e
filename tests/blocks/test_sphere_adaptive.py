"""Adaptive solvers on the sphere: ``Block(constraint=Sphere())`` with DOP853 / Dopri5 (the
projection method of ``BlockStepper.attempt``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.errors import ArgumentError
from transformer_pde.integrate import Dop853

I2 = np.eye(2)


def _angle(X):
    return np.arctan2(X[..., 1], X[..., 0])


def test_two_tokens_on_the_circle_match_the_angle_ode():
    # Two tokens of mass 1/2 under exp attention (Q = K = V = I) on S^1: the angle phi
    # between them obeys dphi/dt = -e^{beta cos phi} sin phi exactly (each token moves by
    # half the pair's relative velocity).  Reference: scipy's DOP853 on that scalar ODE at
    # rtol 1e-13; the particle run at rtol = atol = 1e-11 must agree to 1e-9 (a hundred
    # times its tolerance, for the accumulation over the steps) and stay on the circle to
    # round-off (every accepted step is retracted).
    beta, phi0, ts = 5.0, 0.7, [0.05, 0.1, 0.2, 0.5]
    th = np.array([0.3, 0.3 - phi0])
    X0 = np.column_stack([np.cos(th), np.sin(th)])
    att = tp.Attention("exp", I2, I2, I2, beta=beta)
    traj = tp.simulate(att, X0, t_max=0.5, dt=0.01, solver=Dop853(rtol=1e-11, atol=1e-11),
                       block=tp.Block(constraint=tp.Sphere()), saveat=tp.SaveAt(ts=ts))
    assert traj.status == "ok"
    phi = np.angle(np.exp(1j * (_angle(traj.states[:, 0]) - _angle(traj.states[:, 1]))))
    ref = solve_ivp(lambda t, p: -np.exp(beta * np.cos(p)) * np.sin(p), (0.0, 0.5), [phi0],
                    method="DOP853", rtol=1e-13, atol=1e-15, t_eval=ts).y[0]
    np.testing.assert_allclose(phi[-len(ts):], ref, rtol=0, atol=1e-9)
    assert np.abs(np.linalg.norm(traj.states, axis=-1) - 1.0).max() < 1e-14


@pytest.mark.parametrize("kind", ["softmax", "exp"])
def test_adaptive_sphere_run_matches_rk4_with_small_steps(kind):
    # Twelve random tokens on S^2: DOP853 at rtol = atol = 1e-11 against RK4 with dt = 1e-3
    # (global error O(dt^4) ~ 1e-12 for this field of rate ~ beta): agreement to 1e-9.
    rng = np.random.default_rng(3)
    X0 = rng.standard_normal((12, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention(kind, np.eye(3), np.eye(3), np.eye(3), beta=2.0)
    block = tp.Block(constraint="sphere")
    ref = tp.simulate(att, X0, t_max=1.0, dt=1e-3, solver="rk4", block=block,
                      saveat=tp.SaveAt(ts=[1.0]))
    got = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver=Dop853(rtol=1e-11, atol=1e-11),
                      block=block, saveat=tp.SaveAt(ts=[1.0]))
    assert got.status == "ok"
    np.testing.assert_allclose(got.states[-1], ref.states[-1], rtol=0, atol=1e-9)


def test_adaptive_solver_refuses_other_block_options():
    X0 = np.array([[1.0, 0.0], [0.0, 1.0]])
    att = tp.Attention("softmax", I2, I2, I2)
    with pytest.raises(ArgumentError, match="Block.constraint=Sphere.*alone"):
        tp.simulate(att, X0, t_max=0.1, dt=0.1, solver="dop853",
                    block=tp.Block(normalization="pre"))


def test_adaptive_sphere_run_with_the_harmonic_field_matches_the_direct_field():
    # the exact Fourier field (exact to ~1e-13 per evaluation) under DOP853 on the circle:
    # the same run as the direct field to 1e-10 (per-evaluation differences amplified by
    # the unstable modes, e^{lambda_3 t} ~ 40 at t = 0.2, beta = 5)
    rng = np.random.default_rng(4)
    theta = rng.uniform(0, 2 * np.pi, 80)
    X0 = np.column_stack([np.cos(theta), np.sin(theta)])
    att = tp.Attention("exp", I2, I2, I2, beta=5.0)
    kw = dict(t_max=0.2, dt=0.01, solver=Dop853(rtol=1e-10, atol=1e-12),
              block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(ts=[0.2]))
    direct = tp.simulate(att, X0, **kw)
    harmonic = tp.simulate(att, X0, field=tp.FieldOptions(method="harmonic"), **kw)
    assert harmonic.status == "ok"
    np.testing.assert_allclose(harmonic.states[-1], direct.states[-1], rtol=0, atol=1e-10)
