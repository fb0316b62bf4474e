r"""The Gram-matrix flow: attention on the sphere without the ambient dimension.

With :math:`Q = K = V = I`, the post-LN flow :math:`\dot x_i = P_{x_i}A_i`,
:math:`A_i = \sum_k \mathsf A_{ik} x_k`, depends on the tokens only through their inner
products, and so does its right-hand side for :math:`G_{ij} = \langle x_i, x_j\rangle`:

.. math::
    \dot G_{ij} = \langle \dot x_i, x_j\rangle + \langle x_i, \dot x_j\rangle
               = (\mathsf A G)_{ij} + (\mathsf A G)_{ji} - (c_i + c_j) G_{ij},
    \qquad c_i = (\mathsf A G)_{ii} = \langle x_i, A_i\rangle,

with :math:`\mathsf A = \mathrm{softmax}_{\mathrm{row}}(\beta G)` (SA) or
:math:`\mathsf A = e^{\beta G - \mathrm{shift}}/n` entrywise (USA).  The state is
:math:`n \times n` whatever the dimension :math:`d` of the tokens, so a phase diagram
in :math:`d = 1024` costs what it costs in :math:`d = 8` (only the initial Gram matrices
depend on :math:`d`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import results_display as display
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.controller import initial_step
from ..integrate.loop import Limits, SaveAt, TimeLoop
from ..integrate.solvers import Dop853
from ..results import HasStatus, Status, check_warn, warn_stop
from ..validation import covariance, integer, positive, real_array
from .args import OVERFLOW_EXPONENT, check_beta, check_model, check_shift, check_times

__all__ = ["DIAGONAL_TOL", "GramFlow", "MAX_STEPS", "consensus_radius", "gram_field",
           "gram_flow", "gram_from_tokens", "random_gram"]

#: largest accepted :math:`|G_{ii} - 1|` of an initial Gram matrix
DIAGONAL_TOL = 1e-10
#: default step budget of :func:`gram_flow` (attempted DOP853 steps, all chunks together)
MAX_STEPS = 1_000_000


@dataclass(frozen=True, eq=False, repr=False)
class GramFlow(display.Summarised, HasStatus):
    r"""Gram matrices of the tokens at the saved times.

    Attributes
    ----------
    times : ndarray (T,)
        The saved times.
    grams : ndarray (T, n, n), or (T, B, n, n) for a batch
        :math:`G(t)` at each saved time.
    status : Status
        ``ok`` when the run reached the last time.
    message : str
        How the run ended.
    beta, model, shift
        The inputs.
    """

    times: np.ndarray
    grams: np.ndarray
    status: Status
    message: str
    beta: float
    model: str
    shift: float

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("times", display.time_span(self.times)),
                ("grams", display.array_summary(self.grams)), ("message", self.message)]
        return (f"GramFlow(status='{self.status}', model={self.model!r}, "
                f"beta={display.number(self.beta)})", rows)


def gram_field(G: np.ndarray, beta: float, model: str = "sa", shift: float = 0.0) -> np.ndarray:
    r"""The right-hand side :math:`\dot G = \mathsf A G + (\mathsf A G)^\top - (c\mathbf 1^\top
    + \mathbf 1 c^\top)\circ G`, :math:`c = \mathrm{diag}(\mathsf A G)`, for ``G`` of shape
    ``(..., n, n)`` (a batch of Gram matrices: one matrix product per member).

    Softmax is evaluated with the row maximum subtracted.  The result is exactly
    symmetric when ``G`` is, and its diagonal is exactly zero where :math:`G_{ii} = 1`."""
    S = beta * G
    if model == "sa":
        W = np.exp(S - S.max(axis=-1, keepdims=True))
        W /= W.sum(axis=-1, keepdims=True)
    else:
        W = np.exp(S - shift) / G.shape[-1]
    M = W @ G
    c = np.diagonal(M, axis1=-2, axis2=-1)
    return M + np.swapaxes(M, -1, -2) - (c[..., :, None] + c[..., None, :]) * G


def consensus_radius(beta: float, rtol: float, atol: float) -> float:
    r"""Largest :math:`\varepsilon = \max_{ij}|1 - G_{ij}|` from which :func:`gram_flow`
    answers later times with the consensus tail :math:`1 - G(t) = (1 - G(t_c))\,
    e^{-2\kappa(t - t_c)}`, :math:`\kappa = 1` (SA) or :math:`e^{\beta - \mathrm{shift}}`
    (USA).

    With :math:`E = J - G` (:math:`J` the all-ones matrix, :math:`E_{ii} = 0`) the flow
    reads :math:`\dot E = -2\kappa E + N(E)`, and for :math:`\beta\varepsilon \le 0.05`

    .. math::
        |N(E)_{ij}| \le \kappa K \varepsilon^2, \qquad K = 3 + 9\beta

    (SA: :math:`N_{ij} = (DE)_{ij} + (DE)_{ji} - (DE)_{ii} - (DE)_{jj} + ((WE)_{ii} +
    (WE)_{jj})E_{ij}` with :math:`D = W - J/n`, :math:`\sum_k |D_{ik}| \le
    e^{2\beta\varepsilon} - 1`; USA adds :math:`(2\kappa - r_i - r_j)E_{ij}` with the row
    sums :math:`|r_i - \kappa| \le \kappa(e^{\beta\varepsilon} - 1)`).  While
    :math:`K\varepsilon \le 1/2` the max-norm decays at least like
    :math:`e^{-3\kappa s/2}`, and Gronwall's lemma bounds the distance of the flow to the
    linear tail by :math:`K\varepsilon^2 e^{-2\kappa s}`.  The radius

    .. math::
        \varepsilon = \min\Big(\sqrt{(\mathrm{rtol} + \mathrm{atol})/K},\;
                              0.05/\beta,\; 0.5/K\Big)

    makes that distance at most :math:`\mathrm{rtol} + \mathrm{atol}`, the tolerance of
    the solver on entries of size 1."""
    K = 3.0 + 9.0 * beta
    eps = min(math.sqrt((rtol + atol) / K), 0.5 / K)
    return min(eps, 0.05 / beta) if beta > 0 else eps


def _check_gram(G0: Any) -> np.ndarray:
    """``G0`` (n, n) or (B, n, n): symmetric, positive semi-definite, unit diagonal."""
    arr = real_array("G0", G0)
    if arr.ndim not in (2, 3) or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] < 1 \
            or (arr.ndim == 3 and arr.shape[0] < 1):
        raise ArgumentError(f"G0 must have shape (n, n) or (B, n, n), got {arr.shape}")
    G = covariance("G0", arr, batch=arr.ndim == 3)
    dev = np.abs(np.diagonal(G, axis1=-2, axis2=-1) - 1.0).max()
    if dev > DIAGONAL_TOL:
        raise ArgumentError(f"G0 must have a unit diagonal (Gram matrix of unit vectors): max "
                            f"|G_ii - 1| = {dev:.3g} > {DIAGONAL_TOL:g}")
    G = G.copy()
    idx = np.arange(G.shape[-1])
    G[..., idx, idx] = 1.0
    return G


def gram_flow(G0: Any, beta: float, t: Any, *, model: str = "sa", rtol: float = 1e-10,
              atol: float = 1e-12, shift: float = 0.0, warn: bool = True, tail: bool = True,
              max_steps: int = MAX_STEPS) -> GramFlow:
    r"""Integrate the Gram-matrix flow of post-LN attention on the sphere.

    .. math::
        \dot G = \mathsf A G + (\mathsf A G)^\top - (c\mathbf 1^\top + \mathbf 1 c^\top)\circ G,
        \qquad c = \mathrm{diag}(\mathsf A G),

    :math:`\mathsf A = \mathrm{softmax}_{\mathrm{row}}(\beta G)` (``"sa"``) or
    :math:`e^{\beta G - \mathrm{shift}}/n` (``"usa"``): the exact flow of
    :math:`G = XX^\top` for tokens :math:`\dot x_i = P_{x_i}A_i` with :math:`Q = K = V = I`
    in any dimension.

    Parameters
    ----------
    G0 : array_like (n, n) or (B, n, n)
        Initial Gram matrix of unit vectors, or a batch of ``B`` of them (integrated
        together as one system: each matrix product is batched).  Symmetric and positive
        semi-definite to rounding, with :math:`|G_{ii} - 1| \le 10^{-10}` (the diagonal is
        then set to exactly 1, which the flow keeps exactly).
    beta : float
        :math:`\beta \ge 0`.
    t : float or array_like
        Strictly increasing save times :math:`\ge 0` (a time 0 saves ``G0``).
    model : {"sa", "usa"}
    rtol, atol : float
        Tolerances of the DOP853 pair (on the entries of :math:`G`).
    shift : float
        Shift of the USA exponent (time runs :math:`e^{\mathrm{shift}}` times slower);
        USA only.
    warn : bool, default True
        Issue the warning below; ``False`` leaves the status as the only report.
    tail : bool, default True
        Answer the times after consensus with the closed-form tail (Notes); ``False``
        integrates all the way (work linear in :math:`t`: for comparisons).
    max_steps : int, default 1_000_000
        Budget of attempted DOP853 steps over the whole run.

    Returns
    -------
    GramFlow
        ``grams`` of shape (T, n, n) or (T, B, n, n).  A run that stops without an answer
        (step budget, non-finite step) keeps the saved matrices and issues an
        :class:`~transformer_pde.errors.EarlyStopWarning`; its message gives the time
        it reached.

    Raises
    ------
    ArgumentError
        ``G0`` not symmetric, not positive semi-definite or without a unit diagonal;
        invalid times or tolerances; a USA kernel with :math:`\beta - \mathrm{shift} > 700`
        (it overflows: pass ``shift=beta``).

    Notes
    -----
    **Long times.**  Once the tokens have merged, an explicit solver's steps stop growing
    (the consensus attracts at rate :math:`2\kappa`, :math:`\kappa = 1` for SA and
    :math:`e^{\beta - \mathrm{shift}}` for USA, which caps stable steps near
    :math:`3/\kappa`), so the work of a direct integration grows like :math:`t`.  The run
    is therefore cut into chunks ending at :math:`2^k/\kappa`; at the end :math:`t_c` of
    a chunk where every member has :math:`\max_{ij}|1 - G_{ij}| \le
    \varepsilon` (:func:`consensus_radius`), the later times are answered with the linear
    tail :math:`1 - G(t) = (1 - G(t_c))\,e^{-2\kappa(t - t_c)}`, within
    :math:`\mathrm{rtol} + \mathrm{atol}` of the flow from :math:`G(t_c)`; the message
    says so.  A state whose field is exactly zero at the end of a chunk (a rest point,
    such as an antipodal pair) is kept at all later times; in a batch each member may end
    either way.  A run that
    neither merges nor rests spends its ``max_steps`` and stops with status
    ``max_steps``.

    The adaptive DOP853 steps of :class:`~transformer_pde.integrate.TimeLoop` control the
    error of the whole batch together (one step size for all members), so a member of a
    batch follows the same solution as its own run to within the tolerance, not bit for
    bit.

    Examples
    --------
    >>> import numpy as np
    >>> from transformer_pde.reductions.gram import gram_flow, random_gram
    >>> G0 = random_gram(6, 1024, np.random.default_rng(0))
    >>> flow = gram_flow(G0, 2.0, [0.0, 5.0])
    >>> flow.grams.shape, str(flow.status)
    ((2, 6, 6), 'ok')
    """
    beta, model = check_beta(beta), check_model(model)
    shift = check_shift(shift, model)
    rtol, atol = positive("rtol", rtol), positive("atol", atol)
    warn = check_warn(warn)
    if type(tail).__name__ not in ("bool", "bool_"):
        raise ArgumentTypeError(f"tail must be True or False, got {type(tail).__name__}")
    max_steps = integer("max_steps", max_steps, minimum=1)
    G = _check_gram(G0)
    times, _ = check_times(t)
    if np.any(np.diff(times) <= 0):
        raise ArgumentError("t must be strictly increasing")
    if model == "usa" and beta - shift > OVERFLOW_EXPONENT:
        raise ArgumentError(f"beta - shift = {beta - shift:g} > {OVERFLOW_EXPONENT:g}: the "
                            "unnormalised kernel overflows float64; pass shift=beta")
    saved_t: list[float] = []
    saved: list[np.ndarray] = []
    if times[0] == 0.0:
        saved_t.append(0.0)
        saved.append(G.copy())
    status, message = Status.OK, "nothing to integrate: the only save time is 0"
    t_max = float(times[-1])
    if t_max > 0.0:
        status, message = _integrate(G, beta, model, shift, rtol, atol, times, t_max, tail,
                                     max_steps, saved_t, saved)
        warn_stop(status, message, warn=warn)
    grams = np.array(saved) if saved else np.empty((0,) + G.shape)
    return GramFlow(times=np.array(saved_t), grams=grams, status=status, message=message,
                    beta=beta, model=model, shift=shift)


def _integrate(G: np.ndarray, beta: float, model: str, shift: float, rtol: float,
               atol: float, times: np.ndarray, t_max: float, tail: bool, max_steps: int,
               saved_t: list[float], saved: list[np.ndarray]) -> tuple[Status, str]:
    """The chunked DOP853 run of :func:`gram_flow` with its consensus tail; appends the
    states at ``times > 0`` to ``saved_t``/``saved`` and returns ``(status, message)``."""
    kappa = 1.0 if model == "sa" else math.exp(beta - shift)
    radius = consensus_radius(beta, rtol, atol)

    def field(tau: float, y: np.ndarray, left: bool = False, stage: Any = None) -> np.ndarray:
        return gram_field(y, beta, model, shift)

    y, t0, h, steps = G, 0.0, math.nan, 0
    while True:
        # chunk [t0, t1], t1 = 2^k / kappa (at most twice the work to the consensus, and
        # log2(kappa t) chunks otherwise); t - t0 is exact for t in (t0, t1] (Sterbenz)
        t1 = min(t_max, 1.0 / kappa if t0 == 0.0 else 2.0 * t0)
        length = t1 - t0
        inside = times[(times > t0) & (times <= t1)]
        offsets = {float(tt - t0): float(tt) for tt in inside}
        end_state: list[np.ndarray] = []

        def save(tau: float, state: np.ndarray, offsets: dict = offsets,
                 end_state: list = end_state, length: float = length) -> None:
            if tau in offsets:
                saved_t.append(offsets[tau])
                saved.append(state.copy())
            if tau == length:
                end_state.append(state)

        if math.isnan(h):
            f0 = field(0.0, y)
            h = float(np.min(initial_step(y.reshape(1, -1), f0.reshape(1, -1), rtol, atol,
                                          h_max=length)))
        loop = TimeLoop(Dop853(rtol=rtol, atol=atol), field, t_max=length, dt=min(h, length),
                        saveat=SaveAt(ts=sorted(set(offsets) | {length})),
                        limits=Limits(max_norm=2.0, max_steps=max(max_steps - steps, 1)),
                        tables=[], xp=np, save=save)
        status, message, st = loop.run(loop.initial_state(y))
        steps += st.n_steps
        if status != Status.OK:
            return status, (f"stopped at t={t0 + st.t:.6g} before t_max={t_max:g} after "
                            f"{steps} steps: {message} (times relative to the chunk that "
                            f"starts at t={t0:.6g})")
        y, t0, h = end_state[-1], t1, float(st.h)
        if t0 >= t_max:
            return Status.OK, f"reached t_max={t_max:g} in {steps} steps"
        # each member (one matrix or each of a batch) is done when its field is exactly
        # zero (a rest point: kept) or it is within the consensus radius (the tail)
        n = y.shape[-1]
        members = y.reshape(-1, n, n)
        gap = 1.0 - members
        eps = np.abs(gap).reshape(len(members), -1).max(axis=1)
        merged = eps <= radius if tail else np.zeros(len(members), dtype=bool)
        rest = ~np.any(field(t0, members).reshape(len(members), -1), axis=1) & ~merged
        if np.all(rest | merged):
            for tt in times[times > t0]:
                decay = math.exp(-2.0 * kappa * (float(tt) - t0))
                later = np.where(rest[:, None, None], members, 1.0 - gap * decay)
                saved_t.append(float(tt))
                saved.append(later.reshape(y.shape))
            parts = []
            if np.any(rest):
                parts.append(f"{int(rest.sum())} of {len(members)} at a rest point (zero "
                             "field: kept)")
            if np.any(merged):
                parts.append(f"{int(merged.sum())} of {len(members)} with max|1 - G| = "
                             f"{float(eps[merged].max()):.3g} <= {radius:.3g}, then the "
                             f"consensus tail 1 - G(t) = (1 - G({t0:.6g})) "
                             f"exp(-{2.0 * kappa:.6g} (t - {t0:.6g})) (within rtol + atol "
                             "of the flow)")
            return Status.OK, (f"reached t_max={t_max:g}: {steps} steps to t={t0:.6g}; "
                               + "; ".join(parts))


def gram_from_tokens(X: Any) -> np.ndarray:
    r"""The Gram matrix :math:`G_{ij} = \langle x_i/|x_i|, x_j/|x_j|\rangle` of the
    normalised tokens.

    Parameters
    ----------
    X : array_like (n, d) or (B, n, d)
        Tokens (rows), or a batch of token sets; no row may be zero.

    Returns
    -------
    ndarray (n, n) or (B, n, n)
        Exactly symmetric, with an exactly unit diagonal.
    """
    arr = real_array("X", X)
    if arr.ndim not in (2, 3) or arr.shape[-1] < 1 or arr.shape[-2] < 1:
        raise ArgumentError(f"X must have shape (n, d) or (B, n, d), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError("X contains NaN or inf")
    norms = np.linalg.norm(arr, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise ArgumentError("X has a zero row: a token must have a direction")
    U = arr / norms
    G = U @ np.swapaxes(U, -1, -2)
    G = 0.5 * (G + np.swapaxes(G, -1, -2))
    idx = np.arange(G.shape[-1])
    G[..., idx, idx] = 1.0
    return G


def random_gram(n: int, d: int, rng: Any = None, batch: int | None = None) -> np.ndarray:
    r"""Gram matrix of :math:`n` independent uniform points on :math:`S^{d-1}` (normalised
    standard Gaussian vectors of :math:`\mathbb R^d`), or a batch of them.

    Parameters
    ----------
    n, d : int
        Number of tokens and dimension (both :math:`\ge 1`).
    rng : numpy.random.Generator or int or None
        Random source (an int seeds :func:`numpy.random.default_rng`).
    batch : int, optional
        Number ``B`` of independent matrices: the result is then (B, n, n).

    Returns
    -------
    ndarray (n, n) or (B, n, n)
        See :func:`gram_from_tokens`.
    """
    n = integer("n", n, minimum=1)
    d = integer("d", d, minimum=1)
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise ArgumentTypeError(f"rng must be a numpy.random.Generator, an int seed or None, "
                                f"got {type(rng).__name__}")
    shape = (n, d) if batch is None else (integer("batch", batch, minimum=1), n, d)
    return gram_from_tokens(rng.standard_normal(shape))
