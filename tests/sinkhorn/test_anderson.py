"""Anderson mixing (transformer_pde.sinkhorn.anderson)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.sinkhorn import Anderson


def _iterate(acc, G, x, n):
    for _ in range(n):
        x = acc.step(np, x, G(x) - x)
    return x


def test_linear_contraction_converges_much_faster_than_plain():
    rng = np.random.default_rng(0)
    n = 30
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    A = Q @ np.diag(np.linspace(0.0, 0.97, n)) @ Q.T   # slow contraction (rate 0.97)
    b = rng.normal(size=n)
    x_star = np.linalg.solve(np.eye(n) - A, b)

    def G(x):
        return A @ x + b

    plain = _iterate(Anderson(0), G, np.zeros(n), 40)
    fast = _iterate(Anderson(10), G, np.zeros(n), 40)
    assert np.linalg.norm(plain - x_star) > 1e-2 * np.linalg.norm(x_star)
    # memory 10 on 30 distinct eigenvalues: not GMRES-exact, but orders of magnitude ahead
    assert np.linalg.norm(fast - x_star) < 1e-4 * np.linalg.norm(x_star)
    assert np.linalg.norm(fast - x_star) < 1e-3 * np.linalg.norm(plain - x_star)


def test_memory_zero_is_the_plain_step_and_m_pairs_are_kept():
    acc = Anderson(0)
    x, r = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    assert np.array_equal(acc.step(np, x, r), x + r)
    acc = Anderson(3)
    x = np.zeros(4)
    for k in range(10):
        x = acc.step(np, x, 0.5 * (np.arange(4.0) - x) + 0.01 * k)
    assert len(acc.dX) == len(acc.dR) == 3


def test_first_step_is_plain_and_reset_new_problem():
    acc = Anderson(5)
    x, r = np.ones(3), np.full(3, 0.25)
    assert np.array_equal(acc.step(np, x, r), x + r)   # no secant pair yet
    acc.step(np, x + r, np.full(3, 0.1))
    assert len(acc.dX) == 1
    acc.new_problem(3)            # same size: keep the pairs, forget the iterate
    assert len(acc.dX) == 1 and acc.x_prev is None
    acc.new_problem(4)            # another size: forget everything
    assert not acc.dX and acc.x_prev is None
    acc.step(np, np.ones(4), np.ones(4))
    acc.reset()
    assert not acc.dX and acc.x_prev is None


def test_singular_or_nonfinite_least_squares_falls_back_to_plain():
    acc = Anderson(4)
    x = np.zeros(2)
    acc.step(np, x, np.array([1.0, 0.0]))
    # a NaN residual difference: the solve is not finite -> memory cleared, plain step
    out = acc.step(np, np.array([1.0, 0.0]), np.array([np.nan, 0.0]))
    assert not acc.dX
    assert np.isnan(out[0]) and out[1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keeps_the_dtype(dtype):
    acc = Anderson(3)
    x = np.zeros(5, dtype)
    for _ in range(4):
        x = acc.step(np, x, (0.5 * (1.0 - x)).astype(dtype))
    assert x.dtype == dtype
    np.testing.assert_allclose(x, 1.0, rtol=1e-5)


@pytest.mark.parametrize("m", [0, 2, 5])
def test_peek_is_the_next_step_without_touching_the_memory(m):
    rng = np.random.default_rng(1)
    A = 0.3 * rng.normal(size=(6, 6)) / np.sqrt(6)
    b = rng.normal(size=6)
    acc = Anderson(m)
    x = np.zeros(6)
    for _ in range(4):              # fills the memory past m = 2
        x = acc.step(np, x, A @ x + b - x)
    r = A @ x + b - x
    before = ([a.copy() for a in acc.dX], [a.copy() for a in acc.dR], acc.x_prev, acc.r_prev)
    peeked = acc.peek(np, x, r)
    assert len(acc.dX) == len(before[0]) and acc.x_prev is before[2] and acc.r_prev is before[3]
    assert all(np.array_equal(a, c) for a, c in zip(acc.dX, before[0], strict=True))
    assert np.array_equal(peeked, acc.step(np, x, r))   # the step it foretold
    # a failed least-squares solve in peek takes the plain step and keeps the memory
    if m:
        n_pairs = len(acc.dX)
        bad = acc.peek(np, x + 1.0, np.full(6, np.nan))
        assert np.isnan(bad).all() and len(acc.dX) == n_pairs


def test_state_round_trip_continues_the_same_iteration():
    # a memory rebuilt from its plain data steps exactly as the original does
    rng = np.random.default_rng(2)
    A = 0.4 * rng.normal(size=(5, 5)) / np.sqrt(5)
    b = rng.normal(size=5)
    acc = Anderson(3)
    x = _iterate(acc, lambda y: A @ y + b, np.zeros(5), 5)
    copy = Anderson.from_state(acc.get_state())
    assert copy.m == 3 and len(copy.dX) == len(acc.dX) == 3
    r = A @ x + b - x
    assert np.array_equal(copy.step(np, x, r), acc.step(np, x, r))
    with pytest.raises(KeyError):
        Anderson.from_state({"m": 3})
