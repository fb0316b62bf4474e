"""The argument validators (transformer_pde.validation) and their rules."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde import validation as v
from transformer_pde.errors import ArgumentError, ArgumentTypeError, TransformerPDEError


@pytest.mark.parametrize("bad", [None, "abc", b"x", [1, "a"], [[1, 2], [3]], np.array([1j]),
                                 [1 + 2j, 3], np.array(["1.0"]), {"a": 1}, [None, 1.0]])
def test_real_array_rejects_non_real_input_naming_it(bad):
    with pytest.raises(ArgumentTypeError, match="^Xq must be"):
        v.real_array("Xq", bad)


def test_real_array_converts_numbers_and_keeps_float32_on_request():
    assert v.real_array("a", [1, 2]).dtype == np.float64
    assert v.real_array("a", [True, False]).tolist() == [1.0, 0.0]
    x32 = np.ones(3, np.float32)
    assert v.real_array("a", x32).dtype == np.float64
    assert v.real_array("a", x32, keep_float32=True) is x32
    x64 = np.ones(3)
    assert v.real_array("a", x64) is x64  # no copy


def test_errors_are_package_errors_and_builtins():
    with pytest.raises(TransformerPDEError):
        v.positive("dt", -1.0)
    with pytest.raises(ValueError):
        v.positive("dt", -1.0)
    with pytest.raises(TypeError):
        v.positive("dt", None)


@pytest.mark.parametrize("value, exc", [(None, ArgumentTypeError), ("1.0", ArgumentTypeError),
                                        (True, ArgumentTypeError), (1j, ArgumentTypeError),
                                        (np.complex128(1), ArgumentTypeError),
                                        (np.ones(2), ArgumentTypeError),
                                        (float("nan"), ArgumentError),
                                        (float("inf"), ArgumentError),
                                        (0.0, ArgumentError), (-2, ArgumentError)])
def test_positive(value, exc):
    with pytest.raises(exc, match="^tol "):
        v.positive("tol", value)


def test_scalars_accept_numpy_and_python_numbers():
    assert v.scalar("t", np.float32(0.5)) == 0.5
    assert v.scalar("t", np.array(2.0)) == 2.0
    assert v.scalar("t", 3) == 3.0
    assert v.positive("t", np.int64(4)) == 4.0
    assert v.nonnegative("t", 0) == 0.0
    assert v.scalar("t", float("inf"), finite=False) == float("inf")


def test_integer():
    assert v.integer("n", 3) == 3
    assert v.integer("n", np.int32(3)) == 3
    assert v.integer("n", 1e6) == 1_000_000
    for bad, exc in ((None, ArgumentTypeError), (True, ArgumentTypeError), ("3", ArgumentTypeError),
                     (2.5, ArgumentError), (float("inf"), ArgumentError)):
        with pytest.raises(exc, match="^max_steps must be an integer"):
            v.integer("max_steps", bad)
    with pytest.raises(ArgumentError, match=">= 1"):
        v.integer("max_steps", 0, minimum=1)


def test_choice():
    assert v.choice("method", "rk4", ("euler", "rk4")) == "rk4"
    with pytest.raises(ArgumentTypeError, match="method must be one of"):
        v.choice("method", None, ("euler", "rk4"))
    with pytest.raises(ArgumentError, match="method must be one of"):
        v.choice("method", "rk5", ("euler", "rk4"))


def test_weights_normalise_safely():
    # a sum that overflows must still give the right measure
    # (each weight is a quotient of a few exact sums: one or two roundings, rtol 1e-15)
    w = v.weights("weights", np.full(5, 1e308), 5)
    np.testing.assert_allclose(w, np.full(5, 0.2), rtol=1e-15, atol=0)
    w = v.weights("weights", [1e308, 1e308, 0.0, 2e307], 4)
    np.testing.assert_allclose(w, np.array([10, 10, 0, 2]) / 22, rtol=1e-15, atol=0)
    # subnormal sums too
    w = v.weights("weights", np.full(4, 5e-324), 4)
    np.testing.assert_allclose(w, np.full(4, 0.25), rtol=1e-15, atol=0)
    # ordinary weights: w / sum(w)
    x = np.array([0.3, 1.7, 2.0])
    np.testing.assert_allclose(v.weights("weights", x, 3), x / x.sum(), rtol=1e-15, atol=0)
    np.testing.assert_allclose(v.weights("weights", None, 4), np.full(4, 0.25), rtol=1e-15,
                               atol=0)


@pytest.mark.parametrize("bad, exc, msg", [
    (np.ones(3), ArgumentError, r"shape \(N,\) = \(4,\)"),
    ([1, 1, 1, np.nan], ArgumentError, "NaN"),
    ([1, -1, 1, 1], ArgumentError, ">= 0"),
    (np.zeros(4), ArgumentError, "positive sum"),
    (np.ones(4) + 0j, ArgumentTypeError, "real"),
    ("abcd", ArgumentTypeError, "real"),
])
def test_weights_reject(bad, exc, msg):
    with pytest.raises(exc, match="weights_x.*" + msg):
        v.weights("weights_x", bad, 4)


def test_points_and_matrix():
    X = v.points("X", [[1, 2], [3, 4]], 2)
    assert X.dtype == np.float64
    assert v.points("X", np.ones((2, 2), np.float32), 2).dtype == np.float32
    assert v.points("X", [1.0, 2.0], column=True).shape == (2, 1)
    for bad, msg in ((np.ones((2, 3)), "d=2"), (np.ones((0, 2)), "at least one point"),
                     ([[np.inf, 0]], "NaN or inf"), (np.ones(2), "shape")):
        with pytest.raises(ArgumentError, match="X0 .*" + msg):
            v.points("X0", bad, 2)
    with pytest.raises(ArgumentTypeError, match=r"Q \(evaluated at t=0.5\) must be real"):
        v.matrix("Q", np.eye(2) * 1j, 0.5)
    with pytest.raises(ArgumentError, match="Q must be a 2-D matrix"):
        v.matrix("Q", np.ones(3))


def test_positions():
    assert v.positions("positions", None, 3) is None
    with pytest.raises(ArgumentError, match="masked attention needs positions"):
        v.positions("positions", None, 3, required=True)
    with pytest.raises(ArgumentError, match=r"must lie in \[0, 1\]"):
        v.positions("positions", [0, 0.5, 1.5], 3)
    with pytest.raises(ArgumentTypeError, match="positions must be real"):
        v.positions("positions", [0, 0.5, 1j], 3)


def test_covariance_one_rule():
    S = np.array([[2.0, 1.0], [1.0, 2.0]])
    assert np.array_equal(v.covariance("cov", S), S)
    # round-off asymmetry and negative round-off eigenvalues are accepted and symmetrised
    T = S + np.array([[0, 1e-13], [0, 0]])
    out = v.covariance("cov", T)
    assert np.array_equal(out, out.T)
    P = np.array([[1.0, 1.0], [1.0, 1.0]]) + np.diag([-1e-14, 0])
    v.covariance("cov", P)
    with pytest.raises(ArgumentError, match="cov must be symmetric"):
        v.covariance("cov", [[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(ArgumentError, match="cov must be positive semi-definite"):
        v.covariance("cov", np.diag([1.0, -1e-6]))
    with pytest.raises(ArgumentError, match=r"cov must have shape \(3, 3\)"):
        v.covariance("cov", np.eye(2), 3)
    with pytest.raises(ArgumentError, match=r"covs0 must be positive semi-definite \(member 1\)"):
        v.covariance("covs0", np.stack([np.eye(2), -np.eye(2)]), 2, batch=True)
    with pytest.raises(ArgumentTypeError, match="cov must be real"):
        v.covariance("cov", np.eye(2) + 0j)
    assert v.covariance("cov", np.zeros((2, 2))).tolist() == [[0, 0], [0, 0]]


def test_validation_imports_nothing_from_the_package_but_errors():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(v))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.module == "errors", node.module
