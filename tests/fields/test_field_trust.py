"""Cancelling biases, fields beyond the float range, clear argument errors.

* Query/key biases that cancel mathematically for a kind are removed exactly before the
  scores are formed (``Kind.bias_rule``, ``attention.score_head``): softmax drops ``b_K``,
  sinkhorn drops ``b_Q`` and ``b_K``, l2 keeps only ``b_Q - b_K``.  A huge cancelling
  bias then leaves the field unchanged instead of swamping ``K y`` by rounding.
* ``velocity`` never returns a non-finite field for finite tokens: it computes it (the
  ``exp`` kind in the log domain, finite whenever the true value is) or raises
  ``ScoreOverflowError`` naming the kind and ``beta``; ``simulate`` stops with status
  ``nonfinite``.
* Bad arguments of ``Attention``, ``Block`` (and its options), ``velocity``,
  ``register_kind`` and ``register_head_field`` raise the package's ``ArgumentError`` /
  ``ArgumentTypeError`` naming the argument; a hypothesis fuzz checks that no raw NumPy or
  Python exception escapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transformer_pde as tp
from transformer_pde.attention import KINDS, Kind, Layers, register_kind, score_head
from transformer_pde.backends.numpy_backend import NumpyBackend
from transformer_pde.errors import (ArgumentError, ArgumentTypeError, EarlyStopWarning,
                                    ScoreOverflowError, SinkhornNotConverged)
from transformer_pde.fields import HEAD_FIELDS, FieldEvaluator, register_head_field
from transformer_pde.testing import references

I2 = np.eye(2)
#: what a bad argument may raise: the package's own errors, never a raw exception
PACKAGE_ERRORS = (ArgumentError, ArgumentTypeError, ScoreOverflowError)


def _problem(rng, d=3, n=7):
    Q, K, V = rng.normal(size=(3, d, d))
    X = rng.normal(size=(n, d))
    u = rng.normal(size=d)
    return Q, K, V, X, u / np.linalg.norm(u)


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# --------------------------------------------------------------------------- cancelling biases
@pytest.mark.parametrize("heads,masked", [(1, False), (3, False), (1, True)])
def test_softmax_huge_key_bias_cancels(backend, heads, masked, rng):
    Q, K, V, X, u = _problem(rng)
    bQ = rng.normal(size=3)
    kw = dict(heads=heads, masked=masked, beta=0.7, b_Q=bQ, b_V=rng.normal(size=3))
    pos = {"positions": rng.uniform(size=7)} if masked else {}
    ref = tp.velocity(tp.Attention("softmax", Q, K, V, **kw), X, backend=backend, **pos)
    got = tp.velocity(tp.Attention("softmax", Q, K, V, b_K=1e16 * u, **kw), X,
                      backend=backend, **pos)
    assert _rel(got, ref) <= 1e-12
    if heads == 1 and not masked:   # and the field is the biased formula
        want = references.field("softmax", X, Q, K, V, b_Q=bQ, b_V=kw["b_V"], beta=0.7)
        np.testing.assert_allclose(ref, want, rtol=1e-12, atol=1e-13)


def test_softmax_key_bias_of_moderate_size_gives_the_formula(rng):
    # dropping b_K is exact mathematics: the field equals the formula with b_K included
    Q, K, V, X, u = _problem(rng)
    bQ, bK, bV = rng.normal(size=(3, 3))
    att = tp.Attention("softmax", Q, K, V, beta=1.3, b_Q=bQ, b_K=bK, b_V=bV)
    np.testing.assert_allclose(tp.velocity(att, X),
                               references.field("softmax", X, Q, K, V, b_Q=bQ, b_K=bK, b_V=bV,
                                                beta=1.3), rtol=1e-12)


def test_sinkhorn_huge_query_and_key_biases_cancel(rng):
    Q, K, V, X, u = _problem(rng, n=5)
    ref = tp.velocity(tp.Attention("sinkhorn", Q, K, V, beta=0.5), X, sinkhorn_tol=1e-12)
    att = tp.Attention("sinkhorn", Q, K, V, beta=0.5, b_Q=-3e15 * u, b_K=1e16 * u[::-1])
    assert _rel(tp.velocity(att, X, sinkhorn_tol=1e-12), ref) <= 1e-12


def test_l2_sees_only_the_bias_difference(backend, rng):
    Q, K, V, X, u = _problem(rng)
    d = rng.normal(size=3)
    ref = tp.velocity(tp.Attention("l2", Q, K, V, b_Q=d), X, backend=backend)
    same = tp.Attention("l2", Q, K, V, b_Q=1e16 * u + d, b_K=1e16 * u)
    # b_Q - b_K is d up to one rounding of 1e16 (|error| <= 1): compare with that shift
    shift = (1e16 * u + d) - 1e16 * u
    want = tp.velocity(tp.Attention("l2", Q, K, V, b_Q=shift), X, backend=backend)
    assert _rel(tp.velocity(same, X, backend=backend), want) <= 1e-12
    assert np.all(np.abs(shift - d) <= 2.0)
    assert ref.shape == want.shape


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_score_head_rules_of_the_builtin_kinds(kind):
    bQ, bK = np.array([1.0, 2.0]), np.array([5.0, -1.0])
    head = tp.Attention(kind, I2, I2, I2, b_Q=bQ, b_K=bK).at(0.0).heads[0]
    out = score_head(kind, head)
    rule = {"softmax": "drop_key", "sinkhorn": "drop_both", "l2": "difference"}.get(kind, "keep")
    assert KINDS[kind].bias_rule == rule
    if rule == "keep":
        assert out is head
    elif rule == "drop_key":
        assert out.bK is None and np.array_equal(out.bQ, bQ)
    elif rule == "drop_both":
        assert out.bK is None and out.bQ is None
    else:
        assert out.bK is None and np.array_equal(out.bQ, bQ - bK)
    # the parameters themselves are kept as given
    assert np.array_equal(head.bK, bK)


@pytest.mark.parametrize("kind", ["linear", "exp", "sigmoid", "galerkin"])
def test_kinds_that_see_the_key_bias_keep_it(kind, rng):
    # b_K does not cancel for these kinds: the field must change with it
    Q, K, V, X, u = _problem(rng)
    a = tp.velocity(tp.Attention(kind, Q, K, V, b_K=0.5 * u), X)
    b = tp.velocity(tp.Attention(kind, Q, K, V), X)
    assert _rel(a, b) > 1e-3


# --------------------------------------------------------------------------- non-finite fields
def test_exp_at_large_beta_raises_naming_kind_and_beta(backend):
    att = tp.Attention("exp", I2, I2, I2, beta=1000.0)
    with pytest.raises(ScoreOverflowError, match=r"'exp'.*beta=1000.*709\.8.*softmax"):
        tp.velocity(att, np.ones((3, 2)), backend=backend)


def test_exp_is_finite_whenever_the_true_field_is(backend):
    # lse = 2 * 19.5^2 = 760.5 > 709.8: e^lse overflows, the field (V tiny) does not
    att = tp.Attention("exp", I2, I2, 1e-300 * I2)
    X = np.full((3, 2), 19.5)
    want = math.exp(60.5) * (math.exp(700.0) * 19.5e-300)
    np.testing.assert_allclose(tp.velocity(att, X, backend=backend), np.full((3, 2), want),
                               rtol=1e-12)
    X32 = np.full((3, 2), 7.0, dtype=np.float32)     # float32: lse = 98 > 88.7
    att32 = tp.Attention("exp", I2, I2, 1e-30 * I2)
    got = tp.velocity(att32, X32, backend=backend)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, math.exp(98.0) * 7e-30, rtol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "relu", "galerkin"])
def test_unnormalised_kinds_beyond_the_float_range_raise(kind):
    att = tp.Attention(kind, I2, I2, 1e300 * I2)
    with pytest.raises(ScoreOverflowError, match=f"'{kind}' attention field"):
        tp.velocity(att, np.array([[1e10, 2e10], [3e10, 1e10], [2e10, 2e10]]))


def test_float32_overflows_at_much_smaller_scores():
    att = tp.Attention("exp", I2, I2, I2)
    X = np.full((3, 2), 7.0)
    assert np.all(np.isfinite(tp.velocity(att, X)))                 # float64: e^98 is fine
    with pytest.raises(ScoreOverflowError, match="float32.*compute in float64"):
        tp.velocity(att, X.astype(np.float32))                       # float32: e^98 > 3.4e38
    lin = tp.Attention("linear", I2, I2, I2)
    with pytest.raises(ScoreOverflowError, match="float32"):
        tp.velocity(lin, np.full((3, 2), 1e13, dtype=np.float32))    # 1e39 > 3.4e38


def test_bounded_and_normalised_kinds_stay_finite_at_huge_scores():
    X = np.array([[1e150, 1.0], [2e150, -1.0], [-1e150, 0.5]])
    for kind in ("sigmoid", "softmax"):
        assert np.all(np.isfinite(tp.velocity(tp.Attention(kind, I2, I2, I2), X)))


def test_output_projection_overflow_is_named():
    att = tp.Attention("softmax", I2, I2, I2, W_O=1e300 * I2)
    with pytest.raises(ScoreOverflowError, match="output map W_O"):
        tp.velocity(att, np.full((2, 2), 1e10))


def test_field_evaluator_check_finite_is_explicit():
    att = tp.Attention("exp", I2, I2, I2, beta=1000.0)
    X = np.ones((3, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        raw = FieldEvaluator(att, 3)(0.0, X)            # simulate's evaluator: loop checks
    assert not np.all(np.isfinite(raw))
    with pytest.raises(ScoreOverflowError, match="'exp'"):
        FieldEvaluator(att, 3, check_finite=True)(0.0, X)
    with pytest.raises(ArgumentTypeError, match="check_finite"):
        FieldEvaluator(att, 3, check_finite="yes")
    with pytest.raises(ArgumentError, match="dtype"):
        FieldEvaluator(att, 3, dtype=np.int64)


def test_simulate_stops_with_status_nonfinite():
    att = tp.Attention("exp", I2, I2, I2, beta=1000.0)
    with pytest.warns(EarlyStopWarning):
        run = tp.simulate(att, np.ones((3, 2)), t_max=1.0, dt=0.5, solver="euler")
    assert run.status == "nonfinite"
    assert np.all(np.isfinite(run.states))


# --------------------------------------------------------------------------- clear errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(constraint=tp.Sphere), r"pass constraint=tp\.Sphere\(\)"),
    (dict(constraint=tp.PostLayerNorm), r"constraint=tp\.PostLayerNorm\(\.\.\.\)"),
    (dict(layernorm=tp.LayerNorm), r"pass layernorm=tp\.LayerNorm\(\)"),
    (dict(layernorm=(tp.LayerNorm(), tp.LayerNorm)), r"layernorm\[1\].*class tp\.LayerNorm"),
    (dict(mlp=tp.MLP), r"pass mlp=tp\.MLP\(\.\.\.\)"),
    (dict(mlp=tp.MLP(I2, I2), splitting=True), "splitting must be one of"),
])
def test_block_refuses_classes_and_wrong_types(kwargs, match):
    with pytest.raises(ArgumentTypeError, match=match):
        tp.Block(**kwargs)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: tp.LayerNorm(variance=True), ArgumentTypeError, "variance"),
    (lambda: tp.LayerNorm(eps=1j), ArgumentTypeError, "eps"),
    (lambda: tp.LayerNorm(eps=np.nan), ArgumentError, "eps must be finite"),
    (lambda: tp.LayerNorm(mode=["pre"]), ArgumentTypeError, "mode"),
    (lambda: tp.LayerNorm(scale=Layers), ArgumentTypeError, "class tp.Layers"),
    (lambda: tp.MLP(I2, I2, activation=["relu"]), ArgumentTypeError, "activation"),
    (lambda: tp.MLP(None, I2), ArgumentTypeError, "W1"),
    (lambda: tp.MLP(I2 + 1j, I2), ArgumentTypeError, "W1 must be real"),
    (lambda: tp.MLP(I2, I2, b1=[1j, 0]), ArgumentTypeError, "b1 must be real"),
])
def test_block_options_validate_their_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize("name,value,exc,match", [
    ("b_Q", [1j, 0.0], ArgumentTypeError, "b_Q must be real"),
    ("b_K", np.array([1.0, 2.0 + 0j]), ArgumentTypeError, "b_K must be real"),
    ("b_V", lambda t: [0.0, 1j], ArgumentTypeError, r"b_V \(evaluated at t=0.0\) must be real"),
    ("b_O", [[1j], [0.0]], ArgumentTypeError, "b_O must be real"),
    ("b_O", tp.Sphere, ArgumentTypeError, "b_O must be a vector.*class Sphere"),
    ("b_Q", [10**400, 1], ArgumentError, "b_Q has an entry beyond the float64 range"),
    ("b_K", [np.inf, 0.0], ArgumentError, "b_K contains NaN or inf"),
    ("b_V", np.ones(3), ArgumentError, "b_V must have 2 entries"),
    ("Q", I2 + 1j, ArgumentTypeError, "Q must be real"),
    ("V", np.eye(2, dtype=complex), ArgumentTypeError, "V must be real"),
    ("K", Layers, ArgumentTypeError, "K must be a matrix.*class Layers"),
    ("W_O", lambda t: I2 * 1j, ArgumentTypeError, "W_O .* must be real"),
    ("beta", 1 + 0j, ArgumentTypeError, "beta must be a real number"),
    ("beta", True, ArgumentTypeError, "beta must be a real number"),
    ("beta", 10**400, ArgumentError, "beta must be finite"),
    ("eps", np.bool_(True), ArgumentTypeError, "eps must be a real number"),
    ("heads", np.bool_(True), ArgumentTypeError, "heads must be a positive integer"),
    ("kind", tp.Sphere, ArgumentTypeError, "kind must be one of"),
])
def test_attention_refuses_complex_bools_classes_and_bad_biases(name, value, exc, match):
    args = dict(kind="softmax", Q=I2, K=I2, V=I2)
    args[name] = value
    with pytest.raises(exc, match=match):
        tp.Attention(**args)


def test_register_kind_refuses_non_kinds_and_builtin_replacement():
    new = Kind("trust_test_kind", True, False, True, "test")
    try:
        with pytest.raises(ArgumentTypeError, match="must be a transformer_pde.Kind"):
            register_kind("trust_test_kind", {"normalized": True})
        with pytest.raises(ArgumentTypeError, match="must be a transformer_pde.Kind"):
            register_kind(object())
        with pytest.raises(ArgumentTypeError, match="class Kind"):
            register_kind(Kind)
        with pytest.raises(ArgumentError, match="'softmax' is a built-in"):
            register_kind("softmax", Kind("softmax", False, False, True, "mine"))
        with pytest.raises(ArgumentError, match="'softmax' is a built-in"):
            register_kind(Kind("softmax", True, True, True, "mine", "keep"), replace=True)
        assert KINDS["softmax"].bias_rule == "drop_key"          # untouched
        register_kind(KINDS["softmax"])                           # equal entry: a no-op
        with pytest.raises(ArgumentError, match="differs from the Kind's name"):
            register_kind("other", new)
        assert register_kind("trust_test_kind", new) is new
        register_kind(new)                                        # the same again: fine
        changed = Kind("trust_test_kind", False, False, True, "changed")
        with pytest.raises(ArgumentError, match="replace=True"):
            register_kind(changed)
        assert KINDS["trust_test_kind"] is new
        register_kind(changed, replace=True)
        assert KINDS["trust_test_kind"] is changed
        with pytest.raises(ArgumentTypeError, match="replace must be a bool"):
            register_kind(changed, replace=1)
    finally:
        KINDS.pop("trust_test_kind", None)


@pytest.mark.parametrize("args,exc,match", [
    (("k", 1, False, True, "d"), ArgumentTypeError, "normalized must be a bool"),
    ((3, True, False, True, "d"), ArgumentTypeError, "name must be a string"),
    (("", True, False, True, "d"), ArgumentError, "non-empty"),
    (("k", True, False, True, "d", "drop"), ArgumentError, "bias_rule must be one of"),
])
def test_kind_validates_its_fields(args, exc, match):
    with pytest.raises(exc, match=match):
        Kind(*args)


def test_register_head_field_refuses_builtins_and_silent_replacement():
    try:
        with pytest.raises(ArgumentError, match="'softmax' is a built-in"):
            register_head_field("softmax")
        with pytest.raises(ArgumentTypeError, match="name must be a string"):
            register_head_field(3)

        def f(ctx, P, h, head, Xq, Xk):
            return Xq

        register_head_field("trust_test_field")(f)
        register_head_field("trust_test_field")(f)               # the same function: fine
        with pytest.raises(ArgumentError, match="replace=True"):
            register_head_field("trust_test_field")(lambda *a: a[-2])
        with pytest.raises(ArgumentTypeError, match="must be a function"):
            register_head_field("trust_test_field", replace=True)(3)
        assert HEAD_FIELDS["trust_test_field"] is f
    finally:
        HEAD_FIELDS.pop("trust_test_field", None)


def test_velocity_argument_errors_are_the_packages():
    att = tp.Attention("softmax", I2, I2, I2)
    X = np.ones((3, 2))
    with pytest.raises(ArgumentTypeError, match="att must be"):
        tp.velocity(tp.Attention, X)
    with pytest.raises(ArgumentTypeError, match="class NumpyBackend"):
        tp.velocity(att, X, backend=NumpyBackend)
    with pytest.raises(ArgumentError, match="backend must be one of"):
        tp.velocity(att, X, backend="nope")
    with pytest.raises(ArgumentError, match="query_positions given without queries"):
        tp.velocity(att, X, query_positions=[0.5])


# --------------------------------------------------------------------------- fuzz
class _Opaque:
    pass


def _non_finite(shape):
    return hnp.arrays(np.float64, shape, elements=st.floats(allow_nan=True,
                                                           allow_infinity=True)).filter(
        lambda a: not np.all(np.isfinite(a)))


_CLASSES = st.sampled_from([tp.Sphere, tp.LayerNorm, Layers, np.ndarray, _Opaque, tp.MLP])
_COMPLEX_MATRIX = hnp.arrays(np.complex128, (2, 2),
                             elements=st.complex_numbers(allow_nan=False, allow_infinity=False,
                                                         max_magnitude=1e6))
_BAD_MATRIX = st.one_of(
    _non_finite((2, 2)), _COMPLEX_MATRIX, _CLASSES,
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)).filter(
        lambda a: a.ndim != 2 or a.shape[1] != 2 or 0 in a.shape or a.shape == (1, 2)),
    st.sampled_from(["ab", True, None, _Opaque(), [[1.0, 2.0], [3.0]], {"a": 1},
                     [[10**400, 0], [0, 1]], np.array([[None, 1.0], [1.0, 1.0]])]),
    _COMPLEX_MATRIX.map(lambda m: (lambda t: m)))
_BAD_SCALAR = st.one_of(
    st.sampled_from([np.nan, np.inf, -np.inf, True, np.bool_(False), "1", None, [1.0],
                     np.array([1.0, 2.0]), 10**400, _Opaque(), np.array(1 + 1j)]),
    st.complex_numbers(allow_nan=False, allow_infinity=False).filter(lambda z: z.imag != 0),
    _CLASSES)
def _bad_vector(n):
    """Vectors that are wrong wherever a finite real vector of ``n`` entries is expected."""
    return st.one_of(
        _non_finite((n,)), _CLASSES,
        hnp.arrays(np.complex128, (n,), elements=st.complex_numbers(max_magnitude=1e6)),
        hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)).filter(
            lambda a: a.size != n),
        st.sampled_from(["ab", True, _Opaque(), [[1.0], [2.0, 3.0]], [10**400] + [1.0] * (n - 1),
                         Layers(np.ones((2, 2, 2)))]))


_BAD_VECTOR = _bad_vector(2)
_BAD_ATTENTION_ARG = st.one_of(
    # W_O=None is the default (no output map), not a bad value
    st.tuples(st.sampled_from(["Q", "K", "V", "W_O"]), _BAD_MATRIX).filter(
        lambda a: not (a[0] == "W_O" and a[1] is None)),
    st.tuples(st.sampled_from(["beta", "eps", "l2_beta"]), _BAD_SCALAR),
    st.tuples(st.sampled_from(["b_Q", "b_K", "b_V", "b_O"]), _BAD_VECTOR),
    st.tuples(st.just("heads"), st.sampled_from([0, -1, 1.5, True, "2", 3, None, tp.Sphere])),
    st.tuples(st.just("masked"), st.sampled_from(["yes", 1, None, tp.Sphere])),
    st.tuples(st.just("kind"), st.one_of(st.text(max_size=5).filter(lambda s: s not in KINDS),
                                         st.sampled_from([3, None, tp.Sphere, ["softmax"]]))))


@given(arg=_BAD_ATTENTION_ARG, kind=st.sampled_from(sorted(KINDS)))
def test_fuzz_attention_bad_arguments_raise_package_errors(arg, kind):
    name, value = arg
    args = dict(kind=kind, Q=I2, K=I2, V=I2)
    args[name] = value
    with pytest.raises(PACKAGE_ERRORS):
        tp.Attention(**args).at(0.5)


_BAD_BLOCK_ARG = st.one_of(
    st.tuples(st.just("mlp"), st.one_of(_CLASSES, st.sampled_from(["x", 3, tp.LayerNorm()]))),
    st.tuples(st.just("layernorm"), st.one_of(
        _CLASSES, st.sampled_from(["pre", 3, [tp.LayerNorm()], (tp.LayerNorm(),)]),
        _CLASSES.map(lambda c: (tp.LayerNorm(), c)))),
    st.tuples(st.just("constraint"), st.one_of(
        _CLASSES, st.sampled_from([tp.PostLayerNorm, "ball", 3, _Opaque()]))),
    st.tuples(st.just("splitting"), st.sampled_from(["x", 3, ["lie"], True, tp.Sphere])),
    st.tuples(st.sampled_from(["ln.variance", "ln.eps"]), _BAD_SCALAR),
    st.tuples(st.sampled_from(["ln.scale", "ln.shift", "mlp.b1", "mlp.b2"]), _BAD_VECTOR),
    st.tuples(st.sampled_from(["mlp.W1", "mlp.W2"]), _BAD_MATRIX),
    st.tuples(st.sampled_from(["ln.mode", "mlp.activation"]),
              st.sampled_from(["tanh", 3, None, ["pre"], tp.Sphere])))


@given(arg=_BAD_BLOCK_ARG)
def test_fuzz_block_bad_arguments_raise_package_errors(arg):
    name, value = arg
    X = np.array([[1.0, 2.0], [-1.0, 0.5]])
    with pytest.raises(PACKAGE_ERRORS):
        if name.startswith("ln."):
            ln = tp.LayerNorm(**{name[3:]: value})
            ln(X, 0.5)
            tp.Block(layernorm=ln)
        elif name.startswith("mlp."):
            kw = dict(W1=I2, W2=I2)
            kw[name[4:]] = value
            mlp = tp.MLP(**kw)
            mlp(0.5, X)
            tp.Block(mlp=mlp)
        else:
            kw = {name: value}
            if name == "splitting":
                kw["mlp"] = tp.MLP(I2, I2)
            tp.Block(**kw)


_BAD_POINTS = st.one_of(
    hnp.arrays(np.float64, (3, 2), elements=st.floats(allow_nan=True, allow_infinity=True))
    .filter(lambda a: not np.all(np.isfinite(a))),
    hnp.arrays(np.complex128, (3, 2), elements=st.complex_numbers(max_magnitude=10)),
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)).filter(
        lambda a: a.ndim != 2 or a.shape[1] != 2 or a.shape[0] == 0),
    _CLASSES, st.sampled_from(["ab", True, _Opaque(), [[1.0, 2.0], [3.0]], [[10**400, 0.0]]]))
_BAD_VELOCITY_ARG = st.one_of(
    st.tuples(st.sampled_from(["X", "queries"]), _BAD_POINTS),
    st.tuples(st.just("weights"), st.one_of(
        _bad_vector(3), st.sampled_from([-np.ones(3), np.zeros(3), [1.0, -1e-300, 1.0]]))),
    st.tuples(st.just("positions"), st.one_of(
        _bad_vector(3), st.sampled_from([[-0.5, 0.0, 1.0], np.full(3, 2.0)]))),
    st.tuples(st.sampled_from(["t", "sinkhorn_tol", "sinkhorn_max_iter"]), _BAD_SCALAR),
    st.tuples(st.just("backend"), st.sampled_from(["nope", NumpyBackend, 3, None, _Opaque()])),
    st.tuples(st.just("att"), st.sampled_from([tp.Attention, {"kind": "softmax"}, None, 3])),
    st.tuples(st.just("query_positions"), st.one_of(
        _bad_vector(3), st.sampled_from([None, [2.0, 0.5, 0.5], [-0.1, 0.0, 1.0]]))))


@given(arg=_BAD_VELOCITY_ARG, kind=st.sampled_from(sorted(KINDS)), masked=st.booleans())
def test_fuzz_velocity_bad_arguments_raise_package_errors(arg, kind, masked):
    masked = masked and KINDS[kind].maskable
    name, value = arg
    att = tp.Attention(kind, I2, I2, I2, masked=masked)
    kw = dict(att=att, X=np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
    if masked:
        kw["positions"] = [0.0, 0.5, 1.0]
    if name == "sinkhorn_max_iter" and (isinstance(value, float) and value.is_integer()
                                        or type(value) is int):
        value = -1          # an integer (10**400 too) or an integral float is an accepted
                            # iteration budget; keep the example bad
    if name == "query_positions" and value is None and not masked:
        value = [0.5] * 4   # None is bad only with masking: use a wrong length instead
    if name == "query_positions":
        kw["queries"] = kw["X"]
    if name == "positions" and not masked:
        name, value = "weights", -np.ones(3)   # positions are ignored without masking
    kw[name] = value
    with pytest.raises(PACKAGE_ERRORS):
        tp.velocity(**kw)


@given(kind=st.sampled_from(sorted(KINDS)), log_scale=st.integers(-5, 160),
       beta=st.sampled_from([1e-3, 1.0, 30.0, 1000.0]), f32=st.booleans(),
       seed=st.integers(0, 2**16))
def test_fuzz_velocity_of_finite_tokens_is_finite_or_raises(kind, log_scale, beta, f32, seed):
    rng = np.random.default_rng(seed)
    if kind == "l2":
        beta = 1.0
    att = tp.Attention(kind, rng.normal(size=(2, 2)), rng.normal(size=(2, 2)),
                       rng.normal(size=(2, 2)), beta=beta, b_Q=rng.normal(size=2),
                       b_K=rng.normal(size=2) * 10.0 ** rng.integers(0, 17))
    X = rng.normal(size=(5, 2)) * 10.0 ** (log_scale if not f32 else min(log_scale, 30))
    if f32:
        X = X.astype(np.float32)
    try:
        out = tp.velocity(att, X, sinkhorn_max_iter=200)
    except (ScoreOverflowError, ArgumentError):
        return
    except SinkhornNotConverged:   # an explicit outcome of the inner solve
        return
    assert out.dtype == X.dtype
    assert np.all(np.isfinite(out))
