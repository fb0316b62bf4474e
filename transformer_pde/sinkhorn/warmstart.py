r"""Warm starts of the Sinkhorn potentials along a time-dependent flow.

Along a smooth flow the Sinkhorn potentials are smooth in time, so a solve at time
:math:`t` is started from a Lagrange extrapolation of earlier potentials
(:class:`SinkhornWarmStart`): degree ``order`` (default 2) in :math:`t` through the
previous evaluations, or -- inside a fixed-step Runge--Kutta step, when the caller gives
the stage index -- the previous evaluation plus the increment of the same stage in the
previous steps, extrapolated with the degree (at most ``stage_order``, default 9) that
best predicted the latest increment.  The Anderson secant memory is carried from one
solve to the next as well.  :meth:`SinkhornWarmStart.get_state` and
:meth:`SinkhornWarmStart.from_state` turn the memory into plain data and back (for
checkpoints).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..backends import array_namespace, to_host
from .anderson import Anderson

__all__ = ["SinkhornWarmStart"]


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
#: the search costs a fixed number of array calls per evaluation (about half a
#: millisecond), which the iterations it saves repay only on larger problems
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

    **What is remembered.**  A converged solve stops at an iterate whose marginal error
    is just below the tolerance; the accelerated step after it costs no pass over the
    pairs (its image is known) and lands several times closer
    (:attr:`SinkhornResult.g_next
    <transformer_pde.sinkhorn.SinkhornResult.g_next>`).
    :func:`~transformer_pde.sinkhorn.sinkhorn_field` records that point, not the
    verified one, so the noise the Lagrange weights amplify is smaller and high degrees
    pay off.

    Parameters
    ----------
    order : int, default 2
        Extrapolation degree of the stage-less prediction (0: reuse the last potentials).
    reuse_secants : bool, default True
        Start each solve with the previous solve's Anderson memory (one memory for all
        stages).
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
        :class:`~transformer_pde.sinkhorn.Stopping`'s ``expect``."""
        return self.start_err.get(stage)

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
        costs a few array calls per evaluation.
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
        # then take CPU from the Numba passes
        err = xp.abs(xp.einsum("pk,kn->pn", xp.asarray(W, dtype=G.dtype), G[:-1])
                     - G[-1]).max(axis=1)
        err = np.asarray(to_host(err), dtype=float)
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

    def get_state(self) -> dict[str, Any]:
        """The memory as plain data: options, potentials history, per-stage increments,
        start errors and the Anderson memory (arrays on the backend, not copied; an entry
        whose two potentials are one array, as for symmetric scores, stores it once).
        :meth:`from_state` restores it exactly.

        Raises
        ------
        TypeError
            The secant memory is not an :class:`~transformer_pde.sinkhorn.Anderson`.
        """
        if self.memory is not None and not isinstance(self.memory, Anderson):
            raise TypeError(f"cannot checkpoint a Sinkhorn memory of type "
                            f"{type(self.memory).__name__}")
        return {"order": self.order, "stage_order": self.stage_order,
                "reuse_secants": self.reuse_secants,
                "hist": [_triple(e) for e in self.hist],
                "stage_inc": [[s, [_triple(e) for e in lst]] for s, lst in self.stage_inc.items()],
                "start_err": [[s, float(v)] for s, v in self.start_err.items()],
                "memory": None if self.memory is None else self.memory.get_state()}

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> SinkhornWarmStart:
        """The warm start whose :meth:`get_state` is ``data``.

        Raises
        ------
        KeyError, TypeError, ValueError
            ``data`` is not such a mapping.
        """
        ws = cls(order=data["order"], reuse_secants=data["reuse_secants"],
                 stage_order=data["stage_order"])
        ws.hist = [_untriple(e) for e in data["hist"]]
        ws.stage_inc = {int(s): [_untriple(e) for e in lst] for s, lst in data["stage_inc"]}
        ws.start_err = {None if s is None else int(s): float(v) for s, v in data["start_err"]}
        ws.memory = None if data["memory"] is None else Anderson.from_state(data["memory"])
        return ws


def _triple(entry: tuple) -> list:
    """``(t, f, g)`` as ``[t, f or None, g]``: ``None`` when ``f`` is ``g`` (one array)."""
    t, f, g = entry
    return [float(t), None if f is g else f, g]


def _untriple(entry: Any) -> tuple:
    t, f, g = entry
    return (float(t), g if f is None else f, g)
