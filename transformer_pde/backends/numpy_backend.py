"""NumPy reference backend: dense logits, processed in blocks of queries.

This is the reference every faster backend is tested against, so it favours
obviously-correct code over speed: for a block of queries it forms the full block of
logits, masks invisible keys with ``-inf``, subtracts the row maximum and
exponentiates.  Memory is bounded by processing ``block`` queries at a time
(``block * N`` logits).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NumpyBackend"]

# number of logits held at once (about 32 MB in float64)
_MAX_BLOCK_ELEMS = 4_000_000


def _blocks(m: int, n: int):
    step = max(1, _MAX_BLOCK_ELEMS // max(n, 1))
    for start in range(0, m, step):
        yield slice(start, min(m, start + step))


def _mask(limits: np.ndarray | None, sl: slice, n: int) -> np.ndarray | None:
    if limits is None:
        return None
    return np.arange(n)[None, :] >= limits[sl][:, None]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # stable for large |z|: exp of a non-positive number only
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _shifted_exp(logits: np.ndarray):
    """Row-wise ``p = exp(logits - max)``, ``s = sum(p)`` and ``lse = max + log s``.

    A row with no finite maximum (no visible key, or NaN) gets ``lse = -inf``; otherwise
    the maximal entry contributes 1, so ``s >= 1``.
    """
    mx = logits.max(axis=1, initial=-np.inf)
    ok = np.isfinite(mx)
    mx = np.where(ok, mx, 0.0)
    p = np.exp(logits - mx[:, None])
    s = p.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(ok & (s > 0), mx + np.log(s), -np.inf)
    return p, s, lse


_PHI = {
    "identity": lambda z: z,
    "sigmoid": _sigmoid,
    "relu": lambda z: np.maximum(z, 0.0),
}


class NumpyBackend:
    """Reference backend (see :mod:`transformer_pde.backends` for the primitives)."""

    name = "numpy"
    xp = np

    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def _logits(self, q, k, bias, limits, sl):
        logits = q[sl] @ k.T
        if bias is not None:
            logits = logits + bias[None, :]
        mask = _mask(limits, sl, k.shape[0])
        if mask is not None:
            logits = np.where(mask, -np.inf, logits)
        return logits

    def softmax(self, q, k, v, bias, limits):
        m, n = q.shape[0], k.shape[0]
        dtype = np.result_type(q, k, v)
        out = np.zeros((m, v.shape[1]), dtype=dtype)
        lse = np.full(m, -np.inf, dtype=dtype)
        for sl in _blocks(m, n):
            p, s, lse[sl] = _shifted_exp(self._logits(q, k, bias, limits, sl))
            with np.errstate(invalid="ignore"):
                out[sl] = np.where(np.isfinite(lse[sl])[:, None], (p @ v) / s[:, None], 0.0)
        return out, lse

    def lse(self, q, k, bias, limits):
        m, n = q.shape[0], k.shape[0]
        lse = np.full(m, -np.inf, dtype=np.result_type(q, k))
        for sl in _blocks(m, n):
            lse[sl] = _shifted_exp(self._logits(q, k, bias, limits, sl))[2]
        return lse

    def pointwise(self, phi, q, k, v, w, limits):
        f = _PHI[phi]
        m, n = q.shape[0], k.shape[0]
        out = np.zeros((m, v.shape[1]), dtype=np.result_type(q, k, v))
        for sl in _blocks(m, n):
            kern = f(q[sl] @ k.T) * w[None, :]
            mask = _mask(limits, sl, n)
            if mask is not None:
                kern = np.where(mask, 0.0, kern)
            out[sl] = kern @ v
        return out
