r"""Numba backend: parallel streaming and tiled attention kernels, O(N·d) memory.

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
3. exponentiates :math:`\ell_j - m \le 0` in a tight loop with a branch-free,
   vectorisable exponential (:func:`vexp`, below) and accumulates
   :math:`s \mathrel{+}= \sum_j e^{\ell_j-m}` and
   :math:`a_c \mathrel{+}= \sum_j e^{\ell_j-m} v_{jc}`.

Both kernels take the queries in tiles of :data:`TILE` consecutive queries and
loop over key blocks outside the queries of a tile, so that a block of keys and values
is fetched from memory once per tile (about 2× at N = 1e5, d = 8, where the keys no
longer fit in L2).

At the end :math:`\mathrm{lse} = m + \log s` and :math:`\mathrm{out} = a / s`.  Running
totals are kept in float64 whatever the input precision; the per-block sums use the
input precision (float32 runs twice as many SIMD lanes).

Why a hand-written exponential: without Intel SVML, ``np.exp`` inside a Numba loop is a
scalar libm call that LLVM cannot vectorise, and it bounds the whole kernel (about
1e8 softmax pair interactions per second per core).  :func:`vexp` uses Cody–Waite range
reduction :math:`x = n\ln 2 + r`, :math:`|r|\le \ln 2/2`, a Taylor polynomial of degree 12
(float64; truncation error :math:`< (\ln 2/2)^{13}/13! \approx 2\cdot 10^{-16}`) or 7
(float32; :math:`< 4\cdot 10^{-9}`), and builds :math:`2^n` by writing the exponent bits
(an LLVM bitcast).  :math:`n` is rounded by adding :math:`1.5\cdot 2^{52}` (float32:
:math:`1.5\cdot 2^{23}`), which leaves :math:`n` in the low bits of the sum, so no
float-to-integer conversion is needed (AVX2 has none for float64 vectors: with one,
LLVM extracted the four lanes to scalar conversions and the exponential cost 1.65 ns
instead of 1.28 ns per float64, 0.96 instead of 0.35 ns per float32).  It is only used
on arguments :math:`x \le 0`; below the smallest normal exponent (:math:`x < -708` in
float64, :math:`x < -87` in float32) it returns 0, which changes a sum whose largest
term is 1 by less than :math:`N\cdot 10^{-307}`.
The test suite checks it against ``np.exp`` to a few ulp over that whole range.

Tiled kernels (projection width :math:`r \ge` :data:`TILED_MIN_WIDTH`, FlashAttention on
the CPU).  When a pair costs :math:`2r` multiply-adds and :math:`r` is a Transformer's
head width (32–128), the streaming kernels are bound by their per-query dot products.
The tiled kernels instead take :data:`QTILE` queries against a block of :data:`KBLOCK`
keys and compute the QTILE×KBLOCK logits and then the QTILE×c block of value sums as
small matrix products, with the online log-sum-exp of each query between the two.
Both products go through one register-blocked micro-kernel (:data:`_mk_store`,
:data:`_mk_add`), written as an LLVM intrinsic because Numba's loop vectoriser only
produces dot-product kernels (a horizontal sum per output, seven loads per twelve
FMAs): :data:`MR` = 6 rows of the left operand by two AVX2 registers of the right one
(:data:`NR` = 8 float64 or :data:`NR_F32` = 16 float32 columns), twelve vector
accumulators, and per reduction step two vector loads, six broadcasts and twelve
vector FMAs (``vfmadd231pd ymm``) — the outer-product form of an optimised BLAS.  The
right operands are packed once per call so that the micro-kernel reads contiguous
memory: keys in panels of NR (``k[p*NR:(p+1)*NR].T``, r×NR) for the logits, values in
panels of NR coordinates (N×NR) for the value sums (a strided N×c array would alias in
the L1 sets).  Memory stays :math:`O((N + M)(r + c))` plus a QTILE×KBLOCK logit tile
and QTILE×c accumulators per thread.  Queries are sorted by masked prefix length (so a
tile's queries see similar prefixes) and padded to a multiple of MR; keys and value
coordinates are padded with zeros to multiples of NR.  Value sums over one key block
are formed in the input precision and added to float64 accumulators.

Where the time goes (one thread, N = 2e4, float64, per query–key pair, a loaded 2-core
AMD EPYC (Zen 3) whose OpenBLAS DGEMM reaches about 20 multiply-adds per ns per core):
at r = c = 128 the logit product takes 7 ns (18 multiply-adds per ns), the value
product 8 ns (16 per ns), the bias, maximum, exponential and sum 1.8 ns; at r = 64:
3.4, 3.7 and 1.9 ns.  BLAS calls on tiles inside the parallel loop were measured
slower (OpenBLAS starts its own threads on each small product: 0.3–0.6 multiply-adds
per CPU-nanosecond) and are not used.

Keys of zero weight (bias :math:`-\infty`) are removed before the kernels run (masked
prefix lengths are recounted), so the kernels only see finite numbers and can be
compiled with fast-math reductions; a bias containing NaN or :math:`+\infty` (or
``pointwise`` weights that are not all finite) is handed to the NumPy reference
unchanged, so every backend returns the same non-finite answer.  So are calls whose
logits could come near the float range (:func:`~transformer_pde.backends.numpy_backend.overflow_scale`:
:math:`r\max|q|\max|k| + \max|b|` beyond :math:`2^{-10}` of the largest float), which
the reference computes exactly by a power-of-two rescaling.

Threads: ``NumbaBackend(n_threads=k)`` runs the kernels on ``k`` threads (default: all
of Numba's threads, ``NUMBA_NUM_THREADS``).  Calls from several Python threads are safe
under every threading layer: with ``workqueue`` (not thread-safe in Numba) kernel
launches are serialised by a lock.  Kernels are compiled with ``cache=True``;
one specialisation per dtype (float32, float64) and kernel.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import numpy as np

from . import BackendNotAvailable
from .numpy_backend import NumpyBackend, overflow_scale

try:
    import numba
    from llvmlite import ir
    from numba import njit, prange
    from numba.core import cgutils, types
    from numba.extending import intrinsic, overload
except ImportError as exc:  # pragma: no cover - exercised only without numba
    raise BackendNotAvailable(
        f"backend='numba' needs the numba package ({exc}); pip install numba") from exc

__all__ = [
    "BLOCK",
    "KBLOCK",
    "MR",
    "NR",
    "NR_F32",
    "QTILE",
    "TILE",
    "TILED_MIN_WIDTH",
    "TILED_MIN_WIDTH_F32",
    "NumbaBackend",
    "vexp",
]

logger = logging.getLogger(__name__)

#: keys per streamed block (the per-thread logit buffer holds this many numbers)
BLOCK = 256
#: consecutive queries that share each block of keys (read once, reused from L1)
TILE = 8
#: tiled kernels: queries × keys (or value coordinates) of one register tile: MR × NR in
#: float64, MR × NR_F32 in float32 (two AVX2 registers of keys per query)
MR, NR, NR_F32 = 6, 8, 16
#: tiled kernels: queries sharing each block of keys (a multiple of MR)
QTILE = 48
#: tiled kernels: keys per block (the per-thread logit tile is QTILE × KBLOCK)
KBLOCK = 128
#: smallest projection width r for which the tiled kernels are used, float64 and float32
#: (measured crossovers, see :meth:`NumbaBackend.kernel_for`)
TILED_MIN_WIDTH = 8
TILED_MIN_WIDTH_F32 = 12

# Fast-math flags of the kernels: reassociation lets LLVM vectorise the sums, max
# reductions and dot products; nnan/ninf are safe because the kernels only ever see
# finite numbers (non-finite biases are filtered out before the call).
_FM_KERNEL = {"nnan", "ninf", "nsz", "arcp", "contract", "reassoc"}
# The exponential must NOT be reassociated (that would merge the two Cody–Waite
# constants and lose the extra precision), only contracted into FMAs.
_FM_EXP = {"nnan", "ninf", "nsz", "contract"}

_PHI_CODES = {"identity": 0, "sigmoid": 1, "relu": 2}

#: smallest number of query-key pairs worth giving to one more thread
_MIN_PAIRS_PER_THREAD = 500_000

# answers calls with non-finite biases or weights (see the module docstring)
_REFERENCE = NumpyBackend()

# Numba's "workqueue" threading layer aborts the process (SIGABRT) when two Python
# threads launch parallel kernels at once; "tbb" and "omp" are thread-safe.  Launches
# are serialised by this lock unless the layer in use is known to be thread-safe
# (before the first launch the layer is not chosen yet: locked too).
_LAUNCH_LOCK = threading.Lock()
_THREADSAFE_LAYERS = ("tbb", "omp")


def _needs_reference(q, k, bias) -> bool:
    """Logits that may come near the float range, or non-finite q / k: the kernels
    (compiled for finite numbers) leave such calls to the NumPy reference."""
    if q.size == 0 or k.size == 0:
        return False
    if not (np.isfinite(np.abs(q).max()) and np.isfinite(np.abs(k).max())):
        return True
    return overflow_scale(q, k, bias) != 1.0


def _launch_is_threadsafe() -> bool:
    try:
        return numba.threading_layer() in _THREADSAFE_LAYERS
    except ValueError:         # no parallel region has run yet
        return False


# --------------------------------------------------------------------------- exp
@intrinsic
def _bits_to_f64(typingctx, x):
    """Reinterpret the bits of an int64 as a float64 (LLVM bitcast, vectorisable)."""
    if x != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _bits_to_f32(typingctx, x):
    """Reinterpret the low 32 bits of an integer as a float32."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        val = args[0]
        if x.bitwidth != 32:
            val = builder.trunc(val, ir.IntType(32)) if x.bitwidth > 32 \
                else builder.zext(val, ir.IntType(32))
        return builder.bitcast(val, ir.FloatType())
    return types.float32(x), codegen


@intrinsic
def _f64_to_bits(typingctx, x):
    """The bits of a float64 as an int64 (LLVM bitcast)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _f32_to_bits(typingctx, x):
    """The bits of a float32 as an int32 (LLVM bitcast)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _fmax(typingctx, a, b):
    """``llvm.maxnum`` of two floats of the same type.

    Unlike Python's ``max`` (compiled with NaN checks) LLVM vectorises a reduction over
    this intrinsic; the kernels only pass finite numbers.
    """
    if a != b or a not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        lty = ir.DoubleType() if a == types.float64 else ir.FloatType()
        name = "llvm.maxnum.f64" if a == types.float64 else "llvm.maxnum.f32"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lty, [lty, lty]),
                                            name)
        return builder.call(fn, args)
    return a(a, a), codegen


_LOG2E = 1.4426950408889634
# ln 2 split so that n * _LN2_HI is exact for |n| < 2**11 (Cody–Waite)
_LN2_HI = 0.693147180369123816490
_LN2_LO = 1.90821492927058770002e-10
_LN2_HI32 = np.float32(0.693359375)           # 8 significant bits: n * hi exact in float32
_LN2_LO32 = np.float32(-2.12194440e-4)
# round-to-nearest shifters: for |t| < 2**51 (2**22), t + 1.5*2**52 (1.5*2**23) rounds t to
# an integer n held in the low bits of the sum, so 2**n is built from those bits with
# integer adds and shifts (AVX2 has no vector float64 -> int64 conversion)
_SHIFT = 6755399441055744.0
_SHIFT32 = np.float32(12582912.0)


@njit(fastmath=_FM_EXP, cache=True)
def _vexp64(x):
    # valid for x <= 0; returns 0 below -708 (results would be subnormal)
    xc = max(x, -708.0)
    t = xc * _LOG2E + _SHIFT                  # not reassociated (_FM_EXP): t - _SHIFT is
    n = t - _SHIFT                            # round(xc / ln 2), exactly
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    scale = _bits_to_f64((_f64_to_bits(t) + 1023) << 52)   # low 12 bits of t's: n mod 2**12
    return p * scale if x >= -708.0 else 0.0


@njit(fastmath=_FM_EXP, cache=True)
def _vexp32(x):
    # valid for x <= 0; returns 0 below -87 (results would be subnormal)
    xc = max(x, np.float32(-87.0))
    t = xc * np.float32(_LOG2E) + _SHIFT32
    n = t - _SHIFT32
    r = (xc - n * _LN2_HI32) - n * _LN2_LO32
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    scale = _bits_to_f32((_f32_to_bits(t) + np.int32(127)) << np.int32(23))
    return p * scale if x >= np.float32(-87.0) else np.float32(0.0)


def vexp(x):
    r"""Vectorisable :math:`e^x` for :math:`x \le 0`, in the precision of ``x``.

    Callable from Numba-compiled code (float32 or float64 scalar) and, for testing, from
    Python on a NumPy array.  Exact to a few ulp for :math:`x \in [-708, 0]` (float64)
    or :math:`[-87, 0]` (float32); 0 below that range.  Positive arguments are outside
    its contract (results are not checked).
    """
    a = np.asarray(x)
    if a.dtype != np.float32:
        a = a.astype(np.float64)
    return _vexp_array(np.ascontiguousarray(a).ravel()).reshape(a.shape)


@overload(vexp, jit_options={"fastmath": _FM_EXP})
def _vexp_overload(x):
    if x == types.float32:
        return lambda x: _vexp32(x)
    if x == types.float64:
        return lambda x: _vexp64(x)
    return None


@njit(fastmath=_FM_KERNEL, cache=True)
def _vexp_array(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = vexp(x[i])
    return out


# --------------------------------------------------------------------------- kernels
@njit(fastmath=_FM_KERNEL, cache=True)
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


@njit(fastmath=_FM_KERNEL, cache=True)
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


@njit(fastmath=_FM_KERNEL, cache=True)
def _start_tile(acc, limits, i0, nt):
    """Zero the tile's accumulators; return its longest visible prefix."""
    acc[:] = 0.0
    most = 0
    for t in range(nt):
        most = max(most, limits[i0 + t])
    return most


@njit(cache=True)
def _first_tile(g, n_groups, n_threads):
    """First tile of group ``g`` (which takes every ``n_groups``-th tile from there).

    ``n_groups = n_threads * k``; Numba's static schedule hands thread ``t`` the
    contiguous groups ``t*k … t*k + k - 1``, which this maps to first tiles ``t, t + T,
    … t + (k-1)T``: thread ``t`` then takes every T-th tile, so the threads' tile counts
    differ by at most one and tiles of sorted masked prefixes alternate between them.
    (Contiguous groups with first tile ``g`` gave one thread 14 of 22 tiles.)  Any
    schedule is correct: each tile is one group's, whichever thread runs it.
    """
    k = n_groups // n_threads
    return (g % k) * n_threads + g // k


@njit(parallel=True, fastmath=_FM_KERNEL, cache=True)
def _softmax_kernel(q, kT, vT, bias, limits, n_groups, n_threads, out, lse):
    """Streaming softmax / lse over tiles of :data:`TILE` consecutive queries.

    Within a tile the key blocks are the outer loop, so one block of keys and values is
    read from memory once and reused, from L1, by every query of the tile; each query
    keeps its own running maximum, sum and values and still sees its keys in order, so
    the result of a query does not depend on the tiling or the threads.  Group ``g``
    takes every ``n_groups``-th tile from :func:`_first_tile` (strided groups balance
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
        for tile in range(_first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * TILE
            nt = min(TILE, m_q - i0)
            most = _start_tile(acc, limits, i0, nt)
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
                        mb = _fmax(mb, buf[j])
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


@njit(parallel=True, fastmath=_FM_KERNEL, cache=True)
def _pointwise_kernel(phi, q, kT, vT, w, zb, limits, n_groups, n_threads, out):
    """out[i] = sum_{j < limits[i]} w_j phi(q_i . k_j) v_j; phi: 0 id, 1 sigmoid, 2 relu.

    Same tiling of queries as :func:`_softmax_kernel` (no running maximum is needed).
    """
    m_q = q.shape[0]
    c = vT.shape[0]
    zero = q.dtype.type(0.0)
    one = q.dtype.type(1.0)
    n_tiles = (m_q + TILE - 1) // TILE
    for g in prange(n_groups):
        buf = np.empty(BLOCK, dtype=q.dtype)
        acc = np.empty((TILE, c), dtype=np.float64)
        for tile in range(_first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * TILE
            nt = min(TILE, m_q - i0)
            most = _start_tile(acc, limits, i0, nt)
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


# --------------------------------------------------------------------------- tiled kernels
def _make_micro_kernel(accumulate: bool):
    """Build the register-blocked micro-kernel as an LLVM intrinsic (see :func:`_mk_store`)."""

    def typer(typingctx, a, a_off, a_rs, b, b_off, b_rs, n_red, c, c_off, c_rs):
        if not all(isinstance(x, types.Array) and x.layout == "C" for x in (a, b, c)):
            return None
        dt = a.dtype
        if dt not in (types.float32, types.float64) or b.dtype != dt:
            return None
        # the product is formed in the inputs' precision; an accumulating call may add
        # float32 products into float64 totals
        if not (c.dtype == dt or (accumulate and c.dtype == types.float64)):
            return None
        lanes = 4 if dt == types.float64 else 8
        wide = c.dtype != dt
        sig = types.void(a, types.intp, types.intp, b, types.intp, types.intp, types.intp,
                         c, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            a_v, a_off_v, a_rs_v, b_v, b_off_v, b_rs_v, n_v, c_v, c_off_v, c_rs_v = args
            fty = ir.DoubleType() if dt == types.float64 else ir.FloatType()
            vty = ir.VectorType(fty, lanes)
            wty = ir.VectorType(ir.DoubleType(), lanes)
            i64 = ir.IntType(64)
            i32 = ir.IntType(32)
            align = dt.bitwidth // 8
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                f"llvm.fma.v{lanes}{'f64' if dt == types.float64 else 'f32'}")
            aptr = context.make_array(signature.args[0])(context, builder, a_v).data
            bptr = context.make_array(signature.args[3])(context, builder, b_v).data
            cptr = context.make_array(signature.args[7])(context, builder, c_v).data
            zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * lanes)
            undef = ir.Constant(vty, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            a0 = builder.gep(aptr, [a_off_v])
            b0 = builder.gep(bptr, [b_off_v])
            arows = [builder.gep(a0, [builder.mul(a_rs_v, ir.Constant(i64, i))])
                     for i in range(MR)]
            pre = builder.block
            loop = builder.function.append_basic_block("mk.loop")
            done = builder.function.append_basic_block("mk.done")
            builder.cbranch(builder.icmp_signed(">", n_v, ir.Constant(i64, 0)), loop, done)
            builder.position_at_end(loop)
            ll = builder.phi(i64)
            ll.add_incoming(ir.Constant(i64, 0), pre)
            accs = [[builder.phi(vty) for _ in range(2)] for _ in range(MR)]
            for row in accs:
                for p in row:
                    p.add_incoming(zero, pre)
            brow = builder.gep(b0, [builder.mul(ll, b_rs_v)])
            bvec = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, h * lanes)]),
                                                 vty.as_pointer()), align=align)
                    for h in range(2)]
            new = []
            for i in range(MR):
                x = builder.load(builder.gep(arows[i], [ll]))
                xs = builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(i32, 0)),
                                            undef, splat)
                new.append([builder.call(fma, [xs, bvec[h], accs[i][h]]) for h in range(2)])
            ll1 = builder.add(ll, ir.Constant(i64, 1))
            body = builder.block
            ll.add_incoming(ll1, body)
            for i in range(MR):
                for h in range(2):
                    accs[i][h].add_incoming(new[i][h], body)
            builder.cbranch(builder.icmp_signed("<", ll1, n_v), loop, done)
            builder.position_at_end(done)
            res = []
            for i in range(MR):
                row = []
                for h in range(2):
                    p = builder.phi(vty)
                    p.add_incoming(zero, pre)
                    p.add_incoming(new[i][h], body)
                    row.append(p)
                res.append(row)
            c0 = builder.gep(cptr, [c_off_v])
            sty = wty if wide else vty
            for i in range(MR):
                crow = builder.gep(c0, [builder.mul(c_rs_v, ir.Constant(i64, i))])
                for h in range(2):
                    ptr = builder.bitcast(builder.gep(crow, [ir.Constant(i64, h * lanes)]),
                                          sty.as_pointer())
                    val = builder.fpext(res[i][h], wty) if wide else res[i][h]
                    if accumulate:
                        val = builder.fadd(builder.load(ptr, align=8 if wide else align), val)
                    builder.store(val, ptr, align=8 if wide else align)
            return context.get_dummy_value()
        return sig, codegen

    typer.__name__ = "_mk_add" if accumulate else "_mk_store"
    return intrinsic(typer)


#: ``_mk_store(A, a0, lda, B, b0, ldb, L, C, c0, ldc)``:
#: ``C[c0 + i*ldc + j] = sum_{l<L} A[a0 + i*lda + l] * B[b0 + l*ldb + j]`` for ``i < MR``,
#: ``j <`` two SIMD registers (NR = 8 float64 or 16 float32): an MR×NR block of a matrix
#: product as twelve vector accumulators (outer products: one broadcast of ``A`` and two
#: vector loads of ``B`` per six pairs of FMAs).  Arrays are C-contiguous, indices flat
#: and unchecked: the callers guarantee the bounds (padded layouts).
_mk_store = _make_micro_kernel(False)
#: as :data:`_mk_store` but ``C += ...`` (``C`` may be float64 for float32 ``A``, ``B``)
_mk_add = _make_micro_kernel(True)


@njit(fastmath=_FM_KERNEL, cache=True)
def _tile_logits(S, q, i0, nt, kpk, j0, nbp, nr):
    """S[:nt, :nbp] = q[i0:i0+nt] @ k[j0:j0+nbp].T from the packed key panels ``kpk``
    (keys ``p*nr … p*nr + nr - 1`` stored as an r×nr block): each panel (r·nr numbers, in
    L1) is used by every group of MR queries of the tile."""
    r = q.shape[1]
    kb = S.shape[1]
    for jj in range(0, nbp, nr):
        boff = (j0 + jj) * r                  # panel (j0 + jj) / nr starts at its keys' offset
        for u in range(0, nt, MR):
            _mk_store(q, (i0 + u) * r, r, kpk, boff, nr, r, S, u * kb + jj, kb)


@njit(fastmath=_FM_KERNEL, cache=True)
def _tile_values(acc, nt, S, vpk, j0, nbp, nr):
    """acc[:nt] += S[:nt, :nbp] @ v[j0:j0+nbp] from the packed value panels ``vpk``
    (value coordinates ``p*nr … p*nr + nr - 1`` of every key, an N×nr block); products
    in the inputs' precision over one key block, added to the float64 totals."""
    n_pan, npad = vpk.shape[0], vpk.shape[1]
    cp = n_pan * nr
    kb = S.shape[1]
    for pan in range(n_pan):
        boff = (pan * npad + j0) * nr
        for u in range(0, nt, MR):
            _mk_add(S, u * kb, kb, vpk, boff, nr, nbp, acc, u * cp + pan * nr, cp)


@njit(parallel=True, fastmath=_FM_KERNEL, cache=True)
def _softmax_tiled_kernel(q, kpk, vpk, bias, limits, nr, n_groups, n_threads, out, lse):
    """Softmax / lse with logits and value sums as register-blocked tile products.

    Shapes: ``q`` (M, r) with M a multiple of :data:`MR`; keys packed by
    :meth:`NumbaBackend._tiled_layout` into ``kpk`` (N·r numbers, N a multiple of ``nr``
    = NR or NR_F32), ``bias`` (N,), values packed into ``vpk`` (c/nr, N, nr), c a
    multiple of nr (c = 0: lse only), ``out`` (M, c).  Queries are taken in tiles of :data:`QTILE`; for each block
    of :data:`KBLOCK` keys: the QTILE×KBLOCK logits (:data:`_mk_store`), the online
    log-sum-exp of each row over its visible keys ``j < limits[i]`` (invisible entries
    are set to 0 after the exponential), then the QTILE×c value sums
    (:data:`_mk_add`, into float64 accumulators).  Every query sees its keys in the same
    order and blocks whatever the threads, so results do not depend on the thread count.
    """
    m_q = q.shape[0]
    cp = vpk.shape[0] * nr
    cw = max(cp, 1)
    zero = q.dtype.type(0.0)
    n_tiles = (m_q + QTILE - 1) // QTILE
    for g in prange(n_groups):
        S = np.empty((QTILE, KBLOCK), dtype=q.dtype)
        acc = np.empty((QTILE, cw), dtype=np.float64)
        m_run = np.empty(QTILE, dtype=q.dtype)
        s_run = np.empty(QTILE, dtype=np.float64)
        for tile in range(_first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * QTILE
            nt = min(QTILE, m_q - i0)
            most = _start_tile(acc, limits, i0, nt)
            s_run[:] = 0.0
            for j0 in range(0, most, KBLOCK):
                nbt = min(KBLOCK, most - j0)
                nbp = (nbt + nr - 1) // nr * nr
                _tile_logits(S, q, i0, nt, kpk, j0, nbp, nr)
                for t in range(nt):
                    row = S[t]
                    nb = min(KBLOCK, limits[i0 + t] - j0)
                    if nb <= 0:
                        for j in range(nbp):
                            row[j] = zero
                        continue
                    bb = bias[j0:j0 + nb]
                    mb = row[0] + bb[0]
                    for j in range(nb):
                        x = row[j] + bb[j]
                        row[j] = x
                        mb = _fmax(mb, x)
                    if j0 == 0:
                        m_run[t] = mb
                    elif mb > m_run[t]:
                        scale = float(vexp(m_run[t] - mb))
                        s_run[t] *= scale
                        at = acc[t]
                        for cc in range(cp):
                            at[cc] *= scale
                        m_run[t] = mb
                    mt = m_run[t]
                    sb = zero
                    for j in range(nb):
                        p = vexp(row[j] - mt)
                        row[j] = p
                        sb += p
                    for j in range(nb, nbp):
                        row[j] = zero
                    s_run[t] += sb
                if cp > 0:
                    _tile_values(acc, nt, S, vpk, j0, nbp, nr)
            for t in range(nt):
                i = i0 + t
                if limits[i] <= 0:
                    continue
                lse[i] = m_run[t] + math.log(s_run[t])
                inv = 1.0 / s_run[t]
                for cc in range(cp):
                    out[i, cc] = acc[t, cc] * inv


@njit(parallel=True, fastmath=_FM_KERNEL, cache=True)
def _pointwise_tiled_kernel(phi, q, kpk, vpk, w, limits, nr, n_groups, n_threads, out):
    """Tiled ``out[i] = sum_{j < limits[i]} w_j phi(q_i . k_j) v_j`` (shapes as in
    :func:`_softmax_tiled_kernel`; ``w`` (N,) padded with zeros)."""
    m_q = q.shape[0]
    cp = vpk.shape[0] * nr
    zero = q.dtype.type(0.0)
    one = q.dtype.type(1.0)
    n_tiles = (m_q + QTILE - 1) // QTILE
    for g in prange(n_groups):
        S = np.empty((QTILE, KBLOCK), dtype=q.dtype)
        acc = np.empty((QTILE, max(cp, 1)), dtype=np.float64)
        for tile in range(_first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * QTILE
            nt = min(QTILE, m_q - i0)
            most = _start_tile(acc, limits, i0, nt)
            for j0 in range(0, most, KBLOCK):
                nbt = min(KBLOCK, most - j0)
                nbp = (nbt + nr - 1) // nr * nr
                _tile_logits(S, q, i0, nt, kpk, j0, nbp, nr)
                wb = w[j0:j0 + nbp]
                for t in range(nt):
                    row = S[t]
                    nb = max(0, min(KBLOCK, limits[i0 + t] - j0))
                    if phi == 1:
                        for j in range(nb):
                            z = row[j]
                            e = vexp(-abs(z))
                            row[j] = wb[j] * ((one if z >= zero else e) / (one + e))
                    elif phi == 2:
                        for j in range(nb):
                            row[j] = wb[j] * max(row[j], zero)
                    else:
                        for j in range(nb):
                            row[j] = wb[j] * row[j]
                    for j in range(nb, nbp):
                        row[j] = zero
                _tile_values(acc, nt, S, vpk, j0, nbp, nr)
            for t in range(nt):
                for cc in range(cp):
                    out[i0 + t, cc] = acc[t, cc]


# --------------------------------------------------------------------------- backend
class NumbaBackend:
    """Parallel streaming CPU backend (see the module docstring for the algorithm).

    Parameters
    ----------
    n_threads : int, optional
        Number of threads for the kernels (1 … ``numba.config.NUMBA_NUM_THREADS``);
        default all of them.  Can be changed later with :meth:`set_threads`.
    kernel : {"auto", "tiled", "streaming"}, default "auto"
        Kernel family: ``"auto"`` follows the measured crossover of
        :meth:`kernel_for`; the others force one (for tests and benchmarks).

    Notes
    -----
    Inputs may be float32 or float64 (mixed inputs are promoted like NumPy); outputs
    have the promoted dtype.  Memory use is O((N + M)·(r + c)) for M queries, N keys,
    projection width r and value width c.
    """

    name = "numba"
    xp = np

    def __init__(self, n_threads: int | None = None, kernel: str = "auto"):
        if kernel not in ("auto", "tiled", "streaming"):
            raise ValueError(f"kernel must be 'auto', 'tiled' or 'streaming', got {kernel!r}")
        self.kernel = kernel
        self.n_threads: int | None = None
        self.set_threads(n_threads)

    def set_threads(self, n_threads: int | None) -> None:
        """Use ``n_threads`` threads (``None``: all of Numba's threads)."""
        if n_threads is not None:
            if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)):
                raise TypeError(f"n_threads must be a positive integer or None, "
                                f"got {n_threads!r}")
            top = numba.config.NUMBA_NUM_THREADS
            if not 1 <= n_threads <= top:
                raise ValueError(f"n_threads must be in [1, {top}] "
                                 f"(NUMBA_NUM_THREADS), got {n_threads}")
            n_threads = int(n_threads)
        self.n_threads = n_threads

    def __repr__(self) -> str:
        return f"NumbaBackend(n_threads={self.n_threads}, kernel={self.kernel!r})"

    # ------------------------------------------------------------------ arrays
    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    # ------------------------------------------------------------------ helpers
    def _threads(self) -> int:
        return self.n_threads or numba.config.NUMBA_NUM_THREADS

    def _threads_for(self, work: int) -> int:
        # at least _MIN_PAIRS_PER_THREAD pair interactions (~0.5 ms) per thread: below
        # that, waking threads costs more than it saves, and on a loaded machine a
        # parallel call waits for every thread to be scheduled
        return int(min(self._threads(), max(1, work // _MIN_PAIRS_PER_THREAD)))

    def _run(self, kernel, work, *args):
        n = self._threads_for(work)
        old = numba.get_num_threads()
        if n != old:
            numba.set_num_threads(n)
        try:
            if _launch_is_threadsafe():
                kernel(*args)
            else:
                with _LAUNCH_LOCK:
                    kernel(*args)
        finally:
            if n != old:
                numba.set_num_threads(old)

    def _groups(self, m: int, tile: int, work: int) -> tuple[int, int]:
        """``(n_groups, n_threads)`` for a kernel over ``m`` queries in tiles of ``tile``:
        up to 8 strided groups of tiles per thread (see :func:`_first_tile`), a multiple
        of the threads :meth:`_run` uses for ``work`` pairs."""
        n = self._threads_for(work)
        n_tiles = -(-m // tile)
        per = max(1, min(8, -(-n_tiles // n)))
        return n * per, n

    @staticmethod
    def _prepare(q, k, others, bias, limits):
        """Common dtype, int64 limits, -inf keys removed, keys past every prefix dropped.

        ``bias = None`` gives a zero bias.  Returns ``None`` when ``bias`` holds NaN or
        +inf (caller falls back to NumPy); otherwise ``(dtype, q, k, others, bias,
        limits)`` with ``k`` (N', r) and ``others`` (N', c) not yet laid out for a kernel.
        """
        q = np.asarray(q)
        k = np.asarray(k)
        others = [np.asarray(o) for o in others]
        dtype = np.result_type(q, k, *others, np.float32)
        if dtype not in (np.float32, np.float64):
            dtype = np.dtype(np.float64)
        if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1]:
            raise ValueError(f"q and k must be (M, r) and (N, r), got {q.shape} and {k.shape}")
        n = k.shape[0]
        m = q.shape[0]
        if bias is None:
            b = np.zeros(n, dtype=dtype)
        else:
            b = np.asarray(bias, dtype=dtype)
            if b.shape != (n,):
                raise ValueError(f"bias must have shape ({n},), got {b.shape}")
        if limits is None:
            lim = np.full(m, n, dtype=np.int64)
        else:
            lim = np.asarray(limits).astype(np.int64, copy=False)
            if lim.shape != (m,):
                raise ValueError(f"limits must have shape ({m},), got {lim.shape}")
            lim = np.clip(lim, 0, n)
        finite = np.isfinite(b)
        if not finite.all():
            if np.isnan(b).any() or (b == np.inf).any():
                return None
            # -inf: zero-weight keys contribute nothing
            csum = np.concatenate(([0], np.cumsum(finite, dtype=np.int64)))
            lim = csum[lim]
            b = b[finite]
            k = k[finite]
            others = [o[finite] for o in others]
        top = int(lim.max(initial=0))
        if top < k.shape[0]:                   # keys no query can see are never read
            k, b, others = k[:top], b[:top], [o[:top] for o in others]
        return dtype, np.ascontiguousarray(q, dtype=dtype), k, others, b, lim

    def kernel_for(self, r: int, dtype: Any = np.float64) -> str:
        """``"tiled"`` or ``"streaming"``: the kernel used for projection width ``r``.

        With ``kernel="auto"`` the tiled kernels (register-blocked tile products) are
        used from ``r >=`` :data:`TILED_MIN_WIDTH` = 8 (float64) or
        :data:`TILED_MIN_WIDTH_F32` = 12 (float32): there a pair's ``r`` multiply-adds
        outweigh its exponential, and below it the streaming kernels (one query at a
        time, SIMD across keys) are faster.  Crossovers measured on a 2-core AVX2
        machine (AMD EPYC, Zen 3) at N = 2e4, c = r, one thread, streaming time over
        tiled time: float64 0.87 (r = 2), 1.05 (4), 1.03 (6), 1.53 (8), 1.61 (16);
        float32 0.78 (4), 0.93 (6), 1.04 (8), 1.30 (12), 1.64 (16)
        (``benchmarks/particles.py`` records both kernels for d >= 8).
        """
        if self.kernel != "auto":
            return self.kernel
        top = TILED_MIN_WIDTH_F32 if np.dtype(dtype) == np.float32 else TILED_MIN_WIDTH
        return "tiled" if r >= top else "streaming"

    @staticmethod
    def _tiled_layout(dtype, q, k, vals, b, lim):
        """Pad and pack for the tiled kernels.

        Queries sorted by prefix length (masked calls) and padded to a multiple of MR
        (limit 0); keys, bias and value coordinates padded with zeros to multiples of
        ``nr`` (:data:`NR` float64, :data:`NR_F32` float32), then packed in the
        operand layouts of the micro-kernels: key panel ``p`` holds
        ``k[p*nr:(p+1)*nr].T`` (r×nr, contiguous), value panel ``p`` holds
        ``v[:, p*nr:(p+1)*nr]`` (N×nr, contiguous), so that the micro-kernels read
        contiguous memory (a strided N×c array would alias in the L1 sets).
        Returns ``(order, qp, kpk, vpk, bp, limp, nr)``.
        """
        m, r = q.shape
        n = k.shape[0]
        nr = NR_F32 if dtype == np.float32 else NR
        order = None
        if lim.min(initial=0) < n:             # masked: similar prefixes share a tile
            order = np.argsort(lim, kind="stable")
            q, lim = q[order], lim[order]
        mp = -(-m // MR) * MR
        npad = -(-n // nr) * nr
        qp = np.zeros((mp, r), dtype=dtype)
        qp[:m] = q
        limp = np.zeros(mp, dtype=np.int64)
        limp[:m] = lim
        full = n // nr * nr                    # keys of the complete panels
        kpk = np.zeros((npad // nr, r, nr), dtype=dtype)
        kpk[:n // nr] = k[:full].reshape(n // nr, nr, r).transpose(0, 2, 1)
        if full < n:
            kpk[n // nr, :, :n - full] = k[full:].T
        bp = np.zeros(npad, dtype=dtype)
        bp[:n] = b
        c = 0 if vals is None else vals.shape[1]
        vpk = np.zeros((-(-c // nr), npad, nr), dtype=dtype)
        for p in range(c // nr):
            vpk[p, :n] = vals[:, p * nr:(p + 1) * nr]
        if c % nr:
            vpk[c // nr, :n, :c % nr] = vals[:, c // nr * nr:]
        return order, qp, kpk, vpk, bp, limp, nr

    @staticmethod
    def _unpermute(a, order, m):
        if order is None:
            return a[:m]
        res = np.empty_like(a[:m])
        res[order] = a[:m]
        return res

    # ------------------------------------------------------------------ primitives
    def _reduce(self, q, k, v, bias, limits):
        """Run a softmax kernel; ``v = None`` computes the lse alone."""
        prep = self._prepare(q, k, [] if v is None else [v], bias, limits)
        if prep is None or _needs_reference(prep[1], prep[2], prep[4]):
            return None
        dtype, qc, kk, oo, b, lim = prep
        m, r = qc.shape
        c = 0 if v is None else oo[0].shape[1]
        work = int(lim.sum())
        if self.kernel_for(r, dtype) == "tiled":
            order, qp, kpk, vpk, bp, limp, nr = self._tiled_layout(
                dtype, qc, kk, oo[0] if oo else None, b, lim)
            out = np.zeros((qp.shape[0], vpk.shape[0] * nr), dtype=dtype)
            lse = np.full(qp.shape[0], -np.inf, dtype=dtype)
            self._run(_softmax_tiled_kernel, work, qp, kpk, vpk, bp, limp, nr,
                      *self._groups(qp.shape[0], QTILE, work), out, lse)
            return (self._unpermute(out[:, :c], order, m),
                    self._unpermute(lse, order, m))
        kT = np.ascontiguousarray(kk.T, dtype=dtype)
        vT = (np.ascontiguousarray(oo[0].T, dtype=dtype) if oo
              else np.empty((0, kT.shape[1]), dtype=dtype))
        out = np.zeros((m, c), dtype=dtype)              # no visible mass: out = 0,
        lse = np.full(m, -np.inf, dtype=dtype)           # lse = -inf
        self._run(_softmax_kernel, work, qc, kT, vT, np.ascontiguousarray(b), lim,
                  *self._groups(m, TILE, work), out, lse)
        return out, lse

    def softmax(self, q, k, v, bias, limits):
        """Streaming softmax: ``(out (M, c), lse (M,))``; see :mod:`transformer_pde.backends`."""
        res = self._reduce(q, k, v, bias, limits)
        if res is None:       # NaN / +inf bias or logits that may overflow: the reference
            # defines the answer (it rescales overflowing logits exactly)
            return _REFERENCE.softmax(q, k, v, bias, limits)
        return res

    def lse(self, q, k, bias, limits):
        r"""Streaming :math:`\mathrm{lse}_i = \log\sum_{j<L_i} e^{q_i\cdot k_j + b_j}` (M,).

        The primitive of log-domain Sinkhorn: one pass over the keys per query, O(N)
        memory, ``-inf`` for a query whose visible keys all have weight zero.
        """
        res = self._reduce(q, k, None, bias, limits)
        if res is None:
            return _REFERENCE.lse(q, k, bias, limits)
        return res[1]

    def pointwise(self, phi, q, k, v, w, limits):
        r"""``out_i = sum_{j<L_i} w_j phi(q_i . k_j) v_j`` for ``phi`` in identity/sigmoid/relu."""
        if phi not in _PHI_CODES:
            raise ValueError(f"phi must be one of {sorted(_PHI_CODES)}, got {phi!r}")
        wa = np.asarray(w)
        if not np.all(np.isfinite(wa)):
            return _REFERENCE.pointwise(phi, q, k, v, w, limits)
        if wa.shape != (np.shape(k)[0],):
            raise ValueError(f"w must have shape ({np.shape(k)[0]},), got {wa.shape}")
        dtype, qc, kk, (vv,), _, lim = self._prepare(q, k, [v], None, limits)
        if _needs_reference(qc, kk, None):      # keys past every prefix already dropped
            return _REFERENCE.pointwise(phi, q, k, v, w, limits)
        ww = wa[:kk.shape[0], None].astype(dtype)     # no bias: keys are only truncated
        m, r = qc.shape
        c = vv.shape[1]
        code = np.int64(_PHI_CODES[phi])
        work = int(lim.sum())
        if self.kernel_for(r, dtype) == "tiled":
            order, qp, kpk, vpk, wp, limp, nr = self._tiled_layout(dtype, qc, kk, vv, ww[:, 0],
                                                                  lim)
            out = np.zeros((qp.shape[0], vpk.shape[0] * nr), dtype=dtype)
            self._run(_pointwise_tiled_kernel, work, code, qp, kpk, vpk, wp, limp, nr,
                      *self._groups(qp.shape[0], QTILE, work), out)
            return self._unpermute(out[:, :c], order, m)
        kT = np.ascontiguousarray(kk.T, dtype=dtype)
        vT = np.ascontiguousarray(vv.T, dtype=dtype)
        wc = np.ascontiguousarray(ww[:, 0], dtype=dtype)
        zb = np.zeros(kT.shape[1], dtype=dtype)
        out = np.zeros((m, c), dtype=dtype)
        self._run(_pointwise_kernel, work, code, qc, kT, vT, wc, zb, lim,
                  *self._groups(m, TILE, work), out)
        return out
