r"""TOML configurations of the ``transformer-pde`` commands: reading and checking values.

A configuration is a TOML file (``tomllib``; ``tomli`` on Python 3.10) of tables, one per
concern: ``[attention]``, ``[tokens]``, ``[run]``, ``[field]``, ``[limits]``, ``[block]``,
``[noise]``, ``[output]`` for ``simulate``, ``[gaussian]``, ``[cone]``, ``[ranks]`` for the other
commands.  This module reads the file (:func:`load_config`) and gives typed access to one
table (:class:`Table`); :mod:`~transformer_pde.cli.builders` turns tables into library
objects.  The keys and their defaults are those of the library's own objects, read from
their signatures (:func:`typed_parameters`, :func:`read_options`), so the configuration
cannot drift from the API; the library's own argument checks run on the values
(:func:`library_call`).  A key a table does not know, a value of the wrong type or out of
range is a :class:`~transformer_pde.errors.ConfigError` whose message starts with the key
(``attention.Q: expected ...``); an unknown key or table is named with the closest known
one (``attention.kidn: unknown key; did you mean 'kind'?``, :func:`did_you_mean`).  Sizes
are checked before anything is allocated (:func:`check_memory`).
"""

from __future__ import annotations

import difflib
import inspect
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import validation
from ..errors import ConfigError
from ..integrate import physical_memory

__all__ = [
    "ConfigError",
    "Table",
    "UNKNOWN_MEMORY",
    "check_memory",
    "did_you_mean",
    "human_bytes",
    "library_call",
    "load_config",
    "numeric_array",
    "read_options",
    "sections",
    "typed_parameters",
]


# =========================================================================== files
def load_config(path: str | Path) -> dict:
    """Read a TOML configuration file.

    The file must exist, be UTF-8 text and valid TOML; otherwise a :class:`ConfigError`
    names the file and the problem.  The returned dictionary remembers the file's
    directory under the key ``"__dir__"`` (relative paths inside the file, such as
    ``tokens.file``, are read from there).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"configuration file {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"configuration file {str(path)!r} is not a file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line "
                          f"{line}); TOML files must be UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    data["__dir__"] = str(path.resolve().parent)
    return data


def sections(cfg: dict, allowed: Iterable[str]) -> None:
    """Check that the configuration has only the tables (and top-level keys) ``allowed``."""
    Table({k: v for k, v in cfg.items() if k != "__dir__"}, "config", allowed)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` for the option closest to the unknown ``word``
    (:func:`difflib.get_close_matches`, case-insensitive), or ``""`` when none is close."""
    options = [str(o) for o in options]
    lowered = {o.lower(): o for o in options}
    match = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[match[0]]!r}?" if match else ""


# =========================================================================== tables
class Table:
    """Typed access to one table of the configuration; every error names the key.

    Parameters
    ----------
    data : dict or None
        The table (``None``: empty).
    name : str
        Its dotted name in messages (``"attention"``, ``"block.mlp"``).
    allowed : iterable of str
        Keys this table accepts; another key is an error listing them.
    """

    def __init__(self, data: Any, name: str, allowed: Iterable[str]):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{name}: expected a table, got {data!r}")
        self.data = data
        self.name = name
        self.allowed = tuple(allowed)
        unknown = sorted(set(data) - set(self.allowed))
        if unknown:
            raise ConfigError(f"{self.key(unknown[0])}: unknown key"
                              f"{did_you_mean(unknown[0], self.allowed)}; allowed keys are "
                              f"{', '.join(sorted(self.allowed))}")

    def key(self, k: str) -> str:
        """The dotted name of key ``k`` in messages (``"attention.Q"``)."""
        return f"{self.name}.{k}" if self.name != "config" else k

    def has(self, k: str) -> bool:
        """Whether the table sets ``k``."""
        return k in self.data

    def raw(self, k: str, default: Any = None) -> Any:
        """The value of ``k`` as written (``default`` if unset), unchecked."""
        return self.data.get(k, default)

    def number(self, k: str, default: Any = None, *, positive: bool = False,
               nonneg: bool = False) -> float:
        """A finite number (``> 0`` with ``positive``, ``>= 0`` with ``nonneg``)."""
        v = self.data.get(k, default)
        if v is None:
            raise ConfigError(f"{self.key(k)}: required, expected a number")
        check, cond = ((validation.positive, " > 0") if positive else
                       (validation.nonnegative, " >= 0") if nonneg else (validation.scalar, ""))
        try:
            return check(self.key(k), v)
        except TypeError:   # ArgumentTypeError: not a number (a string, a bool, a list)
            raise ConfigError(f"{self.key(k)}: expected a number, got {v!r}") from None
        except ValueError:  # ArgumentError: not finite, or out of range
            raise ConfigError(f"{self.key(k)}: expected a finite number{cond}, got {v!r}") from None

    def integer(self, k: str, default: Any = None, *, minimum: int = 0,
                maximum: int | None = None) -> int:
        """An integer in ``[minimum, maximum]`` (booleans refused)."""
        v = self.data.get(k, default)
        if v is None:
            raise ConfigError(f"{self.key(k)}: required, expected an integer >= {minimum}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{self.key(k)}: expected an integer >= {minimum}, got {v!r}")
        if v < minimum or (maximum is not None and v > maximum):
            rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise ConfigError(f"{self.key(k)}: expected an integer {rng}, got {v}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        """``true`` or ``false``."""
        v = self.data.get(k, default)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.key(k)}: expected true or false, got {v!r}")
        return v

    def string(self, k: str, default: str | None = None) -> str:
        """A string."""
        v = self.data.get(k, default)
        if not isinstance(v, str):
            raise ConfigError(f"{self.key(k)}: expected a string, got {v!r}")
        return v

    def choice(self, k: str, default: Any, options: Sequence[Any]) -> Any:
        """One of ``options``."""
        v = self.data.get(k, default)
        if isinstance(v, bool) or v not in options:
            raise ConfigError(f"{self.key(k)}: expected one of "
                              f"{', '.join(map(repr, options))}, got {v!r}")
        return v

    def vector(self, k: str, n: int, default: Any = None) -> np.ndarray:
        """A list of ``n`` finite numbers, as a float array of shape ``(n,)``."""
        v = self.data.get(k, default)
        arr = numeric_array(v, self.key(k), f"a list of {n} numbers")
        if arr.shape != (n,):
            raise ConfigError(f"{self.key(k)}: expected a list of {n} numbers, "
                              f"got shape {arr.shape}")
        return arr

    def list_of(self, k: str, default: list, options: Sequence[Any]) -> list:
        """A non-empty list of elements of ``options``."""
        v = self.data.get(k, default)
        if (not isinstance(v, list) or not v
                or any(isinstance(x, bool) or x not in options for x in v)):
            raise ConfigError(f"{self.key(k)}: expected a non-empty list of "
                              f"{', '.join(map(repr, options))}, got {v!r}")
        return v


def numeric_array(v: Any, key: str, form: str) -> np.ndarray:
    """A finite real float array from a TOML value (numbers and nested lists only)."""
    def numbers_only(x: Any) -> bool:
        if isinstance(x, list):
            return all(numbers_only(y) for y in x)
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if not numbers_only(v):
        raise ConfigError(f"{key}: expected {form}, got {v!r}")
    try:
        arr = np.array(v, dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key}: expected {form}, got {v!r}") from None
    if not np.all(np.isfinite(arr)):
        raise ConfigError(f"{key}: expected {form} of finite numbers, got {v!r}")
    return arr


# =========================================================================== memory
#: the memory assumed where the machine's physical memory cannot be read (1 TiB)
UNKNOWN_MEMORY = 1 << 40


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units, three significant digits (``"1.5 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def check_memory(key: str, nbytes: float, what: str) -> None:
    """Refuse up front (naming ``key``) a configuration whose arrays cannot fit in memory:
    ``nbytes`` above the machine's physical memory
    (:func:`~transformer_pde.integrate.physical_memory`; :data:`UNKNOWN_MEMORY` where it
    cannot be read) is a :class:`ConfigError` saying ``what`` needs it."""
    memory = physical_memory()
    limit = UNKNOWN_MEMORY if memory is None else memory
    if nbytes > limit:
        raise ConfigError(f"{key}: {what} would need {human_bytes(nbytes)} of memory, more than "
                          f"this machine's {human_bytes(limit)}")


# =========================================================================== library signatures
def typed_parameters(obj: Callable, exclude: Iterable[str] = ()) -> dict[str, tuple[str, Any]]:
    """The keyword parameters of ``obj`` (a class or function) that a TOML value can set:
    ``{name: (kind, default)}`` with ``kind`` one of ``"bool"``, ``"int"``, ``"float"``,
    ``"str"``, read from the annotations (``float | None`` is ``"float"``) or, without
    one, from the default's type.  Other parameters (arrays, callables) are left out."""
    target = obj.__init__ if inspect.isclass(obj) and not hasattr(obj, "__dataclass_fields__") \
        else obj
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 -- unresolvable annotations: fall back to defaults
        hints = {}
    skip = set(exclude)
    out: dict[str, tuple[str, Any]] = {}
    for name, p in inspect.signature(obj).parameters.items():
        if name in skip or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        default = None if p.default is inspect.Parameter.empty else p.default
        hint = hints.get(name)
        args = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
        for kind, types in (("bool", (bool,)), ("int", (int,)), ("float", (float,)),
                            ("str", (str,))):
            if args & set(types) or (hint is None and type(default) in types):
                out[name] = (kind, default)
                break
    return out


def read_options(sec: Table, spec: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """The values of ``sec`` for the parameters ``spec`` (:func:`typed_parameters`) that it
    sets, type-checked (numbers finite, integers >= 0)."""
    out: dict[str, Any] = {}
    for name, (kind, default) in spec.items():
        if not sec.has(name):
            continue
        if kind == "bool":
            out[name] = sec.boolean(name, default)
        elif kind == "int":
            out[name] = sec.integer(name, default, minimum=0)
        elif kind == "float":
            out[name] = sec.number(name, default)
        else:
            out[name] = sec.string(name, default)
    return out


def library_call(key: str, func: Callable, *args: Any, names: Iterable[str] = (),
                 strict: bool = True, aliases: dict[str, str] | None = None,
                 **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, its argument errors reported as :class:`ConfigError`
    under ``key.name`` for the first of ``names`` (the keys the user gave) that the
    library's message mentions -- or the key ``aliases[word]`` for a library argument
    ``word`` that a key of another name sets (``{"mean0": "mean"}``) -- else under ``key``;
    or, with ``strict=False`` (a call that also computes, where an error naming no option
    is a failure of the computation, not of the configuration), re-raised as they are."""
    try:
        return func(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(exc)))
        named = next((n for n in names if n in words), None)
        if named is None:
            named = next((k for w, k in (aliases or {}).items() if w in words), None)
        if named is None and not strict:
            raise
        raise ConfigError(f"{key if named is None else key + '.' + named}: {exc}") from None
