r"""Checkpoint files of :func:`~transformer_pde.simulate`: codec, run identity, integrity.

A checkpoint is an NPZ archive (a zip of ``.npy`` members) written by
:class:`CheckpointWriter` and read back by :func:`read_checkpoint`:

* ``meta``: JSON text ``{"format": "transformer-pde-checkpoint", "version": 2,
  "digest_algorithm": "sha256", "body": {...}, "body_digest": ...}``.  The body holds
  ``run`` (the identity of the run, see below), ``state`` (the plain, versioned data of
  the loop, the solver, the field evaluator and the saver, encoded by :func:`encode`)
  and ``arrays`` (the SHA-256 of every other member,
  :func:`~transformer_pde.io.digests.array_digest`); ``body_digest`` is the
  :func:`~transformer_pde.io.digests.json_digest` of the body.
* ``a0``, ``a1``, ...: the arrays of the state.

**Identity of a run.**  :class:`RunIdentity` holds what determines a run as plain
fields: ``static`` descriptions compared for equality (scalars by ``repr``, arrays by
SHA-256; what a particle run records is listed by
:func:`transformer_pde.particles.identity.run_identity`), callables of time compared by
their values at *probe times* (0, the loop time of the checkpoint, up to ``MAX_PROBES``
of the times saved so far, the stage times of the first, the last and of evenly spread
attempted steps (:class:`~.state.EvaluationTimes`: the times the field was evaluated at,
:math:`t_n + c_i h`) and, for a resumed run, the probe times of the checkpoint it resumed
from), and the run's :class:`~transformer_pde.Limits` apart.  The part of the run a
checkpoint holds was computed with those values, so a resumed run whose callables agree
there continues the same computation; a callable that differs only between all these
times cannot be told apart (no finite set of samples can).
(:meth:`RunIdentity.differences` says which differences are safe.)

**Reading.**  :func:`read_checkpoint` first checks the file (an NPZ archive of this
format and a known version, the body's digest, every array's digest: any edit,
truncation or flipped byte is an :class:`~transformer_pde.errors.IntegrityError` naming
the file), then the run (a different run is a :class:`~transformer_pde.errors.CheckpointError`
naming every field that differs), and only then decodes the state; the caller checks the
restored loop state against the run (:func:`~.state.check_resumed`).

**Writing.**  :func:`check_path` refuses, before a run starts, a path that could not be
written or must not be replaced (a folder, a device, a missing or read-only folder, an
existing file that is not a checkpoint).  :class:`CheckpointWriter` writes beside the
target and renames over it; a write that fails during or at the end of a run issues a
:class:`~transformer_pde.errors.CheckpointWarning` and the run goes on.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, CheckpointWarning, IntegrityError
from ..io.container import write_npz
from ..io.digests import DIGEST_ALGORITHM, array_digest, json_digest, verify_array
from ..io.jsonfmt import dumps
from .loop import owned
from .state import EvaluationTimes

__all__ = ["FORMAT", "VERSION", "CheckpointWriter", "RunIdentity", "check_path", "decode",
           "encode", "is_checkpoint", "read_checkpoint", "value_digest", "write_checkpoint"]

#: format marker in the metadata of every checkpoint
FORMAT = "transformer-pde-checkpoint"
#: version of the checkpoint format written (and the only one read)
VERSION = 2
#: at most this many saved times (besides 0 and the checkpoint's time) probe callables
MAX_PROBES = 30
#: at most this many probe times of a checkpoint a resumed run carries into its own
MAX_CARRIED = 512


# ------------------------------------------------------------------ codec
def encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON description of plain data ``obj``, its arrays moved into ``arrays`` (exact).

    ``obj`` may nest ``None``, bools, ints, floats (kept bit for bit, also ``-0.0``, NaN
    and infinities), strings, NumPy scalars, NumPy or CuPy arrays, lists, tuples and dicts
    (any such keys).  Anything else is a ``TypeError``: objects are never stored."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return {"v": obj}
    if isinstance(obj, float):
        return {"f": repr(obj)}
    if isinstance(obj, np.generic):
        if obj.dtype.hasobject:
            raise TypeError("cannot checkpoint a NumPy object scalar")
        return {"np": obj.dtype.str, "a": encode(np.asarray(obj), arrays)}
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        on_gpu = not isinstance(obj, np.ndarray)
        host = obj.get() if on_gpu else obj
        if host.dtype.hasobject:
            raise TypeError("cannot checkpoint an array of Python objects")
        key = f"a{len(arrays)}"
        arrays[key] = host
        return {"arr": key, "gpu": on_gpu}
    if isinstance(obj, (list, tuple)):
        return {"list" if isinstance(obj, list) else "tuple": [encode(x, arrays) for x in obj]}
    if isinstance(obj, dict):
        return {"dict": [[encode(k, arrays), encode(v, arrays)] for k, v in obj.items()]}
    cls = type(obj)
    raise TypeError(f"cannot checkpoint an object of type {cls.__module__}.{cls.__qualname__} "
                    "(state data must be plain: numbers, strings, arrays, lists, dicts)")


def decode(desc: Any, arrays: Any, asarray: Callable[[np.ndarray], Any]) -> Any:
    """Inverse of :func:`encode`; ``asarray`` moves arrays that were on a GPU back there.

    Raises ``ValueError`` (or ``KeyError``/``TypeError``) on a description :func:`encode`
    does not write."""
    if not isinstance(desc, dict) or len(desc) not in (1, 2):
        raise ValueError(f"bad checkpoint entry {str(desc)[:60]}")
    if "v" in desc:
        v = desc["v"]
        if v is not None and not isinstance(v, (bool, int, str)):
            raise ValueError(f"bad checkpoint value {v!r}")
        return v
    if "f" in desc:
        return float(desc["f"])
    if "np" in desc:
        return np.asarray(decode(desc["a"], arrays, asarray)).astype(desc["np"])[()]
    if "arr" in desc:
        a = arrays[desc["arr"]]
        return asarray(a) if desc["gpu"] else a
    if "list" in desc:
        return [decode(x, arrays, asarray) for x in desc["list"]]
    if "tuple" in desc:
        return tuple(decode(x, arrays, asarray) for x in desc["tuple"])
    if "dict" in desc:
        return {decode(k, arrays, asarray): decode(v, arrays, asarray) for k, v in desc["dict"]}
    raise ValueError(f"unknown checkpoint entry {str(desc)[:60]}")


# ------------------------------------------------------------------ identity of a run
def value_digest(value: Any) -> str:
    """SHA-256 of a callable's value (an array, or numbers as a float array)."""
    a = np.asarray(value)
    if a.dtype.hasobject:
        a = np.asarray(value, dtype=float)
    return array_digest(a)


def _spread(times: Sequence[float], n: int) -> list[float]:
    """At most ``n`` of the sorted ``times``, evenly spread, the first and last kept."""
    a = np.asarray(times, dtype=float)
    if a.size > n:
        a = a[np.unique(np.rint(np.linspace(0, a.size - 1, n)).astype(int))]
    return [float(s) for s in a]


class RunIdentity:
    """Everything that determines a run, as compared by checkpoints (see the module
    docstring).

    Parameters
    ----------
    static : dict of str to str
        Field name to a description (scalars by ``repr``, arrays by SHA-256).
    callables : dict of str to callable ``t -> array``
        Parameters that are functions of time, compared by their values at probe times.
    limits : dict, optional
        ``max_norm``, ``max_steps``, ``max_memory`` of the run's
        :class:`~transformer_pde.Limits` (``None``: not compared).

    Attributes
    ----------
    evaluations : EvaluationTimes
        Filled by the time loop (:attr:`~.loop.TimeLoop.evaluations`): the stage times at
        which the callables are probed besides the saved times.
    carried : list of float
        The probe times of the checkpoint this run resumed from (its callables agreed
        there); later checkpoints probe them too.
    unchecked : list of str
        What :meth:`differences` could not compare (a checkpoint of an earlier version).
    """

    def __init__(self, static: dict[str, str], callables: dict[str, Callable[[float], Any]],
                 limits: dict[str, Any] | None = None):
        self.static = dict(static)
        self.callables = dict(callables)
        self.limits = None if limits is None else dict(limits)
        self.evaluations = EvaluationTimes()
        self.carried: list[float] = []
        self.unchecked: list[str] = []

    def probe_times(self, saved_times: Sequence[float], t: float) -> list[float]:
        """0, ``t``, up to ``MAX_PROBES`` of ``saved_times`` up to ``t`` (evenly
        spread), the stage times of :attr:`evaluations` and the :attr:`carried` times."""
        saved = _spread([s for s in saved_times if s <= t], MAX_PROBES)
        return sorted({0.0, float(t), *saved, *self.evaluations.times(), *self.carried})

    def probe(self, times: Sequence[float]) -> dict[str, str]:
        """Digest of each callable's values at ``times`` (a failure is recorded as such)."""
        out = {}
        for name, fn in sorted(self.callables.items()):
            try:
                out[name] = json_digest([value_digest(fn(float(s))) for s in times])
            except Exception as exc:   # a failing callable differs from a working one
                if not owned(exc):   # a caller's timeout, out of memory: not the callable's
                    raise
                out[name] = f"raised {type(exc).__name__}"
        return out

    def record(self, saved_times: Sequence[float], t: float) -> dict[str, Any]:
        """What a checkpoint at loop time ``t`` stores about the run."""
        times = self.probe_times(saved_times, t)
        out = {"static": dict(self.static), "probe_times": times, "probes": self.probe(times)}
        if self.limits is not None:
            out["limits"] = dict(self.limits)
        return out

    def differences(self, recorded: Any) -> list[str]:
        """Names of the fields in which ``recorded`` (a :meth:`record`) differs from this run.

        Static fields must be equal, callables equal at the recorded probe times.  Of the
        limits only ``max_norm`` is compared, and a larger one is accepted: the run stops
        at the first state above ``max_norm`` and writes no checkpoint after it, so every
        state a checkpoint holds is below the recorded ``max_norm`` and a run with a larger
        one reaches the same checkpoint.  ``max_steps`` is compared with the checkpoint's
        step count when its loop state is restored, and ``max_memory`` never changes a
        state (it is checked before the run).  A record without limits (an earlier
        version) fills :attr:`unchecked`."""
        if not isinstance(recorded, dict):
            return ["run"]
        old = recorded.get("static")
        old = old if isinstance(old, dict) else {}
        diff = {k for k in set(old) | set(self.static) if old.get(k) != self.static.get(k)}
        times = recorded.get("probe_times")
        probes = recorded.get("probes")
        if not isinstance(times, list) or not isinstance(probes, dict) \
                or not all(isinstance(s, (int, float)) for s in times):
            return sorted(diff | {"probe_times"})
        new = self.probe(times)
        diff |= {k for k in set(probes) | set(new) if probes.get(k) != new.get(k)}
        self.unchecked = []
        if self.limits is not None:
            lim = recorded.get("limits")
            if lim is None:
                self.unchecked = ["limits"] + (["callables between the probe times"]
                                               if self.callables else [])
            elif not isinstance(lim, dict) or not isinstance(lim.get("max_norm"), (int, float)) \
                    or isinstance(lim.get("max_norm"), bool):
                diff.add("limits")
            elif lim["max_norm"] > self.limits["max_norm"]:
                diff.add("limits.max_norm")
        return sorted(diff)

    def explain(self, recorded: Any, names: Sequence[str]) -> list[str]:
        """``names`` with both values where they are short scalars, e.g.
        ``"dt (0.1 in the checkpoint, 0.05 now)"`` (arrays and callables by name only)."""
        old = recorded.get("static") if isinstance(recorded, dict) else None
        old = old if isinstance(old, dict) else {}
        out = []
        for name in names:
            if name == "limits.max_norm":
                was = recorded["limits"]["max_norm"]
                out.append(f"limits.max_norm ({was:g} in the checkpoint, {self.limits['max_norm']:g} "
                           "now: a lower max_norm may stop before states the checkpoint holds)")
                continue
            a, b = old.get(name), self.static.get(name)
            short = all(isinstance(v, str) and len(v) <= 40 and "sha256:" not in v
                        and not v.startswith("callable ") for v in (a, b))
            out.append(f"{name} ({a} in the checkpoint, {b} now)" if short else name)
        return out


# ------------------------------------------------------------------ files
def _where(path: Path) -> str:
    return f"checkpoint {path}"


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a readable file whose metadata carries this library's checkpoint
    format marker (any version; nothing else is checked)."""
    path = Path(path)
    try:
        if not path.is_file() or not zipfile.is_zipfile(path):
            return False
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
        return isinstance(meta, dict) and meta.get("format") == FORMAT
    except Exception:  # noqa: BLE001 - any failure to read the marker: not a checkpoint
        return False


def check_path(path: str | os.PathLike, *, resume: bool) -> None:
    """Refuse, before a run starts, a checkpoint path that cannot or must not be written.

    The path must not be a folder or a special file (device, pipe, socket); its folder
    must exist and accept a new file; an existing file there must be a checkpoint of
    this library (it is then replaced by the run's checkpoints), except with ``resume``,
    where :func:`read_checkpoint` examines it.

    Raises
    ------
    CheckpointError
        The message names the path and what is wrong.
    """
    path = Path(path)
    where = f"checkpoint={str(path)!r}"
    if path.is_dir():
        raise CheckpointError(f"{where} is a folder, not a file; give a file path such as "
                              f"{str(path / 'run.ckpt')!r}")
    if os.path.lexists(path) and not path.is_file():
        kind = "a broken symbolic link" if not path.exists() else \
            "a special file (device, pipe or socket)"
        raise CheckpointError(f"{where} is {kind}, not a regular file; checkpoints are "
                              "written to a new file renamed over the path: choose a file path")
    folder = path.parent
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise CheckpointError(f"{where}: its folder {str(folder)!r} {what}; create it first")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot create a file in the folder {str(folder)!r} "
                              f"({exc.strerror or exc}); choose a writable folder") from None
    os.close(fd)
    Path(probe).unlink(missing_ok=True)
    if path.exists() and not resume and not is_checkpoint(path):
        raise CheckpointError(f"{where} exists and is not a transformer-pde checkpoint; "
                              "refusing to overwrite it: remove it or choose another path")


def write_checkpoint(path: str | os.PathLike, run: dict[str, Any], state: dict[str, Any]) -> None:
    """Write a checkpoint atomically: to a hidden temporary file beside ``path``, renamed over it.

    ``run`` is :meth:`RunIdentity.record`'s data, ``state`` the plain data of the parts of
    the run (see :func:`encode`).  A failure (also Ctrl-C) during the write removes the
    temporary file and leaves a previous checkpoint intact; the exception propagates."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    body = {"run": run, "state": encode(state, arrays)}
    body["arrays"] = {k: array_digest(v) for k, v in arrays.items()}
    meta = {"format": FORMAT, "version": VERSION, "digest_algorithm": DIGEST_ALGORITHM,
            "body": body, "body_digest": json_digest(body)}
    arrays["meta"] = np.array(dumps(meta))
    write_npz(path, arrays)


def _member(z: Any, path: Path, key: str) -> np.ndarray:
    try:
        return z[key]
    except KeyError:
        raise IntegrityError(f"{_where(path)}: missing array {key!r} (the file was edited "
                             "or is corrupt)") from None
    except Exception as exc:  # noqa: BLE001 - corrupt member: BadZipFile, zlib.error, ValueError, EOFError
        raise IntegrityError(f"{_where(path)}: array {key!r} is unreadable (truncated or "
                             f"corrupt file: {type(exc).__name__}: {exc})") from None


def read_checkpoint(path: str | os.PathLike, identity: RunIdentity,
                    asarray: Callable[[np.ndarray], Any]) -> dict[str, Any]:
    """Read a checkpoint of the run ``identity``: the decoded ``state`` given to
    :func:`write_checkpoint`.

    Raises
    ------
    IntegrityError
        The file is not a checkpoint of this library, of an unknown format version,
        truncated, corrupt or edited (the body or an array does not match its SHA-256);
        the message names the file.
    CheckpointError
        A checkpoint of another run; the message names every field that differs.
    FileNotFoundError
        No such file.

    Warns
    -----
    CheckpointWarning
        A checkpoint of an earlier version that did not record the run's limits and stage
        times (:attr:`RunIdentity.unchecked`): it is resumed, and the warning says what
        could not be compared.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{_where(path)}: no such file")
    if not path.is_file():
        raise IntegrityError(f"{_where(path)} is not a regular file")
    if not zipfile.is_zipfile(path):
        raise IntegrityError(f"{_where(path)} is not a transformer-pde checkpoint (not an NPZ "
                             "archive: truncated, corrupt or another kind of file)")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, ValueError, EOFError
        raise IntegrityError(f"{_where(path)} is not readable (truncated or corrupt archive: "
                             f"{type(exc).__name__}: {exc})") from None
    with z:
        text = str(_member(z, path, "meta"))
        try:
            meta = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise IntegrityError(f"{_where(path)}: metadata is not JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IntegrityError(f"{_where(path)} is not a transformer-pde checkpoint "
                                 f"(metadata format is not {FORMAT!r})")
        version = meta.get("version")
        if version != VERSION or isinstance(version, bool):
            raise IntegrityError(
                f"{_where(path)} has format version {version!r}, but this transformer-pde "
                f"reads version {VERSION} only; start afresh (resume=False) or use the "
                "version that wrote it")
        body = meta.get("body")
        if meta.get("digest_algorithm") != DIGEST_ALGORITHM or not isinstance(body, dict) \
                or meta.get("body_digest") != json_digest(body):
            raise IntegrityError(f"{_where(path)}: metadata does not match its checksum (the "
                                 "file was edited or is corrupt)")
        digests = body.get("arrays")
        if not isinstance(digests, dict) or set(z.files) != set(digests) | {"meta"}:
            raise IntegrityError(f"{_where(path)}: the arrays stored differ from those "
                                 "recorded (the file was edited or is corrupt)")
        arrays = {k: verify_array(_member(z, path, k), d, what=k, source=_where(path))
                  for k, d in digests.items()}
    diff = identity.differences(body.get("run"))
    if diff:
        raise CheckpointError(
            f"checkpoint {path} comes from a different run: "
            f"{', '.join(identity.explain(body.get('run'), diff))} differ; "
            "resume with the same attention, tokens, solver, t_max, dt, saveat, block "
            "and field options, or start afresh (resume=False)")
    identity.carried = _spread(body["run"]["probe_times"], MAX_CARRIED)
    if identity.unchecked:
        warnings.warn(CheckpointWarning(
            f"checkpoint {path} was written by an earlier transformer-pde, which did not "
            f"record {' nor '.join(identity.unchecked)}: it resumes, but max_norm is "
            "checked against its saved states only" + (
                ", and callables of time were compared at its saved times only"
                if identity.callables else "")), stacklevel=4)   # the caller of simulate
    try:
        state = decode(body["state"], arrays, asarray)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise IntegrityError(f"{_where(path)}: corrupt state ({exc!r})") from None
    if not isinstance(state, dict):
        raise IntegrityError(f"{_where(path)}: corrupt state (not a mapping)")
    return state


class CheckpointWriter:
    """Write the checkpoints of one run; a failed write warns instead of ending the run.

    Parameters
    ----------
    path : Path
        The checkpoint file.
    identity : RunIdentity
    collect : callable ``collect(loop_state) -> (state, saved_times)``
        The plain data of the run's parts, and the times saved so far (probe times).

    Calling the writer with a :class:`~.loop.LoopState` writes a checkpoint and returns
    whether it was written.  Any failure (``OSError`` such as a full disk or a folder
    removed mid-run, a callable failing, data that cannot be stored) issues one
    :class:`~transformer_pde.errors.CheckpointWarning` naming the path and the reason
    (the first time) and leaves the previous checkpoint in place; ``KeyboardInterrupt``
    and the exceptions a run does not own (:func:`~.loop.owned`: a caller's timeout)
    propagate, the previous checkpoint again intact.  ``failures`` counts the failed
    writes.
    """

    def __init__(self, path: Path, identity: RunIdentity,
                 collect: Callable[[Any], tuple[dict[str, Any], Sequence[float]]]):
        self.path, self.identity, self.collect = Path(path), identity, collect
        self.failures = 0

    def __call__(self, loop_state: Any) -> bool:
        try:
            state, saved_times = self.collect(loop_state)
            write_checkpoint(self.path, self.identity.record(saved_times, loop_state.t), state)
        except Exception as exc:   # a failed checkpoint must not discard the run
            if not owned(exc):   # a caller's timeout: the previous checkpoint stays whole
                raise
            self.failures += 1
            if self.failures == 1:
                warnings.warn(CheckpointWarning(
                    f"checkpoint {self.path} could not be written at t={loop_state.t:.6g} "
                    f"({type(exc).__name__}: {exc}); the run goes on and its result is "
                    "returned, but it cannot be resumed from this write"), stacklevel=2)
            return False
        return True
