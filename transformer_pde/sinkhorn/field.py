r"""The Sinkhorn attention field of one head, and the record of its solves.

With converged potentials :math:`(f, g)` of the self-coupling (:mod:`transformer_pde.sinkhorn`),
the field at any point :math:`x` is the softmax average

.. math:: \Gamma(x) = \sum_j w_j\, e^{(f(x) + g_j + s(x, x_j))/\varepsilon}\, v_j,\qquad
          f(x) = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + s(x, x_j))/\varepsilon\big),

whose normaliser is the out-of-sample potential :math:`f(x)`
(:func:`out_of_sample_potential`): the kernel rows sum to one at every point, so the field
is a convex combination of the values :math:`v_j`.  :func:`sinkhorn_field` solves
(warm-started) and evaluates; :class:`SinkhornRecord` keeps the iterations of every solve
of a field evaluator, and :func:`sinkhorn_summary` summarises them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, SinkhornNotConverged
from ..validation import finite_array, integer, type_name
from .options import DEFAULT_MAX_ITER, DEFAULT_TOL
from .potentials import SinkhornResult, sinkhorn_potentials
from .warmstart import SinkhornWarmStart

__all__ = ["SinkhornRecord", "out_of_sample_potential", "sinkhorn_field", "sinkhorn_summary"]


def out_of_sample_potential(be: Any, q: Any, kx: Any, logw: Any, g: Any, eps: float) -> Any:
    r"""Out-of-sample Sinkhorn potential :math:`f(x)` at arbitrary points.

    .. math:: f(x) = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + q(x)\cdot k_j)/\varepsilon\big)

    ``q`` holds the projected queries :math:`\beta Q x` (M, r).  At the tokens this is
    :math:`T_f(g)`; it makes :math:`\sum_j w_j k(x, x_j) = 1` at every point :math:`x`.
    """
    return -eps * be.lse(q * (1.0 / eps), kx, logw + g * (1.0 / eps), None)


def sinkhorn_field(be: Any, qx: Any, kx: Any, vx: Any, logw: Any, eps: float, *,
                   q_query: Any = None, symmetric: bool = False,
                   state: SinkhornWarmStart | None = None, t: float = 0.0,
                   tol: float = DEFAULT_TOL, max_iter: int = DEFAULT_MAX_ITER, anderson: int = 10, label: str = "",
                   stage: int | None = None) -> tuple[Any, SinkhornResult]:
    r"""One head of Sinkhorn attention: :math:`\sum_j w_j k(x, x_j)\, v_j` at the tokens or at queries.

    Solves for the potentials (warm-started from ``state``), then averages ``vx`` (the
    projected values :math:`V x_j`) with the kernel whose :math:`f(x)` is the out-of-sample
    potential.  At the tokens the average comes out of the last Sinkhorn sweep for free.

    Parameters
    ----------
    be, qx, kx, logw, eps, symmetric, tol, max_iter, anderson
        As in :func:`~transformer_pde.sinkhorn.sinkhorn_potentials`.
    vx : array (N, c)
        Values at the tokens.
    q_query : array (M, r), optional
        Projected queries :math:`\beta Q x` of other evaluation points.
    state : SinkhornWarmStart, optional
        Warm-start memory, updated in place with the new potentials.
    t : float
        Evaluation time (for the warm-start extrapolation and messages).
    label : str
        Name of the problem in error messages (e.g. ``"head 0"``).
    stage : int, optional
        Index of this evaluation within a fixed-step solver step: warm-start from the
        same stage of the previous steps (see :class:`SinkhornWarmStart`).

    Returns
    -------
    out : array (N, c) or (M, c)
        The field at the tokens (or at the queries).
    result : SinkhornResult
        The converged solve: its iterations (``n_iter``), error and tolerance are the
        diagnostics of this evaluation (:meth:`SinkhornRecord.add` keeps them).

    Raises
    ------
    SinkhornNotConverged
        The marginal error is still above the tolerance after ``max_iter`` sweeps (the
        warm-start memory is then cleared).
    """
    n = kx.shape[0]
    f0, g0 = (None, None) if state is None else state.predict(t, n, stage)
    res = sinkhorn_potentials(be, qx, kx, logw, eps, tol=tol, max_iter=max_iter, f0=f0,
                              g0=g0, symmetric=symmetric,
                              values=vx if q_query is None else None, anderson=anderson,
                              memory=None if state is None or not state.reuse_secants
                              else state.memory,
                              expect=None if g0 is None and f0 is None
                              else state.expected_error(stage))
    if not res.converged:
        if state is not None:
            state.clear()
        where = f" for {label}" if label else ""
        raise SinkhornNotConverged(
            f"Sinkhorn did not converge{where} at t={t:.6g}: {res.failure()} (eps={eps:g}); "
            "raise sinkhorn_max_iter, loosen sinkhorn_tol or increase eps")
    if state is not None:
        # remember the accelerated step after the converged iterate: a better start for
        # the next solve (fewer iterations), while the field below uses the verified (f, g)
        g_keep = res.g if res.g_next is None else res.g_next
        state.update(t, g_keep if res.f is res.g else res.f, g_keep, stage,
                     memory=res.memory,
                     start_error=res.errors[0] if res.errors and g0 is not None else None)
    if q_query is None:
        return res.out, res
    out = be.softmax(q_query * (1.0 / eps), kx, vx, logw + res.g * (1.0 / eps), None)[0]
    return out, res


#: the keys of :meth:`SinkhornRecord.as_info` (and of a trajectory's ``info``)
_INFO_KEYS = ("sinkhorn_iterations", "sinkhorn_times", "sinkhorn_stages")


@dataclass
class SinkhornRecord:
    """The converged Sinkhorn solves of a field evaluator, one entry per head and evaluation.

    Attributes
    ----------
    iterations : list of int
        Iterations of each solve (:attr:`SinkhornResult.n_iter
        <transformer_pde.sinkhorn.SinkhornResult.n_iter>`).
    times : list of float
        Evaluation time of each solve.
    stages : list of int or None
        Index of each evaluation within its fixed-step solver step (``None`` outside one:
        adaptive methods, direct evaluations).
    """

    iterations: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stages: list[int | None] = field(default_factory=list)

    def add(self, result: SinkhornResult, t: float, stage: int | None) -> None:
        """Record the solve ``result`` of the evaluation at time ``t`` and ``stage``."""
        self.iterations.append(int(result.n_iter))
        self.times.append(float(t))
        self.stages.append(None if stage is None else int(stage))

    def as_info(self) -> dict[str, list]:
        """``{"sinkhorn_iterations": ..., "sinkhorn_times": ..., "sinkhorn_stages": ...}``
        (copies), or ``{}`` before any solve: the entries of a trajectory's ``info``."""
        if not self.iterations:
            return {}
        return dict(zip(_INFO_KEYS, (list(self.iterations), list(self.times),
                                     list(self.stages)), strict=True))

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> SinkhornRecord:
        """The record whose :meth:`as_info` is ``info`` (``{}``: an empty record).

        Raises
        ------
        TypeError
            ``info`` is not a mapping, or an entry is not a list of the right kind
            (the message names the entry).
        ValueError
            Other keys, a missing key, lists of different lengths, or an iteration count
            or stage that is not an integer >= 0, or a time that is not finite.
        """
        _check_mapping(info)
        if not info:
            return cls()
        if set(info) != set(_INFO_KEYS):
            raise ArgumentError(f"a Sinkhorn record has the keys {list(_INFO_KEYS)}, got "
                                f"{sorted(info)}")
        its = _counts(info, "sinkhorn_iterations")
        times = _times(info, "sinkhorn_times")
        stages = _counts(info, "sinkhorn_stages", none_ok=True)
        if not len(its) == len(times) == len(stages):
            raise ArgumentError(f"a Sinkhorn record's lists differ in length: {len(its)} "
                                f"iterations, {len(times)} times, {len(stages)} stages")
        return cls(its, times, stages)


def _check_mapping(info: Any) -> None:
    """Refuse an ``info`` that is not a mapping, naming it (and, for an object that has
    one, such as a trajectory, saying to pass its ``.info``)."""
    if not isinstance(info, Mapping):
        hint = (f"; pass its record, {type(info).__name__}.info"
                if isinstance(getattr(info, "info", None), Mapping) else "")
        raise ArgumentTypeError(f"info must be a mapping such as a trajectory's info, got "
                                f"{type_name(info)}{hint}")


#: counts are summed as int64: one at or beyond 2**63 cannot be a count and is refused
_COUNT_LIMIT = 2 ** 63


def _counts(info: Mapping[str, Any], key: str, *, none_ok: bool = False) -> list:
    """The entry ``key`` of ``info`` (default ``[]``) as a list of integers >= 0 (``None``
    entries kept where ``none_ok``); anything else raises naming ``info[key]``."""
    name = f"info[{key!r}]"
    value = info.get(key, [])
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        if value.size and value.min() < 0:
            raise ArgumentError(f"{name} must hold integers >= 0, got {int(value.min())}")
        return value.tolist()
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        what = "integers >= 0 or None" if none_ok else "integers >= 0"
        shape = f" of shape {value.shape}" if isinstance(value, np.ndarray) else ""
        raise ArgumentTypeError(f"{name} must be a list of {what}, got {type_name(value)}"
                                f"{shape}")
    if all(type(v) is int and 0 <= v < _COUNT_LIMIT for v in value):  # the common case
        return list(value)
    counts = [None if v is None and none_ok else integer(f"{name}[{i}]", v, minimum=0)
              for i, v in enumerate(value)]
    for i, v in enumerate(counts):
        if v is not None and v >= _COUNT_LIMIT:
            raise ArgumentError(f"{name}[{i}] = {v} is not a count of iterations (beyond "
                                "the 64-bit integers the summary sums in)")
    return counts


def _times(info: Mapping[str, Any], key: str) -> list[float]:
    """The entry ``key`` of ``info`` as a list of finite floats, or an error naming it."""
    name = f"info[{key!r}]"
    arr = finite_array(name, info[key])
    if arr.ndim != 1:
        raise ArgumentError(f"{name} must be a list of times, got shape {arr.shape}")
    return arr.tolist()


def sinkhorn_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    """Iteration statistics from a trajectory's (or evaluator's) ``info``.

    Returns per-evaluation statistics of ``info["sinkhorn_iterations"]`` (one entry per
    head and field evaluation: ``evaluations``, ``total``, ``mean``, ``median``, ``max``,
    ``min``) and, when ``info["n_steps"]`` is present (trajectories from
    :func:`~transformer_pde.simulate`), the mean number of iterations per time step
    (``per_step_mean``: all evaluations and heads of a step together; 4 evaluations per
    RK4 step).  When the recorded stage indices (``info["sinkhorn_stages"]``) show that
    every step made the same evaluations -- a fixed-step method, every step with the same
    sequence of stages -- ``per_step`` lists the iterations of each step.

    Raises
    ------
    TypeError
        ``info`` is not a mapping (a trajectory itself: pass ``traj.info``), or one of the
        entries above is not a list of integers (the message names the entry).
    ValueError
        An iteration count, stage or ``n_steps`` that is not an integer >= 0.
    """
    _check_mapping(info)
    its = np.asarray(_counts(info, "sinkhorn_iterations"), dtype=np.int64)
    n_steps = info.get("n_steps")
    n_steps = None if n_steps is None else integer("info['n_steps']", n_steps, minimum=0)
    stages = info.get("sinkhorn_stages")
    stages = None if stages is None else _counts(info, "sinkhorn_stages", none_ok=True)
    if its.size == 0:
        return {"evaluations": 0}
    out: dict[str, Any] = {"evaluations": int(its.size), "total": int(its.sum()),
                           "mean": float(its.mean()), "median": float(np.median(its)),
                           "max": int(its.max()), "min": int(its.min())}
    if n_steps:
        out["per_step_mean"] = float(its.sum() / n_steps)
        if _same_stages_every_step(stages, its.size, n_steps):
            out["per_step"] = its.reshape(n_steps, -1).sum(axis=1).tolist()
    return out


def _same_stages_every_step(stages: Any, n_eval: int, n_steps: int) -> bool:
    """Whether ``n_eval`` evaluations split into ``n_steps`` steps with one and the same
    sequence of stage indices each (``None`` stages: not a fixed-step run)."""
    if stages is None or len(stages) != n_eval or n_eval % n_steps != 0:
        return False
    if any(s is None for s in stages):
        return False
    table = np.asarray(stages, dtype=np.int64).reshape(n_steps, -1)
    return bool(table[:, 0].min() == 0 and np.all(table == table[0]))
