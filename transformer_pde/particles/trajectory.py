"""The result of a particle run: :class:`ParticleTrajectory`, its moments, and its files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..attention import Attention
from ..io import labelled
from ..io.trajectory import dataset_fields, read_trajectory, save_trajectory
from .. import results_display as display
from ..errors import ArgumentError
from ..results import HasStatus, ResultKind, Status

__all__ = ["ParticleTrajectory", "SavedRun", "load", "weighted_moments"]


def weighted_moments(states: np.ndarray, weights: np.ndarray, segments: Any = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    r"""Means :math:`m = \sum_i w_i x_i` (T, d) and covariances
    :math:`\Sigma = \sum_i w_i (x_i - m)(x_i - m)^\top` (T, d, d) of ``states`` (T, N, d).

    With ``segments`` (sizes of consecutive token groups, each its own measure with
    weights summing to 1 in it), the moments of each: (T, S, d) and (T, S, d, d)."""
    X = np.asarray(states, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if segments is not None and len(segments) > 1:
        ends = np.cumsum(segments)
        parts = [weighted_moments(X[:, e - s:e], w[e - s:e])
                 for s, e in zip(segments, ends, strict=True)]
        return (np.stack([m for m, _ in parts], axis=1),
                np.stack([c for _, c in parts], axis=1))
    m = np.einsum("n,tnd->td", w, X)
    C = X - m[:, None, :]
    S = np.einsum("n,tnd,tne->tde", w, C, C)
    return m, 0.5 * (S + np.swapaxes(S, 1, 2))


@dataclass(repr=False)
class SavedRun(HasStatus, display.Summarised):
    """The fields of a run's saves shared by :class:`ParticleTrajectory` and
    :class:`~transformer_pde.particles.EnsembleTrajectory` (documented there): the saved
    ``times`` and ``states``, ``weights``, ``positions``, ``status``, ``message``,
    ``attention``, ``info``, ``values`` and the ``last`` state (``states[-1]`` by
    default); ``len()`` is the number of saves."""

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

    def __post_init__(self) -> None:
        self.status = Status.parse(self.status)
        if self.last is None and self.states is not None:
            self.last = self.states[-1]

    def __len__(self) -> int:
        return len(self.times)


@dataclass(repr=False)
class ParticleTrajectory(SavedRun):
    """Saved states of a particle simulation (follows :class:`transformer_pde.results.Result`).

    Attributes
    ----------
    times : ndarray (T,)
        Saved times.
    states : ndarray (T, N, d) or None
        Token positions at the saved times (host memory, the simulation's dtype);
        ``None`` when a statistic was saved instead (``SaveAt(fn=...)``).
    weights : ndarray (N,)
        Normalised token weights (summing to 1 in each segment of ``info["segments"]``).
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
        Method, backend, step counts, Sinkhorn iterations per evaluation, the
        ``segments`` of packed sequences, ...
    values : ndarray (T, ...) or None
        ``SaveAt(fn=...)``'s value at each saved time.
    last : ndarray (N, d)
        The last saved state (``states[-1]`` when states are kept).
    saved_means, saved_covs : ndarray (T, d), (T, d, d) or None
        The weighted moments at the saved times, kept when the states are not
        (``SaveAt(fn=...)``); use :meth:`moments`.
    """

    saved_means: np.ndarray | None = field(default=None, repr=False)
    saved_covs: np.ndarray | None = field(default=None, repr=False)

    #: :class:`~transformer_pde.results.ResultKind` of the result protocol
    result_kind: ClassVar[ResultKind] = ResultKind.PARTICLES

    @property
    def final(self) -> np.ndarray:
        """Last saved state (N, d)."""
        return self.last

    @property
    def t_final(self) -> float:
        return float(self.times[-1])

    @property
    def segments(self) -> list[int] | None:
        """Sizes of the packed sequences (``simulate(..., segments=...)``), or ``None``."""
        seg = (self.info or {}).get("segments")
        return None if seg is None else [int(s) for s in seg]

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        r"""``(means (T, d), covs (T, d, d))`` of the token measure at the saved times,
        weighted by the token weights (population covariance, weights summing to 1).

        Of packed sequences (several :attr:`segments`): the moments of each segment's
        measure, ``(T, S, d)`` and ``(T, S, d, d)``."""
        if self.states is not None:
            return weighted_moments(self.states, self.weights, self.segments)
        return self.saved_means, self.saved_covs

    def segment(self, s: int) -> "ParticleTrajectory":
        """Segment ``s`` of packed sequences as a trajectory of its own (views of the
        states; the run's status, message and information without ``segments``).

        Raises
        ------
        ArgumentError
            ``s`` is not an integer in ``[-S, S)``."""
        sizes = self.segments or [int(np.shape(self.last)[0])]
        S = len(sizes)
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not -S <= s < S:
            raise ArgumentError(f"s must be an integer in [{-S}, {S}), got {s!r}")
        s = int(s) % S
        end = int(np.sum(sizes[:s + 1]))
        part = slice(end - sizes[s], end)
        info = {k: v for k, v in (self.info or {}).items() if k != "segments"}
        return ParticleTrajectory(
            times=self.times, states=None if self.states is None else self.states[:, part],
            weights=self.weights[part],
            positions=None if self.positions is None else self.positions[part],
            status=self.status, message=self.message, attention=self.attention,
            info=dict(info, segment=s), values=self.values, last=self.last[part],
            saved_means=self.saved_means if self.saved_means is None or S == 1
            else self.saved_means[:, s],
            saved_covs=self.saved_covs if self.saved_covs is None or S == 1
            else self.saved_covs[:, s])

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        N, d = np.shape(self.last)
        title = (f"ParticleTrajectory(status='{self.status}', saved={len(self.times)}, "
                 f"N={N}, d={d})")
        rows = [("times", display.time_span(self.times)),
                ("states", display.array_summary(self.states) if self.states is not None
                 else "not kept (SaveAt(fn=...)): moments and the last state")]
        if self.values is not None:
            rows.append(("values", display.array_summary(self.values)))
        if self.positions is not None:
            rows.append(("positions", "masked attention (token positions in [0, 1])"))
        if self.attention is not None:
            att = self.attention
            rows.append(("attention", f"{att.kind}, d={att.d}, heads={att.heads}"
                         + (f", beta={display.number(att.beta)}"
                            if isinstance(att.beta, (int, float)) else "")))
        info = self.info or {}
        if "method" in info:
            rows.append(("solver", f"{info['method']} on {info.get('backend', '?')}, "
                                   f"{info.get('n_steps', '?')} steps"))
        rows.append(("message", display.shorten(self.message)))
        return title, rows


    # ------------------------------------------------------------------ I/O
    def to_xarray(self) -> Any:
        """The trajectory as a labelled :class:`xarray.Dataset` (dimensions ``time``,
        ``token``, ``dim``; status, message, run information and the attention in its
        attributes): :func:`transformer_pde.io.labelled.particle_dataset`."""
        return labelled.particle_dataset(self)

    @classmethod
    def from_xarray(cls, ds: Any, source: str = "dataset") -> "ParticleTrajectory":
        """Inverse of :meth:`to_xarray`; the invariants of :func:`load` are checked
        (:class:`~transformer_pde.errors.IntegrityError` naming ``source`` otherwise;
        :func:`transformer_pde.io.trajectory.dataset_fields`)."""
        return cls(**dataset_fields(ds, source))

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the trajectory to ``path``: NPZ, or netCDF (``.nc``) / Zarr (``.zarr``)
        through :meth:`to_xarray`.  :func:`load` restores it exactly.

        Every array is written with its SHA-256 digest (NPZ format version
        :data:`~transformer_pde.io.trajectory.NPZ_FORMAT_VERSION`; labelled files:
        :func:`transformer_pde.io.labelled.save_dataset`) and the file is first written to
        a temporary path beside ``path`` and renamed into place, so a failed save leaves
        nothing behind (:func:`transformer_pde.io.trajectory.save_trajectory`).

        Parameters
        ----------
        path : str or Path
            Target file: ``.nc``, ``.zarr``, or anything else for NPZ.
        overwrite : bool, default False
            Replace an existing ``path`` (the new file is complete before it replaces
            the old one).  Without it an existing path is an error, so re-running a
            notebook cell never destroys a previous result silently.

        Returns
        -------
        Path
            ``path``.

        Raises
        ------
        ArgumentError
            ``path`` exists and ``overwrite`` is False (the message names the path and
            says ``overwrite=True``); or the trajectory breaks an invariant that
            :func:`load` checks (it could not be read back); nothing is written.
        """
        return save_trajectory(self, path, overwrite=overwrite)


def load(path: str | Path) -> ParticleTrajectory:
    """Read a :class:`ParticleTrajectory` written by :meth:`ParticleTrajectory.save`.

    The file is verified before anything is returned
    (:func:`transformer_pde.io.trajectory.read_trajectory`): the SHA-256 checksums
    whenever the file carries them, whatever its version field says (files written today
    always do: NPZ format version 3, ``.nc`` / ``.zarr`` version 2), then the
    invariants of every version (``times`` float64, finite and strictly increasing;
    ``states`` / ``last`` float32 or float64; ``weights`` finite, >= 0 and summing to 1;
    ``positions`` in [0, 1]; consistent shapes; no non-finite state in a run that ended
    with a success status).

    Raises
    ------
    TrajectoryFileError, IntegrityError, FileNotFoundError
        As :func:`~transformer_pde.io.trajectory.read_trajectory`: the message names the
        file (and the array whose checksum or invariant fails).
    """
    return ParticleTrajectory(**read_trajectory(path))
