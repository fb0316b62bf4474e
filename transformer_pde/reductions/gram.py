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

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import results_display as display
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.controller import initial_step
from ..integrate.loop import Limits, SaveAt, TimeLoop
from ..integrate.solvers import Dop853
from ..results import Status, check_warn, warn_stop
from ..validation import covariance, integer, positive, real_array
from .args import OVERFLOW_EXPONENT, check_beta, check_model, check_shift, check_times

__all__ = ["DIAGONAL_TOL", "GramFlow", "gram_field", "gram_flow", "gram_from_tokens",
           "random_gram"]

#: largest accepted :math:`|G_{ii} - 1|` of an initial Gram matrix
DIAGONAL_TOL = 1e-10


@dataclass(frozen=True, eq=False)
class GramFlow:
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

    @property
    def success(self) -> bool:
        """``status.success``."""
        return self.status.success

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("times", display.time_span(self.times)),
                ("grams", display.array_summary(self.grams)), ("message", self.message)]
        return (f"GramFlow(status='{self.status}', model={self.model!r}, "
                f"beta={display.number(self.beta)})", rows)

    def __repr__(self) -> str:
        return display.summary_text(*self._summary())

    def _repr_html_(self) -> str:
        return display.summary_html(*self._summary())


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
              atol: float = 1e-12, shift: float = 0.0, warn: bool = True) -> GramFlow:
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

    Returns
    -------
    GramFlow
        ``grams`` of shape (T, n, n) or (T, B, n, n).  A run that stops without an answer
        (step budget, non-finite step) keeps the saved matrices and issues an
        :class:`~transformer_pde.errors.EarlyStopWarning`.

    Raises
    ------
    ArgumentError
        ``G0`` not symmetric, not positive semi-definite or without a unit diagonal;
        invalid times or tolerances; a USA kernel with :math:`\beta - \mathrm{shift} > 700`
        (it overflows: pass ``shift=beta``).

    Notes
    -----
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
    G = _check_gram(G0)
    times, _ = check_times(t)
    if np.any(np.diff(times) <= 0):
        raise ArgumentError("t must be strictly increasing")
    if model == "usa" and beta - shift > OVERFLOW_EXPONENT:
        raise ArgumentError(f"beta - shift = {beta - shift:g} > {OVERFLOW_EXPONENT:g}: the "
                            "unnormalised kernel overflows float64; pass shift=beta")
    saved_t: list[float] = []
    saved: list[np.ndarray] = []

    def save(tt: float, y: np.ndarray) -> None:
        saved_t.append(tt)
        saved.append(y.copy())

    if times[0] == 0.0:
        save(0.0, G)
    status, message = Status.OK, "nothing to integrate: the only save time is 0"
    t_max = float(times[-1])
    if t_max > 0.0:
        def field(tau: float, y: np.ndarray, left: bool = False, stage: Any = None) -> np.ndarray:
            return gram_field(y, beta, model, shift)

        f0 = field(0.0, G)
        h0 = float(np.min(initial_step(G.reshape(1, -1), f0.reshape(1, -1), rtol, atol,
                                       h_max=t_max)))
        loop = TimeLoop(Dop853(rtol=rtol, atol=atol), field, t_max=t_max, dt=h0,
                        saveat=SaveAt(ts=times), limits=Limits(max_norm=2.0), tables=[],
                        xp=np, save=save)
        status, message, _ = loop.run(loop.initial_state(G))
        warn_stop(status, message, warn=warn)
    grams = np.array(saved) if saved else np.empty((0,) + G.shape)
    return GramFlow(times=np.array(saved_t), grams=grams, status=status, message=message,
                    beta=beta, model=model, shift=shift)


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
