"""Studies described by a TOML file (the ``transformer-pde sweep`` command).

.. code-block:: toml

    name = "ranks"            # optional, recorded in the results

    [study]
    cell = "ranks"            # a built-in cell (see CELLS) or "package.module:function"
    draws = 20                # random draws per combination of axis values
    seed = 0                  # base seed of every cell's SeedSequence

    [study.axes]              # the grid: one list per axis (an axis overrides a cell option)
    kind = ["softmax", "l2"]
    d = [3, 4]

    [cell]                    # fixed options of the cell function (built-in cells only)
    t_max = 30.0

    [outputs]                 # declared outputs of a "module:function" cell (optional)
    mean = { shape = [], dtype = "float64" }

The results go to ``OUT/results.zarr`` and a summary to ``OUT/summary.json``.
"""

from __future__ import annotations

import difflib
import importlib
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError, ConfigError
from ..io.jsonfmt import dumps
from .cells import CELLS
from .grid import Grid
from .run import run, summary
from .study import Output, Study

__all__ = ["study_from_config", "load_study_config", "run_config"]

_TOP = ("name", "study", "cell", "outputs")
_STUDY = ("cell", "draws", "seed", "axes")


def _table(cfg: Any, key: str) -> dict:
    value = cfg.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table, got {type(value).__name__}")
    return value


def _suggest(word: str, options: Any) -> str:
    """``"; did you mean 'X'?"`` for the option closest to ``word``
    (:func:`difflib.get_close_matches`, case-insensitive; as the CLI's configuration
    reader), or ``""`` when none is close."""
    lowered = {str(o).lower(): str(o) for o in options}
    match = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[match[0]]!r}?" if match else ""


def _unknown(table: dict, allowed: tuple, where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}{_suggest(key, allowed)} "
                              f"(allowed: {', '.join(allowed)})")


def _cell_function(spec: Any, options: dict) -> Any:
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"study.cell must be a string: one of {sorted(CELLS)} or "
                          f"'module:function', got {spec!r}")
    if spec in CELLS:
        fields = sorted(CELLS[spec].__dataclass_fields__)
        for key in options:
            if key not in fields:
                raise ConfigError(f"[cell]: unknown key {key!r}{_suggest(key, fields)} "
                                  f"(options of {spec!r}: {', '.join(fields)})")
        try:
            return CELLS[spec](**options)
        except TypeError as exc:
            raise ConfigError(f"[cell]: {exc} (options of {spec!r}: {fields})") from None
    mod_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ConfigError(f"study.cell: {spec!r} is neither a built-in cell "
                          f"({', '.join(sorted(CELLS))}) nor 'module:function'"
                          f"{_suggest(spec, CELLS)}")
    if options:
        raise ConfigError("[cell] options apply to built-in cells only; a 'module:function' "
                          "cell takes its parameters from the grid axes")
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"study.cell: cannot import {spec!r} ({exc})") from None
    if not callable(fn):
        raise ConfigError(f"study.cell: {spec!r} is not callable")
    return fn


def study_from_config(cfg: dict) -> Study:
    """Build a :class:`Study` from a parsed configuration (see the module docstring);
    every error names the key."""
    if not isinstance(cfg, dict):
        raise ConfigError("the configuration must be a TOML table")
    _unknown(cfg, _TOP, "config")
    study_t = _table(cfg, "study")
    _unknown(study_t, _STUDY, "[study]")
    if "cell" not in study_t:
        raise ConfigError(f"study.cell is required: one of {sorted(CELLS)} or "
                          f"'module:function'")
    axes = _table(study_t, "axes")
    fn = _cell_function(study_t["cell"], _table(cfg, "cell"))
    try:
        grid = Grid(axes, draws=study_t.get("draws", 1), seed=study_t.get("seed", 0))
    except (ArgumentError, ArgumentTypeError) as exc:
        raise ConfigError(f"[study]: {exc}") from None
    outputs = None
    if "outputs" in cfg:
        outputs = {}
        for name, spec in _table(cfg, "outputs").items():
            if not isinstance(spec, dict):
                raise ConfigError(f"outputs.{name} must be a table like "
                                  f"{{ shape = [], dtype = 'float64' }}")
            _unknown(spec, ("shape", "dtype", "dims"), f"outputs.{name}")
            try:
                outputs[name] = Output(tuple(spec.get("shape", ())), spec.get("dtype", "float64"),
                                       None if "dims" not in spec else tuple(spec["dims"]))
            except (ArgumentError, ArgumentTypeError, TypeError, ValueError) as exc:
                raise ConfigError(f"outputs.{name}: {exc}") from None
    name = cfg.get("name", Path(str(study_t["cell"])).name)
    if not isinstance(name, str):
        raise ConfigError(f"name must be a string, got {name!r}")
    try:
        return Study(grid, fn, outputs=outputs, name=name)
    except (ArgumentError, ArgumentTypeError) as exc:
        raise ConfigError(f"[study]: {exc}") from None


def load_study_config(path: str | Path) -> dict:
    """Parse a TOML study file; errors name the file."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None


def run_config(path: str | Path, out: str | Path, *, scheduler: str | None = None,
               scheduler_file: str | Path | None = None, workers: int | None = None,
               resume: bool = False, progress: bool = True) -> dict:
    """Run the study of a TOML file into ``out/results.zarr``; write and return the summary
    (``out/summary.json``)."""
    cfg = load_study_config(path)
    study = study_from_config(cfg)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ArgumentError(f"--out {out} exists and is not a directory")
    created = not out.exists()
    if created:
        try:
            out.mkdir(parents=True)
        except OSError as exc:
            raise ArgumentError(f"--out {out}: cannot create it ({exc.strerror})") from None
    try:
        ds = run(study, out / "results.zarr", scheduler=scheduler, workers=workers,
                 scheduler_file=scheduler_file, resume=resume, progress=progress, config=cfg)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    s = {"command": "sweep", "name": study.name, "config": str(path),
         "store": str(out / "results.zarr"), **summary(ds)}
    with open(out / "summary.json", "w", encoding="utf-8") as fh:
        fh.write(dumps(s, indent=2, strict=True))
    return s
