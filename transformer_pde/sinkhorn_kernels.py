r"""A fused Sinkhorn sweep: one pass over the pairs for a whole Sinkhorn iteration (Numba).

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
per pair instead of two (measured 1.33 softmax passes for the whole iteration against
1.9 for the two passes, N = 1e4, d = 2).  The rows are split into :data:`CHUNKS` fixed
chunks with their own column sums, added in order at the end: the same bits on any
number of threads.

The row is held in a per-thread buffer of :math:`N` numbers (the logits, then the
exponentials) between its log-sum-exp and its column update; four rows are added to the
column sums at a time.  Column sums are float64 whatever the input precision.

Where a column's sum is not a normal positive number (a column that receives almost no
mass: far from the solution, e.g. a cold start at small :math:`\varepsilon`) the
relation loses its accuracy; callers then take that iteration's column update from the
log-domain ``lse`` pass instead (:class:`transformer_pde.sinkhorn.FusedSweep` does).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

from .backends.numba_backend import vexp

__all__ = ["CHUNKS", "ROWS", "fused_sweep"]

#: rows added to the column sums at a time (one load/store of a column sum per ROWS rows)
ROWS = 4
#: row chunks, each with its own column sums (summed in order at the end): a fixed number,
#: so the result does not depend on the number of threads; memory CHUNKS * N floats
CHUNKS = 8

_FM = {"nnan", "ninf", "nsz", "arcp", "contract", "reassoc"}


@njit(fastmath=_FM, cache=True)
def _row(q, i, kT, vT, bias, b, out, lse):
    """Logits of row ``i`` into ``b``, then ``b = exp(logits - max)``; writes ``out[i]``
    and ``lse[i]`` and returns the row sum of ``b``."""
    n = kT.shape[1]
    r = q.shape[1]
    c = vT.shape[0]
    for j in range(n):
        b[j] = bias[j]
    for a in range(r):
        qa = q[i, a]
        ka = kT[a]
        for j in range(n):
            b[j] += qa * ka[j]
    mx = b[0]
    for j in range(1, n):
        mx = max(mx, b[j])
    s = 0.0
    for j in range(n):
        p = vexp(b[j] - mx)
        b[j] = p
        s += p
    inv = 1.0 / s
    for cc in range(c):
        vc = vT[cc]
        t = 0.0
        for j in range(n):
            t += b[j] * vc[j]
        out[i, cc] = t * inv
    lse[i] = mx + math.log(s)
    return s


@njit(parallel=True, fastmath=_FM, cache=True)
def _sweep_kernel(q, kT, vT, bias, w, n_chunks, out, lse, colacc):
    m = q.shape[0]
    n = kT.shape[1]
    for ch in prange(n_chunks):
        i0 = ch * m // n_chunks
        i1 = (ch + 1) * m // n_chunks
        buf = np.empty((ROWS, n), dtype=q.dtype)
        coef = np.zeros(ROWS)
        col = colacc[ch]
        col[:] = 0.0
        for it in range(i0, i1, ROWS):
            nt = min(ROWS, i1 - it)
            for t in range(nt):
                coef[t] = w[it + t] / _row(q, it + t, kT, vT, bias, buf[t], out, lse)
            if nt == ROWS:
                b0, b1, b2, b3 = buf[0], buf[1], buf[2], buf[3]
                c0, c1, c2, c3 = coef[0], coef[1], coef[2], coef[3]
                for j in range(n):
                    col[j] += (c0 * b0[j] + c1 * b1[j]) + (c2 * b2[j] + c3 * b3[j])
            else:
                for t in range(nt):
                    bt = buf[t]
                    ct = coef[t]
                    for j in range(n):
                        col[j] += ct * bt[j]


def fused_sweep(be: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray | None, bias: np.ndarray,
                w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Row softmax pass with column sums: ``(out, lse, col)``.

    With logits :math:`\ell_{ij} = q_i\cdot k_j + b_j` (all finite),

    .. math:: \mathrm{lse}_i = \log\sum_j e^{\ell_{ij}},\quad
              \mathrm{out}_i = \sum_j e^{\ell_{ij} - \mathrm{lse}_i} v_j,\quad
              \mathrm{col}_j = \sum_i w_i\, e^{\ell_{ij} - \mathrm{lse}_i}.

    Parameters
    ----------
    be : NumbaBackend
        Runs the kernel on its threads (:meth:`~transformer_pde.backends.numba_backend.NumbaBackend.launch`).
    q : array (M, r)
    k : array (N, r)
    v : array (N, c) or None
    bias : array (N,), finite
    w : array (M,)
        Row weights of the column sums.
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
    lse = np.empty(m, dtype=dtype)
    n_chunks = max(1, min(m, CHUNKS))
    colacc = np.empty((n_chunks, n))
    be.launch(_sweep_kernel, m * n, q, kT, vT, np.ascontiguousarray(bias, dtype=dtype),
              np.ascontiguousarray(w, dtype=np.float64), n_chunks, out, lse, colacc)
    return out, lse, colacc.sum(axis=0)
