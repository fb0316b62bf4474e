r"""Streaming Numba kernels: one query at a time, SIMD across keys, O(N·d) memory.

The three primitives (see :mod:`transformer_pde.backends`) are two compiled kernels,
:func:`softmax_kernel` (``lse`` is the softmax with no values) and
:func:`pointwise_kernel`, written from the same helpers (one kernel per reduction: a
single kernel with the reduction as a run-time mode measured 3–14 % slower).  Each runs
``prange`` over queries and, for each query, makes a single pass over its visible keys,
the range ``lo[i] <= j < hi[i]`` (:mod:`~transformer_pde.backends.ranges`; unmasked
calls pass ``lo = 0``, ``hi = N``), so
no N×N matrix is ever formed and a query never touches the keys it cannot see.

Keys are streamed in blocks of :data:`BLOCK` keys.  For one query and one block the
kernel

1. writes the block's logits :math:`\ell_j = q\cdot k_j + b_j` into a small per-thread
   buffer (vectorised loops, four coordinates of :math:`q` per pass),
2. takes the block maximum :math:`m_B` and folds the block into the query's running
   maximum :math:`m`, sum :math:`s` and weighted values :math:`a` (:func:`lse_step`, the
   online log-sum-exp step every Numba kernel family calls): if :math:`m_B > m` the
   running totals are rescaled once by :math:`e^{m - m_B}`; then :math:`\ell_j - m \le 0`
   is exponentiated in a tight loop with the branch-free, vectorisable exponential
   :func:`~transformer_pde.backends.numba.intrinsics.vexp` and
   :math:`s \mathrel{+}= \sum_j e^{\ell_j-m}`,
3. accumulates :math:`a_c \mathrel{+}= \sum_j e^{\ell_j-m} v_{jc}`

(pointwise: step 2 is :math:`w_j\varphi(\ell_j)`, :func:`apply_phi`, and there is no
running maximum).  The kernels take the queries in tiles of :data:`TILE` consecutive queries and
loop over key blocks outside the queries of a tile, so that a block of keys and values
is fetched from memory once per tile (about 2× at N = 1e5, d = 8, where the keys no
longer fit in L2).  A tile visits the keys ``[min lo, max hi)`` of its queries in the
blocks ``[j BLOCK, (j + 1) BLOCK)`` that meet them, and each query takes the part of a
block inside its own range: a query's blocks, and so its result, do not depend on the
other queries of its tile.

At the end :math:`\mathrm{lse} = m + \log s` and :math:`\mathrm{out} = a / s`
(:func:`lse_finish`).  Running
totals are kept in float64 whatever the input precision; the per-block sums use the
input precision (float32 runs twice as many SIMD lanes).

The kernels expect finite inputs (they are compiled with fast-math flags,
:data:`~transformer_pde.backends.numba.intrinsics.FM_KERNEL`) laid out by
:class:`~transformer_pde.backends.numba.NumbaBackend`: queries ``q`` (M, r), keys
transposed ``kT`` (r, N), values transposed ``vT`` (c, N), int64 range ends ``lo``,
``hi`` (M,).  :func:`start_tile` and :func:`first_tile` (the tile schedule),
:func:`lse_step`, :func:`lse_finish` (the online log-sum-exp), :func:`apply_phi` and
:func:`finish_tile` are shared with the tiled and sweep kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .intrinsics import FM_KERNEL, fmax, vexp

__all__ = ["BLOCK", "TILE", "apply_phi", "finish_tile", "first_tile", "lse_finish",
           "lse_step", "lse_totals", "pointwise_kernel", "softmax_kernel", "start_tile"]

#: keys per streamed block (the per-thread logit buffer holds this many numbers)
BLOCK = 256
#: consecutive queries that share each block of keys (read once, reused from L1)
TILE = 8


@njit(fastmath=FM_KERNEL, cache=True)
def _block_logits(buf, q, i, kT, bias, j0, nb):
    """buf[:nb] = bias[j0:j0+nb] + q[i] . kT[:, j0:j0+nb].

    Coordinates are taken four at a time so that each pass over the buffer does four
    FMAs per load/store.  The 1-D row slices compile without the negative-index
    wraparound selects that otherwise keep LLVM from vectorising these loops.
    """
    r = q.shape[1]
    bb = bias[j0:j0 + nb]
    for j in range(nb):
        buf[j] = bb[j]
    a = 0
    while a + 4 <= r:
        q0, q1, q2, q3 = q[i, a], q[i, a + 1], q[i, a + 2], q[i, a + 3]
        k0 = kT[a, j0:j0 + nb]
        k1 = kT[a + 1, j0:j0 + nb]
        k2 = kT[a + 2, j0:j0 + nb]
        k3 = kT[a + 3, j0:j0 + nb]
        for j in range(nb):
            buf[j] += (q0 * k0[j] + q1 * k1[j]) + (q2 * k2[j] + q3 * k3[j])
        a += 4
    while a + 2 <= r:
        q0, q1 = q[i, a], q[i, a + 1]
        k0 = kT[a, j0:j0 + nb]
        k1 = kT[a + 1, j0:j0 + nb]
        for j in range(nb):
            buf[j] += q0 * k0[j] + q1 * k1[j]
        a += 2
    if a < r:
        q0 = q[i, a]
        k0 = kT[a, j0:j0 + nb]
        for j in range(nb):
            buf[j] += q0 * k0[j]


@njit(fastmath=FM_KERNEL, cache=True)
def _accumulate(acc, buf, vT, j0, nb):
    """acc[c] += sum_j buf[j] * vT[c, j0 + j], four value coordinates per pass.

    Block sums are formed in the input precision and added to float64 totals.
    """
    c = vT.shape[0]
    zero = buf.dtype.type(0.0)
    cc = 0
    while cc + 4 <= c:
        v0 = vT[cc, j0:j0 + nb]
        v1 = vT[cc + 1, j0:j0 + nb]
        v2 = vT[cc + 2, j0:j0 + nb]
        v3 = vT[cc + 3, j0:j0 + nb]
        t0 = t1 = t2 = t3 = zero
        for j in range(nb):
            p = buf[j]
            t0 += p * v0[j]
            t1 += p * v1[j]
            t2 += p * v2[j]
            t3 += p * v3[j]
        acc[cc] += t0
        acc[cc + 1] += t1
        acc[cc + 2] += t2
        acc[cc + 3] += t3
        cc += 4
    while cc < c:
        v0 = vT[cc, j0:j0 + nb]
        t0 = zero
        for j in range(nb):
            t0 += buf[j] * v0[j]
        acc[cc] += t0
        cc += 1


@njit(inline="always")
def lse_totals(rows, width, like):
    """Per-thread running totals of ``rows`` queries: weighted values ``acc`` (rows,
    width) and sums ``s_run`` (rows,) in float64, maxima ``m_run`` (rows,) in the dtype
    of the array ``like``; returns ``(acc, m_run, s_run)``."""
    return (np.empty((rows, width), dtype=np.float64), np.empty(rows, dtype=like.dtype),
            np.empty(rows, dtype=np.float64))


@njit(fastmath=FM_KERNEL, cache=True)
def start_tile(tile, size, m_q, block, acc, s_run, lo, hi):
    """Tile ``tile`` of ``size`` consecutive queries (of ``m_q``): ``(i0, nt, start, stop)``,
    its queries ``i0 … i0 + nt - 1`` and the keys ``[start, stop)`` it visits, from the
    start of the block of ``block`` keys holding the smallest ``lo`` to the largest
    ``hi`` of its queries with a non-empty range (``(0, 0)`` when there is none: a
    query's blocks do not depend on its tile); its accumulators ``acc`` and ``s_run``
    zeroed."""
    i0 = tile * size
    nt = min(size, m_q - i0)
    acc[:] = 0.0
    s_run[:] = 0.0
    first = stop = 0
    for i in range(i0, i0 + nt):
        if hi[i] > lo[i]:
            first = lo[i] if stop == 0 else min(first, lo[i])
            stop = max(stop, hi[i])
    return i0, nt, first // block * block, stop


@njit(fastmath=FM_KERNEL, inline="always")
def lse_step(x, nb, mb, m_run, s_run, acc, t, first, zero):
    r"""Fold one block of logits ``x[:nb]`` (largest :math:`m_B` = ``mb``) into the online
    log-sum-exp of row ``t``: running maximum ``m_run[t]``, sum ``s_run[t]`` (float64) and
    weighted values ``acc[t]``.

    ``first`` (the row's first block): :math:`m \leftarrow m_B`.  Otherwise, when
    :math:`m_B > m`, the running sum and values are rescaled by :math:`e^{m - m_B}` and
    :math:`m \leftarrow m_B`.  Then ``x[:nb]`` is replaced by :math:`e^{x_j - m}` (at most
    1) and their sum, formed from ``zero`` (its type sets the block sum's precision), is
    added to ``s_run[t]``; the caller adds the block's weighted values to ``acc[t]``.
    The one online log-sum-exp step of the streaming, tiled and sweep kernels.
    """
    if first:
        m_run[t] = mb
    elif mb > m_run[t]:
        scale = float(vexp(m_run[t] - mb))
        s_run[t] *= scale
        at = acc[t]
        for cc in range(at.shape[0]):
            at[cc] *= scale
        m_run[t] = mb
    mt = m_run[t]
    sb = zero
    for j in range(nb):
        p = vexp(x[j] - mt)
        x[j] = p
        sb += p
    s_run[t] += sb


@njit(fastmath=FM_KERNEL, inline="always")
def lse_finish(t, i, m_run, s_run, acc, out, lse):
    r"""Row ``t``'s result into query ``i``: :math:`\mathrm{lse}_i = m + \log s`,
    :math:`\mathrm{out}_i = a / s` (the first ``out.shape[1]`` values of ``acc[t]``)."""
    lse[i] = m_run[t] + math.log(s_run[t])
    inv = 1.0 / s_run[t]
    for cc in range(out.shape[1]):
        out[i, cc] = acc[t, cc] * inv


@njit(fastmath=FM_KERNEL, inline="always")
def finish_tile(i0, nt, lo, hi, m_run, s_run, acc, out, lse):
    """The softmax results of a tile's queries ``i0 … i0 + nt - 1``: those with a
    non-empty range by :func:`lse_finish`; the others keep ``out = 0``, ``lse = -inf``."""
    for t in range(nt):
        if hi[i0 + t] > lo[i0 + t]:
            lse_finish(t, i0 + t, m_run, s_run, acc, out, lse)


@njit(fastmath=FM_KERNEL, inline="always")
def apply_phi(phi, x, nb, wb):
    """``x[:nb] = wb * phi(x)``: ``phi`` 1 sigmoid (stable for any sign), 2 relu, else the
    identity."""
    zero = x.dtype.type(0.0)
    one = x.dtype.type(1.0)
    if phi == 1:
        for j in range(nb):
            z = x[j]
            e = vexp(-abs(z))
            x[j] = wb[j] * ((one if z >= zero else e) / (one + e))
    elif phi == 2:
        for j in range(nb):
            x[j] = wb[j] * max(x[j], zero)
    else:
        for j in range(nb):
            x[j] = wb[j] * x[j]


@njit(cache=True)
def first_tile(g, n_groups, n_threads):
    """First tile of group ``g`` (which takes every ``n_groups``-th tile from there).

    ``n_groups = n_threads * k``; Numba's static schedule hands thread ``t`` the
    contiguous groups ``t*k … t*k + k - 1``, which this maps to first tiles ``t, t + T,
    … t + (k-1)T``: thread ``t`` then takes every T-th tile, so the threads' tile counts
    differ by at most one and tiles of sorted masked prefixes alternate between them.
    (Groups starting at tile ``g`` would give the threads contiguous runs of groups:
    one thread could get 14 of 22 tiles.)  Any schedule is correct: each tile is one
    group's, whichever thread runs it.
    """
    k = n_groups // n_threads
    return (g % k) * n_threads + g // k


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def softmax_kernel(q, kT, vT, bias, lo, hi, n_groups, n_threads, out, lse):
    """Streaming softmax / lse of logits ``q_i . k_j + bias_j`` over ``lo[i] <= j < hi[i]``,
    in tiles of :data:`TILE` consecutive queries.

    Within a tile the key blocks are the outer loop, so one block of keys and values is
    read from memory once and reused, from L1, by every query of the tile; each query
    keeps its own running maximum, sum and values and still sees its keys in order, so
    the result of a query does not depend on the tiling or the threads.  Group ``g``
    takes every ``n_groups``-th tile from :func:`first_tile` (strided groups balance
    the threads when masked prefix lengths are sorted).  A query with no visible key
    (``lo[i] == hi[i]``) is left untouched in ``out`` and ``lse``.
    """
    m_q = q.shape[0]
    zero = q.dtype.type(0.0)
    n_tiles = (m_q + TILE - 1) // TILE
    for g in prange(n_groups):
        buf = np.empty(BLOCK, dtype=q.dtype)
        acc, m_run, s_run = lse_totals(TILE, vT.shape[0], q)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0, nt, start, stop = start_tile(tile, TILE, m_q, BLOCK, acc, s_run, lo, hi)
            for j0 in range(start, stop, BLOCK):
                for t in range(nt):
                    i = i0 + t
                    a = max(lo[i], j0)           # this query's keys [a, a + nb) of the block
                    nb = min(hi[i], j0 + BLOCK) - a
                    if nb > 0:
                        _block_logits(buf, q, i, kT, bias, a, nb)
                        mb = buf[0]
                        for j in range(1, nb):
                            mb = fmax(mb, buf[j])
                        lse_step(buf, nb, mb, m_run, s_run, acc, t, lo[i] >= j0, zero)
                        _accumulate(acc[t], buf, vT, a, nb)
            finish_tile(i0, nt, lo, hi, m_run, s_run, acc, out, lse)


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def pointwise_kernel(phi, q, kT, vT, w, zb, lo, hi, n_groups, n_threads, out):
    """out[i] = sum_{lo[i] <= j < hi[i]} w_j phi(q_i . k_j) v_j; phi: 0 id, 1 sigmoid, 2 relu.

    Same tiling of queries as :func:`softmax_kernel` (no running maximum is needed).
    """
    m_q = q.shape[0]
    n_tiles = (m_q + TILE - 1) // TILE
    for g in prange(n_groups):
        buf = np.empty(BLOCK, dtype=q.dtype)
        acc, _, s_run = lse_totals(TILE, vT.shape[0], q)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0, nt, start, stop = start_tile(tile, TILE, m_q, BLOCK, acc, s_run, lo, hi)
            for j0 in range(start, stop, BLOCK):
                for i in range(i0, i0 + nt):
                    a = max(lo[i], j0)
                    nb = min(hi[i], j0 + BLOCK) - a
                    if nb > 0:
                        _block_logits(buf, q, i, kT, zb, a, nb)
                        apply_phi(phi, buf, nb, w[a:a + nb])
                        _accumulate(acc[i - i0], buf, vT, a, nb)
            for t in range(nt):
                for cc in range(out.shape[1]):
                    out[i0 + t, cc] = acc[t, cc]
