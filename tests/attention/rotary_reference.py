"""A dense, loop-by-loop reference of attention with rotary positions and grouped heads.

Written from the formulas only (explicit 2x2 rotations of each coordinate pair, a Python
loop over heads, queries and keys); it reads no parameter through the library, so it can
check :meth:`Attention.at`'s head layout and the rotation glue of ``fields.py`` alike.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["expand_groups", "reference_field", "rotation"]


def rotation(p, m, r, base, span, pairing):
    """The m x m matrix R(p): pair k rotated by span * p * base**(-2k/r), the rest fixed."""
    R = np.eye(m)
    for k in range(r // 2):
        a, b = (2 * k, 2 * k + 1) if pairing == "interleaved" else (k, k + r // 2)
        theta = span * p * base ** (-2.0 * k / r)
        c, s = math.cos(theta), math.sin(theta)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def expand_groups(M, heads, kv_heads, m):
    """Rows of the G key/value heads repeated for the H query heads (block g -> H/G copies)."""
    if M is None:
        return None
    per = heads // kv_heads
    return np.concatenate([M[(h // per) * m:(h // per + 1) * m] for h in range(heads)])


def reference_field(kind, X, Q, K, V, *, heads=1, kv_heads=None, beta=1.0, l2_beta=0.5,
                    b_Q=None, b_K=None, b_V=None, W_O=None, b_O=None, rotary=None,
                    positions=None, weights=None, masked=False):
    """Field of ``softmax`` / ``l2`` / ``exp`` attention; ``rotary`` = (base, span, dim, pairing)."""
    N, d = X.shape
    w = np.full(N, 1.0 / N) if weights is None else np.asarray(weights) / np.sum(weights)
    m = Q.shape[0] if heads == 1 else d // heads
    G = heads if kv_heads is None else kv_heads
    per = heads // G
    out = np.zeros((N, d))
    for h in range(heads):
        g = h // per
        qr = slice(h * m, (h + 1) * m)
        kr = slice(g * m, (g + 1) * m)
        vr = slice(0, d) if heads == 1 else kr
        orow = slice(0, d) if heads == 1 else qr

        def proj(M, b, x, rows):
            y = M[rows] @ x
            return y if b is None else y + b[rows]

        def rot(p):
            if rotary is None:
                return np.eye(m)
            base, span, dim, pairing = rotary
            return rotation(p, m, m if dim is None else dim, base, span, pairing)

        for i in range(N):
            q = rot(positions[i] if rotary else 0.0) @ proj(Q, b_Q, X[i], qr)
            s, vis = np.empty(N), np.ones(N, dtype=bool)
            for j in range(N):
                k = rot(positions[j] if rotary else 0.0) @ proj(K, b_K, X[j], kr)
                s[j] = beta * (q @ k) if kind != "l2" else -l2_beta * np.sum((q - k) ** 2)
                vis[j] = not masked or positions[j] <= positions[i]
            vals = np.array([proj(V, b_V, X[j], vr) for j in range(N)])
            a = np.where(vis, w * np.exp(s - s[vis].max()), 0.0)
            if kind == "exp":
                out[i, orow] = (a @ vals) * math.exp(s[vis].max())
            else:
                out[i, orow] = (a @ vals) / a.sum()
    if W_O is not None:
        out = out @ W_O.T
    return out if b_O is None else out + b_O
