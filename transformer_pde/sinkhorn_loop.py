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

**Updates.**  *Alternating* (two soft-mins, ``softmin_f`` and ``softmin_g``): the map
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

**Acceleration and safeguard.**  Anderson mixing (:class:`~transformer_pde.anderson.Anderson`)
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
\dots > \varepsilon` (:class:`EpsilonScaling`), each stage warm-started from the last and
solved loosely (or by a fixed number of plain sweeps), the secant memory cleared between
stages (secants of another :math:`\varepsilon` describe another problem).

**Warm starts.**  Starting potentials (``g0``, or ``f0`` alone, from which
:math:`g = \mathrm{softmin}_g(f_0)`) skip the ladder unless it asks to run warm too, and
the Anderson memory of a previous solve of a nearby problem can be passed back in
(``memory``): its secant pairs are a good model of the new Jacobian.

**Fused sweeps.**  A soft-min pair may come with a ``sweep(g, eps) -> (f, T(g),
by-product)`` that does a whole alternating iteration in one pass over the pairs (the
column soft-min of :math:`f = \mathrm{softmin}_f(g)` follows from the plan's column sums,
see :mod:`transformer_pde.sinkhorn_kernels`); the loop uses it at the target
:math:`\varepsilon` in place of ``readout``/``softmin_f`` and ``softmin_g``.

**Readout.**  A by-product of the last row soft-min -- the attention field's value
average :math:`\sum_j \pi_{ij} v_j / a_i` -- comes at no extra pass when the caller gives
a ``readout(h, eps) -> (potential, by-product)`` that replaces ``softmin_f`` at the target
:math:`\varepsilon`.

**Lean passes.**  Only the last pass's by-product is used, and reading it out costs
about an eighth of a pass.  So a pass runs with it only when it may be the last: when
the error it will measure, predicted as the last error times the last contraction, is
below ``LEAN_MARGIN`` times the tolerance (before the first pass: the ``expect``-ed
start error).  Other passes use ``softmin_f`` or the sweep's ``lean`` variant.  If a
lean pass converges after all, one readout pass at the same point supplies the
by-product.  Which passes were lean changes nothing but the last bits of the
soft-mins (two kernels round differently).

Users: :func:`transformer_pde.sinkhorn.sinkhorn_potentials` (Sinkhorn attention, soft-min =
the backend's streaming ``lse``) and :func:`transformer_pde.diagnostics.wasserstein`
(debiased Sinkhorn divergence, soft-min = dense blocks of squared distances).

This module imports nothing from the package but :mod:`transformer_pde.anderson`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .anderson import Anderson

__all__ = ["EpsilonScaling", "LoopResult", "SoftMin", "sinkhorn_loop"]

#: ``softmin(h, eps) -> potential``: :math:`-\varepsilon\log\sum_j b_j e^{(h_j - C_{ij})/\varepsilon}`
#: for every row :math:`i` (any array namespace).
SoftMin = Callable[[Any, float], Any]


@dataclass(frozen=True)
class EpsilonScaling:
    r"""The :math:`\varepsilon`-scaling ladder of a cold start.

    Stages :math:`\varepsilon_k = \varepsilon_0\,\theta^k` for as long as
    :math:`\varepsilon_k > \varepsilon(1 + \text{margin})`, then the target
    :math:`\varepsilon`.

    Parameters
    ----------
    start : float
        :math:`\varepsilon_0`, where the problem is nearly solved by one iteration (a
        multiple of the cost range).  No ladder when it is not above the target.
    factor : float
        Ratio :math:`\theta \in (0, 1)` of consecutive stages.
    stage_tol : float or None
        Tolerance of the coarse stages (their own marginal error).  ``None``: no
        stopping test, ``stage_max_iter`` plain sweeps per stage (the symmetric
        averaging, or a plain alternating sweep).
    stage_max_iter : int
        Iteration budget of one coarse stage (always bounded by what is left of the
        total budget).
    margin : float
        Relative margin: a stage within ``eps * (1 + margin)`` of the target is skipped.
    warm : bool
        Also walk the ladder when the loop is warm-started (default: only cold starts).
    """

    start: float
    factor: float
    stage_tol: float | None
    stage_max_iter: int
    margin: float = 0.0
    warm: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.factor < 1.0:
            raise ValueError(f"factor must be in (0, 1), got {self.factor!r}")
        if int(self.stage_max_iter) < 1:
            raise ValueError(f"stage_max_iter must be >= 1, got {self.stage_max_iter!r}")

    def ladder(self, eps: float) -> list[float]:
        """The stages down to ``eps`` (the last entry is ``eps`` itself)."""
        stages = []
        e = float(self.start)
        stop = eps * (1.0 + self.margin)
        while e > stop:
            stages.append(e)
            e *= self.factor
        return stages + [eps]


@dataclass
class LoopResult:
    r"""Outcome of :func:`sinkhorn_loop`.

    Attributes
    ----------
    f, g : arrays
        Potentials.  Alternating update: ``f = softmin_f(g)`` (exact row marginals; column
        log-error ``err``).  Symmetric update: ``f is g``.  With ``finish="image"`` a
        stopped solve returns the last image :math:`T(x)` instead of :math:`x` as ``g``
        (and ``f`` is then that of the previous half-step: recompute it if the pair must
        be exact on the rows).
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
        The secant memory after the solve (pass back as ``memory=`` for a nearby problem).
    stages : list of (float, int, float)
        ``(eps, iterations, err)`` of every stage run.
    errors : list of float
        The marginal log-error of every iterate at the target :math:`\varepsilon`, in
        order (the first one is that of the start when warm: how good the prediction was).
    g_next : array or None
        When the solve converged at the target: the iterate that would have followed the
        last one (the accelerated step from ``g`` and its image, no extra pass over the
        pairs; ``memory`` is left as the solve left it).  Its error is not measured
        -- it is typically several times below ``err`` -- so it is no result: it is the
        better point to remember for the warm start of a nearby problem.
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


def sinkhorn_loop(xp: Any, softmin_f: SoftMin, eps: float, *, n: int, tol: float,
                  max_iter: int, softmin_g: SoftMin | None = None, g0: Any = None,
                  f0: Any = None, dtype: Any = None, anderson: int = 10, memory: Any = None,
                  scaling: EpsilonScaling | None = None, safeguard: str = "residual",
                  marginals: tuple[Any, Any] | None = None,
                  readout: Callable[[Any, float], tuple[Any, Any]] | None = None,
                  sweep: Callable[[Any, float], tuple[Any, Any, Any]] | None = None,
                  finish: str = "input", next_step: bool = False,
                  expect: float | None = None) -> LoopResult:
    r"""Solve the entropic transport dual by Sinkhorn iterations of the given soft-min(s).

    The dual update is

    .. math:: f_i \leftarrow -\varepsilon\log\sum_j b_j\,e^{(g_j - C_{ij})/\varepsilon},\qquad
              g_j \leftarrow -\varepsilon\log\sum_i a_i\,e^{(f_i - C_{ij})/\varepsilon}

    (``softmin_f`` then ``softmin_g``), or :math:`f \leftarrow \mathrm{softmin}(f)` for the
    symmetric problem (``softmin_g=None``); see the module docstring for the stopping rule,
    the acceleration, the safeguards and :math:`\varepsilon`-scaling.

    Parameters
    ----------
    xp : module
        Array namespace of the potentials (``numpy``, ``cupy``).
    softmin_f : SoftMin
        ``softmin_f(g, eps)``: the row potentials from the column ones.  Alone: the
        symmetric map.
    eps : float
        Target regularisation.
    n : int
        Length of the iterated potential (``g``; ``f`` on the symmetric path), for the cold
        start and the Anderson memory.
    tol : float
        Marginal log-error tolerance at ``eps``.
    max_iter : int
        Iteration budget, all stages together.
    softmin_g : SoftMin, optional
        ``softmin_g(f, eps)``: the column potentials from the row ones (alternating update).
    g0, f0 : arrays, optional
        Warm start: ``g0`` (the iterated potential), else ``f0``; on the alternating path
        ``f0`` alone starts from :math:`g = \mathrm{softmin}_g(f_0)`.  Neither: zeros
        (cold start).
    dtype : dtype, optional
        Of the cold start's zeros and of the warm start (default float64).
    anderson : int
        Anderson memory (0: plain iteration).
    memory : Anderson, optional
        Secant memory of a previous solve (used when its size ``m`` equals ``anderson``).
    scaling : EpsilonScaling, optional
        :math:`\varepsilon`-scaling ladder of a cold start.
    safeguard : {"residual", "dual"}
        See the module docstring (``"dual"`` needs ``marginals`` and the alternating update).
    marginals : (a, b), optional
        The marginal weights, for the ``"dual"`` safeguard.
    readout : callable, optional
        ``readout(g, eps) -> (f, by-product)``, used instead of ``softmin_f`` at the target
        :math:`\varepsilon`; the by-product of the last call is returned as ``out``.
    sweep : callable, optional
        ``sweep(g, eps) -> (f, g', by-product)``: one whole alternating iteration
        (:math:`f = \mathrm{softmin}_f(g)`, :math:`g' = \mathrm{softmin}_g(f)`), used at
        the target :math:`\varepsilon` instead of ``readout``/``softmin_f`` and ``softmin_g``.
    finish : {"input", "image"}
        Which point a stopped stage hands on (and the loop returns as ``g``): the last
        iterate :math:`x` (its error is ``err``) or its image :math:`T(x)` (half a
        Sinkhorn step further).
    next_step : bool
        On convergence, also compute the accelerated step after the last iterate
        (``LoopResult.g_next``, for warm starts; the memory is not changed by it).
    expect : float, optional
        The marginal error the start is expected to have (e.g. that of the previous
        solve's start), which decides whether the first pass reads the by-product out
        (see **Lean passes** in the module docstring).  Unknown: it does not.

    Returns
    -------
    LoopResult
        Never raises on non-convergence: check ``converged``.
    """
    if safeguard not in ("residual", "dual"):
        raise ValueError(f"safeguard must be 'residual' or 'dual', got {safeguard!r}")
    if finish not in ("input", "image"):
        raise ValueError(f"finish must be 'input' or 'image', got {finish!r}")
    symmetric = softmin_g is None
    if sweep is not None and (symmetric or safeguard == "dual"):
        raise ValueError("a fused sweep needs the alternating update (softmin_g) and the "
                         "residual safeguard")
    if safeguard == "dual" and (symmetric or marginals is None):
        raise ValueError("the dual safeguard needs the alternating update and the marginals")
    dtype = np.float64 if dtype is None else dtype
    cold = g0 is None and f0 is None
    if g0 is not None:
        x = xp.asarray(g0, dtype=dtype)
    elif f0 is not None:
        f0 = xp.asarray(f0, dtype=dtype)
        x = f0 if symmetric else softmin_g(f0, eps)
    else:
        x = xp.zeros(n, dtype=dtype)

    schedule = [eps]
    if scaling is not None and (cold or scaling.warm):
        schedule = scaling.ladder(eps)
    acc = memory if isinstance(memory, Anderson) and memory.m == anderson \
        else Anderson(anderson)
    used = 0
    f, out, err, converged, reached, x_next = None, None, np.inf, False, False, None
    stages: list = []
    errors: list = []
    for k, e in enumerate(schedule):
        final = k == len(schedule) - 1
        if final:
            stage_tol, budget = tol, max_iter - used
        else:
            assert scaling is not None
            stage_tol = scaling.stage_tol
            budget = min(max_iter - used, int(scaling.stage_max_iter))
        if budget <= 0:
            break
        if len(schedule) > 1:
            acc.reset()  # secants of another eps describe another problem
        acc.new_problem(n)
        rows = readout if final and readout is not None else None
        fused = sweep if final else None
        if stage_tol is None:
            x, f, it, err = _sweeps(xp, softmin_f, softmin_g, x, e, budget)
            out = None
        else:
            x, f, out, err, it, x_next = _stage(xp, softmin_f, softmin_g, rows, fused, x, e,
                                                stage_tol, budget, acc, safeguard, marginals,
                                                finish, errors if final else None,
                                                next_step and final,
                                                expect if final else None)
        used += it
        stages.append((e, it, err))
        reached = final
        converged = bool(err < stage_tol) if stage_tol is not None else False
        if not np.isfinite(err):
            break
    if not reached:
        err, converged, out = np.inf, False, None
    if symmetric:
        f = x
    return LoopResult(f=f, g=x, n_iter=used, err=float(err), converged=converged,
                      reached_target=reached, out=out if reached else None, memory=acc,
                      stages=stages, errors=errors, g_next=x_next if converged else None)


def _sweeps(xp, softmin_f, softmin_g, x, eps, count):
    r"""``count`` plain sweeps without a stopping test: the symmetric averaging
    :math:`f \leftarrow (f + Tf)/2`, or :math:`g \leftarrow T(g)`.  Returns
    ``(x, f, count, err)`` with ``err`` the marginal error of the last sweep's input."""
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
#: lean (``softmin_f`` / ``sweep.lean``).  A lean pass that converges after all costs one
#: more pass (the readout at the same point), a full pass that does not converge about an
#: eighth of a pass (measured: lse 0.88x a softmax pass with values, the fused sweep
#: without values 0.88x with them, N = 1e4, d = 2), hence the generous margin.
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


def _stage(xp, softmin_f, softmin_g, readout, sweep, x, eps, tol, max_iter, acc, safeguard,
           marginals, finish, history, next_step=False, expect=None):
    r"""Safeguarded Anderson iteration at one ``eps`` (see the module docstring).

    Returns ``(x, f, out, err, iterations, x_next)``: the point handed on (``finish``),
    the row potential of the last evaluation, the readout's by-product, the error of the
    last evaluated iterate and, when it met ``tol`` and ``next_step`` is set, the
    accelerated step that would have followed (``LoopResult.g_next``), else ``None``.
    Appends every error to ``history`` (a list) when given.
    """
    symmetric = softmin_g is None
    inv = 1.0 / eps
    # the unaccelerated symmetric map is the averaging (f + Tf)/2: residual halved
    damp = 0.5 if symmetric and acc.m <= 0 else 1.0
    best_err, best = np.inf, None          # "residual": best error and its plain iterate
    best_dual, plain_next = -np.inf, x     # "dual": best objective and the plain step
    f, out, err, it, x_next = None, None, np.inf, 0, None
    lean = getattr(sweep, "lean", None)    # the fused sweep without the by-product
    seen: list = []                        # this stage's errors, for _may_be_last
    with np.errstate(invalid="ignore", over="ignore"):
        for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned
            full = _may_be_last(seen, tol, expect)
            if sweep is not None:
                f, Tx, out = sweep(x, eps) if full or lean is None else lean(x, eps)
            elif readout is not None and full:
                f, out = readout(x, eps)
            else:
                f, out = softmin_f(x, eps), None
            if symmetric:
                Tx = f
            elif sweep is None:
                if safeguard == "dual":
                    a, b = marginals
                    dual = float(a @ f + b @ x)
                    if dual < best_dual - 1e-13 * (abs(best_dual) + eps):
                        # the extrapolation lost dual objective: plain step instead
                        acc.reset()
                        x = plain_next
                        continue
                    best_dual = dual
                Tx = softmin_g(f, eps)
            err = float(xp.max(xp.abs(Tx - x))) * inv
            seen.append(err)
            if history is not None:
                history.append(err)
            if not np.isfinite(err) or err < tol:
                if err < tol and out is None and readout is not None:
                    # converged on a lean pass: one more pass at the same point reads the
                    # by-product out (the iteration count is unchanged)
                    f, out = readout(x, eps)
                if next_step and err < tol:
                    # the step after the last iterate: no pass over the pairs (its image
                    # Tx is known); the memory is left as it is (storing that last secant
                    # pair was measured no better for the next solve)
                    x_next = eps * acc.peek(xp, x * inv, (Tx - x) * (damp * inv))
                if finish == "image":
                    x = Tx
                break
            if safeguard == "residual":
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
