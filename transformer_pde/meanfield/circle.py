r"""The mean-field equation of attention on the circle, solved as a PDE.

Tokens on :math:`S^1` (angle :math:`\theta`, :math:`Q = K = V = I`, post-LN flow) have, in
the mean-field limit, a density :math:`\mu(t, \theta)` solving the continuity equation

.. math:: \partial_t \mu + \partial_\theta(\mu\, v[\mu]) = D\,\partial_\theta^2\mu, \qquad
          v_{SA} = \frac{1}{\beta}\partial_\theta \log(K*\mu), \quad
          v_{USA} = \frac{e^{-c}}{\beta}\partial_\theta (K*\mu),

with :math:`K(\theta) = e^{\beta\cos\theta}`, :math:`c` the ``shift`` of the
unnormalised kernel and :math:`D = \sigma^2/2 \ge 0` the diffusion of independent noise
:math:`\sigma\,dW` on every token (the McKean–Vlasov equation; :math:`D = 0` by
default).  :func:`solve_circle` integrates it pseudo-spectrally
(:mod:`~transformer_pde.meanfield.spectral`) with the adaptive DOP853 pair of the
package's time loop (:class:`~transformer_pde.integrate.TimeLoop`), doubling the number
of Fourier modes whenever the top third of the spectrum grows above a tolerance, and
returns a :class:`CircleSolution`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import results_display as display
from ..errors import ArgumentError
from ..extras import require
from ..integrate import Dop853, Limits, LoopState, SaveAt, TimeLoop, initial_step
from ..io.saving import LabelledSave
from ..results import HasStatus, Status, check_warn, warn_stop
from ..validation import choice, finite_array, integer, nonnegative, positive, scalar
from .spectral import (MODELS, CircleField, as_complex, as_real, evaluate, pad,
                       tail_share)

__all__ = ["CircleSolution", "initial_coefficients", "solve_circle"]

#: fewest modes a solve starts from
MIN_MODES = 8
#: a density below ``-NEGATIVE_SLACK * tol * max(density)`` counts as negative
NEGATIVE_SLACK = 10.0


@dataclass(repr=False)
class CircleSolution(display.Summarised, HasStatus, LabelledSave):
    r"""Result of :func:`solve_circle`.

    Attributes
    ----------
    times : ndarray (T,)
        Saved times: the requested ones reached, and, after an early stop, the time of
        the last resolved state.
    theta : ndarray (M,)
        Output grid :math:`\theta_j = 2\pi j/M`.
    density : ndarray (T, M)
        :math:`\mu(t, \theta_j)` (a probability density: :math:`\int\mu\,d\theta = 1`).
    coefficients : ndarray (T, n_max), complex
        :math:`\hat\mu_k(t)`, :math:`k = 0..n_{max}-1` (zero above the modes in use).
    modes : ndarray (T,) of int
        Number of Fourier modes in use at each saved time.
    mass : ndarray (T,)
        :math:`\frac{2\pi}{M}\sum_j \mu(t, \theta_j)` (exact quadrature of the
        trigonometric polynomial; 1 up to round-off).
    min_density : ndarray (T,)
        :math:`\min_j \mu(t, \theta_j)`.
    tail : ndarray (T,)
        Relative :math:`L^2` share of the top third of the spectrum
        (:func:`~transformer_pde.meanfield.spectral.tail_share`).
    status : Status
        ``"ok"``, ``"failed"`` (not resolved within ``max_modes``, or a negative
        density), ``"nonfinite"`` or ``"max_steps"``.
    message : str
    model : str
    beta, shift, tol : float
    n_steps : int
        Attempted time steps (all resolutions together).
    diffusion : float
        The diffusion coefficient :math:`D` of the equation (0 without noise).
    """

    times: np.ndarray
    theta: np.ndarray
    density: np.ndarray
    coefficients: np.ndarray
    modes: np.ndarray
    mass: np.ndarray
    min_density: np.ndarray
    tail: np.ndarray
    status: Status
    message: str
    model: str
    beta: float
    shift: float
    tol: float
    n_steps: int = 0
    diffusion: float = 0.0

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("times", display.time_span(self.times)),
                ("density", f"{display.array_summary(self.density)} on "
                            f"{self.theta.size} angles"),
                ("modes", display.stats_text(self.modes)),
                ("min density", display.stats_text(self.min_density)),
                ("steps", str(self.n_steps)), ("message", self.message)]
        noise = f", diffusion={self.diffusion:g}" if self.diffusion else ""
        return (f"CircleSolution(status='{self.status}', model={self.model!r}, "
                f"beta={self.beta:g}{noise}, saved={len(self.times)})", rows)

    def to_xarray(self) -> Any:
        """The solution as a labelled :class:`xarray.Dataset`: ``density (time, theta)``,
        ``spectrum (time, mode)`` (:math:`|\\hat\\mu_k|`), ``modes``, ``mass``,
        ``min_density``, ``tail`` over ``time``; ``model``, ``beta``, ``shift``,
        ``diffusion``, ``tol``, ``status`` and ``message`` as attributes.  Needs the ``io`` extra (xarray)."""
        xr = require("xarray", "CircleSolution.to_xarray")
        data = {"density": (("time", "theta"), self.density),
                "spectrum": (("time", "mode"), np.abs(self.coefficients)),
                "modes": (("time",), self.modes), "mass": (("time",), self.mass),
                "min_density": (("time",), self.min_density), "tail": (("time",), self.tail)}
        coords = {"time": self.times, "theta": self.theta,
                  "mode": np.arange(self.coefficients.shape[1])}
        attrs = {"transformer_pde": "meanfield-circle", "model": self.model,
                 "beta": self.beta, "shift": self.shift, "diffusion": self.diffusion,
                 "tol": self.tol,
                 "status": str(self.status), "message": self.message}
        return xr.Dataset(data, coords=coords, attrs=attrs)


class _Resolution(Exception):
    """Raised inside a trial step that would be accepted but is not resolved."""


class _WatchedDop853(Dop853):
    """DOP853 whose trial steps are checked for resolution before they are accepted."""

    def __init__(self, rtol: float, atol: float, tol: float, field_: CircleField):
        super().__init__(rtol=rtol, atol=atol)
        self.tol, self.field = tol, field_
        self.reason: str | None = None

    def attempt(self, f: Any, t: float, y: Any, h: float, fy: Any):
        y_new, err, f_new = super().attempt(f, t, y, h, fy)
        if err <= 1.0 and np.all(np.isfinite(y_new)):
            c = as_complex(y_new)
            share = tail_share(c)
            if share > self.tol:
                self.reason = (f"the top third of the spectrum holds {share:.3g} > "
                               f"tol={self.tol:g}")
                raise _Resolution(self.reason)
            rho = self.field.grid(c)
            low, high = float(rho.min()), float(rho.max())
            if low < -NEGATIVE_SLACK * self.tol * high:
                self.reason = (f"the density reached {low:.3g} < 0 (maximum {high:.3g}): "
                               "under-resolved")
                raise _Resolution(self.reason)
        return y_new, err, f_new


# ------------------------------------------------------------------ input
def _samples(density0: Any, m: int) -> np.ndarray:
    """``density0`` on the grid of ``m`` points (a callable is called on it)."""
    theta = 2.0 * np.pi * np.arange(m) / m
    try:
        values = density0(theta)
    except Exception as exc:   # the user's callable failed: say so, naming density0
        raise ArgumentError(f"density0 failed on a grid of {m} angles in [0, 2 pi): "
                            f"{type(exc).__name__}: {exc}") from exc
    values = finite_array("density0(theta)", values)
    if values.shape != theta.shape:
        raise ArgumentError(f"density0(theta) must return an array of the shape of theta "
                            f"({m},), got shape {values.shape}")
    return values


def _check_values(values: np.ndarray, name: str) -> None:
    low = float(values.min())
    if low < 0:
        raise ArgumentError(f"{name} must be a non-negative density, got a minimum of {low:.6g}")
    if not values.max() > 0:
        raise ArgumentError(f"{name} is zero everywhere: it has no mass to normalise")


def initial_coefficients(density0: Any, tol: float, modes: int, max_modes: int
                         ) -> tuple[np.ndarray, int]:
    r"""``(c, grid)``: the normalised Fourier coefficients of ``density0`` on the fewest
    modes :math:`n = \text{modes}\cdot 2^j` whose :func:`tail_share` is at most ``tol``,
    and the length of the sample grid (0 for a callable).

    Raises
    ------
    ArgumentError
        Negative, zero or non-finite values, a grid shorter than 4 points, or a density
        not resolved by its samples (or within ``max_modes`` for a callable)."""
    if callable(density0):
        n = modes
        while True:
            values = _samples(density0, 2 * n)
            _check_values(values, "density0(theta)")
            c = np.fft.rfft(values) / values.size
            if tail_share(c, n) <= tol:
                return c[:n] / (2.0 * np.pi * c[0].real), 0
            if 2 * n > max_modes:
                raise ArgumentError(
                    f"density0 is not resolved by max_modes={max_modes} Fourier modes to "
                    f"tol={tol:g} (the top third of the spectrum holds "
                    f"{tail_share(c, n):.3g}); raise max_modes or smooth density0")
            n *= 2
    values = finite_array("density0", density0)
    if values.ndim != 1 or values.size < 4:
        raise ArgumentError(f"density0 must be a callable of theta or a 1-d array of at "
                            f"least 4 samples on a uniform grid of [0, 2 pi), got shape "
                            f"{values.shape}")
    _check_values(values, "density0")
    c = np.fft.rfft(values) / values.size
    top = (values.size - 1) // 2 + 1        # modes below the Nyquist frequency
    n = min(modes, top)
    while tail_share(c, n) > tol:
        if n >= top:
            raise ArgumentError(
                f"density0 is not resolved by its {values.size} samples to tol={tol:g} "
                f"(the top third of the spectrum holds {tail_share(c, n):.3g}): sample it "
                "on a finer grid, pass a callable, or raise tol")
        n = min(2 * n, top)
    return c[:n] / (2.0 * np.pi * c[0].real), values.size


def _times(t: Any) -> np.ndarray:
    if np.isscalar(t) or np.ndim(t) == 0:
        t = [0.0, scalar("t", t)]
    ts = finite_array("t", t).ravel()
    if ts.size == 0 or np.any(ts < 0) or np.any(np.diff(ts) <= 0):
        raise ArgumentError("t must be a non-empty, strictly increasing array of save times "
                            f">= 0, got {t!r:.80}")
    return ts


# ------------------------------------------------------------------ the run
@dataclass
class _Run:
    """The pieces of a running solve and what it has saved."""

    ts: np.ndarray           # requested save times
    scale: float             # the time of the field: tau = scale * t
    saved: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tau = self.ts * self.scale
        self.back = dict(zip(self.tau.tolist(), self.ts.tolist(), strict=True))

    def save(self, tau: float, y: Any) -> None:
        self.saved.append((self.back.get(tau, tau / self.scale),
                           as_complex(np.array(y, dtype=np.float64)).copy()))


def _loop(run: _Run, field_: CircleField, solver: Any, max_steps: int) -> TimeLoop:
    saveat = SaveAt(ts=run.tau[run.tau > 0]) if run.tau[-1] > 0 else SaveAt(ts=[0.0])
    return TimeLoop(solver, field_, t_max=float(run.tau[-1]), dt=float(run.tau[-1]),
                    saveat=saveat, limits=Limits(max_norm=1e8, max_steps=max_steps),
                    tables=[], xp=np, save=run.save)


def _first_step(field_: CircleField, y0: np.ndarray, rtol: float, atol: float,
                t_max: float) -> float:
    f0 = field_(0.0, y0)
    h = initial_step(y0, f0, rtol, atol, h_max=t_max, f=lambda y: field_(0.0, y),
                     error_order=7)
    return float(h)


def _integrate(run: _Run, c0: np.ndarray, beta: float, model: str, opts: dict
               ) -> tuple[Status, str, int]:
    """Run the time loop, doubling the modes on every resolution stop."""
    n, tau_max = c0.size, float(run.tau[-1])
    if tau_max == 0:
        return Status.OK, "t_max=0: nothing to integrate", 0
    diffusion = opts["diffusion"] / run.scale      # in the time of the field
    field_ = CircleField(n, beta, model, diffusion)
    y = as_real(c0)
    st = LoopState(t=0.0, y=y, h=_first_step(field_, y, opts["rtol"], opts["atol"], tau_max))
    while True:
        solver = _WatchedDop853(opts["rtol"], opts["atol"], opts["tol"], field_)
        status, message, st = _loop(run, field_, solver, opts["max_steps"]).run(st)
        if solver.reason is None:
            if status == Status.OK:
                message = (f"reached t={run.ts[-1]:g} in {st.n_steps} steps with at most "
                           f"{n} Fourier modes")
            return status, message, st.n_steps
        if 2 * n > opts["max_modes"]:
            t_stop = st.t / run.scale
            if not run.saved or run.saved[-1][0] != run.back.get(st.t, t_stop):
                run.saved.append((t_stop, as_complex(st.y).copy()))
            return Status.FAILED, (
                f"not resolved after t={t_stop:.6g} with max_modes={opts['max_modes']} "
                f"Fourier modes: {solver.reason}; the density concentrates faster than "
                "the modes resolve it (the states up to the last resolved one, at "
                f"t={t_stop:.6g}, are kept)"), st.n_steps
        n *= 2
        field_ = CircleField(n, beta, model, diffusion)
        st = LoopState(t=st.t, y=as_real(pad(as_complex(st.y), n)), h=st.h,
                       n_steps=st.n_steps, n_rejected=st.n_rejected, target=st.target,
                       err_prev=st.err_prev)


def _check_options(beta: Any, model: Any, modes: Any, tol: Any, rtol: Any, atol: Any,
                   max_modes: Any, shift: Any, n_theta: Any, max_steps: Any,
                   diffusion: Any = 0.0) -> dict:
    beta = nonnegative("beta", beta)
    model = choice("model", model, MODELS)
    max_modes = integer("max_modes", max_modes, minimum=MIN_MODES)
    modes = MIN_MODES * 2 if modes is None else integer("modes", modes, minimum=4)
    if modes > max_modes:
        raise ArgumentError(f"modes={modes} exceeds max_modes={max_modes}")
    tol = positive("tol", tol)
    if tol >= 1:
        raise ArgumentError(f"tol must be < 1 (a relative share of the spectrum), got {tol!r}")
    opts = {"beta": beta, "model": model, "modes": modes, "max_modes": max_modes, "tol": tol,
            "rtol": positive("rtol", rtol), "shift": scalar("shift", shift),
            "n_theta": None if n_theta is None else integer("n_theta", n_theta, minimum=4),
            "max_steps": integer("max_steps", max_steps, minimum=1),
            "diffusion": nonnegative("diffusion", diffusion)}
    # default: the integration error of a coefficient stays 1000 times below the
    # resolution tolerance (times the mean coefficient 1/(2 pi)), so that it does not
    # count as spectral content of the top modes
    opts["atol"] = (1e-3 * tol / (2.0 * np.pi) if atol is None
                    else nonnegative("atol", atol))
    return opts


def _time_scale(opts: dict, t_max: float) -> float:
    """:math:`e^{\\beta - c}` for USA (the time of the field), 1 for SA."""
    if opts["model"] == "sa":
        return 1.0
    log_scale = opts["beta"] - opts["shift"]
    if t_max > 0 and log_scale + math.log(t_max) > 700:
        raise ArgumentError(
            f"USA at beta={opts['beta']:g}, shift={opts['shift']:g}: the time scale "
            f"e^(beta - shift) t_max overflows; pass shift=beta (the kernel e^(beta<x,y> - "
            "shift) then has rates of order one)")
    return math.exp(log_scale)


def _solution(run: _Run, ts: np.ndarray, status: Status, message: str, n_steps: int,
              opts: dict, grid: int) -> CircleSolution:
    times = np.array([s[0] for s in run.saved])
    modes = np.array([s[1].size for s in run.saved], dtype=int)
    n_max = int(modes.max())
    coeffs = np.stack([pad(s[1], n_max) for s in run.saved])
    m = opts["n_theta"] or max(grid, 2 * n_max)
    density = evaluate(coeffs, m)
    tails = np.array([tail_share(s[1]) for s in run.saved])
    return CircleSolution(
        times=times, theta=2.0 * np.pi * np.arange(m) / m, density=density,
        coefficients=coeffs, modes=modes, mass=density.mean(axis=1) * 2.0 * np.pi,
        min_density=density.min(axis=1), tail=tails, status=status, message=message,
        model=opts["model"], beta=opts["beta"], shift=opts["shift"], tol=opts["tol"],
        n_steps=n_steps, diffusion=opts["diffusion"])


def solve_circle(density0: Callable[[np.ndarray], Any] | Any, beta: float, t: Any, *,
                 model: str = "sa", modes: int | None = None, tol: float = 1e-12,
                 rtol: float = 1e-10, atol: float | None = None, max_modes: int = 4096,
                 shift: float = 0.0, n_theta: int | None = None,
                 max_steps: int = 1_000_000, diffusion: float = 0.0,
                 warn: bool = True) -> CircleSolution:
    r"""Solve the mean-field equation of attention on the circle from ``density0``.

    .. math:: \partial_t\mu + \partial_\theta(\mu v) = D\,\partial_\theta^2\mu, \qquad
              \partial_t\hat\mu_k = -ik\sum_m \hat v_m\,\hat\mu_{k-m} - D k^2\hat\mu_k,

    with :math:`v = \beta^{-1}\partial_\theta\log(K*\mu)` (``"sa"``, normalised
    self-attention, ``Attention("softmax", I, I, I, beta)`` on the circle) or
    :math:`v = e^{-c}\beta^{-1}\partial_\theta(K*\mu)` (``"usa"``, the unnormalised
    ``Attention("exp", ..., shift=c)``), :math:`K = e^{\beta\cos\theta}` and
    :math:`\widehat{(K*\mu)}_m = 2\pi I_m(\beta)\hat\mu_m`.  For USA the Fourier system
    is the closed quadratic ODE

    .. math:: \frac{d\hat\mu_k}{dt} = \frac{2\pi k\, e^{-c}}{\beta}
              \sum_m m\, I_m(\beta)\,\hat\mu_m\,\hat\mu_{k-m}.

    Pseudo-spectral in :math:`\theta` (products on a grid of :math:`3n` points, so exact
    for the :math:`n` modes kept), adaptive DOP853 in time
    (:class:`~transformer_pde.integrate.TimeLoop`), :math:`\hat\mu_0 = 1/(2\pi)` held
    exactly.  **Resolution control**: the solve starts from the fewest modes
    :math:`n = \text{modes}\cdot 2^j` for which the top third of the spectrum of
    ``density0`` has a relative :math:`L^2` share at most ``tol``; a trial step whose
    result has a larger share, or a negative density (below :math:`-10\,\text{tol}\max\mu`),
    is not taken: the modes are doubled (zero-padding, an exact interpolation) and the
    step retried.  When doubling would exceed ``max_modes`` the solve stops with status
    ``"failed"``, an :class:`~transformer_pde.errors.EarlyStopWarning`, and keeps the
    saved states plus the last resolved one.

    Parameters
    ----------
    density0 : callable or array_like (L,)
        Initial density: a callable ``density0(theta)`` (array in, array of the same shape
        out) or its samples at :math:`\theta_j = 2\pi j/L`.  Non-negative, not zero; it is
        divided by its mass (the solution is a probability density).
    beta : float
        Inverse temperature :math:`\beta \ge 0` (large values such as 200 are fine:
        :math:`e^{\beta}` is never formed).
    t : array_like (T,) or float
        Save times (strictly increasing, :math:`\ge 0`); a number means ``[0, t]``.
    model : {"sa", "usa"}
    modes : int, optional
        Fewest modes to start from (default 16).
    tol : float, default 1e-12
        Largest relative :math:`L^2` share of the top third of the spectrum.
    rtol, atol : float
        Tolerances of DOP853 on the coefficients; ``atol`` defaults to
        :math:`10^{-3}\,\mathrm{tol}/(2\pi)`: the time-stepping error of the
        top modes then stays well below the resolution tolerance (a larger ``atol`` shows
        up there as spectral content and makes the modes double for nothing).  Follow
        coefficients far below it, such as small perturbations, with a smaller ``atol``;
        ``tol`` below about :math:`10^{-14}` meets the round-off of the FFTs.  USA is integrated in the time
        :math:`\tau = e^{\beta - c} t`.
    max_modes : int, default 4096
    shift : float, default 0.0
        The constant :math:`c` of USA's kernel :math:`e^{\beta\langle x, y\rangle - c}`
        (no effect on SA, where it cancels).
    n_theta : int, optional
        Points of the output grid (default: the length of the samples of ``density0`` or
        twice the largest number of modes used, whichever is larger).
    max_steps : int, default 1_000_000
        Budget of attempted time steps.
    diffusion : float, default 0.0
        :math:`D \ge 0`: the McKean–Vlasov equation of tokens with independent noise
        :math:`\sigma\,dW`, :math:`D = \sigma^2/2` (exact in Fourier:
        :math:`-Dk^2\hat\mu_k`; each linear rate about the uniform density drops by
        :math:`Dk^2`).  Explicit in time, so a large :math:`D` on many modes makes the
        steps small (of order :math:`1/(D n^2)`); the noise keeps the density smooth
        and the modes few.
    warn : bool, default True
        Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when the solve ends
        without an answer (``failed``, ``max_steps``, ``nonfinite``, ``interrupted``);
        ``False`` leaves the status as the only report.

    Returns
    -------
    CircleSolution

    Raises
    ------
    ArgumentError, ArgumentTypeError
        A negative, zero, non-finite or unresolved ``density0``, a sample array that is not
        1-d or shorter than 4, ``beta < 0``, bad times or options (the message names the
        argument).

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_pde.meanfield.circle import solve_circle
    >>> sol = solve_circle(lambda th: 1 + 0.1 * np.cos(3 * th), 5.0, [0.0, 1.0])
    >>> str(sol.status), bool(abs(sol.mass[-1] - 1) < 1e-12)
    ('ok', True)
    """
    opts = _check_options(beta, model, modes, tol, rtol, atol, max_modes, shift, n_theta,
                          max_steps, diffusion)
    warn = check_warn(warn)
    ts = _times(t)
    c0, grid = initial_coefficients(density0, opts["tol"], opts["modes"], opts["max_modes"])
    run = _Run(ts, _time_scale(opts, float(ts[-1])))
    if ts[0] == 0:
        run.saved.append((0.0, c0.copy()))
    status, message, n_steps = _integrate(run, c0, opts["beta"], opts["model"], opts)
    if not run.saved:   # stopped before the first save time: keep the initial state
        run.saved.append((0.0, c0.copy()))
    warn_stop(status, message, warn=warn)
    return _solution(run, ts, status, message, n_steps, opts, grid)
