"""One softmax layer over a long equiangular context."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.limits import long_context_cosine, long_context_limit


@pytest.mark.parametrize("n, gamma, rho", [(50, 2.0, 0.5), (200, 0.7, 0.3), (1000, 3.0, 0.8),
                                           (400, 5.0, 0.9), (1000, 0.0, 0.2)])
def test_equals_a_direct_softmax_layer(n, gamma, rho):
    # the layer of tp.velocity on n equiangular unit vectors (rows of a Cholesky factor):
    # cosine of two outputs, exact to rounding (1e-12 covers n = 1000 accumulated sums)
    X = np.linalg.cholesky((1 - rho) * np.eye(n) + rho * np.ones((n, n)))
    att = tp.Attention("softmax", np.eye(n), np.eye(n), np.eye(n), beta=gamma * math.log(n))
    A = tp.velocity(att, X)
    i, k = 0, n - 1
    cos = A[i] @ A[k] / (np.linalg.norm(A[i]) * np.linalg.norm(A[k]))
    assert abs(long_context_cosine(n, gamma, rho) - cos) <= 1e-12


def test_quoted_value_and_large_n():
    assert round(long_context_cosine(1000, 2.0, 0.5), 6) == 0.800280
    for gamma, rho in [(1.0, 0.5), (2.0, 0.5), (4.0, 0.5), (2.5, 0.6)]:
        near = long_context_cosine(10**9, gamma, rho)
        assert math.isfinite(near)
        assert abs(near - long_context_limit(gamma, rho)) < 2e-3


def test_limits():
    assert long_context_limit(1.0, 0.5) == 1.0
    assert long_context_limit(2.0, 0.5) == pytest.approx(4 * 0.5 / (1 + 1.5))
    assert long_context_limit(3.0, 0.5) == 0.5
    # the approach: at n = 1e300 the three regimes are apart
    assert long_context_cosine(1e300, 1.9, 0.5) > 0.999
    assert long_context_cosine(1e300, 2.1, 0.5) == pytest.approx(0.5, abs=1e-10)


@pytest.mark.parametrize("call, name", [
    (lambda: long_context_cosine(1, 1.0, 0.5), "n"), (lambda: long_context_cosine(10, -1.0, 0.5), "gamma"),
    (lambda: long_context_cosine(10, 1.0, 0.0), "rho"), (lambda: long_context_cosine(10, 1.0, 1.0), "rho"),
    (lambda: long_context_limit(1.0, 1.5), "rho"), (lambda: long_context_limit(float("nan"), 0.5), "gamma"),
])
def test_argument_errors(call, name):
    with pytest.raises(ArgumentError, match=name):
        call()
