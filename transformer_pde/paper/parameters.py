r"""The parameters of the paper's 2-D covariance figures, as data.

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322) draw their 2-D covariance figures from
seeded NumPy draws; replaying those draws gives the matrices below (17 significant digits).
Each figure has one grid of initial covariances and one :math:`(Q, K, V)`; each of its
panels ("variants") runs one attention kind with its own explicit Euler step and stopping
rule.

Conventions of the paper's code (see ``docs/conventions.md`` for the library's own):

* initial covariances: the trace-one grid of :func:`init_grid`;
* scalings (:func:`~transformer_pde.paper.paper_attention`): softmax and each head
  :math:`A_h = K_h^\top Q_h/\sqrt k` with :math:`k = d/H`, head :math:`h` taking rows
  :math:`hk \dots (h+1)k-1` of :math:`Q, K, V` (:math:`W_O = I`); L2 kernel
  :math:`\exp(-|Qx/\sqrt d - Ky|^2)`; Sinkhorn :math:`\varepsilon = 1`, unscaled;
* ``"plane"``: :math:`Q, K` have one row and :math:`H = 2`, so head 0 gets that row and
  head 1 none (:math:`A_1 = 0`);
* ``"initial"``: the paper's multi-head variant passes no :math:`H`, so it is single-head
  (it differs from ``trad`` only by its step); :data:`EXTRA_RUNS` adds a true 2-head variant;
* time stepping: projected explicit Euler with step ``step``; a run stops as ``converged``
  when :math:`\|\Sigma'\|_F` < ``tol_low``, as ``exceeded`` when
  :math:`\operatorname{tr}\Sigma` > ``tol_high``, or after ``max_iter`` steps
  (:func:`transformer_pde.paper.euler_reference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scalings import paper_attention

__all__ = ["EXTRA_RUNS", "FIGURE_NAMES", "Figure", "CovarianceGrid", "PaperRun", "StopRule",
           "init_grid", "paper_figure", "paper_run", "paper_runs"]


def init_grid(n_U: int, n_C: int, limits: Any) -> np.ndarray:
    r"""The paper's grid of trace-one initial covariances.

    :math:`u` on ``linspace(lo_u, hi_u, n_U)`` (outer loop), :math:`w` on
    ``linspace(lo_w, hi_w, n_C)`` (inner loop), :math:`v = 1`; a point is kept when it is
    strictly inside the cone, :math:`v^2 - u^2 > w^2`, and gives

    .. math:: \Sigma = \begin{pmatrix} (v+u)/2 & w/2\\ w/2 & (v-u)/2 \end{pmatrix}.

    Parameters
    ----------
    n_U, n_C : int
        Numbers of grid values of :math:`u` and :math:`w`.
    limits : sequence of 4 floats
        ``[lo_u, hi_u, lo_w, hi_w]``.

    Returns
    -------
    ndarray, shape (n, 2, 2)
        The kept covariances, :math:`u` varying slowest.

    Examples
    --------
    >>> init_grid(10, 10, [-0.5, 0.5, -0.5, 0.5]).shape
    (100, 2, 2)
    >>> init_grid(20, 20, [-1, 1, -1, 1]).shape
    (276, 2, 2)
    """
    n_U, n_C = int(n_U), int(n_C)
    if n_U < 1 or n_C < 1:
        raise ValueError(f"n_U and n_C must be >= 1, got {n_U}, {n_C}")
    lim = np.asarray(limits, dtype=float)
    if lim.shape != (4,) or not np.all(np.isfinite(lim)):
        raise ValueError(f"limits must be 4 finite numbers [lo_u, hi_u, lo_w, hi_w], got {limits!r}")
    u, w = np.meshgrid(np.linspace(lim[0], lim[1], n_U), np.linspace(lim[2], lim[3], n_C),
                       indexing="ij")
    u, w = u.ravel(), w.ravel()
    v = 1.0
    keep = v * v - u * u > w * w
    u, w = u[keep], w[keep]
    out = np.empty((u.size, 2, 2))
    out[:, 0, 0] = (v + u) / 2
    out[:, 1, 1] = (v - u) / 2
    out[:, 0, 1] = out[:, 1, 0] = w / 2
    return out


@dataclass(frozen=True)
class CovarianceGrid:
    """The grid of initial 2 x 2 covariances of a paper figure: the arguments of
    :func:`init_grid` (not a parameter-study grid, which is :class:`transformer_pde.sweep.Grid`)."""

    n_U: int
    n_C: int
    limits: tuple[float, float, float, float]

    def covariances(self) -> np.ndarray:
        """The grid's initial covariances, shape ``(n, 2, 2)``."""
        return init_grid(self.n_U, self.n_C, self.limits)


@dataclass(frozen=True)
class StopRule:
    r"""The paper's projected explicit Euler and its stopping rule.

    Attributes
    ----------
    step : float
        Euler step :math:`h`.
    tol_low : float
        ``converged`` when :math:`\|\Sigma'\|_F` < ``tol_low``.
    tol_high : float
        ``exceeded`` when :math:`\operatorname{tr}\Sigma` > ``tol_high``.
    max_iter : int
        At most this many steps (final time ``step * max_iter``).
    """

    step: float
    tol_low: float
    tol_high: float
    max_iter: int

    @property
    def t_max(self) -> float:
        """The last time the paper's Euler can reach, ``step * max_iter``."""
        return self.step * self.max_iter


#: the paper's variant names and the attention kind each runs
VARIANT_KINDS = {"trad": "softmax", "L2": "l2", "multihead": "softmax", "sinkhorn": "sinkhorn"}


@dataclass(frozen=True)
class PaperRun:
    """One panel of a paper figure: a kind, its heads, the figure's matrices and grid, and
    the Euler stopping rule of the paper's code.

    ``paper`` is False for the runs this library adds beside the paper's
    (:data:`EXTRA_RUNS`)."""

    figure: str
    variant: str
    heads: int
    Q: np.ndarray = field(repr=False)
    K: np.ndarray = field(repr=False)
    V: np.ndarray = field(repr=False)
    grid: CovarianceGrid
    rule: StopRule
    paper: bool = True

    @property
    def kind(self) -> str:
        """The attention kind: ``softmax``, ``l2`` or ``sinkhorn``."""
        return VARIANT_KINDS[self.variant]

    @property
    def label(self) -> str:
        """A short panel title, e.g. ``"softmax, 2 heads"``."""
        kind = {"softmax": "softmax", "l2": "L2", "sinkhorn": "Sinkhorn"}[self.kind]
        return kind + (f", {self.heads} heads" if self.heads > 1 else "")

    def attention(self) -> Any:
        """The :class:`~transformer_pde.Attention` with the paper's scalings
        (:func:`~transformer_pde.paper.paper_attention`)."""
        return paper_attention(self.kind, self.Q, self.K, self.V, heads=self.heads)

    def covariances(self) -> np.ndarray:
        """The figure's initial covariances (:func:`init_grid`)."""
        return self.grid.covariances()


@dataclass(frozen=True)
class Figure:
    """A figure of the paper: its grid, matrices and panels (in the paper's order)."""

    name: str
    grid: CovarianceGrid
    Q: np.ndarray = field(repr=False)
    K: np.ndarray = field(repr=False)
    V: np.ndarray = field(repr=False)
    runs: tuple[PaperRun, ...]

    def run(self, variant: str) -> PaperRun:
        """The panel ``variant`` (``trad``, ``L2``, ``multihead`` or ``sinkhorn``)."""
        for r in self.runs:
            if r.variant == variant:
                return r
        raise ValueError(f"figure {self.name!r} has no variant {variant!r}; it has "
                         f"{', '.join(repr(r.variant) for r in self.runs)}")


def _m(rows: list) -> np.ndarray:
    a = np.array(rows, dtype=float)
    a.setflags(write=False)
    return a


_Q_ZERO = _m([[0.45805494822409054, 0.30834960696491165],
              [0.23148704503556228, 0.2774245517561259]])
_V_ZERO = _m([[2.6693776102802937, -0.6915301722052816],
              [-0.6915301722052816, 2.6874461223198938]])
_Q_LINE = _m([[0.4063236466758838, 0.913729223649989]])
_Q_TWO = _m([[0.6764132657544725, 1.5210991859339182],
             [-0.5118762450490144, 1.150194635377595]])
_K_TWO = _m([[-0.5907168066359194, -0.7687652516461853],
             [-0.33500916605030867, 0.09299944353450965]])
_V_TWO = _m([[-0.3488944509894251, 0.9837034333517989],
             [0.5809228307171408, 0.07028444085744995]])
_Q_BLOW = _m([[-0.09678415830991538, 0.42220166048145347],
              [-0.22546156340099752, -0.6379430932117882]])
_K_BLOW = _m([[-0.01628630369574242, 1.0442167783791647],
              [-1.0848803286340662, -2.2059248271588077]])
_V_INIT = _m([[1.8317530059587854, -0.37688784393619434],
              [0.34811234158600607, -0.11628155656536983]])
_I2 = _m([[1.0, 0.0], [0.0, 1.0]])

_SMALL = CovarianceGrid(10, 10, (-0.5, 0.5, -0.5, 0.5))

#: figure -> (grid, Q, K, V, [(variant, heads, step, tol_low, tol_high, max_iter), ...])
_TABLE = {
    "zero": (_SMALL, _Q_ZERO, _m(-_Q_ZERO), _V_ZERO,
             [("trad", 1, 0.3, 1e-5, 1e3, 50_000), ("L2", 1, 0.3, 1e-5, 1e3, 50_000),
              ("multihead", 2, 0.3, 1e-5, 1e3, 50_000),
              ("sinkhorn", 1, 0.5, 1e-5, 1e3, 50_000)]),
    "line": (_SMALL, _Q_LINE, _m(-_Q_LINE), _I2,
             [("trad", 1, 0.5, 1e-4, 1e3, 50_000), ("L2", 1, 0.5, 1e-4, 1e3, 50_000)]),
    "plane": (_SMALL, _Q_LINE, _m(-_Q_LINE), _I2,
              [("multihead", 2, 0.5, 1e-4, 1e3, 50_000)]),
    "twolines": (CovarianceGrid(20, 20, (-1.0, 1.0, -1.0, 1.0)), _Q_TWO, _K_TWO, _V_TWO,
                 [("trad", 1, 0.01, 1e-7, 1e3, 50_000), ("L2", 1, 0.01, 1e-7, 1e3, 50_000)]),
    "blowup": (CovarianceGrid(40, 40, (-1.0, 1.0, -1.0, 1.0)), _Q_BLOW, _K_BLOW, _I2,
               [("trad", 1, 0.01, 1e-4, 1e3, 100_000),
                ("multihead", 2, 0.002, 1e-4, 1e3, 100_000),
                ("L2", 1, 0.001, 1e-5, 1e4, 50_000),
                ("sinkhorn", 1, 0.01, 1e-5, 1e4, 50_000)]),
    "initial": (CovarianceGrid(30, 30, (-1.0, 1.0, -1.0, 1.0)), _Q_TWO, _K_TWO, _V_INIT,
                [("trad", 1, 0.003, 1e-4, 1e3, 50_000), ("L2", 1, 0.002, 1e-4, 1e3, 50_000),
                 ("multihead", 1, 0.002, 1e-4, 1e3, 50_000)]),
}

#: the figures of the paper, in its order
FIGURE_NAMES = tuple(_TABLE)


def _build() -> dict[str, Figure]:
    figs = {}
    for name, (grid, Q, K, V, variants) in _TABLE.items():
        runs = tuple(PaperRun(name, var, heads, Q, K, V, grid, StopRule(h, lo, hi, n))
                     for var, heads, h, lo, hi, n in variants)
        figs[name] = Figure(name, grid, Q, K, V, runs)
    return figs


_FIGURES = _build()

#: runs added beside the paper's (``paper=False``): the "initial" figure with a true
#: 2-head softmax (the paper's "multihead" variant there is single-head)
EXTRA_RUNS = (PaperRun("initial", "multihead", 2, _Q_TWO, _K_TWO, _V_INIT,
                       _TABLE["initial"][0], StopRule(0.002, 1e-4, 1e3, 50_000), paper=False),)


def paper_figure(name: str) -> Figure:
    """The figure ``name`` (one of :data:`FIGURE_NAMES`: ``zero``, ``line``, ``plane``,
    ``twolines``, ``blowup``, ``initial``) with its paper panels."""
    try:
        return _FIGURES[name]
    except KeyError:
        raise ValueError(f"name must be one of {', '.join(map(repr, FIGURE_NAMES))}, "
                         f"got {name!r}") from None


def paper_run(figure: str, variant: str) -> PaperRun:
    """One panel: ``paper_run("blowup", "L2")``; ``paper_run("initial", "multihead2")`` is
    the true 2-head variant of :data:`EXTRA_RUNS`."""
    if figure == "initial" and variant == "multihead2":
        return EXTRA_RUNS[0]
    return paper_figure(figure).run(variant)


def paper_runs(extras: bool = False) -> list[PaperRun]:
    """Every panel of every figure, in the paper's order (with ``extras``, followed by
    :data:`EXTRA_RUNS`)."""
    runs = [r for name in FIGURE_NAMES for r in _FIGURES[name].runs]
    return runs + list(EXTRA_RUNS) if extras else runs
