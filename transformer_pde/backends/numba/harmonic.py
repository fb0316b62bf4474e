r"""Numba kernels of the harmonic field (:mod:`transformer_pde.fields.harmonic`).

Moments.  The tokens of each segment are cut into fixed blocks of at most
:data:`BLOCK` tokens (the cut depends on the segment sizes only, never on the number of
threads, so results are deterministic); a parallel loop over blocks sums each block in
:data:`SUB` lanes (on the circle token ``SUB r + i`` of a block goes to lane ``i``, so
the powers of ``SUB`` tokens advance side by side in SIMD registers; on the sphere
consecutive sub-blocks of ``SUB`` tokens), each in order, then the lanes in order
(summation depth :math:`SUB + BLOCK/SUB`), and the blocks' sums of a segment are then
added pairwise (NumPy's pairwise sum along the contiguous axis).  On the circle the
powers :math:`\bar z_j^k` come from the recurrence :math:`\bar z^{k} = \bar z^{k-1}\bar
z`; on the sphere the real harmonics of a token from the associated Legendre
recurrences of :mod:`~transformer_pde.fields.harmonic_sphere`.

Mode sums.  A parallel loop over chunks of :data:`EVAL_CHUNK` queries; on the circle
``SUB`` queries side by side sum their modes in runs of :data:`MODE_RUN` (depth about
:math:`8 + K/8`) against per-segment coefficients :math:`2a_kM_k`,
:math:`a_k(M_{k-1} \pm M_{k+1})` formed once per call, and the same kernel divides by
:math:`\hat F` and flags the queries whose error bound exceeds the tolerance (one pass
over the queries); on the sphere first over :math:`m` within a degree, then over the
degrees (depth :math:`\le 3L + 3`).  Every query's arithmetic is the same whatever the
chunking and the thread count.  Kernels run through the backend's launcher (the
backend's thread count, one thread for small calls).  No fast-math: the kernels keep
IEEE arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

__all__ = ["BLOCK", "EVAL_CHUNK", "MODE_RUN", "SUB", "circle_field", "harmonic_sums",
           "sphere_block", "unit_rows", "unit_rows_kernel"]

#: tokens per sub-block (summed sequentially)
SUB = 16
#: tokens per block on the circle (a parallel task; SUB * SUB: depth 2 * SUB)
BLOCK = SUB * SUB
#: modes per run of the circle's mode sums (depth MODE_RUN + K / MODE_RUN)
MODE_RUN = 8
#: queries per parallel task of the mode sums (scratch allocated once per task)
EVAL_CHUNK = 2048
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


@njit(cache=True)
def unit_rows_kernel(X, out):   # pragma: no cover (compiled)
    # out = X / |X| row by row, in NumPy's order of operations; the first row that is
    # zero or not finite (|x| > 0 fails), or -1
    first = -1
    d = X.shape[1]
    for i in range(X.shape[0]):
        r = 0.0
        for c in range(d):
            r += X[i, c] * X[i, c]
        r = math.sqrt(r)
        if not r > 0.0 and first < 0:
            first = i
        for c in range(d):
            out[i, c] = X[i, c] / r
    return first


@njit(cache=True)
def _circle_block(X, w, j0, j1, count, out):   # pragma: no cover (compiled)
    # the moments of tokens j0..j1-1: token j0 + SUB * r + i goes to lane i (powers of
    # SUB tokens side by side, vectorised), each lane sums its <= BLOCK / SUB tokens in
    # order, then the SUB lanes are summed in order.  out: (2 count,) real, imaginary
    accr = np.zeros(count * SUB)
    acci = np.zeros(count * SUB)
    pr, pi = np.empty(SUB), np.empty(SUB)
    cr, ci = np.empty(SUB), np.empty(SUB)
    for j in range(j0, j1, SUB):
        m = min(j1 - j, SUB)
        for i in range(SUB):                   # padding: weight 0 adds exact zeros
            pr[i] = w[j + i] if i < m else 0.0
            pi[i] = 0.0
            cr[i] = X[j + i, 0] if i < m else 1.0
            ci[i] = X[j + i, 1] if i < m else 0.0
        for k in range(count):
            o = k * SUB
            for i in range(SUB):               # add p, then p <- p * conj(z)
                a, c = pr[i], pi[i]
                accr[o + i] += a
                acci[o + i] += c
                pr[i] = a * cr[i] + c * ci[i]
                pi[i] = c * cr[i] - a * ci[i]
    for k in range(count):
        sr = 0.0
        si = 0.0
        for i in range(SUB):
            sr += accr[k * SUB + i]
            si += acci[k * SUB + i]
        out[k] = sr
        out[count + k] = si


@njit(parallel=True, cache=True)
def _circle_moments(X, w, starts, ends, count, parts):   # pragma: no cover (compiled)
    for b in prange(starts.shape[0]):
        _circle_block(X, w, starts[b], ends[b], count, parts[b])


@njit(cache=True)
def _circle_group(Q, qseg, T0, T, i0, n, post, thr, tol, scale, F, out, bad,
                  s_):   # pragma: no cover (compiled)
    # queries i0..i0+n-1 (n <= SUB) side by side; each sums its modes k = 1..K in runs
    # of MODE_RUN (a run in order, then the runs in order).  T0[s] = (a_0 M_0, a_0 M_1):
    # the k = 0 terms; T[s, k-1] = 2 a_k M_k, a_k (M_{k-1} + M_{k+1}),
    # a_k (M_{k-1} - M_{k+1}) (real, imaginary parts).  s_: scratch (11, SUB)
    K = T.shape[1]
    pr, pi, qr, qi = s_[0], s_[1], s_[2], s_[3]
    f, nr, ni, fp, nrp, nip = s_[4], s_[5], s_[6], s_[7], s_[8], s_[9]
    sg = s_[10]
    s0 = qseg[i0]
    same = True
    for i in range(n):
        s = qseg[i0 + i]
        same = same and s == s0
        sg[i] = s
        qr[i], qi[i] = Q[i0 + i, 0], Q[i0 + i, 1]
        pr[i], pi[i] = 1.0, 0.0
        f[i], nr[i], ni[i] = T0[s, 0], T0[s, 1], -T0[s, 2]
        fp[i], nrp[i], nip[i] = 0.0, 0.0, 0.0
    for k in range(1, K + 1):
        if same:                               # one segment: coefficients broadcast
            cr, c_i = T[s0, k - 1, 0], T[s0, k - 1, 1]
            sr, si = T[s0, k - 1, 2], T[s0, k - 1, 3]
            dr, di = T[s0, k - 1, 4], T[s0, k - 1, 5]
            for i in range(n):
                x, y = pr[i], pi[i]
                x, y = x * qr[i] - y * qi[i], x * qi[i] + y * qr[i]     # p = q^k
                pr[i], pi[i] = x, y
                fp[i] += x * cr - y * c_i
                nrp[i] += x * sr - y * si
                nip[i] += x * di + y * dr
        else:                                  # the same arithmetic, per query's segment
            for i in range(n):
                s = int(sg[i])
                x, y = pr[i], pi[i]
                x, y = x * qr[i] - y * qi[i], x * qi[i] + y * qr[i]
                pr[i], pi[i] = x, y
                fp[i] += x * T[s, k - 1, 0] - y * T[s, k - 1, 1]
                nrp[i] += x * T[s, k - 1, 2] - y * T[s, k - 1, 3]
                nip[i] += x * T[s, k - 1, 5] + y * T[s, k - 1, 4]
        if k % MODE_RUN == 0 or k == K:
            for i in range(n):
                f[i] += fp[i]
                nr[i] += nrp[i]
                ni[i] += nip[i]
                fp[i], nrp[i], nip[i] = 0.0, 0.0, 0.0
    for i in range(n):
        # post 0: the raw sums; 1: softmax N (sign / F); 2: exp N * scale.  bad: the
        # per-query bound thr / F above tol (or F <= 0): answered by the direct sum
        Fi = f[i]
        F[i0 + i] = Fi
        ok = Fi > 0.0 and thr / Fi <= tol
        bad[i0 + i] = not ok
        if post == 0:
            out[i0 + i, 0], out[i0 + i, 1] = nr[i], ni[i]
        elif not ok:
            out[i0 + i, 0], out[i0 + i, 1] = 0.0, 0.0
        elif post == 1:
            r = scale / Fi
            out[i0 + i, 0], out[i0 + i, 1] = nr[i] * r, ni[i] * r
        else:
            out[i0 + i, 0], out[i0 + i, 1] = nr[i] * scale, ni[i] * scale


@njit(parallel=True, cache=True)
def _circle_eval(Q, qseg, T0, T, post, thr, tol, scale, F, out,
                 bad):   # pragma: no cover (compiled)
    m = Q.shape[0]
    for c in prange((m + EVAL_CHUNK - 1) // EVAL_CHUNK):
        s_ = np.empty((11, SUB))
        for i0 in range(c * EVAL_CHUNK, min(m, (c + 1) * EVAL_CHUNK), SUB):
            _circle_group(Q, qseg, T0, T, i0, min(m - i0, SUB), post, thr, tol, scale,
                          F, out, bad, s_)


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
def _sphere_block_moments(X, w, starts, ends, L, A, Bc, out):   # pragma: no cover (compiled)
    nlm = (L + 1) * (L + 1)
    for b in prange(starts.shape[0]):
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


@njit(parallel=True, cache=True)
def _sphere_eval(Q, qseg, G, L, A, Bc, out):   # pragma: no cover (compiled)
    nlm = (L + 1) * (L + 1)
    m = Q.shape[0]
    for ch in prange((m + EVAL_CHUNK - 1) // EVAL_CHUNK):
        y = np.empty(nlm)
        for i in range(ch * EVAL_CHUNK, min(m, (ch + 1) * EVAL_CHUNK)):
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


def unit_rows(X: np.ndarray) -> tuple[np.ndarray, int]:
    """``X / |X|`` row by row in one pass (the operations of
    :func:`transformer_pde.fields.harmonic.unit_rows`), and the first row that is zero or
    not finite (-1: none)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    out = np.empty_like(X)
    return out, int(unit_rows_kernel(X, out))


def circle_field(be: Any, X: np.ndarray, w: np.ndarray, bounds: list, Q: np.ndarray,
                 qseg: np.ndarray, coef: np.ndarray, post: int = 0, thr: float = 0.0,
                 tol: float = 0.0, scale: float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The harmonic sums on the circle at the unit rows ``Q`` (segment ``qseg``) of the
    unit tokens ``X`` with weights ``w``: scaled :math:`\hat F_w` (M,), the numerator
    (M, 2) (``post`` 0), the softmax field :math:`\hat N\,\mathrm{scale}/\hat F`
    (``post`` 1) or :math:`\hat N\,\mathrm{scale}` (``post`` 2; zero where ``bad``), and
    ``bad`` (M,): where not (:math:`\hat F > 0` and ``thr / F <= tol``).  Kernels run on the
    backend's threads (:meth:`NumbaBackend._run`: fewer for small calls)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    qseg = np.ascontiguousarray(qseg, dtype=np.int64)
    K = coef.shape[0] - 1
    count = K + 2
    starts, ends, spans = _blocks(bounds, BLOCK)
    parts = np.empty((starts.shape[0], 2 * count))
    be._run(_circle_moments, X.shape[0] * count, X, w, starts, ends, count, parts)
    M = _pairwise(parts, spans)
    Mr, Mi = M[:, :count], M[:, count:]
    a = np.asarray(coef[1:], dtype=np.float64)
    T = np.empty((M.shape[0], K, 6))
    T[:, :, 0], T[:, :, 1] = (2.0 * a) * Mr[:, 1:K + 1], (2.0 * a) * Mi[:, 1:K + 1]
    T[:, :, 2], T[:, :, 3] = a * (Mr[:, :K] + Mr[:, 2:]), a * (Mi[:, :K] + Mi[:, 2:])
    T[:, :, 4], T[:, :, 5] = a * (Mr[:, :K] - Mr[:, 2:]), a * (Mi[:, :K] - Mi[:, 2:])
    c0 = float(coef[0])
    T0 = np.ascontiguousarray(np.stack([c0 * Mr[:, 0], c0 * Mr[:, 1], c0 * Mi[:, 1]], axis=1))
    m = Q.shape[0]
    F, out, bad = np.empty(m), np.empty((m, 2)), np.empty(m, dtype=np.bool_)
    be._run(_circle_eval, m * max(K, 1), Q, qseg, T0, T, int(post), float(thr),
            float(tol), float(scale), F, out, bad)
    return F, out, bad


def harmonic_sums(be: Any, d: int, X: np.ndarray, w: np.ndarray, bounds: list,
                  Q: np.ndarray, qseg: np.ndarray, coef: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    r"""Scaled :math:`\hat F_w` (M,) and numerator (M, d) of the harmonic field at the unit
    rows ``Q`` (segment ``qseg``) of the unit tokens ``X`` with weights ``w`` (see
    :func:`transformer_pde.fields.harmonic._circle_sums` and
    :func:`transformer_pde.fields.harmonic_sphere.sphere_sums` for the formulas)."""
    if d == 2:
        F, N, _ = circle_field(be, X, w, bounds, Q, qseg, coef)
        return F, N
    X = np.ascontiguousarray(X, dtype=np.float64)
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    qseg = np.ascontiguousarray(qseg, dtype=np.int64)
    order = coef.shape[0] - 1
    m = Q.shape[0]
    nlm = (order + 1) ** 2
    A, B = _recurrence(order)
    starts, ends, spans = _blocks(bounds, sphere_block(X.shape[0], nlm))
    parts = np.empty((starts.shape[0], 4, nlm))
    be._run(_sphere_block_moments, X.shape[0] * nlm, X, w, starts, ends, order, A, B, parts)
    ell = np.repeat(np.arange(order + 1), 2 * np.arange(order + 1) + 1)
    g = 4.0 * math.pi * coef[ell] / (2.0 * ell + 1.0)
    G = np.ascontiguousarray(_pairwise(parts, spans) * g)
    out = np.empty((m, 4))
    be._run(_sphere_eval, m * nlm, Q, qseg, G, order, A, B, out)
    return out[:, 0].copy(), np.ascontiguousarray(out[:, 1:])
