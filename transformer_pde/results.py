"""One result protocol for every time-dependent result of the package.

Every trajectory-like result (particle runs, Gaussian moment solves, and each member of
a batch) exposes the same attributes:

``times``
    The saved times, an array of shape ``(T,)``.
``status``
    A :class:`Status` (a ``str`` enum, so ``traj.status == "ok"`` works).
``message``
    A sentence saying how and when the run ended.
``success``
    ``status.success``: the run did what was asked (see :class:`Status`).
``moments()``
    ``(means, covs)`` of shape ``(T, d)`` and ``(T, d, d)`` at the saved times.
``result_kind``
    A :class:`ResultKind` (a class attribute): what the result holds --
    ``PARTICLES`` (token states and weights), ``GAUSSIAN`` (one mean and covariance path)
    or ``GAUSSIAN_BATCH`` (many members at common times).

Diagnostics and plots dispatch on :func:`kind_of` / :func:`require_kind` (the declared
``result_kind``) instead of testing attributes with ``hasattr``; a wrong type is an
:class:`~transformer_pde.errors.ArgumentTypeError` naming the argument.

This module imports nothing from the package but :mod:`transformer_pde.errors`.
"""

from __future__ import annotations

import enum
import warnings
from typing import Any, Protocol, runtime_checkable

from .errors import ArgumentTypeError, EarlyStopWarning

__all__ = ["HasStatus", "Result", "ResultKind", "Status", "check_warn", "kind_of", "require_kind",
           "warn_stop"]


class Status(str, enum.Enum):
    """How a run ended: one vocabulary for particle runs, Gaussian solves and batches.

    ====================  =======  ====================================================
    value                 success  meaning
    ====================  =======  ====================================================
    ``"ok"``              yes      reached the final time; nothing else was detected
    ``"converged"``       yes      reached a stationary state (or its algebraic approach)
    ``"blowup"``          yes      finite-time blow-up detected; ``blowup_time`` is T*
    ``"diverging"``       yes      unbounded growth without finite-time blow-up
    ``"nonfinite"``       no       a step produced NaN or inf (not saved)
    ``"failed"``          no       an inner solve or a user callable failed
    ``"max_steps"``       no       the step budget ran out before the final time
    ``"interrupted"``     no       stopped by the user (Ctrl-C) before the final time
    ====================  =======  ====================================================

    "Success" means the result answers the question that was asked: a detected blow-up
    is an answer, a NaN is not.

    **Answers are statuses, not warnings.**  A run that ends with an answer (``ok``,
    ``converged``, ``blowup``, ``diverging``) reports it in ``status`` and ``message``
    only, as :func:`scipy.integrate.solve_ivp` does.  A run that ends without one
    (``nonfinite``, ``failed``, ``max_steps``, ``interrupted``) also issues an
    :class:`~transformer_pde.errors.EarlyStopWarning`, so that a partial result is not
    taken for a complete one (an interrupted run warns too: its result stops at the time
    of the Ctrl-C, which a later cell of a notebook may not show).  Every solver that
    returns a status takes ``warn=True``; ``warn=False`` turns the warning off for that
    call (the status and message are unchanged).  Globally,
    ``warnings.simplefilter("ignore", EarlyStopWarning)`` silences them and
    ``warnings.simplefilter("error", EarlyStopWarning)`` turns them into errors.
    """

    OK = "ok"
    CONVERGED = "converged"
    BLOWUP = "blowup"
    DIVERGING = "diverging"
    NONFINITE = "nonfinite"
    FAILED = "failed"
    MAX_STEPS = "max_steps"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:  # "ok", not "Status.OK", in messages and files
        return self.value

    @property
    def success(self) -> bool:
        """True for ``ok``, ``converged``, ``blowup`` and ``diverging``."""
        return self in _SUCCESS

    @property
    def stopped_early(self) -> bool:
        """True when the run ended before its final time for a reason other than
        convergence (``blowup``, ``nonfinite``, ``failed``, ``max_steps``, ``interrupted``)."""
        return self in _EARLY

    @classmethod
    def parse(cls, value: Any, name: str = "status") -> "Status":
        """Return the member for ``value`` (a member or its string), or raise ``ValueError``
        naming ``name`` and the accepted values."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value))
        except ValueError:
            raise ValueError(f"{name} must be one of {[s.value for s in cls]}, "
                             f"got {value!r}") from None


_SUCCESS = frozenset({Status.OK, Status.CONVERGED, Status.BLOWUP, Status.DIVERGING})
_EARLY = frozenset({Status.BLOWUP, Status.NONFINITE, Status.FAILED, Status.MAX_STEPS,
                    Status.INTERRUPTED})


class HasStatus:
    """Mixin of the result classes with one ``status``: their ``success`` property."""

    __slots__ = ()

    @property
    def success(self) -> bool:
        """:attr:`Status.success <transformer_pde.results.Status.success>` of ``status`` (a
        :class:`Status` or its string)."""
        return Status.parse(self.status).success  # type: ignore[attr-defined]


class ResultKind(str, enum.Enum):
    """What a result holds; declared by each result class as ``result_kind``.

    ``PARTICLES``
        :class:`~transformer_pde.ParticleTrajectory`: token states ``(T, N, d)`` (or, when
        saved with ``SaveAt(fn=...)``, only their moments) and weights.
    ``GAUSSIAN``
        :class:`~transformer_pde.gaussian.GaussianTrajectory`: ``means (T, d)`` and
        ``covs (T, d, d)`` of one Gaussian solve.
    ``GAUSSIAN_BATCH``
        :class:`~transformer_pde.gaussian.GaussianBatch`: many members, final states, and
        paths at common times when solved with ``t_eval``.
    """

    PARTICLES = "particles"
    GAUSSIAN = "gaussian"
    GAUSSIAN_BATCH = "gaussian_batch"

    def __str__(self) -> str:
        return self.value


_CLASS_NAMES = {ResultKind.PARTICLES: "ParticleTrajectory",
                ResultKind.GAUSSIAN: "GaussianTrajectory",
                ResultKind.GAUSSIAN_BATCH: "GaussianBatch"}


@runtime_checkable
class Result(Protocol):
    """What every trajectory-like result provides (see the module docstring)."""

    result_kind: ResultKind
    times: Any
    status: Status
    message: str

    @property
    def success(self) -> bool: ...

    def moments(self) -> tuple[Any, Any]: ...


def kind_of(obj: Any) -> ResultKind | None:
    """The :class:`ResultKind` declared by ``obj``'s class, or ``None`` when ``obj`` is not
    one of the package's results (an array, a list, ...)."""
    kind = getattr(type(obj), "result_kind", None)
    return kind if isinstance(kind, ResultKind) else None


def require_kind(obj: Any, name: str, accept: tuple[ResultKind, ...] = tuple(ResultKind)
                 ) -> ResultKind:
    """:func:`kind_of` ``obj``, which must be one of ``accept``.

    Raises
    ------
    ArgumentTypeError
        Naming ``name``, the accepted result classes and the type received.

    Examples
    --------
    >>> require_kind([1.0], "traj")
    Traceback (most recent call last):
    ...
    transformer_pde.errors.ArgumentTypeError: traj must be a ParticleTrajectory, \
GaussianTrajectory or GaussianBatch, got list
    """
    kind = kind_of(obj)
    if kind is None or kind not in accept:
        names = [_CLASS_NAMES[k] for k in accept]
        wanted = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise ArgumentTypeError(f"{name} must be a {wanted}, got {type(obj).__name__}")
    return kind


def warn_stop(status: Status, message: str, *, warn: bool = True,
              stacklevel: int = 3) -> None:
    """Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when a run ended without
    an answer (``status.success`` is false: ``nonfinite``, ``failed``, ``max_steps``,
    ``interrupted``) and ``warn`` is true; an answer (``ok``, ``converged``, ``blowup``,
    ``diverging``) is reported in the status only (see :class:`Status`).

    Parameters
    ----------
    status : Status or str
        How the run ended.
    message : str
        The run's message (the warning reads ``"<status>: <message>"``).
    warn : bool, default True
        The ``warn=`` argument of the solver; ``False`` issues nothing.
    stacklevel : int, default 3
        Passed to :func:`warnings.warn` (3: the caller of the function calling this one).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error")
    ...     warn_stop("blowup", "finite-time blow-up at t=0.88")   # an answer: silent
    """
    if check_warn(warn) and not Status.parse(status).success:
        warnings.warn(f"{status}: {message}", EarlyStopWarning, stacklevel=stacklevel)


def check_warn(warn: Any) -> bool:
    """The ``warn=`` argument of a solver as a ``bool`` (Python or NumPy bool); anything
    else raises :class:`~transformer_pde.errors.ArgumentTypeError` naming ``warn``.
    Solvers call it before they run, so that a wrong value fails at once."""
    if type(warn).__name__ not in ("bool", "bool_"):
        raise ArgumentTypeError(f"warn must be True or False, got {type(warn).__name__}")
    return bool(warn)
