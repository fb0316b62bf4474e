"""Where a command writes its files: checked before the run, filled in a staging
directory, moved into place only when the command succeeds.

Rules (documented in ``transformer-pde --help``):

* ``--out DIR`` must be a new directory or an empty one; an existing directory with
  files in it is refused unless ``--force`` is given, and then only the files of the same
  names are replaced (the others are left alone).  Outputs are never overwritten silently.
* ``DIR`` is checked before anything is computed (a file, a path under a file, a
  directory without write permission are refused at once).
* ``DIR`` is claimed for the run: it is created at once (``os.mkdir``, atomic) and a lock
  file :data:`LOCK_NAME` holding the run's process id is created in it with
  ``O_CREAT | O_EXCL``; a second run given the same ``DIR`` while the first one lives is
  refused (naming ``DIR`` and the first run's process id).  The lock of a run that was
  killed (its process is gone) is taken over.
* Files are written into a hidden staging directory inside ``DIR``, whose name holds the
  owning process id and host, and moved into ``DIR`` at the end; a run that fails or is
  interrupted without a result leaves neither ``DIR`` (when it created it) nor the staging
  directory behind.  Staging directories left by a killed run (SIGKILL: no clean-up) are
  removed by the next run in the same place, once their process is gone.

**Data files** (``--format``): a command's numbers are written as a labelled netCDF file
(``netcdf``, the default: named dimensions, the run's parameters and status as
attributes, CF ``long_name``/``units``/``flag_meanings``, checksums; read it with
:func:`transformer_pde.io.labelled.open_dataset` or ``xarray.open_dataset``), a Zarr
store (``zarr``) or, on request, a checksummed NPZ archive (``npz``).  Without the
``[io]`` extra (xarray, h5netcdf, zarr) a labelled format falls back to NPZ with a
one-line notice.  Every data file records the package version and a ``history`` line
naming the command (:func:`transformer_pde.io.labelled.provenance`, the function that
``ParticleTrajectory.save`` uses too): CF global attributes of a labelled file, the JSON
entry ``provenance`` of an NPZ archive.  Every JSON file is strict JSON: NaN and
infinities are ``null``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import TransformerPDEError
from ..io.container import save_npz
from ..io.jsonfmt import dumps
from ..io.labelled import provenance, save_dataset

__all__ = ["DATA_FORMATS", "IO_EXTRA_HINT", "LOCK_NAME", "STAGING_PREFIX", "OutputDir",
           "OutputError", "check_out", "data_format", "path_problem", "remove_stale_staging",
           "write_json"]

#: the formats of a command's data file (``--format``), the first the default
DATA_FORMATS = ("netcdf", "zarr", "npz")
_SUFFIXES = {"netcdf": ".nc", "zarr": ".zarr", "npz": ".npz"}
_FORMAT_MODULES = {"netcdf": ("xarray", "h5netcdf"), "zarr": ("xarray", "zarr")}
#: how to install the labelled formats (named by the fallback notice)
IO_EXTRA_HINT = 'pip install "transformer-pde[io]"'

#: name prefix of the staging directories: ``<prefix><pid>.<host>.<random>``
STAGING_PREFIX = ".transformer-pde-partial-"
#: the lock file that claims an output directory for one run (holds ``<pid> <host>``)
LOCK_NAME = ".transformer-pde-lock"
#: a lock file still empty after this many seconds is a leftover (its writer died between
#: creating and filling it)
_EMPTY_LOCK_GRACE = 10.0


def _host() -> str:
    """A short, file-name safe identity of this machine (process ids are per machine)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


_STAGING_RE = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)\.([0-9a-f]{8})\.")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return True
    try:  # a killed child not yet reaped by its parent still answers kill(pid, 0)
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale_staging(directory: str | Path) -> list[Path]:
    """Remove the staging directories in ``directory`` left by runs of this machine whose
    process is gone (killed by SIGKILL, or a crash of the interpreter); returns them.

    Staging directories of live processes, of other machines, and directories whose name
    does not carry a process id are left alone.
    """
    removed = []
    host = _host()
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _STAGING_RE.match(entry.name)
        if m is None or m.group(2) != host or _alive(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class OutputError(TransformerPDEError, OSError):
    """The output directory cannot be used (the message names ``--out``)."""


def data_format(fmt: str | None = None, *, notice: bool = True) -> str:
    """The data format to write: ``fmt`` (one of :data:`DATA_FORMATS`; ``None`` is
    ``"netcdf"``), or ``"npz"`` when the modules of a labelled format are not installed;
    then a one-line notice naming :data:`IO_EXTRA_HINT` goes to stderr (``notice``)."""
    fmt = DATA_FORMATS[0] if fmt is None else fmt
    if fmt not in DATA_FORMATS:
        raise OutputError(f"--format: expected one of {', '.join(DATA_FORMATS)}, got {fmt!r}")
    missing = [m for m in _FORMAT_MODULES.get(fmt, ()) if importlib.util.find_spec(m) is None]
    if not missing:
        return fmt
    if notice:
        sys.stderr.write(f"transformer-pde: {fmt} output needs {', '.join(missing)} (the [io] "
                         f"extra: {IO_EXTRA_HINT}); writing NPZ instead\n")
    return "npz"


#: the limits of POSIX file names where the system does not say (``NAME_MAX``, ``PATH_MAX``)
_NAME_MAX, _PATH_MAX = 255, 4096


def _pathconf(path: str, name: str, default: int) -> int:
    """``os.pathconf(path, name)`` of the nearest existing folder of ``path``, or
    ``default`` where the system does not say."""
    folder = os.path.dirname(path) or os.sep
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        value = os.pathconf(folder, name)
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no answer
        return default
    return value if value and value > 0 else default


def _shown(text: str) -> str:
    """``text`` for a one-line message: at most 40 characters (a long name abbreviated)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file or folder on this system, or ``None``: an empty
    string, a NUL character, a component longer than the file system's ``NAME_MAX``
    bytes (255 on most), or a path longer than ``PATH_MAX`` bytes (4096 on Linux) once
    made absolute.  The command line checks every path option with it, so that such a
    path is a one-line usage error naming the option instead of an ``OSError``."""
    if text == "":
        return "expected a path, got an empty string"
    if "\0" in text:
        return "a path cannot contain a NUL character"
    full = os.path.abspath(text)
    name_max = _pathconf(full, "PC_NAME_MAX", _NAME_MAX)
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            return (f"the name {_shown(part)} is {size} bytes long, more than the {name_max} "
                    "bytes a file name may have here")
    size, path_max = len(os.fsencode(full)), _pathconf(full, "PC_PATH_MAX", _PATH_MAX)
    if size >= path_max:
        return (f"the path {_shown(text)} is {size} bytes long (made absolute), more than "
                f"the {path_max - 1} bytes a path may have here")
    return None


def _existing_ancestor(path: Path) -> Path:
    """The nearest existing path among ``path``'s parents (a file or a directory)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path(path.absolute().anchor)


def check_out(path: str | Path, option: str = "--out") -> Path:
    """Refuse, as an :class:`OutputError` naming ``option``, an output directory that
    cannot be one -- before anything is computed or created: a path this system cannot
    use (:func:`path_problem`), an existing file, a path under a file; an ``OSError`` while
    looking (a loop of links, no permission to look) is said in words.  Returns the path."""
    text = str(path)
    p = Path(path)

    def fail(reason: str) -> OutputError:
        return OutputError(f"{option} {text}: {reason}")

    problem = path_problem(text)
    if problem is not None:
        raise fail(problem)
    try:
        exists = p.exists()
        base = p if exists else _existing_ancestor(p)
        is_dir = base.is_dir()
    except OSError as exc:  # a loop of links, no permission to look, ...
        raise fail(f"cannot be used: {exc.strerror or exc}") from None
    if not is_dir:
        raise fail("exists and is not a directory" if exists else f"{base} is not a directory")
    return p


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
        self._text = str(path)  # as given: Path("") would be "."
        self.final = Path(path)
        self.force = bool(force)
        self.replaceable = replaceable
        self.option = option
        self.staging: Path | None = None
        self.committed: list[Path] = []
        self._lock: Path | None = None
        self._made: list[Path] = []  # directories created by this run (parents first)
        self._open()

    def _fail(self, reason: str) -> OutputError:
        return OutputError(f"{self.option} {self.final}: {reason}")

    def _open(self) -> None:
        p = self.final
        check_out(self._text, self.option)
        try:
            self._claim()
            remove_stale_staging(p)
            if (not self.force and any(q.name != LOCK_NAME for q in p.iterdir())
                    and not (self.replaceable is not None and self.replaceable(p))):
                raise self._fail("exists and is not empty; pass --force to replace the files "
                                 "of the same names in it, or choose a new directory")
            try:
                self.staging = Path(tempfile.mkdtemp(
                    prefix=f"{STAGING_PREFIX}{os.getpid()}.{_host()}.", dir=p))
            except PermissionError:
                raise self._fail(f"permission denied: cannot create files in {p}") from None
            except OSError as exc:
                raise self._fail(f"cannot create files in {p}: "
                                 f"{exc.strerror or exc}") from None
        except BaseException:
            self._release()
            raise

    def _claim(self) -> None:
        """Create ``final`` (when new) and its lock file, atomically: of two runs started
        together with the same new directory, exactly one gets it."""
        p = self.final
        try:
            for q in reversed([p.absolute(), *p.absolute().parents]):
                if q.is_dir():
                    continue
                try:
                    os.mkdir(q)  # atomic: of two runs, one creates it
                    self._made.append(q)
                except FileExistsError:
                    if not q.is_dir():
                        raise self._fail(f"{q} exists and is not a directory") from None
        except OutputError:
            raise
        except PermissionError:
            raise self._fail(f"permission denied: cannot create {p}") from None
        except OSError as exc:
            raise self._fail(f"cannot create it: {exc.strerror or exc}") from None
        lock = p / LOCK_NAME
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._owner(lock)
                if owner is not None:
                    raise self._fail(f"is in use by another transformer-pde run ({owner}); "
                                     "wait for it to end or choose another directory") from None
                continue  # a dead run's lock was taken away: try again
            except PermissionError:
                raise self._fail(f"permission denied: cannot create files in {p}") from None
            except OSError as exc:
                raise self._fail(f"cannot create files in {p}: "
                                 f"{exc.strerror or exc}") from None
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(f"{os.getpid()} {_host()}\n")
            self._lock = lock
            return
        raise self._fail("is being claimed by other transformer-pde runs; try again")

    def _owner(self, lock: Path) -> str | None:
        """Who holds ``lock`` (``"process 1234"``), or None after removing the lock of a run
        that is gone.  A lock of another machine, or one being written, counts as held."""
        try:
            text = lock.read_text(encoding="ascii", errors="replace")
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"unknown: its lock {lock} is unreadable ({exc.strerror or exc})"
        fields = text.split()
        valid = len(fields) == 2 and fields[0].isdigit()
        if not valid and age < _EMPTY_LOCK_GRACE:
            return "a run that is starting"
        if valid and fields[1] != _host():
            return f"process {fields[0]} of another machine"
        if valid and _alive(int(fields[0])):
            return f"process {fields[0]}"
        # the owner is gone: move its lock aside (atomic: of two runs doing this at once,
        # one succeeds) and check that what moved is the dead run's lock
        aside = lock.with_name(f"{LOCK_NAME}.stale.{os.getpid()}")
        try:
            os.rename(lock, aside)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"unknown: its stale lock {lock} cannot be removed ({exc.strerror or exc})"
        try:
            moved = aside.read_text(encoding="ascii", errors="replace")
        except OSError:
            moved = text
        if moved != text:  # a live run's fresh lock: give it back
            try:
                os.rename(aside, lock)
            except OSError:
                pass
            return f"process {moved.split()[0]}" if moved.split() else "a run that is starting"
        aside.unlink(missing_ok=True)
        return None

    def _release(self) -> None:
        """Remove the lock file, and the directories this run created (``final`` and its
        missing parents) while they are empty."""
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
            self._lock = None
        made, self._made = self._made, []
        for q in reversed(made):
            try:
                q.rmdir()  # only when empty
            except OSError:
                break

    # ------------------------------------------------------------------ writing
    def path(self, name: str) -> Path:
        """Where to write the output file ``name`` (inside the staging directory)."""
        if self.staging is None:
            raise RuntimeError("the output directory was already committed or discarded")
        return self.staging / name

    def write_json(self, name: str, data: dict) -> Path:
        return write_json(self.path(name), data)

    def write_data(self, stem: str, fmt: str, dataset: Callable[[], Any],
                   arrays: Callable[[], dict]) -> str:
        """Write a command's data file ``stem.nc`` / ``stem.zarr`` (``dataset()``, an
        :class:`xarray.Dataset`, through :func:`~transformer_pde.io.labelled.save_dataset`)
        or ``stem.npz`` (``arrays()``, a checksummed NPZ) for the format ``fmt`` (from
        :func:`data_format`); returns the file's name.  ``stem`` is the command's name: the
        file's ``history`` says ``transformer-pde <stem>``
        (:func:`~transformer_pde.io.labelled.provenance`; in an NPZ, the JSON entry
        ``provenance``)."""
        name = stem + _SUFFIXES[fmt]
        made_by = f"transformer-pde {stem}"
        if fmt == "npz":
            save_npz(self.path(name), {**arrays(),
                                       "provenance": np.array(dumps(provenance(made_by)))})
        else:
            save_dataset(dataset(), self.path(name), made_by=made_by)
        return name

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
            if src.is_dir() and dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)  # a Zarr store of an earlier run (--force)
            os.replace(src, dst)
            self.committed.append(dst)
        self._made = []  # the directories hold the run's result now: kept
        self.discard()
        return self.committed

    def discard(self) -> None:
        """Remove the staging directory and whatever it holds, release the claim on the
        final directory, and remove that directory when this run created it and nothing
        else was written into it."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        self._release()

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented, strict JSON (:func:`transformer_pde.io.jsonfmt.dumps`
    with ``strict=True``: NumPy scalars and arrays become numbers and lists, paths
    strings, enums their values, NaN and infinities ``null``)."""
    path = Path(path)
    path.write_text(dumps(data, indent=2, strict=True) + "\n", encoding="utf-8")
    return path
