r"""How fast particles converge to the mean-field PDE: :func:`convergence_study`.

:math:`N` tokens drawn from :math:`\mu_0` on the circle evolve by the particle flow
(:func:`~transformer_pde.simulate` on the unit circle of :math:`\mathbb R^2`,
``Block(constraint="sphere")``); their empirical measure :math:`\mu^N_t` is compared with
the PDE solution :math:`\mu_t` (:func:`~transformer_pde.meanfield.circle.solve_circle`) by
the exact :math:`W_1` on the circle (:func:`~transformer_pde.meanfield.distance.w1_circle`)
at the final time.  The runs over :math:`(N, \text{draw})` are the cells of a
:mod:`transformer_pde.sweep` study.

The rate is the least-squares slope :math:`p` of :math:`\log W_1` against :math:`\log N`
over all cells, with its standard error

.. math::

    \hat p = \frac{\sum_c (u_c - \bar u)(y_c - \bar y)}{\sum_c (u_c - \bar u)^2}, \qquad
    \operatorname{se}(\hat p) = \sqrt{\frac{\sum_c r_c^2/(n - 2)}{\sum_c (u_c - \bar u)^2}},

:math:`u = \log N`, :math:`y = \log W_1`, :math:`r` the residuals.  For i.i.d. samples
the flow map of the mean-field equation is Lipschitz on :math:`W_1` over a finite time
(Dobrushin's estimate), so :math:`W_1(\mu^N_t, \mu_t) \le e^{Lt} W_1(\mu^N_0, \mu_0)` and
the rate is that of the initial sampling, :math:`N^{-1/2}` in one dimension.  Tokens at the
quantiles :math:`F_0^{-1}((i + 1/2)/N)` start at :math:`W_1 = 2\pi/(4N) + O(N^{-2})`
from :math:`\mu_0` (each token is the median of its cell of mass :math:`1/N`), so they
converge like :math:`N^{-1}` (until the time integration or the PDE's own accuracy is
reached).

The PDE's density is first interpolated to ``refine`` times more points by zero-padding
its Fourier series (an exact interpolation of the trigonometric polynomial), and then read
as a periodic piecewise-linear density, both to draw the tokens (inverse CDF) and to
measure :math:`W_1`.

The particle field is the direct sum over all pairs, :math:`O(N^2)` per evaluation, or,
with ``field=FieldOptions(method="harmonic")``, the exact :math:`O(NK)` harmonic expansion
(:mod:`~transformer_pde.fields.harmonic`; both models are isotropic attention on the
circle), which makes :math:`N = 10^5` cheap on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..attention import Attention
from ..blocks import Block
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate import SaveAt
from ..particles import FieldOptions, simulate
from ..sweep import Grid, Output, Study, run, status_code
from ..validation import choice, integer, nonnegative, positive
from .circle import solve_circle
from .distance import circle_quantile, w1_circle

__all__ = ["ConvergenceStudy", "CircleParticleCell", "convergence_study", "fit_rate"]

TWO_PI = 2.0 * math.pi


def _attention(model: str, beta: float, shift: float) -> Attention:
    """The attention of the particle runs: softmax (``"sa"``) or ``kind="exp"`` with
    ``shift`` (``"usa"``), :math:`Q = K = V = I_2`."""
    I2 = np.eye(2)
    return (Attention("softmax", I2, I2, I2, beta=beta) if model == "sa" else
            Attention("exp", I2, I2, I2, beta=beta, shift=shift))


def _field_config(fopts: FieldOptions | None) -> dict:
    """What of ``fopts`` changes the particle runs' numbers (the method, its tolerance,
    the precision; not the backend), for the study's identity; empty for the default."""
    if fopts is None:
        return {}
    return {"field": {"method": fopts.method, "harmonic_tol": fopts.harmonic_tol,
                      "dtype": None if fopts.dtype is None else str(fopts.dtype)}}


def _refine(density: np.ndarray, factor: int) -> np.ndarray:
    """Values of the trigonometric interpolant of ``density`` on ``factor`` times more points."""
    m = density.size
    return np.fft.irfft(np.fft.rfft(density), n=m * factor) * factor


@dataclass(frozen=True)
class CircleParticleCell:
    r"""One particle run of :func:`convergence_study` (a sweep cell over ``N``).

    Draws ``N`` angles from the density ``density0`` (values on the uniform grid
    :math:`2\pi j/M`, periodic piecewise linear): i.i.d. with the cell's generator
    (``sampling="random"``) or at the quantiles :math:`(i + 1/2)/N` rotated by a uniform
    random offset of the mass coordinate (``"quantile"``: different draws differ by
    that offset only), runs the flow to ``t`` with RK4 steps ``dt`` and the field options
    ``field`` (``None``: the defaults of :func:`~transformer_pde.simulate`), and returns
    ``w1`` (to ``density_t``, the PDE at ``t``) and ``status`` (code).
    """

    density0: tuple
    density_t: tuple
    beta: float
    t: float
    dt: float
    model: str = "sa"
    shift: float = 0.0
    sampling: str = "random"
    N: int = 100
    field: FieldOptions | None = None

    def outputs(self, grid: Grid) -> dict:
        return {"w1": Output(), "status": Output((), "int8")}

    def config(self) -> dict:
        return {"cell": type(self).__name__, "beta": self.beta, "t": self.t, "dt": self.dt,
                "model": self.model, "shift": self.shift, "sampling": self.sampling,
                "density0": np.round(np.asarray(self.density0, float), 15).tolist(),
                "density_t": np.round(np.asarray(self.density_t, float), 15).tolist(),
                **_field_config(self.field)}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        n = int(params.get("N", self.N))
        theta = TWO_PI * np.arange(len(self.density0)) / len(self.density0)
        if self.sampling == "random":
            m = rng.random(n)
        else:
            m = np.mod((np.arange(n) + 0.5) / n + rng.random(), 1.0)
        ang = circle_quantile(theta, np.asarray(self.density0, float), m)
        X0 = np.column_stack([np.cos(ang), np.sin(ang)])
        traj = simulate(_attention(self.model, self.beta, self.shift), X0, t_max=self.t,
                        dt=self.dt, solver="rk4", block=Block(constraint="sphere"),
                        saveat=SaveAt(ts=[self.t]), field=self.field)
        dens = np.asarray(self.density_t, float)
        w1 = w1_circle(traj.states[-1], (TWO_PI * np.arange(dens.size) / dens.size, dens))
        return {"w1": float(w1), "status": status_code(traj.status)}


def fit_rate(N: Any, w1: Any) -> tuple[float, float]:
    """Least-squares slope of ``log w1`` against ``log N`` and its standard error (see the
    module docstring); needs at least three points and two distinct ``N``."""
    u = np.log(np.asarray(N, float).ravel())
    y = np.log(np.asarray(w1, float).ravel())
    ok = np.isfinite(u) & np.isfinite(y)
    u, y = u[ok], y[ok]
    if u.size < 3 or np.ptp(u) == 0:
        raise ArgumentError("fit_rate needs at least three finite points at two or more N")
    du = u - u.mean()
    slope = float(du @ (y - y.mean()) / (du @ du))
    resid = y - y.mean() - slope * du
    return slope, float(math.sqrt(resid @ resid / (u.size - 2) / (du @ du)))


@dataclass
class ConvergenceStudy:
    r"""Result of :func:`convergence_study`.

    Attributes
    ----------
    Ns : ndarray (K,)
    w1 : ndarray (K, S)
        :math:`W_1(\mu^N_t, \mu_t)` per ``N`` and draw (NaN for a failed cell).
    slope, slope_se : float
        Fitted rate :math:`p` in :math:`W_1 \propto N^p` and its standard error.
    sampling : str
    solution : CircleSolution
        The PDE solution the particles were measured against.
    results : xarray.Dataset
        The sweep's results (``w1``, ``status``, ``cell_status`` over ``(N, draw)``).
    """

    Ns: np.ndarray
    w1: np.ndarray
    slope: float
    slope_se: float
    sampling: str
    solution: Any
    results: Any = field(repr=False, default=None)


def convergence_study(density0: Any, beta: float, t: float, *,
                      Ns: Any = (100, 1000, 10000, 100000), seeds: int = 4, seed: int = 0,
                      model: str = "sa", shift: float = 0.0, sampling: str = "random",
                      dt: float = 0.01, refine: int = 8, field: FieldOptions | None = None,
                      scheduler: Any = "serial", progress: bool = False,
                      **solve_options: Any) -> ConvergenceStudy:
    r"""Particles against the PDE on the circle: :math:`W_1` at time ``t`` versus :math:`N`.

    Parameters
    ----------
    density0 : callable or array_like
        Initial density, as :func:`~transformer_pde.meanfield.circle.solve_circle` takes it.
    beta : float
        Inverse temperature.
    t : float
        Final time (> 0).
    Ns : sequence of int
        Token counts (each >= 2; at least two distinct).  With the direct field a run
        costs :math:`O(N^2)` per field evaluation (all pairs): :math:`N = 10^5` needs a GPU
        or hours of CPU; with ``field=FieldOptions(method="harmonic")``, :math:`O(NK)`.
    seeds : int
        Draws per ``N`` (independent samples, seeded from ``seed`` through the sweep grid).
    seed : int
        Base seed of the sweep grid.
    model : {"sa", "usa"}
        Softmax self-attention or its unnormalised variant (kind ``"exp"``, with ``shift``).
    sampling : {"random", "quantile"}
        I.i.d. tokens, or tokens at the quantiles :math:`(i + 1/2)/N` (with a random
        common offset per draw).
    dt : float
        RK4 step of the particle runs (error :math:`O(dt^4)`, to stay below the smallest
        :math:`W_1` measured).
    refine : int
        Factor of the trigonometric interpolation of the PDE's density before it is read
        as a piecewise-linear density (>= 1).
    field : FieldOptions, optional
        How the particle runs evaluate the field (:class:`~transformer_pde.FieldOptions`;
        default that of :func:`~transformer_pde.simulate`): ``method="harmonic"`` for the
        exact harmonic expansion, ``backend``, ``dtype``.  Checked against the model before
        any run.
    scheduler : "serial", None or a Dask scheduler
        As :func:`transformer_pde.sweep.run` (default: this process).
    progress : bool
        Progress bar of the sweep.
    **solve_options
        Passed to :func:`~transformer_pde.meanfield.circle.solve_circle`.

    Returns
    -------
    ConvergenceStudy

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument.
    """
    beta = nonnegative("beta", beta)
    t = positive("t", t)
    dt = positive("dt", dt)
    model = choice("model", model, ("sa", "usa"))
    sampling = choice("sampling", sampling, ("random", "quantile"))
    refine = integer("refine", refine, minimum=1)
    seeds = integer("seeds", seeds, minimum=1)
    if isinstance(Ns, (str, bytes)) or np.ndim(Ns) != 1:
        raise ArgumentError(f"Ns must be a sequence of token counts, got {Ns!r:.60}")
    Ns = [integer("Ns", n, minimum=2) for n in Ns]
    if len(set(Ns)) < 2:
        raise ArgumentError(f"Ns needs at least two distinct token counts, got {Ns}")
    if field is not None:
        if not isinstance(field, FieldOptions):
            raise ArgumentTypeError(f"field must be a transformer_pde.FieldOptions or None, "
                                    f"got {type(field).__name__}")
        field.check(_attention(model, beta, float(shift)), Block(constraint="sphere"))
    sol = solve_circle(density0, beta, [0.0, t], model=model, shift=shift, **solve_options)
    if not sol.success or abs(sol.times[-1] - t) > 1e-12 * max(1.0, t):
        raise ArgumentError(f"the PDE solve did not reach t={t:g}: {sol.message}")
    d0 = np.maximum(_refine(np.asarray(sol.density[0], float), refine), 0.0)
    dT = np.maximum(_refine(np.asarray(sol.density[-1], float), refine), 0.0)
    cell = CircleParticleCell(tuple(d0.tolist()), tuple(dT.tolist()), beta, t, dt, model,
                              float(shift), sampling, field=field)
    study = Study(Grid({"N": sorted(Ns)}, draws=seeds, seed=integer("seed", seed, minimum=0)),
                  cell, name="meanfield-convergence")
    ds = run(study, scheduler=scheduler, progress=progress)
    w1 = np.asarray(ds["w1"].values, float)
    ok = np.asarray(ds["cell_status"].values) == 1
    w1 = np.where(ok, w1, np.nan)
    Nn = np.broadcast_to(np.asarray(sorted(Ns), float)[:, None], w1.shape)
    slope, se = fit_rate(Nn[np.isfinite(w1)], w1[np.isfinite(w1)])
    return ConvergenceStudy(np.asarray(sorted(Ns)), w1, slope, se, sampling, sol, ds)
