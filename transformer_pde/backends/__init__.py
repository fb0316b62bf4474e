r"""Backends: the three reduction primitives every attention kind is built from.

A backend evaluates, for projected queries ``q`` (M, r), keys ``k`` (N, r), values
``v`` (N, c), a per-key bias ``bias`` (N,) and per-query key ranges ``ranges``
(a :class:`~transformer_pde.backends.ranges.KeyRanges`: query :math:`i` sees the keys
:math:`\mathrm{lo}_i \le j < \mathrm{hi}_i` in the order given; ``None`` = all keys):

``softmax(q, k, v, bias, ranges) -> (out, lse)``
    :math:`\ell_{ij} = q_i\cdot k_j + b_j`,
    :math:`\mathrm{lse}_i = \log\sum_{j=\mathrm{lo}_i}^{\mathrm{hi}_i-1} e^{\ell_{ij}}`,
    :math:`\mathrm{out}_i = \sum_{j=\mathrm{lo}_i}^{\mathrm{hi}_i-1} e^{\ell_{ij}-\mathrm{lse}_i} v_j`
    (a query with no visible mass gets ``out = 0`` and ``lse = -inf``).
``lse(q, k, bias, ranges) -> lse``
    the log-normaliser alone (Sinkhorn potential updates).
``pointwise(phi, q, k, v, w, ranges) -> out``
    :math:`\mathrm{out}_i = \sum_{j=\mathrm{lo}_i}^{\mathrm{hi}_i-1} w_j \varphi(q_i\cdot k_j) v_j` for
    ``phi`` in ``{"identity", "sigmoid", "relu"}``.

Backends also expose ``asarray(a, dtype)``, ``to_numpy(a)`` and an array namespace ``xp``
so that the state can live on the backend's device.  :func:`get_backend` is the single
dispatch point; ``"auto"`` (:data:`DEFAULT_BACKEND`, the default of every entry point)
picks the fastest installed backend for a problem size, and never waits for a
compilation: while the Numba kernels are not compiled yet it answers with NumPy and
compiles them in the background (:func:`compile_kernels`).

The array namespace.  Code outside a backend works on backend arrays with operators,
array methods and the functions of :data:`XP_FUNCTIONS` of the namespace, which it gets
from the backend (``be.xp``) or from an array (:func:`array_namespace`; :func:`to_host`
brings an array to NumPy); nothing else tells a device array from a host one.  NumPy and
CuPy both provide every name of :data:`XP_FUNCTIONS` with NumPy's meaning (a project test
scans the package for the names it calls).

Optional methods.  A backend *may* also provide faster fused forms of what callers can
build from the primitives; callers detect one with ``getattr(be, name, None)`` and
otherwise use the primitives, so a backend without it stays complete:

``sinkhorn_sweep(q, k, v, bias, w) -> (out, lse, col)``
    one alternating Sinkhorn iteration in one pass over the pairs: with the row softmax
    :math:`P_{ij} = e^{\ell_{ij} - \mathrm{lse}_i}` of the logits
    :math:`\ell_{ij} = q_i\cdot k_j + b_j` (``bias`` finite, no mask), ``lse`` and
    ``out`` as for ``softmax`` (``out`` (M, 0) when ``v`` is ``None``) and the column sums
    :math:`\mathrm{col}_j = \sum_i w_i P_{ij}` (float64) of the plan, from which the
    column potential follows as :math:`g'_j = g_j - \varepsilon\log(\mathrm{col}_j/w_j)`.
    Provided by the Numba backend
    (:meth:`transformer_pde.backends.numba.NumbaBackend.sinkhorn_sweep`, which states the
    contract); the Sinkhorn solver uses it where present.
"""

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, BackendNotAvailable
from . import compile_notice

__all__ = ["Backend", "BackendNotAvailable", "array_namespace", "available_backends",
           "compile_kernels", "get_backend", "kernels_ready", "register_backend", "to_host",
           "AUTO_COMPILE_ENV", "BACKENDS", "DEFAULT_BACKEND", "XP_FUNCTIONS"]

#: the backend of every entry point that takes ``backend=`` (library and command line):
#: the fastest installed backend for the run's number of tokens
DEFAULT_BACKEND = "auto"

#: the names of an array namespace (``numpy``, ``cupy``) the package calls on backend
#: arrays outside the backends: constructors, element-wise functions, reductions, dtypes
XP_FUNCTIONS: frozenset[str] = frozenset({
    "asarray", "zeros", "ones", "full", "empty", "stack", "concatenate",   # constructors
    "abs", "sqrt", "exp", "log", "floor", "ldexp", "maximum", "minimum", "where",
    "isfinite", "isnan", "isneginf", "isposinf",                          # element-wise
    "max", "sum", "mean", "all", "einsum",                                # reductions
    "float32", "float64", "int32", "int64", "nan", "inf",                 # dtypes, values
})


class Backend(Protocol):
    """Interface implemented by every backend (see the module docstring).

    The optional methods (``sinkhorn_sweep``) are not part of the protocol: callers
    look them up with ``getattr(be, "sinkhorn_sweep", None)``.
    """

    name: str
    xp: Any

    def asarray(self, a: Any, dtype: Any = None) -> Any: ...

    def to_numpy(self, a: Any) -> Any: ...

    def softmax(self, q, k, v, bias, ranges) -> tuple[Any, Any]: ...

    def lse(self, q, k, bias, ranges) -> Any: ...

    def pointwise(self, phi: str, q, k, v, w, ranges) -> Any: ...


def array_namespace(a: Any) -> Any:
    """The array namespace (``numpy`` or ``cupy``) of a backend array ``a``: the one place
    the package tells a device array from a host one.

    NumPy arrays, NumPy scalars and Python numbers give ``numpy``; CuPy arrays give the
    ``cupy`` module (imported only when such an array exists).  Callers use its
    :data:`XP_FUNCTIONS` (``xp.asarray``, ``xp.where``, ``xp.max``, ...), operators and
    array methods, so one code path serves host and device arrays.
    """
    if type(a).__module__.split(".")[0] == "cupy":
        # deferred: CuPy is optional and only reached when a CuPy array already exists
        import cupy  # noqa: PLC0415
        return cupy
    return np


def to_host(a: Any) -> Any:
    """``a`` as a NumPy array on the host (a copy from the device for a CuPy array; NumPy
    input is returned as ``numpy.asarray(a)``, without a copy)."""
    xp = array_namespace(a)
    return np.asarray(a) if xp is np else xp.asnumpy(a)


# name -> "module:factory"; factories are imported lazily so optional libraries are
# only needed when their backend is requested.
BACKENDS: dict[str, str] = {
    "numpy": "transformer_pde.backends.numpy_backend:NumpyBackend",
    "numba": "transformer_pde.backends.numba:NumbaBackend",
    "cupy": "transformer_pde.backends.cupy_backend:CupyBackend",
}

_cache: dict[str, Any] = {}


def register_backend(name: str, target: str) -> None:
    """Register a backend factory given as ``"module:callable"``."""
    BACKENDS[name] = target
    _cache.pop(name, None)


def _load(name: str) -> Any:
    if name in _cache:
        return _cache[name]
    target = BACKENDS[name]
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
        factory = getattr(mod, attr)
        be = factory()
    except BackendNotAvailable:
        raise
    except ImportError as exc:
        raise BackendNotAvailable(
            f"backend={name!r} is not available: {exc}. Install the optional dependency "
            f"(for cupy: pip install 'transformer-pde[gpu-cuda12]' or '[gpu-cuda13]')") from exc
    _cache[name] = be
    return be


def available_backends() -> list[str]:
    """Names of the backends that can be loaded on this machine."""
    out = []
    for name in BACKENDS:
        try:
            _load(name)
        except BackendNotAvailable:
            continue
        out.append(name)
    return out


def get_backend(name: Any = DEFAULT_BACKEND, *, n_tokens: int | None = None) -> Any:
    """Return the backend called ``name`` (or pass through a backend object).

    Parameters
    ----------
    name : str or backend object, default :data:`DEFAULT_BACKEND` (``"auto"``)
        ``"numpy"`` (reference), ``"numba"`` (parallel CPU), ``"cupy"`` (GPU) or ``"auto"``
        (the first of CuPy, Numba that loads and pays off at ``n_tokens``, else NumPy).
    n_tokens : int, optional
        Problem size used by ``"auto"`` (none: NumPy).

    Notes
    -----
    ``"auto"`` never blocks on a compilation.  When it would pick Numba but the Numba
    kernels (:func:`compile_kernels`: softmax, pointwise and Sinkhorn-sweep kernels,
    streaming and tiled, float64 and float32) are neither compiled in this process nor in
    Numba's disk cache, it returns the NumPy reference and starts compiling them on one
    background thread (a daemon; its progress is the compile notice of
    :mod:`~transformer_pde.backends.compile_notice`, at ``INFO``; a failure there is
    logged, never raised).  Calls made once they are ready get Numba.  A run resolves its
    backend once, so it never switches mid-way; a later run does.  Both answers agree to
    the accuracy of the Numba kernels (about 1e-13 relative in float64, 1e-5 in
    float32).  With the environment variable :data:`AUTO_COMPILE_ENV` set to
    ``foreground``, ``"auto"`` compiles in the caller's thread instead (the behaviour of
    an explicit ``"numba"``, which always does); ``transformer-pde warmup`` compiles
    everything ahead of time.

    Raises
    ------
    ArgumentError
        Unknown backend name.
    ArgumentTypeError
        Neither a name nor a backend object (a backend class instead of an instance).
    BackendNotAvailable
        The backend's library or device is missing.
    """
    if isinstance(name, type):
        raise ArgumentTypeError(f"backend must be a backend name or a backend object, got the "
                                f"class {name.__name__}: pass an instance, {name.__name__}()")
    if not isinstance(name, str):
        if all(hasattr(name, a) for a in ("xp", "softmax", "lse", "to_numpy")):
            return name
        raise ArgumentTypeError(f"backend must be one of {sorted(BACKENDS) + ['auto']} or a "
                                f"backend object, got {name!r:.60}")
    if name == "auto":
        return _load(_auto_choice(n_tokens))
    if name not in BACKENDS:
        raise ArgumentError(f"backend must be one of {sorted(BACKENDS) + ['auto']}, got {name!r}")
    return _load(name)


# Preference order of ``"auto"``: (backend, smallest token count it is chosen for).  The
# GPU backend only pays off once kernel launches are amortised, and is chosen only when
# it loads: CuPy, driver and device present and its kernels pass their self-test
# (CupyBackend raises BackendNotAvailable otherwise); numba beats the NumPy reference
# from a few dozen tokens.
_AUTO_ORDER: tuple[tuple[str, int], ...] = (("cupy", 20_000), ("numba", 64))


def _auto_choice(n_tokens: int | None) -> str:
    n = 0 if n_tokens is None else n_tokens
    for name, n_min in _AUTO_ORDER:
        if n < n_min or name not in BACKENDS:
            continue
        try:
            _load(name)
        except BackendNotAvailable:
            continue
        if name in _KERNEL_SETS and not kernels_ready(name, start=True):
            return "numpy"       # compiling in the background: never wait for it
        return name
    return "numpy"


#: environment variable: ``foreground`` makes ``"auto"`` compile in the caller's thread
#: (read at each call; default ``background``)
AUTO_COMPILE_ENV = compile_notice.COMPILE_ENV


def _numba_kernel_set() -> list[tuple[Any, str, Callable[[], Any]]]:
    """``(dispatcher, dtype, call)`` for every kernel of the Numba backend: ``call``
    compiles (or loads) the kernel's specialisation for ``dtype`` by a tiny call."""
    # deferred: numba is optional and slow to import; reached only once it loaded
    from .numba import NumbaBackend, streaming, sweep, tiled  # noqa: PLC0415

    out = []
    for dtype in (np.float64, np.float32):
        name = np.dtype(dtype).name
        for family, r, softmax, pointwise in (
                ("streaming", 2, streaming.softmax_kernel, streaming.pointwise_kernel),
                ("tiled", 16, tiled.softmax_tiled_kernel, tiled.pointwise_tiled_kernel)):
            be = NumbaBackend(kernel=family)
            q = np.linspace(-1.0, 1.0, 8 * r).reshape(8, r).astype(dtype)
            zero, one = np.zeros(8, dtype), np.full(8, 0.125, dtype)
            out.append((softmax, name, lambda be=be, q=q, b=zero: be.softmax(q, q, q, b, None)))
            out.append((pointwise, name,
                        lambda be=be, q=q, w=one: be.pointwise("sigmoid", q, q, q, w, None)))
        q = np.ascontiguousarray(q[:, :2])
        out.append((sweep._sweep_kernel, name,
                    lambda be=be, q=q, b=zero, w=one: be.sinkhorn_sweep(q, q, q, b, w)))
    return out


#: backend name -> its kernels (:func:`_numba_kernel_set`); ``"auto"`` waits for none
_KERNEL_SETS: dict[str, Callable[[], list[tuple[Any, str, Callable[[], Any]]]]] = {
    "numba": _numba_kernel_set}
_READY: set[str] = set()


def compile_kernels(name: str = "numba") -> list[str]:
    """Compile (or load from Numba's disk cache) every kernel of backend ``name`` in this
    thread, one call each; returns the kernels compiled, as ``"kernel (dtype)"``.

    The Numba backend's kernels: softmax (and lse), pointwise and Sinkhorn sweep,
    streaming and tiled, float64 then float32.  A backend with nothing to compile
    (``"numpy"``, ``"cupy"``) returns ``[]``.

    Raises
    ------
    ArgumentError
        Unknown backend name.
    BackendNotAvailable
        The backend's library is missing.
    """
    if name not in BACKENDS:
        raise ArgumentError(f"backend must be one of {sorted(BACKENDS)}, got {name!r}")
    _load(name)
    done = []
    for dispatcher, dtype, call in _KERNEL_SETS.get(name, list)():
        call()
        done.append(f"{dispatcher.py_func.__name__} ({dtype})")
    _READY.add(name)
    return done


def kernels_ready(name: str = "numba", *, start: bool = False) -> bool:
    """Whether every kernel of backend ``name`` (:func:`compile_kernels`) is compiled in
    this process or in Numba's disk cache, so that a call does not wait for a compilation.

    With ``start=True`` a backend that is not ready starts compiling on the background
    thread (:func:`~transformer_pde.backends.compile_notice.ready_or_background`), unless
    the environment variable :data:`AUTO_COMPILE_ENV` is ``foreground``: then it compiles
    now, in this thread, and is ready.
    """
    if name in _READY or name not in _KERNEL_SETS:
        return True
    key = f"{name} kernels"
    kernels = [(d, dtype) for d, dtype, _ in _KERNEL_SETS[name]()]
    if start:
        ready = compile_notice.ready_or_background(key, kernels, lambda: compile_kernels(name))
    else:
        ready = compile_notice.runnable(key, kernels)
    if ready:
        _READY.add(name)
    return ready
