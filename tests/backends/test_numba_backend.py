"""The Numba backend against the NumPy reference (primitives, public API, a full run).

Tolerances, and why
-------------------
* ``vexp``: a few ulp against ``np.exp`` (measured: 2.0 ulp in float64, 0.74 in float32).
* Primitives, float64: ``1e-12`` normwise, relative to the largest visible value
  ``max |v|`` (softmax is a convex combination of the ``v_j``; a relative error per
  entry would be meaningless for an output that is ~0 by cancellation).  Both backends
  round each logit :math:`\\ell = q\\cdot k + b` with an error of order
  :math:`\\varepsilon\\Lambda`, :math:`\\Lambda = \\max \\sum_a |q_a k_a| + |b|`, and a logit
  error :math:`\\delta` changes a softmax weight by the relative amount :math:`\\delta`;
  so for logits beyond 100 the tolerance grows like :math:`\\Lambda/100` (at
  :math:`\\Lambda = 10^3`, 1e-11: still ~20 ulp of the logits).  ``lse``: the same bound
  in absolute terms.  Pointwise kinds: relative to :math:`\\sum_j w_j|\\varphi_{ij}||v_j|`.
* float32: ``1e-5`` relative, same scales, against the float64 reference evaluated on
  the same float32 inputs (float32 rounding of logits of size :math:`\\Lambda \\le 8` is
  :math:`\\le 5\\cdot 10^{-7}`).
* Public ``velocity``: ``1e-12`` relative to ``max |reference|`` plus the head-value scale
  (scores are kept below ~50 by the strategies, so the logit conditioning term is small).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde import backends
from transformer_pde.backends import BackendNotAvailable, get_backend
from transformer_pde.backends.numba import NumbaBackend, vexp
from transformer_pde.backends.numpy_backend import NumpyBackend
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.testing import attentions

NB = NumbaBackend()
REF = NumpyBackend()


# --------------------------------------------------------------------------- vexp
def test_vexp_float64_accuracy():
    x = np.concatenate([-np.linspace(0.0, 708.0, 400_001),
                        -np.random.default_rng(0).exponential(5.0, 100_000).clip(0, 708),
                        [-0.0, -1e-300, -5e-324, -0.34657359, -0.34657360]])
    ref = np.exp(x)
    ulp = np.abs(vexp(x) - ref) / np.spacing(ref)
    assert ulp.max() <= 4.0
    assert vexp(np.array([0.0]))[0] == 1.0
    # below the normal range: exactly 0 (contributions < 1e-307 of the largest term)
    assert np.all(vexp(np.array([-708.5, -745.2, -1e5, -1e300])) == 0.0)


def test_vexp_float32_accuracy():
    x = -np.linspace(0.0, 87.0, 400_001).astype(np.float32)
    got = vexp(x)
    assert got.dtype == np.float32
    ref = np.exp(x.astype(np.float64))
    ulp = np.abs(got - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 2.0
    assert np.all(vexp(np.array([-87.5, -200.0], np.float32)) == 0.0)


# --------------------------------------------------------------------------- primitives
@st.composite
def problems(draw, dtype=np.float64, max_scale=1e3):
    """Queries, keys (with duplicates), values, a bias with -inf (zero weights), prefix
    ranges or None (general ranges: tests/backends/test_ranges.py)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    m = draw(st.integers(1, 40))
    n = draw(st.integers(1, 700))          # > 2 blocks of 256 keys: the rescaling path
    r = draw(st.integers(1, 9))
    c = draw(st.integers(1, 9))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 5.0, 30.0, max_scale]))
    q = rng.normal(size=(m, r)) * np.sqrt(scale)
    k = rng.normal(size=(n, r)) * np.sqrt(scale)
    if draw(st.booleans()):                # duplicate tokens
        k[rng.integers(0, n, n // 2)] = k[rng.integers(0, n)]
    v = rng.normal(size=(n, c))
    bias = np.log(rng.uniform(0.1, 1.0, n))
    if draw(st.booleans()):                # zero weights, possibly all of them in a prefix
        bias[rng.random(n) < draw(st.sampled_from([0.1, 0.5, 0.95]))] = -np.inf
    limits = None
    if draw(st.booleans()):
        hi = rng.integers(0, n + 1, m)
        hi[0] = draw(st.sampled_from([0, n]))
        limits = KeyRanges.prefix(hi, n)

    def cast(a):
        return a.astype(dtype)

    return cast(q), cast(k), cast(v), cast(bias), limits


def _logit_scale(q, k, bias):
    b = np.where(np.isfinite(bias), np.abs(bias), 0.0)
    return float((np.abs(q.astype(float)) @ np.abs(k.astype(float)).T + b).max())


@given(problems())
def test_softmax_and_lse_float64(p):
    q, k, v, bias, limits = p
    out, lse = NB.softmax(q, k, v, bias, limits)
    ref_out, ref_lse = REF.softmax(q, k, v, bias, limits)
    assert out.dtype == lse.dtype == np.float64
    cond = max(1.0, _logit_scale(q, k, bias) / 100.0)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * cond * np.abs(v).max())
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-12,
                               atol=1e-12 * cond)
    np.testing.assert_array_equal(NB.lse(q, k, bias, limits), lse)


@given(problems(np.float32, max_scale=8.0))
def test_softmax_and_lse_float32(p):
    q, k, v, bias, limits = p
    out, lse = NB.softmax(q, k, v, bias, limits)
    assert out.dtype == lse.dtype == np.float32
    f64 = [a.astype(np.float64) for a in (q, k, v, bias)]
    ref_out, ref_lse = REF.softmax(*f64, limits)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-5 * np.abs(v).max())
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("phi", ["identity", "sigmoid", "relu"])
@settings(max_examples=20)
@given(data=st.data())
def test_pointwise(phi, dtype, rtol, data):
    q, k, v, bias, limits = data.draw(problems(dtype, max_scale=50.0))
    w = np.exp(bias.astype(np.float64)).astype(dtype)   # zero weights included
    out = NB.pointwise(phi, q, k, v, w, limits)
    assert out.dtype == dtype
    f64 = [a.astype(np.float64) for a in (q, k, v, w)]
    ref = REF.pointwise(phi, *f64, limits)
    # scale: sum_j w_j (|phi(s_ij)| + sum_a |q_ia k_ja|) |v_j|: the reference applied to
    # absolute values, plus the rounding of the score itself (a dot product that cancels
    # is only accurate relative to sum_a |q_ia k_ja|; phi is 1-Lipschitz)
    s = f64[0] @ f64[1].T
    mag = {"identity": np.abs(s), "sigmoid": 1 / (1 + np.exp(-np.clip(s, -700, 700))),
           "relu": np.maximum(s, 0)}[phi] + np.abs(f64[0]) @ np.abs(f64[1]).T
    if limits is not None:
        mag = np.where(limits.mask(), mag, 0.0)
    scale = (mag * f64[3][None, :]) @ np.abs(f64[2])
    # plus the smallest normal number: results below it carry no relative accuracy (the
    # float32 sigmoid of -100 is subnormal; vexp flushes it to zero)
    tiny = np.finfo(dtype).tiny * (1.0 + f64[3] @ np.abs(f64[2]))
    assert np.all(np.abs(out - ref) <= rtol * scale + tiny)


# --------------------------------------------------------------------------- tiled kernels
TILED = NumbaBackend(kernel="tiled")


@st.composite
def tiled_problems(draw, dtype=np.float64):
    """Widths around Transformer head sizes; M, N, r, c rarely multiples of the tiles."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    m = draw(st.integers(1, 60))
    n = draw(st.integers(1, 300))          # > 2 key blocks of KBLOCK = 128: rescaling
    r = draw(st.sampled_from([1, 5, 16, 17, 31, 64, 130]))
    c = draw(st.sampled_from([0, 1, 3, 16, 33]))
    scale = draw(st.sampled_from([0.0, 1.0, 30.0]))
    q = rng.normal(size=(m, r)) * np.sqrt(scale / max(r, 1))
    k = rng.normal(size=(n, r)) * np.sqrt(scale)
    v = rng.normal(size=(n, c))
    bias = np.log(rng.uniform(0.1, 1.0, n))
    if draw(st.booleans()):
        bias[rng.random(n) < draw(st.sampled_from([0.1, 0.5, 0.95]))] = -np.inf
    limits = None
    if draw(st.booleans()):
        hi = rng.integers(0, n + 1, m)
        hi[0] = draw(st.sampled_from([0, n]))
        limits = KeyRanges.prefix(hi, n)
    return tuple(a.astype(dtype) for a in (q, k, v, bias)) + (limits,)


@settings(max_examples=40)
@given(tiled_problems())
def test_tiled_softmax_matches_reference(p):
    q, k, v, bias, limits = p
    out, lse = TILED.softmax(q, k, v, bias, limits)
    ref_out, ref_lse = REF.softmax(q, k, v, bias, limits)
    assert out.shape == ref_out.shape and out.dtype == lse.dtype == np.float64
    cond = max(1.0, _logit_scale(q, k, bias) / 100.0)
    vmax = np.abs(v).max(initial=0.0)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * cond * vmax)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-12, atol=1e-12 * cond)
    np.testing.assert_array_equal(TILED.lse(q, k, bias, limits), lse)


@settings(max_examples=20)
@given(tiled_problems(np.float32))
def test_tiled_softmax_float32(p):
    q, k, v, bias, limits = p
    out, lse = TILED.softmax(q, k, v, bias, limits)
    assert out.dtype == lse.dtype == np.float32
    ref_out, ref_lse = REF.softmax(*[a.astype(np.float64) for a in (q, k, v, bias)], limits)
    cond = max(1.0, _logit_scale(q, k, bias))
    np.testing.assert_allclose(out, ref_out, rtol=0,
                               atol=1e-5 * cond * np.abs(v).max(initial=0.0))
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5, atol=1e-5 * cond)


@pytest.mark.parametrize("phi", ["identity", "sigmoid", "relu"])
@settings(max_examples=15)
@given(p=tiled_problems())
def test_tiled_pointwise_matches_reference(phi, p):
    q, k, v, bias, limits = p
    w = np.exp(bias)
    out = TILED.pointwise(phi, q, k, v, w, limits)
    ref = REF.pointwise(phi, q, k, v, w, limits)
    assert out.shape == ref.shape
    s = np.abs(q) @ np.abs(k).T
    if limits is not None:
        s = np.where(limits.mask(), s, 0.0)
    scale = (s * w[None, :]) @ np.abs(v) + w @ np.abs(v)
    assert np.all(np.abs(out - ref) <= 1e-12 * scale + 1e-300)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("packed", [False, True])
def test_micro_kernel_against_numpy(dtype, packed):
    """The tiled kernels' LLVM micro-kernel on strided sub-blocks of flat arrays: an
    MR×NR block of A @ B, stored (C) or added to float64 totals (C64), and the
    one-register variant (MR×NR/2, added to C64h); nothing outside the block is
    written.  A is read row-major (element (i, l) at a0 + i*ars + l) or packed (at
    a0 + i + l*acs, acs >= MR).  Exact products of small integers, so equality is exact."""
    import numba

    from transformer_pde.backends.numba import tiled as nbm

    @numba.njit
    def run(A, a0, ars, acs, B, b0, ldb, n, C, c0, ldc, C64, C64h):
        nbm._mk_store(A, a0, ars, acs, B, b0, ldb, n, C, c0, ldc)
        nbm._mk_add(A, a0, ars, acs, B, b0, ldb, n, C64, c0, ldc)
        nbm._mk_add_half(A, a0, ars, acs, B, b0, ldb, n, C64h, c0, ldc)

    mr, nr = nbm.MR, (nbm.NR if dtype == np.float64 else nbm.NR_F32)
    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 130):
        ars, acs = (1, mr + 1) if packed else (n + 3, 1)
        ldb, ldc = nr + 5, nr + 2
        A = rng.integers(-8, 9, 2 + mr * (n + 3) + (mr + 1) * n).astype(dtype)
        B = rng.integers(-8, 9, 7 + max(n, 1) * ldb).astype(dtype)
        C = np.full(1 + mr * ldc, -7.0, dtype=dtype)
        C64 = np.ones(C.size)
        C64h = np.ones(C.size)
        run(A, 2, ars, acs, B, 7, ldb, n, C, 1, ldc, C64, C64h)
        a = np.array([[A[2 + i * ars + l * acs] for l in range(n)] for i in range(mr)],
                     dtype=float).reshape(mr, n)
        b = np.array([B[7 + j * ldb:7 + j * ldb + nr] for j in range(n)]).reshape(n, nr)
        want = a @ b.astype(float)
        for out, width, fill, add in ((C, nr, -7.0, 0.0), (C64, nr, 1.0, 1.0),
                                      (C64h, nr // 2, 1.0, 1.0)):
            blk = np.zeros(C.size, bool)
            for i in range(mr):
                blk[1 + i * ldc:1 + i * ldc + width] = True
            np.testing.assert_array_equal(out[blk].reshape(mr, width), want[:, :width] + add)
            assert np.all(out[~blk] == fill)
    import llvmlite.binding

    # the features Numba compiles for: NUMBA_CPU_FEATURES when set (NUMBA_CPU_NAME=generic
    # sets it to none), else the host's; an empty string with NUMBA_CPU_NAME=haswell (CI's
    # AVX2 pass) gives Haswell's own: AVX2 and FMA, no AVX-512
    if numba.config.CPU_FEATURES is None:
        features = llvmlite.binding.get_host_cpu_features()
    elif numba.config.CPU_FEATURES == "" and numba.config.CPU_NAME == "haswell":
        features = {"avx2": True, "fma": True, "avx512f": False}
    else:
        given = numba.config.CPU_FEATURES.split(",")
        features = {f[1:]: f[0] == "+" for f in given if f[:1] in "+-" and len(f) > 1}
    if features.get("avx2") and features.get("fma"):
        # the reason it exists: packed FMAs on whole SIMD registers (512-bit where the
        # CPU has AVX-512F, else 256-bit), not a scalar or dot-product loop
        assert nbm.VECTOR_BITS == (512 if features.get("avx512f") else 256)
        reg = "zmm" if nbm.VECTOR_BITS == 512 else "ymm"
        asm = "\n".join(run.inspect_asm().values())
        op = "vfmadd231pd" if dtype == np.float64 else "vfmadd231ps"
        assert any(op in line and reg in line for line in asm.splitlines())


def test_tiled_is_the_auto_choice_for_wide_heads():
    # measured crossovers (NumbaBackend.kernel_for): r >= 8 in float64, r >= 12 in float32
    assert NB.kernel_for(64) == NB.kernel_for(8) == "tiled"
    assert NB.kernel_for(7) == NB.kernel_for(2) == "streaming"
    assert NB.kernel_for(11, np.float32) == "streaming"
    assert NB.kernel_for(12, np.float32) == NB.kernel_for(128, np.float32) == "tiled"
    assert NumbaBackend(kernel="streaming").kernel_for(128) == "streaming"


def test_tiled_results_do_not_depend_on_thread_count(rng):
    q, k, v = rng.normal(size=(97, 20)), rng.normal(size=(700, 20)), rng.normal(size=(700, 18))
    limits = KeyRanges.prefix(rng.integers(0, 701, 97), 700)
    one = NumbaBackend(n_threads=1, kernel="tiled").softmax(q, k, v, None, limits)
    many = TILED.softmax(q, k, v, None, limits)
    np.testing.assert_array_equal(one[0], many[0])
    np.testing.assert_array_equal(one[1], many[1])


def test_tiled_masked_query_never_reads_past_its_prefix(rng):
    q, k, v = rng.normal(size=(30, 20)), rng.normal(size=(600, 20)), rng.normal(size=(600, 5))
    limits = KeyRanges.prefix(rng.integers(0, 300, 30), 600)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[300:], v_bad[300:] = np.nan, np.nan
    out, _ = TILED.softmax(q, k_bad, v_bad, None, limits)
    np.testing.assert_allclose(out, REF.softmax(q, k, v, None, limits)[0], rtol=0,
                               atol=1e-12 * np.abs(v).max())


@pytest.mark.parametrize("kind", ["softmax", "l2", "sigmoid"])
@pytest.mark.parametrize("masked", [False, True])
def test_velocity_wide_heads_match_numpy(kind, masked, rng):
    # d = 40 with two heads of width 20 (tiled kernels) and an output matrix
    d = 40
    att = tp.Attention(kind, rng.normal(size=(d, d)) / d, rng.normal(size=(d, d)) / d,
                       rng.normal(size=(d, d)) / np.sqrt(d), heads=2, masked=masked)
    X = rng.normal(size=(333, d))
    pos = rng.random(333) if masked else None
    ref = tp.velocity(att, X, positions=pos, backend="numpy")
    got = tp.velocity(att, X, positions=pos, backend="numba")
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_masked_query_never_reads_past_its_prefix(rng):
    # keys beyond every query's prefix are NaN: a kernel that touched them would say so
    q, k, v = rng.normal(size=(30, 3)), rng.normal(size=(600, 3)), rng.normal(size=(600, 2))
    limits = KeyRanges.prefix(rng.integers(0, 300, 30), 600)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[300:], v_bad[300:] = np.nan, np.nan
    bias = np.zeros(600)
    out, lse = NB.softmax(q, k_bad, v_bad, bias, limits)
    ref_out, ref_lse = REF.softmax(q, k, v, bias, limits)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * np.abs(v).max())
    assert np.all(np.isfinite(out))
    out_pw = NB.pointwise("sigmoid", q, k_bad, v_bad, np.ones(600), limits)
    np.testing.assert_allclose(out_pw, REF.pointwise("sigmoid", q, k, v, np.ones(600), limits),
                               rtol=1e-12, atol=1e-12)


def test_huge_logits_do_not_overflow(rng):
    q = rng.normal(size=(10, 2)) * 40.0
    k = rng.normal(size=(1000, 2)) * 40.0        # logits of several thousand
    v = rng.normal(size=(1000, 2))
    out, lse = NB.softmax(q, k, v, None, None)
    ref_out, ref_lse = REF.softmax(q, k, v, None, None)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    cond = _logit_scale(q, k, np.zeros(1000)) / 100.0
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * cond * np.abs(v).max())


def test_non_finite_bias_matches_reference(rng):
    q, k, v = rng.normal(size=(5, 2)), rng.normal(size=(20, 2)), rng.normal(size=(20, 2))
    bias = np.zeros(20)
    bias[3] = np.nan
    bias[4] = np.inf
    with np.errstate(invalid="ignore"):
        out, lse = NB.softmax(q, k, v, bias, None)
        ref_out, ref_lse = REF.softmax(q, k, v, bias, None)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)


def test_results_do_not_depend_on_thread_count(rng):
    # each query is reduced by exactly one thread in a fixed order: bitwise identical
    q, k, v = rng.normal(size=(97, 4)), rng.normal(size=(900, 4)), rng.normal(size=(900, 3))
    limits = KeyRanges.prefix(np.sort(rng.integers(0, 901, 97)), 900)
    one = NumbaBackend(n_threads=1).softmax(q, k, v, None, limits)
    many = NumbaBackend().softmax(q, k, v, None, limits)
    np.testing.assert_array_equal(one[0], many[0])
    np.testing.assert_array_equal(one[1], many[1])


def test_bad_arguments():
    """Bad arguments raise the package's argument errors, naming the argument; these are
    also ``ValueError`` / ``TypeError``, so code that catches the builtins still does."""
    for kwargs, err, name in (({"n_threads": 0}, ArgumentError, "n_threads"),
                              ({"n_threads": 10**6}, ArgumentError, "n_threads"),
                              ({"n_threads": 1.5}, ArgumentTypeError, "n_threads"),
                              ({"n_threads": True}, ArgumentTypeError, "n_threads"),
                              ({"kernel": "blas"}, ArgumentError, "kernel")):
        with pytest.raises(err, match=name):
            NumbaBackend(**kwargs)
    with pytest.raises(ValueError, match="kernel"):
        NumbaBackend(kernel="blas")
    with pytest.raises(TypeError, match="n_threads"):
        NB.set_threads("2")
    q = np.zeros((3, 2))
    with pytest.raises(ArgumentError, match="phi"):
        NB.pointwise("tanh", q, q, q, np.ones(3), None)
    with pytest.raises(ArgumentError, match="q and k"):
        NB.lse(q, np.zeros((3, 4)), None, None)
    with pytest.raises(ArgumentError, match="bias"):
        NB.lse(q, q, np.zeros(4), None)
    with pytest.raises(ArgumentError, match="ranges"):
        NB.lse(q, q, None, KeyRanges.prefix(np.zeros(2, int), 3))
    with pytest.raises(ArgumentTypeError, match="ranges"):    # raw prefix lengths
        NB.lse(q, q, None, np.zeros(3, int))
    with pytest.raises(ArgumentError, match="w must"):
        NB.pointwise("relu", q, q, q, np.ones(4), None)


def _gpu_stand_in(monkeypatch, state):
    """Make "cupy" a backend that loads ("works"), one whose factory raises
    BackendNotAvailable like CupyBackend without a usable device ("fails"), or no
    registered backend at all ("absent"); whatever GPU this machine has is hidden."""
    monkeypatch.setattr(backends, "_cache", {})
    if state == "absent":
        monkeypatch.delitem(backends.BACKENDS, "cupy", raising=False)
        return
    mod = types.ModuleType("_gpu_stand_in")

    class GPU(NumpyBackend):
        name = "cupy"

    def factory():
        if state == "fails":
            raise BackendNotAvailable("backend='cupy': no usable CUDA device (test stand-in)")
        return GPU()
    mod.factory = factory
    monkeypatch.setitem(sys.modules, "_gpu_stand_in", mod)
    monkeypatch.setitem(backends.BACKENDS, "cupy", "_gpu_stand_in:factory")


@pytest.mark.parametrize("gpu", ["works", "fails", "absent"])
def test_auto_backend_rule(monkeypatch, gpu):
    """backend="auto" for N tokens: "cupy" from N = 20 000 when the GPU backend loads
    (CuPy, driver and device present, kernels pass their self-test), otherwise "numba"
    from N = 64, otherwise "numpy".  The GPU is a stand-in, so the test states the rule
    on every machine, with or without a GPU."""
    _gpu_stand_in(monkeypatch, gpu)
    for n in (None, 0, 10, 63, 64, 5000, 19_999, 20_000, 50_000, 10**6):
        big, mid = n is not None and n >= 20_000, n is not None and n >= 64
        want = "cupy" if big and gpu == "works" else "numba" if mid else "numpy"
        assert get_backend("auto", n_tokens=n).name == want, (gpu, n)
    assert get_backend("numba").name == "numba"
    if gpu == "works":
        return
    # no working GPU: a large problem runs on numba and agrees with the reference
    X = np.random.default_rng(0).normal(size=(20_000, 2))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    out = tp.velocity(att, X, queries=X[:64], backend="auto")     # 20k tokens, 64 queries
    ref = tp.velocity(att, X, queries=X[:64], backend="numpy")
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- public API
KINDS = ["softmax", "linear", "l2", "sigmoid", "relu", "exp"]


@st.composite
def velocity_problems(draw, kind, masked, dtype):
    d = draw(st.sampled_from([2, 4]))
    att = draw(attentions([kind], d, heads=(1, 2), masked=masked, scale=3.0,
                          output_matrix=None))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 300))
    X = rng.normal(size=(n, d)) * draw(st.sampled_from([0.1, 1.0, 2.0]))
    if n > 3 and draw(st.booleans()):
        X[: n // 3] = X[-1]                     # duplicate tokens
    w = rng.uniform(0.0, 1.0, n)
    if draw(st.booleans()):
        w[rng.random(n) < 0.3] = 0.0           # zero weights
    w[rng.integers(0, n)] = 1.0
    pos = None
    if masked:
        pos = rng.choice([0.0, 0.3, 0.5, 1.0], n) if draw(st.booleans()) else rng.random(n)
    return att, X.astype(dtype), w, pos


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12)
@given(data=st.data())
def test_velocity_matches_numpy(kind, masked, data):
    att, X, w, pos = data.draw(velocity_problems(kind, masked, np.float64))
    ref = tp.velocity(att, X, weights=w, positions=pos, backend="numpy")
    got = tp.velocity(att, X, weights=w, positions=pos, backend="numba")
    assert got.dtype == np.float64 and got.shape == X.shape
    fin = np.isfinite(ref)
    assert np.array_equal(fin, np.isfinite(got))
    scale = np.abs(ref[fin]).max(initial=0.0) + np.abs(X).max() * 1e-3
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-12, atol=1e-12 * scale)


@pytest.mark.parametrize("kind", ["softmax", "l2", "sigmoid"])
@settings(max_examples=10)
@given(data=st.data())
def test_velocity_float32_matches_float64_reference(kind, data):
    att, X, w, pos = data.draw(velocity_problems(kind, data.draw(st.booleans()), np.float32))
    got = tp.velocity(att, X, weights=w, positions=pos, backend="numba")
    assert got.dtype == np.float32
    ref = tp.velocity(att, X.astype(np.float64), weights=w, positions=pos, backend="numpy")
    scale = np.abs(ref).max() + np.abs(X).max() * 1e-2
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale)


def test_velocity_at_queries_masked(rng):
    att = tp.Attention("softmax", rng.normal(size=(2, 2)), rng.normal(size=(2, 2)), np.eye(2),
                       masked=True)
    X, pos = rng.normal(size=(200, 2)), rng.random(200)
    Y, qpos = rng.normal(size=(50, 2)), rng.random(50)
    kw = dict(positions=pos, queries=Y, query_positions=qpos)
    np.testing.assert_allclose(tp.velocity(att, X, backend="numba", **kw),
                               tp.velocity(att, X, backend="numpy", **kw), rtol=1e-12,
                               atol=1e-14)


@pytest.mark.parametrize("kind,masked,heads", [("softmax", False, 2), ("l2", True, 1),
                                               ("sigmoid", True, 2)])
def test_simulate_numba_equals_numpy(kind, masked, heads, rng):
    d = 4
    att = tp.Attention(kind, rng.normal(size=(d, d)) / 2, rng.normal(size=(d, d)) / 2,
                       rng.normal(size=(d, d)) / 2, heads=heads, masked=masked)
    X0 = rng.normal(size=(120, d))
    pos = rng.random(120) if masked else None
    runs = [tp.simulate(att, X0, t_max=1.0, dt=0.1, solver="rk4",
                        field=tp.FieldOptions(backend=b), positions=pos)
            for b in ("numpy", "numba")]
    assert runs[0].status == runs[1].status == "ok"
    # 10 RK4 steps of a Lipschitz flow: per-step 1e-15 discrepancies stay far below 1e-11
    np.testing.assert_allclose(runs[1].states, runs[0].states, rtol=1e-11, atol=1e-11)


# --------------------------------------------------------------------------- threads
_CONCURRENT = """
import threading
import numpy as np
import transformer_pde as tp
rng = np.random.default_rng(0)
att = tp.Attention("softmax", np.eye(4), np.eye(4), np.eye(4))
X = rng.normal(size=(1500, 4))
ref = tp.velocity(att, X, backend="numpy")
bad = []
def work():
    for _ in range(4):
        out = tp.velocity(att, X, backend="numba")
        if not np.allclose(out, ref, rtol=1e-12, atol=1e-14):
            bad.append(1)
ts = [threading.Thread(target=work) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
import numba
print(numba.threading_layer(), len(bad))
"""


@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_concurrent_calls_are_safe_under_every_threading_layer(layer):
    # regression: with NUMBA_THREADING_LAYER=workqueue two Python threads launching
    # parallel kernels at once aborted the process (SIGABRT)
    import os
    import subprocess_runs
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_NUM_THREADS="2",
               PYTHONPATH=str(Path(tp.__file__).resolve().parents[1]))
    if layer != "default":
        env["NUMBA_THREADING_LAYER"] = layer
    res = subprocess_runs.run([sys.executable, "-c", _CONCURRENT], env=env,
                              capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    used, n_bad = res.stdout.split()
    assert n_bad == "0"
    if layer != "default":
        assert used == layer
