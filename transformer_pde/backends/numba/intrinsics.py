r"""LLVM intrinsics of the Numba kernels: bit casts, ``maxnum`` and a vectorisable exponential.

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

:func:`fmax` is ``llvm.maxnum``: unlike Python's ``max`` (compiled with NaN checks) LLVM
vectorises a maximum reduction over it.

Fast-math flags: :data:`FM_KERNEL` (reassociation, so that LLVM vectorises sums, maximum
reductions and dot products; ``nnan``/``ninf`` are safe because the kernels only ever
see finite numbers) and :data:`FM_EXP` for the exponential, which must not be
reassociated (that would merge the two Cody–Waite constants and lose the extra
precision), only contracted into FMAs.

Importing this module without Numba raises
:class:`~transformer_pde.errors.BackendNotAvailable`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import BackendNotAvailable

try:
    from llvmlite import binding as llvm
    from llvmlite import ir
    from numba import njit
    from numba.core import cgutils, config, types
    from numba.core.codegen import get_host_cpu_features
    from numba.extending import intrinsic, overload
except ImportError as exc:  # pragma: no cover - exercised only without numba
    raise BackendNotAvailable(
        f"backend='numba' needs the numba package ({exc}); pip install numba") from exc

__all__ = ["FM_EXP", "FM_KERNEL", "VECTOR_BITS", "fmax", "vexp", "wide_vectors"]

#: fast-math flags of the kernels: reassociation lets LLVM vectorise the sums, max
#: reductions and dot products; nnan/ninf are safe because the kernels only ever see
#: finite numbers (non-finite biases are filtered out before the call)
FM_KERNEL = {"nnan", "ninf", "nsz", "arcp", "contract", "reassoc"}
#: fast-math flags of the exponential: NOT reassociated (that would merge the two
#: Cody–Waite constants and lose the extra precision), only contracted into FMAs
FM_EXP = {"nnan", "ninf", "nsz", "contract"}


def _bitcast(src: Any, dst: Any, name: str) -> Any:
    """An intrinsic reinterpreting the bits of a ``src`` scalar as the ``dst`` scalar of
    the same width (an LLVM bitcast, vectorisable)."""
    def typer(typingctx, x):
        if x != src:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(dst))
        return dst(src), codegen

    typer.__name__ = name
    return intrinsic(typer)


#: the bits of an int64 as a float64, of a float64 as an int64, of a float32 as an int32
_bits_to_f64 = _bitcast(types.int64, types.float64, "_bits_to_f64")
_f64_to_bits = _bitcast(types.float64, types.int64, "_f64_to_bits")
_f32_to_bits = _bitcast(types.float32, types.int32, "_f32_to_bits")


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
def fmax(typingctx, a, b):
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


#: a 16-lane float32 sum: one ``zmm`` instruction where LLVM's target has AVX-512F
_PROBE_IR = """
define <16 x float> @probe(<16 x float> %a) {
  %b = fadd <16 x float> %a, %a
  ret <16 x float> %b
}
"""


def _target_vector_bits() -> int:
    """512 when the CPU Numba compiles for has AVX-512F, else 256.

    Numba's target is the CPU name ``NUMBA_CPU_NAME`` (else the host's) with the feature
    string ``NUMBA_CPU_FEATURES`` (else the host's features), the same pair that keys
    Numba's on-disk cache, so a cached kernel always matches this choice.  The name does
    not switch features off: ``NUMBA_CPU_NAME=haswell`` alone on an AVX-512 host keeps
    the host's ``+avx512f`` (Numba's default features) and compiles AVX-512 code; with
    ``NUMBA_CPU_FEATURES=""`` the name's own features apply (Haswell: AVX2, FMA).  When
    the feature string names ``avx512f`` it decides; otherwise LLVM is asked: a 512-bit
    vector sum is compiled for that target and its assembly searched for ``zmm``
    registers (about 10 ms, only in that case).
    """
    feats = config.CPU_FEATURES
    if feats is None:
        feats = get_host_cpu_features()
    flags = str(feats).split(",")
    if "+avx512f" in flags or "-avx512f" in flags:
        return 512 if "+avx512f" in flags else 256
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    name = config.CPU_NAME or llvm.get_host_cpu_name()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=name, features=str(feats), opt=0)
    return 512 if "zmm" in machine.emit_assembly(llvm.parse_assembly(_PROBE_IR)) else 256


#: SIMD width (bits) of the wide-head kernels: 512 where the CPU Numba compiles for has
#: AVX-512F, else 256 (AVX2)
VECTOR_BITS = _target_vector_bits()


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorise the calling function's loops with :data:`VECTOR_BITS`-bit vectors.

    LLVM's tuning for AVX-512 CPUs keeps auto-vectorised loops at 256 bits
    (``prefer-vector-width``); on those CPUs this sets the function attribute
    ``"prefer-vector-width"="512"`` on the function being compiled (the body of a
    ``prange`` loop when called there), so that loops such as the exponential of a
    logit tile run on 512-bit registers.  Elsewhere it does nothing.  Called with no
    arguments from compiled code; it computes nothing.
    """
    def codegen(context, builder, signature, args):
        if VECTOR_BITS == 512:
            try:   # llvmlite lists only enumerated attributes; this one is a string pair
                set.add(builder.function.attributes, '"prefer-vector-width"="512"')
            except (TypeError, AttributeError):  # pragma: no cover - other llvmlite
                pass
        return context.get_dummy_value()
    return types.none(), codegen


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


@njit(fastmath=FM_EXP, cache=True)
def _vexp64(x):
    # valid for x <= 0; returns 0 below -708 (results would be subnormal)
    xc = max(x, -708.0)
    t = xc * _LOG2E + _SHIFT                  # not reassociated (FM_EXP): t - _SHIFT is
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


@njit(fastmath=FM_EXP, cache=True)
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


def vexp(x: Any) -> np.ndarray:
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


@overload(vexp, jit_options={"fastmath": FM_EXP})
def _vexp_overload(x):
    if x == types.float32:
        return lambda x: _vexp32(x)
    if x == types.float64:
        return lambda x: _vexp64(x)
    return None


@njit(fastmath=FM_KERNEL, cache=True)
def _vexp_array(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = vexp(x[i])
    return out

