r"""Numba kernels of the harmonic field (:mod:`transformer_pde.fields.harmonic`).

Moments.  The tokens of each segment are cut into fixed blocks of at most
:data:`BLOCK` tokens (the cut depends on the segment sizes only, never on the number of
threads, so results are deterministic); a parallel loop over blocks sums each block in
sub-blocks of :data:`SUB` tokens (a sub-block sequentially, then the sub-blocks
sequentially: summation depth :math:`SUB + BLOCK/SUB`), and the blocks' sums of a
segment are then added pairwise (NumPy's pairwise sum along the contiguous axis).  On
the circle the powers :math:`\bar z_j^k` come from the recurrence
:math:`\bar z^{k} = \bar z^{k-1}\bar z`; on the sphere the real harmonics of a token from
the associated Legendre recurrences of :mod:`~transformer_pde.fields.harmonic_sphere`.

Mode sums.  A parallel loop over queries; on the circle the modes are summed in runs of
:data:`MODE_RUN` (depth about :math:`8 + K/8`), on the sphere first over :math:`m` within
a degree, then over the degrees (depth :math:`\le 3L + 3`).  No fast-math: the kernels keep IEEE arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

__all__ = ["BLOCK", "MODE_RUN", "SUB", "harmonic_sums", "sphere_block"]

#: tokens per sub-block (summed sequentially)
SUB = 16
#: tokens per block on the circle (a parallel task; SUB * SUB: depth 2 * SUB)
BLOCK = SUB * SUB
#: modes per run of the circle's mode sums (depth MODE_RUN + K / MODE_RUN)
MODE_RUN = 8
#: most bytes of the sphere's per-block moment sums before the blocks grow
_SPHERE_BYTES = 1 << 28


def _blocks(bounds: list, block: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Block starts and ends over the segments, and each segment's block range."""
    starts, ends, spans, b0 = [], [], [], 0
    for s, e in bounds:
        a = np.arange(s, e, block, dtype=np.int64)
        starts.append(a)
        ends.append(np.minimum(a + block, e))
        spans.append((b0, b0 + a.size))
        b0 += a.size
    return np.concatenate(starts), np.concatenate(ends), spans


def sphere_block(n: int, nlm: int) -> int:
    """Tokens per block of the sphere's moments: :data:`BLOCK`, larger (a multiple of
    :data:`SUB`) when ``n / BLOCK`` blocks of ``4 nlm`` sums would pass 256 MB."""
    nb = max(1, _SPHERE_BYTES // (32 * nlm))
    return max(BLOCK, SUB * math.ceil(n / nb / SUB))


@njit(parallel=True, cache=True)
def _circle_block_moments(zr, zi, w, starts, ends, count):   # pragma: no cover (compiled)
    nb = starts.shape[0]
    out = np.zeros((nb, count), dtype=np.complex128)
    for b in prange(nb):
        accr = np.zeros(count)
        acci = np.zeros(count)
        pr = np.empty(SUB)
        pi = np.empty(SUB)
        j = starts[b]
        while j < ends[b]:
            m = min(ends[b], j + SUB) - j
            for i in range(m):                 # the powers of a sub-block, side by side
                pr[i] = w[j + i]
                pi[i] = 0.0
            for k in range(count):
                sr = 0.0
                si = 0.0
                for i in range(m):
                    sr += pr[i]
                    si += pi[i]
                accr[k] += sr
                acci[k] += si
                for i in range(m):             # p <- p * conj(z)
                    a, c = pr[i], pi[i]
                    pr[i] = a * zr[j + i] + c * zi[j + i]
                    pi[i] = c * zr[j + i] - a * zi[j + i]
            j += m
        for k in range(count):
            out[b, k] = complex(accr[k], acci[k])
    return out


@njit(parallel=True, cache=True)
def _circle_eval(qr, qi, qseg, Mr, Mi, coef, F, N):   # pragma: no cover (compiled)
    # queries in groups of SUB side by side (independent chains, vectorisable); each
    # query sums its modes k = 1..K in runs of MODE_RUN (a run sequentially, then the runs
    # sequentially).  Mr, Mi: real and imaginary moments (S, K+2)
    K = coef.shape[0] - 1
    m = qr.shape[0]
    for g in prange((m + SUB - 1) // SUB):
        i0 = g * SUB
        n = min(m, i0 + SUB) - i0
        pr, pi = np.ones(SUB), np.zeros(SUB)
        f, nr, ni = np.empty(SUB), np.empty(SUB), np.empty(SUB)
        fp, nrp, nip = np.zeros(SUB), np.zeros(SUB), np.zeros(SUB)
        sg = np.empty(SUB, dtype=np.int64)
        for i in range(n):
            s = qseg[i0 + i]
            sg[i] = s
            f[i] = coef[0] * Mr[s, 0]
            nr[i] = coef[0] * Mr[s, 1]
            ni[i] = -coef[0] * Mi[s, 1]
        for k in range(1, K + 1):
            a = coef[k]
            for i in range(n):
                s = sg[i]
                x, y = pr[i], pi[i]
                u, v = qr[i0 + i], qi[i0 + i]
                x, y = x * u - y * v, x * v + y * u           # p = q^k
                pr[i], pi[i] = x, y
                # 2 a Re(p M_k);  a (p M_{k-1} + conj(p M_{k+1}))
                fp[i] += 2.0 * a * (x * Mr[s, k] - y * Mi[s, k])
                nrp[i] += a * ((x * Mr[s, k - 1] - y * Mi[s, k - 1])
                               + (x * Mr[s, k + 1] - y * Mi[s, k + 1]))
                nip[i] += a * ((x * Mi[s, k - 1] + y * Mr[s, k - 1])
                               - (x * Mi[s, k + 1] + y * Mr[s, k + 1]))
            if k % MODE_RUN == 0 or k == K:
                for i in range(n):
                    f[i] += fp[i]
                    nr[i] += nrp[i]
                    ni[i] += nip[i]
                    fp[i] = 0.0
                    nrp[i] = 0.0
                    nip[i] = 0.0
        for i in range(n):
            F[i0 + i] = f[i]
            N[i0 + i, 0] = nr[i]
            N[i0 + i, 1] = ni[i]


@njit(cache=True)
def _ylm(x, y, t, L, A, Bc, out):   # pragma: no cover (compiled)
    # the real orthonormal harmonics of harmonic_sphere.real_harmonics at one point
    xy = math.hypot(x, y)
    ur, ui = (x / xy, y / xy) if xy > 0.0 else (1.0, 0.0)
    pmm = 1.0 / math.sqrt(4.0 * math.pi)
    cr, ci = 1.0, 0.0
    r2 = math.sqrt(2.0)
    for m in range(L + 1):
        if m > 0:
            pmm *= math.sqrt((2.0 * m + 1.0) / (2.0 * m)) * xy
            cr, ci = cr * ur - ci * ui, cr * ui + ci * ur
        p2 = 0.0
        p1 = pmm
        for l in range(m, L + 1):
            if l == m + 1:
                p2, p1 = p1, math.sqrt(2.0 * m + 3.0) * t * p1
            elif l > m + 1:
                p2, p1 = p1, A[l, m] * (t * p1 - Bc[l, m] * p2)
            if m == 0:
                out[l * l] = p1
            else:
                row = l * l + 2 * m - 1
                out[row] = r2 * p1 * cr
                out[row + 1] = r2 * p1 * ci


@njit(parallel=True, cache=True)
def _sphere_block_moments(X, w, starts, ends, L, A, Bc):   # pragma: no cover (compiled)
    nb = starts.shape[0]
    nlm = (L + 1) * (L + 1)
    out = np.zeros((nb, 4, nlm))
    for b in prange(nb):
        y = np.empty(nlm)
        acc = np.zeros((4, nlm))
        sub = np.zeros((4, nlm))
        j = starts[b]
        while j < ends[b]:
            stop = min(ends[b], j + SUB)
            sub[:, :] = 0.0
            for i in range(j, stop):
                _ylm(X[i, 0], X[i, 1], X[i, 2], L, A, Bc, y)
                c0, c1, c2, c3 = w[i], w[i] * X[i, 0], w[i] * X[i, 1], w[i] * X[i, 2]
                for r in range(nlm):
                    sub[0, r] += c0 * y[r]
                    sub[1, r] += c1 * y[r]
                    sub[2, r] += c2 * y[r]
                    sub[3, r] += c3 * y[r]
            for c in range(4):
                for r in range(nlm):
                    acc[c, r] += sub[c, r]
            j = stop
        out[b] = acc
    return out


@njit(parallel=True, cache=True)
def _sphere_eval(Q, qseg, G, L, A, Bc, out):   # pragma: no cover (compiled)
    nlm = (L + 1) * (L + 1)
    for i in prange(Q.shape[0]):
        y = np.empty(nlm)
        _ylm(Q[i, 0], Q[i, 1], Q[i, 2], L, A, Bc, y)
        g = G[qseg[i]]
        for c in range(4):
            tot = 0.0
            for l in range(L + 1):
                part = 0.0
                for r in range(l * l, (l + 1) * (l + 1)):
                    part += g[c, r] * y[r]
                tot += part
            out[i, c] = tot


def _recurrence(L: int) -> tuple[np.ndarray, np.ndarray]:
    """The constants :math:`a_{lm}, b_{lm}` of the Legendre recurrence (l >= m + 2)."""
    A = np.zeros((L + 1, L + 1))
    B = np.zeros((L + 1, L + 1))
    for m in range(L + 1):
        for l in range(m + 2, L + 1):
            A[l, m] = math.sqrt((4.0 * l * l - 1.0) / (l * l - m * m))
            B[l, m] = math.sqrt(((l - 1.0) ** 2 - m * m) / (4.0 * (l - 1.0) ** 2 - 1.0))
    return A, B


def _pairwise(parts: np.ndarray, spans: list) -> np.ndarray:
    """Each segment's sum of its blocks' sums (axis 0), pairwise."""
    return np.stack([np.moveaxis(parts[b0:b1], 0, -1).copy().sum(axis=-1)
                     for b0, b1 in spans])


def harmonic_sums(d: int, X: np.ndarray, w: np.ndarray, bounds: list, Q: np.ndarray,
                  qseg: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Scaled :math:`\hat F_w` (M,) and numerator (M, d) of the harmonic field at the unit
    rows ``Q`` (segment ``qseg``) of the unit tokens ``X`` with weights ``w`` (see
    :func:`transformer_pde.fields.harmonic._circle_sums` and
    :func:`transformer_pde.fields.harmonic_sphere.sphere_sums` for the formulas)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    qseg = np.ascontiguousarray(qseg, dtype=np.int64)
    order = coef.shape[0] - 1
    m = Q.shape[0]
    if d == 2:
        starts, ends, spans = _blocks(bounds, BLOCK)
        parts = _circle_block_moments(X[:, 0].copy(), X[:, 1].copy(), w, starts, ends,
                                      order + 2)
        M = np.ascontiguousarray(_pairwise(parts, spans))
        F, N = np.empty(m), np.empty((m, 2))
        _circle_eval(Q[:, 0].copy(), Q[:, 1].copy(), qseg, np.ascontiguousarray(M.real),
                     np.ascontiguousarray(M.imag), np.asarray(coef, float), F, N)
        return F, N
    nlm = (order + 1) ** 2
    A, B = _recurrence(order)
    starts, ends, spans = _blocks(bounds, sphere_block(X.shape[0], nlm))
    parts = _sphere_block_moments(X, w, starts, ends, order, A, B)
    ell = np.repeat(np.arange(order + 1), 2 * np.arange(order + 1) + 1)
    g = 4.0 * math.pi * coef[ell] / (2.0 * ell + 1.0)
    G = np.ascontiguousarray(_pairwise(parts, spans) * g)
    out = np.empty((m, 4))
    _sphere_eval(Q, qseg, G, order, A, B, out)
    return out[:, 0].copy(), np.ascontiguousarray(out[:, 1:])
