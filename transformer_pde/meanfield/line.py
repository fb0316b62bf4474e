r"""The mean-field equation of attention on the real line, solved along characteristics.

For tokens on :math:`\mathbb R` (:math:`d = 1`) with scalar query, key and value
:math:`q, k, v`, the token density :math:`\mu_t` solves the continuity equation

.. math::

    \partial_t \mu + \partial_x(\mu\,\Gamma_\mu) = 0, \qquad
    \Gamma_\mu(x) = v\,\frac{\int y\,\kappa(x, y)\,d\mu(y)}{\int \kappa(x, y)\,d\mu(y)},

with the softmax kernel :math:`\kappa(x, y) = e^{\beta q k x y}` or the L2 kernel
:math:`\kappa(x, y) = e^{-\beta'(q x - k y)^2}`.  The factor :math:`e^{-\beta' q^2 x^2}`
of the L2 kernel cancels between numerator and denominator, so both are the *tilted mean*

.. math::

    \Gamma_\mu(x) = v\,\mathbb E_{\pi_x}[y], \qquad
    \pi_x(dy) \propto e^{a x y - c y^2}\,\mu(dy),

with :math:`(a, c) = (\beta q k, 0)` (softmax) or :math:`(2\beta' q k, \beta' k^2)` (L2),
and its slope is a tilted variance, :math:`\Gamma_\mu'(x) = v\,a\,\operatorname{Var}_{\pi_x}(y)`.

**Scheme (Lagrangian).**  The solution is the push-forward of :math:`\mu_0` by the flow
:math:`X(\xi, t)` of :math:`\dot X = \Gamma_{\mu_t}(X)`, :math:`X(\xi, 0) = \xi`.  The
labels :math:`\xi_j` are a uniform grid (step :math:`h`) on the support of :math:`\mu_0`
(truncated to :math:`[F_0^{-1}(\epsilon), F_0^{-1}(1-\epsilon)]` for a distribution with
unbounded support), with the trapezoid masses
:math:`w_j \propto \rho_0(\xi_j) h` (halved at the ends of a compact support), so that

.. math::

    \Gamma_{\mu_t}(x) \approx v\,\frac{\sum_j w_j e^{a x X_j - c X_j^2} X_j}
    {\sum_j w_j e^{a x X_j - c X_j^2}}.

The trapezoid rule is spectrally accurate for smooth, rapidly decaying integrands on a
uniform grid (error :math:`O(e^{-2\pi^2/(h/\sigma)^2})` for Gaussian integrands of width
:math:`\sigma`), so for a smooth :math:`\mu_0` the only errors left are the time
integration's (tolerances ``rtol``, ``atol``) and the truncated tail mass
:math:`2\epsilon`.  The density follows from the Jacobian :math:`J = \partial_\xi X`,
integrated with the positions as :math:`\tfrac{d}{dt}\log J = \Gamma'_{\mu_t}(X)`:
:math:`\rho_t(X_j) = \rho_0(\xi_j)/J_j`.  The map :math:`\xi \mapsto X(\xi, t)` is
increasing, so the distribution function is carried along exactly:
:math:`F_t(X_j) = F_0(\xi_j)`.  The domain follows the solution wherever it goes (no
fixed grid to leave, no CFL condition, no numerical diffusion), which is why this scheme
was chosen over a finite-volume grid: a Gaussian start stays exactly Gaussian
(:math:`\Gamma` is affine then) and its mean and variance match
:func:`transformer_pde.gaussian.solve` to the integration tolerance.

A density given on a grid with a compact support has a kink where it meets zero; the
trapezoid rule is then of second order in :math:`h`.

**Range of validity.**  The quadrature is accurate while the tilted measures
:math:`\pi_{X_i}` of the nodes that carry mass lie inside the node range.  For a Gaussian
:math:`\mathcal N(m, \sigma^2)` the tilt moves the centre of :math:`\pi_x` to
:math:`m + a\sigma^2 (x - m)`, so the condition is :math:`|a|\sigma_t^2 \lesssim 1`.  A
contracting flow (:math:`v a < 0`) that starts there stays there.  An expanding flow
(:math:`v a > 0`) leaves it: the PDE then blows up in finite time (for a Gaussian start at
:math:`T^* = 1/(2 v a \sigma_0^2)`), which no finite set of nodes can follow.  The
solver watches the tilted mass that the nodes' own measure puts on the two end nodes and
stops (status ``"failed"``, message saying why, states saved before kept) once it exceeds
``edge_tol``: past that point the field depends on the truncated tails.  (Measured for a
Gaussian start with the default ``tail``: relative error of the variance
:math:`3\cdot 10^{-10}` when :math:`a\sigma_t^2 = 1`, :math:`3\cdot 10^{-6}` when it is
1.25.)

Time stepping is the package's :class:`~transformer_pde.integrate.TimeLoop` with the
adaptive :class:`~transformer_pde.integrate.Dop853`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import results_display as display
from ..errors import ArgumentError, ArgumentTypeError
from ..extras import require
from ..integrate import Dop853, Limits, SaveAt, TimeLoop
from ..io.saving import LabelledSave
from ..results import HasStatus, Status, check_warn, warn_stop
from ..validation import choice, finite_array, integer, positive, scalar

__all__ = ["LineSolution", "solve_line"]


@dataclass(repr=False)
class LineSolution(display.Summarised, HasStatus, LabelledSave):
    r"""Result of :func:`solve_line`: the solution at the saved times, node by node.

    Attributes
    ----------
    times : ndarray (T,)
    x : ndarray (T, M)
        Positions :math:`X_j(t)` of the Lagrangian nodes (increasing in :math:`j`).
    density : ndarray (T, M)
        Density :math:`\rho_t(X_j(t))` at the nodes.
    weights : ndarray (M,)
        Mass :math:`w_j` carried by each node (sums to one); moments are
        :math:`\sum_j w_j f(X_j)`.
    cdf : ndarray (M,)
        :math:`F_0(\xi_j)`, which is also :math:`F_t(X_j(t))` at every time.
    labels : ndarray (M,)
        The initial positions :math:`\xi_j`.
    status : Status
    message : str
    params : dict
        ``kind``, ``q``, ``k``, ``v``, ``beta``, ``l2_beta`` and the tilt ``(a, c)``.
    n_steps : int
        Attempted steps of the time loop.
    """

    times: np.ndarray
    x: np.ndarray
    density: np.ndarray
    weights: np.ndarray
    cdf: np.ndarray
    labels: np.ndarray
    status: Status
    message: str
    params: dict = field(default_factory=dict)
    n_steps: int = 0

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("times", display.time_span(self.times)),
                ("nodes", f"x, density {display.array_summary(self.x)}"),
                ("parameters", ", ".join(f"{k}={v if isinstance(v, str) else display.number(v)}"
                                         for k, v in self.params.items()) or "—"),
                ("steps", str(self.n_steps)), ("message", self.message)]
        return (f"LineSolution(status='{self.status}', saved={len(self.times)}, "
                f"nodes={self.weights.size})", rows)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        r"""``(means (T, 1), covs (T, 1, 1))``: :math:`\sum_j w_j X_j` and
        :math:`\sum_j w_j (X_j - \bar X)^2`."""
        m = self.x @ self.weights
        var = ((self.x - m[:, None]) ** 2) @ self.weights
        return m[:, None], var[:, None, None]

    def measure(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, density)`` at saved time number ``index``: the grid density that the
        distances of :mod:`~transformer_pde.meanfield.distance` take (its piecewise-linear
        interpolant between the nodes)."""
        i = integer("index", index, minimum=-len(self.times), maximum=len(self.times) - 1)
        return self.x[i].copy(), self.density[i].copy()

    def to_xarray(self) -> Any:
        """The solution as an :class:`xarray.Dataset`: ``x`` and ``density`` over
        ``(time, node)``, ``weights``, ``cdf`` and ``label`` over ``node``; status, message
        and parameters as attributes."""
        xr = require("xarray", "LineSolution.to_xarray")
        attrs = {"status": str(self.status), "message": self.message,
                 **{k: (str(v) if isinstance(v, str) else float(v))
                    for k, v in self.params.items()}}
        return xr.Dataset(
            {"x": (("time", "node"), self.x), "density": (("time", "node"), self.density),
             "weights": (("node",), self.weights), "cdf": (("node",), self.cdf),
             "label": (("node",), self.labels)},
            coords={"time": self.times, "node": np.arange(self.weights.size)}, attrs=attrs)


# ------------------------------------------------------------------ initial measure
def _initial_nodes(density0: Any, n_nodes: int, tail: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(labels, weights, rho0, cdf)`` of the initial measure."""
    if isinstance(density0, tuple) and len(density0) == 2:
        x = finite_array("density0[0] (grid nodes)", density0[0]).ravel()
        rho = finite_array("density0[1] (density values)", density0[1]).ravel()
        if x.size < 3 or rho.shape != x.shape:
            raise ArgumentError("density0 as (x, density) needs two arrays of the same length "
                                f">= 3, got lengths {x.size} and {rho.size}")
        if np.any(np.diff(x) <= 0):
            raise ArgumentError("density0: the grid nodes must be strictly increasing")
        if np.any(rho < 0):
            raise ArgumentError(f"density0: the density must be >= 0 (min {rho.min():.3g})")
        if not math.isfinite(float(x[-1]) - float(x[0])):
            raise ArgumentError(f"density0: the grid's span x[-1] - x[0] overflows "
                                f"({x[0]:g} to {x[-1]:g})")
        lab = np.linspace(x[0], x[-1], n_nodes)
        h = np.diff(lab)
        with np.errstate(over="ignore", invalid="ignore"):   # an overflow is handled below
            r0 = np.interp(lab, x, rho)
            cell = 0.5 * (r0[:-1] + r0[1:]) * h
            total = cell.sum()
        if not math.isfinite(total) and rho.max() > 0:
            # only the normalised density matters: divide by the largest value first, so
            # that densities near the float64 maximum do not overflow the interpolation or
            # the mass (a density whose mass is finite keeps its values bit for bit)
            r0 = np.interp(lab, x, rho / rho.max())
            cell = 0.5 * (r0[:-1] + r0[1:]) * h
            total = cell.sum()
        if not total > 0:
            raise ArgumentError("density0 has zero mass")
        cdf = np.r_[0.0, np.cumsum(cell)] / total
        w = np.r_[0.0, cell / 2] + np.r_[cell / 2, 0.0]
        return lab, w / total, r0 / total, cdf
    if not all(callable(getattr(density0, n, None)) for n in ("pdf", "ppf", "isf", "cdf")):
        raise ArgumentTypeError("density0 must be a tuple (x, density) or a frozen continuous "
                                "scipy.stats distribution (with pdf, cdf, ppf and isf), got "
                                f"{type(density0).__name__}")
    lo, hi = float(density0.ppf(tail)), float(density0.isf(tail))
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ArgumentError(f"density0: its quantiles at tail={tail:g} and 1 - tail are not "
                            f"finite and distinct ({lo}, {hi})")
    lab = np.linspace(lo, hi, n_nodes)
    r0 = np.asarray(density0.pdf(lab), float)
    if not (np.all(np.isfinite(r0)) and np.all(r0 >= 0)) or not r0.max() > 0:
        raise ArgumentError("density0's pdf must be finite, >= 0 and not all zero on "
                            "its support")
    if not math.isfinite(r0.sum()):
        r0 = r0 / r0.max()          # only the normalised density matters (see above)
    w = r0 / r0.sum()
    return lab, w, r0, np.asarray(density0.cdf(lab), float)


def _edge_tolerances(density0: Any, edge_tol: float) -> tuple[float, float]:
    """``edge_tol`` on each side where the initial measure's tail was cut (an unbounded
    support of a scipy distribution), infinity where the nodes hold the whole measure."""
    if isinstance(density0, tuple):
        return math.inf, math.inf
    lo, hi = density0.support()
    return (edge_tol if not math.isfinite(lo) else math.inf,
            edge_tol if not math.isfinite(hi) else math.inf)


# ------------------------------------------------------------------ field
def _tilted(x: np.ndarray, nodes: np.ndarray, w: np.ndarray, logw: np.ndarray, a: float,
            c: float) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    r"""Tilted means and variances :math:`\mathbb E_{\pi_{x_i}}[y]`,
    :math:`\operatorname{Var}_{\pi_{x_i}}(y)` by the node quadrature (log-sum-exp), and the
    edge weights :math:`\sum_i w_i\,\pi_{x_i}(y_1)` and :math:`\sum_i w_i\,\pi_{x_i}(y_M)`:
    the tilted mass the nodes' own measure puts on each end node."""
    s = (a * x)[:, None] * nodes[None, :] + (logw - c * nodes * nodes)[None, :]
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    mean = p @ nodes
    var = np.einsum("ij,ij->i", p, (nodes[None, :] - mean[:, None]) ** 2)
    edge = (float(w @ p[:, 0]), float(w @ p[:, -1]))
    return mean, var, edge


class OutOfRangeError(ArithmeticError):
    """The tilted measures of the nodes reach the end nodes: the quadrature has left its
    range of validity (an expanding flow on its way to blow-up)."""


def _field(w: np.ndarray, logw: np.ndarray, a: float, c: float, v: float,
           edge_tol: tuple[float, float]):
    """Right-hand side of the characteristics: state ``(X, log J)`` of length ``2 M``
    (``w`` the node masses, ``logw`` their logarithms).

    Raises :class:`OutOfRangeError` once an edge weight exceeds its tolerance (infinite on
    a side where the initial measure was not cut; the loop then stops with status
    ``"failed"``, keeping the states saved before)."""
    def rhs(t: float, y: np.ndarray, _left: bool = False, _stage: Any = None) -> np.ndarray:
        X = y[:w.size]
        mean, var, edge = _tilted(X, X, w, logw, a, c)
        for e, tol in zip(edge, edge_tol, strict=True):
            if not e <= tol:
                raise OutOfRangeError(
                    f"the tilted measures put a mass {e:.3g} > edge_tol={tol:g} on an end "
                    f"node at t={t:.6g}: the solution has left the range the nodes resolve "
                    "(an expanding flow approaching its finite-time blow-up, see the "
                    "solve_line docstring)")
        return np.concatenate([v * mean, (v * a) * var])
    return rhs


def _times(t: Any) -> np.ndarray:
    ts = finite_array("t", t).ravel()
    if ts.size == 1:
        ts = np.array([0.0, positive("t", float(ts[0]))])
    if np.any(ts < 0) or np.any(np.diff(ts) <= 0) or not ts[-1] > 0:
        raise ArgumentError("t must be a final time > 0 or strictly increasing times >= 0 "
                            f"ending > 0, got {t!r:.80}")
    return ts


# ------------------------------------------------------------------ solver
def solve_line(density0: Any, t: Any, *, kind: str = "softmax", q: float = 1.0,
               k: float = 1.0, v: float = 1.0, beta: float = 1.0, l2_beta: float = 0.5,
               masked: bool = False, n_nodes: int = 401, tail: float = 1e-30,
               rtol: float = 1e-11, atol: float = 1e-13, max_steps: int = 100_000,
               max_norm: float = 1e8, edge_tol: float = 1e-16, warn: bool = True
               ) -> LineSolution:
    r"""Solve the mean-field continuity equation of attention on :math:`\mathbb R`.

    See the module docstring for the equation and the Lagrangian scheme.

    Parameters
    ----------
    density0 : frozen scipy.stats distribution or tuple ``(x, density)``
        Initial measure: a continuous distribution (``scipy.stats.norm(0, 1)``; its
        ``pdf``, ``cdf`` and ``ppf`` are used) or density values on strictly increasing
        nodes (piecewise-linear interpolant, zero outside, normalised to mass one).
    t : float or array_like
        Final time (the solution is saved at 0 and ``t``) or the saved times (strictly
        increasing, >= 0).
    kind : {"softmax", "l2"}
    q, k, v : float
        Scalar query, key and value.
    beta : float
        Inverse temperature of ``softmax`` (must stay 1 for ``l2``, as in
        :class:`~transformer_pde.Attention`).
    l2_beta : float
        :math:`\beta'` of the ``l2`` kernel (> 0).
    masked : bool
        Causal attention is not available on this equation (it needs token positions):
        ``True`` raises :class:`~transformer_pde.errors.ArgumentError`.
    n_nodes : int
        Number :math:`M` of Lagrangian nodes (>= 16).  A field evaluation costs
        :math:`O(M^2)`.
    tail : float
        Mass :math:`\epsilon` cut from each tail of an unbounded ``density0``
        (:math:`0 < \epsilon < 10^{-3}`; the default keeps :math:`\pm 11.5\sigma` of a
        Gaussian).
    rtol, atol : float
        Tolerances of the adaptive DOP853 steps (on the positions and :math:`\log J`).
    max_steps : int
        Step budget of the time loop.
    max_norm : float
        Stop with status ``"blowup"`` once a node leaves :math:`[-\text{max\_norm},
        \text{max\_norm}]` (or :math:`|\log J|` exceeds it).  This is a guard on the
        computation; the blow-up of the PDE itself is out of the scheme's range (see the
        module docstring).
    edge_tol : float
        Largest tilted mass :math:`\sum_i w_i\,\pi_{X_i}(X_1)` (and the same at
        :math:`X_M`) allowed on an end node where the initial tail was cut (an unbounded
        support; a measure given on a grid has no cut tail).  Beyond it the field depends
        on the truncated tails and the run stops with status ``"failed"`` and a message
        saying so, keeping the states saved before (an expanding flow reaches it before its
        blow-up; a contracting flow never).

    warn : bool, default True
        Issue the warning below; ``False`` leaves the status as the only report.

    Returns
    -------
    LineSolution
        A node leaving ``max_norm`` is reported in ``status`` (``"blowup"``) only.

    Warns
    -----
    EarlyStopWarning
        When the run ends before the last time without an answer (``edge_tol``: status
        ``"failed"``, or the step budget: ``"max_steps"``).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument: unknown ``kind``, ``masked=True``, ``beta != 1`` with ``l2``,
        non-finite parameters, a bad ``density0`` or ``t``.

    Examples
    --------
    >>> from scipy import stats
    >>> sol = solve_line(stats.norm(0.5, 1.0), 1.0, beta=-0.5)
    >>> means, covs = sol.moments()
    >>> round(float(covs[-1, 0, 0]), 6)     # 1 / (1 + 2 * 0.5): exact Gaussian variance
    0.5
    """
    kind = choice("kind", kind, ("softmax", "l2"))
    if not isinstance(masked, (bool, np.bool_)):
        raise ArgumentTypeError(f"masked must be a bool, got {masked!r:.60}")
    if masked:
        raise ArgumentError("masked=True is not available for solve_line: causal attention "
                            "needs token positions, which this equation does not carry")
    q, k, v = scalar("q", q), scalar("k", k), scalar("v", v)
    beta, l2_beta = scalar("beta", beta), positive("l2_beta", l2_beta)
    if kind == "l2" and beta != 1.0:
        raise ArgumentError("beta must stay 1 for kind='l2' (l2_beta is its temperature)")
    n_nodes = integer("n_nodes", n_nodes, minimum=16)
    tail = positive("tail", tail)
    if tail >= 1e-3:
        raise ArgumentError(f"tail must be < 1e-3, got {tail!r}")
    rtol, atol = positive("rtol", rtol), positive("atol", atol)
    max_steps = integer("max_steps", max_steps, minimum=1)
    warn = check_warn(warn)
    ts = _times(t)
    a, c = (beta * q * k, 0.0) if kind == "softmax" else (2 * l2_beta * q * k, l2_beta * k * k)
    lab, w, r0, cdf = _initial_nodes(density0, n_nodes, tail)
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    edge_tol = positive("edge_tol", edge_tol)
    rhs = _field(w, logw, a, c, v, _edge_tolerances(density0, edge_tol))

    saved_t: list[float] = []
    saved_y: list[np.ndarray] = []

    def save(tt: float, y: np.ndarray) -> None:
        saved_t.append(float(tt))
        saved_y.append(np.array(y, copy=True))

    y0 = np.concatenate([lab, np.zeros(lab.size)])
    loop = TimeLoop(Dop853(rtol=rtol, atol=atol), rhs, t_max=float(ts[-1]),
                    dt=float(ts[-1]) / 64, saveat=SaveAt(ts=ts),
                    limits=Limits(max_norm=positive("max_norm", max_norm), max_steps=max_steps),
                    tables=[], xp=np, save=save)
    if ts[0] == 0.0:
        save(0.0, y0)
    status, message, state = loop.run(loop.initial_state(y0))
    warn_stop(status, message, warn=warn)
    Y = np.array(saved_y).reshape(len(saved_y), 2 * lab.size)
    X, logJ = Y[:, :lab.size], Y[:, lab.size:]
    params = {"kind": kind, "q": q, "k": k, "v": v, "beta": beta, "l2_beta": l2_beta,
              "a": a, "c": c}
    return LineSolution(np.array(saved_t), X, r0[None, :] * np.exp(-logJ), w, cdf, lab,
                        status, message, params, state.n_steps)
