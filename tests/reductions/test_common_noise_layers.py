"""The value placement against a deep Transformer with random value matrices.

L normalised residual layers x_i <- (x_i + sqrt(h) G_l A_i) / |...|, G_l a d x d standard
Gaussian matrix shared by the two tokens and drawn afresh in each layer, A_i the softmax
average (Q = K = V = I): the layers whose limit h -> 0 defines ``placement="value"`` (with
``drift=0``, where sigma is only a time scale).  The fraction of B independent pairs with
rho_L < 0 is binomial, standard deviation sqrt(P(1 - P)/B); accepted within 5 standard
deviations (false-fail probability < 6e-7) plus 0.015 for the step h = 0.02 and the depth
(measured with 4000 pairs: 0.244 vs 0.247 at beta = 2, d = 4; 0.252 vs 0.252 at beta = 3,
d = 6; the depth T = 16 leaves under 1 % of the pairs undecided).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from transformer_pde.reductions.common_noise import antipodal_probability

BIAS = 0.015


def random_value_layers(beta, d, rho0, B, *, h=0.02, depth=16.0, seed=0):
    rng = np.random.default_rng(seed)
    x1 = np.zeros((B, d))
    x2 = np.zeros((B, d))
    x1[:, 0], x2[:, 0], x2[:, 1] = 1.0, rho0, math.sqrt(1.0 - rho0 ** 2)
    for _ in range(int(round(depth / h))):
        rho = np.einsum("bi,bi->b", x1, x2)[:, None]
        p = 1.0 / (1.0 + np.exp(-beta * (1.0 - rho)))
        a1, a2 = p * x1 + (1 - p) * x2, (1 - p) * x1 + p * x2
        G = rng.standard_normal((B, d, d))
        y1 = x1 + math.sqrt(h) * np.einsum("bij,bj->bi", G, a1)
        y2 = x2 + math.sqrt(h) * np.einsum("bij,bj->bi", G, a2)
        x1 = y1 / np.linalg.norm(y1, axis=1, keepdims=True)
        x2 = y2 / np.linalg.norm(y2, axis=1, keepdims=True)
    return np.einsum("bi,bi->b", x1, x2)


def check(beta, d, rho0, B, seed):
    rho = random_value_layers(beta, d, rho0, B, seed=seed)
    P = antipodal_probability(beta, d, rho0, placement="value", drift=0.0)
    est = float(np.mean(rho < 0.0))
    assert abs(est - P) <= 5 * math.sqrt(P * (1 - P) / B) + BIAS, (est, P)
    return est, P


def test_random_value_layers_end_antipodal_at_the_oracle_rate():
    # 1000 pairs: P = 0.247, sd 0.014; at beta = 0 (P = 0 in d = 4) or without attention
    # (arccos(0)/pi = 0.5) a run would be 12 sd away
    est, P = check(2.0, 4, 0.0, 1000, seed=5)
    assert 0.24 < P < 0.25


def test_below_the_critical_beta_random_value_layers_merge():
    # d = 6: beta_c = arccosh(4)/2 = 1.03; at beta = 0.5 every pair merges (P = 0)
    assert antipodal_probability(0.5, 6, 0.0, placement="value", drift=0.0) == 0.0
    rho = random_value_layers(0.5, 6, 0.0, 300, seed=6)
    assert np.mean(rho < 0.0) <= 0.01


@pytest.mark.slow
@pytest.mark.parametrize("beta, d, rho0", [(3.0, 6, 0.0), (1.5, 3, -0.5), (4.0, 10, 0.3),
                                           (0.5, 2, 0.2)])
def test_grid(beta, d, rho0):
    # 3000 pairs: sd <= 0.0092, acceptance <= 0.061
    check(beta, d, rho0, 3000, seed=7)
