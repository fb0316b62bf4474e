"""Attention velocity fields: hand-computed values, the reference implementations, symmetries.

Every expected value here is computed without the library's field code: either literal
formulas worked out by hand (small N, 1-D, Q = K = V = 1) or
:mod:`transformer_pde.testing.references`, a direct transcription of the formulas of
docs/conventions.md with loops over heads and queries (its Sinkhorn coupling is checked
against POT in tests/testing/test_references.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.attention import KINDS, Layers
from transformer_pde.backends import BackendNotAvailable, get_backend, register_backend
from transformer_pde.backends import BACKENDS
from transformer_pde.testing import CORE_KINDS, attention_problems, attentions, measures, references

ALL_KINDS = sorted(CORE_KINDS)
NORMALISED = [k for k in ALL_KINDS if KINDS[k].normalized]
MASKABLE = [k for k in ALL_KINDS if KINDS[k].maskable]

E = math.e


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def one_d(kind, **kw):
    return tp.Attention(kind, [[1.0]], [[1.0]], [[1.0]], **kw)


# --------------------------------------------------------------------------- hand-computed
# 1-D, Q = K = V = 1, beta = 1, eps = 1, l2_beta = 1/2, uniform weights: s(x, y) = x y.
# Sinkhorn, N = 2: a 2x2 coupling with uniform marginals is [[a, 1/2-a], [1/2-a, a]] and the
# cross ratio a^2/(1/2-a)^2 equals K11 K22/(K12 K21) = e^{S11+S22-S12-S21} =: rho, so
# Gamma(x1) = (sqrt(rho) x1 + x2)/(1 + sqrt(rho)).  Tokens (0, 1): rho = e.
# Sinkhorn, N = 3 on (-1, 0, 1): by symmetry k_ij = a_i a_j e^{x_i x_j} with a = (a1, a2, a1);
# the marginal equations a2 (2 a1 + a2) = 3 and a1 (c a1 + a2) = 3 (c = e + 1/e) give
# z = a2^2 = 3 (c + 1 - sqrt(4c + 1)) / (c - 2), a1 = (3 - z) / (2 a2) and
# Gamma(-1) = a1^2 (1/e - e) / 3.
_c = E + 1 / E
_z = 3 * (_c + 1 - math.sqrt(4 * _c + 1)) / (_c - 2)
_a1 = (3 - _z) / (2 * math.sqrt(_z))
_SK3 = _a1 ** 2 * (1 / E - E) / 3
_SM3 = (1 / E - E) / (E + 1 + 1 / E)
_L23 = (-1 + math.exp(-2)) / (1 + math.exp(-0.5) + math.exp(-2))

HAND = {
    # kind: (field at x=[2], field at x=[0, 1], field at x=[-1, 0, 1])
    "softmax": ([2.0], [0.5, E / (1 + E)], [_SM3, 0.0, -_SM3]),
    "linear": ([8.0], [0.0, 0.5], [-2 / 3, 0.0, 2 / 3]),
    "l2": ([2.0], [math.exp(-0.5) / (1 + math.exp(-0.5)), 1 / (1 + math.exp(-0.5))],
           [_L23, 0.0, -_L23]),
    "sinkhorn": ([2.0], [1 / (1 + math.sqrt(E)), math.sqrt(E) / (1 + math.sqrt(E))],
                 [_SK3, 0.0, -_SK3]),
    "sigmoid": ([sig(4.0) * 2], [0.25, sig(1.0) / 2],
                [(sig(-1) - sig(1)) / 3, 0.0, (sig(1) - sig(-1)) / 3]),
    "relu": ([8.0], [0.0, 0.5], [-1 / 3, 0.0, 1 / 3]),
    "exp": ([math.exp(4) * 2], [0.5, E / 2], [(1 / E - E) / 3, 0.0, (E - 1 / E) / 3]),
}


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("case", [0, 1, 2], ids=["N=1", "N=2", "N=3"])
def test_hand_computed_fields(kind, case):
    X = [[[2.0]], [[0.0], [1.0]], [[-1.0], [0.0], [1.0]]][case]
    got = tp.velocity(one_d(kind), np.array(X))
    # closed forms evaluated in double precision; the library's only extra error is the
    # Sinkhorn stopping rule (1e-9 marginal error in the log domain)
    np.testing.assert_allclose(got[:, 0], HAND[kind][case], rtol=1e-8, atol=1e-9)


def test_hand_computed_weighted_and_2d():
    # weights (1/4, 3/4) on tokens 0 and 1 in 1-D softmax: Gamma(1) = 3e / (1 + 3e)
    got = tp.velocity(one_d("softmax"), np.array([[0.0], [1.0]]), weights=[1.0, 3.0])
    np.testing.assert_allclose(got[:, 0], [0.75, 3 * E / (1 + 3 * E)], rtol=1e-13)
    # 2-D, Q = I, K = rotation by 90 degrees, V = diag(1, 2): s(x, y) = <x, R y>;
    # tokens e1, e2: s(e1, e1) = 0, s(e1, e2) = <e1, -e1> = -1, s(e2, e1) = 1, s(e2, e2) = 0
    R = np.array([[0.0, -1.0], [1.0, 0.0]])
    att = tp.Attention("softmax", np.eye(2), R, np.diag([1.0, 2.0]))
    got = tp.velocity(att, np.eye(2))
    p1 = 1 / (1 + 1 / E)  # query e1: weights (e^0, e^-1)/(e^0 + e^-1) on (e1, e2)
    p2 = 1 / (1 + E)      # query e2: weights (e^1, e^0)/(e^1 + e^0), so p2 on e2
    np.testing.assert_allclose(got[0], [p1, 2 * (1 - p1)], rtol=1e-13)
    np.testing.assert_allclose(got[1], [1 - p2, 2 * p2], rtol=1e-13)


def test_hand_computed_masked():
    # tokens 0 and 1 at positions 0 and 1: the first sees only itself, the second both
    X = np.array([[0.5], [1.0]])
    got = tp.velocity(one_d("softmax", masked=True), X, positions=[0.0, 1.0])
    e = math.exp(0.25), math.exp(0.5)
    np.testing.assert_allclose(got[:, 0], [0.5, (0.5 * e[1] + 1.0 * math.exp(1.0))
                                           / (e[1] + math.exp(1.0))], rtol=1e-13)
    # unnormalised kinds keep the full-measure weights w_j = 1/2 on the visible prefix
    got = tp.velocity(one_d("linear", masked=True), X, positions=[0.0, 1.0])
    np.testing.assert_allclose(got[:, 0], [0.5 * 0.25 * 0.5, 0.5 * 0.5 * 0.5 + 0.5 * 1.0],
                               rtol=1e-13)


# --------------------------------------------------------------------------- reference, random
@settings(max_examples=60)
@given(problem=attention_problems(heads=None, masked=None, weighted=None,
                                  time_dependent=None),
       t=st.floats(0.0, 3.0))
def test_matches_loop_reference(problem, t, backend):
    att, m = problem
    got = tp.velocity(att, m.X, t=t, backend=backend, **m.kwargs)
    # double precision on O(1) values, exponentials of at most e^8 (transformer_pde.testing
    # strategies); sinkhorn carries the library's 1e-9 log-domain stopping error
    np.testing.assert_allclose(got, references.velocity(att, m.X, t=t, **m.kwargs),
                               rtol=1e-7, atol=1e-8)


@given(problem=attention_problems(masked=None, weighted=None), data=st.data())
def test_queries_match_reference(problem, data):
    att, m = problem
    q = data.draw(measures(d=m.d, n=(1, 4), positions=att.masked))
    got = tp.velocity(att, m.X, queries=q.X, query_positions=q.positions, **m.kwargs)
    want = references.velocity(att, m.X, queries=q.X, query_positions=q.positions, **m.kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-8)


# --------------------------------------------------------------------------- symmetries
@given(problem=attention_problems(heads=None, masked=None, weighted=None), data=st.data())
def test_permutation_equivariance(problem, data):
    att, m = problem
    perm = np.array(data.draw(st.permutations(range(m.n))))
    out = tp.velocity(att, m.X, **m.kwargs)
    w = None if m.weights is None else m.weights[perm]
    p = None if m.positions is None else m.positions[perm]
    out_p = tp.velocity(att, m.X[perm], weights=w, positions=p)
    # a permutation only reorders sums; round-off (and Sinkhorn's stopping error) remain
    np.testing.assert_allclose(out_p, out[perm], rtol=1e-9, atol=1e-10)


@given(problem=attention_problems(heads=None, masked=None, weighted=True), data=st.data())
def test_zero_weight_token_is_a_pure_query(problem, data):
    # appending a token of weight 0 leaves the measure unchanged: the field at the other
    # tokens is the same, and at the new token it is the old measure's field at that point
    att, m = problem
    extra = data.draw(measures(d=m.d, n=1, positions=att.masked))
    X = np.vstack([m.X, extra.X])
    w = np.append(m.weights, 0.0)
    p = None if m.positions is None else np.append(m.positions, extra.positions)
    out = tp.velocity(att, X, weights=w, positions=p)
    np.testing.assert_allclose(out[:-1], tp.velocity(att, m.X, **m.kwargs),
                               rtol=1e-8, atol=1e-9)
    at_new = tp.velocity(att, m.X, queries=extra.X, query_positions=extra.positions,
                         **m.kwargs)
    np.testing.assert_allclose(out[-1:], at_new, rtol=1e-8, atol=1e-9)


def _in_hull(points: np.ndarray, y: np.ndarray, tol: float) -> bool:
    """Support-function test: for many directions u, min u.x_j <= u.y <= max u.x_j."""
    d = points.shape[1]
    rng = np.random.default_rng(0)
    U = np.vstack([np.eye(d), -np.eye(d), rng.normal(size=(64, d))])
    proj, py = points @ U.T, y @ U.T
    return bool(np.all(py <= proj.max(0) + tol) and np.all(py >= proj.min(0) - tol))


@given(m=measures(d=(1, 3), n=(1, 6), weighted=None, positions=None), data=st.data())
def test_softmax_identity_value_stays_in_convex_hull(m, data):
    a = data.draw(attentions(kinds=["softmax", "l2", "sinkhorn"], d=m.d,
                             masked=m.positions is not None))
    a = a.replace(V=np.eye(m.d), W_O=None)
    kw = m.kwargs if a.masked else {"weights": m.weights}
    out = tp.velocity(a, m.X, **kw)
    for i in range(m.n):
        vis = m.X if not a.masked else m.X[m.positions <= m.positions[i]]
        assert _in_hull(vis, out[i], 1e-12), (i, out[i], vis)


@pytest.mark.parametrize("kind", NORMALISED)
def test_single_token_is_fixed_by_normalised_attention(kind):
    # Gamma_{delta_x}(x) = V x; with V = I the attention map fixes the token exactly
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 3))
    Q, K = rng.normal(size=(2, 3, 3))
    att = tp.Attention(kind, Q, K, np.eye(3))
    np.testing.assert_allclose(tp.velocity(att, x), x, rtol=1e-14)
    V = rng.normal(size=(3, 3))
    np.testing.assert_allclose(tp.velocity(att.replace(V=V), x), x @ V.T, rtol=1e-13)


@given(problem=attention_problems(d=st.sampled_from([2, 4]), heads=None, masked=None,
                                  weighted=None))
def test_multihead_equals_sum_of_heads(problem):
    att, m = problem
    H, d = att.heads, att.d
    k = d // H
    Q, K, V = (np.asarray(att.Q), np.asarray(att.K), np.asarray(att.V))
    total = np.zeros_like(m.X)
    for h in range(H):
        rows = slice(h * k, (h + 1) * k)
        Vh = np.zeros((d, d))
        Vh[rows] = V[rows]  # single head writing only into block h
        single = tp.Attention(att.kind, Q[rows], K[rows], Vh, masked=att.masked,
                              beta=att.beta, eps=att.eps, l2_beta=att.l2_beta)
        total += tp.velocity(single, m.X, **m.kwargs)
    if att.W_O is not None:
        total = total @ np.asarray(att.W_O).T
    np.testing.assert_allclose(tp.velocity(att, m.X, **m.kwargs), total,
                               rtol=1e-10, atol=1e-12)


@given(problem=attention_problems(kinds=MASKABLE, heads=None, weighted=None),
       s=st.floats(0.0, 1.0))
def test_masked_with_equal_positions_is_unmasked(problem, s):
    att, m = problem
    unmasked = tp.velocity(att, m.X, weights=m.weights)
    masked = tp.velocity(att.replace(masked=True), m.X, weights=m.weights,
                         positions=np.full(m.n, s))
    np.testing.assert_allclose(masked, unmasked, rtol=1e-12, atol=1e-13)


@given(problem=attention_problems(kinds=MASKABLE, masked=True, weighted=None, n=(2, 6)))
def test_masked_first_token_sees_only_itself(problem):
    att, m = problem
    pos = np.linspace(0.0, 1.0, m.n)[::-1]  # token n-1 comes first
    out = tp.velocity(att, m.X, weights=m.weights, positions=pos)
    first = m.n - 1
    alone = tp.velocity(att.replace(masked=False), m.X[first:], weights=None)
    # normalised kinds: the field of delta_x; unnormalised: that field scaled by w_first
    scale = 1.0 if KINDS[att.kind].normalized else m.w[first]
    np.testing.assert_allclose(out[first], scale * alone[0], rtol=1e-12, atol=1e-13)


@given(problem=attention_problems(kinds=["sinkhorn"], heads=None, weighted=None))
def test_sinkhorn_field_averages_to_v_times_mean(problem):
    # column sums of the doubly stochastic coupling are one, so
    # sum_i w_i Gamma(x_i) = W_O concat_h(V_h sum_j w_j x_j) = W_O V mean  (alpha' = V alpha)
    att, m = problem
    out = tp.velocity(att, m.X, weights=m.weights)
    W = np.eye(m.d) if att.W_O is None else np.asarray(att.W_O)
    want = W @ np.asarray(att.V) @ (m.w @ m.X)
    # the column marginals hold to the Sinkhorn stopping tolerance (1e-9, log domain)
    np.testing.assert_allclose(m.w @ out, want, rtol=1e-7, atol=1e-8)


# --------------------------------------------------------------------------- time dependence
def test_callable_and_layers_parameters_are_evaluated_at_t(rng):
    X = rng.normal(size=(5, 2))
    Q0, K0, V0 = rng.normal(size=(3, 2, 2)) * 0.5

    def Q(t):
        return Q0 * (1 + t)

    att = tp.Attention("softmax", Q, K0, V0)
    for t in (0.0, 0.3, 2.0):
        fixed = tp.Attention("softmax", Q0 * (1 + t), K0, V0)
        np.testing.assert_array_equal(tp.velocity(att, X, t=t), tp.velocity(fixed, X))
    tab = Layers(np.stack([Q0, 2 * Q0, 3 * Q0]), layer_time=0.5)
    att = tp.Attention("softmax", tab, K0, V0)
    for t, layer in ((0.0, 0), (0.49, 0), (0.5, 1), (1.2, 2), (9.0, 2)):
        fixed = tp.Attention("softmax", (layer + 1) * Q0, K0, V0)
        np.testing.assert_array_equal(tp.velocity(att, X, t=t), tp.velocity(fixed, X))


# --------------------------------------------------------------------------- stability
def test_huge_logits_softmax_and_sinkhorn():
    # tokens 30 and 31 in 1-D: scores 900, 930, 961 (logits ~1e3 overflow a naive exp)
    X = np.array([[30.0], [31.0]])
    # softmax: Gamma(30) = (30 + e^{30} 31)/(1 + e^{30}), Gamma(31) = (30 + e^{31} 31)/(1 + e^{31})
    want = [(30 * math.exp(-30) + 31) / (math.exp(-30) + 1),
            (30 * math.exp(-31) + 31) / (math.exp(-31) + 1)]
    got = tp.velocity(one_d("softmax"), X)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-13)
    # sinkhorn: rho = e^{900 + 961 - 2 * 930} = e, as in the N = 2 hand computation
    r = math.sqrt(E)
    got = tp.velocity(one_d("sinkhorn"), X)
    # the potentials are ~1e3, so the 1e-9 log-domain tolerance costs ~1e-9 relative
    np.testing.assert_allclose(got[:, 0], [(r * 30 + 31) / (1 + r), (30 + r * 31) / (1 + r)],
                               rtol=1e-8)


def test_sinkhorn_small_eps():
    # eps = 1e-3 on tokens (0, 1): logits s/eps up to 1e3, rho = e^{1000}, and the N = 2
    # formula gives Gamma = (1/(1 + e^{500}), e^{500}/(1 + e^{500})) -- computed as e^{-500}
    att = one_d("sinkhorn", eps=1e-3)
    got = tp.velocity(att, np.array([[0.0], [1.0]]))
    np.testing.assert_allclose(got[:, 0], [math.exp(-500) / (1 + math.exp(-500)),
                                           1 / (1 + math.exp(-500))], rtol=1e-9, atol=0)
    # 2-D, non-symmetric A, eps = 0.1 against the reference's plain log-domain Sinkhorn
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 2))
    R = np.array([[0.0, -1.0], [1.0, 0.3]])
    att = tp.Attention("sinkhorn", np.eye(2), R, np.eye(2), eps=0.1)
    want = references.field("sinkhorn", X, np.eye(2), R, np.eye(2), eps=0.1)
    # potentials of size ~|s| = O(1) divided by eps: the 1e-9 log-domain stopping error
    # of each solver moves the weights by ~1e-9 relative
    np.testing.assert_allclose(tp.velocity(att, X), want, rtol=1e-7, atol=1e-8)


def test_huge_logits_l2():
    # tokens 100 and 101, Q = K = 1, l2_beta = 1/2: kernel e^{-(x-y)^2/2} but the library's
    # decomposition 2 b' x y - b' y^2 has logits ~1e4 (cancelling); the answer is
    # Gamma(100) = (100 + e^{-1/2} 101)/(1 + e^{-1/2}) and symmetrically for 101
    X = np.array([[100.0], [101.0]])
    q = math.exp(-0.5)
    got = tp.velocity(one_d("l2"), X)
    # logits of 1e4 carry absolute round-off ~1e-12, i.e. relative ~1e-12 in the weights
    np.testing.assert_allclose(got[:, 0], [(100 + q * 101) / (1 + q), (q * 100 + 101) / (1 + q)],
                               rtol=1e-10)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("kind", ["softmax", "l2", "sinkhorn"])
def test_huge_logits_stay_finite_in_several_dimensions(kind):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(6, 3)) * 20  # scores of order 1e3
    att = tp.Attention(kind, np.eye(3), np.eye(3), np.eye(3))
    got = tp.velocity(att, X)
    assert np.all(np.isfinite(got))
    # each value is a convex combination of the tokens (V = I, normalised kinds)
    for y in got:
        assert _in_hull(X, y, 1e-9 * np.abs(X).max())


# --------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_float32_stays_float32(kind, rng):
    X = rng.normal(size=(7, 2)).astype(np.float32)
    att = tp.Attention(kind, np.eye(2) * 0.5, np.eye(2), np.eye(2))
    out = tp.velocity(att, X)
    assert out.dtype == np.float32
    ref = tp.velocity(att, X.astype(np.float64))
    # single precision: ~1e-7 relative per operation, a few dozen operations per value
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_integer_input_is_promoted_to_float64():
    out = tp.velocity(one_d("softmax"), np.array([[0], [1]]))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[:, 0], HAND["softmax"][1], rtol=1e-14)


# --------------------------------------------------------------------------- validation
def test_velocity_validation_errors():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X = np.zeros((3, 2))
    cases = [
        (dict(X=np.zeros((3, 3))), ValueError, "X must have shape"),
        (dict(X=np.zeros(3)), ValueError, "X must have shape"),
        (dict(X=np.zeros((0, 2))), ValueError, "X must contain"),
        (dict(X=np.array([[0.0, np.nan]] * 3)), ValueError, "X contains NaN"),
        (dict(X=np.array([[0.0, np.inf]] * 3)), ValueError, "X contains NaN"),
        (dict(weights=[1.0, 1.0]), ValueError, "weights must have shape"),
        (dict(weights=[1.0, -1.0, 1.0]), ValueError, "weights must be >= 0"),
        (dict(weights=[0.0, 0.0, 0.0]), ValueError, "weights must have a positive sum"),
        (dict(weights=[1.0, np.nan, 1.0]), ValueError, "weights contain NaN"),
        (dict(queries=np.zeros((2, 3))), ValueError, "queries must have shape"),
        (dict(query_positions=[0.5]), ValueError, "query_positions given without queries"),
        (dict(backend="nope"), ValueError, "backend must be one of"),
    ]
    for kw, exc, msg in cases:
        args = {"X": X, **kw}
        with pytest.raises(exc, match=msg):
            tp.velocity(att, args.pop("X"), **args)
    with pytest.raises(TypeError, match="att must be"):
        tp.velocity("softmax", X)


def test_masked_validation_errors():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True)
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="masked attention needs positions"):
        tp.velocity(att, X)
    with pytest.raises(ValueError, match="positions must have shape"):
        tp.velocity(att, X, positions=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 1\]"):
        tp.velocity(att, X, positions=[0.0, 1.5, 0.2])
    with pytest.raises(ValueError, match="positions contain NaN"):
        tp.velocity(att, X, positions=[0.0, np.nan, 0.2])
    with pytest.raises(ValueError, match="masked attention needs query_positions"):
        tp.velocity(att, X, positions=[0.0, 0.5, 1.0], queries=np.zeros((1, 2)))


def test_backend_errors():
    with pytest.raises(ValueError, match="backend must be one of"):
        get_backend("not-a-backend")
    register_backend("_missing_for_test", "transformer_pde_no_such_module:Backend")
    try:
        with pytest.raises(BackendNotAvailable, match="_missing_for_test"):
            get_backend("_missing_for_test")
        assert "_missing_for_test" not in tp.available_backends()
        with pytest.raises(BackendNotAvailable):
            tp.velocity(one_d("softmax"), np.zeros((2, 1)), backend="_missing_for_test")
    finally:
        BACKENDS.pop("_missing_for_test", None)
    assert issubclass(BackendNotAvailable, ImportError)
    assert "numpy" in tp.available_backends()


def test_sinkhorn_not_converged_is_reported():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(6, 2)) * 3
    att = tp.Attention("sinkhorn", np.eye(2), np.eye(2), np.eye(2), eps=0.05)
    with pytest.raises(tp.SinkhornNotConverged, match="did not converge"):
        tp.velocity(att, X, sinkhorn_max_iter=2)
