r"""The identity of a particle run, as checkpoints compare it: :func:`run_identity`.

A checkpoint of :func:`~transformer_pde.simulate` may only be resumed by the same run.
:func:`run_identity` lists what determines a particle run: the attention (its scalars,
its constant matrices and :class:`~transformer_pde.Layers` tables by hash), the tokens,
weights and positions (by hash), the segments of packed sequences, dtype, backend and
field options (Sinkhorn tolerance and iteration budget), the solver's class and options,
``t_max``, ``dt``, what is saved (``every``, ``ts``, and for ``SaveAt(fn)`` the
function's qualified name, a hash of its bytecode and constants and of its value on the
initial state) and every parameter of the :class:`~transformer_pde.Block`.  Parameters
that are callables of time are kept as callables and compared at probe times by the
generic :class:`~transformer_pde.integrate.checkpoint.RunIdentity`, which also holds the
file machinery's side (records, differences, explanations).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..attention import Layers
from ..blocks import BlockStepper
from ..integrate.checkpoint import RunIdentity, value_digest
from ..integrate.loop import owned
from ..io.codec import attention_fields
from ..io.digests import array_digest, json_digest

__all__ = ["SystemStatistic", "run_identity"]


class SystemStatistic:
    """``SaveAt(fn=...)`` of an ensemble as the engine calls it.

    The engine integrates :math:`B` systems of :math:`n` tokens as one state (B n, d);
    ``fn(t, X, weights)`` expects the states as (B, n, d) and one system's weights (n,).
    Calling this object reshapes (views: read-only views stay read-only) and calls
    ``fn``; the run identity names and hashes ``fn`` itself.
    """

    def __init__(self, fn: Callable[..., Any], shape: tuple[int, int, int]):
        self.fn, self.shape = fn, tuple(shape)

    def __call__(self, t: float, X: Any, weights: Any) -> Any:
        return self.fn(t, X.reshape(self.shape), weights[:self.shape[1]])


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    name = getattr(obj, "__qualname__", None) or cls.__qualname__
    module = getattr(obj, "__module__", None) or cls.__module__
    return f"{module}.{name}"


def _code_digest(code: Any) -> str:
    """SHA-256 of a code object's bytecode, names and constants (nested code included)."""
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for c in code.co_consts:
        h.update(_code_digest(c).encode() if hasattr(c, "co_code") else repr(c).encode())
    return h.hexdigest()


def _function_code(fn: Any) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None:   # a callable object: the code of its class's __call__
        call = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)),
                    None)
        code = getattr(call, "__code__", None)
    return code


def _solver_key(solver: Any) -> str:
    """What identifies a solver's numerics: its class and its public options."""
    if isinstance(solver, BlockStepper):
        return f"BlockStepper[{_solver_key(solver.inner)}]"
    opts = []
    for k, v in sorted(getattr(solver, "__dict__", {}).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, (bool, int, float, str)):
            opts.append((k, v))
        elif dataclasses.is_dataclass(v):   # a Butcher tableau
            fields = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
            opts.append((k, json_digest({n: array_digest(x) if isinstance(x, np.ndarray)
                                         else repr(x) for n, x in fields.items()})))
    return f"{_qualname(solver)}{opts}"


def run_identity(*, att: Any, X0: np.ndarray, weights: np.ndarray, positions: Any,
                 dtype: Any, backend: str, field_options: dict[str, Any], solver: Any,
                 t_max: float, dt: float, saveat: Any, block: Any, limits: Any = None,
                 segments: Any = None, noise: Any = None) -> RunIdentity:
    """The identity of a :func:`~transformer_pde.simulate` run (see the module docstring).

    ``X0`` is the initial state as the run starts from it (after a constraint's
    renormalisation); ``field_options`` the evaluator's Sinkhorn controls;
    ``saveat.fn``, if any, is evaluated once on the initial state; ``limits`` the run's
    :class:`~transformer_pde.Limits` (kept apart from the fields compared for equality,
    so a run's fingerprint :attr:`~RunIdentity.static` does not depend on them);
    ``segments`` the sizes of packed sequences (recorded only when there are several,
    so the fingerprints of runs without them are those of earlier versions); ``noise``
    the run's :class:`~transformer_pde.noise.Noise` (recorded only when given: sigma,
    convention, seed, path, base step and a hash of the common matrices)."""
    static: dict[str, str] = {}
    calls: dict[str, Callable[[float], Any]] = {}

    def put(name: str, value: Any) -> None:
        if value is None or isinstance(value, (bool, int, float, str, np.generic)):
            static[name] = repr(value.item() if isinstance(value, np.generic) else value)
        elif isinstance(value, np.ndarray):
            static[name] = "sha256:" + array_digest(value)
        elif isinstance(value, Layers):
            static[name] = "Layers sha256:" + json_digest(
                [array_digest(np.asarray(value.values)), repr(value.layer_time),
                 repr(value.t0)])
        elif callable(value):
            static[name] = "callable " + _qualname(value)
            calls[name + "(t)"] = value
        else:
            static[name] = f"{_qualname(value)}: {value!r}"

    for key, value in sorted(attention_fields(att).items()):
        put(f"attention.{key}", value)
    static["tokens"] = json_digest([array_digest(X0), array_digest(weights),
                                    array_digest(positions)])
    if segments is not None and len(segments) > 1:   # absent from single-set runs
        static["segments"] = repr([int(s) for s in segments])
    if noise is not None:   # absent from deterministic runs
        for key, value in sorted(noise.describe().items()):
            static[f"noise.{key}"] = repr(value)
        static["noise.common"] = "None" if noise.common is None else \
            "sha256:" + array_digest(noise.common)
    static["dtype"] = str(np.dtype(dtype))
    static["backend"] = str(backend)
    for key in sorted(field_options):
        put(f"field.{key}", field_options[key])
    static["solver"] = _solver_key(solver)
    static["t_max"], static["dt"] = repr(float(t_max)), repr(float(dt))
    static["saveat.every"] = repr(saveat.every)
    static["saveat.ts"] = "None" if saveat.ts is None else "sha256:" + array_digest(
        np.asarray(saveat.ts, dtype=float))
    fn = saveat.fn
    if fn is None:
        static["saveat.fn"] = "None"
    else:
        user_fn = fn.fn if isinstance(fn, SystemStatistic) else fn
        static["saveat.fn"] = _qualname(user_fn)
        code = _function_code(user_fn)
        static["saveat.fn.code"] = "unknown" if code is None else _code_digest(code)
        try:
            x0 = np.array(X0, dtype=dtype)
            x0.flags.writeable = False
            value = fn(0.0, x0, weights)
            static["saveat.fn(X0)"] = value_digest(value)
        except Exception as exc:   # any failure the run owns is part of the identity
            if not owned(exc):   # a caller's timeout, out of memory: not the run's
                raise
            static["saveat.fn(X0)"] = f"raised {type(exc).__name__}"
    if block is None:
        static["block"] = "None"
    else:
        static["block"] = "Block"
        for key, value in sorted(block.parameters().items()):
            put(f"block.{key}", value)
    lim = None if limits is None else {
        "max_norm": float(limits.max_norm), "max_steps": int(limits.max_steps),
        "max_memory": None if limits.max_memory is None else float(limits.max_memory)}
    return RunIdentity(static, calls, lim)

