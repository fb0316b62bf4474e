r"""Sinkhorn attention: the entropic optimal-transport self-coupling of a token measure.

For tokens :math:`\mu = \sum_j w_j \delta_{x_j}`, scores :math:`s(x, y) = \langle \beta Q x, K y\rangle`
and regularisation :math:`\varepsilon > 0`, Sinkhorn attention (Sander et al. 2022,
"Sinkformers") replaces the row-softmax by the density

.. math:: k(x, y) = \exp\big((f(x) + g(y) + s(x, y))/\varepsilon\big)

of the entropic optimal-transport coupling :math:`\pi = k\,\mu\otimes\mu` of :math:`(\mu,\mu)` for
the cost :math:`-s`.  The potentials solve the two marginal equations

.. math:: \sum_j w_j k(x_i, x_j) = 1, \qquad \sum_i w_i k(x_i, x_j) = 1,

i.e. :math:`f = T_f(g)`, :math:`g = T_g(f)` with the soft-min operators

.. math:: T_f(g)_i = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + s_{ij})/\varepsilon\big),\qquad
          T_g(f)_j = -\varepsilon\,\mathrm{LSE}_i\big(\log w_i + (f_i + s_{ij})/\varepsilon\big).

The velocity field is :math:`\Gamma(x) = V\sum_j w_j k(x, x_j)\, x_j`, where :math:`f(x)` is the
*out-of-sample* potential :math:`T_f(g)(x)` -- exactly the normaliser of a softmax with scores
:math:`s/\varepsilon` and per-key bias :math:`\log w_j + g_j/\varepsilon`, so the field can be
evaluated at any query point.

Solver
------
The iterations are those of the package's one Sinkhorn loop,
:func:`transformer_pde.sinkhorn_loop.sinkhorn_loop` (also behind the Sinkhorn divergence of
:func:`transformer_pde.diagnostics.wasserstein`), with the soft-min
:class:`ScoreSoftMin`: the backend's streaming ``lse`` over the scores, and its
``softmax`` for the readout of the field.
Everything is computed in the log domain with these
primitives (no :math:`N\times N` matrix outside the NumPy reference backend), so
:math:`\varepsilon = 10^{-3}` with scores of :math:`10^3` stays finite, and any backend of the
protocol (NumPy, Numba, a future CuPy one) runs the same code.

* General scores: alternating Sinkhorn :math:`g \mapsto T_g(T_f(g))`, two passes per
  iteration.  After :math:`f = T_f(g)` the rows are exact and the column log-error is
  :math:`\|T_g(f) - g\|_\infty/\varepsilon`.
* Symmetric scores (:math:`A = K^\top Q = A^\top`): :math:`f = g` solves :math:`f = Tf`,
  one pass per iteration, error :math:`\|Tf - f\|_\infty/\varepsilon`.  Anderson is applied
  to :math:`T` itself; without acceleration the averaged map :math:`f \mapsto (f + Tf)/2` (the
  geometric mean :math:`u \leftarrow \sqrt{u\,Tu}` of the scalings) is iterated, since plain
  :math:`T` oscillates on constants (:math:`T(f + c) = Tf - c`).

On the Numba backend, with every weight positive, an alternating iteration is one pass
(:class:`FusedSweep`, :mod:`transformer_pde.sinkhorn_kernels`): the column update follows
from the column sums of the row-normalised plan, so the two soft-mins cost one
exponential per pair.

Both errors are exactly the log-domain marginal error of the returned pair,

.. math:: \mathrm{err}(f, g) = \max\Big(\max_i \Big|\log\frac{\sum_j \pi_{ij}}{w_i}\Big|,\;
          \max_j \Big|\log\frac{\sum_i \pi_{ij}}{w_j}\Big|\Big),

which is the stopping rule.  Both fixed-point maps are accelerated by Anderson mixing
(type II, memory 10) with a safeguard (restart from the best plain iterate when the error
grows tenfold).  Warm starts (:class:`SinkhornWarmStart`) extrapolate the potentials
polynomially in time -- per Runge--Kutta stage inside ``simulate``, from the same stage of
the previous steps -- and keep Anderson's secant pairs from one solve to the next, since
the Jacobian of the fixed-point map changes little along a smooth flow.  Cold starts with
a score range :math:`\max|s|/\varepsilon > 30` use :math:`\varepsilon`-scaling (factor 4 per stage).

The error cannot go below the rounding floor of the arithmetic, about
:math:`\mathrm{u}\,(1 + \max|s|/\varepsilon + \max|\log w|)` with :math:`\mathrm{u}` the unit
round-off; the tolerance actually used is ``max(tol, 8 * floor)`` and is reported as
:attr:`SinkhornResult.tol`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from . import validation
from .backends import get_backend
from .backends.numpy_backend import overflow_scale
from .errors import ArgumentError, SinkhornNotConverged
from .integrate.rk import array_namespace
from .sinkhorn_loop import EpsilonScaling, sinkhorn_loop

__all__ = [
    "FusedSweep",
    "PARTNER_MIN_PAIRS",
    "ScoreSoftMin",
    "SinkhornNotConverged",
    "SinkhornResult",
    "SinkhornWarmStart",
    "is_symmetric",
    "out_of_sample_potential",
    "sinkhorn_coupling",
    "sinkhorn_field",
    "sinkhorn_potentials",
    "sinkhorn_summary",
]

logger = logging.getLogger(__name__)



def is_symmetric(A: np.ndarray) -> bool:
    """Whether the score matrix ``A`` is symmetric to round-off (``|A - A^T| <= 1e-14 max(1,
    max|A|)``), so that the self-coupling has ``f = g`` and the symmetric solver applies."""
    A = np.asarray(A)
    return bool(np.allclose(A, A.T, rtol=0, atol=1e-14 * max(1.0, np.abs(A).max())))


@dataclass
class SinkhornResult:
    r"""Outcome of :func:`sinkhorn_potentials`.

    Attributes
    ----------
    f, g : arrays (N,)
        Potentials (backend arrays).  ``f is g`` on the symmetric path.
    n_iter : int
        Iterations performed.  One iteration is one pass over all pairs on the symmetric
        path and two passes (a row and a column reduction) otherwise.
    err : float
        Log-domain marginal error of ``(f, g)`` (see the module docstring).
    tol : float
        Tolerance actually used (the requested one, raised to the rounding floor).
    converged : bool
        ``err < tol``.
    symmetric : bool
        Whether the symmetric path (``f = g``) was used.
    out : array (N, c) or None
        When ``values`` were passed and the solve converged:
        :math:`\sum_j w_j k(x_i, x_j) v_j` at the tokens, with the out-of-sample potential
        (it comes out of the last pass at no extra cost).

    memory : object
        The Anderson memory after the solve (pass it back as ``memory=`` to reuse the
        secant pairs in a warm-started solve of a nearby problem).
    reached_eps : bool
        Whether the iterations reached the target :math:`\varepsilon` (``False`` when the
        budget ran out on the :math:`\varepsilon`-scaling ladder; ``err`` is then ``inf``).
    errors : list of float
        Marginal log-error of every iterate at the target :math:`\varepsilon` (the first
        is that of the warm start).
    g_next : array (N,) or None
        When converged: the accelerated iterate after ``g`` (in the gauge of ``g``), whose
        error is not measured (typically several times below ``err``).  Not a result: the
        point :class:`SinkhornWarmStart` remembers, so that the next solve of a nearby
        problem starts closer.

    Unpacks as ``f, g, n_iter, err`` (the tuple of earlier versions).
    """

    f: Any
    g: Any
    n_iter: int
    err: float
    tol: float
    converged: bool
    symmetric: bool
    out: Any = None
    memory: Any = field(default=None, repr=False)
    reached_eps: bool = True
    errors: list = field(default_factory=list, repr=False)
    g_next: Any = field(default=None, repr=False)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.f, self.g, self.n_iter, self.err))

    def failure(self) -> str:
        """Why the solve did not converge, in words (for error messages)."""
        if not self.reached_eps:
            return (f"the epsilon-scaling ladder used all {self.n_iter} sweeps before "
                    "reaching eps")
        return (f"log-domain marginal error {self.err:.3g} >= tol={self.tol:.3g} after "
                f"{self.n_iter} sweeps")


# ------------------------------------------------------------------ solver
def sinkhorn_potentials(be: Any, qx: Any, kx: Any, logw: Any, eps: float, *,
                        tol: float = 1e-9, max_iter: int = 2000, f0: Any = None, g0: Any = None,
                        symmetric: bool = False, values: Any = None, anderson: int = 10,
                        eps_scaling: bool | None = None, memory: Any = None,
                        expect: float | None = None) -> SinkhornResult:
    r"""Log-domain Sinkhorn for the entropic self-coupling of :math:`\mu=\sum_j w_j\delta_{x_j}`.

    With scores :math:`s_{ij} = q_i\cdot k_j` (``qx = beta Q x``, ``kx = K x``), cost
    :math:`-s` and regularisation :math:`\varepsilon`, finds potentials with

    .. math:: \sum_j w_j e^{(f_i+g_j+s_{ij})/\varepsilon} = 1,\qquad
              \sum_i w_i e^{(f_i+g_j+s_{ij})/\varepsilon} = 1

    up to a log-domain marginal error below ``tol`` (see the module docstring for the
    iterations, the acceleration and the error).

    Parameters
    ----------
    be : backend
        Any object implementing the backend protocol (:mod:`transformer_pde.backends`).
    qx, kx : arrays (N, r)
        Projected queries and keys of the tokens (backend arrays).
    logw : array (N,)
        Log-weights (``-inf`` for zero weight).
    eps : float
        Entropic regularisation (> 0).
    tol : float
        Log-domain marginal tolerance (raised to the rounding floor if below it).
    max_iter : int
        Maximum number of iterations (including the :math:`\varepsilon`-scaling stages).
    f0, g0 : arrays (N,), optional
        Warm start.  ``g0`` is used when given (``f0`` is then ignored except on the
        symmetric path, where ``f0`` is used if ``g0`` is absent); ``f0`` alone starts
        from :math:`g = T_g(f_0)`.
    symmetric : bool
        The score matrix is symmetric (:math:`A = A^\top`): solve for :math:`f = g`.
    values : array (N, c), optional
        Values to average with the converged kernel at the tokens (returned as ``out``).
    anderson : int
        Anderson memory (0: plain Sinkhorn / averaged symmetric iteration).
    eps_scaling : bool, optional
        Use :math:`\varepsilon`-scaling; default: on for cold starts whose score range
        :math:`\max|q|\max|k|/\varepsilon` exceeds 30.
    memory : object, optional
        ``SinkhornResult.memory`` of a previous solve of a nearby problem (secant pairs
        reused across warm-started solves; :class:`SinkhornWarmStart` does this).
    expect : float, optional
        Expected marginal error of the warm start (e.g. :meth:`SinkhornWarmStart.expected_error`):
        below ten times ``tol`` the first pass also averages ``values``; otherwise passes
        average them only once the error is predicted to meet ``tol`` (see
        :mod:`transformer_pde.sinkhorn_loop`, lean passes).  Changes no result beyond
        rounding.

    Returns
    -------
    SinkhornResult
        Never raises on non-convergence: check ``converged`` (callers such as the
        attention field raise :class:`SinkhornNotConverged`).
    """
    eps = validation.positive("eps", eps)
    tol = validation.positive("tol", tol)
    max_iter = validation.integer("max_iter", max_iter, minimum=1)
    if expect is not None:
        expect = validation.scalar("expect", expect, finite=False)
        if not expect >= 0:
            raise ArgumentError(f"expect must be >= 0 (a marginal error), got {expect!r}")
    xp = be.xp
    n = kx.shape[0]
    dtype = kx.dtype
    qmax = float(xp.max(xp.sqrt((qx * qx).sum(axis=1))))
    kmax = float(xp.max(xp.sqrt((kx * kx).sum(axis=1))))
    span = qmax * kmax  # bound on max |s_ij|
    if not np.isfinite(span / eps):
        raise ArgumentError(f"scores up to {span:.3g} (from beta, Q, K and the tokens) are "
                            f"too large for eps={eps:g}: max|s|/eps overflows")
    unit = float(np.finfo(dtype).eps)
    finite_logw = logw[xp.isfinite(logw)]
    lw = float(xp.max(xp.abs(finite_logw))) if finite_logw.size else 0.0
    # rounding floor of a log-domain marginal: every logit carries a relative error of a
    # few units of round-off, i.e. an absolute error u * (|s|/eps + |log w|)
    tol_used = max(float(tol), 8.0 * unit * (1.0 + span / eps + lw))

    # geometric ladder from eps * (range / 10) down to eps, factor 4 per stage, each
    # coarse stage to a marginal error of 1e-3 within 200 iterations; by default only for
    # cold starts (the loop skips it when warm) with a score range above 30
    use = span / eps > 30.0 if eps_scaling is None else bool(eps_scaling)
    scaling = EpsilonScaling(start=eps * max(1.0, span / eps / 10.0), factor=0.25,
                             stage_tol=max(tol_used, 1e-3), stage_max_iter=200, margin=1e-4,
                             warm=eps_scaling is not None) if use else None
    rows = ScoreSoftMin(be, qx, kx, logw)
    cols = None if symmetric else ScoreSoftMin(be, kx, qx, logw)
    sweep = None
    if cols is not None and FusedSweep.applies(be, logw):
        sweep = FusedSweep(be, rows, cols, values)
    res = sinkhorn_loop(xp, rows, eps, n=n, tol=tol_used, max_iter=max_iter, softmin_g=cols,
                        g0=g0, f0=f0,
                        dtype=dtype, anderson=anderson, memory=memory, scaling=scaling,
                        readout=None if values is None else rows.with_values(values),
                        sweep=sweep, next_step=True,
                        expect=expect)
    ok = res.converged
    f, g, g_next = res.f, res.g, res.g_next
    if ok and not symmetric:
        # fix the gauge (f + c, g - c) by equal weighted means: keeps warm starts comparable
        c = 0.5 * float(xp.exp(logw) @ (g - f))
        f, g = f + c, g - c
        g_next = None if g_next is None else g_next - c
    return SinkhornResult(f=f, g=g, n_iter=res.n_iter, err=res.err, tol=tol_used, converged=ok,
                          symmetric=symmetric, out=res.out if ok else None, memory=res.memory,
                          reached_eps=res.reached_target, errors=res.errors,
                          g_next=g_next if ok else None)


class ScoreSoftMin:
    r"""The soft-min of Sinkhorn attention over scores :math:`s_{ij} = q_i\cdot k_j`, on a backend.

    ``ScoreSoftMin(be, q, k, logw)(h, eps)`` is

    .. math:: -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + h_j/\varepsilon + q_i\cdot k_j/\varepsilon\big)

    for every row :math:`i` (the cost is :math:`C = -s`), one streaming ``lse`` pass of the
    backend: no :math:`N\times N` matrix.  Swapping ``q`` and ``k`` gives the column
    soft-min.  :meth:`with_values` is the readout that also averages values with the
    softmax of the same logits (one ``softmax`` pass), the attention field at the tokens.
    The scaled queries :math:`q/\varepsilon` are kept for the last ``eps`` used.
    """

    def __init__(self, be: Any, q: Any, k: Any, logw: Any):
        self.be, self.q, self.k, self.logw = be, q, k, logw
        self._eps: float | None = None
        self._qs: Any = None

    def scaled(self, eps: float) -> Any:
        r""":math:`q/\varepsilon` (cached for the last ``eps``)."""
        if eps != self._eps:
            self._eps, self._qs = eps, self.q * (1.0 / eps)
        return self._qs

    def __call__(self, h: Any, eps: float) -> Any:
        return -eps * self.be.lse(self.scaled(eps), self.k, self.logw + h * (1.0 / eps), None)

    def with_values(self, values: Any) -> Callable[[Any, float], tuple[Any, Any]]:
        """The readout ``(h, eps) -> (soft-min, softmax average of values)``."""
        def readout(h: Any, eps: float) -> tuple[Any, Any]:
            out, lse = self.be.softmax(self.scaled(eps), self.k, values,
                                       self.logw + h * (1.0 / eps), None)
            return -eps * lse, out
        return readout


class FusedSweep:
    r"""One alternating Sinkhorn iteration in one pass over the pairs (Numba backend).

    ``FusedSweep(be, rows, cols, values)(g, eps)`` returns :math:`(f, g', \text{out})` with
    :math:`f = T_f(g)` (``rows``), the value average of the row softmax (``out``, ``None``
    without values) and :math:`g' = T_g(f)` computed from the column sums :math:`c_j` of the
    plan as :math:`g'_j = g_j - \varepsilon\log(c_j/w_j)`
    (:func:`transformer_pde.sinkhorn_kernels.fused_sweep`: one exponential per pair
    instead of two).  Where a column sum is too small for that relation to be accurate,
    or the logits may leave the float range, the iteration takes the two log-domain passes
    instead (``rows`` with the values, then ``cols``), so the result is always the
    alternating iteration of :func:`sinkhorn_potentials`.
    """

    #: smallest column sum used (float64, float32): far above the mass the kernel's
    #: exponential may flush to zero (N * 1e-308, N * 1e-38), so the column sums keep
    #: full relative accuracy
    TINY: ClassVar[dict] = {np.dtype(np.float64): 1e-280, np.dtype(np.float32): 1e-20}

    def __init__(self, be: Any, rows: ScoreSoftMin, cols: ScoreSoftMin, values: Any):
        self.be, self.rows, self.cols, self.values = be, rows, cols, values
        self.w = np.exp(rows.logw)
        self.readout = rows.with_values(values) if values is not None else None
        self.fallbacks = 0

    @staticmethod
    def applies(be: Any, logw: Any) -> bool:
        """Whether the fused pass is available: the Numba backend, every weight positive."""
        return getattr(be, "name", None) == "numba" and bool(np.all(np.isfinite(logw)))

    def __call__(self, g: Any, eps: float) -> tuple[Any, Any, Any]:
        return self._sweep(g, eps, self.values)

    def lean(self, g: Any, eps: float) -> tuple[Any, Any, None]:
        """The same iteration without the value average (``out`` is ``None``): a pass
        that is not the last one needs no values (about 12 % cheaper at d = 2)."""
        return self._sweep(g, eps, None)

    def _sweep(self, g: Any, eps: float, values: Any) -> tuple[Any, Any, Any]:
        from .sinkhorn_kernels import fused_sweep  # noqa: PLC0415 (compiles numba kernels: only on that backend)

        rows = self.rows
        qs = rows.scaled(eps)
        bias = rows.logw + g * (1.0 / eps)
        if np.all(np.isfinite(bias)) and overflow_scale(qs, rows.k, bias) == 1.0:
            out, lse, col = fused_sweep(self.be, qs, rows.k, values, bias, self.w)
            f = -eps * lse
            if np.all(np.isfinite(col)) and col.min() >= self.TINY.get(qs.dtype, 1e-280) \
                    and np.all(np.isfinite(f)):
                g_next = g - eps * (np.log(col).astype(g.dtype, copy=False) - rows.logw)
                return f, g_next, (out if values is not None else None)
        self.fallbacks += 1
        if values is not None and self.readout is not None:
            f, out = self.readout(g, eps)
        else:
            f, out = rows(g, eps), None
        return f, self.cols(f, eps), out


# ------------------------------------------------------------------ warm start
@functools.lru_cache(maxsize=4096)
def _lagrange_weights(nodes: tuple, u: float) -> np.ndarray:
    r"""Lagrange weights of the distinct ``nodes`` at ``u``: :math:`w_i = \prod_{j \ne i}
    (u - u_j)/(u_i - u_j)` (read-only: cached)."""
    x = np.array(nodes)
    d = x[:, None] - x[None, :]
    r = (u - x)[None, :] / np.where(d == 0.0, 1.0, d)
    np.fill_diagonal(r, 1.0)
    w = r.prod(axis=1)
    w.setflags(write=False)
    return w


@functools.lru_cache(maxsize=1024)
def _backtest_weights(nodes: tuple, u: float, top: int) -> np.ndarray:
    """Row ``p`` (``p = 0 … top``): the weights over ``nodes`` of the degree-``p``
    extrapolation to ``u`` through the last ``p + 1`` nodes (read-only: cached)."""
    W = np.zeros((top + 1, len(nodes)))
    W[0, -1] = 1.0
    for p in range(1, top + 1):
        W[p, -(p + 1):] = _lagrange_weights(nodes[-(p + 1):], u)
    W.setflags(write=False)
    return W


#: fewest pairs (tokens squared) for which :class:`SinkhornWarmStart` tries partner stages:
#: the search costs about 0.5 ms of array calls per evaluation, which a pass over fewer
#: pairs does not repay (measured: N = 200 slower with it, N = 2000 faster)
PARTNER_MIN_PAIRS = 2**20


class SinkhornWarmStart:
    r"""Potentials kept between evaluations of a time-dependent Sinkhorn field.

    Remembers the potentials at the last ``order + 1`` distinct evaluation times and
    predicts the next ones by polynomial (Lagrange) extrapolation in :math:`t` of degree
    up to ``order``; a repeated time (the two middle stages of RK4) or a time far from the
    history gets the last potentials.  Along a smooth flow the potentials are smooth in
    :math:`t`, so the prediction error is :math:`O(h^{\mathrm{order}+1})` instead of :math:`O(h)`.
    It also carries the Anderson secant pairs from one solve to the next
    (``reuse_secants``).

    **Per-stage prediction.**  Inside a fixed-step Runge--Kutta step the field is
    evaluated at the stages :math:`Y_i = y_n + h\sum_j a_{ij} k_j` in a fixed order; the
    stages of one step are not points of one smooth curve (the middle stages of RK4 lie
    :math:`O(h^2)` off the trajectory), so an extrapolation in :math:`t` through the previous
    evaluations, which mixes stages, starts far off.  When the caller passes ``stage``
    (the index of the evaluation within the step, as :func:`~transformer_pde.simulate`
    does for fixed-step methods), stage :math:`i` is predicted as

    .. math:: \hat g_{n,i} = g_{\mathrm{prev}} + \mathcal{E}\big[\delta_{n-1,i},
              \delta_{n-2,i}, \dots\big],\qquad \delta_{m,i} = g_{m,i} - g_{\mathrm{prev}(m,i)},

    where :math:`g_{\mathrm{prev}}` is the evaluation just before (the previous stage, or
    the last stage of the previous step for :math:`i = 0`) and :math:`\mathcal{E}` the
    Lagrange extrapolation in :math:`t` (stage times :math:`t_m + c_i h`) of the increments
    of stage :math:`i` in the previous steps: the increment between two given stages is a
    smooth function of :math:`t_m`, so a degree-:math:`p` extrapolation errs by
    :math:`O(h^{p+1})` times the (already small) increment -- but it also multiplies the
    solves' own errors (tolerance-sized) by the Lagrange weights, about :math:`2^{p+1}`.
    The degree is therefore chosen per prediction by a back-test: the degree
    :math:`p \le` ``stage_order`` whose extrapolation from the earlier increments best
    predicted the latest one.  For explicit Euler (one stage) the scheme is an
    extrapolation of the potentials of one degree more.

    **Partner stages.**  Two stages whose displacements from the evaluation before them
    are alike have alike increments: in RK4, stage 2 moves the tokens by
    :math:`\tfrac h2 k_1` and stage 4 by :math:`h k_3 - \tfrac h2 k_2`, both
    :math:`\tfrac h2 \dot y + O(h^2)`.  So stage :math:`i` may also be predicted as the
    latest increment of another stage :math:`j` (of this step if :math:`j < i`, else of
    the previous one) plus the extrapolated difference
    :math:`\delta_{m,i} - \delta_{m',j}`, which is smaller than :math:`\delta_{m,i}`
    itself.  Each prediction takes the candidate (own increments or a partner) and degree
    whose back-test error is smallest; the method needs no knowledge of the tableau.
    Partners are tried from :data:`PARTNER_MIN_PAIRS` pairs (:math:`N^2`) on: for fewer,
    the search costs more than the passes it saves.
    Measured at N = 1500 and 2000 over three seeds (RK4 dt = 0.1, steps 15–26): 1–5 %
    fewer iterations per evaluation.

    **What is remembered.**  A converged solve stops at an iterate whose marginal error
    is just below the tolerance; the accelerated step after it costs no pass over the
    pairs (its image is known) and lands several times closer
    (:attr:`SinkhornResult.g_next`).  :func:`sinkhorn_field` records that point, not the
    verified one, so the noise the Lagrange weights amplify is smaller and high degrees
    pay off.  Measured with :file:`benchmarks/sinkhorn.py`'s setting at N = 2000 (RK4
    dt = 0.1, tolerance 1e-9, 12 steps after 14): recording the step after and raising
    ``stage_order`` from 5 to 9 took the warm-start errors of the four stages from
    1e-7, 7e-6, 2e-6, 8e-6 to 5e-8, 6e-7, 2e-7, 7e-7 and the iterations per evaluation
    from 6.8 to 5.2 (general score matrix) and from 3.1 to 2.8 (symmetric).

    Parameters
    ----------
    order : int, default 2
        Extrapolation degree of the stage-less prediction (0: reuse the last potentials).
    reuse_secants : bool, default True
        Start each solve with the previous solve's Anderson memory.  (Keeping one memory
        per stage was measured no better.)
    stage_order : int, default 9
        Highest extrapolation degree of the per-stage increments (chosen by back-test);
        ``stage_order + 2`` increments are kept per stage.
    """

    def __init__(self, order: int = 2, reuse_secants: bool = True, stage_order: int = 9):
        if int(order) < 0:
            raise ValueError(f"order must be >= 0, got {order!r}")
        if int(stage_order) < 0:
            raise ValueError(f"stage_order must be >= 0, got {stage_order!r}")
        self.order = int(order)
        self.stage_order = int(stage_order)
        self.reuse_secants = bool(reuse_secants)
        self.hist: list[tuple[float, Any, Any]] = []
        self.memory: Any = None
        self.stage_inc: dict[int, list[tuple[float, Any, Any]]] = {}
        self.start_err: dict[int | None, float] = {}

    def clear(self) -> None:
        """Forget everything (next solve is cold)."""
        self.hist.clear()
        self.memory = None
        self.stage_inc.clear()
        self.start_err.clear()

    def expected_error(self, stage: int | None = None) -> float | None:
        """The marginal error the next start of ``stage`` is expected to have: that of the
        previous start of the same stage (``None`` before any), for
        :func:`~transformer_pde.sinkhorn_loop.sinkhorn_loop`'s ``expect``."""
        return getattr(self, "start_err", {}).get(stage)

    def predict(self, t: float, n: int, stage: int | None = None) -> tuple[Any, Any]:
        """Predicted ``(f, g)`` at time ``t`` for ``n`` tokens, or ``(None, None)``.

        ``stage`` selects the per-stage prediction of a fixed-step method (see the class
        docstring) once that stage has been seen."""
        if not self.hist or self.hist[-1][2].shape[0] != n:
            return None, None
        inc = self.stage_inc.get(stage, []) if stage is not None else []
        if inc and inc[-1][2].shape[0] == n:
            _, f_last, g_last = self.hist[-1]
            df, dg = self._stage_increment(inc, t, stage, n)
            g = g_last + dg
            return (g if f_last is g_last else f_last + df), g
        return self._extrapolate(self.hist, t, self.order)

    def _stage_increment(self, inc: list, t: float, stage: int, n: int) -> tuple[Any, Any]:
        """The predicted increment of ``stage``: its own increments extrapolated, or the
        latest increment of a partner stage plus the extrapolated difference between the
        two, whichever (with its degree) back-tests best (see the class docstring).

        Vectorised: each candidate's back-test over every degree is one product of a
        small matrix of Lagrange weights with the stacked history, so the bookkeeping
        costs a few array calls per evaluation (it had cost 0.9 ms in Python loops,
        a third of a whole RK4 step at N = 50).
        """
        xp = array_namespace(inc[-1][2])
        sym = inc[-1][1] is inc[-1][2]
        ts = np.array([e[0] for e in inc], dtype=float)
        G = xp.stack([e[2] for e in inc])
        F = None if sym else xp.stack([e[1] for e in inc])
        cands = [(ts, G, F, 0.0, 0.0)]
        for s, lst in self.stage_inc.items():
            if n * n < PARTNER_MIN_PAIRS:
                break
            if s == stage or len(lst) < 3 or any(e[2].shape[0] != n for e in lst):
                continue
            # the partner's latest increment pairs with this stage's next one, its j-th
            # latest with this stage's (j-1)-th latest
            k = min(len(inc), len(lst) - 1)
            if k < 2:
                continue
            PG = xp.stack([e[2] for e in lst[-k - 1:-1]])
            PF = None if sym else xp.stack([e[1] for e in lst[-k - 1:-1]])
            cands.append((ts[-k:], G[-k:] - PG, None if sym else F[-k:] - PF,
                          lst[-1][2], 0.0 if sym else lst[-1][1]))
        best = None
        for cand in cands:
            p, err = self._backtest(cand[0], cand[1], xp)
            if best is None or err < best[0]:
                best = (err, p, cand)
        _, p, (tc, Gc, Fc, base_g, base_f) = best
        w = xp.asarray(self._lagrange(tc, t, p), dtype=Gc.dtype)
        dg = base_g + xp.einsum("k,kn->n", w, Gc)
        return (dg if sym else base_f + xp.einsum("k,kn->n", w, Fc)), dg

    @staticmethod
    def _lagrange(ts: np.ndarray, t: float, order: int) -> np.ndarray:
        """Weights over ``ts`` of the degree-``order`` extrapolation to ``t`` through the
        last ``order + 1`` points (as :meth:`_extrapolate`: the last point alone for degree
        0, a repeated time or a ``t`` more than two spacings away)."""
        t_last = ts[-1]
        spacing = abs(t_last - ts[-2]) if ts.size > 1 else 0.0
        if ts.size < 2 or order == 0 or t == t_last or abs(t - t_last) > 2.0 * spacing:
            w = np.zeros(ts.size)
            w[-1] = 1.0
            return w
        # the weights are those of the nodes in units of the last spacing (affine
        # invariance); along a fixed-step run these repeat, so they are computed once
        nodes = tuple(round(float(u), 12) for u in (ts[-(order + 1):] - t_last) / spacing)
        w = np.zeros(ts.size)
        w[-(order + 1):] = _lagrange_weights(nodes, round(float((t - t_last) / spacing), 12))
        return w

    def _backtest(self, ts: np.ndarray, G: Any, xp: Any) -> tuple[int, float]:
        """The degree (at most ``stage_order``) whose extrapolation from the earlier rows
        of ``G`` best predicted its last row, and that error (``inf`` when there are too
        few rows to test)."""
        m = ts.size
        if m < 3:
            return min(self.stage_order, m - 1), np.inf
        top = min(self.stage_order, m - 2)
        spacing = abs(ts[-2] - ts[-3])
        if abs(ts[-1] - ts[-2]) > 2.0 * spacing:    # as _extrapolate: every degree is 0
            W = np.zeros((top + 1, m - 1))
            W[:, -1] = 1.0
        else:
            nodes = tuple(round(float(u), 12) for u in (ts[:-1] - ts[-2]) / spacing)
            W = _backtest_weights(nodes, round(float((ts[-1] - ts[-2]) / spacing), 12), top)
        # einsum, not @: a BLAS call here wakes its thread pool, whose spinning threads
        # then take CPU from the Numba passes (measured: +40 % CPU per Euler step)
        err = xp.abs(xp.einsum("pk,kn->pn", xp.asarray(W, dtype=G.dtype), G[:-1])
                     - G[-1]).max(axis=1)
        err = np.asarray(err.get() if hasattr(err, "get") else err, dtype=float)
        best = int(np.argmin(err))
        return best, float(err[best])

    @classmethod
    def _extrapolate(cls, hist: list, t: float, order: int) -> tuple[Any, Any]:
        """``(f, g)`` extrapolated to ``t`` from the ``(t, f, g)`` entries of ``hist`` with
        the weights of :meth:`_lagrange` (the last entry itself when they pick it alone)."""
        _, f_last, g_last = hist[-1]
        w = cls._lagrange(np.array([h[0] for h in hist], dtype=float), t, order)
        if w[-1] == 1.0 and np.count_nonzero(w) == 1:
            return f_last, g_last
        pts = [(float(c), h) for c, h in zip(w, hist, strict=True) if c != 0.0]
        g = sum(c * h[2] for c, h in pts)
        f = g if f_last is g_last else sum(c * h[1] for c, h in pts)
        return f, g

    @staticmethod
    def _push(hist: list, entry: tuple, keep: int) -> None:
        """Append ``(t, f, g)``, keeping the last ``keep``; an entry of the same time is
        replaced (a repeated step: Lagrange needs distinct times)."""
        if hist and hist[-1][0] == entry[0]:
            hist[-1] = entry
        else:
            hist.append(entry)
            del hist[:-keep]

    def update(self, t: float, f: Any, g: Any, stage: int | None = None,
               memory: Any = None, start_error: float | None = None) -> None:
        """Record converged potentials at time ``t`` (replacing those of the same time).

        With ``stage``, also the increment from the previous evaluation to this stage;
        ``memory`` (the solve's Anderson memory) is kept for the next solve, and
        ``start_error`` (the marginal error of the solve's start) for
        :meth:`expected_error`."""
        if start_error is not None:
            if not hasattr(self, "start_err"):  # a state restored from an older checkpoint
                self.start_err = {}
            self.start_err[stage] = float(start_error)
        if stage is not None:
            inc = self.stage_inc.setdefault(stage, [])
            if self.hist and self.hist[-1][2].shape == g.shape:
                _, f_prev, g_prev = self.hist[-1]
                dg = g - g_prev
                self._push(inc, (t, dg if f is g else f - f_prev, dg), self.stage_order + 2)
            else:
                inc.clear()
        self._push(self.hist, (t, f, g), self.order + 1)
        if memory is not None:
            self.memory = memory


# ------------------------------------------------------------------ fields and helpers
def out_of_sample_potential(be: Any, q: Any, kx: Any, logw: Any, g: Any, eps: float) -> Any:
    r"""Out-of-sample Sinkhorn potential :math:`f(x)` at arbitrary points.

    .. math:: f(x) = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + q(x)\cdot k_j)/\varepsilon\big)

    ``q`` holds the projected queries :math:`\beta Q x` (M, r).  At the tokens this is
    :math:`T_f(g)`; it makes :math:`\sum_j w_j k(x, x_j) = 1` at every point :math:`x`.
    """
    return -eps * be.lse(q * (1.0 / eps), kx, logw + g * (1.0 / eps), None)


def sinkhorn_field(be: Any, qx: Any, kx: Any, vx: Any, logw: Any, eps: float, *,
                   q_query: Any = None, symmetric: bool = False,
                   state: SinkhornWarmStart | None = None, t: float = 0.0, tol: float = 1e-9,
                   max_iter: int = 2000, anderson: int = 10, info: dict | None = None,
                   label: str = "", stage: int | None = None) -> tuple[Any, SinkhornResult]:
    r"""One head of Sinkhorn attention: :math:`\sum_j w_j k(x, x_j)\, v_j` at the tokens or at queries.

    Solves for the potentials (warm-started from ``state``), then averages ``vx`` (the
    projected values :math:`V x_j`) with the kernel whose :math:`f(x)` is the out-of-sample
    potential.  At the tokens the average comes out of the last Sinkhorn sweep for free.

    Parameters
    ----------
    be, qx, kx, logw, eps, symmetric, tol, max_iter, anderson
        As in :func:`sinkhorn_potentials`.
    vx : array (N, c)
        Values at the tokens.
    q_query : array (M, r), optional
        Projected queries :math:`\beta Q x` of other evaluation points.
    state : SinkhornWarmStart, optional
        Warm-start memory, updated in place with the new potentials.
    t : float
        Evaluation time (for the warm-start extrapolation and messages).
    info : dict, optional
        Appends the sweeps used to ``info["sinkhorn_iterations"]`` and ``t`` to
        ``info["sinkhorn_times"]`` (summarise with :func:`sinkhorn_summary`).
    label : str
        Name of the problem in error messages (e.g. ``"head 0"``).
    stage : int, optional
        Index of this evaluation within a fixed-step solver step: warm-start from the
        same stage of the previous steps (see :class:`SinkhornWarmStart`).

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
    if info is not None:
        info.setdefault("sinkhorn_iterations", []).append(int(res.n_iter))
        info.setdefault("sinkhorn_times", []).append(float(t))
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


def sinkhorn_summary(info: dict) -> dict:
    """Iteration statistics from a trajectory's (or evaluator's) ``info``.

    Returns per-evaluation statistics of ``info["sinkhorn_iterations"]`` (one entry per
    head and field evaluation) and, when ``info["n_steps"]`` is present (trajectories from
    :func:`~transformer_pde.simulate`), the mean number of iterations per time step (all
    evaluations and heads of a step together; 4 evaluations per RK4 step).  When every
    step made the same number of evaluations (fixed-step methods on a completed run),
    ``per_step`` lists the iterations of each step.
    """
    its = np.asarray(info.get("sinkhorn_iterations", []), dtype=np.int64)
    if its.size == 0:
        return {"evaluations": 0}
    out: dict[str, Any] = {"evaluations": int(its.size), "total": int(its.sum()),
                           "mean": float(its.mean()), "median": float(np.median(its)),
                           "max": int(its.max()), "min": int(its.min())}
    n_steps = info.get("n_steps")
    if n_steps:
        out["per_step_mean"] = float(its.sum() / n_steps)
        if its.size % n_steps == 0 and info.get("method") != "dopri5":
            out["per_step"] = its.reshape(n_steps, -1).sum(axis=1).tolist()
    return out


def sinkhorn_coupling(X: Any, A: Any, *, weights: Any = None, eps: float = 1.0,
                      beta: float = 1.0, tol: float = 1e-9, max_iter: int = 2000,
                      backend: Any = "numpy") -> tuple[np.ndarray, SinkhornResult]:
    r"""Dense entropic self-coupling :math:`\pi_{ij} = w_i w_j e^{(f_i + g_j + \beta x_j^\top A x_i)/\varepsilon}`.

    For small ``N`` (it returns an :math:`N\times N` matrix): checks, plots, comparisons
    with other OT codes.  The score is :math:`s(x_i, x_j) = \beta\, x_j^\top A x_i`, the cost
    :math:`-s`.  The symmetric path is used when ``A`` is symmetric.

    Raises
    ------
    SinkhornNotConverged
        The tolerance was not reached within ``max_iter`` sweeps.
    """
    be = get_backend(backend)
    Xn = validation.points("X", X, keep_float32=False)
    An = validation.matrix("A", A)
    beta = validation.scalar("beta", beta)
    if Xn.ndim != 2 or An.shape != (Xn.shape[1], Xn.shape[1]):
        raise ValueError(f"X must be (N, d) and A (d, d); got X {Xn.shape}, A {An.shape}")
    n = Xn.shape[0]
    w = validation.weights("weights", weights, n)
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    with np.errstate(over="ignore", invalid="ignore"):
        qx = beta * Xn @ An.T
    if not np.all(np.isfinite(qx)):
        raise ArgumentError(f"beta * X A^T overflows (beta={beta:g}, max |X| = "
                            f"{np.abs(Xn).max():.3g}, max |A| = {np.abs(An).max():.3g})")
    sym = is_symmetric(An)
    res = sinkhorn_potentials(be, be.asarray(qx), be.asarray(Xn), be.asarray(logw), eps,
                              tol=tol, max_iter=max_iter, symmetric=sym)
    if not res.converged:
        raise SinkhornNotConverged(
            f"Sinkhorn did not converge: {res.failure()} (eps={eps:g})")
    f = be.to_numpy(res.f)
    g = be.to_numpy(res.g)
    with np.errstate(divide="ignore", invalid="ignore"):
        logpi = logw[:, None] + logw[None, :] + (f[:, None] + g[None, :] + qx @ Xn.T) / eps
    return np.where(np.isfinite(logpi), np.exp(logpi), 0.0), res
