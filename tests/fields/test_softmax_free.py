"""Softmax-free attention of Cao 2021: the ``galerkin`` and ``fourier`` kinds.

With LN the per-token layer normalisation over a head's k features and s = beta <q, k>:
galerkin Gamma(x) = sum_j w_j beta <Q x, LN(K x_j)> LN(V x_j), fourier
Gamma(x) = sum_j w_j beta <LN(Q x), LN(K x_j)> V x_j (loop transcriptions in
:mod:`transformer_pde.testing.references`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings

import transformer_pde as tp
from transformer_pde.attention import KINDS
from transformer_pde.blocks import SOFTMAX_FREE_LN_EPS
from transformer_pde.testing import attention_problems, references

EPS = SOFTMAX_FREE_LN_EPS


def test_registry_entries():
    for name in ("galerkin", "fourier"):
        k = KINDS[name]
        assert not k.normalized and k.maskable and not k.affine_on_gaussians
        assert name in tp.fields.HEAD_FIELDS


@settings(max_examples=60, deadline=None)
@given(attention_problems(kinds=["galerkin", "fourier"], d=(2, 4), n=(1, 7), heads=None,
                          masked=None, weighted=None, time_dependent=None))
def test_matches_the_loop_reference(problem):
    att, m = problem
    assume(all(h.Q.shape[0] >= 2 for h in att.at(0.0).heads))
    got = tp.velocity(att, m.X, **m.kwargs)
    ref = references.velocity(att, m.X, **m.kwargs)
    # same sums in another order: rounding only (values are O(d) here)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_reduce_to_linear_when_already_normalised():
    # K = [[1, 0], [-1, 0]] maps x = (+-1, z) to (x1, -x1): mean 0, variance 1, so
    # LN(Kx) = Kx / sqrt(1 + eps); likewise for V (galerkin) and Q (fourier).  Then
    # galerkin = linear / (1 + eps) and fourier = linear / (1 + eps) exactly.
    rng = np.random.default_rng(0)
    n = 9
    X = np.stack([rng.choice([-1.0, 1.0], n), rng.normal(size=n)], axis=1)
    N = np.array([[1.0, 0.0], [-1.0, 0.0]])
    A = rng.normal(size=(2, 2))
    g = tp.velocity(tp.Attention("galerkin", A, N, N, beta=1.7), X)
    lin = tp.velocity(tp.Attention("linear", A, N, N, beta=1.7), X)
    np.testing.assert_allclose(g, lin / (1 + EPS), rtol=1e-13, atol=1e-15)
    f = tp.velocity(tp.Attention("fourier", N, N, A, beta=0.6), X)
    lin = tp.velocity(tp.Attention("linear", N, N, A, beta=0.6), X)
    np.testing.assert_allclose(f, lin / (1 + EPS), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["galerkin", "fourier"])
def test_scale_invariance(kind):
    # LN removes the scale of the normalised projections: galerkin is invariant under
    # K -> cK, V -> cV, fourier under Q -> cQ, K -> cK (c > 0), up to the epsilon in the
    # variance.  Each normalised vector changes by a relative O(eps / (c^2 var_min)); with
    # k = 4 features and c >= 1/2 the smallest per-token variance here is > 0.05, so the
    # change is below 1e-3 (checked on the data in the assertion below).
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 4))
    Q, K, V = (rng.normal(size=(4, 4)) for _ in range(3))
    for M in (Q, K, V):
        assert (X @ M.T).var(axis=1).min() > 0.05
    base = tp.velocity(tp.Attention(kind, Q, K, V), X)
    if kind == "galerkin":
        scaled = tp.velocity(tp.Attention(kind, Q, 3 * K, 0.5 * V), X)
    else:
        scaled = tp.velocity(tp.Attention(kind, 3 * Q, 0.5 * K, V), X)
    np.testing.assert_allclose(scaled, base, rtol=1e-3, atol=1e-3 * np.abs(base).max())
    # the unnormalised matrix (Q for galerkin, V for fourier) enters linearly
    if kind == "galerkin":
        other = tp.velocity(tp.Attention(kind, 2 * Q, K, V), X)
    else:
        other = tp.velocity(tp.Attention(kind, Q, K, 2 * V), X)
    np.testing.assert_allclose(other, 2 * base, rtol=1e-12, atol=1e-12)


def test_masked_equal_positions_equals_unmasked():
    # all positions equal: every token sees every other; exercises the pointwise
    # (prefix) path against the factorised O(N k^2) path
    rng = np.random.default_rng(2)
    X = rng.normal(size=(15, 3))
    Q, K, V = (rng.normal(size=(3, 3)) for _ in range(3))
    for kind in ("galerkin", "fourier"):
        a = tp.velocity(tp.Attention(kind, Q, K, V), X)
        b = tp.velocity(tp.Attention(kind, Q, K, V, masked=True), X,
                        positions=np.full(15, 0.5))
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_galerkin_is_linear_in_the_query():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(10, 3))
    att = tp.Attention("galerkin", *(rng.normal(size=(3, 3)) for _ in range(3)))
    x, y = rng.normal(size=(1, 3)), rng.normal(size=(1, 3))
    G = lambda q: tp.velocity(att, X, queries=q)  # noqa: E731
    np.testing.assert_allclose(G(2 * x - 3 * y), 2 * G(x) - 3 * G(y), rtol=1e-12, atol=1e-12)


def test_needs_two_features_and_keeps_float32():
    X = np.random.default_rng(4).normal(size=(5, 2))
    # refused when the attention is built, not at its first evaluation
    for kind in ("galerkin", "fourier"):
        with pytest.raises(ValueError, match="k >= 2"):
            tp.Attention(kind, np.ones((1, 2)), np.ones((1, 2)), np.eye(2))
        with pytest.raises(ValueError, match="k >= 2"):   # two heads of one feature each
            tp.Attention(kind, np.eye(2), np.eye(2), np.eye(2), heads=2)
    att = tp.Attention("fourier", np.eye(2), np.array([[1.0, 2.0], [0.0, 1.0]]), np.eye(2))
    out = tp.velocity(att, X.astype(np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, tp.velocity(att, X), rtol=1e-4, atol=1e-5)


def test_simulation_runs_and_is_recorded():
    rng = np.random.default_rng(5)
    att = tp.Attention("galerkin", *(0.5 * rng.normal(size=(4, 4)) for _ in range(3)),
                       heads=2)
    tr = tp.simulate(att, rng.normal(size=(30, 4)), t_max=1.0, dt=0.1, solver="heun")
    assert tr.status == "ok" and np.all(np.isfinite(tr.states))


@pytest.mark.parametrize("masked", [False, True])
def test_every_backend_matches_the_reference(masked, backend):
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 4))
    pos = rng.uniform(size=40) if masked else None
    for kind in ("galerkin", "fourier"):
        att = tp.Attention(kind, *(rng.normal(size=(4, 4)) for _ in range(3)), heads=2,
                           masked=masked)
        got = tp.velocity(att, X, positions=pos, backend=backend)
        want = references.velocity(att, X, positions=pos)
        # sums of 40 terms of size O(10) in another order: rounding only
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
