r"""Tiled Numba kernels for wide heads: register-blocked tile products (FlashAttention on the CPU).

Used for projection widths :math:`r \ge` :data:`TILED_MIN_WIDTH` (float64) or
:data:`TILED_MIN_WIDTH_F32` (float32).  When a pair costs :math:`2r` multiply-adds and
:math:`r` is a Transformer's head width (32–128), the streaming kernels
(:mod:`~transformer_pde.backends.numba.streaming`) are bound by their per-query dot
products.  The tiled kernels instead take :data:`QTILE` queries against a block of
:data:`KBLOCK` keys and compute the QTILE×KBLOCK logits and then the QTILE×c block of
value sums as small matrix products, with the online log-sum-exp of each query between
the two.  Both products go through one register-blocked micro-kernel (:data:`_mk_store`,
:data:`_mk_add`), written as an LLVM intrinsic because Numba's loop vectoriser only
produces dot-product kernels (a horizontal sum per output, seven loads per twelve
FMAs): :data:`MR` = 6 rows of the left operand by two AVX2 registers of the right one
(:data:`NR` = 8 float64 or :data:`NR_F32` = 16 float32 columns), twelve vector
accumulators, and per reduction step two vector loads, six broadcasts and twelve
vector FMAs (``vfmadd231pd ymm``) — the outer-product form of an optimised BLAS.  The
right operands are packed once per call (:func:`tiled_layout`) so that the micro-kernel
reads contiguous memory: keys in panels of NR (``k[p*NR:(p+1)*NR].T``, r×NR) for the
logits, values in panels of NR coordinates (N×NR) for the value sums (a strided N×c
array would alias in the L1 sets).  Memory stays :math:`O((N + M)(r + c))` plus a
QTILE×KBLOCK logit tile and QTILE×c accumulators per thread.  Queries are sorted by
masked prefix length (so a tile's queries see similar prefixes) and padded to a
multiple of MR; keys and value coordinates are padded with zeros to multiples of NR.
Value sums over one key block are formed in the input precision and added to float64
accumulators.

Where the time goes (one thread, N = 2e4, float64, per query–key pair, a 2-core
AMD EPYC (Zen 3) whose OpenBLAS DGEMM reaches about 20 multiply-adds per ns per core):
at r = c = 128 the logit product takes 7 ns (18 multiply-adds per ns), the value
product 8 ns (16 per ns), the bias, maximum, exponential and sum 1.8 ns; at r = 64:
3.4, 3.7 and 1.9 ns.  BLAS calls on tiles inside the parallel loop were measured
slower (OpenBLAS starts its own threads on each small product: 0.3–0.6 multiply-adds
per CPU-nanosecond) and are not used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from .intrinsics import FM_KERNEL, fmax, vexp
from .streaming import first_tile, start_tile

__all__ = [
    "KBLOCK",
    "MR",
    "NR",
    "NR_F32",
    "QTILE",
    "TILED_MIN_WIDTH",
    "TILED_MIN_WIDTH_F32",
    "pointwise_tiled_kernel",
    "softmax_tiled_kernel",
    "tiled_layout",
]

#: queries × keys (or value coordinates) of one register tile: MR × NR in float64,
#: MR × NR_F32 in float32 (two AVX2 registers of keys per query)
MR, NR, NR_F32 = 6, 8, 16
#: queries sharing each block of keys (a multiple of MR)
QTILE = 48
#: keys per block (the per-thread logit tile is QTILE × KBLOCK)
KBLOCK = 128
#: smallest projection width r for which the tiled kernels are used, float64 and float32
#: (measured crossovers, see :meth:`~transformer_pde.backends.numba.NumbaBackend.kernel_for`)
TILED_MIN_WIDTH = 8
TILED_MIN_WIDTH_F32 = 12


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


@njit(fastmath=FM_KERNEL, cache=True)
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


@njit(fastmath=FM_KERNEL, cache=True)
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


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def softmax_tiled_kernel(q, kpk, vpk, bias, limits, nr, n_groups, n_threads, out, lse):
    """Softmax / lse with logits and value sums as register-blocked tile products.

    Shapes: ``q`` (M, r) with M a multiple of :data:`MR`; keys packed by
    :func:`tiled_layout` into ``kpk`` (N·r numbers, N a multiple of ``nr``
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
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * QTILE
            nt = min(QTILE, m_q - i0)
            most = start_tile(acc, limits, i0, nt)
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
                        mb = fmax(mb, x)
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


@njit(parallel=True, fastmath=FM_KERNEL, cache=True)
def pointwise_tiled_kernel(phi, q, kpk, vpk, w, limits, nr, n_groups, n_threads, out):
    """Tiled ``out[i] = sum_{j < limits[i]} w_j phi(q_i . k_j) v_j`` (shapes as in
    :func:`softmax_tiled_kernel`; ``w`` (N,) padded with zeros)."""
    m_q = q.shape[0]
    cp = vpk.shape[0] * nr
    zero = q.dtype.type(0.0)
    one = q.dtype.type(1.0)
    n_tiles = (m_q + QTILE - 1) // QTILE
    for g in prange(n_groups):
        S = np.empty((QTILE, KBLOCK), dtype=q.dtype)
        acc = np.empty((QTILE, max(cp, 1)), dtype=np.float64)
        for tile in range(first_tile(g, n_groups, n_threads), n_tiles, n_groups):
            i0 = tile * QTILE
            nt = min(QTILE, m_q - i0)
            most = start_tile(acc, limits, i0, nt)
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



def tiled_layout(dtype: Any, q: np.ndarray, k: np.ndarray, vals: np.ndarray | None,
                 b: np.ndarray, lim: np.ndarray) -> tuple:
    """Pad and pack for the tiled kernels.

    Queries sorted by prefix length (masked calls) and padded to a multiple of MR
    (limit 0); keys, bias and value coordinates padded with zeros to multiples of
    ``nr`` (:data:`NR` float64, :data:`NR_F32` float32), then packed in the
    operand layouts of the micro-kernels: key panel ``p`` holds
    ``k[p*nr:(p+1)*nr].T`` (r×nr, contiguous), value panel ``p`` holds
    ``v[:, p*nr:(p+1)*nr]`` (N×nr, contiguous), so that the micro-kernels read
    contiguous memory (a strided N×c array would alias in the L1 sets).
    Returns ``(order, qp, kpk, vpk, bp, limp, nr)``: ``order`` the permutation of the
    queries (``None`` when they are not reordered), ``qp`` (M', r), ``kpk`` (N'/nr, r,
    nr), ``vpk`` (c'/nr, N', nr), ``bp`` (N',), ``limp`` (M',) with M' the padded
    query count, N' and c' the padded key count and value width.
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
