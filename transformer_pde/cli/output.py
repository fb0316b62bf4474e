"""Where a command writes its files: checked before the run, filled in a staging
directory, moved into place only when the command succeeds.

Rules (documented in ``transformer-pde --help``):

* ``--out DIR`` must be a new directory or an empty one; an existing directory with
  files in it is refused unless ``--force`` is given, and then only the files of the same
  names are replaced (the others are left alone).  Outputs are never overwritten silently.
* ``DIR`` is checked before anything is computed (a file, a path under a file, a
  directory without write permission are refused at once).
* Files are written into a hidden staging directory next to ``DIR`` (or inside it, when
  it exists) and moved into ``DIR`` at the end; a run that fails or is interrupted
  without a result leaves neither ``DIR`` nor the staging directory behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import TransformerPDEError

__all__ = ["OutputDir", "OutputError", "write_json"]

STAGING_PREFIX = ".transformer-pde-partial-"


class OutputError(TransformerPDEError, OSError):
    """The output directory cannot be used (the message names ``--out``)."""


def _existing_ancestor(path: Path) -> Path:
    """The nearest existing path among ``path``'s parents (a file or a directory)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path(path.absolute().anchor)


class OutputDir:
    """An output directory, checked at construction and written at :meth:`commit`.

    Use as a context manager: on an exception the staging directory is removed and the
    final directory is not created.

    Parameters
    ----------
    path : str or Path
        The final directory (``--out``).
    force : bool
        Write into an existing, non-empty directory, replacing files of the same names.
    option : str
        The option's name in messages.
    replaceable : callable, optional
        ``replaceable(path) -> bool``: whether an existing non-empty directory may be
        written into without ``force`` (``simulate --resume`` replaces the files of the
        interrupted run it continues).
    """

    def __init__(self, path: str | Path, *, force: bool = False, option: str = "--out",
                 replaceable: Callable[[Path], bool] | None = None):
        self.final = Path(path)
        self.force = bool(force)
        self.replaceable = replaceable
        self.option = option
        self.staging: Path | None = None
        self.committed: list[Path] = []
        self._open()

    def _fail(self, reason: str) -> OutputError:
        return OutputError(f"{self.option} {self.final}: {reason}")

    def _open(self) -> None:
        p = self.final
        if p.exists():
            if not p.is_dir():
                raise self._fail("exists and is not a directory")
            if (not self.force and any(p.iterdir())
                    and not (self.replaceable is not None and self.replaceable(p))):
                raise self._fail("exists and is not empty; pass --force to replace the files "
                                 "of the same names in it, or choose a new directory")
            base = p
        else:
            base = _existing_ancestor(p)
            if not base.is_dir():
                raise self._fail(f"{base} is not a directory")
        try:
            self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=base))
        except PermissionError:
            raise self._fail(f"permission denied: cannot create files in {base}") from None
        except OSError as exc:
            raise self._fail(f"cannot create files in {base}: "
                             f"{exc.strerror or exc}") from None

    # ------------------------------------------------------------------ writing
    def path(self, name: str) -> Path:
        """Where to write the output file ``name`` (inside the staging directory)."""
        if self.staging is None:
            raise RuntimeError("the output directory was already committed or discarded")
        return self.staging / name

    def write_json(self, name: str, data: dict) -> Path:
        return write_json(self.path(name), data)

    def write_text(self, name: str, text: str) -> Path:
        path = self.path(name)
        path.write_text(text, encoding="utf-8")
        return path

    def savefig(self, fig: Any, name: str, dpi: int = 110) -> Path:
        path = self.path(name)
        fig.savefig(path, dpi=dpi)
        return path

    # ------------------------------------------------------------------ end
    def commit(self) -> list[Path]:
        """Move the written files into the final directory (created if needed)."""
        if self.staging is None:
            return self.committed
        self.final.mkdir(parents=True, exist_ok=True)
        for src in sorted(self.staging.iterdir()):
            dst = self.final / src.name
            os.replace(src, dst)
            self.committed.append(dst)
        self.discard()
        return self.committed

    def discard(self) -> None:
        """Remove the staging directory and whatever it holds."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, str):  # str enums (Status)
        return str(o)
    raise TypeError(f"cannot write {type(o).__name__} to JSON")


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON (NumPy scalars and arrays become numbers and lists)."""
    path = Path(path)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n", encoding="utf-8")
    return path
