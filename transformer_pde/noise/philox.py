r"""The compiled generator of the Brownian streams: Philox-4x64-10 and Box–Muller.

:func:`stream_normals` fills the standard normals of every system's stream at one
refinement level and coarse step in one pass (the layout is documented in
:mod:`~transformer_pde.noise.brownian`); :func:`philox_words` gives the raw blocks (the
tests compare them with NumPy's ``Philox``).  Philox-4x64-10 (Salmon, Moraes, Dror, Shaw,
SC 2011) maps a counter of four 64-bit words and a key of two to four 64-bit words; a
block's two pairs of words become four normals by Box–Muller,
:math:`u = ((w \gg 11) + \tfrac12)\,2^{-53} \in (0, 1)`,
:math:`(\sqrt{-2\log u_0}\cos 2\pi u_1,\ \sqrt{-2\log u_0}\sin 2\pi u_1)`.  This module
imports numba: :mod:`~transformer_pde.noise.brownian` imports it on the first draw.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["philox_words", "stream_normals"]

_U32 = np.uint64(0xFFFFFFFF)
_S32, _S11 = np.uint64(32), np.uint64(11)
#: Philox-4x64 multipliers and Weyl key increments
_M0, _M1 = np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157)
_W0, _W1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B)
_TWO_PI, _ULP = 2.0 * math.pi, 2.0 ** -53


@numba.njit(cache=True, inline="always")
def _mulhilo(a, x):
    """The high and low words of the 128-bit product ``a * x`` (uint64), from 32-bit
    halves."""
    a0, a1, x0, x1 = a & _U32, a >> _S32, x & _U32, x >> _S32
    p01, p10 = a0 * x1, a1 * x0
    mid = ((a0 * x0) >> _S32) + (p01 & _U32) + (p10 & _U32)
    return a1 * x1 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32), a * x


@numba.njit(cache=True, inline="always")
def _philox(x0, y0, x1, y1, k0, k1):
    """Philox-4x64-10 of the counter ``(x0, y0, x1, y1)`` under the key ``(k0, k1)``."""
    for r in range(10):
        if r:
            k0, k1 = k0 + _W0, k1 + _W1
        hi0, lo0 = _mulhilo(_M0, x0)
        hi1, lo1 = _mulhilo(_M1, x1)
        x0, y0, x1, y1 = hi1 ^ y0 ^ k0, lo1, hi0 ^ y1 ^ k1, lo0
    return x0, y0, x1, y1


@numba.njit(cache=True, inline="always")
def _box_muller(w0, w1):
    """Two standard normals from two 64-bit words."""
    u0 = (float(w0 >> _S11) + 0.5) * _ULP
    u1 = (float(w1 >> _S11) + 0.5) * _ULP
    radius, angle = math.sqrt(-2.0 * math.log(u0)), _TWO_PI * u1
    return radius * math.cos(angle), radius * math.sin(angle)


@numba.njit(cache=True)
def philox_words(counters, key, out):   # pragma: no cover - compiled
    """``out[i]`` (uint64 (n, 4)) = the Philox block of ``counters[i]`` under ``key``."""
    for i in range(counters.shape[0]):
        w = _philox(counters[i, 0], counters[i, 1], counters[i, 2], counters[i, 3],
                    key[0], key[1])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = w[0], w[1], w[2], w[3]


@numba.njit(cache=True)
def stream_normals(dims, rows, first, level, step, key, out):   # pragma: no cover - compiled
    """Fill ``out`` (flat, ``D * rows``) with the normals of the streams of the systems
    ``first``, ``first + 1``, ... (``dims[s]`` coordinates each; ``first``, ``level``,
    ``step`` uint64) at ``(level, step)``: system ``s``'s numbers are consecutive, number
    ``q`` (its block ``q // 4`` has the counter ``(q // 4, first + s, level, step)``) at
    ``start_s * rows + q`` (``start_s`` its first column), so ``out.reshape(D, rows).T``
    has number ``q = i R + r`` of a system at row ``r`` of its column ``i``."""
    start = 0
    for s in range(dims.shape[0]):
        count = dims[s] * rows
        g = first + np.uint64(s)
        for c in range((count + 3) // 4):
            w = _philox(np.uint64(c), g, level, step, key[0], key[1])
            z0, z1 = _box_muller(w[0], w[1])
            z2, z3 = _box_muller(w[2], w[3])
            q = 4 * c
            for z in (z0, z1, z2, z3):
                if q < count:
                    out[start + q] = z
                q += 1
        start += count
