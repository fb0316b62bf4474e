r"""Argument validators of transformer-pde: one rule per kind of input.

Every public entry point checks its arguments with these functions, so that a bad
argument gets the same clear error wherever it is passed: an
:class:`~transformer_pde.errors.ArgumentTypeError` (a ``TypeError``) when it has the
wrong type (``None``, a string, a complex or non-numeric array, a bool where a number is
expected) and an :class:`~transformer_pde.errors.ArgumentError` (a ``ValueError``) when
its value is invalid (shape, NaN or inf, sign, range).  Every message names the argument.

The rules
---------
* **Real arrays.**  Complex input is rejected everywhere (NumPy would silently keep the
  real part); so are strings, ``None``, objects and ragged nested lists.  Booleans and
  integers are accepted as numbers and converted to ``float64``.
* **Weights** (:func:`weights`) are finite, non-negative, with a positive sum, and are
  normalised to sum one.  The normalisation is safe when the sum overflows or is
  subnormal: the weights are first divided by their maximum, so
  ``np.full(5, 1e308)`` gives the uniform measure, not zeros.
* **Covariances** (:func:`covariance`): square, finite, symmetric and positive
  semi-definite up to round-off, with the stated tolerances

  .. math:: \max_{ij} |S_{ij} - S_{ji}| \le \mathtt{SYMMETRY\_RTOL}\,\max_{ij}|S_{ij}|,
            \qquad \lambda_{\min}\big(\tfrac12(S + S^\top)\big) \ge
            -\mathtt{PSD\_RTOL} \sum_i |\lambda_i| ,

  with both tolerances :math:`10^{-12}` (round-off of a covariance computed in double
  precision is about :math:`d\,\epsilon_{mach}` relative, below :math:`10^{-13}` for
  :math:`d \le 500`).  The symmetric part is returned.  The same rule serves
  :func:`transformer_pde.gaussian.solve`, :func:`transformer_pde.diagnostics.bures_wasserstein`,
  the rank functions of :mod:`transformer_pde.diagnostics` and the CLI's token covariance.

This module imports nothing from the package but :mod:`transformer_pde.errors`, so every
other module may import it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import ArgumentError, ArgumentTypeError

__all__ = [
    "PSD_RTOL",
    "SYMMETRY_RTOL",
    "choice",
    "covariance",
    "finite_array",
    "integer",
    "matrix",
    "nonnegative",
    "normalize_weights",
    "points",
    "positions",
    "positive",
    "real_array",
    "scalar",
    "type_name",
    "vector",
    "weights",
]

#: Relative asymmetry :math:`\max|S - S^\top| / \max|S|` accepted in a covariance.
SYMMETRY_RTOL = 1e-12
#: Negative eigenvalues of a covariance accepted down to ``-PSD_RTOL * sum(|eigenvalues|)``.
PSD_RTOL = 1e-12


def type_name(value: Any) -> str:
    """How a wrong argument is named in messages: its type's name, or, for a class passed
    where an instance is expected, ``"the class X (pass an instance, X(...))"``."""
    if isinstance(value, type):
        return f"the class {value.__name__} (pass an instance, {value.__name__}(...))"
    return type(value).__name__


def _where(t: float | None) -> str:
    return "" if t is None else f" (evaluated at t={t})"


# ------------------------------------------------------------------ arrays
def real_array(name: str, value: Any, *, keep_float32: bool = False,
               what: str = "array") -> np.ndarray:
    """``value`` as a real floating NumPy array, or a clear error naming ``name``.

    ``None``, strings, complex numbers and non-numeric or ragged data raise
    :class:`ArgumentTypeError`.  Integers and booleans become ``float64``; with
    ``keep_float32`` a ``float32`` array keeps its dtype, every other input becomes
    ``float64``.  Arrays of other libraries (CuPy) must be converted by the caller.
    ``what`` names the expected object in messages (``"matrix"``, ...).
    """
    if value is None:
        raise ArgumentTypeError(f"{name} must be a real {what}, got None")
    if isinstance(value, (str, bytes)):
        raise ArgumentTypeError(f"{name} must be a real {what}, got the string {value!r:.60}")
    if isinstance(value, type):
        raise ArgumentTypeError(f"{name} must be a real {what}, got the class "
                                f"{value.__name__}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested sequences
        raise ArgumentTypeError(f"{name} must be a real {what}: {exc}") from None
    kind = arr.dtype.kind
    if kind == "c":
        raise ArgumentTypeError(f"{name} must be real, got a complex array (dtype {arr.dtype}); "
                                "pass its real part explicitly if that is what you mean")
    if kind == "O":
        for item in arr.flat:
            if isinstance(item, (complex, np.complexfloating)):
                raise ArgumentTypeError(f"{name} must be real, got a complex entry {item!r}")
            if not isinstance(item, (numbers.Real, np.number, np.bool_)) or \
                    isinstance(item, np.complexfloating):
                raise ArgumentTypeError(f"{name} must be a real {what}, got an entry of type "
                                        f"{type(item).__name__}")
    elif kind not in "biuf":
        raise ArgumentTypeError(f"{name} must be a real {what}, got dtype {arr.dtype}")
    if keep_float32 and arr.dtype == np.float32:
        return arr
    if arr.dtype == np.float64:
        return arr
    try:
        return arr.astype(np.float64)
    except OverflowError:  # Python integers beyond the float range (object arrays)
        raise ArgumentError(f"{name} has an entry beyond the float64 range") from None


def finite_array(name: str, value: Any, *, keep_float32: bool = False,
                 where: str = "") -> np.ndarray:
    """:func:`real_array` whose entries are all finite (NaN or inf raise ``ArgumentError``)."""
    arr = real_array(name, value, keep_float32=keep_float32)
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{name}{where} contains NaN or inf")
    return arr


def matrix(name: str, value: Any, t: float | None = None) -> np.ndarray:
    """A finite, non-empty real 2-D ``float64`` matrix (``t``: time a callable was evaluated
    at, quoted in messages)."""
    where = _where(t)
    arr = real_array(f"{name}{where}", value, what="matrix")
    if arr.ndim != 2:
        raise ArgumentError(f"{name}{where} must be a 2-D matrix, got shape {arr.shape}")
    if arr.size == 0:
        raise ArgumentError(f"{name}{where} must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{name}{where} contains NaN or inf")
    return arr


def vector(name: str, value: Any, n: int | None = None) -> np.ndarray:
    """A finite real 1-D ``float64`` vector (of length ``n`` when given)."""
    arr = finite_array(name, value)
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        want = f"({n},)" if n is not None else "(n,)"
        raise ArgumentError(f"{name} must have shape {want}, got {arr.shape}")
    return arr


def points(name: str, value: Any, d: int | None = None, *, column: bool = False,
           keep_float32: bool = True, d_from: str | None = None) -> np.ndarray:
    """Token coordinates: a finite real array of shape ``(N, d)`` with ``N >= 1``.

    ``float32`` input keeps its dtype (``keep_float32``), everything else becomes
    ``float64``.  With ``column``, a 1-D array is read as ``N`` points in one dimension.
    ``d_from`` names the argument ``d`` comes from (quoted in the message).
    """
    arr = real_array(name, value, keep_float32=keep_float32)
    if column and arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or (d is not None and arr.shape[1] != d):
        want = f"(N, d) with d={d}" if d is not None else "(N, d)"
        if d_from is not None:
            want += f" (the dimension of {d_from})"
        raise ArgumentError(f"{name} must have shape {want}, got {arr.shape}")
    if arr.shape[0] == 0:
        raise ArgumentError(f"{name} must contain at least one point, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{name} contains NaN or inf")
    return arr


def normalize_weights(w: np.ndarray) -> np.ndarray:
    """``w / w.sum()`` for finite non-negative ``w`` with a positive maximum, safe when the
    sum overflows or is subnormal (then ``w`` is divided by its maximum first)."""
    with np.errstate(over="ignore"):
        s = w.sum()
    if np.isfinite(s) and s >= 1e-290:
        return w / s
    u = w / w.max()
    return u / u.sum()


def weights(name: str, value: Any, n: int) -> np.ndarray:
    """Token masses: ``None`` gives the uniform ``1/n``; otherwise a finite, non-negative
    real vector of shape ``(n,)`` with a positive sum, normalised to sum one
    (:func:`normalize_weights`)."""
    if value is None:
        return np.full(n, 1.0 / n)
    w = real_array(name, value)
    if w.shape != (n,):
        raise ArgumentError(f"{name} must have shape (N,) = ({n},), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ArgumentError(f"{name} contain NaN or inf")
    if np.any(w < 0):
        raise ArgumentError(f"{name} must be >= 0")
    if not w.max(initial=0.0) > 0:
        raise ArgumentError(f"{name} must have a positive sum")
    return normalize_weights(w)


def positions(name: str, value: Any, n: int, *, required: bool = False) -> np.ndarray | None:
    """Token positions in ``[0, 1]``, shape ``(n,)``; ``None`` is allowed unless
    ``required`` (masked attention)."""
    if value is None:
        if required:
            raise ArgumentError(
                f"masked attention needs {name}: an array of N token positions in [0, 1]")
        return None
    p = real_array(name, value)
    if p.shape != (n,):
        raise ArgumentError(f"{name} must have shape (N,) = ({n},), got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ArgumentError(f"{name} contain NaN or inf")
    if np.any(p < 0) or np.any(p > 1):
        raise ArgumentError(f"{name} must lie in [0, 1]")
    return p


def covariance(name: str, value: Any, d: int | None = None, *, batch: bool = False,
               psd_rtol: float = PSD_RTOL, psd_atol: float = 0.0) -> np.ndarray:
    r"""A symmetric positive semi-definite ``(d, d)`` matrix (``(B, d, d)`` with ``batch``).

    The rule (see the module docstring): finite; :math:`\max|S - S^\top| \le`
    :data:`SYMMETRY_RTOL` :math:`\max|S|`; smallest eigenvalue of the symmetric part
    :math:`\ge -`:data:`PSD_RTOL` :math:`\sum|\lambda|`.  Returns the symmetric part
    :math:`(S + S^\top)/2` (``float64``).  Messages name ``name`` (and the batch member).

    ``psd_rtol`` (and an absolute ``psd_atol``: the bound is
    :math:`-\max(\mathtt{psd\_rtol}\sum|\lambda|, \mathtt{psd\_atol})`) loosen the
    eigenvalue test for matrices that are themselves results of a computation known only
    to that accuracy (the rank diagnostics pass their own resolution).
    """
    c = finite_array(name, value)
    if batch:
        if c.ndim != 3 or c.shape[1] != c.shape[2] or (d is not None and c.shape[1] != d):
            want = f"(B, {d}, {d})" if d is not None else "(B, d, d)"
            raise ArgumentError(f"{name} must have shape {want}, got {c.shape}")
        cc = c
    else:
        if c.ndim != 2 or c.shape[0] != c.shape[1] or c.size == 0 or \
                (d is not None and c.shape[0] != d):
            want = f"({d}, {d})" if d is not None else "square (d, d)"
            raise ArgumentError(f"{name} must have shape {want}, got {c.shape}")
        cc = c[None]
    if cc.shape[0] == 0 or cc.shape[1] == 0:
        return 0.5 * (c + np.swapaxes(c, -1, -2))
    scale = np.maximum(np.abs(cc).max(axis=(1, 2)), 1e-300)
    asym = np.abs(cc - np.swapaxes(cc, 1, 2)).max(axis=(1, 2))
    bad = np.nonzero(asym > SYMMETRY_RTOL * scale)[0]

    def member(i: int) -> str:
        return f" (member {i})" if batch else ""

    if bad.size:
        i = int(bad[0])
        raise ArgumentError(f"{name} must be symmetric{member(i)}: max |C - C^T| = "
                            f"{asym[i]:.3g} > {SYMMETRY_RTOL:g} max |C|")
    sym = 0.5 * (cc + np.swapaxes(cc, 1, 2))
    try:  # eigenvalues of the matrix scaled to max |entry| = 1 (no overflow), scaled back
        lam = np.linalg.eigvalsh(sym / scale[:, None, None]) * scale[:, None]
    except np.linalg.LinAlgError as exc:
        raise ArgumentError(f"{name}: eigenvalues could not be computed ({exc})") from None
    tr = np.maximum(np.abs(lam).sum(axis=1), 1e-300)
    floor = np.maximum(psd_rtol * tr, psd_atol)
    bad = np.nonzero(lam[:, 0] < -floor)[0]
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(f"{name} must be positive semi-definite{member(i)}: smallest "
                            f"eigenvalue {lam[i, 0]:.3g} < -{floor[i]:.3g} (= -{psd_rtol:g} "
                            "sum |eigenvalues|)")
    return sym if batch else sym[0]


# ------------------------------------------------------------------ scalars
def scalar(name: str, value: Any, *, finite: bool = True) -> float:
    """A real number as ``float``: ``None``, strings, bools, complex numbers and arrays of
    more than one element raise :class:`ArgumentTypeError`; NaN or inf raise
    :class:`ArgumentError` unless ``finite=False``."""
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a real number, got {value!r:.60}")
    if isinstance(value, (complex, np.complexfloating)):
        raise ArgumentTypeError(f"{name} must be a real number, got the complex {value!r}")
    if isinstance(value, np.ndarray):
        if value.ndim != 0 or value.dtype.kind not in "iuf":
            raise ArgumentTypeError(f"{name} must be a real number, got an array of shape "
                                    f"{value.shape} and dtype {value.dtype}")
        value = value[()]
    if not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # a Python integer beyond the float range
        raise ArgumentError(f"{name} must be finite, got an integer beyond the float64 "
                            "range") from None
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name} must be a real number, got {value!r:.60}") from None
    if finite and not math.isfinite(v):
        raise ArgumentError(f"{name} must be finite, got {value!r}")
    return v


def positive(name: str, value: Any) -> float:
    """A finite real number ``> 0``."""
    v = scalar(name, value)
    if not v > 0:
        raise ArgumentError(f"{name} must be > 0, got {value!r}")
    return v


def nonnegative(name: str, value: Any) -> float:
    """A finite real number ``>= 0``."""
    v = scalar(name, value)
    if not v >= 0:
        raise ArgumentError(f"{name} must be >= 0, got {value!r}")
    return v


def integer(name: str, value: Any, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An integer (``int``, NumPy integer, or a float with an integral value such as
    ``1e6``); bools, ``None``, strings raise :class:`ArgumentTypeError`, non-integral
    numbers and values outside ``[minimum, maximum]`` raise :class:`ArgumentError`."""
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be an integer, got {value!r:.60}")
    if isinstance(value, (numbers.Integral, np.integer)):
        v = int(value)
    elif isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, bool):
        f = float(value)
        if not (math.isfinite(f) and f == int(f)):
            raise ArgumentError(f"{name} must be an integer, got {value!r}")
        v = int(f)
    else:
        raise ArgumentTypeError(f"{name} must be an integer, got {type(value).__name__}")
    if minimum is not None and v < minimum:
        raise ArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and v > maximum:
        raise ArgumentError(f"{name} must be an integer <= {maximum}, got {value!r}")
    return v


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of the strings ``options`` (``None`` and non-strings raise
    :class:`ArgumentTypeError`, other strings :class:`ArgumentError`)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be one of {list(options)}, got {value!r:.60}")
    if value not in options:
        raise ArgumentError(f"{name} must be one of {list(options)}, got {value!r}")
    return value
