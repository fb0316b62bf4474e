"""A study: a grid, a cell function and the outputs it returns.

A cell function is any picklable callable ``fn(params, rng) -> mapping`` taking the cell's
parameters (a dict, one value per grid axis) and its own seeded
:class:`numpy.random.Generator`, and returning named scalars or small arrays of fixed shape.
Module-level functions and instances of module-level classes are picklable; closures are
shipped by value with cloudpickle when the study runs on Dask.

A cell function may also compute many cells at once: an object with a method
``run_batch(params_list, rngs) -> list`` (one mapping per cell, or an exception instance
for a cell that failed) is handed each task's cells together, so that it can vectorise
over them (one batched ODE solve instead of many small ones).  Its results must equal the
cell-by-cell ones; if ``run_batch`` raises, the cells are run one by one (so only the
failing cells fail).

The outputs are declared by an :class:`Output` per name (shape, dtype, names of the extra
dimensions).  Built-in cell functions declare them through an ``outputs(grid)`` method;
for other functions pass ``outputs=`` or let :func:`~transformer_pde.sweep.run` infer them
from the first cell that succeeds.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
import textwrap
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..io.jsonfmt import dumps
from .grid import Cell, Grid

__all__ = ["Output", "Study", "CellResult", "cell_name", "code_digest", "run_cell", "run_cells",
           "structured", "DONE", "FAILED", "MISSING"]

#: values of the ``cell_status`` variable of a study's results
MISSING, DONE, FAILED = 0, 1, 2


@dataclass(frozen=True)
class Output:
    """Declared shape and dtype of one output of a cell function.

    ``dims`` names the extra dimensions (defaults ``<name>_0``, ``<name>_1`` …).
    Missing and failed cells hold the fill value: NaN for floats, the smallest integer for
    integers, ``False`` for booleans; the ``cell_status`` variable says which cells are valid.
    """

    shape: tuple = ()
    dtype: str = "float64"
    dims: tuple | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise ArgumentError(f"output shape must be non-negative, got {self.shape}")
        dt = np.dtype(self.dtype)
        if dt.kind not in "biuf":
            raise ArgumentTypeError(f"output dtype must be boolean, integer or float, got {dt}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dt.str)
        if self.dims is not None and len(self.dims) != len(shape):
            raise ArgumentError(f"output dims {self.dims!r} do not match shape {shape}")

    def dim_names(self, name: str) -> tuple[str, ...]:
        return tuple(self.dims) if self.dims is not None else tuple(
            f"{name}_{i}" for i in range(len(self.shape)))

    @property
    def fill(self) -> Any:
        dt = np.dtype(self.dtype)
        return {"f": np.nan, "b": False}.get(dt.kind, np.iinfo(dt).min if dt.kind in "iu" else 0)

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype,
                "dims": None if self.dims is None else list(self.dims)}

    @classmethod
    def infer(cls, value: Any) -> "Output":
        a = np.asarray(value)
        if a.dtype.kind == "c":
            raise ArgumentTypeError("cell outputs must be real, got a complex value")
        if a.dtype.kind not in "biuf":
            raise ArgumentTypeError(f"cell outputs must be numbers or numeric arrays, "
                                    f"got {a.dtype}")
        return cls(a.shape, "float64" if a.dtype.kind == "f" else a.dtype.str)


def cell_name(fn: Any) -> str:
    """``module:qualname`` of a cell function (of its class for a callable object)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not isinstance(target, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', '?')}"


def _stable(value: Any, depth: int = 0) -> Any:
    """A JSON-able, run-independent description of a value the code depends on (a default,
    a closure cell, a constant): plain values as they are, arrays by their bytes, functions
    by their code, anything else by its type (never a repr holding a memory address)."""
    if depth > 6:
        return "..."
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, float) else repr(value)
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [_stable(v, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _stable(v, depth + 1) for k, v in sorted(value.items(), key=repr)}
    if isinstance(value, types.CodeType):
        return _code(value, depth + 1)
    if isinstance(value, (types.FunctionType, functools.partial, types.MethodType)):
        return _function(value, depth + 1)
    if isinstance(value, types.ModuleType):
        return f"<module {value.__name__}>"
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.dtype.kind in "biufc":
            return [a.dtype.str, list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _code(code: types.CodeType, depth: int = 0) -> Any:
    """A code object by its bytecode, names and constants (nested code objects included)."""
    return [hashlib.sha256(code.co_code).hexdigest(), list(code.co_names),
            list(code.co_varnames), [_stable(c, depth + 1) for c in code.co_consts]]


def _function(fn: Any, depth: int = 0) -> Any:
    """What a function computes: its source (else its code), defaults and closure values."""
    if isinstance(fn, functools.partial):
        return {"partial": _function(fn.func, depth + 1),
                "args": _stable(fn.args, depth + 1), "keywords": _stable(fn.keywords, depth + 1)}
    if isinstance(fn, types.MethodType):
        return {"method": _function(fn.__func__, depth + 1),
                "self": _stable(getattr(fn.__self__, "__dict__", None), depth + 1)}
    if not isinstance(fn, types.FunctionType):
        return _stable(fn, depth + 1)
    try:
        body: Any = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # defined by exec / in an interactive session: its bytecode
        body = _code(fn.__code__, depth + 1)
    cells = [c.cell_contents if _filled(c) else None for c in fn.__closure__ or ()]
    return {"code": body, "defaults": _stable(fn.__defaults__, depth + 1),
            "kwdefaults": _stable(fn.__kwdefaults__, depth + 1),
            "closure": [_stable(v, depth + 1) for v in cells]}


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell (a name bound later)
        return False
    return True


def code_digest(fn: Any) -> str:
    """A digest of what a cell function computes: for a plain function, its source code
    (its bytecode and constants when the source is not available), defaults and closure
    values; for a callable object, the code of its class's ``__call__`` and ``run_batch``
    and its attributes.  Two versions of a function with the same name but different code
    get different digests.  Plain values (numbers, strings, arrays, nested functions) are
    described by their content; other objects only by their type."""
    if isinstance(fn, (types.FunctionType, functools.partial, types.MethodType)):
        desc: Any = _function(fn)
    else:
        cls = type(fn)
        desc = {name: _function(getattr(cls, name)) for name in ("__call__", "run_batch")
                if isinstance(getattr(cls, name, None), types.FunctionType)}
        desc["attributes"] = _stable(getattr(fn, "__dict__", None))
    text = dumps(desc, sort_keys=True, describe=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _describe(fn: Any) -> Any:
    """The cell function in a study's fingerprint: its ``config()`` (a JSON object), or
    ``"module:qualname#digest"`` (:func:`code_digest`)."""
    if hasattr(fn, "config"):
        return fn.config()
    return f"{cell_name(fn)}#{code_digest(fn)}"


def structured(value: Any) -> Any:
    """``value`` (JSON data) with every text that is itself the JSON of an object decoded,
    recursively: the data of a fingerprint whose cell configuration was stored as JSON text
    (stores of format 2 and earlier hold JSON inside JSON inside JSON) or holds a JSON
    label (the ``[attention]`` table of the ``cone`` command).  Fingerprints are written and
    compared in this form, one level of JSON; an old store's fingerprint compares equal to
    the same study's new one."""
    if isinstance(value, dict):
        return {k: structured(v) for k, v in value.items()}
    if isinstance(value, list):
        return [structured(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return structured(decoded) if isinstance(decoded, dict) else value
    return value


@dataclass
class Study:
    """What to compute: a :class:`Grid`, a cell function and its outputs.

    Parameters
    ----------
    grid : Grid
    cell : callable ``(params, rng) -> mapping``
        See the module docstring.
    outputs : mapping of str to Output, optional
        Declared outputs; taken from ``cell.outputs(grid)`` when the cell function has that
        method, else inferred from the first cell that succeeds.
    name : str
        Recorded in the results' attributes.
    """

    grid: Grid
    cell: Callable[[dict, np.random.Generator], Mapping[str, Any]]
    outputs: Mapping[str, Output] | None = None
    name: str = "study"
    attrs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.grid, Grid):
            raise ArgumentTypeError(f"grid must be a transformer_pde.sweep.Grid, got "
                                    f"{type(self.grid).__name__}")
        if not callable(self.cell):
            raise ArgumentTypeError(f"cell must be callable (params, rng) -> mapping, got "
                                    f"{type(self.cell).__name__}")
        if self.outputs is None and hasattr(self.cell, "outputs"):
            self.outputs = self.cell.outputs(self.grid)
        if self.outputs is not None:
            outs = {}
            for k, v in dict(self.outputs).items():
                if not isinstance(k, str) or not k.isidentifier() or k == "cell_status":
                    raise ArgumentError(f"output names must be identifiers other than "
                                        f"'cell_status', got {k!r}")
                if k in self.grid.dims:
                    raise ArgumentError(f"output {k!r} has the name of a grid axis")
                outs[k] = v if isinstance(v, Output) else Output(**v)
            self.outputs = outs

    def fingerprint(self) -> str:
        """JSON identity of the study: grid, cell function and outputs, one level of JSON
        (:func:`structured`).  A store written for one fingerprint is never resumed with
        another.

        A cell function with a ``config()`` method is identified by that configuration;
        any other by ``module:qualname#digest``, where the digest (:func:`code_digest`)
        covers its code, defaults and closure values, so that an edited function does not
        complete a store begun by its earlier version."""
        outs = None if self.outputs is None else {k: v.to_dict() for k, v in self.outputs.items()}
        cell = _describe(self.cell)
        if not isinstance(cell, str):  # a config(): objects that are not JSON data as text
            cell = json.loads(dumps(cell, describe=True))
        return dumps(structured({"grid": self.grid.to_dict(), "cell": cell,
                                 "outputs": outs}), sort_keys=True)


@dataclass
class CellResult:
    """Outcome of one cell: ``status`` is DONE or FAILED; ``values`` or ``message``."""

    index: int
    status: int
    values: dict | None = None
    message: str = ""
    seconds: float = 0.0


def _check_values(values: Any, outputs: Mapping[str, Output] | None) -> dict:
    if not isinstance(values, Mapping):
        raise TypeError(f"the cell function must return a mapping of output name to value, "
                        f"got {type(values).__name__}")
    out = {}
    for k, v in values.items():
        a = np.asarray(v)
        if a.dtype.kind not in "biuf":
            raise TypeError(f"output {k!r}: expected a real number or numeric array, got "
                            f"{a.dtype} ({v!r:.60})")
        out[k] = a
    if outputs is not None:
        if set(out) != set(outputs):
            raise ValueError(f"the cell function returned outputs {sorted(out)}, declared "
                             f"{sorted(outputs)}")
        for k, spec in outputs.items():
            if out[k].shape != spec.shape:
                raise ValueError(f"output {k!r} has shape {out[k].shape}, declared {spec.shape}")
            if np.dtype(spec.dtype).kind in "iub" and out[k].dtype.kind == "f":
                raise ValueError(f"output {k!r} is a float, declared {spec.dtype}")
            out[k] = out[k].astype(spec.dtype)
    return out


def run_cell(fn: Callable, grid: Grid, index: int,
             outputs: Mapping[str, Output] | None) -> CellResult:
    """Run one cell; an exception inside the cell function becomes a FAILED result whose
    message is the exception (its last traceback line), so the study goes on."""
    cell: Cell = grid.cell(index)
    t0 = time.perf_counter()
    try:
        values = _check_values(fn(dict(cell.params), cell.rng()), outputs)
    except Exception as exc:  # noqa: BLE001 -- recorded, the study goes on
        return CellResult(index, FAILED, None, _message(exc), time.perf_counter() - t0)
    return CellResult(index, DONE, values, "", time.perf_counter() - t0)


def _single_threaded_numba() -> None:
    """Inside a Dask worker, run the package's Numba kernels on one thread: the cluster
    already has one worker process per core, so more threads would oversubscribe."""
    try:
        from distributed import get_worker  # noqa: PLC0415 (optional: present under Dask only)

        get_worker()
    except (ImportError, ValueError):
        return
    numba = sys.modules.get("numba")
    if numba is None:  # not imported (yet): no import just for this (it costs ~1 s)
        os.environ["NUMBA_NUM_THREADS"] = "1"  # read by numba when it is first imported
    elif numba.get_num_threads() != 1:
        numba.set_num_threads(1)


def _message(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_cells(fn: Callable, grid: Grid, indices: list[int],
              outputs: Mapping[str, Output] | None) -> list[CellResult]:
    """Run a batch of cells (one Dask task): together through ``fn.run_batch`` when the
    cell function has one (see the module docstring), else one by one."""
    _single_threaded_numba()
    batch = getattr(type(fn), "run_batch", None)
    if batch is None or len(indices) < 2:
        return [run_cell(fn, grid, i, outputs) for i in indices]
    cells = [grid.cell(i) for i in indices]
    t0 = time.perf_counter()
    try:
        values = fn.run_batch([dict(c.params) for c in cells], [c.rng() for c in cells])
        if len(values) != len(cells):
            raise ValueError(f"run_batch returned {len(values)} results for {len(cells)} cells")
    except Exception:  # noqa: BLE001 -- isolate the failing cells: run them one by one
        return [run_cell(fn, grid, i, outputs) for i in indices]
    seconds = (time.perf_counter() - t0) / len(cells)
    out = []
    for i, v in zip(indices, values, strict=True):
        if isinstance(v, BaseException):
            out.append(CellResult(i, FAILED, None, _message(v), seconds))
            continue
        try:
            out.append(CellResult(i, DONE, _check_values(v, outputs), "", seconds))
        except Exception as exc:  # noqa: BLE001
            out.append(CellResult(i, FAILED, None, _message(exc), seconds))
    return out
