"""The causal pair and the pairing angle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.pairs import causal_pair, pairing_angle


@pytest.mark.parametrize("rho0", [-0.6, 0.0, 0.7])
def test_causal_pair_equals_masked_particles(rho0):
    # RK4, dt = 1e-3, t <= 3 with the sphere retraction: error ~1e-13, bound 1e-10
    d, beta, t_max = 5, 2.5, 3.0
    X0 = np.zeros((2, d))
    X0[0, 0] = 1.0
    X0[1, :2] = rho0, math.sqrt(1 - rho0 ** 2)
    ts = np.linspace(0.0, t_max, 5)
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta, masked=True)
    traj = tp.simulate(att, X0, t_max=t_max, dt=1e-3, solver="rk4", positions=[0.0, 1.0],
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(ts=ts))
    np.testing.assert_array_equal(traj.states[:, 0], np.broadcast_to(X0[0], (5, d)))
    rho = np.einsum("td,td->t", traj.states[:, 0], traj.states[:, 1])
    sol = causal_pair(beta, rho0, ts)
    assert np.abs(sol.rho - rho).max() <= 1e-10
    assert sol.rho[-1] > rho0 + 0.02       # the second token moved


def test_causal_pair_near_one_and_fixed_points():
    # against the ODE in rho itself (solve_ivp, DOP853)
    beta, rho0 = 1.0, 0.5
    ts = np.array([0.0, 5.0, 20.0])
    ref = solve_ivp(lambda t, r: [math.exp(beta * r[0]) * (1 - r[0] ** 2)
                                  / (math.exp(beta * r[0]) + math.exp(beta))],
                    (0, 20.0), [rho0], method="DOP853", t_eval=ts, rtol=1e-13, atol=1e-16)
    sol = causal_pair(beta, rho0, ts)
    np.testing.assert_allclose(sol.rho, ref.y[0], rtol=0, atol=1e-12)
    late = causal_pair(beta, rho0, [200.0, 400.0])
    assert 0 < late.one_minus_rho[1] < late.one_minus_rho[0] < 1e-50
    # near rho = 1 the rate is 1 - rho^2 ~ 2(1 - rho): the gap decays like e^{-t}
    assert math.log(late.one_minus_rho[0] / late.one_minus_rho[1]) == pytest.approx(200.0, rel=1e-10)
    for r0 in (-1.0, 1.0):
        assert np.all(causal_pair(beta, r0, [0.0, 3.0]).rho == r0)
    assert causal_pair(beta, 0.2, 0.0).rho.shape == ()


@pytest.mark.parametrize("phi0", [0.3, 1.5, 3.0])
def test_pairing_angle_equals_the_limit_system(phi0):
    s = np.array([0.0, 0.2, 1.0, 2.5])
    y0 = np.array([1.0, 0.0, 0.0, math.cos(phi0), math.sin(phi0), 0.0])

    def rhs(_, y):
        y1, y2 = y[:3], y[3:]
        return np.concatenate([y2 - (y1 @ y2) * y1, y1 - (y1 @ y2) * y2])

    ref = solve_ivp(rhs, (0, s[-1]), y0, method="DOP853", t_eval=s, rtol=1e-13, atol=1e-15)
    y1, y2 = ref.y[:3], ref.y[3:]
    cos = np.sum(y1 * y2, axis=0) / (np.linalg.norm(y1, axis=0) * np.linalg.norm(y2, axis=0))
    np.testing.assert_allclose(np.cos(pairing_angle(phi0, s)), cos, rtol=0, atol=1e-11)


def test_pairing_angle_special_values():
    assert pairing_angle(math.pi, 3.0) == math.pi
    assert pairing_angle(0.0, 3.0) == 0.0
    assert pairing_angle(1.0, 0.0) == pytest.approx(1.0, rel=1e-15)


@pytest.mark.parametrize("call, name", [
    (lambda: causal_pair(1.0, 1.5, 1.0), "rho0"), (lambda: causal_pair(-1.0, 0.5, 1.0), "beta"),
    (lambda: causal_pair(1.0, 0.5, [2.0, 1.0]), "t"), (lambda: pairing_angle(4.0, 1.0), "phi0"),
    (lambda: pairing_angle(1.0, -1.0), "s"),
])
def test_argument_errors(call, name):
    with pytest.raises(ArgumentError, match=name):
        call()
