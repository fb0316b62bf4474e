r"""Strong convergence of the stochastic schemes against exact solutions on the same path.

With a zero attention field (value matrix 0) and common noise only, the SDEs have
closed-form solutions driven by the very Brownian path the run used (rebuilt here from
its :class:`~transformer_pde.noise.BrownianPath`):

* :math:`\mathbb R^d`, commuting :math:`A_k`, Stratonovich:
  :math:`x(T) = \exp(\sum_k A_k B_k(T))\,x_0`; Itô:
  :math:`x(T) = \exp(\sum_k A_k B_k(T) - \tfrac T2\sum_k A_k^2)\,x_0`;
* the sphere, commuting :math:`A_k` (projected Stratonovich SDE
  :math:`dx = P_x(\sum_k A_k x)\circ dB_k`): :math:`y = \exp(\sum_k A_k B_k)x_0` solves
  :math:`dy = \sum_k A_k y\circ dB_k`, and :math:`x = y/|y|` then solves the projected
  SDE, so :math:`x(T) = y(T)/|y(T)|`.

Every member of an ensemble (one token each) is an independent path.  The mean error
:math:`E|x_h(T) - x(T)|` over the members is measured at :math:`\Delta t = b/2^L`,
:math:`L = 0..4` (the same paths refined), and the least-squares slope of
:math:`\log E` against :math:`\log\Delta t` must lie within 0.2 of the strong order
(1/2 for Euler–Maruyama with multiplicative noise, 1 for Heun and Milstein with commuting
noise).  The runs use :math:`\Delta t = b/2^L`, :math:`L = 1..4`: every run refines the
coarse path by Brownian bridges, and the exact solution reads only the coarse increments,
so the test also checks that the refinement is the same path.  With 256 paths the relative
standard error of each mean error is about 5 % (measured), which moves a slope fitted
over a factor 8 in :math:`\Delta t` by about 0.04; the measured slopes differ from the
orders by up to 0.13 (higher-order terms at the coarse steps), so 0.2 is the tolerance; it
tells order 1/2 from order 1, and a scheme that misses a correction term does not converge
at all (slope near 0).  The runs are seeded (deterministic).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm

import transformer_pde as tp
from transformer_pde import Noise, simulate_ensemble
from transformer_pde.noise import BrownianPath

B, T, BASE = 256, 1.0, 0.125
LEVELS = range(1, 5)


def _zero_field(d):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.zeros((d, d)))


def _x0(d, seed=0):
    X = np.random.default_rng(seed).normal(size=(B, 1, d))
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def _B_T(noise, d, K):
    """Each member's B_k(T): the sum of the coarse increments of its common coordinates,
    the first K of its stream (member b is system b)."""
    path = BrownianPath(noise.seed, noise.path, [K + d] * B, BASE, 0)
    z = sum(path.increment(j) for j in range(round(T / BASE)))
    return z.reshape(B, K + d)[:, :K]


def _exact(A, BT, x0, convention, sphere):
    out = np.empty_like(x0[:, 0])
    ito = 0.5 * T * np.einsum("kij,kjl->il", A, A) if convention == "ito" else 0.0
    for b in range(B):
        y = expm(np.einsum("k,kij->ij", BT[b], A) - ito) @ x0[b, 0]
        out[b] = y / np.linalg.norm(y) if sphere else y
    return out


def _slope(solver, A, convention, sphere, d):
    noise = Noise(common=A, convention=convention, seed=11, path=3, base_dt=BASE)
    x0 = _x0(d)
    exact = _exact(A, _B_T(noise, d, A.shape[0]), x0, convention, sphere)
    errs, dts = [], []
    for L in LEVELS:
        dt = BASE / 2 ** L
        ens = simulate_ensemble(_zero_field(d), x0, t_max=T, dt=dt, solver=solver, noise=noise,
                                block="sphere" if sphere else None, backend="numpy",
                                saveat=tp.SaveAt(ts=[T]))
        assert str(ens.status) == "ok"
        errs.append(np.mean(np.linalg.norm(ens.last[:, 0] - exact, axis=-1)))
        dts.append(dt)
    return np.polyfit(np.log(dts), np.log(errs), 1)[0], errs


def _commuting(d, K, seed):
    """K commuting matrices: polynomials in one random matrix, scaled to norm ~0.5."""
    M = np.random.default_rng(seed).normal(size=(d, d)) / np.sqrt(d)
    return np.stack([0.5 * M if k == 0 else 0.3 * M @ M / (k + 1) for k in range(K)])


ROTATION = np.array([[[0.0, -0.8, 0.0], [0.8, 0.0, 0.0], [0.0, 0.0, 0.0]]])


@pytest.mark.parametrize("solver, order", [("euler_maruyama", 0.5), ("heun_stratonovich", 1.0),
                                           ("milstein", 1.0)])
@pytest.mark.parametrize("convention", ["stratonovich", "ito"])
def test_strong_order_in_rd(solver, order, convention):
    slope, errs = _slope(solver, _commuting(3, 2, seed=1), convention, False, 3)
    assert errs[-1] < 0.1
    assert abs(slope - order) < 0.2, (slope, errs)


@pytest.mark.parametrize("solver, order", [("euler_maruyama", 0.5), ("heun_stratonovich", 1.0)])
@pytest.mark.parametrize("A", [ROTATION, _commuting(3, 2, seed=2)], ids=["rotation", "general"])
def test_strong_order_on_the_sphere(solver, order, A):
    """The rotation generator checks the tangential Stratonovich correction of the sphere
    (without it Euler–Maruyama converges to another process: its error stalls); the
    general matrices check the projection of a non-tangent field."""
    slope, errs = _slope(solver, A, "stratonovich", True, 3)
    assert errs[-1] < 0.1
    assert abs(slope - order) < 0.2, (slope, errs)


def test_the_ito_reading_on_the_sphere_is_one_process_for_both_schemes():
    """On the sphere the Itô reading has no closed form; Euler–Maruyama (an Itô scheme, no
    correction) and Stratonovich Heun (which subtracts the tangential drift T) must
    converge to the same process on the same path: their mean distance shrinks like
    dt^(1/2) (slope within 0.2 of 1/2, the strong order of E-M).  With the correction
    left out of Heun it stalls at about 0.09 (the two schemes would approximate the two
    different readings)."""
    A = _commuting(3, 2, seed=2)
    noise = Noise(common=A, convention="ito", seed=12, base_dt=BASE)
    x0 = _x0(3, seed=4)
    gaps, dts = [], []
    for L in LEVELS:
        dt = BASE / 2 ** L
        ends = [simulate_ensemble(_zero_field(3), x0, t_max=T, dt=dt, solver=s, noise=noise,
                                  block="sphere", backend="numpy",
                                  saveat=tp.SaveAt(ts=[T])).last[:, 0]
                for s in ("euler_maruyama", "heun_stratonovich")]
        gaps.append(np.mean(np.linalg.norm(ends[0] - ends[1], axis=-1)))
        dts.append(dt)
    slope = np.polyfit(np.log(dts), np.log(gaps), 1)[0]
    assert gaps[-1] < 0.03 and abs(slope - 0.5) < 0.2, (slope, gaps)
