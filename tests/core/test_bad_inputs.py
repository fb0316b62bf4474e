"""Property-based bad-input suite over the public entry points.

The rule, for every entry point and every argument: a call either

* raises a clear exception -- a :class:`~transformer_pde.errors.TransformerPDEError`
  subclass, or a ``ValueError`` / ``TypeError`` -- whose message **names the argument**
  that was spoiled, or
* returns a **correct** result, checked against an independent reference computed here
  (dense formulas, POT, NumPy eigenvalues),

never a wrong result and never another exception (``AttributeError``, ``IndexError``,
NumPy's ``ComplexWarning`` about a dropped imaginary part...).

Each test spoils one argument of an otherwise valid call with a value drawn from
:func:`bad_values` (``None``, strings, bools, complex numbers and arrays, NaN, inf,
wrong shapes, ragged lists, huge and subnormal numbers, negative values) or a valid
alternative.  Set ``BAD_INPUTS_TALLY=path.json`` to write the count of every outcome class.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transformer_pde as tp
from transformer_pde import diagnostics as D
from transformer_pde.errors import TransformerPDEError
from transformer_pde.testing import references

TALLY: Counter = Counter()
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _write_tally():
    yield
    path = os.environ.get("BAD_INPUTS_TALLY")
    if path:
        with open(path, "w") as fh:
            json.dump(dict(sorted(TALLY.items())), fh, indent=1)


# ----------------------------------------------------------------------------- values
class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


SCALAR_JUNK = [None, "x", "1.0", True, False, 1j, np.complex128(2.0), [], [1.0, 2.0],
               np.ones(2), {}, _Opaque(), float("nan"), float("inf"), -float("inf"), -1.0,
               0.0, -0.0, 1e308, 5e-324, np.float32(0.5), np.int64(3), 2, 0.25]


def _float_arrays(shape):
    return hnp.arrays(np.float64, shape,
                      elements=st.one_of(st.floats(-1e3, 1e3),
                                         st.sampled_from([np.nan, np.inf, -np.inf, 1e308,
                                                          -1e308, 5e-324, 0.0])))


def bad_values(shape: tuple[int, ...]) -> st.SearchStrategy:
    """Spoilt versions of an array argument of shape ``shape`` (and a few valid ones)."""
    wrong = [s for s in ((), (1,), (shape[0] + 1,) + shape[1:], shape + (1,), (0,) + shape[1:])
             if s != shape]
    return st.one_of(
        st.sampled_from(SCALAR_JUNK),
        st.sampled_from([None, "abc", [["a", "b"]], [[1, 2], [3]], [[None, 1.0]]]),
        _float_arrays(shape),
        st.sampled_from(wrong).flatmap(_float_arrays),
        hnp.arrays(np.complex128, shape, elements=st.complex_numbers(max_magnitude=10,
                                                                      allow_nan=False)),
        hnp.arrays(np.int64, shape, elements=st.integers(-5, 5)),
        hnp.arrays(np.bool_, shape),
        _float_arrays(shape).map(lambda a: a.tolist()),
    )


def outcome(name: str, call, check) -> str:
    """Run ``call()``; classify the outcome and assert the rule (see the module docstring)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tp.errors.TransformerPDEWarning)
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            result = call()
        except (TransformerPDEError, ValueError, TypeError) as exc:
            msg = str(exc)
            assert name in msg, f"error does not name {name!r}: {type(exc).__name__}: {msg}"
            kind = ("error:" + ("package" if isinstance(exc, TransformerPDEError) else "builtin"))
            TALLY[kind] += 1
            return kind
    if any(issubclass(w.category, tp.errors.ConvergenceWarning) for w in caught):
        # a solve stopped short of its tolerance and said so: the result is not checked
        TALLY["result with ConvergenceWarning"] += 1
        return "warned"
    check(result)
    TALLY["correct result"] += 1
    return "correct result"


def _as_real(value, shape=None):
    """The array a correct implementation must have used (or None when it had to refuse)."""
    if value is None or isinstance(value, (str, bytes, dict, _Opaque)):
        return None
    try:
        arr = np.asarray(value)
    except ValueError:
        return None
    if arr.dtype.kind not in "biuf":
        return None
    arr = arr.astype(float)
    if shape is not None and arr.shape != shape:
        return None
    return arr


def _weights_ref(w, n):
    if w is None:
        return np.full(n, 1.0 / n)
    w = _as_real(w, (n,))
    assert w is not None and np.all(np.isfinite(w)) and np.all(w >= 0) and w.max() > 0
    u = w / w.max()
    return u / u.sum()


# ----------------------------------------------------------------------------- velocity
X5 = np.array([[0.3, -0.2], [1.0, 0.5], [-0.7, 0.1], [0.2, 0.9], [-0.4, -0.8]])
ATT = tp.Attention("softmax", np.array([[1.0, 0.2], [0.0, 0.7]]), np.eye(2),
                   np.array([[0.5, -1.0], [0.3, 0.8]]))


def _softmax_field(X, w):
    """The field of ``ATT`` by the reference implementation (weights ``w``)."""
    return references.field("softmax", X, ATT.Q, ATT.K, ATT.V, weights=w)


@SETTINGS
@given(w=bad_values((5,)))
def test_velocity_weights(w):
    def check(out):
        ref = _softmax_field(X5, _weights_ref(w, 5))
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)
    outcome("weights", lambda: tp.velocity(ATT, X5, weights=w), check)


@SETTINGS
@given(X=bad_values((5, 2)))
def test_velocity_tokens(X):
    def check(out):
        Xr = _as_real(X, (5, 2))
        assert Xr is not None and np.all(np.isfinite(Xr))
        ref = _softmax_field(Xr, np.full(5, 0.2))
        np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12 * max(1, np.abs(Xr).max()))
    outcome("X", lambda: tp.velocity(ATT, X), check)


@SETTINGS
@given(t=st.sampled_from(SCALAR_JUNK), which=st.sampled_from(["t", "positions"]))
def test_velocity_scalars(t, which):
    def check(out):
        np.testing.assert_allclose(out, _softmax_field(X5, np.full(5, 0.2)),
                                   rtol=1e-12)
    if which == "t":
        outcome("t", lambda: tp.velocity(ATT, X5, t=t), check)
    else:
        outcome("positions", lambda: tp.velocity(ATT, X5, positions=t), check)


# ----------------------------------------------------------------------------- Attention
@SETTINGS
@given(value=bad_values((2, 2)), name=st.sampled_from(["Q", "K", "V", "W_O"]))
def test_attention_matrices(value, name):
    args = dict(kind="softmax", Q=np.eye(2), K=np.eye(2), V=np.eye(2))
    args[name] = value

    def check(att):
        ref = _as_real(value)
        assert ref is not None and np.all(np.isfinite(ref)), "accepted a non-real matrix"
        P = att.at(0.0)
        got = {"Q": P.heads[0].Q, "K": P.heads[0].K, "V": P.heads[0].V, "W_O": P.W_O}[name]
        np.testing.assert_array_equal(got, ref)
    outcome(name, lambda: tp.Attention(**args), check)


@SETTINGS
@given(value=st.sampled_from(SCALAR_JUNK), name=st.sampled_from(["beta", "eps", "l2_beta"]))
def test_attention_scalars(value, name):
    def check(att):
        v = float(value)
        assert math.isfinite(v) and not isinstance(value, bool)
        assert getattr(att, name) == v
        if name != "beta":
            assert v > 0
    outcome(name, lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2),
                                       **{name: value}), check)


@SETTINGS
@given(values=bad_values((2, 2, 2)), lt=st.sampled_from(SCALAR_JUNK))
def test_layers(values, lt):
    def check_values(layers):
        ref = _as_real(values, (2, 2, 2))
        assert ref is not None and np.all(np.isfinite(ref))
        np.testing.assert_array_equal(layers.values, ref)

    def check_time(layers):
        assert math.isfinite(float(lt)) and float(lt) > 0 and not isinstance(lt, bool)
        assert layers.layer_time == float(lt)
    outcome("values", lambda: tp.Layers(values), check_values)
    outcome("layer_time", lambda: tp.Layers(np.ones((2, 2, 2)), layer_time=lt), check_time)


@SETTINGS
@given(W=bad_values((3, 2)))
def test_mlp_weights(W):
    def check(mlp):
        ref = _as_real(W, (3, 2))
        assert ref is not None and np.all(np.isfinite(ref))
    outcome("W1", lambda: tp.MLP(W, np.ones((2, 3))), check)


# ----------------------------------------------------------------------------- diagnostics
Y4 = np.array([[0.0, 1.0], [2.0, 0.5], [1.0, -1.0], [0.5, 0.5]])


@SETTINGS
@given(value=bad_values((5,)), which=st.sampled_from(["weights_x", "X"]))
def test_wasserstein(value, which):
    import ot

    def check(val):
        if which == "weights_x":
            a, X = _weights_ref(value, 5), X5
        else:
            X = _as_real(value, (5, 2)) if np.ndim(value) == 2 else None
            if X is None:
                X = _as_real(value)
                assert X is not None and X.ndim == 1 and X5.shape[1] == 1
            a = np.full(5, 0.2)
        ref = math.sqrt(max(ot.emd2(a, np.full(4, 0.25), ot.dist(X, Y4)), 0.0))
        assert val == pytest.approx(ref, rel=1e-9, abs=1e-12)
    if which == "weights_x":
        outcome("weights_x", lambda: D.wasserstein(X5, Y4, weights_x=value), check)
    else:
        outcome("X", lambda: D.wasserstein(value, Y4), check)


@SETTINGS
@given(value=st.sampled_from(SCALAR_JUNK),
       name=st.sampled_from(["n_projections", "reg", "rel_reg", "tol", "max_iter", "method"]))
def test_wasserstein_options(value, name):
    kwargs = {name: value}
    if name in ("reg", "rel_reg", "tol", "max_iter"):
        kwargs["method"] = "sinkhorn"
    elif name == "n_projections":
        kwargs["method"] = "sliced"

    def check(val):
        assert math.isfinite(val) and val >= 0
        exact = D.wasserstein(X5, Y4)
        if kwargs.get("method") == "sinkhorn":
            assert val == pytest.approx(exact, rel=0.3)
        elif kwargs.get("method") == "sliced":
            assert val <= exact * 1.5
    outcome(name, lambda: D.wasserstein(X5, Y4, **kwargs), check)


@SETTINGS
@given(S=bad_values((2, 2)), name=st.sampled_from(["S1", "m1"]))
def test_bures_wasserstein(S, name):
    import scipy.linalg

    S2, m2 = np.array([[2.0, 0.3], [0.3, 1.0]]), np.array([1.0, -1.0])

    def check(val):
        if name == "S1":
            A, m1 = _as_real(S, (2, 2)), np.zeros(2)
        else:
            A, m1 = np.eye(2), _as_real(S, (2,))
        assert A is not None and m1 is not None and np.all(np.isfinite(A))
        assert np.allclose(A, A.T) and np.linalg.eigvalsh(A)[0] >= -1e-9 * np.abs(A).sum()
        A = np.clip(0.5 * (A + A.T), -1e300, 1e300)
        rA = np.real(scipy.linalg.sqrtm(A))
        cross = np.real(scipy.linalg.sqrtm(rA @ S2 @ rA))
        ref2 = np.sum((m1 - m2) ** 2) + np.trace(A) + np.trace(S2) - 2 * np.trace(cross)
        assert val == pytest.approx(math.sqrt(max(ref2, 0)), rel=1e-6, abs=1e-6)
    if name == "S1":
        outcome("S1", lambda: D.bures_wasserstein([0, 0], S, m2, S2), check)
    else:
        outcome("m1", lambda: D.bures_wasserstein(S, np.eye(2), m2, S2), check)


@SETTINGS
@given(S=bad_values((3, 3)), rtol=st.sampled_from(SCALAR_JUNK))
def test_numerical_rank(S, rtol):
    def check_s(r):
        A = _as_real(S, (3, 3))
        assert A is not None and np.all(np.isfinite(A)) and np.allclose(A, A.T, rtol=0,
                                                                          atol=1e-12 * np.abs(A).max())
        lam = np.linalg.eigvalsh(0.5 * (A + A.T))
        assert lam[0] >= -1e-6 * max(np.abs(lam).sum(), 1e-300), "indefinite matrix accepted"
        lam = np.clip(lam, 0, None)
        assert r == (0 if lam[-1] <= 0 else int(np.sum(lam > 1e-6 * lam[-1])))

    def check_rtol(r):
        v = float(rtol)
        assert 0 <= v < 1 and not isinstance(rtol, bool)
        assert r == int(1.0 > v) + int(0.5 > v)
    outcome("S", lambda: D.numerical_rank(S), check_s)
    outcome("rtol", lambda: D.numerical_rank(np.diag([1.0, 0.5, 0.0]), rtol), check_rtol)


@SETTINGS
@given(X=bad_values((6, 2)), tol=st.sampled_from(SCALAR_JUNK + [None]))
def test_clusters(X, tol):
    def check_x(res):
        A = _as_real(X)
        assert A is not None and np.all(np.isfinite(A)) and A.shape[0] >= 1
        assert res.labels.shape == (A.shape[0],) and res.masses.sum() == pytest.approx(1.0)

    def check_tol(res):
        assert tol is None or (math.isfinite(float(tol)) and float(tol) > 0)
        assert res.n_clusters >= 1
    outcome("X", lambda: D.clusters(X), check_x)
    Z = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [0.0, 0.1], [5.0, 5.1]])
    outcome("tol", lambda: D.clusters(Z, tol=tol), check_tol)


# ----------------------------------------------------------------------------- gaussian
@SETTINGS
@given(value=bad_values((2, 2)), name=st.sampled_from(["cov", "mean"]))
def test_gaussian_affine_field(value, name):
    from transformer_pde import gaussian

    args = {"mean": np.zeros(2), "cov": np.eye(2)}
    args[name] = value if name == "cov" else (value[0] if isinstance(value, np.ndarray)
                                              and value.ndim == 2 else value)

    def check(res):
        M, b = res
        m = _as_real(args["mean"], (2,))
        C = _as_real(args["cov"], (2, 2))
        assert m is not None and C is not None and np.all(np.isfinite(m)) and np.all(np.isfinite(C))
        assert np.allclose(C, C.T, rtol=0, atol=1e-12 * np.abs(C).max())
        assert np.linalg.eigvalsh(C)[0] >= -1e-12 * max(np.abs(C).sum(), 1e-300)
        # softmax, V = A = I: M = V S A = S, b = V m
        np.testing.assert_allclose(M, 0.5 * (C + C.T), rtol=1e-12)
        np.testing.assert_allclose(b, m, rtol=1e-12)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    outcome(name, lambda: gaussian.affine_field(att, args["mean"], args["cov"]), check)


# ----------------------------------------------------------------------------- sinkhorn
@SETTINGS
@given(value=st.sampled_from(SCALAR_JUNK), name=st.sampled_from(["eps", "beta", "tol"]))
def test_sinkhorn_coupling_scalars(value, name):
    def check(res):
        pi, info = res
        v = float(value)
        assert math.isfinite(v) and not isinstance(value, bool)
        if name in ("eps", "tol"):
            assert v > 0
        # doubly stochastic to the tolerance used: log-marginal errors below info.tol
        for axis in (0, 1):
            err = np.max(np.abs(np.log(pi.sum(axis=axis) / 0.2)))
            assert err <= info.tol * (1 + 1e-6) + 1e-12 or (info.tol > 1 and np.isfinite(err))
    kwargs = {name: value}
    outcome(name, lambda: tp.sinkhorn_coupling(X5, np.eye(2), **kwargs), check)
