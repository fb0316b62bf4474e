r"""Streaming Numba kernels: one query at a time, SIMD across keys, O(N·d) memory.

Every primitive (see :mod:`transformer_pde.backends`) is one compiled kernel (``lse`` is
the softmax kernel with no values) that runs ``prange`` over queries and, for each
query, makes a single pass over its visible keys (the prefix ``j < limits[i]``; unmasked
calls pass ``limits = N``), so no N×N matrix is ever formed and a masked query never
touches the keys it cannot see.

Keys are streamed in blocks of :data:`BLOCK` keys.  For one query and one block the
kernel

1. writes the block's logits :math:`\ell_j = q\cdot k_j + b_j` into a small per-thread
   buffer (vectorised loops, four coordinates of :math:`q` per pass),
2. takes the block maximum :math:`m_B`; if it exceeds the running maximum :math:`m`,
   the running sum :math:`s` and the running weighted values are rescaled once by
   :math:`e^{m - m_B}` (online log-sum-exp),
3. exponentiates :math:`\ell_j - m \le 0` in a tight loop with the branch-free,
   vectorisable exponential :func:`~transformer_pde.backends.numba.intrinsics.vexp`
   and accumulates :math:`s \mathrel{+}= \sum_j e^{\ell_j-m}` and
   :math:`a_c \mathrel{+}= \sum_j e^{\ell_j-m} v_{jc}`.

Both kernels take the queries in tiles of :data:`TILE` consecutive queries and
loop over key blocks outside the queries of a tile, so that a block of keys and values
is fetched from memory once per tile (about 2× at N = 1e5, d = 8, where the keys no
longer fit in L2).

At the end :math:`\mathrm{lse} = m + \log s` and :math:`\mathrm{out} = a / s`.  Running
totals are kept in float64 whatever the input precision; the per-block sums use the
input precision (float32 runs twice as many SIMD lanes).

The kernels expect finite inputs (they are compiled with fast-math flags,
:data:`~transformer_pde.backends.numba.intrinsics.FM_KERNEL`) laid out by
:class:`~transformer_pde.backends.numba.NumbaBackend`: queries ``q`` (M, r), keys
transposed ``kT`` (r, N), values transposed ``vT`` (c, N), int64 ``limits`` (M,).
:func:`start_tile` and :func:`first_tile` (the tile schedule) are shared with the tiled
kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .intrinsics import FM_KERNEL, fmax, vexp

__all__ = ["BLOCK", "TILE", "first_tile", "pointwise_kernel", "softmax_kernel", "start_tile"]

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


@njit(fastmath=FM_KERNEL, cache=True)
def start_tile(acc, limits, i0, nt):
    """Zero the tile's accumulators; return its longest visible prefix."""
    acc[:] = 0.0
    most = 0
    for t in range(nt):
        most = max(most, limits[i0 + t])
    return most


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
def softmax_kernel(q, kT, vT, bias, limits, n_groups, n_threads, out, lse):
    """Streaming softmax / lse over tiles of :data:`TILE` consecutive queries.

    Within a tile the key blocks are the outer loop, so one block of keys and values is
    read from memory once and reused, from L1, by every query of the tile; each query
    keeps its own running maximum, sum and values and still sees its keys in order, so
    the result of a query does not depend on the tiling or the threads.  Group ``g``
    takes every ``n_groups``-th tile from :func:`first_tile` (strided groups balance
    the threads when masked prefix lengths are sorted).  A query with no visible key (``limits[i] == 0``)
    is left untouched in ``out`` and ``lse``.
    """
    m_q = q.shape[0]
    c = vT.shape[0]
    zero = q.dtype.type(0.0)
    n_tiles = (m_q + TILE - 1) // TILE
    for g in prange(n_groups):
        buf = np.empty(BLOCK, dtype=q.dtype)
        acc = np.empty((TILE, c), dtype=np.float64)
        m_run = np.empty(TILE, dtype=q.dtype)
        s_run = np.empty(TILE, dtype=np.float64)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * TILE
            nt = min(TILE, m_q - i0)
            most = start_tile(acc, limits, i0, nt)
            s_run[:] = 0.0
            for j0 in range(0, most, BLOCK):
                for t in range(nt):
                    i = i0 + t
                    nb = min(BLOCK, limits[i] - j0)
                    if nb <= 0:
                        continue
                    _block_logits(buf, q, i, kT, bias, j0, nb)
                    mb = buf[0]
                    for j in range(1, nb):
                        mb = fmax(mb, buf[j])
                    at = acc[t]
                    if j0 == 0:
                        m_run[t] = mb
                    elif mb > m_run[t]:
                        scale = float(vexp(m_run[t] - mb))
                        s_run[t] *= scale
                        for cc in range(c):
                            at[cc] *= scale
                        m_run[t] = mb
                    mt = m_run[t]
                    sb = zero
                    for j in range(nb):
                        p = vexp(buf[j] - mt)
                        buf[j] = p
                        sb += p
                    s_run[t] += sb
                    _accumulate(at, buf, vT, j0, nb)
            for t in range(nt):
                i = i0 + t
                if limits[i] <= 0:
                    continue
                lse[i] = m_run[t] + math.log(s_run[t])
                inv = 1.0 / s_run[t]
                for cc in range(c):
                    out[i, cc] = acc[t, cc] * inv


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def pointwise_kernel(phi, q, kT, vT, w, zb, limits, n_groups, n_threads, out):
    """out[i] = sum_{j < limits[i]} w_j phi(q_i . k_j) v_j; phi: 0 id, 1 sigmoid, 2 relu.

    Same tiling of queries as :func:`softmax_kernel` (no running maximum is needed).
    """
    m_q = q.shape[0]
    c = vT.shape[0]
    zero = q.dtype.type(0.0)
    one = q.dtype.type(1.0)
    n_tiles = (m_q + TILE - 1) // TILE
    for g in prange(n_groups):
        buf = np.empty(BLOCK, dtype=q.dtype)
        acc = np.empty((TILE, c), dtype=np.float64)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * TILE
            nt = min(TILE, m_q - i0)
            most = start_tile(acc, limits, i0, nt)
            for j0 in range(0, most, BLOCK):
                wb = w[j0:min(j0 + BLOCK, w.shape[0])]
                for t in range(nt):
                    i = i0 + t
                    nb = min(BLOCK, limits[i] - j0)
                    if nb <= 0:
                        continue
                    _block_logits(buf, q, i, kT, zb, j0, nb)
                    if phi == 1:
                        for j in range(nb):
                            z = buf[j]
                            e = vexp(-abs(z))
                            buf[j] = wb[j] * ((one if z >= zero else e) / (one + e))
                    elif phi == 2:
                        for j in range(nb):
                            buf[j] = wb[j] * max(buf[j], zero)
                    else:
                        for j in range(nb):
                            buf[j] = wb[j] * buf[j]
                    _accumulate(acc[t], buf, vT, j0, nb)
            for t in range(nt):
                for cc in range(c):
                    out[i0 + t, cc] = acc[t, cc]

