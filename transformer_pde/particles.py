r"""Interacting-particle engine: evolve empirical token measures under an attention flow.

For tokens :math:`X_i(t)` with weights :math:`w_i`, :func:`simulate` integrates

.. math:: \dot X_i = \Gamma_{\mu_t}(X_i), \qquad \mu_t = \sum_j w_j \delta_{X_j(t)},

where :math:`\Gamma` is the attention velocity field (:func:`velocity`; conventions in
``docs/conventions.md``).  Depth is time: one explicit Euler step of size 1 is one
residual attention layer.  The options of a run are grouped by concern: the solver
object (:mod:`transformer_pde.integrate`), what to save (:class:`SaveAt`), the block
composition (:class:`~transformer_pde.blocks.Block`), the field evaluation
(:class:`FieldOptions`), when to stop (:class:`Limits`) and reporting / checkpoints
(:class:`Monitor`).  The result is a :class:`ParticleTrajectory` that can be saved to
and loaded from NPZ.
"""

from __future__ import annotations

import json
import logging
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .attention import Attention
from .blocks import Block, BlockStepper
from .errors import ArgumentError, ArgumentTypeError, IntegrityError, TrajectoryFileError
from .fields import FieldEvaluator, velocity
from .integrate.breakpoints import layer_tables
from .integrate.checkpoint import CheckpointWriter, RunIdentity, check_path, read_checkpoint
from .integrate.loop import Limits, LoopState, Monitor, SaveAt, TimeLoop
from .integrate.loop import Progress
from . import labelled
from .integrate.solvers import get_solver
from .integrity import DIGEST_ALGORITHM, array_digest, check_version, verify_array, write_npz
from .results import ResultKind, Status, warn_stop
from .validation import points, positive

__all__ = ["FieldOptions", "Limits", "Monitor", "NPZ_FORMAT_VERSION", "ParticleTrajectory",
           "SaveAt", "TrajectoryFileError", "load", "simulate", "velocity"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ options
@dataclass(frozen=True, eq=False)
class FieldOptions:
    """How the attention field is evaluated.

    Parameters
    ----------
    backend : {"auto", "numpy", "numba", "cupy"} or backend object, default "auto"
        Where fields are computed; the state stays on that backend between steps and only
        saved states are copied to the host.  ``"auto"`` picks the fastest installed
        backend for the number of tokens (NumPy below 64 tokens).
    dtype : {float32, float64}, optional
        Working precision; default that of ``X0`` (float32 stays float32, anything else
        runs in float64).
    sinkhorn_tol, sinkhorn_max_iter : float, int, optional
        Inner Sinkhorn solve controls (defaults 1e-9 and 2000; warm-started from the
        previous evaluation).  Only for ``kind="sinkhorn"``: an error otherwise.
    """

    backend: Any = "auto"
    dtype: Any = None
    sinkhorn_tol: float | None = None
    sinkhorn_max_iter: int | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            raise ArgumentTypeError("backend must be a backend name or object, got None")
        if self.dtype is not None:
            try:
                dt = np.dtype(self.dtype)
            except TypeError:
                raise ArgumentTypeError(f"dtype must be float32 or float64, got {self.dtype!r}") from None
            if dt not in (np.float32, np.float64):
                raise ArgumentError(f"dtype must be float32 or float64, got {dt}")
            object.__setattr__(self, "dtype", dt)
        if self.sinkhorn_tol is not None:
            v = self.sinkhorn_tol
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ArgumentTypeError(f"sinkhorn_tol must be a real number, got {v!r}")
            if not (math.isfinite(v) and v > 0):
                raise ArgumentError(f"sinkhorn_tol must be finite and > 0, got {v!r}")
        if self.sinkhorn_max_iter is not None:
            v = self.sinkhorn_max_iter
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentTypeError(f"sinkhorn_max_iter must be an integer, got {v!r}")
            if v < 1:
                raise ArgumentError(f"sinkhorn_max_iter must be >= 1, got {v!r}")

    def check(self, att: Attention) -> None:
        """Refuse options that do not apply to ``att``."""
        if att.kind != "sinkhorn":
            for name in ("sinkhorn_tol", "sinkhorn_max_iter"):
                if getattr(self, name) is not None:
                    raise ArgumentError(f"FieldOptions({name}=...) applies only to "
                                        f"kind='sinkhorn', not to kind={att.kind!r}")

    def evaluator_kwargs(self) -> dict[str, Any]:
        return {"backend": self.backend,
                "sinkhorn_tol": 1e-9 if self.sinkhorn_tol is None else float(self.sinkhorn_tol),
                "sinkhorn_max_iter": 2000 if self.sinkhorn_max_iter is None
                else int(self.sinkhorn_max_iter)}


# ------------------------------------------------------------------ result
def weighted_moments(states: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Means :math:`m = \sum_i w_i x_i` (T, d) and covariances
    :math:`\Sigma = \sum_i w_i (x_i - m)(x_i - m)^\top` (T, d, d) of ``states`` (T, N, d)."""
    X = np.asarray(states, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    m = np.einsum("n,tnd->td", w, X)
    C = X - m[:, None, :]
    S = np.einsum("n,tnd,tne->tde", w, C, C)
    return m, 0.5 * (S + np.swapaxes(S, 1, 2))


@dataclass
class ParticleTrajectory:
    """Saved states of a particle simulation (follows :class:`transformer_pde.results.Result`).

    Attributes
    ----------
    times : ndarray (T,)
        Saved times.
    states : ndarray (T, N, d) or None
        Token positions at the saved times (host memory, the simulation's dtype);
        ``None`` when a statistic was saved instead (``SaveAt(fn=...)``).
    weights : ndarray (N,)
        Normalised token weights.
    positions : ndarray (N,) or None
        Token positions in [0, 1] (masked attention); they never move.
    status : Status
        ``ok``: reached ``t_max``; ``blowup``: max :math:`|x|` exceeded ``max_norm`` (the
        offending state is the last one saved); ``nonfinite``: a step produced NaN/inf
        (not saved); ``failed``: an inner solve (Sinkhorn, implicit step) or a user
        callable failed; ``max_steps``: the step budget ran out; ``interrupted``:
        Ctrl-C (``KeyboardInterrupt``) during the run.  Every state saved before the stop
        is kept.
    message : str
        How the run ended (when and why).
    attention : Attention or None
        The specification that was simulated (``None`` after loading one made of
        callables, which cannot be stored).
    info : dict
        Method, backend, step counts, Sinkhorn iterations per evaluation, ...
    values : ndarray (T, ...) or None
        ``SaveAt(fn=...)``'s value at each saved time.
    last : ndarray (N, d)
        The last saved state (``states[-1]`` when states are kept).
    saved_means, saved_covs : ndarray (T, d), (T, d, d) or None
        The weighted moments at the saved times, kept when the states are not
        (``SaveAt(fn=...)``); use :meth:`moments`.
    """

    times: np.ndarray
    states: np.ndarray | None
    weights: np.ndarray
    positions: np.ndarray | None
    status: Status
    message: str
    attention: Attention | None = None
    info: dict = field(default_factory=dict)
    values: np.ndarray | None = None
    last: np.ndarray | None = None
    saved_means: np.ndarray | None = field(default=None, repr=False)
    saved_covs: np.ndarray | None = field(default=None, repr=False)

    #: :class:`~transformer_pde.results.ResultKind` of the result protocol
    result_kind: ClassVar[ResultKind] = ResultKind.PARTICLES

    def __post_init__(self) -> None:
        self.status = Status.parse(self.status)
        if self.last is None and self.states is not None:
            self.last = self.states[-1]

    @property
    def success(self) -> bool:
        """``status.success``: the run answered the question (``ok`` or a detected blow-up)."""
        return self.status.success

    @property
    def final(self) -> np.ndarray:
        """Last saved state (N, d)."""
        return self.last

    @property
    def t_final(self) -> float:
        return float(self.times[-1])

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        r"""``(means (T, d), covs (T, d, d))`` of the token measure at the saved times,
        weighted by the token weights (population covariance, weights summing to 1)."""
        if self.states is not None:
            return weighted_moments(self.states, self.weights)
        return self.saved_means, self.saved_covs

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        N, d = self.last.shape
        return (f"ParticleTrajectory(saved={len(self.times)}, N={N}, d={d}, "
                f"t=[{self.times[0]:g}, {self.times[-1]:g}], status='{self.status}')")

    # ------------------------------------------------------------------ I/O
    def to_xarray(self) -> Any:
        """The trajectory as a labelled :class:`xarray.Dataset` (dimensions ``time``,
        ``token``, ``dim``; status, message, run information and the attention in its
        attributes): :func:`transformer_pde.labelled.particle_dataset`."""
        return labelled.particle_dataset(self)

    @classmethod
    def from_xarray(cls, ds: Any, source: str = "dataset") -> "ParticleTrajectory":
        """Inverse of :meth:`to_xarray`; the invariants of :func:`load` are checked
        (:class:`~transformer_pde.errors.IntegrityError` naming ``source`` otherwise)."""
        f = labelled.particle_fields(ds, source)
        status = Status.parse(f["status"])
        _check_shapes(source, f["times"], f["states"], f["weights"], f["positions"],
                      f["last"], f["saved_means"], f["saved_covs"], f["values"])
        _check_values(source, status, f["times"], f["states"], f["weights"], f["positions"],
                      f["last"])
        return cls(**f)

    def save(self, path: str | Path) -> Path:
        """Write the trajectory to ``path``: NPZ, or netCDF (``.nc``) / Zarr (``.zarr``)
        through :meth:`to_xarray`.  :func:`load` restores it exactly.

        Every array is written with its SHA-256 digest (NPZ format version
        :data:`NPZ_FORMAT_VERSION`; labelled files: :func:`transformer_pde.labelled.save_dataset`)
        and the file is first written to a temporary path beside ``path`` and renamed into
        place, so a failed save leaves nothing behind.  An existing NPZ file is replaced
        (atomically); an existing ``.nc`` or ``.zarr`` is never overwritten.

        Raises
        ------
        ArgumentError
            The trajectory breaks an invariant that :func:`load` checks (it could not be
            read back); nothing is written.
        """
        path = Path(path)
        status = Status.parse(self.status)
        try:
            _check_shapes(path, *(None if a is None else np.asarray(a) for a in (
                self.times, self.states, self.weights, self.positions, self.last,
                self.saved_means, self.saved_covs, self.values)))
            _check_values(path, status, *(None if a is None else np.asarray(a) for a in (
                self.times, self.states, self.weights, self.positions, self.last)))
        except TrajectoryFileError as exc:
            raise ArgumentError(f"cannot save this trajectory (load would refuse it): "
                                f"{exc}") from None
        if path.suffix in labelled.LABELLED_SUFFIXES:
            return labelled.save_dataset(self.to_xarray(), path)
        arrays: dict[str, Any] = {"times": self.times, "weights": self.weights}
        if self.states is not None:
            arrays["states"] = self.states
        else:
            arrays.update(last=self.last, means=self.saved_means, covs=self.saved_covs)
            if self.values is not None:
                arrays["values"] = self.values
        if self.positions is not None:
            arrays["positions"] = self.positions
        meta: dict[str, Any] = {"format": "transformer-pde-trajectory",
                                "version": NPZ_FORMAT_VERSION,
                                "status": str(self.status), "message": self.message,
                                "info": self.info, "attention": None}
        if self.attention is not None:
            spec = self.attention.to_dict()
            att_meta = {}
            for key, value in spec.items():
                if isinstance(value, np.ndarray):
                    arrays[f"att__{key}"] = value
                    att_meta[key] = {"array": f"att__{key}"}
                elif isinstance(value, dict):  # Layers table
                    arrays[f"att__{key}__layers"] = value["layers"]
                    att_meta[key] = {"layers": f"att__{key}__layers",
                                     "layer_time": value["layer_time"], "t0": value["t0"]}
                else:
                    att_meta[key] = value
            meta["attention"] = att_meta
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        meta["digest_algorithm"] = DIGEST_ALGORITHM
        meta["checksums"] = {k: array_digest(v) for k, v in arrays.items()}
        arrays["meta"] = np.array(json.dumps(meta, default=_json_default))
        arrays["meta_checksum"] = np.array(array_digest(arrays["meta"]))
        # written beside the target and renamed over it: a failed save leaves no partial file
        return write_npz(path, arrays)


#: NPZ trajectory format written by :meth:`ParticleTrajectory.save`: 3 = per-array SHA-256
#: checksums; versions 1 and 2 (no checksums) are still read, with the invariant checks only
NPZ_FORMAT_VERSION = 3
_NPZ_VERSIONS = (1, 2, 3)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot store {type(o).__name__} in trajectory metadata")


def _open_npz(path: Path, what: str) -> Any:
    """``np.load`` of an NPZ archive, every failure turned into :class:`TrajectoryFileError`."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise TrajectoryFileError(f"{path} is a directory, not a {what} file")
    if path.stat().st_size == 0:
        raise TrajectoryFileError(f"{path} is empty (0 bytes), not a {what} file")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            magic = fh.read(6)
        kind = "a plain .npy array" if magic == b"\x93NUMPY" else "not an NPZ archive"
        raise TrajectoryFileError(f"{path} is {kind}, not a {what} file (written by "
                                  "ParticleTrajectory.save)")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - zipfile.BadZipFile, OSError, ValueError, EOFError
        raise TrajectoryFileError(f"{path} is not a readable {what} file "
                                  f"(truncated or corrupt archive: {exc})") from None


def _entry(z: Any, path: Path, key: str) -> np.ndarray:
    try:
        return z[key]
    except KeyError:
        raise TrajectoryFileError(f"{path}: missing array {key!r}") from None
    except Exception as exc:  # noqa: BLE001 - corrupt member: BadZipFile, zlib.error, ValueError, EOFError
        raise TrajectoryFileError(f"{path}: array {key!r} is unreadable (truncated or "
                                  f"corrupt file: {type(exc).__name__}: {exc})") from None


def load(path: str | Path) -> ParticleTrajectory:
    """Read a :class:`ParticleTrajectory` written by :meth:`ParticleTrajectory.save`.

    The data are verified before they are returned:

    - **checksums**: NPZ files of format version 3 (:data:`NPZ_FORMAT_VERSION`) and
      ``.nc`` / ``.zarr`` files of version 2 record the SHA-256 digest of every array
      (and of the metadata); each is recomputed.  Files written before checksums existed
      (NPZ versions 1 and 2, labelled files without ``format_version``) are read with the
      invariant checks only.  An unknown version is refused.
    - **invariants** (every version): ``times`` float64, finite and strictly increasing;
      ``states`` / ``last`` float32 or float64 (an integer or float16 file is refused);
      ``weights`` float32/float64, finite, >= 0 and summing to 1 within
      ``max(1e-12, N * eps)``; ``positions`` finite and in [0, 1]; ``values`` real numeric
      (bool, integer or float); consistent shapes.  Non-finite ``states`` / ``last`` are
      refused when the status is a success (``ok``, ``converged``, ``blowup``,
      ``diverging``): :func:`simulate` never saves a non-finite state (a non-finite step
      ends the run with ``nonfinite`` and is not saved; a blow-up state is finite), so
      they can only come from an edit; for the other statuses they are accepted.

    Raises
    ------
    TrajectoryFileError
        (a :class:`~transformer_pde.errors.TransformerPDEError` and ``ValueError``) the
        file is empty, truncated, not an NPZ archive, a plain ``.npy``, has no or bad
        metadata, misses arrays or has inconsistent shapes; the message names the file.
    IntegrityError
        (a :class:`TrajectoryFileError`) an array does not match its checksum, an
        invariant above is broken, or the format version is unknown; the message names
        the file and the array.
    FileNotFoundError
        No such file.
    """
    path = Path(path)
    if path.suffix in labelled.LABELLED_SUFFIXES:
        return ParticleTrajectory.from_xarray(labelled.open_dataset(path), str(path))
    with _open_npz(path, "transformer-pde trajectory") as z:
        if "meta" not in z.files:
            raise TrajectoryFileError(f"{path} is not a transformer-pde trajectory (no 'meta' "
                                      "entry)")
        raw_meta = _entry(z, path, "meta")
        if "meta_checksum" in z.files:
            expected = _entry(z, path, "meta_checksum")
            verify_array(raw_meta, str(expected) if expected.dtype.kind == "U" else None,
                         what="meta", source=path)
        try:
            meta = json.loads(str(raw_meta))
        except json.JSONDecodeError as exc:
            raise TrajectoryFileError(f"{path}: metadata is not valid JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != "transformer-pde-trajectory":
            raise TrajectoryFileError(f"{path} is not a transformer-pde trajectory (metadata "
                                      "format is not 'transformer-pde-trajectory')")
        version = meta.get("version")
        check_version(version, _NPZ_VERSIONS, what="trajectory ", source=path)
        sums = None
        if version >= 3:
            sums = meta.get("checksums")
            if "meta_checksum" not in z.files or not isinstance(sums, dict) \
                    or meta.get("digest_algorithm") != DIGEST_ALGORITHM:
                raise IntegrityError(f"{path}: the checksums of this version-{version} file "
                                     f"are missing or unreadable (the file was edited or is "
                                     f"corrupt)")
            stored = set(z.files) - {"meta", "meta_checksum"}
            for key in sorted(set(sums) - stored):
                raise IntegrityError(f"{path}: array {key!r} is missing (the file was edited "
                                     f"or is corrupt)")
            for key in sorted(stored - set(sums)):
                raise IntegrityError(f"{path}: array {key!r} has no checksum (the file was "
                                     f"edited)")
            # read and verify every array up front: nothing unverified is ever used
            verified = {key: verify_array(_entry(z, path, key), sums[key], what=key,
                                          source=path) for key in sorted(stored)}

            def get(key: str) -> np.ndarray:
                if key not in verified:
                    raise TrajectoryFileError(f"{path}: missing array {key!r}")
                return verified[key]
        else:
            def get(key: str) -> np.ndarray:
                return _entry(z, path, key)
        try:
            status = Status.parse(meta["status"])
            message = str(meta["message"])
        except (KeyError, ValueError) as exc:
            raise TrajectoryFileError(f"{path}: bad metadata ({exc})") from None
        info = meta.get("info", {})
        if not isinstance(info, dict):
            raise TrajectoryFileError(f"{path}: bad metadata ('info' is not a mapping)")
        times = get("times")
        weights = get("weights")
        positions = get("positions") if "positions" in z.files else None
        states = get("states") if "states" in z.files else None
        last = means = covs = values = None
        if states is None:
            if "last" not in z.files:
                raise TrajectoryFileError(f"{path}: missing array 'states'")
            last = get("last")
            means = get("means")
            covs = get("covs")
            values = get("values") if "values" in z.files else None
        _check_shapes(path, times, states, weights, positions, last, means, covs, values)
        _check_values(path, status, times, states, weights, positions, last)
        att = None
        att_meta = meta.get("attention")
        if att_meta is not None and att_meta.get("serialisable", True):
            try:
                spec = {}
                for key, value in att_meta.items():
                    if isinstance(value, dict) and "array" in value:
                        spec[key] = get(value["array"])
                    elif isinstance(value, dict) and "layers" in value:
                        spec[key] = {"layers": get(value["layers"]),
                                     "layer_time": value["layer_time"], "t0": value["t0"]}
                    else:
                        spec[key] = value
                att = Attention.from_dict(spec)
            except TrajectoryFileError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: the stored attention is invalid
                raise TrajectoryFileError(f"{path}: the stored attention is invalid "
                                          f"({type(exc).__name__}: {exc})") from None
        return ParticleTrajectory(times=times, states=states, weights=weights,
                                  positions=positions, status=status, message=message,
                                  attention=att, info=info, values=values, last=last,
                                  saved_means=means, saved_covs=covs)


_STATE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_shapes(path, times, states, weights, positions, last, means, covs, values) -> None:
    """Dtypes and shapes of a trajectory's arrays (:class:`TrajectoryFileError` naming
    ``path`` and the array; :class:`IntegrityError` for a dtype that
    :func:`simulate` never writes)."""
    def bad(msg: str) -> TrajectoryFileError:
        return TrajectoryFileError(f"{path}: inconsistent arrays: {msg}")
    for name, a in (("times", times), ("weights", weights), ("states", states),
                    ("positions", positions), ("last", last), ("means", means), ("covs", covs)):
        if a is not None and not np.issubdtype(a.dtype, np.floating):
            raise IntegrityError(f"{path}: inconsistent arrays: array {name!r} has dtype "
                                 f"{a.dtype}, expected floating point")
    if times.dtype != np.float64:
        raise IntegrityError(f"{path}: array 'times' has dtype {times.dtype}, expected float64")
    for name, a in (("states", states), ("last", last), ("weights", weights),
                    ("positions", positions), ("means", means), ("covs", covs)):
        if a is not None and a.dtype not in _STATE_DTYPES:
            raise IntegrityError(f"{path}: array {name!r} has dtype {a.dtype}, expected "
                                 f"float32 or float64")
    if values is not None and values.dtype.kind not in "biuf":
        raise IntegrityError(f"{path}: array 'values' has dtype {values.dtype}, expected a "
                             f"real numeric type (bool, integer or float)")
    if times.ndim != 1 or times.size == 0:
        raise bad(f"times must be a non-empty 1-D array, got shape {times.shape}")
    if weights.ndim != 1:
        raise bad(f"weights must be 1-D, got shape {weights.shape}")
    n = weights.shape[0]
    if states is not None:
        if states.ndim != 3 or states.shape[0] != times.shape[0] or states.shape[1] != n:
            raise bad(f"states {states.shape} must be (T, N, d) with T = {times.shape[0]} "
                      f"saved times and N = {n} weights")
    else:
        if last.ndim != 2 or last.shape[0] != n:
            raise bad(f"last {last.shape} must be (N, d) with N = {n}")
        T, d = times.shape[0], last.shape[1]
        if means.shape != (T, d) or covs.shape != (T, d, d):
            raise bad(f"means {means.shape} / covs {covs.shape} must be {(T, d)} / {(T, d, d)}")
        if values is not None and values.shape[:1] != (T,):
            raise bad(f"values {values.shape} must have T = {T} rows")
    if positions is not None and positions.shape != (n,):
        raise bad(f"positions {positions.shape} must be ({n},)")
    if states is not None and last is not None and last.shape != states.shape[1:]:
        raise bad(f"last {last.shape} must be {states.shape[1:]}")


def _check_values(path, status: Status, times, states, weights, positions, last) -> None:
    """The value invariants of :func:`load` (after :func:`_check_shapes`):
    :class:`IntegrityError` naming ``path`` and the array."""
    def bad(name: str, msg: str) -> IntegrityError:
        return IntegrityError(f"{path}: array {name!r} {msg} (the file was edited or is "
                              f"corrupt)")
    if not np.all(np.isfinite(times)):
        raise bad("times", "holds NaN or inf")
    if times.size > 1 and not np.all(np.diff(times) > 0):
        raise bad("times", "is not strictly increasing")
    if not np.all(np.isfinite(weights)):
        raise bad("weights", "holds NaN or inf")
    if np.any(weights < 0):
        raise bad("weights", "holds negative weights")
    n = weights.shape[0]
    total = math.fsum(weights.astype(np.float64).tolist())
    tol = max(1e-12, n * float(np.finfo(weights.dtype).eps))
    if not abs(total - 1.0) <= tol:
        raise bad("weights", f"sums to {total!r}, not 1 (tolerance {tol:.3g})")
    if positions is not None and not (np.all(np.isfinite(positions))
                                      and np.all((positions >= 0) & (positions <= 1))):
        raise bad("positions", "holds positions outside [0, 1] (or NaN)")
    if status.success:
        # simulate never saves a non-finite state: a non-finite step ends the run with
        # status 'nonfinite' without saving it, and a blow-up is detected on a finite state
        for name, a in (("states", states), ("last", last)):
            if a is not None and not np.all(np.isfinite(a)):
                raise bad(name, f"holds NaN or inf although the run ended with status "
                                f"{str(status)!r}")


# ------------------------------------------------------------------ saving
def _statistic(out: Any, t: float) -> np.ndarray:
    """``SaveAt(fn=...)``'s return value as a real numeric array (a copy), or
    :class:`ArgumentError` naming what was returned."""
    what = f"{type(out).__name__} {out!r}"[:200]
    if out is None or isinstance(out, (str, bytes, dict)):
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array, got {what} at "
                            f"t={t:.6g}")
    try:
        v = np.array(out)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array, got {what} at "
                            f"t={t:.6g} ({exc})") from None
    if v.dtype.kind not in "biuf":
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array (bool, integer "
                            f"or float), got {what} (dtype {v.dtype}) at t={t:.6g}")
    return v


class _Saver:
    """Copies saved states to the host (or keeps ``SaveAt.fn``'s value and the moments)."""

    def __init__(self, be: Any, fn: Any, weights: np.ndarray):
        self.be, self.fn, self.weights = be, fn, weights
        self.times: list[float] = []
        self.states: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.means: list[np.ndarray] = []
        self.covs: list[np.ndarray] = []
        self.last: np.ndarray | None = None
        self.shape: tuple | None = None

    def __call__(self, t: float, y: Any) -> None:
        """Keep the state ``y`` at time ``t`` (or ``SaveAt.fn``'s value and the moments).

        ``fn(t, X, weights)`` gets read-only views (an in-place edit raises instead of
        changing the run) and must return a real numeric array (bool, integer or float) of
        the same shape at every call; anything else raises :class:`ArgumentError` naming
        ``SaveAt(fn=...)`` and what it returned.  At the first save :func:`simulate` raises
        it; later, the time loop ends the run with status ``failed``, keeping the earlier
        saves."""
        x = self.be.to_numpy(y).copy()
        if self.fn is not None:
            xv, wv = x.view(), np.asarray(self.weights).view()
            xv.flags.writeable = wv.flags.writeable = False
            try:
                out = self.fn(t, xv, wv)
            except ValueError as exc:
                if "read-only" not in str(exc):
                    raise
                raise ArgumentError(f"SaveAt(fn=...) must not modify the state or the weights "
                                    f"in place (copy them first): {exc}") from exc
            v = _statistic(out, t)
            if self.shape is None:
                self.shape = v.shape
            elif v.shape != self.shape:
                raise ArgumentError(f"SaveAt(fn=...) returned shape {v.shape} at t={t:.6g}, "
                                    f"but {self.shape} before")
            m, c = weighted_moments(x[None], self.weights)
            self.values.append(v)
            self.means.append(m[0])
            self.covs.append(c[0])
        else:
            self.states.append(x)
        self.times.append(t)
        self.last = x

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """What was saved so far, as plain versioned data (lists of host arrays)."""
        return {"version": self.STATE_VERSION, "times": [float(t) for t in self.times],
                "states": list(self.states), "values": list(self.values),
                "means": list(self.means), "covs": list(self.covs), "last": self.last,
                "shape": None if self.shape is None else [int(k) for k in self.shape]}

    def set_state(self, s: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version or shape)."""
        keys = {"version", "times", "states", "values", "means", "covs", "last", "shape"}
        if not isinstance(s, dict) or s.get("version") != self.STATE_VERSION or set(s) != keys:
            raise ValueError(f"saver state is not of version {self.STATE_VERSION}")
        n_saved = len(s["states"]) if self.fn is None else len(s["values"])
        if n_saved != len(s["times"]) or not s["times"]:
            raise ValueError(f"saver state holds {len(s['times'])} times for {n_saved} saves")
        self.times = [float(t) for t in s["times"]]
        self.states, self.values = list(s["states"]), list(s["values"])
        self.means, self.covs = list(s["means"]), list(s["covs"])
        self.last = s["last"]
        self.shape = None if s["shape"] is None else tuple(int(k) for k in s["shape"])


# ------------------------------------------------------------------ simulate
def _option(name: str, value: Any, cls: type, default: Any) -> Any:
    if value is None:
        return default
    if not isinstance(value, cls):
        raise ArgumentTypeError(f"{name} must be a transformer_pde.{cls.__name__} or None, got "
                                f"{type(value).__name__}")
    return value


def simulate(att: Attention, X0: Any, *, t_max: float, dt: float, solver: Any = "rk4",
             saveat: SaveAt | None = None, weights: Any = None, positions: Any = None,
             block: Block | None = None, field: FieldOptions | None = None,
             limits: Limits | None = None, monitor: Monitor | None = None
             ) -> ParticleTrajectory:
    r"""Integrate the particle attention flow :math:`\dot X_i = \Gamma_{\mu_t}(X_i)` on :math:`[0, t_{max}]`.

    Parameters
    ----------
    att : Attention
        The velocity field (parameters may depend on time).
    X0 : array (N, d)
        Initial tokens.  float32 input runs in float32; anything else in float64.
    t_max : float
        Final time (> 0).
    dt : float
        Step size of a fixed-step solver (a last partial step lands exactly on ``t_max``);
        the save-grid unit and the first trial step of an adaptive one.
    solver : str or solver object, default "rk4"
        ``"euler"``, ``"heun"``, ``"rk4"``, ``"ab2"``, ``"ab3"``, ``"implicit_midpoint"``,
        ``"dopri5"``, ``"dop853"`` (default options), or an object carrying its options
        such as ``Dopri5(rtol=1e-8, atol=1e-10)`` or ``ImplicitMidpoint(tol=1e-12)``
        (:mod:`transformer_pde.integrate`); the run works on its own copy, so one object
        may serve many runs, also concurrent ones.  ``"euler"`` with ``dt = 1`` is exactly a stack
        of residual attention layers.
    saveat : SaveAt, optional
        What to keep: ``SaveAt(every=k)`` (default every step), ``SaveAt(ts=times)`` or
        ``SaveAt(fn=statistic)`` (keep a statistic instead of the (T, N, d) states).
    weights, positions : array (N,), optional
        Token masses (normalised) and positions in [0, 1] (required for masked attention).
    block : Block, optional
        Full Transformer block: MLP, LayerNorm, constraint (sphere, post-norm), splitting;
        needs a fixed-step solver.
    field : FieldOptions, optional
        Backend (default ``"auto"``), dtype, Sinkhorn tolerances.
    limits : Limits, optional
        ``max_norm`` (blow-up event), ``max_steps``, ``max_memory``; runs that would exceed
        the last two are refused before they start.
    monitor : Monitor, optional
        Progress bar / periodic log lines, checkpoints every so many seconds and resuming
        from them.

    Returns
    -------
    ParticleTrajectory
        ``status`` says how the run ended; every state saved before a blow-up, a non-finite
        step, a failure (inner solve, user callable) or an interruption is kept.  An early
        stop also issues an :class:`~transformer_pde.errors.EarlyStopWarning`.

    Notes
    -----
    **Ctrl-C.**  A ``KeyboardInterrupt`` during the run ends it: ``simulate`` returns the
    trajectory saved so far with status ``interrupted`` (and warns) instead of raising.
    With ``Monitor(checkpoint=path)`` the run can later be continued with
    ``Monitor(checkpoint=path, resume=True)`` from the last checkpoint; the resumed run
    equals an uninterrupted one bit for bit.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Invalid arguments, options that do not apply, or a run refused up front (too many
        steps for ``max_steps``, saved states larger than ``max_memory``).
    CheckpointError
        (an ``ArgumentError``) before the first step: a ``Monitor(checkpoint=...)`` path
        that cannot or must not be written (missing or read-only folder, a folder, a
        device, an existing file that is not a checkpoint), or, with ``resume=True``, a
        checkpoint of another run (the message names the fields that differ).
    IntegrityError
        With ``resume=True``: the checkpoint file is not one of this library, of an
        unknown format version, truncated, corrupt or edited (the message names it).

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    >>> X0 = np.random.default_rng(0).normal(size=(50, 2))
    >>> traj = tp.simulate(att, X0, t_max=1.0, dt=0.1)
    >>> traj.states.shape, str(traj.status)
    ((11, 50, 2), 'ok')
    """
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    X0n = points("X0", np.asarray(X0) if not hasattr(X0, "get") else X0.get(), att.d)
    t_max = positive("t_max", t_max)
    dt = positive("dt", dt)
    saveat = _option("saveat", saveat, SaveAt, SaveAt())
    block = _option("block", block, Block, None)
    fopts = _option("field", field, FieldOptions, FieldOptions())
    limits = _option("limits", limits, Limits, Limits())
    monitor = _option("monitor", monitor, Monitor, Monitor())
    fopts.check(att)
    if saveat.ts is not None and saveat.ts[-1] > t_max:
        raise ArgumentError(f"SaveAt(ts=...) asks for t={saveat.ts[-1]:g} > t_max={t_max:g}")
    dtype = fopts.dtype
    if dtype is None:
        dtype = X0n.dtype if X0n.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    solver = get_solver(solver)
    stepper = None
    if block is not None:
        stepper = BlockStepper(solver, block, att.d)
        X0n = stepper.initial(X0n)
        solver = stepper
    tables = layer_tables(att, stepper.tables if stepper is not None else None)
    n = X0n.shape[0]
    ev = FieldEvaluator(att, n, weights=weights, positions=positions, dtype=dtype,
                        **fopts.evaluator_kwargs())
    be = ev.be
    saver = _Saver(be, saveat.fn, ev.weights)

    def rhs(tau: float, z: Any, left: bool, stage: int | None) -> Any:
        # the stage index lets Sinkhorn warm-start stage i from stage i of earlier steps
        ev.stage = stage
        return ev(tau, z, left=left)

    loop = TimeLoop(solver, rhs, t_max=t_max, dt=dt, saveat=saveat, limits=limits,
                    tables=tables, xp=be.xp, save=saver)
    _preflight(loop, limits, saveat, n, att.d, dtype, dt)
    ckpt = monitor.checkpoint
    resumed = None
    if ckpt is not None:
        check_path(ckpt, resume=monitor.resume)
        identity = RunIdentity.of_run(
            att=att, X0=X0n, weights=ev.weights, positions=ev.positions, dtype=dtype,
            backend=be.name, field_options=fopts.evaluator_kwargs(), solver=solver,
            t_max=t_max, dt=dt, saveat=saveat, block=block)
        if monitor.resume and ckpt.exists():
            resumed = read_checkpoint(ckpt, identity, lambda a: be.asarray(a, a.dtype))
    solver.reset()
    if resumed is not None:
        try:
            state = LoopState.from_state(resumed["loop"])
            if hasattr(solver, "set_state"):   # a user's solver object may keep no state
                solver.set_state(resumed["solver"])
            ev.set_state(resumed["field"])
            saver.set_state(resumed["saver"])
        except (KeyError, ValueError, TypeError) as exc:
            raise IntegrityError(f"checkpoint {ckpt}: inconsistent state ({exc})") from None
        loop.last_saved = saver.times[-1]
        logger.info("simulate: resuming from %s at t=%.6g", ckpt, state.t)
    else:
        y0 = be.asarray(X0n, dtype)
        state = loop.initial_state(y0)
        if saveat.ts is None or saveat.ts[0] == 0.0:
            try:
                saver(0.0, y0)
            except Exception as exc:
                raise ArgumentError(f"SaveAt(fn=...) failed on the initial state: "
                                    f"{type(exc).__name__}: {exc}") from exc
    writer = None
    if ckpt is not None:
        def collect(st: LoopState) -> tuple[dict[str, Any], list[float]]:
            solver_state = solver.get_state() if hasattr(solver, "get_state") else {}
            return ({"loop": st.get_state(), "solver": solver_state,
                     "field": ev.get_state(), "saver": saver.get_state()}, saver.times)
        writer = CheckpointWriter(ckpt, identity, collect)
        loop.checkpoint_fn = writer
        loop.checkpoint_every = monitor.checkpoint_every
    loop.progress = Progress(t_max, monitor.progress, monitor.report_every,
                             f"simulate[{att.kind}]", t0=state.t)
    try:
        status, message, state = loop.run(state)
    finally:
        loop.progress.close()
    if writer is not None and status == Status.OK:
        writer(state)   # a failed write warns (CheckpointWarning); the result is returned
    warn_stop(status, message)
    info: dict[str, Any] = {"method": getattr(solver, "name", str(solver)),
                            "backend": be.name, "dt": dt, "t_max": t_max,
                            "n_steps": state.n_steps, "n_rejected": state.n_rejected,
                            "dtype": str(np.dtype(dtype)), "save_every": saveat.every}
    info.update(ev.info)
    if stepper is not None:
        info.update(stepper.describe())
    if not saver.times:
        # SaveAt(ts) without 0 and a run that stopped before ts[0]: keep the last state
        # computed (at its own time) rather than return an empty trajectory
        saver(float(state.t), state.y)
    return ParticleTrajectory(
        times=np.asarray(saver.times, dtype=float),
        states=np.stack(saver.states) if saveat.fn is None and saver.states else
        (np.empty((0, n, att.d), dtype=dtype) if saveat.fn is None else None),
        weights=ev.weights, positions=ev.positions, status=status, message=message,
        attention=att, info=info,
        values=np.stack(saver.values) if saver.values else None, last=saver.last,
        saved_means=np.stack(saver.means) if saver.means else None,
        saved_covs=np.stack(saver.covs) if saver.covs else None)


def _preflight(loop: TimeLoop, limits: Limits, saveat: SaveAt, n: int, d: int, dtype: Any,
               dt: float) -> None:
    """Refuse runs that cannot finish: too many steps, or saves that do not fit in memory."""
    steps = loop.planned_steps()
    if steps is not None and steps > limits.max_steps:
        raise ArgumentError(
            f"t_max={loop.t_max:g} with dt={dt:g} needs {steps} steps, more than "
            f"max_steps={limits.max_steps}; increase dt or Limits(max_steps=...)")
    if saveat.fn is None:
        saves = loop.planned_saves()
        need = float(saves) * n * d * np.dtype(dtype).itemsize
        cap = limits.memory_limit()
        if need > cap:
            raise ArgumentError(
                f"the {saves} saved states of {n} x {d} tokens would need "
                f"{need / 2 ** 30:.3g} GiB, more than max_memory={cap / 2 ** 30:.3g} GiB; "
                "save fewer with SaveAt(every=k) or SaveAt(ts=...), keep a statistic with "
                "SaveAt(fn=...), or raise Limits(max_memory=...)")
