r"""The field evaluator: :class:`FieldEvaluator` (an attention bound to a token set, its
key order and ranges, weights and warm starts) and :func:`velocity` (one evaluation)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import validation
from ..attention import Attention, AttentionParams
from ..attention.alibi import require_alibi_positions
from ..attention.matrix import float_dtype
from ..attention.rotary import require_positions
from ..attention.visibility import (query_ranges, segment_sizes, segment_weights,
                                    token_visibility)
from ..backends import DEFAULT_BACKEND, array_namespace, get_backend, to_host
from ..backends.ranges import KeyRanges
from ..errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from ..sinkhorn import SinkhornRecord, SinkhornWarmStart
from ..sinkhorn.options import DEFAULT_MAX_ITER, DEFAULT_TOL
from ..validation import type_name as _what
from .alibi import AlibiRanges
from .harmonic import DEFAULT_HARMONIC_TOL, METHODS, HarmonicField, isotropic_sign
from .kinds import BUILTIN_FIELDS, HEAD_FIELDS, FieldContext

__all__ = ["FieldEvaluator", "velocity"]


class FieldEvaluator:
    r"""Evaluate :math:`\Gamma_{\mu}` repeatedly for a fixed attention, weights and positions.

    Token positions never move, so the keys are put in kernel order once (for masked or
    ALiBi attention sorted by position inside each segment) and every token gets its range
    of visible keys (:mod:`~transformer_pde.attention.visibility`,
    :class:`~transformer_pde.backends.ranges.KeyRanges`).  Sinkhorn
    potentials are kept between calls (warm start) in ``state``; every Sinkhorn solve is
    recorded (:attr:`info`).

    Parameters
    ----------
    att : Attention
    n_tokens : int
    weights, positions : array_like, optional
        Token weights (normalised to sum 1 in each segment; uniform by default) and
        positions in [0, 1] (required when ``att.masked``, ``att.rotary`` or ``att.alibi``).
    segments : sequence of int, optional
        Sizes :math:`n_1, \dots, n_B` (each >= 1, summing to ``n_tokens``) of consecutive
        groups of tokens that never see each other: packed sequences, or an ensemble of
        :math:`B` systems.  Each segment is its own measure
        :math:`\mu_b = \sum_{j \in b} w_j \delta_{x_j}` (:math:`\sum_{j\in b} w_j = 1`) and
        its tokens move by :math:`\Gamma_{\mu_b}`, exactly the field of the segment
        evaluated alone; masks and windows apply inside each segment.  ``None``: one
        segment.
    backend : str or backend object, default "auto"
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Stopping rule of the inner Sinkhorn solve (log-domain marginal error).
    dtype : {numpy.float64, numpy.float32}
        Floating type of the backend arrays.
    method : {"direct", "harmonic"}, default "direct"
        ``"harmonic"``: the exact harmonic expansion of isotropic attention on the circle or
        :math:`S^2` (:mod:`~transformer_pde.fields.harmonic`), :math:`O(NK)` instead of
        :math:`O(N^2)`; tokens and queries are used through their radial projections.
        Other attentions raise :class:`~transformer_pde.errors.ArgumentError`.
    harmonic_tol : float, default 1e-13
        Bound on the error of every harmonic answer (relative to the field's local scale;
        queries the expansion cannot serve to it are evaluated by the direct sum and
        counted in :attr:`info`).
    check_finite : bool, default False
        Raise :class:`~transformer_pde.errors.ScoreOverflowError` (naming the kind, the
        head, ``beta`` and the dtype) when the field of the tokens is not finite, instead
        of returning it.  :func:`velocity` sets it.  :func:`~transformer_pde.simulate`
        leaves it off: its time loop checks every step and stops with status
        ``nonfinite`` (or shrinks an adaptive step), an explicit outcome of its own.

    Attributes
    ----------
    be : backend object
        The backend, resolved once (pass it on rather than resolving ``backend`` again).
    weights : ndarray (N,)
        The token weights as used: normalised in each segment.
    positions : ndarray (N,) or None
    sizes : ndarray of int64 or None
        The checked ``segments`` (``None`` without).
    perm : ndarray or None
        Kernel order of the keys: key :math:`j` is token ``perm[j]`` (``None``: as given).

    Every head field receives the heads of :attr:`AttentionParams.score_heads
    <transformer_pde.attention.AttentionParams.score_heads>`: query and key biases that
    cancel for the kind are removed exactly before any score is formed.
    """

    def __init__(self, att: Attention, n_tokens: int, *, weights: Any = None,
                 positions: Any = None, segments: Any = None, backend: Any = DEFAULT_BACKEND,
                 dtype: Any = np.float64, sinkhorn_tol: float = DEFAULT_TOL,
                 sinkhorn_max_iter: int = DEFAULT_MAX_ITER, check_finite: bool = False,
                 method: str = "direct", harmonic_tol: float = DEFAULT_HARMONIC_TOL):
        if not isinstance(att, Attention):
            raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got "
                                    f"{_what(att)}")
        sinkhorn_tol = validation.positive("sinkhorn_tol", sinkhorn_tol)
        sinkhorn_max_iter = validation.integer("sinkhorn_max_iter", sinkhorn_max_iter, minimum=1)
        if not isinstance(check_finite, (bool, np.bool_)):
            raise ArgumentTypeError(f"check_finite must be a bool, got {check_finite!r:.60}")
        self.method = validation.choice("method", method, METHODS)
        harmonic_tol = validation.positive("harmonic_tol", harmonic_tol)
        if self.method == "harmonic":
            isotropic_sign(att)      # before the checks of positions, masks, rotary
            if att.alibi is not None:   # ALiBi weighs keys by position: not isotropic
                raise ArgumentError("field: method='harmonic' evaluates isotropic attention "
                                    "only; att.alibi is set (ALiBi slopes weigh the keys by "
                                    "their positions)")
        self.att = att
        self.n = validation.integer("n_tokens", n_tokens, minimum=1)
        self.dtype = float_dtype(dtype)
        self.check_finite = bool(check_finite)
        self.be = get_backend(backend, n_tokens=self.n)
        self.sizes = segment_sizes(segments, self.n)
        self.weights = segment_weights(weights, self.n, self.sizes)
        require_positions(att.rotary, positions)
        if att.rotary is not None and att.kind not in BUILTIN_FIELDS:
            raise ArgumentError(f"rotary: the head field registered for kind {att.kind!r} does "
                                "not rotate queries and keys (built-in kinds only)")
        require_alibi_positions(att.alibi, positions)
        self.positions = validation.positions("positions", positions, self.n, required=att.masked)
        self._rot_tables: dict[int, tuple] = {}
        be = self.be
        vis = token_visibility(self.positions, self.sizes, masked=att.masked,
                               window=att.window, alibi=att.alibi is not None)
        self.perm, self.sorted_pos = vis.perm, vis.sorted_pos
        self._perm_be = None if vis.perm is None else be.asarray(vis.perm)
        self._ranges = None if vis.lo is None else KeyRanges(vis.lo, vis.hi, self.n)
        w_sorted = self.weights if vis.perm is None else self.weights[vis.perm]
        with np.errstate(divide="ignore"):
            logw = np.log(w_sorted)
        self.ctx = FieldContext(be, be.asarray(w_sorted, self.dtype), be.asarray(logw, self.dtype),
                                self._ranges, float(sinkhorn_tol), int(sinkhorn_max_iter),
                                segments=vis.bounds)
        self._alibi = None          # the tokens' ALiBi ranges (keys before / after each)
        if att.alibi is not None:
            split = vis.hi if vis.split is None else vis.split
            after = None if vis.split is None else KeyRanges(vis.split, vis.end, self.n)
            self._alibi = AlibiRanges(be.asarray(vis.sorted_pos, self.dtype),
                                      be.asarray(self.positions, self.dtype),
                                      KeyRanges(vis.lo, split, self.n), after)
        self._harmonic = None
        if self.method == "harmonic":
            if self.dtype != np.float64:
                raise ArgumentError("dtype: method='harmonic' runs in float64")
            self._harmonic = HarmonicField(att, self.n, w_sorted, vis.bounds, be, harmonic_tol)

    @property
    def info(self) -> dict[str, list]:
        """The Sinkhorn solves so far, one entry per head and evaluation:
        ``{"sinkhorn_iterations", "sinkhorn_times", "sinkhorn_stages"}`` (a copy of
        :meth:`SinkhornRecord.as_info <transformer_pde.sinkhorn.SinkhornRecord.as_info>`;
        ``{}`` before any, and for every other kind); with ``method="harmonic"`` also
        :attr:`HarmonicField.info <transformer_pde.fields.harmonic.HarmonicField>`
        (``harmonic_modes``, ``harmonic_evaluations``, ``harmonic_direct_queries``)."""
        info = self.ctx.sinkhorn.as_info()
        if self._harmonic is not None:
            info.update(self._harmonic.get_info())
        return info

    @property
    def state(self) -> dict:
        return self.ctx.state

    @property
    def stage(self) -> int | None:
        """Index of the next evaluation within a fixed-step solver step, or ``None``.

        Set by :func:`~transformer_pde.simulate` before each evaluation (0 for the first
        stage of every step): Sinkhorn warm starts then extrapolate each stage from the
        same stage of the previous steps
        (:class:`~transformer_pde.sinkhorn.SinkhornWarmStart`)."""
        return self.ctx.stage

    @stage.setter
    def stage(self, value: int | None) -> None:
        self.ctx.stage = None if value is None else int(value)

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """The warm-start memory and the counters, as plain versioned data.

        Returns ``{"version": 1, "warm_starts": [...], "info": {...}}``: one entry per
        Sinkhorn head (and segment), ``{"head": h, **SinkhornWarmStart.get_state()}``
        (``"segment": b`` added with segments) (options,
        potentials history, per-stage increments, start errors and Anderson secant memory;
        see :meth:`~transformer_pde.sinkhorn.SinkhornWarmStart.get_state`), and
        :attr:`info` (the record of the Sinkhorn solves).  :meth:`set_state` restores it
        exactly.
        """
        warm = []
        for key, ws in self.state.items():
            if not (isinstance(key, tuple) and len(key) in (2, 3) and key[0] == "sinkhorn"
                    and isinstance(ws, SinkhornWarmStart)):
                raise TypeError(f"cannot checkpoint the field state entry {key!r} "
                                f"({type(ws).__name__})")
            seg = {} if len(key) == 2 else {"segment": int(key[2])}
            warm.append({"head": int(key[1]), **seg, **ws.get_state()})
        return {"version": self.STATE_VERSION, "warm_starts": warm, "info": self.info}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s data (replacing the warm starts and the record).

        Raises
        ------
        ValueError
            Data of another version or of another shape (the message names the entry).
        """
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION \
                or set(state) != {"version", "warm_starts", "info"}:
            raise ValueError(f"field evaluator state {str(state)[:80]} is not of version "
                             f"{self.STATE_VERSION}")
        new: dict = {}
        for w in state["warm_starts"]:
            try:
                key = ("sinkhorn", int(w["head"])) + \
                    (() if "segment" not in w else (int(w["segment"]),))
                new[key] = SinkhornWarmStart.from_state(w)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"field evaluator state: bad warm start entry ({exc!r})") from None
        if not isinstance(state["info"], dict):
            raise ValueError("field evaluator state: 'info' is not a mapping")
        info = {k: v for k, v in state["info"].items() if not k.startswith("harmonic_")}
        if self._harmonic is not None:
            self._harmonic.set_info(state["info"])
        try:
            record = SinkhornRecord.from_info(info)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"field evaluator state: bad 'info' ({exc})") from None
        self.state.clear()
        self.state.update(new)
        self.ctx.sinkhorn = record

    def query_limits(self, query_positions: Any, m: int) -> KeyRanges:
        """The key ranges of ``m`` queries at ``query_positions`` (masked attention): the
        keys at or before each query's position (the last ``window`` of them)."""
        if self.ctx.segments is not None:
            raise ArgumentError("query_positions: queries are not defined for a token set in "
                                "segments (see __call__)")
        qp = validation.positions("query_positions", query_positions, m, required=True)
        lo, hi = query_ranges(self.sorted_pos, qp, self.att.window)
        return KeyRanges(lo, hi, self.n, "query_limits")

    def _alibi_ranges(self, queries: Any, query_positions: Any) -> AlibiRanges | None:
        """The ALiBi ranges of the tokens, or of ``queries`` at ``query_positions``."""
        if self._alibi is None or queries is None:
            return self._alibi
        if query_positions is None:
            raise ArgumentError("ALiBi attention (Attention(alibi=...)) evaluated at queries "
                                "needs query_positions: their positions in [0, 1]")
        qp = validation.positions("query_positions", query_positions, queries.shape[0],
                                  required=True)
        lo, hi = query_ranges(self.sorted_pos, qp, self.att.window)
        after = None if self.att.masked else \
            KeyRanges(hi, np.full_like(hi, self.n), self.n, "query_limits")
        return AlibiRanges(self._alibi.key_pos, self.be.asarray(qp, self.dtype),
                           KeyRanges(lo, hi, self.n, "query_limits"), after)

    def _rotary(self, P: AttentionParams, queries: Any, query_positions: Any) -> tuple:
        """The rotary tables (queries, keys in kernel order) of ``P``, or ``(None, None)``."""
        if P.rotary is None:
            return None, None
        m = P.heads[0].Q.shape[0]
        if m not in self._rot_tables:
            keys = self.positions if self.perm is None else self.sorted_pos
            self._rot_tables[m] = tuple(P.rotary.table(p, m, self.be.xp, self.dtype)
                                        for p in (self.positions, keys))
        rq, rk = self._rot_tables[m]
        if queries is not None:
            if query_positions is None:
                raise ArgumentError("rotary attention (Attention(rotary=...)) evaluated at "
                                    "queries needs query_positions: their positions in [0, 1]")
            qp = validation.positions("query_positions", query_positions, queries.shape[0],
                                      required=True)
            rq = P.rotary.table(qp, m, self.be.xp, self.dtype)
        return rq, rk

    def __call__(self, t: float, X: Any, queries: Any = None, query_limits: Any = None,
                 *, left: bool = False, query_positions: Any = None) -> Any:
        """Field of the measure with tokens ``X`` (backend array, (N, d)) at ``X`` or ``queries``.

        ``left=True`` evaluates piecewise-constant (:class:`~transformer_pde.Layers`)
        parameters by their left limit at a layer boundary (see :meth:`Attention.at`).
        ``query_limits`` (:meth:`query_limits`) are the key ranges of ``queries`` for
        masked attention; ``query_positions`` their positions, required with rotary.
        Queries are not defined with ``segments`` (which segment's measure would they
        see?): evaluate each segment's measure with its own evaluator."""
        P = self.att.at(t, left=left)
        ctx = self.ctx
        if queries is not None and ctx.segments is not None:
            raise ArgumentError("queries: a field evaluator with segments evaluates each "
                                "segment's field at its own tokens only; evaluate one segment "
                                "alone (an evaluator without segments) at queries")
        if self._harmonic is not None:   # isotropic: one head, no W_O or biases
            out = self._harmonic(P, X, queries)
            if self.check_finite:
                self._check(out, P, 0)
            return out
        Xk = X if self._perm_be is None else X[self._perm_be]
        Xq, ranges = (X, self._ranges) if queries is None else (queries, query_limits)
        rot = self._rotary(P, queries, query_positions)
        saved = ctx.ranges, ctx.rot_q, ctx.rot_k, ctx.alibi
        ctx.ranges, (ctx.rot_q, ctx.rot_k) = ranges, rot
        ctx.alibi = self._alibi_ranges(queries, query_positions)
        check = self._check if self.check_finite else None
        try:
            fn = HEAD_FIELDS[P.kind]
            heads = P.score_heads
            if P.n_heads == 1:
                out = fn(ctx, P, 0, heads[0], Xq, Xk)
                if check is not None:
                    check(out, P, 0)
            else:
                xp = self.be.xp
                out = xp.zeros(Xq.shape, dtype=Xq.dtype)
                for h, head in enumerate(heads):
                    out[:, head.rows] = part = fn(ctx, P, h, head, Xq, Xk)
                    if check is not None:
                        check(part, P, h)
        finally:
            ctx.ranges, ctx.rot_q, ctx.rot_k, ctx.alibi = saved
        if P.W_O is not None:
            out = out @ self.be.asarray(P.W_O.T, out.dtype)
        if P.b_O is not None:
            out = out + self.be.asarray(P.b_O, out.dtype)
        if check is not None and (P.W_O is not None or P.b_O is not None):
            check(out, P, None)
        return out

    def _check(self, out: Any, P: AttentionParams, h: int | None) -> None:
        """Raise :class:`ScoreOverflowError` if ``out`` (head ``h``'s output, or the whole
        field after ``W_O`` / ``b_O`` when ``h`` is None) holds NaN or inf."""
        xp = self.be.xp
        if bool(xp.all(xp.isfinite(out))):
            return
        raise ScoreOverflowError(P.overflow_message(h, np.dtype(out.dtype)))


def velocity(att: Attention, X: Any, *, weights: Any = None, positions: Any = None,
             segments: Any = None, queries: Any = None, query_positions: Any = None,
             t: float = 0.0, backend: Any = DEFAULT_BACKEND, sinkhorn_tol: float = DEFAULT_TOL,
             sinkhorn_max_iter: int = DEFAULT_MAX_ITER, method: str = "direct",
             harmonic_tol: float = DEFAULT_HARMONIC_TOL) -> Any:
    r"""Attention velocity field :math:`\Gamma_{\mu}` of :math:`\mu = \sum_j w_j \delta_{X_j}`.

    Evaluates, at each row of ``X`` (or of ``queries``),

    .. math:: \Gamma_\mu(x) = W_O\,\mathrm{concat}_h\Big( V_h \sum_j P^h_j(x)\, X_j \Big)

    (with bias vectors, :math:`\sum_j P^h_j(x)(V_h X_j + b_{V,h})` and :math:`+\,b_O`; the
    scores use :math:`Q_h x + b_{Q,h}` and :math:`K_h X_j + b_{K,h}`)

    with :math:`P^h_j(x)` the attention weights of kind ``att.kind`` (softmax:
    :math:`w_j e^{\beta\langle Q_h x, K_h X_j\rangle}/\sum_l w_l e^{\beta\langle Q_h x, K_h X_l\rangle}`,
    etc.; see :class:`~transformer_pde.Attention`).  Normalised kinds are computed with a
    running maximum (log-sum-exp), so logits of any size give finite, correct output.

    Parameters
    ----------
    att : Attention
    X : array (N, d)
        Token positions in feature space.
    weights : array (N,), optional
        Non-negative masses (normalised to sum 1, in each segment; uniform by default).
    positions : array (N,), optional
        Token positions :math:`s_j \in [0,1]`; required for masked attention, where a
        query at position :math:`s` sees tokens with :math:`s_j \le s`, for rotary
        attention (``Attention(rotary=...)``), which rotates queries and keys by them, and
        for ALiBi (``Attention(alibi=...)``), whose scores lose
        :math:`\lambda_h |s_i - s_j|`.
    segments : sequence of int, optional
        Sizes of consecutive groups of tokens, each its own measure (weights normalised
        per group; see :class:`FieldEvaluator`): every token moves by the field of its
        own group, exactly as if the groups were evaluated one by one.  Not with
        ``queries``.
    queries : array (M, d), optional
        Evaluate the field of the same measure at these points instead of at ``X``.
    query_positions : array (M,), optional
        Positions of ``queries`` (masked, rotary or ALiBi attention).
    t : float
        Time (depth) at which time-dependent parameters are evaluated.
    backend : {"auto", "numpy", "numba", "cupy"} or a backend object
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Inner-solve controls for ``kind="sinkhorn"``.
    method : {"direct", "harmonic"}, default "direct"
        ``"harmonic"``: the exact expansion of isotropic attention on the unit circle or
        sphere (:mod:`~transformer_pde.fields.harmonic`); ``X`` and ``queries`` must lie
        on the unit sphere (:math:`||x| - 1| \le 10^{-6}`).
    harmonic_tol : float, default 1e-13
        The harmonic field's per-query error bound.

    Returns
    -------
    ndarray (N, d) or (M, d)
        Same floating dtype as ``X`` (float32 stays float32).

    Raises
    ------
    ArgumentTypeError
        An argument of the wrong type (not an :class:`Attention`, complex or non-numeric
        arrays, a bool or a string where a number is expected).
    ArgumentError
        Wrong shapes, NaN/inf, negative weights, masked attention without positions,
        ``segments`` not summing to N, with ``queries`` or with a segment of zero weight.
    SinkhornNotConverged
        The Sinkhorn inner solve missed its tolerance.
    ScoreOverflowError
        The field of the finite tokens is beyond the float range: ``kind="exp"`` with
        :math:`\beta\,\langle Qx, Ky\rangle - c` above about 709 (88 in float32;
        ``shift`` :math:`= c` of :class:`~transformer_pde.Attention` removes it), the other
        unnormalised kinds with scores times values beyond the range, or ``kind="l2"``
        with projected tokens spread so far apart that :math:`|Qx - Ky|^2` overflows.
        (Scores beyond the float range are otherwise handled exactly by the normalised
        kinds: the softmax then puts all the mass on the largest score.)

    Notes
    -----
    The result is always finite: a field that is not finite for the finite tokens
    given raises :class:`~transformer_pde.errors.ScoreOverflowError` instead of being
    returned (its message names the kind, ``beta``, the head and the dtype).  Query and
    key biases that cancel for the kind (``b_K`` for softmax, both for sinkhorn, all but
    :math:`b_Q - b_K` for l2; see
    :attr:`Kind.bias_rule <transformer_pde.attention.Kind.bias_rule>`) are removed exactly
    before the scores are formed, so a huge cancelling bias does not spoil the field.
    """
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got {_what(att)}")
    t = validation.scalar("t", t)
    try:
        n_tokens = len(X)
    except TypeError:
        n_tokens = None
    be = get_backend(backend, n_tokens=n_tokens)
    Xn = validation.points("X", X if isinstance(X, (list, tuple)) else to_host(X), att.d)
    dtype = Xn.dtype if Xn.dtype in (np.float32, np.float64) else np.float64
    if segments is not None and queries is not None:
        raise ArgumentError("segments: the field of a token set in segments is defined at its "
                            "own tokens only, not at queries; call velocity once per segment")
    ev = FieldEvaluator(att, Xn.shape[0], weights=weights, positions=positions,
                        segments=segments, backend=be, dtype=dtype, sinkhorn_tol=sinkhorn_tol,
                        sinkhorn_max_iter=sinkhorn_max_iter, check_finite=True,
                        method=method, harmonic_tol=harmonic_tol)
    if ev.method == "harmonic":
        _on_sphere("X", Xn)
    Xb = be.asarray(Xn, dtype)
    Qb = None
    qlim = None
    if queries is not None:
        Qn = validation.points("queries", queries if isinstance(queries, (list, tuple))
                               else to_host(queries), att.d)
        Qb = be.asarray(Qn, dtype)
        if ev.method == "harmonic":
            _on_sphere("queries", Qn)
        if att.masked:
            qlim = ev.query_limits(query_positions, Qn.shape[0])
        else:   # used by rotary and ALiBi only, but always checked like positions
            validation.positions("query_positions", query_positions, Qn.shape[0])
    elif query_positions is not None:
        raise ArgumentError("query_positions given without queries")
    with np.errstate(over="ignore", invalid="ignore"):
        out = ev(float(t), Xb, Qb, qlim, query_positions=query_positions)
    return to_host(out) if array_namespace(X) is np else out   # X's namespace


def _on_sphere(name: str, X: np.ndarray) -> None:
    """Refuse rows of ``X`` off the unit sphere by more than 1e-6 (harmonic method)."""
    dev = np.abs(np.sqrt((X * X).sum(axis=1)) - 1.0)
    if dev.size and not dev.max() <= 1e-6:
        i = int(np.argmax(dev))
        raise ArgumentError(f"{name}: method='harmonic' evaluates tokens on the unit sphere; "
                            f"row {i} has norm {1.0 + dev[i]:.9g} (| |x| - 1 | > 1e-6)")
