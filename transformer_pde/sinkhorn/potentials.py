r"""Log-domain Sinkhorn potentials of Sinkhorn attention, on any backend.

With the notation of :mod:`transformer_pde.sinkhorn` (scores :math:`s_{ij} = q_i\cdot k_j`,
soft-min operators :math:`T_f`, :math:`T_g`), this module solves for the potentials
(:func:`sinkhorn_potentials`) and builds the dense coupling of small problems
(:func:`sinkhorn_coupling`).

The iterations are those of the package's one Sinkhorn loop,
:func:`transformer_pde.sinkhorn.sinkhorn_loop` (also behind the Sinkhorn divergence of
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

On a backend with a fused Sinkhorn sweep (the ``sinkhorn_sweep`` method of the backend
protocol: the Numba backend), with every weight positive, an alternating iteration is one
pass (:class:`FusedSweep`): the column update follows from the column sums of the
row-normalised plan, so the two soft-mins cost one exponential per pair.

Both errors are exactly the log-domain marginal error of the returned pair,

.. math:: \mathrm{err}(f, g) = \max\Big(\max_i \Big|\log\frac{\sum_j \pi_{ij}}{w_i}\Big|,\;
          \max_j \Big|\log\frac{\sum_i \pi_{ij}}{w_j}\Big|\Big),

which is the stopping rule.  Both fixed-point maps are accelerated by Anderson mixing
(type II, memory 10) with a safeguard (restart from the best plain iterate when the error
grows tenfold).  Warm starts
(:class:`~transformer_pde.sinkhorn.SinkhornWarmStart`) extrapolate the
potentials polynomially in time -- per Runge--Kutta stage inside ``simulate``, from the
same stage of the previous steps -- and keep Anderson's secant pairs from one solve to the
next, since the Jacobian of the fixed-point map changes little along a smooth flow.  Cold starts with
a score range :math:`\max|s|/\varepsilon > 30` use :math:`\varepsilon`-scaling (factor 4 per stage).

The error cannot go below the rounding floor of the arithmetic, about
:math:`\mathrm{u}\,(1 + \max|s|/\varepsilon + \max|\log w|)` with :math:`\mathrm{u}` the unit
round-off; the tolerance actually used is ``max(tol, 8 * floor)`` and is reported as
:attr:`SinkhornResult.tol`.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .. import validation
from ..backends import DEFAULT_BACKEND, get_backend
from ..backends.numpy_backend import overflow_scale
from ..errors import ArgumentError, SinkhornNotConverged
from .loop import sinkhorn_loop
from .options import (DEFAULT_MAX_ITER, DEFAULT_TOL, Acceleration, EpsilonScaling, SoftMins,
                      Start, Stopping)

__all__ = [
    "FusedSweep",
    "ScoreSoftMin",
    "SinkhornResult",
    "is_symmetric",
    "sinkhorn_coupling",
    "sinkhorn_potentials",
]


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
        point :class:`~transformer_pde.sinkhorn.SinkhornWarmStart` remembers, so
        that the next solve of a nearby problem starts closer.
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

    def failure(self) -> str:
        """Why the solve did not converge, in words (for error messages)."""
        if not self.reached_eps:
            return (f"the epsilon-scaling ladder used all {self.n_iter} sweeps before "
                    "reaching eps")
        return (f"log-domain marginal error {self.err:.3g} >= tol={self.tol:.3g} after "
                f"{self.n_iter} sweeps")


# ------------------------------------------------------------------ solver
def _tolerance_and_ladder(xp: Any, qx: Any, kx: Any, logw: Any, eps: float, tol: float,
                          eps_scaling: bool | None) -> tuple[float, EpsilonScaling | None]:
    r"""The tolerance used (``tol`` raised to 8 times the rounding floor) and the
    :math:`\varepsilon`-scaling ladder of :func:`sinkhorn_potentials`, from the score bound
    :math:`\max|s_{ij}| \le \max_i|q_i|\,\max_j|k_j|`."""
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
    return tol_used, scaling


def sinkhorn_potentials(be: Any, qx: Any, kx: Any, logw: Any, eps: float, *,
                        tol: float = DEFAULT_TOL, max_iter: int = DEFAULT_MAX_ITER, f0: Any = None,
                        g0: Any = None,
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
        reused across warm-started solves;
        :class:`~transformer_pde.sinkhorn.SinkhornWarmStart` does this).
    expect : float, optional
        Expected marginal error of the warm start (e.g.
        :meth:`~transformer_pde.sinkhorn.SinkhornWarmStart.expected_error`):
        below ten times ``tol`` the first pass also averages ``values``; otherwise passes
        average them only once the error is predicted to meet ``tol`` (see
        :mod:`transformer_pde.sinkhorn.loop`, lean passes).  Changes no result beyond
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
    tol_used, scaling = _tolerance_and_ladder(xp, qx, kx, logw, eps, tol, eps_scaling)
    rows = ScoreSoftMin(be, qx, kx, logw)
    cols = None if symmetric else ScoreSoftMin(be, kx, qx, logw)
    # Why Anderson (memory 10, secants reused across warm solves) and no other scheme:
    # warm-started general-score solves along a flow spend their passes on a smooth,
    # global slow mode of the alternating map (plain contraction about 0.9 per iteration
    # once the tokens have spread), where Anderson does as well as a Krylov solver can;
    # measured alternatives (`benchmarks/sinkhorn.py --candidates` runs all but the
    # Galerkin one, on the benchmark's RK4 run at N = 2000): memory 20 saves up
    # to 15 % of the iterations late in a run and about 1 % over a whole run, a Newton
    # correction on a Nystrom model of the Jacobian (300-600 sampled tokens) 0-12 % at
    # the price of its own pass over tokens x samples, a Galerkin correction on
    # polynomials (degree <= 6) of the token coordinates 0-2 % (the reused secants already
    # hold those smooth modes), and dropping or not reusing the secants of earlier solves
    # costs 30-50 % more.
    sweep = None
    if cols is not None and FusedSweep.applies(be, logw):
        sweep = FusedSweep(be, rows, cols, values)
    res = sinkhorn_loop(
        xp, SoftMins(rows, cols, readout=None if values is None else rows.with_values(values),
                     sweep=sweep), eps, n=n,
        stopping=Stopping(tol_used, max_iter, expect=expect, next_step=True),
        acceleration=Acceleration(anderson),
        start=Start(g0=g0, f0=f0, memory=memory, dtype=dtype), scaling=scaling)
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
    r"""One alternating Sinkhorn iteration in one pass over the pairs, on a backend that has one.

    ``FusedSweep(be, rows, cols, values)(g, eps)`` returns :math:`(f, g', \text{out})` with
    :math:`f = T_f(g)` (``rows``), the value average of the row softmax (``out``, ``None``
    without values) and :math:`g' = T_g(f)` computed from the column sums :math:`c_j` of the
    plan as :math:`g'_j = g_j - \varepsilon\log(c_j/w_j)` (one exponential per pair
    instead of two).  The pass is the backend's
    ``sinkhorn_sweep(q, k, v, bias, w) -> (out, lse, col)``: for logits
    :math:`L_{ij} = q_i\cdot k_j + \mathrm{bias}_j`, the row log-sum-exps
    :math:`\mathrm{lse}_i`, the row-softmax averages of ``v`` (``out``; ``v`` may be
    ``None``) and the column sums :math:`c_j = \sum_i w_i e^{L_{ij} - \mathrm{lse}_i}`.
    Where a column sum is too small for that relation to be accurate, or the logits may
    leave the float range, the iteration takes the two log-domain passes instead
    (``rows`` with the values, then ``cols``), so the result is always the alternating
    iteration of :func:`sinkhorn_potentials`.
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
        """Whether the fused pass is available: the backend has ``sinkhorn_sweep`` and
        every weight is positive."""
        return getattr(be, "sinkhorn_sweep", None) is not None \
            and bool(np.all(np.isfinite(logw)))

    def __call__(self, g: Any, eps: float) -> tuple[Any, Any, Any]:
        return self._sweep(g, eps, self.values)

    def lean(self, g: Any, eps: float) -> tuple[Any, Any, None]:
        """The same iteration without the value average (``out`` is ``None``): a pass
        that is not the last one needs no values."""
        return self._sweep(g, eps, None)

    def _sweep(self, g: Any, eps: float, values: Any) -> tuple[Any, Any, Any]:
        rows = self.rows
        qs = rows.scaled(eps)
        bias = rows.logw + g * (1.0 / eps)
        if np.all(np.isfinite(bias)) and overflow_scale(qs, rows.k, bias) == 1.0:
            out, lse, col = self.be.sinkhorn_sweep(qs, rows.k, values, bias, self.w)
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


# ------------------------------------------------------------------ dense coupling
def sinkhorn_coupling(X: Any, A: Any, *, weights: Any = None, eps: float = 1.0,
                      beta: float = 1.0, tol: float = DEFAULT_TOL,
                      max_iter: int = DEFAULT_MAX_ITER, backend: Any = DEFAULT_BACKEND
                      ) -> tuple[np.ndarray, SinkhornResult]:
    r"""Dense entropic self-coupling :math:`\pi_{ij} = w_i w_j e^{(f_i + g_j + \beta x_j^\top A x_i)/\varepsilon}`.

    For small ``N`` (it returns an :math:`N\times N` matrix): checks, plots, comparisons
    with other OT codes.  The score is :math:`s(x_i, x_j) = \beta\, x_j^\top A x_i`, the cost
    :math:`-s`.  The symmetric path is used when ``A`` is symmetric.  The iterations run on
    ``backend`` (default ``"auto"``, :data:`~transformer_pde.backends.DEFAULT_BACKEND`: the
    fastest installed backend for ``N`` tokens); the coupling is formed on the host.

    Raises
    ------
    SinkhornNotConverged
        The tolerance was not reached within ``max_iter`` sweeps.
    """
    Xn = validation.points("X", X, keep_float32=False)
    An = validation.matrix("A", A)
    beta = validation.scalar("beta", beta)
    if Xn.ndim != 2 or An.shape != (Xn.shape[1], Xn.shape[1]):
        raise ValueError(f"X must be (N, d) and A (d, d); got X {Xn.shape}, A {An.shape}")
    n = Xn.shape[0]
    be = get_backend(backend, n_tokens=n)
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
