r"""Tiled Numba kernels for wide heads: register-blocked tile products (FlashAttention on the CPU).

Used for projection widths :math:`r \ge` :data:`TILED_MIN_WIDTH` (float64) or
:data:`TILED_MIN_WIDTH_F32` (float32).  When a pair costs :math:`2r` multiply-adds and
:math:`r` is a Transformer's head width (32–128), the streaming kernels
(:mod:`~transformer_pde.backends.numba.streaming`) are bound by their per-query dot
products.  The tiled kernels instead take a tile of up to :data:`QTILE` queries
(:func:`query_tile`) against a block of :data:`KBLOCK` keys and compute the tile's
logits and then its block of
value sums as small matrix products, with the online log-sum-exp of each query between
the two.  Both products go through one register-blocked micro-kernel (:data:`_mk_store`,
:data:`_mk_add`), written as an LLVM intrinsic because Numba's loop vectoriser only
produces dot-product kernels (a horizontal sum per output, seven loads per twelve
FMAs): :data:`MR` rows of the left operand by two SIMD registers of the right one
(:data:`NR` float64 or :data:`NR_F32` float32 columns), :math:`2\,\mathrm{MR}` vector
accumulators, and per reduction step two vector loads, MR broadcasts and 2·MR vector
FMAs — the outer-product form of an optimised BLAS.

The SIMD width :data:`~transformer_pde.backends.numba.intrinsics.VECTOR_BITS` is fixed
when the module is imported, from the CPU Numba compiles for (``NUMBA_CPU_FEATURES``
when set, else the host's features, the same that key Numba's cache): 512 bits where
the CPU has AVX-512F (MR = 8 rows × 2 ``zmm`` registers, 16 accumulators of the 32
registers: NR = 16 float64, NR_F32 = 32 float32 columns), otherwise 256 bits (AVX2:
MR = 6 rows × 2 ``ymm`` registers, 12 accumulators of 16: NR = 8, NR_F32 = 16).  LLVM's
auto-vectoriser keeps 256-bit vectors on AVX-512 CPUs (its ``prefer-vector-width``
tuning): the micro-kernel's explicit vector types put the products in 512-bit
registers, and :func:`~transformer_pde.backends.numba.intrinsics.wide_vectors` lets the
row pass (bias, maximum, exponential, sum) be vectorised at 512 bits too.

All operands are packed once per call (:func:`tiled_layout`) so that the micro-kernel
reads contiguous memory: queries in groups of MR (``q[g*MR:(g+1)*MR].T``, r×MR: one
reduction step reads the MR broadcasts from one cache line instead of MR rows r apart),
keys in panels of NR (``k[p*NR:(p+1)*NR].T``, r×NR) for the logits, values in panels of
NR coordinates (N×NR) for the value sums (a strided N×c array would alias in the L1
sets); a last value panel at most half used is multiplied with one register per row
(:data:`_mk_add_half`).  Memory stays :math:`O((N + M)(r + c))` plus a QTILE×KBLOCK
logit tile and QTILE×c accumulators per thread (in L2).

Keys and values stream from L3 or memory once per query tile, so the tile is large:
each key and value panel is reused by up to :data:`QTILE` queries: 256 with AVX-512,
252 with AVX2 (the largest multiple of MR not above 256, so that :func:`query_tile`,
a multiple of MR, never exceeds it: the buffers are sized by the tile).  The layout is
a pure function of the width (:func:`tile_layout`), so both are tested on any machine.
Tiles of 48 queries left the products 20–30 % below the machine's GEMM rate at r = 64–128 and N =
16384; the logit product also waited on the packed queries coming from L2, which it now
prefetches :data:`PREFETCH` reduction steps ahead.

Queries are sorted by their key ranges
(so a tile's queries see similar keys) and padded to a multiple of MR; keys
and value coordinates are padded with zeros to multiples of NR.  Value sums over one
key block are formed in the input precision and added to float64 accumulators.

Where the time goes: ``benchmarks/heads.py`` reports, per head width and precision, the
pair rate as a fraction of the machine's GEMM rate measured in the same run, and the
nanoseconds per pair of the logit product, the per-row pass (bias, maximum, exponential,
sum, online rescaling) and the value product.  BLAS calls on tiles inside the parallel
loop were measured slower (OpenBLAS starts its own threads on each small product:
0.3–0.6 multiply-adds per CPU-nanosecond) and are not used.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ...errors import ArgumentError
from ...validation import integer
from .intrinsics import FM_KERNEL, VECTOR_BITS, fmax, wide_vectors
from .streaming import (
    apply_phi,
    finish_tile,
    first_tile,
    lse_step,
    lse_totals,
    start_tile,
)

__all__ = [
    "KBLOCK",
    "LAYOUT",
    "MR",
    "NR",
    "NR_F32",
    "QTILE",
    "TILED_MIN_WIDTH",
    "TILED_MIN_WIDTH_F32",
    "TileLayout",
    "pointwise_tiled_kernel",
    "query_layout",
    "query_tile",
    "softmax_tiled_kernel",
    "tile_layout",
    "tiled_layout",
]

class TileLayout(NamedTuple):
    r"""The register tile and the cache tiles of the tiled kernels for one SIMD width.

    ``mr`` queries × two SIMD registers of keys (or value coordinates) per register tile:
    ``nr`` = 2·bits/64 float64 or ``nr_f32`` = 2·bits/32 float32 columns, so
    :math:`2\,\mathrm{mr}` vector accumulators; ``qtile`` the most queries sharing a block
    of ``kblock`` keys, a multiple of ``mr`` (so that :func:`query_tile`, a multiple of
    ``mr``, never exceeds it); ``kblock`` a multiple of ``nr_f32`` (and so of ``nr``).
    """

    vector_bits: int
    mr: int
    nr: int
    nr_f32: int
    qtile: int
    kblock: int


#: queries per tile are at most the largest multiple of ``mr`` not above this
_QTILE_TARGET = 256


def tile_layout(vector_bits: int) -> TileLayout:
    r"""The :class:`TileLayout` of ``vector_bits``-bit SIMD registers (256: AVX2, 512: AVX-512).

    ``mr`` fills the register file with accumulators and leaves room for the operands:
    512 bits (32 ``zmm`` registers): ``mr = 8``, 16 accumulators; 256 bits (16 ``ymm``
    registers): ``mr = 6``, 12 accumulators, 2 registers of keys and 1 for the broadcast.
    ``qtile = mr·⌊256/mr⌋`` (256 for ``mr = 8``, 252 for ``mr = 6``) and ``kblock = 128``.
    A pure function of the width, so that both layouts can be checked on any machine.
    """
    bits = integer("vector_bits", vector_bits)
    if bits not in (256, 512):
        raise ArgumentError(f"vector_bits must be 256 or 512, got {vector_bits!r}")
    mr = 8 if bits == 512 else 6
    return TileLayout(vector_bits=bits, mr=mr, nr=2 * bits // 64, nr_f32=2 * bits // 32,
                      qtile=_QTILE_TARGET // mr * mr, kblock=128)


#: the layout of the SIMD width the kernels are compiled for
#: (:data:`~transformer_pde.backends.numba.intrinsics.VECTOR_BITS`)
LAYOUT = tile_layout(VECTOR_BITS)
#: queries × keys (or value coordinates) of one register tile: MR × NR in float64,
#: MR × NR_F32 in float32 (two SIMD registers of keys per query)
MR, NR, NR_F32 = LAYOUT.mr, LAYOUT.nr, LAYOUT.nr_f32
#: most queries sharing each block of keys (a multiple of MR); :func:`query_tile` picks
#: the tile of a call, at most this
QTILE = LAYOUT.qtile
#: keys per block (the per-thread logit tile is QTILE × KBLOCK)
KBLOCK = LAYOUT.kblock
#: smallest projection width r for which the tiled kernels are used, float64 and float32
#: (measured crossovers, see :meth:`~transformer_pde.backends.numba.NumbaBackend.kernel_for`)
TILED_MIN_WIDTH = 8
TILED_MIN_WIDTH_F32 = 12
#: reduction steps by which the logit product prefetches its packed queries
PREFETCH = 8


def _prefetch(builder: Any, ptr: Any) -> None:
    """Emit ``llvm.prefetch`` of ``ptr`` (read, keep in all cache levels)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                      ir.Constant(i32, 1)])


def _make_micro_kernel(accumulate: bool, nvec: int = 2, prefetch: int = 0):
    """Build the register-blocked micro-kernel as an LLVM intrinsic (see :func:`_mk_store`);
    ``prefetch > 0`` prefetches the left operand's first row ``prefetch`` reduction steps
    ahead."""

    def typer(typingctx, a, a_off, a_rs, a_cs, b, b_off, b_rs, n_red, c, c_off, c_rs):
        if not all(isinstance(x, types.Array) and x.layout == "C" for x in (a, b, c)):
            return None
        dt = a.dtype
        if dt not in (types.float32, types.float64) or b.dtype != dt:
            return None
        # the product is formed in the inputs' precision; an accumulating call may add
        # float32 products into float64 totals
        if not (c.dtype == dt or (accumulate and c.dtype == types.float64)):
            return None
        lanes = VECTOR_BITS // dt.bitwidth
        wide = c.dtype != dt
        sig = types.void(a, types.intp, types.intp, types.intp, b, types.intp, types.intp,
                         types.intp,
                         c, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            a_v, a_off_v, a_rs_v, a_cs_v, b_v, b_off_v, b_rs_v, n_v, c_v, c_off_v, c_rs_v = args
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
            bptr = context.make_array(signature.args[4])(context, builder, b_v).data
            cptr = context.make_array(signature.args[8])(context, builder, c_v).data
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
            accs = [[builder.phi(vty) for _ in range(nvec)] for _ in range(MR)]
            for row in accs:
                for p in row:
                    p.add_incoming(zero, pre)
            if prefetch:                      # the packed query group: one line per step
                ahead = builder.mul(builder.add(ll, ir.Constant(i64, prefetch)), a_cs_v)
                _prefetch(builder, builder.gep(arows[0], [ahead]))
            brow = builder.gep(b0, [builder.mul(ll, b_rs_v)])
            bvec = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, h * lanes)]),
                                                 vty.as_pointer()), align=align)
                    for h in range(nvec)]
            new = []
            for i in range(MR):
                x = builder.load(builder.gep(arows[i], [builder.mul(ll, a_cs_v)]))
                xs = builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(i32, 0)),
                                            undef, splat)
                new.append([builder.call(fma, [xs, bvec[h], accs[i][h]]) for h in range(nvec)])
            ll1 = builder.add(ll, ir.Constant(i64, 1))
            body = builder.block
            ll.add_incoming(ll1, body)
            for i in range(MR):
                for h in range(nvec):
                    accs[i][h].add_incoming(new[i][h], body)
            builder.cbranch(builder.icmp_signed("<", ll1, n_v), loop, done)
            builder.position_at_end(done)
            res = []
            for i in range(MR):
                row = []
                for h in range(nvec):
                    p = builder.phi(vty)
                    p.add_incoming(zero, pre)
                    p.add_incoming(new[i][h], body)
                    row.append(p)
                res.append(row)
            c0 = builder.gep(cptr, [c_off_v])
            sty = wty if wide else vty
            for i in range(MR):
                crow = builder.gep(c0, [builder.mul(c_rs_v, ir.Constant(i64, i))])
                for h in range(nvec):
                    ptr = builder.bitcast(builder.gep(crow, [ir.Constant(i64, h * lanes)]),
                                          sty.as_pointer())
                    val = builder.fpext(res[i][h], wty) if wide else res[i][h]
                    if accumulate:
                        val = builder.fadd(builder.load(ptr, align=8 if wide else align), val)
                    builder.store(val, ptr, align=8 if wide else align)
            return context.get_dummy_value()
        return sig, codegen

    typer.__name__ = ("_mk_add" if accumulate else "_mk_store") + ("" if nvec == 2 else "_half")
    return intrinsic(typer)


#: ``_mk_store(A, a0, ars, acs, B, b0, ldb, L, C, c0, ldc)``:
#: ``C[c0 + i*ldc + j] = sum_{l<L} A[a0 + i*ars + l*acs] * B[b0 + l*ldb + j]`` for
#: ``i < MR``, ``j <`` two SIMD registers (NR float64 or NR_F32 float32): an MR×NR block
#: of a matrix product as 2·MR vector accumulators (outer products: MR broadcasts of
#: ``A`` and two vector loads of ``B`` per MR pairs of FMAs).  ``A`` is read row-major
#: (``acs = 1``) or from a packed group of MR rows (``ars = 1, acs = MR``).  Arrays are
#: C-contiguous, indices flat
#: and unchecked: the callers guarantee the bounds (padded layouts).  Row 0 of ``A`` is
#: prefetched :data:`PREFETCH` reduction steps ahead (a packed query group streams from L2).
_mk_store = _make_micro_kernel(False, 2, PREFETCH)
#: as :data:`_mk_store` but ``C += ...`` (``C`` may be float64 for float32 ``A``, ``B``)
_mk_add = _make_micro_kernel(True)
#: as :data:`_mk_add` for one SIMD register of columns (NR/2): the last value panel
#: when the value width leaves it at most half used
_mk_add_half = _make_micro_kernel(True, 1)


@njit(fastmath=FM_KERNEL, cache=True)
def _tile_logits(S, qpk, i0, nt, kpk, j0, nbp, nr, spans):
    """S[:nt, :nbp] = q[i0:i0+nt] @ k[j0:j0+nbp].T from the packed query groups ``qpk``
    (queries ``g*MR … g*MR + MR - 1`` stored as an r×MR block) and key panels ``kpk``
    (keys ``p*nr … p*nr + nr - 1`` stored as an r×nr block): each panel (r·nr numbers, in
    L1) is used by every group of MR queries of the tile whose keys ``spans[u // MR]``
    (:func:`_group_spans`) it meets; the other entries of S are left as they were."""
    r = qpk.shape[1]
    kb = KBLOCK                           # S is QTILE x KBLOCK: a constant row stride
    for jj in range(0, nbp, nr):
        boff = (j0 + jj) * r                  # panel (j0 + jj) / nr starts at its keys' offset
        for u in range(0, nt, MR):            # query group (i0 + u) / MR starts at (i0 + u) * r
            if spans[u // MR, 0] < jj + nr and spans[u // MR, 1] > jj:
                _mk_store(qpk, (i0 + u) * r, 1, MR, kpk, boff, nr, r, S, u * kb + jj, kb)


@njit(fastmath=FM_KERNEL, cache=True)
def _tile_values(acc, nt, S, vpk, j0, nr, cv, spans):
    """acc[:nt] += S[:nt] @ v[j0:j0+KBLOCK] from the packed value panels ``vpk``
    (value coordinates ``p*nr … p*nr + nr - 1`` of every key, an N×nr block), each group
    of MR rows over its keys ``spans[u // MR] = [a, e)`` only (the row pass leaves S zero
    there outside each row's own range; the products over the other keys of the block
    would add zeros); products in the inputs' precision over one key block, added to the
    float64 totals; only the first ``cv`` value coordinates are needed (a last panel at
    most half used takes :data:`_mk_add_half`)."""
    n_pan, npad = vpk.shape[0], vpk.shape[1]
    cp = n_pan * nr
    kb = KBLOCK                           # S is QTILE x KBLOCK: a constant row stride
    for pan in range(n_pan):
        boff = (pan * npad + j0) * nr
        half = cv - pan * nr <= nr // 2      # at most half of this panel is used
        for u in range(0, nt, MR):
            a, e = spans[u // MR, 0], spans[u // MR, 1]
            if e <= a:
                continue
            if half:
                _mk_add_half(S, u * kb + a, kb, 1, vpk, boff + a * nr, nr, e - a, acc,
                             u * cp + pan * nr, cp)
            else:
                _mk_add(S, u * kb + a, kb, 1, vpk, boff + a * nr, nr, e - a, acc,
                        u * cp + pan * nr, cp)


@njit(fastmath=FM_KERNEL, inline="always")
def _row_range(lo, hi, j0, nbt, nbp):
    """The keys ``[a, e)`` of a block (from key ``j0``, ``nbt`` keys, ``nbp`` padded) that
    the query with range ``[lo, hi)`` sees, ``a <= e`` (``a = e``: none)."""
    a = min(max(lo - j0, 0), nbp)
    return a, max(a, min(hi - j0, nbt))


@njit(fastmath=FM_KERNEL, inline="always")
def _group_spans(spans, lo, hi, i0, nt, j0, nbt, nbp):
    """``spans[u // MR] = [a, e)``: the union of the keys of the block (from ``j0``) that
    the queries of group ``i0 + u … i0 + u + MR - 1`` see (:func:`_row_range`; ``[0, 0)``:
    none).  A group only computes the logits and value sums of its span, so a tile whose
    queries see different keys (two segments of an ensemble, a causal diagonal) does not
    compute every group against every key of the tile."""
    for u in range(0, nt, MR):
        ga, ge = nbp, 0
        for i in range(i0 + u, i0 + u + MR):
            a, e = _row_range(lo[i], hi[i], j0, nbt, nbp)
            if e > a:
                ga = min(ga, a)
                ge = max(ge, e)
        if ge <= ga:
            ga = ge = 0
        spans[u // MR, 0] = ga
        spans[u // MR, 1] = ge


@njit(fastmath=FM_KERNEL, inline="always")
def _tile_block(S, qpk, i0, nt, kpk, j0, stop, nr, lo, hi, spans):
    """The logits of the block of keys from ``j0`` (to at most ``stop``) for the tile's
    queries, each group over its span (:func:`_group_spans`, :func:`_tile_logits`);
    returns ``(nbt, nbp)``, its key count and that count padded to a key panel."""
    nbt = min(KBLOCK, stop - j0)
    nbp = (nbt + nr - 1) // nr * nr
    _group_spans(spans, lo, hi, i0, nt, j0, nbt, nbp)
    _tile_logits(S, qpk, i0, nt, kpk, j0, nbp, nr, spans)
    return nbt, nbp


@njit(fastmath=FM_KERNEL, inline="always")
def _zero_outside(row, a, e, ga, ge):
    """``row[ga:a] = row[e:ge] = 0``: inside its group's span ``[ga, ge)`` (what the value
    product reads), the entries of keys the row's query does not see."""
    zero = row.dtype.type(0.0)
    for j in range(ga, min(a, ge)):
        row[j] = zero
    for j in range(max(e, ga), ge):
        row[j] = zero


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def softmax_tiled_kernel(qpk, kpk, vpk, bias, lo, hi, nr, cv, qtile, n_groups, n_threads, out,
                         lse):
    """Softmax / lse over the keys ``lo[i] <= j < hi[i]`` with logits and value sums as
    register-blocked tile products.

    Shapes: queries packed by :func:`tiled_layout` into ``qpk`` (M/MR, r, MR), M a
    multiple of :data:`MR`; keys packed into ``kpk`` (N·r numbers, N a multiple of
    ``nr`` = NR or NR_F32), ``bias`` (N,), values packed into ``vpk`` (c/nr, N, nr), c
    a multiple of nr (c = 0: lse only) of which the first ``cv`` are used, ``out``
    (M, c).  Queries are taken in tiles of ``qtile`` (a multiple of MR, at most
    :data:`QTILE`: :func:`query_tile`); a tile visits the keys ``[min lo, max hi)`` of
    its queries in the blocks ``[j KBLOCK, (j + 1) KBLOCK)`` of :data:`KBLOCK` keys that
    meet them (the same blocks for a query whatever its tile): the qtile×KBLOCK logits
    (:data:`_mk_store`), the online log-sum-exp of each row over its visible keys
    (:func:`~transformer_pde.backends.numba.streaming.lse_step`; the entries outside the
    row's range are set to 0), then the qtile×c value sums (:data:`_mk_add`, into
    float64 accumulators).  Every query sees its keys in the same order and blocks
    whatever the threads, so results do not depend on the thread count.
    """
    m_q = qpk.shape[0] * MR
    cp = vpk.shape[0] * nr
    zero = qpk.dtype.type(0.0)
    n_tiles = (m_q + qtile - 1) // qtile
    for g in prange(n_groups):
        wide_vectors()
        S = np.empty((qtile, KBLOCK), dtype=qpk.dtype)
        spans = np.empty((qtile // MR, 2), dtype=np.int64)
        acc, m_run, s_run = lse_totals(qtile, max(cp, 1), qpk)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0, nt, start, stop = start_tile(tile, qtile, m_q, KBLOCK, acc, s_run, lo, hi)
            for j0 in range(start, stop, KBLOCK):
                nbt, nbp = _tile_block(S, qpk, i0, nt, kpk, j0, stop, nr, lo, hi, spans)
                for t in range(nt):
                    row = S[t]
                    a, e = _row_range(lo[i0 + t], hi[i0 + t], j0, nbt, nbp)
                    if e > a:
                        x = row[a:e]
                        bb = bias[j0 + a:j0 + e]
                        mb = x[0] + bb[0]
                        for j in range(e - a):
                            y = x[j] + bb[j]
                            x[j] = y
                            mb = fmax(mb, y)
                        lse_step(x, e - a, mb, m_run, s_run, acc, t, lo[i0 + t] >= j0, zero)
                    _zero_outside(row, a, e, spans[t // MR, 0], spans[t // MR, 1])
                if cp > 0:
                    _tile_values(acc, nt, S, vpk, j0, nr, cv, spans)
            finish_tile(i0, nt, lo, hi, m_run, s_run, acc, out, lse)


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def pointwise_tiled_kernel(phi, qpk, kpk, vpk, w, lo, hi, nr, cv, qtile, n_groups, n_threads,
                           out):
    """Tiled ``out[i] = sum_{lo[i] <= j < hi[i]} w_j phi(q_i . k_j) v_j`` (``phi`` 0
    identity, 1 sigmoid, 2 relu; shapes, key blocks, ``cv`` and ``qtile`` as in
    :func:`softmax_tiled_kernel`; ``w`` (N,) padded with zeros)."""
    m_q = qpk.shape[0] * MR
    cp = vpk.shape[0] * nr
    n_tiles = (m_q + qtile - 1) // qtile
    for g in prange(n_groups):
        wide_vectors()
        S = np.empty((qtile, KBLOCK), dtype=qpk.dtype)
        spans = np.empty((qtile // MR, 2), dtype=np.int64)
        acc, _, s_run = lse_totals(qtile, max(cp, 1), qpk)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0, nt, start, stop = start_tile(tile, qtile, m_q, KBLOCK, acc, s_run, lo, hi)
            for j0 in range(start, stop, KBLOCK):
                nbt, nbp = _tile_block(S, qpk, i0, nt, kpk, j0, stop, nr, lo, hi, spans)
                for t in range(nt):
                    row = S[t]
                    a, e = _row_range(lo[i0 + t], hi[i0 + t], j0, nbt, nbp)
                    apply_phi(phi, row[a:e], e - a, w[j0 + a:j0 + e])
                    _zero_outside(row, a, e, spans[t // MR, 0], spans[t // MR, 1])
                _tile_values(acc, nt, S, vpk, j0, nr, cv, spans)
            for t in range(nt):
                for cc in range(cp):
                    out[i0 + t, cc] = acc[t, cc]


def query_tile(m: int, n_threads: int, layout: TileLayout = LAYOUT) -> int:
    r"""Queries per tile for ``m`` (padded) queries on ``n_threads`` threads.

    Fewest rounds, then the smallest tile: with :math:`T` threads taking tiles in turn, a
    thread runs at least :math:`R = \lceil m / (T\,\mathrm{qtile}) \rceil` tiles; the
    tile is the smallest multiple :math:`t` of ``layout.mr`` that splits the queries into
    at most :math:`R\,T` tiles, :math:`t = \mathrm{mr}\,\lceil \lceil m/(RT) \rceil /
    \mathrm{mr} \rceil`, so that no thread runs more than :math:`R` tiles and the tiles
    carry as little padding as that allows.  Since ``layout.qtile`` is a multiple of
    ``mr``, :math:`\mathrm{mr} \le t \le` ``layout.qtile`` (:data:`QTILE`).  A query's
    result does not depend on its tile (each row of a tile product is summed in the same
    order).  ``layout`` defaults to the compiled one (:data:`LAYOUT`).
    """
    m, threads = max(m, 1), max(n_threads, 1)
    n_tiles = -(-m // layout.qtile)
    n_tiles = -(-n_tiles // threads) * threads
    rows = -(-m // n_tiles)
    return max(layout.mr, -(-rows // layout.mr) * layout.mr)


def query_layout(lo: np.ndarray, hi: np.ndarray, n: int) -> tuple:
    """The part of :func:`tiled_layout` that depends on the key ranges alone (a backend
    caches it per :class:`~transformer_pde.backends.ranges.KeyRanges`).

    Queries sorted by their ranges (by ``lo``, then ``hi``; stable, so a prefix mask sorts
    by ``hi``) when some query does not see all ``n`` keys, so that a tile's queries see
    similar keys; ``order = None`` when they are in that order already (unmasked calls,
    sorted prefixes, block-diagonal ensembles: no permutation of the queries in or of the
    results out).  Returns ``(order, lop, hip)``: the permutation, and the ranges in that
    order padded with empty ranges to a multiple of :data:`MR` queries.
    """
    m = lo.shape[0]
    order = None
    if lo.max(initial=0) > 0 or hi.min(initial=0) < n:   # masked: similar ranges share a tile
        order = np.lexsort((hi, lo))
        if (order == np.arange(m)).all():
            order = None
        else:
            lo, hi = lo[order], hi[order]
    mp = -(-m // MR) * MR
    lop = np.zeros(mp, dtype=np.int64)
    lop[:m] = lo
    hip = np.zeros(mp, dtype=np.int64)
    hip[:m] = hi
    return order, lop, hip


#: per-thread packing buffers of :func:`tiled_layout` (``scratch=True``)
_SCRATCH = threading.local()
#: largest packing buffer kept for reuse, in bytes (larger ones are allocated per call)
SCRATCH_MAX_BYTES = 1 << 25


def _empty(scratch: bool, name: str, shape: tuple, dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)``, or with ``scratch`` this thread's buffer ``name``
    reused from call to call (grown when too small, up to :data:`SCRATCH_MAX_BYTES`):
    a fresh array of a few MB is mapped page by page on first write, which measured
    ~0.5 ms per MB on a 2-core VM, a third of an ensemble's field evaluation."""
    size = int(np.prod(shape))
    dtype = np.dtype(dtype)
    if not scratch or size * dtype.itemsize > SCRATCH_MAX_BYTES:
        return np.empty(shape, dtype)
    buf = _SCRATCH.__dict__.get((name, dtype))
    if buf is None or buf.size < size:
        buf = np.empty(size, dtype)
        _SCRATCH.__dict__[(name, dtype)] = buf
    return buf[:size].reshape(shape)


def tiled_layout(dtype: Any, q: np.ndarray, k: np.ndarray, vals: np.ndarray | None,
                 b: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 queries: tuple | None = None, scratch: bool = False) -> tuple:
    """Pad and pack for the tiled kernels.

    Queries sorted and padded by :func:`query_layout` (``queries``: its result for these
    ``lo``, ``hi``, when the caller has it); with ``scratch`` the packed operands are
    this thread's buffers, overwritten by its next ``scratch`` call (a kernel launch
    uses them and lets them go); keys, bias and value coordinates padded with
    zeros to multiples of ``nr`` (:data:`NR` float64, :data:`NR_F32` float32), then packed in the
    operand layouts of the micro-kernels: key panel ``p`` holds
    ``k[p*nr:(p+1)*nr].T`` (r×nr, contiguous), value panel ``p`` holds
    ``v[:, p*nr:(p+1)*nr]`` (N×nr, contiguous), so that the micro-kernels read
    contiguous memory (a strided N×c array would alias in the L1 sets).
    Queries are packed in groups of :data:`MR`: group ``g`` holds
    ``q[g*MR:(g+1)*MR].T`` (r×MR, contiguous).
    Returns ``(order, qpk, kpk, vpk, bp, lop, hip, nr)``: ``order`` the permutation of the
    queries (``None`` when they are not reordered), ``qpk`` (M'/MR, r, MR), ``kpk`` (N'/nr,
    r, nr), ``vpk`` (c'/nr, N', nr), ``bp`` (N',), ``lop``, ``hip`` (M',) with M' the
    padded query count, N' and c' the padded key count and value width.
    """
    m, r = q.shape
    n = k.shape[0]
    nr = NR_F32 if dtype == np.float32 else NR
    order, lop, hip = query_layout(lo, hi, n) if queries is None else queries
    mp = lop.shape[0]
    qpk = _empty(scratch, "q", (mp // MR, r, MR), dtype)
    whole = m // MR                        # complete query groups
    qs = q if order is None else q[order]
    qpk[:whole] = qs[:whole * MR].reshape(whole, MR, r).transpose(0, 2, 1)
    if whole < mp // MR:                   # the last group, padded with zero queries
        qpk[whole:] = 0
        qpk[whole, :, :m - whole * MR] = qs[whole * MR:].T
    npad = -(-n // nr) * nr
    full = n // nr * nr                    # keys of the complete panels
    kpk = _empty(scratch, "k", (npad // nr, r, nr), dtype)
    kpk[:n // nr] = k[:full].reshape(n // nr, nr, r).transpose(0, 2, 1)
    if full < n:
        kpk[n // nr] = 0
        kpk[n // nr, :, :n - full] = k[full:].T
    bp = _empty(scratch, "b", (npad,), dtype)
    bp[:n] = b
    bp[n:] = 0
    c = 0 if vals is None else vals.shape[1]
    vpk = _empty(scratch, "v", (-(-c // nr), npad, nr), dtype)
    for p in range(c // nr):
        vpk[p, :n] = vals[:, p * nr:(p + 1) * nr]
        vpk[p, n:] = 0
    if c % nr:
        vpk[c // nr, :n, :c % nr] = vals[:, c // nr * nr:]
        vpk[c // nr, :n, c % nr:] = 0
        vpk[c // nr, n:] = 0
    return order, qpk, kpk, vpk, bp, lop, hip, nr
