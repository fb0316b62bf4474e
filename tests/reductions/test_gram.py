"""The Gram-matrix flow equals particle runs in any dimension."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.reductions.equiangular_flow import equiangular
from transformer_pde.reductions.gram import gram_field, gram_flow, gram_from_tokens, random_gram

KINDS = {"sa": "softmax", "usa": "exp"}


@pytest.mark.parametrize("model", ["sa", "usa"])
def test_gram_flow_equals_particles_d64(model):
    # particles: RK4, dt = 5e-3, with the sphere retraction (measured error 2e-12 for SA,
    # 8e-11 for USA, where the fast merging of pairs dominates); Gram flow: DOP853 at
    # rtol 1e-11.  Both well inside 1e-9.
    n, d, beta, t_max = 8, 64, 3.0, 10.0
    rng = np.random.default_rng(1)
    X0 = rng.standard_normal((n, d))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    ts = np.linspace(0.0, t_max, 6)
    att = tp.Attention(KINDS[model], np.eye(d), np.eye(d), np.eye(d), beta=beta)
    traj = tp.simulate(att, X0, t_max=t_max, dt=5e-3, solver="rk4",
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(ts=ts))
    G_particles = np.einsum("tid,tjd->tij", traj.states, traj.states)
    flow = gram_flow(gram_from_tokens(X0), beta, ts, model=model, rtol=1e-11, atol=1e-13)
    assert flow.status == "ok" and flow.success
    np.testing.assert_array_equal(flow.times, ts)
    assert np.abs(flow.grams - G_particles).max() <= 1e-9
    assert np.abs(flow.grams[-1] - flow.grams[0]).max() > 0.1       # the tokens moved


def test_batch_equals_one_by_one():
    # one step size for the batch: members agree with their own runs to the tolerance,
    # and at rtol 1e-13 both are within 1e-12 of the exact flow
    G0 = random_gram(5, 1024, np.random.default_rng(2), batch=3)
    ts = [0.0, 1.0, 4.0]
    batch = gram_flow(G0, 2.0, ts, rtol=1e-13, atol=1e-15)
    assert batch.grams.shape == (3, 3, 5, 5)
    for b in range(3):
        one = gram_flow(G0[b], 2.0, ts, rtol=1e-13, atol=1e-15)
        assert np.abs(batch.grams[:, b] - one.grams).max() <= 1e-12


def test_structure_is_kept_exactly():
    G0 = random_gram(7, 16, 3)
    flow = gram_flow(G0, 5.0, np.linspace(0, 3, 4), model="usa", shift=5.0)
    for G in flow.grams:
        np.testing.assert_array_equal(G, G.T)
        np.testing.assert_array_equal(np.diag(G), 1.0)
        assert np.linalg.eigvalsh(G).min() >= -1e-10


def test_equiangular_gram_follows_the_equiangular_ode():
    n, beta, rho0 = 6, 4.0, 0.1
    G0 = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    ts = np.linspace(0, 3, 4)
    flow = gram_flow(G0, beta, ts, rtol=1e-12, atol=1e-14)
    rho = equiangular(beta, n, rho0, ts).rho
    off = ~np.eye(n, dtype=bool)
    assert np.abs(flow.grams[:, off] - rho[:, None]).max() <= 1e-10


def test_field_matches_the_token_velocity():
    # G' = <x_i', x_j> + <x_i, x_j'> with x' = P_x A from tp.velocity
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5, 9))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    for model in ("sa", "usa"):
        att = tp.Attention(KINDS[model], np.eye(9), np.eye(9), np.eye(9), beta=2.5)
        A = tp.velocity(att, X)
        V = A - np.sum(A * X, axis=1, keepdims=True) * X
        want = V @ X.T + X @ V.T
        np.testing.assert_allclose(gram_field(X @ X.T, 2.5, model), want, rtol=0, atol=1e-14)


def test_gram_from_tokens_and_random_gram():
    X = np.array([[3.0, 4.0], [0.0, 2.0]])
    G = gram_from_tokens(X)
    np.testing.assert_allclose(G, [[1.0, 0.8], [0.8, 1.0]], rtol=1e-15)
    a, b = random_gram(4, 10, 7), random_gram(4, 10, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert random_gram(4, 10, 0, batch=2).shape == (2, 4, 4)


def test_only_time_zero():
    G0 = random_gram(3, 5, 0)
    flow = gram_flow(G0, 1.0, 0.0)
    assert flow.grams.shape == (1, 3, 3) and flow.status == "ok"


@pytest.mark.parametrize("G0, name", [
    (np.array([[1.0, 0.5], [0.4, 1.0]]), "symmetric"),
    (np.array([[1.0, 2.0], [2.0, 1.0]]), "positive semi-definite"),
    (np.array([[1.1, 0.0], [0.0, 1.0]]), "unit diagonal"),
    (np.ones(3), "shape"), (np.ones((2, 2, 3)), "shape"),
])
def test_gram_validation(G0, name):
    with pytest.raises(ArgumentError, match=name):
        gram_flow(G0, 1.0, 1.0)


def test_argument_errors():
    G0 = np.eye(2)
    with pytest.raises(ArgumentError, match="t must be strictly"):
        gram_flow(G0, 1.0, [0.0, 1.0, 1.0])
    with pytest.raises(ArgumentError, match="rtol"):
        gram_flow(G0, 1.0, 1.0, rtol=0.0)
    with pytest.raises(ArgumentError, match="shift"):
        gram_flow(G0, 800.0, 1.0, model="usa")
    with pytest.raises(ArgumentError, match="shift"):
        gram_flow(G0, 1.0, 1.0, shift=1.0)
    with pytest.raises(ArgumentError, match="zero row"):
        gram_from_tokens(np.zeros((2, 3)))
    with pytest.raises(ArgumentTypeError, match="rng"):
        random_gram(3, 4, "seed")
    with pytest.raises(ArgumentError, match="d"):
        random_gram(3, 0, 1)
