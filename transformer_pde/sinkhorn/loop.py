r"""One log-domain Sinkhorn loop, parametrised by its soft-min.

Entropic optimal transport between :math:`\alpha = \sum_i a_i\delta_{x_i}` and
:math:`\beta = \sum_j b_j\delta_{y_j}` for a cost :math:`C_{ij}` and a regularisation
:math:`\varepsilon > 0` looks for dual potentials :math:`(f, g)` whose plan
:math:`\pi_{ij} = a_i b_j\, e^{(f_i + g_j - C_{ij})/\varepsilon}` has marginals
:math:`a` and :math:`b`.  Both marginal equations are fixed-point equations of a
*soft-min*,

.. math:: f_i = \mathrm{softmin}_\varepsilon(g)_i
              = -\varepsilon\log\sum_j b_j\, e^{(g_j - C_{ij})/\varepsilon},\qquad
          g_j = -\varepsilon\log\sum_i a_i\, e^{(f_i - C_{ij})/\varepsilon},

and Sinkhorn's algorithm alternates them.  Everything that depends on the cost, the
weights and the hardware -- dense blocks of squared distances, a streaming backend
``lse`` kernel over scores :math:`q_i\cdot k_j`, ... -- lives in the soft-min, a callable
``softmin(h, eps) -> potential`` handed to :func:`sinkhorn_loop`.  The loop owns
everything else, once:

**Updates.**  *Alternating* (two soft-mins, ``SoftMins.f`` and ``SoftMins.g``): the map
:math:`g \mapsto T(g) = \mathrm{softmin}_g(\mathrm{softmin}_f(g))`, two passes over the
pairs per iteration.  After :math:`f = \mathrm{softmin}_f(g)` the row marginals are exact
and the column log-error is :math:`\|T(g) - g\|_\infty/\varepsilon`.  *Symmetric* (one
soft-min; :math:`\alpha = \beta` and :math:`C = C^\top`, e.g. the self-coupling of a
symmetric score or the debiasing terms of a Sinkhorn divergence): the potentials are
equal, :math:`f = g`, and solve :math:`f = T(f) = \mathrm{softmin}(f)`, one pass per
iteration, error :math:`\|Tf - f\|_\infty/\varepsilon`.  Plain :math:`T` oscillates on
constants (:math:`T(f + c) = Tf - c`), so the unaccelerated iteration is the symmetric
averaging :math:`f \leftarrow (f + Tf)/2` (the geometric mean :math:`u \leftarrow
\sqrt{u\,Tu}` of the scalings :math:`u = e^{f/\varepsilon}`).

**Stopping rule.**  Stop when the log-domain marginal error
:math:`\|T(x) - x\|_\infty/\varepsilon` of the current pair is below the tolerance, or when
it is not finite, or when the iteration budget is spent.

**Acceleration and safeguard.**  Anderson mixing (:class:`~transformer_pde.sinkhorn.Anderson`)
of :math:`x/\varepsilon` with residual :math:`(T(x) - x)/\varepsilon` (halved for the
unaccelerated symmetric map, i.e. the averaging above).  Anderson alone is not globally
convergent; two safeguards are offered.  ``"residual"``: when the error grows tenfold over
the best one seen, the memory is cleared and the iteration restarts from the plain
(unaccelerated) iterate of that best step.  ``"dual"`` (alternating update only, needs
the marginals ``a, b``): after :math:`f = \mathrm{softmin}_f(g)` the dual objective
:math:`\langle a, f\rangle + \langle b, g\rangle - \varepsilon\langle a\otimes b,
e^{(f\oplus g - C)/\varepsilon}\rangle + \varepsilon` equals
:math:`\langle a, f\rangle + \langle b, g\rangle`, for free; plain Sinkhorn increases it at
every step, so an Anderson extrapolation that decreases it is rejected (memory cleared,
plain step from the last accepted point instead): the worst case is plain Sinkhorn, which
converges.

**ε-scaling.**  Far from the solution and at small :math:`\varepsilon` Sinkhorn crawls; a
cold start walks down a geometric ladder :math:`\varepsilon_0 > \varepsilon_0\theta >
\dots > \varepsilon` (:class:`~transformer_pde.sinkhorn.EpsilonScaling`), each
stage warm-started from the last and solved loosely (or by a fixed number of plain
sweeps), the secant memory cleared between stages (secants of another
:math:`\varepsilon` describe another problem).

**Warm starts.**  Starting potentials (``Start.g0``, or ``Start.f0`` alone, from which
:math:`g = \mathrm{softmin}_g(f_0)`) skip the ladder unless it asks to run warm too, and
the Anderson memory of a previous solve of a nearby problem can be passed back in
(``Start.memory``): its secant pairs are a good model of the new Jacobian.

**Fused sweeps.**  A soft-min pair may come with a ``SoftMins.sweep(g, eps) -> (f, T(g),
by-product)`` that does a whole alternating iteration in one pass over the pairs (the
column soft-min of :math:`f = \mathrm{softmin}_f(g)` follows from the plan's column sums,
computed by the backend's ``sinkhorn_sweep``); the loop uses it at the target
:math:`\varepsilon` in place of ``readout``/``f`` and ``g``.

**Readout.**  A by-product of the last row soft-min -- the attention field's value
average :math:`\sum_j \pi_{ij} v_j / a_i` -- comes at no extra pass when the caller gives
a ``SoftMins.readout(h, eps) -> (potential, by-product)`` that replaces ``f`` at the target
:math:`\varepsilon`.

**Lean passes.**  Only the last pass's by-product is used, and reading it out costs
about an eighth of a pass.  So a pass runs with it only when it may be the last: when
the error it will measure, predicted as the last error times the last contraction, is
below ``LEAN_MARGIN`` times the tolerance (before the first pass: the
``Stopping.expect``-ed start error).  Other passes use ``f`` or the sweep's ``lean``
variant.  If a
lean pass converges after all, one readout pass at the same point supplies the
by-product.  Which passes were lean changes nothing but the last bits of the
soft-mins (two kernels round differently).

The operators are passed as :class:`~transformer_pde.sinkhorn.SoftMins`, the
rest as the records of :mod:`transformer_pde.sinkhorn.options`.

Users: :func:`transformer_pde.sinkhorn.sinkhorn_potentials` (Sinkhorn attention, soft-min =
the backend's streaming ``lse``) and :func:`transformer_pde.diagnostics.wasserstein`
(debiased Sinkhorn divergence, soft-min = dense blocks of squared distances).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from .anderson import Anderson
from .options import Acceleration, EpsilonScaling, SoftMins, Start, Stopping

__all__ = ["LoopResult", "sinkhorn_loop"]


@dataclass
class LoopResult:
    r"""Outcome of :func:`sinkhorn_loop`.

    Attributes
    ----------
    f, g : arrays
        Potentials.  Alternating update: ``f = SoftMins.f(g)`` (exact row marginals;
        column log-error ``err``).  Symmetric update: ``f is g``.  With
        ``Stopping(finish="image")`` a stopped solve returns the last image :math:`T(x)`
        instead of :math:`x` as ``g`` (and ``f`` is then that of the previous half-step:
        recompute it if the pair must be exact on the rows).
    n_iter : int
        Iterations, all stages together (one iteration = two passes over the pairs on the
        alternating update, one on the symmetric one).
    err : float
        Marginal log-error at the target :math:`\varepsilon` (``inf`` when the ladder ran
        out of budget before reaching it).
    converged : bool
        ``err < tol`` at the target :math:`\varepsilon`.
    reached_target : bool
        Whether the target :math:`\varepsilon` was iterated at all.
    out : object
        The readout's by-product of the last row soft-min at the target, else ``None``.
    memory : Anderson
        The secant memory after the solve (pass back as ``Start(memory=...)`` for a
        nearby problem).
    stages : list of (float, int, float)
        ``(eps, iterations, err)`` of every stage run.
    errors : list of float
        The marginal log-error of every iterate at the target :math:`\varepsilon`, in
        order (the first one is that of the start when warm: how good the prediction was).
    g_next : array or None
        When the solve converged at the target and ``Stopping.next_step`` is set: the
        iterate that would have followed the last one (the accelerated step from ``g``
        and its image, no extra pass over the pairs; ``memory`` is left as the solve left
        it).  Its error is not measured -- it is typically several times below ``err``
        -- so it is no result: it is the better point to remember for the warm start of
        a nearby problem.
    """

    f: Any
    g: Any
    n_iter: int
    err: float
    converged: bool
    reached_target: bool
    out: Any = None
    memory: Any = field(default=None, repr=False)
    stages: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    g_next: Any = None


def sinkhorn_loop(xp: Any, softmins: SoftMins, eps: float, *, n: int, stopping: Stopping,
                  acceleration: Acceleration | None = None, start: Start | None = None,
                  scaling: EpsilonScaling | None = None) -> LoopResult:
    r"""Solve the entropic transport dual by Sinkhorn iterations of the given soft-min(s).

    The dual update is

    .. math:: f_i \leftarrow -\varepsilon\log\sum_j b_j\,e^{(g_j - C_{ij})/\varepsilon},\qquad
              g_j \leftarrow -\varepsilon\log\sum_i a_i\,e^{(f_i - C_{ij})/\varepsilon}

    (``softmins.f`` then ``softmins.g``), or :math:`f \leftarrow \mathrm{softmin}(f)` for
    the symmetric problem (``softmins.g is None``); see the module docstring for the
    stopping rule, the acceleration, the safeguards and :math:`\varepsilon`-scaling.

    Parameters
    ----------
    xp : module
        Array namespace of the potentials (``numpy``, ``cupy``).
    softmins : SoftMins
        The soft-min(s) and the passes that stand in for them at the target.
    eps : float
        Target regularisation.
    n : int
        Length of the iterated potential (``g``; ``f`` on the symmetric path), for the cold
        start and the Anderson memory.
    stopping : Stopping
        Tolerance at ``eps``, iteration budget (all stages together), expected start
        error, the point handed on and whether to compute ``g_next``.
    acceleration : Acceleration, optional
        Anderson memory and safeguard (default: memory 10, ``"residual"``).
    start : Start, optional
        Starting potentials, secant memory and dtype (default: a cold start in float64).
    scaling : EpsilonScaling, optional
        :math:`\varepsilon`-scaling ladder of a cold start.

    Returns
    -------
    LoopResult
        Never raises on non-convergence: check ``converged``.

    Raises
    ------
    ArgumentTypeError
        An argument that is not the record it should be.
    ArgumentError
        A fused sweep or the ``"dual"`` safeguard without the alternating update, or a
        fused sweep with the ``"dual"`` safeguard.
    """
    acceleration = Acceleration() if acceleration is None else acceleration
    start = Start() if start is None else start
    _check(softmins, stopping, acceleration, start, scaling)
    x = _start_point(xp, softmins, eps, n, start)
    schedule = [eps]
    if scaling is not None and (start.cold or scaling.warm):
        schedule = scaling.ladder(eps)
    memory = start.memory
    acc = memory if memory is not None and memory.m == acceleration.anderson \
        else Anderson(acceleration.anderson)
    used = 0
    f, out, err, converged, reached, x_next = None, None, np.inf, False, False, None
    stages: list = []
    errors: list = []
    for k, e in enumerate(schedule):
        final = k == len(schedule) - 1
        if final:
            stage_tol, budget = stopping.tol, stopping.max_iter - used
        else:
            assert scaling is not None
            stage_tol = scaling.stage_tol
            budget = min(stopping.max_iter - used, int(scaling.stage_max_iter))
        if budget <= 0:
            break
        if len(schedule) > 1:
            acc.reset()  # secants of another eps describe another problem
        acc.new_problem(n)
        if stage_tol is None:
            x, f, it, err = _sweeps(xp, softmins, x, e, budget)
            out = None
        else:
            run = _Stage(xp, softmins, acc, acceleration, stopping, final,
                         errors if final else None)
            x, f, out, err, it, x_next = run(x, e, stage_tol, budget)
        used += it
        stages.append((e, it, err))
        reached = final
        converged = bool(err < stage_tol) if stage_tol is not None else False
        if not np.isfinite(err):
            break
    if not reached:
        err, converged, out = np.inf, False, None
    if softmins.symmetric:
        f = x
    return LoopResult(f=f, g=x, n_iter=used, err=float(err), converged=converged,
                      reached_target=reached, out=out if reached else None, memory=acc,
                      stages=stages, errors=errors, g_next=x_next if converged else None)


def _check(softmins: Any, stopping: Any, acceleration: Any, start: Any, scaling: Any) -> None:
    """Each argument is its record, and the records go together (see :func:`sinkhorn_loop`)."""
    for name, value, kind in (("softmins", softmins, SoftMins), ("stopping", stopping, Stopping),
                              ("acceleration", acceleration, Acceleration),
                              ("start", start, Start)):
        if not isinstance(value, kind):
            raise ArgumentTypeError(f"sinkhorn_loop: {name} must be a {kind.__name__}, got "
                                    f"{type(value).__name__}")
    if scaling is not None and not isinstance(scaling, EpsilonScaling):
        raise ArgumentTypeError(f"sinkhorn_loop: scaling must be an EpsilonScaling or None, "
                                f"got {type(scaling).__name__}")
    if acceleration.safeguard == "dual" and (softmins.symmetric or softmins.sweep is not None):
        raise ArgumentError("sinkhorn_loop: the dual safeguard needs the alternating update "
                            "(SoftMins.g) and no fused sweep")


def _start_point(xp: Any, softmins: SoftMins, eps: float, n: int, start: Start) -> Any:
    """The first iterate: ``g0``, else ``f0`` (through the column soft-min on the
    alternating update), else zeros."""
    dtype = np.float64 if start.dtype is None else start.dtype
    if start.g0 is not None:
        return xp.asarray(start.g0, dtype=dtype)
    if start.f0 is not None:
        f0 = xp.asarray(start.f0, dtype=dtype)
        return f0 if softmins.symmetric else softmins.g(f0, eps)
    return xp.zeros(n, dtype=dtype)


def _sweeps(xp: Any, softmins: SoftMins, x: Any, eps: float, count: int
            ) -> tuple[Any, Any, int, float]:
    r"""``count`` plain sweeps without a stopping test: the symmetric averaging
    :math:`f \leftarrow (f + Tf)/2`, or :math:`g \leftarrow T(g)`.  Returns
    ``(x, f, count, err)`` with ``err`` the marginal error of the last sweep's input."""
    softmin_f, softmin_g = softmins.f, softmins.g
    f, err = None, np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        for _ in range(count):
            if softmin_g is None:
                Tx = softmin_f(x, eps)
                f = Tx
            else:
                f = softmin_f(x, eps)
                Tx = softmin_g(f, eps)
            err = float(xp.max(xp.abs(Tx - x))) * (1.0 / eps)
            x = 0.5 * (x + Tx) if softmin_g is None else Tx
    return x, f, count, err


#: a pass is run with the by-product (``readout`` / the fused ``sweep`` with values) when
#: the error it will measure is predicted below ``LEAN_MARGIN * tol``; other passes are
#: lean (``SoftMins.f`` / ``sweep.lean``).  A lean pass that converges after all costs one
#: more pass (the readout at the same point), a full pass that does not converge about an
#: eighth of a pass (the by-product's share of a pass), hence the generous margin.
LEAN_MARGIN = 10.0


def _may_be_last(seen: list, tol: float, expect: float | None) -> bool:
    """Whether the next pass may meet ``tol``: its error is predicted as the last one
    times the last contraction (the first step of a stage is assumed to gain 10x), or,
    before any pass, as ``expect`` (unknown: assumed not to)."""
    if not seen:
        return expect is not None and expect < LEAN_MARGIN * tol
    rate = 0.1
    if len(seen) >= 2 and seen[-2] > 0:
        rate = min(seen[-1] / seen[-2], 1.0)
    return seen[-1] * rate < LEAN_MARGIN * tol


class _Stage:
    r"""Safeguarded Anderson iteration at one ``eps`` (see the module docstring).

    ``final`` says whether this is the target :math:`\varepsilon`: only there are the
    readout, the fused sweep, ``Stopping.expect`` and ``Stopping.next_step`` used, and
    every error appended to ``history``.
    """

    def __init__(self, xp: Any, softmins: SoftMins, acc: Anderson, acceleration: Acceleration,
                 stopping: Stopping, final: bool, history: list | None):
        self.xp, self.acc, self.history = xp, acc, history
        self.softmin_f, self.softmin_g = softmins.f, softmins.g
        self.readout = softmins.readout if final else None
        self.sweep = softmins.sweep if final else None
        self.safeguard, self.marginals = acceleration.safeguard, acceleration.marginals
        self.finish = stopping.finish
        self.next_step = stopping.next_step and final
        self.expect = stopping.expect if final else None

    def _pass(self, x: Any, eps: float, full: bool) -> tuple[Any, Any, Any]:
        """One row pass from ``x``: ``(f, T(x) or None, by-product)``; the by-product is
        read out when ``full`` (the pass may be the last)."""
        sweep = self.sweep
        if sweep is not None:
            lean = getattr(sweep, "lean", None)    # the fused sweep without the by-product
            return sweep(x, eps) if full or lean is None else lean(x, eps)
        if self.readout is not None and full:
            f, out = self.readout(x, eps)
            return f, None, out
        return self.softmin_f(x, eps), None, None

    def __call__(self, x: Any, eps: float, tol: float, max_iter: int
                 ) -> tuple[Any, Any, Any, float, int, Any]:
        """Returns ``(x, f, out, err, iterations, x_next)``: the point handed on
        (``Stopping.finish``), the row potential of the last evaluation, the readout's
        by-product, the error of the last evaluated iterate and, when it met ``tol`` and
        ``next_step`` is set, the accelerated step that would have followed
        (``LoopResult.g_next``), else ``None``."""
        xp, acc, history = self.xp, self.acc, self.history
        symmetric = self.softmin_g is None
        inv = 1.0 / eps
        # the unaccelerated symmetric map is the averaging (f + Tf)/2: residual halved
        damp = 0.5 if symmetric and acc.m <= 0 else 1.0
        best_err, best = np.inf, None          # "residual": best error and its plain iterate
        best_dual, plain_next = -np.inf, x     # "dual": best objective and the plain step
        f, out, err, it, x_next = None, None, np.inf, 0, None
        seen: list = []                        # this stage's errors, for _may_be_last
        with np.errstate(invalid="ignore", over="ignore"):
            for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned
                f, Tx, out = self._pass(x, eps, _may_be_last(seen, tol, self.expect))
                if symmetric:
                    Tx = f
                elif self.sweep is None:
                    if self.safeguard == "dual":
                        a, b = self.marginals
                        dual = float(a @ f + b @ x)
                        if dual < best_dual - 1e-13 * (abs(best_dual) + eps):
                            # the extrapolation lost dual objective: plain step instead
                            acc.reset()
                            x = plain_next
                            continue
                        best_dual = dual
                    Tx = self.softmin_g(f, eps)
                err = float(xp.max(xp.abs(Tx - x))) * inv
                seen.append(err)
                if history is not None:
                    history.append(err)
                if not np.isfinite(err) or err < tol:
                    if err < tol and out is None and self.readout is not None:
                        # converged on a lean pass: one more pass at the same point reads
                        # the by-product out (the iteration count is unchanged)
                        f, out = self.readout(x, eps)
                    if self.next_step and err < tol:
                        # the step after the last iterate: no pass over the pairs (its
                        # image Tx is known); the memory is left as it is
                        x_next = eps * acc.peek(xp, x * inv, (Tx - x) * (damp * inv))
                    if self.finish == "image":
                        x = Tx
                    break
                if self.safeguard == "residual":
                    if err < best_err:
                        best_err, best = err, (0.5 * (x + Tx) if symmetric else Tx)
                    elif err > 10.0 * best_err:
                        # Anderson went astray: restart from the best plain iterate
                        acc.reset()
                        x = best
                        continue
                else:
                    plain_next = Tx
                x = eps * acc.step(xp, x * inv, (Tx - x) * (damp * inv))
        return x, f, out, err, it, x_next
