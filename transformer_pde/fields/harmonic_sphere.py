r"""Real spherical harmonics on :math:`S^2` by stable recurrences, and the harmonic sums
of :mod:`~transformer_pde.fields.harmonic` on the sphere (NumPy).

The real orthonormal harmonics of degree :math:`l` are
:math:`Y_{l0} = \bar P_l^0(t)`, :math:`Y_{lm}^{c} = \sqrt2\,\bar P_l^m(t)\cos m\varphi`,
:math:`Y_{lm}^{s} = \sqrt2\,\bar P_l^m(t)\sin m\varphi` (:math:`t = \cos\vartheta = x_3`),
with the orthonormalised associated Legendre functions (no Condon–Shortley phase: every
product :math:`Y_{lm}(x)Y_{lm}(y)` is unchanged by a sign per :math:`(l, m)`)

.. math::
    \bar P_0^0 = \tfrac{1}{\sqrt{4\pi}},\quad
    \bar P_m^m = \sqrt{\tfrac{2m+1}{2m}}\; s\, \bar P_{m-1}^{m-1},\quad
    \bar P_{m+1}^m = \sqrt{2m+3}\; t\, \bar P_m^m,\quad
    \bar P_l^m = a_{lm}\big(t\,\bar P_{l-1}^m - b_{lm}\bar P_{l-2}^m\big),

:math:`a_{lm} = \sqrt{(4l^2-1)/(l^2-m^2)}`,
:math:`b_{lm} = \sqrt{((l-1)^2-m^2)/(4(l-1)^2-1)}`, :math:`s = \sqrt{x_1^2+x_2^2}` (the
sectoral values :math:`\propto s^m` may underflow to zero near the poles, where they are
negligible), and :math:`\cos m\varphi + i\sin m\varphi = u^m`,
:math:`u = (x_1 + ix_2)/s`.  The addition theorem
:math:`\sum_m Y_{lm}(x)Y_{lm}(y) = \frac{2l+1}{4\pi}P_l(x\cdot y)` then gives the kernel
sums.  Layout: degree :math:`l` occupies rows :math:`l^2 \dots (l+1)^2 - 1` in the order
:math:`m = 0, (1, c), (1, s), \dots, (l, c), (l, s)`.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["real_harmonics", "sphere_sums"]

_CHUNK_ELEMENTS = 1 << 21


def real_harmonics(X: np.ndarray, L: int) -> np.ndarray:
    r"""The real orthonormal spherical harmonics of degrees :math:`\le L` at the unit
    rows of ``X`` (n, 3): an array ((L+1)^2, n).

    Examples
    --------
    >>> import numpy as np
    >>> Y = real_harmonics(np.array([[0.0, 0.0, 1.0]]), 1)
    >>> np.allclose(Y[:, 0] * np.sqrt(4 * np.pi), [1, np.sqrt(3), 0, 0])
    True
    """
    n = X.shape[0]
    t = X[:, 2]
    xy = X[:, 0] + 1j * X[:, 1]
    s = np.abs(xy)
    u = np.where(s > 0, xy / np.where(s > 0, s, 1.0), 1.0)
    Y = np.empty(((L + 1) ** 2, n))
    pmm = np.full(n, 1.0 / math.sqrt(4.0 * math.pi))
    um = np.ones(n, dtype=np.complex128)
    for m in range(L + 1):
        if m:
            pmm = pmm * (math.sqrt((2 * m + 1) / (2.0 * m)) * s)
            um = um * u
        cs = (math.sqrt(2.0) * um.real, math.sqrt(2.0) * um.imag) if m else None
        p2, p1 = None, pmm
        for l in range(m, L + 1):
            if l == m + 1:
                p2, p1 = p1, math.sqrt(2 * m + 3) * t * p1
            elif l > m + 1:
                a = math.sqrt((4.0 * l * l - 1.0) / (l * l - m * m))
                b = math.sqrt(((l - 1.0) ** 2 - m * m) / (4.0 * (l - 1.0) ** 2 - 1.0))
                p2, p1 = p1, a * (t * p1 - b * p2)
            if m == 0:
                Y[l * l] = p1
            else:
                row = l * l + 2 * m - 1
                Y[row] = p1 * cs[0]
                Y[row + 1] = p1 * cs[1]
    return Y


def _degree_weights(coef: np.ndarray) -> np.ndarray:
    r"""Per row of the layout: :math:`4\pi\,\mathrm{coef}_l/(2l+1)`."""
    L = coef.shape[0] - 1
    ell = np.repeat(np.arange(L + 1), 2 * np.arange(L + 1) + 1)
    return 4.0 * math.pi * coef[ell] / (2.0 * ell + 1.0)


def sphere_moments(X: np.ndarray, w: np.ndarray, L: int) -> np.ndarray:
    r"""``M[c, lm] = sum_j c_j Y_lm(x_j)`` for the four measures ``c = w, w x_1, w x_2,
    w x_3``: chunks summed pairwise along the contiguous axis, then the chunks' sums
    summed pairwise."""
    n = X.shape[0]
    nlm = (L + 1) ** 2
    chunk = max(64, _CHUNK_ELEMENTS // (4 * nlm))
    parts = []
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        Y = real_harmonics(X[a:b], L)
        cw = np.concatenate([w[a:b, None], w[a:b, None] * X[a:b]], axis=1)  # (c, 4)
        parts.append((Y[None, :, :] * cw.T[:, None, :]).sum(axis=2))
    if not parts:
        return np.zeros((4, nlm))
    return np.ascontiguousarray(np.moveaxis(np.array(parts), 0, -1)).sum(axis=-1)


def sphere_sums(X: np.ndarray, w: np.ndarray, bounds: list, Q: np.ndarray,
                qseg: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Scaled :math:`F_w` (M,) and numerator (M, 3) at the unit rows of ``Q``:
    :math:`F_c(x) = \sum_{l} \mathrm{coef}_l \frac{4\pi}{2l+1}\sum_m Y_{lm}(x)M_{c,lm}`."""
    L = coef.shape[0] - 1
    nlm = (L + 1) ** 2
    g = _degree_weights(coef)
    G = np.stack([sphere_moments(X[s:e], w[s:e], L) for s, e in bounds]) * g   # (B, 4, nlm)
    m = Q.shape[0]
    out = np.empty((m, 4))
    chunk = max(16, _CHUNK_ELEMENTS // (4 * nlm))
    for s0 in range(0, m, chunk):
        s1 = min(m, s0 + chunk)
        Yq = np.ascontiguousarray(real_harmonics(Q[s0:s1], L).T)        # (c, nlm)
        out[s0:s1] = (Yq[:, None, :] * G[qseg[s0:s1]]).sum(axis=2)
    return out[:, 0].copy(), np.ascontiguousarray(out[:, 1:])
