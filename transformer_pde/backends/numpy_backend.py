r"""NumPy reference backend: dense logits, processed in blocks of queries.

This is the reference every faster backend is tested against, so it favours
obviously-correct code over speed: for a block of queries it forms the full block of
logits, masks the keys outside each query's range :math:`[\mathrm{lo}_i, \mathrm{hi}_i)`
(:class:`~transformer_pde.backends.ranges.KeyRanges`) with ``-inf``, subtracts the row
maximum and exponentiates.  Memory is bounded by processing ``block`` queries at a time
(``block * N`` logits); general ranges restrict a block to the keys its queries span
(block-diagonal ensembles then cost one block of keys per block of queries), prefix
masks keep every key so that their results stay those of the full-width product.
Block-diagonal ranges of equal segments (an ensemble of ``B`` systems of ``n`` tokens,
:meth:`KeyRanges.segments <transformer_pde.backends.ranges.KeyRanges.segments>`) are
computed as batched ``(B, n, n)`` products, no mask needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ScoreOverflowError
from .ranges import KeyRanges, check_ranges

__all__ = ["NumpyBackend", "overflow_scale"]

# number of logits held at once (about 32 MB in float64)
_MAX_BLOCK_ELEMS = 4_000_000


def _blocks(m: int, n: int):
    step = max(1, _MAX_BLOCK_ELEMS // max(n, 1))
    for start in range(0, m, step):
        yield slice(start, min(m, start + step))


def _equal_segments(ranges: KeyRanges | None, m: int, n: int) -> int:
    """The size ``s`` of the segments when ``ranges`` are block-diagonal with equal
    segments (query ``i`` sees exactly the keys ``[s (i // s), s (i // s + 1))``, ``m = n``
    a multiple of ``s``), else 0."""
    if ranges is None or ranges.is_prefix or m != n or m == 0:
        return 0
    s = int(ranges.hi[0])
    if s < 1 or n % s:
        return 0
    lo = np.repeat(np.arange(0, n, s), s)
    return s if np.array_equal(ranges.lo, lo) and np.array_equal(ranges.hi, lo + s) else 0


def _parts(ranges: KeyRanges | None, m: int, n: int, q: np.ndarray, *keyed: Any):
    """The blocks of queries ``(sl, rb, qb, keyed_b)``: query slice, its ranges for the
    keys given (``None``: all visible), its queries and the per-key arrays ``keyed`` it
    needs (``None`` entries stay ``None``).

    Equal block-diagonal segments of ``s`` (:func:`_equal_segments`): whole segments,
    every array reshaped to ``(b, s, ...)`` (a batch of independent systems).  Otherwise
    ``_blocks`` of queries with :meth:`NumpyBackend._span`.
    """
    s = _equal_segments(ranges, m, n)
    if s:
        step = max(1, _MAX_BLOCK_ELEMS // (s * s)) * s
        for a in range(0, m, step):
            sl = slice(a, min(m, a + step))
            b = (sl.stop - a) // s
            yield sl, None, q[sl].reshape(b, s, q.shape[1]), tuple(
                None if x is None else x[sl].reshape((b, s) + x.shape[1:]) for x in keyed)
        return
    for sl in _blocks(m, n):
        rb, kb = NumpyBackend._span(ranges, sl, *keyed)
        yield sl, rb, q[sl], kb


def _mask(rb: KeyRanges | None, n: int) -> np.ndarray | None:
    """The hidden entries (M_block, N) of a block of queries with ranges ``rb``, or ``None``
    (all visible)."""
    if rb is None:
        return None
    j = np.arange(n)[None, :]
    return (j < rb.lo[:, None]) | (j >= rb.hi[:, None])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # stable for large |z|: exp of a non-positive number only
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _shifted_exp(logits: np.ndarray, scale: float = 1.0):
    """Row-wise ``p = exp(scale (logits - max))``, ``s = sum(p)``, ``lse = scale max + log s``.

    ``scale`` (a power of two, 1 unless the true logits overflow, see :func:`overflow_scale`)
    multiplies logits that were computed divided by it.  A row with no finite maximum
    (no visible key) gets ``lse = -inf``; otherwise the maximal entry contributes 1, so
    ``s >= 1``.
    """
    mx = logits.max(axis=-1, initial=-np.inf)
    ok = np.isfinite(mx)
    mx = np.where(ok, mx, 0.0)
    with np.errstate(over="ignore"):
        p = np.exp((logits - mx[..., None]) * scale if scale != 1.0 else logits - mx[..., None])
    s = p.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lse = np.where(ok & (s > 0), mx * scale + np.log(s), -np.inf)
    return p, s, lse


def overflow_scale(q: np.ndarray, k: np.ndarray, bias: np.ndarray | None) -> float:
    r"""A power of two :math:`2^e` such that :math:`q\cdot k/2^e + b/2^e` cannot overflow.

    Logits :math:`q_i\cdot k_j + b_j` of finite inputs can exceed the largest float
    (tokens of 1e155 with unit matrices give 1e310); they are then computed divided by
    :math:`2^e` (exact: a power of two) and the exponentials take
    :math:`2^e(\ell' - \max\ell')`, so the weights are the true ones (the largest logit
    wins by a margin far beyond the float range).  Returns 1.0 when no logit can overflow
    (or when ``q`` or ``k`` already hold NaN or inf: the result is then non-finite anyway).
    """
    fin = np.finfo(np.result_type(q, k, np.float32))
    with np.errstate(over="ignore", divide="ignore"):
        qa = float(np.abs(q).max(initial=0.0))
        ka = float(np.abs(k).max(initial=0.0))
        ba = 0.0
        if bias is not None and bias.size:
            fb = np.abs(bias[np.isfinite(bias)])
            ba = float(fb.max(initial=0.0))
        if qa == 0.0 or ka == 0.0:
            logq = -np.inf
        else:
            logq = np.log2(qa) + np.log2(ka) + np.log2(max(q.shape[1], 1))
        top = max(logq, np.log2(ba) if ba > 0 else -np.inf) + 2.0
    limit = np.log2(float(fin.max)) - 8.0
    if not (top > limit and np.isfinite(top)):     # non-finite inputs: nothing to rescale
        return 1.0
    e = int(np.ceil(top - limit))
    if e >= fin.maxexp:
        raise ScoreOverflowError(
            f"attention scores of the tokens X reach about 2^{top:.0f}, beyond any rescaling of "
            f"{fin.dtype} (max |q| = {qa:.3g}, max |k| = {ka:.3g}): rescale X")
    return float(2.0 ** e)


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

    def _logits(self, qb, k, bias, rb, scale=1.0):
        """Logits of the query block ``qb`` with the keys ``k``; ``rb``: the block's ranges
        (a batch ``(b, s, r)`` of blocks: no ranges)."""
        inv = 1.0 / scale
        kt = np.swapaxes(k, -1, -2)
        logits = (qb * inv) @ kt if scale != 1.0 else qb @ kt
        if bias is not None:
            b = bias[..., None, :]
            logits = logits + (b * inv if scale != 1.0 else b)
        mask = _mask(rb, k.shape[-2])
        if mask is not None:
            logits = np.where(mask, -np.inf, logits)
        return logits

    @staticmethod
    def _span(ranges, sl, *arrays):
        """The ranges of the queries ``sl``, and the keys (per-key ``arrays``) they index.

        General ranges are restricted to the span ``[min lo, max hi)`` of the block and
        shifted into it (block-diagonal ensembles then cost one block of keys per block of
        queries); prefix masks and ``None`` keep every key, so their results stay bit for
        bit those of a full-width product.
        """
        if ranges is None:
            return None, arrays
        part = ranges.take(sl)
        if ranges.is_prefix:
            return part, arrays
        a, b = part.span()
        shifted = KeyRanges(part.lo - a, part.hi - a, b - a, ranges.name)
        return shifted, tuple(None if x is None else x[a:b] for x in arrays)

    def softmax(self, q, k, v, bias, ranges):
        m, n = q.shape[0], k.shape[0]
        ranges = check_ranges(ranges, m, n)
        dtype = np.result_type(q, k, v)
        out = np.zeros((m, v.shape[1]), dtype=dtype)
        lse = np.full(m, -np.inf, dtype=dtype)
        scale = overflow_scale(q, k, bias)
        for sl, rb, qb, (kb, vb, bb) in _parts(ranges, m, n, q, k, v, bias):
            p, s, lb = _shifted_exp(self._logits(qb, kb, bb, rb, scale), scale)
            lse[sl] = lb.reshape(-1)
            with np.errstate(invalid="ignore"):
                # lse = +inf (the normaliser itself overflows) still has visible mass
                out[sl] = np.where((lb > -np.inf)[..., None], (p @ vb) / s[..., None],
                                   0.0).reshape(out[sl].shape)
        return out, lse

    def lse(self, q, k, bias, ranges):
        m, n = q.shape[0], k.shape[0]
        ranges = check_ranges(ranges, m, n)
        lse = np.full(m, -np.inf, dtype=np.result_type(q, k))
        scale = overflow_scale(q, k, bias)
        for sl, rb, qb, (kb, bb) in _parts(ranges, m, n, q, k, bias):
            lse[sl] = _shifted_exp(self._logits(qb, kb, bb, rb, scale), scale)[2].reshape(-1)
        return lse

    def pointwise(self, phi, q, k, v, w, ranges):
        f = _PHI[phi]
        m, n = q.shape[0], k.shape[0]
        ranges = check_ranges(ranges, m, n)
        out = np.zeros((m, v.shape[1]), dtype=np.result_type(q, k, v))
        scale = overflow_scale(q, k, None)
        for sl, rb, qb, (kb, vb, wb) in _parts(ranges, m, n, q, k, v, w):
            s = self._logits(qb, kb, None, None, scale)
            with np.errstate(over="ignore", invalid="ignore"):
                if scale != 1.0 and phi != "sigmoid":
                    # identity and relu are positively homogeneous: phi(2^e s) = 2^e phi(s)
                    kern = f(s) * wb[..., None, :]
                else:
                    kern = f(s * scale if scale != 1.0 else s) * wb[..., None, :]
                mask = _mask(rb, kb.shape[-2])
                if mask is not None:
                    kern = np.where(mask, 0.0, kern)
                res = kern @ vb if scale == 1.0 or phi == "sigmoid" else (kern @ vb) * scale
                out[sl] = res.reshape(out[sl].shape)
        return out
