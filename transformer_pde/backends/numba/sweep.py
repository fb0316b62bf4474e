r"""The fused Sinkhorn sweep: one pass over the pairs for a whole Sinkhorn iteration.

One iteration of alternating Sinkhorn for the self-coupling of
:math:`\mu = \sum_j w_j\delta_{x_j}` with scores :math:`s_{ij} = q_i\cdot k_j` is

.. math:: f_i = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + s_{ij})/\varepsilon\big),\qquad
          g'_j = -\varepsilon\,\mathrm{LSE}_i\big(\log w_i + (f_i + s_{ij})/\varepsilon\big),

two passes over the :math:`N^2` pairs with one exponential each.  But the second needs
no new exponential: with the row softmax :math:`P_{ij} = w_j e^{(f_i + g_j + s_{ij})/\varepsilon}`
(rows sum to one), :math:`e^{(f_i + s_{ij})/\varepsilon} = P_{ij} e^{-g_j/\varepsilon}/w_j`, so

.. math:: g'_j = g_j - \varepsilon \log\frac{c_j}{w_j},\qquad c_j = \sum_i w_i P_{ij},

the column sums of the plan :math:`\pi_{ij} = w_i P_{ij}` of :math:`(f, g)`, whose
log-ratio :math:`\max_j|\log(c_j/w_j)| = \|g' - g\|_\infty/\varepsilon` is also the
stopping quantity.  :func:`fused_sweep` computes, in one pass, each row's logits, its
log-sum-exp (hence :math:`f_i`), its softmax average of the values (the attention
field) and adds :math:`w_i P_{ij}` to per-thread column accumulators: one exponential
per pair instead of two (the whole iteration for 1.12 softmax passes against 1.9 for
the two passes, N = 1e4, d = 2).  The rows are split into :data:`CHUNKS` fixed
chunks with their own column sums, added in order at the end: the same bits on any
number of threads.

The row is held in a per-thread buffer of :math:`N` numbers (its exponentials) between
its log-sum-exp and its column update; four rows are added to the column sums at a time.
Column sums are float64 whatever the input precision.

For at most four score and four value coordinates (Sinkhorn attention's usual sizes)
and at least :data:`ONE_PASS_MIN_PAIRS` pairs, a row is one loop over the keys: logits,
exponentials, their sum and the value sums together, the exponentials taken against the Cauchy--Schwarz bound
:math:`\max_j b_j + |q_i|\max_j|k_j|` of the row's logits rather than their maximum (which
would need a pass of its own); a row whose bound is so far above its largest logit that
its sum falls below ``_TINY_SUM`` is redone against the maximum.  Measured at N = 1e4,
d = 2: 1.12 softmax passes for a sweep with values (1.40 with the general rows), 0.99
without (1.20).

Where a column's sum is not a normal positive number (a column that receives almost no
mass: far from the solution, e.g. a cold start at small :math:`\varepsilon`) the
relation loses its accuracy; callers then take that iteration's column update from the
log-domain ``lse`` pass instead (the Sinkhorn solver does).

:func:`fused_sweep` is the Python driver; the backend exposes it as
:meth:`~transformer_pde.backends.numba.NumbaBackend.sinkhorn_sweep`, the optional
backend method of that name (see :mod:`transformer_pde.backends`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

from ..ranges import KeyRanges

from .intrinsics import FM_KERNEL, vexp
from .streaming import lse_finish, lse_step, lse_totals

__all__ = ["CHUNKS", "ONE_PASS_MIN_PAIRS", "ROWS", "fused_sweep"]

#: rows added to the column sums at a time (one load/store of a column sum per ROWS rows)
ROWS = 4
#: fewest pairs (rows x columns) for the one-pass rows (:func:`_sweep_kernel`)
ONE_PASS_MIN_PAIRS = 2**18
#: row chunks, each with its own column sums (summed in order at the end): a fixed number,
#: so the result does not depend on the number of threads; memory CHUNKS * N floats
CHUNKS = 8

#: smallest row sum of the shifted pass that is kept: below it the shift is so far above
#: the row's largest logit that terms which matter could have underflowed (float64: a gap
#: of at most 460 nats against exp's range of 708; float32: 27 against 87)
_TINY_SUM = {np.dtype(np.float64): 1e-200, np.dtype(np.float32): 1e-12}


@njit(fastmath=FM_KERNEL, cache=True)
def _row(q, i, kT, vT, bias, lo, hi, b, t, m_run, s_run, acc, out, lse):
    """Logits of row ``i`` over its keys ``[lo, hi)`` into ``b[lo:hi]``, then
    ``b[lo:hi] = exp(logits - max)`` (one block of
    :func:`~transformer_pde.backends.numba.streaming.lse_step`, as row ``t`` of the
    group's running totals); writes ``out[i]`` and ``lse[i]`` and returns the row sum of
    ``b``."""
    r = q.shape[1]
    c = vT.shape[0]
    x = b[lo:hi]
    bb = bias[lo:hi]
    for j in range(hi - lo):
        x[j] = bb[j]
    for a in range(r):
        qa = q[i, a]
        ka = kT[a, lo:hi]
        for j in range(hi - lo):
            x[j] += qa * ka[j]
    mx = x[0]
    for j in range(1, hi - lo):
        mx = max(mx, x[j])
    s_run[t] = 0.0
    lse_step(x, hi - lo, mx, m_run, s_run, acc, t, True, 0.0)
    at = acc[t]
    for cc in range(c):
        vc = vT[cc, lo:hi]
        tc = 0.0
        for j in range(hi - lo):
            tc += x[j] * vc[j]
        at[cc] = tc
    lse_finish(t, i, m_run, s_run, acc, out, lse)
    return s_run[t]


@njit(fastmath=FM_KERNEL, cache=True)
def _add_columns(col, buf, coef, nt, a, e):
    """``col[a:e] += sum_t coef[t] * buf[t, a:e]`` over the ``nt`` rows of a group (four
    at a time: one load and store of the column sums per group)."""
    cs = col[a:e]
    if nt == ROWS:
        b0, b1, b2, b3 = buf[0, a:e], buf[1, a:e], buf[2, a:e], buf[3, a:e]
        c0, c1, c2, c3 = coef[0], coef[1], coef[2], coef[3]
        for j in range(e - a):
            cs[j] += (c0 * b0[j] + c1 * b1[j]) + (c2 * b2[j] + c3 * b3[j])
    else:
        for t in range(nt):
            bt = buf[t, a:e]
            ct = coef[t]
            for j in range(e - a):
                cs[j] += ct * bt[j]


@njit(fastmath=FM_KERNEL, cache=True)
def _row_shifted(q, i, kT, vT, nv, bias, shift, lo, hi, b):
    """One pass over row ``i``'s keys ``[lo, hi)`` for at most four score and four value
    coordinates (``kT``, ``vT`` zero-padded to four rows): ``b[lo:hi] = exp(logits -
    shift)`` and its sum and value sums ``(s, t0, t1, t2, t3)`` (values only when
    ``nv``)."""
    q0, q1, q2, q3 = q[i, 0], q[i, 1], q[i, 2], q[i, 3]
    k0, k1, k2, k3 = kT[0, lo:hi], kT[1, lo:hi], kT[2, lo:hi], kT[3, lo:hi]
    x = b[lo:hi]
    bb = bias[lo:hi]
    s = 0.0
    t0 = t1 = t2 = t3 = 0.0
    if nv:
        v0, v1, v2, v3 = vT[0, lo:hi], vT[1, lo:hi], vT[2, lo:hi], vT[3, lo:hi]
        for j in range(hi - lo):
            p = vexp((bb[j] + (q0 * k0[j] + q1 * k1[j]) + (q2 * k2[j] + q3 * k3[j])) - shift)
            x[j] = p
            s += p
            t0 += p * v0[j]
            t1 += p * v1[j]
            t2 += p * v2[j]
            t3 += p * v3[j]
    else:
        for j in range(hi - lo):
            p = vexp((bb[j] + (q0 * k0[j] + q1 * k1[j]) + (q2 * k2[j] + q3 * k3[j])) - shift)
            x[j] = p
            s += p
    return s, t0, t1, t2, t3


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def _sweep_kernel(q, kT, vT, bias, w, lo, hi, n_chunks, out, lse, colacc, one_pass, q4, k4,
                  v4, shift, tiny):
    """Rows in :data:`CHUNKS` fixed chunks, each with its own column sums.

    Row ``i`` sees the keys ``[lo[i], hi[i])``; a group of :data:`ROWS` rows adds to the
    columns of the span of its ranges, each row's exponentials zero outside its own range
    (a row with an empty range adds nothing and is left untouched in ``out`` and ``lse``).
    With ``one_pass`` (at most four score and value coordinates, zero-padded to four in
    ``q4``, ``k4``, ``v4``), each row's exponentials are taken against ``shift[i]``, an
    upper bound of its logits, instead of their maximum (no pass to find it, and the
    logits, exponentials and sums share one loop, :func:`_row_shifted`); a row whose sum
    falls below ``tiny`` (the bound far above the largest logit: significant terms could
    underflow) is redone by :func:`_row` against its maximum, as every row is without
    ``one_pass``."""
    m = q.shape[0]
    n = kT.shape[1]
    c = vT.shape[0]
    for ch in prange(n_chunks):
        i0 = ch * m // n_chunks
        i1 = (ch + 1) * m // n_chunks
        buf = np.empty((ROWS, n), dtype=q.dtype)
        coef = np.zeros(ROWS)
        acc, m_run, s_run = lse_totals(ROWS, c, q)
        col = colacc[ch]
        col[:] = 0.0
        for it in range(i0, i1, ROWS):
            nt = min(ROWS, i1 - it)
            a, e = n, 0                  # the span of the group's non-empty ranges
            for t in range(nt):
                if hi[it + t] > lo[it + t]:
                    a = min(a, lo[it + t])
                    e = max(e, hi[it + t])
            for t in range(nt):
                i = it + t
                li, hi_ = lo[i], hi[i]
                bt = buf[t]
                if hi_ <= li:
                    coef[t] = 0.0
                    bt[a:e] = 0.0
                    continue
                s = 0.0
                if one_pass:
                    s, t0, t1, t2, t3 = _row_shifted(q4, i, k4, v4, c > 0, bias, shift[i],
                                                     li, hi_, bt)
                    if s >= tiny:
                        inv = 1.0 / s
                        if c > 0:
                            out[i, 0] = t0 * inv
                        if c > 1:
                            out[i, 1] = t1 * inv
                        if c > 2:
                            out[i, 2] = t2 * inv
                        if c > 3:
                            out[i, 3] = t3 * inv
                        lse[i] = shift[i] + math.log(s)
                if not s >= tiny:
                    s = _row(q, i, kT, vT, bias, li, hi_, bt, t, m_run, s_run, acc, out, lse)
                coef[t] = w[i] / s
                bt[a:li] = 0.0
                bt[hi_:e] = 0.0
            if e > a:
                _add_columns(col, buf, coef, nt, a, e)


def fused_sweep(launch: Callable[..., Any], q: np.ndarray, k: np.ndarray, v: np.ndarray | None,
                bias: np.ndarray, w: np.ndarray, ranges: KeyRanges | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Row softmax pass with column sums: ``(out, lse, col)``.

    With logits :math:`\ell_{ij} = q_i\cdot k_j + b_j` (all finite) and row :math:`i`
    seeing the keys :math:`J_i = [\mathrm{lo}_i, \mathrm{hi}_i)` of ``ranges`` (all keys
    for ``None``),

    .. math:: \mathrm{lse}_i = \log\sum_{j\in J_i} e^{\ell_{ij}},\quad
              \mathrm{out}_i = \sum_{j\in J_i} e^{\ell_{ij} - \mathrm{lse}_i} v_j,\quad
              \mathrm{col}_j = \sum_{i:\, j\in J_i} w_i\, e^{\ell_{ij} - \mathrm{lse}_i}

    (a row with an empty range: ``out = 0``, ``lse = -inf``, no column mass).

    Parameters
    ----------
    launch : callable
        ``launch(kernel, work, *args)`` runs the compiled parallel kernel on ``args``
        (the backend's threads for ``work`` pair interactions).
    q : array (M, r)
    k : array (N, r)
    v : array (N, c) or None
    bias : array (N,), finite
    w : array (M,)
        Row weights of the column sums.
    ranges : KeyRanges or None
        Checked by the caller (:func:`~transformer_pde.backends.ranges.check_ranges`).

    Returns
    -------
    out : ndarray (M, c)
        In the promoted dtype of ``q`` and ``k``; (M, 0) when ``v`` is ``None``.
    lse : ndarray (M,)
    col : ndarray (N,), float64
    """
    dtype = np.result_type(q, k, np.float32)
    if dtype not in (np.float32, np.float64):
        dtype = np.dtype(np.float64)
    q = np.ascontiguousarray(q, dtype=dtype)
    kT = np.ascontiguousarray(np.asarray(k).T, dtype=dtype)
    m, n = q.shape[0], kT.shape[1]
    vT = (np.empty((0, n), dtype=dtype) if v is None
          else np.ascontiguousarray(np.asarray(v).T, dtype=dtype))
    out = np.zeros((m, vT.shape[0]), dtype=dtype)
    lse = np.full(m, -np.inf, dtype=dtype)             # rows with an empty range
    # writeable copies: read-only arrays would compile a second specialisation
    lo = np.zeros(m, dtype=np.int64) if ranges is None else np.array(ranges.lo)
    hi = np.full(m, n, dtype=np.int64) if ranges is None else np.array(ranges.hi)
    n_chunks = max(1, min(m, CHUNKS))
    colacc = np.empty((n_chunks, n))
    bias = np.ascontiguousarray(bias, dtype=dtype)
    w = np.ascontiguousarray(w, dtype=np.float64)
    r, c = q.shape[1], vT.shape[0]
    # the one-pass rows need zero-padded copies and a bound per row (about 40 us of
    # Python and copies per call): below ONE_PASS_MIN_PAIRS pairs they cost more than the
    # passes they save (measured: N = 50 slower, N = 1000 faster)
    if r > 4 or c > 4 or m * n < ONE_PASS_MIN_PAIRS:
        launch(_sweep_kernel, m * n, q, kT, vT, bias, w, lo, hi, n_chunks, out, lse, colacc,
               False, np.zeros((0, 4), dtype=dtype), np.zeros((4, 0), dtype=dtype),
               np.zeros((4, 0), dtype=dtype), np.zeros(0, dtype=dtype), np.inf)
        return out, lse, colacc.sum(axis=0)
    # one pass per row (measured 0.8x the time of the general rows at d = 2, N = 1e4):
    # the exponentials are taken against an upper bound of each row's logits,
    # max_j b_j + |q_i| max_j |k_j| (Cauchy-Schwarz), so they never exceed one
    q4 = np.zeros((m, 4), dtype=dtype)
    q4[:, :r] = q
    k4 = np.zeros((4, n), dtype=dtype)
    k4[:r] = kT
    v4 = np.zeros((4, n), dtype=dtype)
    v4[:c] = vT
    kmax = float(np.sqrt((kT.astype(np.float64) ** 2).sum(axis=0)).max())
    shift = (float(bias.max()) + np.sqrt((q.astype(np.float64) ** 2).sum(axis=1)) * kmax
             ).astype(dtype)
    launch(_sweep_kernel, m * n, q, kT, vT, bias, w, lo, hi, n_chunks, out, lse, colacc, True,
           q4, k4, v4, shift, _TINY_SUM[dtype])
    return out, lse, colacc.sum(axis=0)
