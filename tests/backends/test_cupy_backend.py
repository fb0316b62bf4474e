"""The CuPy GPU backend, tested on every machine: its CUDA kernels compiled for the CPU.

What runs where
---------------
* CPU (every CI run, needs a C++ compiler, else skipped with the reason): the very
  ``kernels/attention.cu`` the GPU runs, compiled as C++ with ``kernels/cpu_shim.h``
  (``__global__``/``__shared__``/``__syncthreads``/``threadIdx``/``blockIdx`` as C++
  threads and a barrier) and driven by the backend's own host code with NumPy standing in
  for CuPy (:class:`~transformer_pde.backends.cuda_cpu.CpuLauncher`).  Checked against the
  dense references of :mod:`transformer_pde.testing.references`: shapes not multiple of
  the tiles, one or several query blocks, the key split and its merge, key ranges (prefix
  masks, segments, sliding windows, single keys, empty ranges, arbitrary ranges in any
  query order), -inf biases, every kind through ``velocity``, Sinkhorn through ``lse``,
  float32 and float64; a query's result bit for bit independent of its block mates.
* CPU, pure Python: the split-merge formulas, the dense fallback, detection with CuPy
  absent or failing (monkeypatched), ``"auto"`` never choosing a failing GPU.
* CUDA toolchain (NVRTC from the ``nvidia-cuda-nvrtc-cu12`` wheel of the ``[cuda-check]``
  extra, or a system ``libnvrtc``; ``ptxas``): the kernels compile for sm_90 without register
  spills; skipped with the reason otherwise.
* GPU (``-m gpu``): the real backend against the reference.

Not covered without a GPU: the MUFU ``ex2.approx`` exponential (relative error
< 2^-22, the CPU build uses ``exp2f``), ``__frcp_rn``, FMA contraction and the
performance targets (``benchmarks/gpu.py``).

Tolerances are those of ``test_numba_backend.py`` (same reasoning): float64 ``1e-12``
relative to ``max |v|`` times the logit conditioning ``max(1, Lambda / 100)``; float32
``1e-5`` against the float64 reference on the same inputs (per-tile float32 partial sums
of at most 64 terms, float64 totals).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import subprocess_runs
import transformer_pde as tp
from transformer_pde import backends
from transformer_pde.backends import cupy_backend as cb
from transformer_pde.backends import get_backend
from transformer_pde.backends.cuda_cpu import CpuLauncher, find_compiler
from transformer_pde.backends.numpy_backend import NumpyBackend
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.errors import ArgumentError, ArgumentTypeError, BackendNotAvailable
from transformer_pde.testing import attentions, references

REF = references   # dense softmax / lse / pointwise
DTYPES = (np.float32, np.float64)
WIDTHS = (1, 2, 3, 8, 16)


def _kernel_names():
    """Every specialisation the CPU tests launch (compiled once, in parallel)."""
    names = []
    pairs = {(d, d) for d in WIDTHS} | {(r, c) for c in (1, 2, 3) for r in range(1, c + 1)}
    pairs |= {(2, 1)}                                   # column blocks (MAX_WIDTH = 2)
    for dt in DTYPES:
        for r, c in sorted(pairs):
            names.append(cb.softmax_kernel_name(dt, r, c))
            names += [cb.pointwise_kernel_name(dt, r, c, phi) for phi in cb.PHI_CODES]
        names += [cb.softmax_kernel_name(dt, r, 0) for r in sorted({p[0] for p in pairs})]
    return names


@pytest.fixture(scope="module")
def launcher():
    if find_compiler() is None:
        pytest.skip("no C++ compiler (g++, clang++ or $CXX): the CUDA kernels cannot be "
                    "built for the CPU")
    return CpuLauncher(_kernel_names())


@pytest.fixture(scope="module")
def gpu_like(launcher):
    """Backends over the CPU-compiled kernels: no key split, and a split whenever possible."""
    return {"whole": cb.CupyBackend(launcher, target_blocks=1),
            "split": cb.CupyBackend(launcher, target_blocks=10_000)}


# --------------------------------------------------------------------------- problems
RANGE_KINDS = ("none", "prefix", "segments", "window", "single", "random")


@st.composite
def key_ranges(draw, m, n, kinds=RANGE_KINDS):
    """``None``, a prefix mask or general ranges over ``n`` keys for ``m`` queries:
    segments (some empty), sliding windows, single keys or arbitrary ranges, with empty
    ranges (``lo = hi`` anywhere) sprinkled in and the queries in random order."""
    kind = draw(st.sampled_from(kinds))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "none":
        return None
    if kind == "prefix":
        hi = rng.integers(0, n + 1, m)
        hi[0] = draw(st.sampled_from([0, n]))                        # empty / full prefix
        return KeyRanges.prefix(hi, n)
    if kind == "segments":                   # blocks of keys, repeated cuts: empty ones
        bounds = np.sort(np.concatenate([[0, n], rng.integers(0, n + 1, rng.integers(1, 6))]))
        seg = rng.integers(0, bounds.size - 1, m)
        lo, hi = bounds[seg], bounds[seg + 1]
    elif kind == "window":                   # a token sees the w keys before its end
        hi = rng.integers(0, n + 1, m)
        lo = np.maximum(hi - draw(st.integers(1, 70)), 0)
    elif kind == "single":
        lo = rng.integers(0, n + 1, m)
        hi = np.minimum(lo + 1, n)
    else:
        lo, hi = np.sort(rng.integers(0, n + 1, (2, m)), axis=0)
    empty = rng.random(m) < 0.1
    lo[empty] = hi[empty] = rng.integers(0, n + 1, int(empty.sum()))
    return KeyRanges(lo, hi, n)


@st.composite
def problems(draw, dtype=np.float64, max_scale=1e3):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = draw(st.sampled_from(WIDTHS))
    m = draw(st.one_of(st.integers(1, 40), st.integers(100, 300)))   # several query blocks
    n = draw(st.integers(1, 300))                                     # tiles of 64 keys
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 5.0, 30.0, max_scale]))
    q = rng.normal(size=(m, d)) * np.sqrt(scale / d)
    k = rng.normal(size=(n, d)) * np.sqrt(scale / d)
    if draw(st.booleans()):
        k[rng.integers(0, n, n // 2)] = k[rng.integers(0, n)]        # duplicate keys
    v = rng.normal(size=(n, d))
    bias = np.log(rng.uniform(0.1, 1.0, n))
    if draw(st.booleans()):                                           # zero weights
        bias[rng.random(n) < draw(st.sampled_from([0.1, 0.5, 1.0]))] = -np.inf
    ranges = draw(key_ranges(m, n))
    split = draw(st.sampled_from(["whole", "split"]))

    def cast(a):
        return a.astype(dtype)

    return cast(q), cast(k), cast(v), cast(bias), ranges, split


def _logit_scale(q, k, bias):
    b = np.where(np.isfinite(bias), np.abs(bias), 0.0)
    return float((np.abs(q.astype(float)) @ np.abs(k.astype(float)).T + b).max(initial=0.0))


# --------------------------------------------------------------------------- kernels on the CPU
@settings(max_examples=25)
@given(p=problems())
def test_softmax_and_lse_float64(gpu_like, p):
    q, k, v, bias, ranges, split = p
    be = gpu_like[split]
    out, lse = be.softmax(q, k, v, bias, ranges)
    ref_out, ref_lse = REF.softmax(q, k, v, bias, ranges)
    assert out.dtype == lse.dtype == np.float64
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    cond = max(1.0, _logit_scale(q, k, bias) / 100.0)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * cond * np.abs(v).max())
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-12, atol=1e-12 * cond)
    np.testing.assert_array_equal(be.lse(q, k, bias, ranges), lse)


@settings(max_examples=20)
@given(p=problems(np.float32, max_scale=8.0))
def test_softmax_and_lse_float32(gpu_like, p):
    q, k, v, bias, ranges, split = p
    be = gpu_like[split]
    out, lse = be.softmax(q, k, v, bias, ranges)
    assert out.dtype == lse.dtype == np.float32
    ref_out, ref_lse = REF.softmax(*[a.astype(np.float64) for a in (q, k, v, bias)], ranges)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-5 * np.abs(v).max())
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse))
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("phi", ["identity", "sigmoid", "relu"])
@settings(max_examples=8)
@given(data=st.data())
def test_pointwise(gpu_like, phi, dtype, rtol, data):
    q, k, v, bias, ranges, split = data.draw(problems(dtype, max_scale=50.0))
    w = np.exp(bias.astype(np.float64)).astype(dtype)
    out = gpu_like[split].pointwise(phi, q, k, v, w, ranges)
    assert out.dtype == dtype
    _check_pointwise(out, phi, q, k, v, w, ranges, rtol, dtype)


def _check_pointwise(out, phi, q, k, v, w, ranges, rtol, dtype):
    """|out - ref| <= rtol * sum_j w_j (|phi_ij| + |q_i|.|k_j|) |v_j| (+ the smallest normal).

    The |q_i|.|k_j| term is the rounding of the score itself (a score that cancels to
    about 0 can change sign in float32, and relu or identity then pass it on)."""
    f64 = [a.astype(np.float64) for a in (q, k, v, w)]
    ref = REF.pointwise(phi, *f64, ranges)
    s = f64[0] @ f64[1].T
    mag = {"identity": np.abs(s), "sigmoid": 1 / (1 + np.exp(-np.clip(s, -700, 700))),
           "relu": np.maximum(s, 0)}[phi] + np.abs(f64[0]) @ np.abs(f64[1]).T
    if ranges is not None:
        mag = np.where(ranges.mask(), mag, 0.0)
    scale = (mag * f64[3][None, :]) @ np.abs(f64[2])
    tiny = np.finfo(dtype).tiny * (1.0 + f64[3] @ np.abs(f64[2]))
    assert np.all(np.abs(out - ref) <= rtol * scale + tiny)


@pytest.mark.parametrize("split", ["whole", "split"])
@pytest.mark.parametrize("prefix", [True, False])
def test_query_never_reads_outside_the_ranges(gpu_like, split, prefix, rng):
    # keys outside every range are NaN: a kernel that used them would say so
    be = gpu_like[split]
    q, k, v = rng.normal(size=(30, 3)), rng.normal(size=(600, 3)), rng.normal(size=(600, 3))
    lo = np.zeros(30, int) if prefix else rng.integers(100, 200, 30)
    ranges = KeyRanges(lo, lo + rng.integers(0, 200, 30), 600)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[400:], v_bad[400:] = np.nan, np.nan
    if not prefix:
        k_bad[:100], v_bad[:100] = np.nan, np.nan
    out, lse = be.softmax(q, k_bad, v_bad, np.zeros(600), ranges)
    ref_out, ref_lse = REF.softmax(q, k, v, np.zeros(600), ranges)
    seen = ranges.counts > 0
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * np.abs(v).max())
    np.testing.assert_allclose(lse[seen], ref_lse[seen], rtol=1e-12)
    assert np.all(np.isneginf(lse[~seen]))
    out_pw = be.pointwise("sigmoid", q, k_bad, v_bad, np.ones(600), ranges)
    np.testing.assert_allclose(out_pw, REF.pointwise("sigmoid", q, k, v, np.ones(600), ranges),
                               rtol=1e-12, atol=1e-12)


def test_queries_see_only_their_own_range(gpu_like, rng):
    # a NaN key visible to one query must not leak into a query of the same block that
    # does not see it (before its lo or from its hi on)
    be = gpu_like["whole"]
    q, k, v = rng.normal(size=(5, 2)), rng.normal(size=(100, 2)), rng.normal(size=(100, 2))
    k[5] = k[70] = np.nan
    ranges = KeyRanges([10, 60, 71, 6, 3], [50, 100, 100, 70, 3], 100)
    out, lse = be.softmax(q, k, v, None, ranges)
    ref_out = REF.softmax(q, k, v, None, ranges)[0]
    np.testing.assert_array_equal(np.isfinite(lse), [True, False, True, True, False])
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_bias_matches_reference(gpu_like, bad, rng):
    q, k, v = rng.normal(size=(6, 2)), rng.normal(size=(200, 2)), rng.normal(size=(200, 2))
    bias = np.zeros(200)
    bias[150] = bad
    for ranges in (KeyRanges.prefix([100, 200, 151, 150, 0, 7], 200),
                   KeyRanges([0, 150, 151, 120, 0, 150], [100, 151, 200, 150, 0, 150], 200)):
        for be in gpu_like.values():
            with np.errstate(invalid="ignore"):
                out, lse = be.softmax(q, k, v, bias, ranges)
                ref_out, ref_lse = REF.softmax(q, k, v, bias, ranges)
            np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
            np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=10)
@given(data=st.data())
def test_result_of_a_query_does_not_depend_on_its_block(gpu_like, dtype, data):
    # key tiles lie on a fixed grid: each query alone gives bit for bit its row of the
    # whole call (so the sort by ranges, and prefix masks, change no result)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    m, n, d = data.draw(st.integers(2, 300)), data.draw(st.integers(1, 300)), 2
    q, k, v = (rng.normal(size=s).astype(dtype) for s in ((m, d), (n, d), (n, d)))
    ranges = data.draw(key_ranges(m, n))
    be = gpu_like["whole"]
    out, lse = be.softmax(q, k, v, None, ranges)
    pw = be.pointwise("sigmoid", q, k, v, np.ones(n, dtype), ranges)
    for i in rng.integers(0, m, 3):
        part = None if ranges is None else ranges.take([i])
        o1, l1 = be.softmax(q[i:i + 1], k, v, None, part)
        assert np.array_equal(o1[0], out[i]) and np.array_equal(l1[0], lse[i])
        assert np.array_equal(be.pointwise("sigmoid", q[i:i + 1], k, v, np.ones(n, dtype),
                                           part)[0], pw[i])


@pytest.mark.parametrize("split", ["whole", "split"])
def test_segments_equal_separate_runs(gpu_like, split, rng):
    # an ensemble of systems is one call over block-diagonal ranges
    sizes = [1, 70, 200, 33]
    n, d = sum(sizes), 3
    X = rng.normal(size=(n, d))
    bias = np.log(rng.uniform(0.1, 1.0, n))
    be = gpu_like[split]
    out, lse = be.softmax(X, X, X, bias, KeyRanges.segments(sizes))
    pw = be.pointwise("relu", X, X, X, np.exp(bias), KeyRanges.segments(sizes))
    for a, b in zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes), strict=True):
        o, l_ = be.softmax(X[a:b], X[a:b], X[a:b], bias[a:b], None)
        np.testing.assert_allclose(out[a:b], o, rtol=0, atol=1e-12 * np.abs(X).max())
        np.testing.assert_allclose(lse[a:b], l_, rtol=1e-12)
        np.testing.assert_allclose(pw[a:b], be.pointwise("relu", X[a:b], X[a:b], X[a:b],
                                                         np.exp(bias[a:b]), None),
                                   rtol=1e-12, atol=1e-12)


def test_huge_logits_do_not_overflow(gpu_like, rng):
    q = rng.normal(size=(10, 2)) * 40.0
    k = rng.normal(size=(1000, 2)) * 40.0        # logits of several thousand
    v = rng.normal(size=(1000, 2))
    ref_out, ref_lse = REF.softmax(q, k, v, None, None)
    cond = _logit_scale(q, k, np.zeros(1000)) / 100.0
    for be in gpu_like.values():
        out, lse = be.softmax(q, k, v, None, None)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12 * cond * np.abs(v).max())


def test_empty_inputs(gpu_like):
    be = gpu_like["whole"]
    out, lse = be.softmax(np.zeros((0, 2)), np.zeros((4, 2)), np.zeros((4, 2)), None, None)
    assert out.shape == (0, 2) and lse.shape == (0,)
    out, lse = be.softmax(np.zeros((3, 2)), np.zeros((0, 2)), np.zeros((0, 2)), None, None)
    np.testing.assert_array_equal(out, 0.0)
    assert np.all(np.isneginf(lse))


def test_values_of_width_zero(gpu_like, rng):
    q, k = rng.normal(size=(5, 2)), rng.normal(size=(9, 2))
    ranges = KeyRanges([0, 2, 4, 4, 0], [9, 5, 4, 9, 1], 9)
    for be in gpu_like.values():
        out, lse = be.softmax(q, k, np.zeros((9, 0)), None, ranges)
        assert out.shape == (5, 0)
        np.testing.assert_array_equal(lse, be.lse(q, k, None, ranges))
        assert be.pointwise("relu", q, k, np.zeros((9, 0)), np.ones(9), ranges).shape == (5, 0)


def test_mixed_dtypes_promote(gpu_like, rng):
    be = gpu_like["whole"]
    q = rng.normal(size=(7, 2)).astype(np.float32)
    k, v = rng.normal(size=(9, 2)), rng.normal(size=(9, 2)).astype(np.float32)
    out, lse = be.softmax(q, k, v, None, None)
    assert out.dtype == lse.dtype == np.float64
    ref = REF.softmax(q.astype(float), k, v.astype(float), None, None)
    np.testing.assert_allclose(out, ref[0], rtol=1e-12, atol=1e-14)


def test_wide_values_and_keys(launcher, rng, monkeypatch):
    # values wider than MAX_WIDTH go through the kernels in column blocks; wider keys
    # through the dense fallback
    monkeypatch.setattr(cb, "MAX_WIDTH", 2)
    be = cb.CupyBackend(launcher, target_blocks=1, self_test=False)
    q, k, v = rng.normal(size=(20, 2)), rng.normal(size=(90, 2)), rng.normal(size=(90, 3))
    prefix = KeyRanges.prefix(rng.integers(0, 91, 20), 90)
    lo = np.sort(rng.integers(0, 60, 20))
    ranges = KeyRanges(lo, lo + rng.integers(0, 31, 20), 90)
    for lim in (None, prefix, ranges):
        out, lse = be.softmax(q, k, v, None, lim)
        ref_out, ref_lse = REF.softmax(q, k, v, None, lim)
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
        np.testing.assert_allclose(be.pointwise("relu", q, k, v, np.ones(90), lim),
                                   REF.pointwise("relu", q, k, v, np.ones(90), lim),
                                   rtol=1e-12, atol=1e-12)
    q3, k3 = rng.normal(size=(20, 3)), rng.normal(size=(90, 3))
    for lim in (prefix, ranges):
        out, lse = be.softmax(q3, k3, v, None, lim)
        ref_out, ref_lse = REF.softmax(q3, k3, v, None, lim)
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
        np.testing.assert_allclose(be.pointwise("sigmoid", q3, k3, v, np.ones(90), lim),
                                   REF.pointwise("sigmoid", q3, k3, v, np.ones(90), lim),
                                   rtol=1e-12, atol=1e-12)


def test_bad_arguments(gpu_like):
    be = gpu_like["whole"]
    q = np.zeros((3, 2))
    with pytest.raises(ValueError, match="phi"):
        be.pointwise("tanh", q, q, q, np.ones(3), None)
    with pytest.raises(ValueError, match="q and k"):
        be.lse(q, np.zeros((3, 4)), None, None)
    with pytest.raises(ValueError, match="bias"):
        be.lse(q, q, np.zeros(4), None)
    with pytest.raises(ArgumentTypeError, match="ranges must be None or"):
        be.lse(q, q, None, np.zeros(3, int))          # prefix lengths, not KeyRanges
    with pytest.raises(ArgumentError, match="one range per query"):
        be.lse(q, q, None, KeyRanges.prefix([1, 2], 3))
    with pytest.raises(ArgumentError, match="index 4 keys"):
        be.softmax(q, q, q, None, KeyRanges.full(3, 4))
    with pytest.raises(ArgumentError, match="lo > hi"):
        be.lse(q, q, None, KeyRanges([0, 2, 0], [1, 1, 3], 3))
    with pytest.raises(ValueError, match="w must"):
        be.pointwise("relu", q, q, q, np.ones(4), None)


# --------------------------------------------------------------------------- public API on the CPU build
KINDS = ["softmax", "linear", "l2", "sigmoid", "relu", "exp", "galerkin", "fourier"]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=4)
@given(data=st.data())
def test_velocity_every_kind(gpu_like, kind, masked, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    d = data.draw(st.sampled_from([2, 3]))
    att = data.draw(attentions([kind], d, heads=(1, 2), masked=masked, scale=2.0,
                               output_matrix=None, min_head_dim=2 if kind in
                               ("galerkin", "fourier") else 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n = data.draw(st.integers(1, 150))
    X = rng.normal(size=(n, d))
    w = rng.uniform(0.0, 1.0, n)
    w[rng.integers(0, n)] = 1.0
    pos = rng.random(n) if masked else None
    be = gpu_like[data.draw(st.sampled_from(["whole", "split"]))]
    got = tp.velocity(att, X.astype(dtype), weights=w, positions=pos, backend=be)
    ref = tp.velocity(att, X, weights=w, positions=pos, backend="numpy")
    assert got.dtype == dtype and got.shape == X.shape
    scale = np.abs(ref).max() + np.abs(X).max() * 1e-3
    if dtype == np.float64:
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11 * scale)
    else:
        # float32: against the NumPy backend on the same float32 tokens, so that only the
        # backends differ (the projections and galerkin / fourier layer norms are the same
        # float32 NumPy code in both; a layer norm of a nearly constant vector amplifies
        # float32 rounding, which a float64 reference would not share)
        ref32 = tp.velocity(att, X.astype(np.float32), weights=w, positions=pos,
                            backend="numpy")
        scale32 = np.abs(ref32).max() + np.abs(X).max() * 1e-3
        np.testing.assert_allclose(got, ref32, rtol=1e-4, atol=1e-4 * scale32)


def test_sinkhorn_field_through_lse(gpu_like, rng):
    d = 2
    att = tp.Attention("sinkhorn", rng.normal(size=(d, d)), rng.normal(size=(d, d)),
                       np.eye(d), eps=1.0)
    X = rng.normal(size=(80, d))
    ref = tp.velocity(att, X, backend="numpy")
    for be in gpu_like.values():
        got = tp.velocity(att, X, backend=be)
        # both solves stop at the 1e-9 log-domain marginal error
        np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-7)


def test_simulate_matches_numpy(gpu_like, rng):
    d = 2
    att = tp.Attention("softmax", rng.normal(size=(d, d)) / 2, rng.normal(size=(d, d)) / 2,
                       np.eye(d), heads=2, masked=True)
    X0, pos = rng.normal(size=(60, d)), rng.random(60)
    runs = [tp.simulate(att, X0, t_max=0.5, dt=0.1, solver="rk4",
                        field=tp.FieldOptions(backend=b), positions=pos)
            for b in ("numpy", gpu_like["split"])]
    assert runs[0].status == runs[1].status == "ok"
    np.testing.assert_allclose(runs[1].states, runs[0].states, rtol=1e-11, atol=1e-11)


# --------------------------------------------------------------------------- host code, pure NumPy
def _partials(q, k, v, bias, ranges, chunk):
    """Per-chunk (m, s, a) in base 2, computed densely (the kernels' contract)."""
    n = k.shape[0]
    logits = (q @ k.T + bias[None, :]) / np.log(2.0)
    if ranges is not None:
        logits = np.where(ranges.mask(), logits, -np.inf)
    parts = []
    for j0 in range(0, n, chunk):
        sl = logits[:, j0:j0 + chunk]
        m = sl.max(axis=1)
        empty = ~np.isfinite(m)
        m = np.where(empty, np.finfo(np.float64).min, m)
        p = np.exp2(sl - m[:, None])
        parts.append(np.concatenate([m[:, None], p.sum(axis=1)[:, None], p @ v[j0:j0 + chunk]],
                                    axis=1))
    return np.stack(parts)


@given(seed=st.integers(0, 2**32 - 1), chunk=st.integers(1, 50), data=st.data())
def test_merge_softmax_partials(seed, chunk, data):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(9, 2)) * 3, rng.normal(size=(60, 2)) * 3, rng.normal(size=(60, 3))
    bias = np.where(rng.random(60) < 0.3, -np.inf, 0.0)
    ranges = data.draw(key_ranges(9, 60))
    out, lse = cb.merge_softmax_partials(np, _partials(q, k, v, bias, ranges, chunk), np.float64)
    ref_out, ref_lse = REF.softmax(q, k, v, bias, ranges)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-12, atol=1e-12)
    f32 = cb.merge_softmax_partials(np, _partials(q, k, v, bias, ranges, chunk), np.float32)
    assert f32[0].dtype == f32[1].dtype == np.float32


def test_merge_partials_non_finite():
    # chunk 0 empty, chunk 1 NaN: no answer but -inf / 0; chunk of +inf maximum likewise
    part = np.array([[[np.finfo(float).min, 0.0, 0.0]], [[1.0, np.nan, np.nan]]])
    out, lse = cb.merge_softmax_partials(np, part, np.float64)
    assert np.isneginf(lse[0]) and out[0, 0] == 0.0
    part = np.array([[[np.inf, np.nan, np.nan]], [[1.0, 2.0, 1.0]]])
    out, lse = cb.merge_softmax_partials(np, part, np.float64)
    assert np.isneginf(lse[0]) and out[0, 0] == 0.0
    np.testing.assert_array_equal(
        cb.merge_pointwise_partials(np, np.ones((3, 2, 2)), np.float32), np.full((2, 2), 3.0))


@pytest.mark.parametrize("phi", ["identity", "sigmoid", "relu"])
def test_plain_path_matches_reference(phi, rng):
    q, k, v = rng.normal(size=(30, 3)) * 5, rng.normal(size=(50, 3)), rng.normal(size=(50, 2))
    bias = np.where(rng.random(50) < 0.2, -np.inf, rng.normal(size=50))
    lo = np.sort(rng.integers(0, 51, 30))
    lo[:3] = 0
    hi = np.minimum(lo + rng.integers(0, 20, 30), 50)
    hi[-3:] = lo[-3:]                                   # a row block of empty ranges
    for lim in (None, KeyRanges.prefix(rng.integers(0, 51, 30), 50), KeyRanges(lo, hi, 50)):
        out, lse = cb.plain_softmax(np, q, k, v, bias, lim, max_elems=200)
        ref_out, ref_lse = REF.softmax(q, k, v, bias, lim)
        np.testing.assert_allclose(out, ref_out, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-13, atol=1e-13)
        w = np.exp(bias)
        np.testing.assert_allclose(cb.plain_pointwise(np, phi, q, k, v, w, lim, max_elems=200),
                                   REF.pointwise(phi, q, k, v, w, lim), rtol=1e-12, atol=1e-12)


def test_kernel_config_and_names():
    assert cb.kernel_config(np.float32, 2, 2).qpt == 8
    assert cb.kernel_config(np.float32, 1, 1).qpt == 8
    assert cb.kernel_config(np.float64, 16, 16).qpt == 1
    for dt in DTYPES:
        for r in range(1, cb.MAX_WIDTH + 1):
            for c in (0, r):
                cfg = cb.kernel_config(dt, r, c)
                assert cfg.qpt in (1, 2, 4, 8) and cfg.nt % 32 == 0
    assert cb.softmax_kernel_name(np.float32, 3, 0).startswith(
        "tpde_reduce<tpde_softmax_acc<float, 3, 0>,")
    assert cb.pointwise_kernel_name(np.float64, 2, 2, "relu").startswith(
        "tpde_reduce<tpde_pointwise_acc<double, 2, 2, 2>,")
    src = cb.kernel_source()
    assert "tpde_reduce" in src and "#include" not in src.replace('"#include', "")


# --------------------------------------------------------------------------- detection
def _fake_cupy(get_count):
    runtime = types.SimpleNamespace(getDeviceCount=get_count)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


def test_cupy_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)        # import cupy -> ImportError
    with pytest.raises(BackendNotAvailable, match="not installed.*gpu-cuda12.*gpu-cuda13"):
        cb.CupyLauncher()


def test_default_backend_failure_is_remembered(monkeypatch):
    # "auto" asks for the GPU on every call: a failure is reported again without retrying
    calls = []

    def launcher():
        calls.append(1)
        raise BackendNotAvailable("backend='cupy': no CUDA device (test)")
    monkeypatch.setattr(cb, "CupyLauncher", launcher)
    monkeypatch.setattr(cb, "_DEFAULT_FAILURE", [])
    for _ in range(3):
        with pytest.raises(BackendNotAvailable, match="no CUDA device"):
            cb.CupyBackend()
    assert len(calls) == 1


class _CudaError(RuntimeError):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


@pytest.mark.parametrize("count,match", [
    (_CudaError(35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
     "no usable NVIDIA driver"),
    (_CudaError(100, "cudaErrorNoDevice: no CUDA-capable device is detected"),
     "no CUDA device"),
    (OSError("libcuda.so.1: cannot open shared object file"), "the CUDA runtime failed"),
    (0, "no CUDA device is visible"),
])
def test_cupy_without_driver_or_device(monkeypatch, count, match):
    def get_count():
        if isinstance(count, Exception):
            raise count
        return count
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(get_count))
    with pytest.raises(BackendNotAvailable, match=match) as info:
        cb.CupyLauncher()
    assert "\n" not in str(info.value)
    assert "gpu-cuda12" in str(info.value) or count == 0


class _BrokenLauncher:
    xp = np
    n_multiprocessors = 1

    def __init__(self, fail):
        self.fail = fail

    def launch(self, name, grid, block, args):
        if self.fail:
            raise RuntimeError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
        for a in args:                     # writes garbage into the outputs
            if isinstance(a, np.ndarray) and a.size > 1:
                a[...] = 7.0


@pytest.mark.parametrize("fail,match", [(True, "could not be compiled or run"),
                                        (False, "disagree with the NumPy reference")])
def test_self_test_rejects_a_broken_gpu(fail, match):
    with pytest.raises(BackendNotAvailable, match=match):
        cb.CupyBackend(_BrokenLauncher(fail))


def test_auto_never_picks_a_failing_gpu(monkeypatch):
    # the real CupyBackend whose kernels fail their self-test: BackendNotAvailable, and
    # "auto" falls back (the rule itself: tests/backends/test_numba_backend.py::test_auto_backend_rule)
    cls = cb.CupyBackend

    def broken():
        return cls(_BrokenLauncher(True))
    monkeypatch.setattr(cb, "CupyBackend", broken)
    monkeypatch.setattr(backends, "_cache", {})
    assert "cupy" in backends.BACKENDS
    assert get_backend("auto", n_tokens=10**6).name != "cupy"
    assert get_backend("auto", n_tokens=10).name == "numpy"
    with pytest.raises(BackendNotAvailable, match="could not be compiled"):
        get_backend("cupy")


def test_this_machine(monkeypatch):
    # whatever this machine has, "auto" gives a backend that works, and "cupy" either
    # works or says why in one line
    monkeypatch.setattr(backends, "_cache", {})
    be = get_backend("auto", n_tokens=10**6)
    assert be.name in ("cupy", "numba", "numpy")
    try:
        gpu = get_backend("cupy")
    except BackendNotAvailable as exc:
        assert "\n" not in str(exc) and "cupy" in str(exc).lower()
    else:
        assert gpu.name == "cupy"


# --------------------------------------------------------------------------- CUDA toolchain
def _nvrtc():
    try:
        import nvidia.cuda_nvrtc as wheel
        paths = [p for d in wheel.__path__ for p in glob.glob(os.path.join(d, "lib",
                                                                           "libnvrtc.so*"))]
    except ImportError:
        paths = []
    paths += [p for p in ("libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13")]
    for p in paths:
        if "alt" in os.path.basename(p) or "builtins" in os.path.basename(p):
            continue
        try:
            return ctypes.CDLL(p)
        except OSError:
            continue
    return None


def _compile_ptx(lib, names, arch="compute_90"):
    """NVRTC: kernel source -> PTX for ``arch``; returns (ptx, {lowered name: name})."""
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"NVRTC {what} failed ({rc})")
    prog = ctypes.c_void_p()
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), cb.kernel_source().encode(),
                                 b"attention.cu", 0, None, None), "create")
    for n in names:
        check(lib.nvrtcAddNameExpression(prog, n.encode()), "name")
    opts = [b"--std=c++17", f"--gpu-architecture={arch}".encode()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert rc == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetPTX(prog, ptx), "ptx")
    lowered = {}
    for n in names:
        p = ctypes.c_char_p()
        check(lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(p)), "lowered name")
        lowered[p.value.decode()] = n
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value, lowered


def _spill_check(names, tmp_path):
    lib = _nvrtc()
    if lib is None:
        pytest.skip("NVRTC not found: no nvidia-cuda-nvrtc-cu12 wheel (pip install "
                    "'transformer-pde[cuda-check]') and no system libnvrtc; cannot compile "
                    "the kernels for sm_90")
    ptx, lowered = _compile_ptx(lib, names)
    assert set(lowered.values()) == set(names)
    ptxas = shutil.which("ptxas") or shutil.which(
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas"))
    if ptxas is None:
        pytest.skip("kernels compile for sm_90 (NVRTC), but ptxas is not available to count "
                    "registers and spills")
    (tmp_path / "k.ptx").write_bytes(ptx)
    res = subprocess_runs.run([ptxas, "-arch=sm_90", "-v", str(tmp_path / "k.ptx"), "-o",
                               str(tmp_path / "k.cubin")], capture_output=True, text=True,
                              check=False, timeout=300)
    assert res.returncode == 0, res.stderr
    current, seen = None, set()
    for line in res.stderr.splitlines():
        if "Compiling entry function" in line:
            current = lowered[line.split("'")[1]]
            seen.add(current)
        elif "spill" in line:
            assert " 0 bytes spill stores, 0 bytes spill loads" in line, (current, line)
        elif "registers" in line:
            regs = int(line.split("Used")[1].split("registers")[0])
            assert regs <= 255, (current, line)
    assert seen == set(names)


def test_kernels_compile_for_sm90_without_spills(tmp_path):
    # representative specialisations (the slow test below covers all widths)
    names = [cb.softmax_kernel_name(np.float32, 2, 2), cb.softmax_kernel_name(np.float64, 16, 16),
             cb.pointwise_kernel_name(np.float32, 3, 3, "sigmoid")]
    _spill_check(names, tmp_path)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_without_spills(tmp_path):
    # one NVRTC program per width (a single program of all 320 kernels is too large)
    for r in range(1, cb.MAX_WIDTH + 1):
        names = []
        for dt in DTYPES:
            names += [cb.softmax_kernel_name(dt, r, r), cb.softmax_kernel_name(dt, r, 0)]
            names += [cb.pointwise_kernel_name(dt, r, r, phi) for phi in cb.PHI_CODES]
        _spill_check(names, tmp_path)


# --------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def gpu():
    try:
        return cb.CupyBackend()
    except BackendNotAvailable as exc:
        pytest.skip(str(exc))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("kind", ["none", "prefix", "window", "segments"])
def test_gpu_primitives(gpu, dtype, tol, kind, rng):
    # same tolerances as the CPU tests: the reference sees the inputs rounded to dtype
    for d in WIDTHS:
        m, n = 3000, 20_011
        q = (rng.normal(size=(m, d)) / np.sqrt(d)).astype(dtype)
        k = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(dtype)
        v = rng.normal(size=(n, d)).astype(dtype)
        bias = np.log(rng.uniform(0.1, 1, n)).astype(dtype)
        hi = np.sort(rng.integers(0, n + 1, m))
        ranges = {"none": None, "prefix": KeyRanges.prefix(rng.permutation(hi), n),
                  "window": KeyRanges(np.maximum(hi - 1000, 0), hi, n),
                  "segments": KeyRanges.segments([n // 3, n - 2 * (n // 3), n // 3]).take(
                      np.sort(rng.integers(0, n, m)))}[kind]
        f64 = [a.astype(np.float64) for a in (q, k, v, bias)]
        ref_out, ref_lse = REF.softmax(*f64, ranges)
        out, lse = gpu.softmax(*[gpu.asarray(a) for a in (q, k, v, bias)], ranges)
        assert type(out).__module__.startswith("cupy") and out.dtype == dtype
        np.testing.assert_allclose(gpu.to_numpy(out), ref_out, rtol=0, atol=tol * np.abs(v).max())
        fin = np.isfinite(ref_lse)
        assert np.array_equal(fin, np.isfinite(gpu.to_numpy(lse)))
        np.testing.assert_allclose(gpu.to_numpy(lse)[fin], ref_lse[fin], rtol=tol, atol=tol)
        w = np.exp(f64[3]).astype(dtype)
        for phi in cb.PHI_CODES:
            got = gpu.to_numpy(gpu.pointwise(phi, *[gpu.asarray(a) for a in (q, k, v, w)],
                                             ranges))
            _check_pointwise(got, phi, q, k, v, w, ranges, tol, dtype)


@pytest.mark.gpu
def test_gpu_float32_accuracy_at_1e5(gpu, rng):
    # issue target: float32 within 1e-5 relative of the float64 reference at N = 1e5
    n, d = 100_000, 2
    X = rng.normal(size=(n, d))
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d))
    idx = rng.integers(0, n, 200)
    ref = tp.velocity(att, X, queries=X[idx], backend="numba")
    got = gpu.to_numpy(tp.velocity(att, gpu.asarray(X, np.float32), queries=gpu.asarray(
        X[idx], np.float32), backend=gpu))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.gpu
def test_gpu_simulate_stays_on_device(gpu, rng):
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), heads=1, masked=True)
    X0, pos = rng.normal(size=(2000, 3)), rng.random(2000)
    runs = [tp.simulate(att, X0, t_max=0.5, dt=0.1, solver="rk4",
                        field=tp.FieldOptions(backend=b), positions=pos)
            for b in ("numba", gpu)]
    np.testing.assert_allclose(runs[1].states, runs[0].states, rtol=1e-10, atol=1e-10)


def test_overflowing_logits_go_to_the_reference(gpu_like, rng):
    # logits beyond the float range (finite tokens): the reference rescales them exactly;
    # the GPU backend hands such calls to it, as the numba backend does
    for dtype, big in ((np.float64, 1e155), (np.float32, 1e19)):
        q = (rng.normal(size=(4, 2)) * big).astype(dtype)
        k = (rng.normal(size=(50, 2)) * big).astype(dtype)
        v = rng.normal(size=(50, 2)).astype(dtype)
        for be in gpu_like.values():
            out, lse = be.softmax(q, k, v, None, None)
            ref_out, ref_lse = NumpyBackend().softmax(q, k, v, None, None)
            assert out.dtype == dtype
            np.testing.assert_array_equal(out, ref_out)
            np.testing.assert_array_equal(lse, ref_lse)
            assert np.all(np.isfinite(out))
            w = np.ones(50, dtype)
            np.testing.assert_array_equal(be.pointwise("relu", q, k, v, w, None),
                                          NumpyBackend().pointwise("relu", q, k, v, w, None))
    # non-finite pointwise weights: the reference's answer too
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(20, 2)), rng.normal(size=(20, 2))
    w = np.ones(20)
    w[3] = np.inf
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(gpu_like["whole"].pointwise("sigmoid", q, k, v, w, None),
                                      NumpyBackend().pointwise("sigmoid", q, k, v, w, None))


# --------------------------------------------------------------------------- benchmarks/gpu.py
def test_gpu_benchmark_times_what_it_says(launcher, capsys):
    # its set-up code on the CPU: the arrays of a row have the row's dtype (a float32 row
    # once timed float64: NEP 50), queries ramp beyond N, the bound model, and a dry run
    # of the whole script on the CPU build of the kernels
    spec = importlib.util.spec_from_file_location(
        "gpu_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        arrays = bench.inputs(np, rng, 50, 70, 3, dtype)
        assert [a.dtype for a in arrays] == [np.dtype(dtype)] * 4
        assert arrays[0].shape == (70, 3) and arrays[1].shape == (50, 3)
    with pytest.raises(AssertionError, match="float64 in a float32 row"):
        bench.check_dtypes(np.float32, np.ones((4, 2), np.float32) / np.sqrt(2))
    assert bench.query_cap(10_000, 2, np.float32) >= 100 * 10_000
    # the figures for an H100 / H200: ~4.2e12 float32 pairs/s at d = 2 (the
    # exponential unit), 3.2e11 float64 pairs/s = half the bound at d = 2
    np.testing.assert_allclose(bench.pair_bound(np.float32, 2, 132, 1.98e9, (9, 0)), 4.2e12,
                               rtol=0.01)
    np.testing.assert_allclose(bench.pair_bound(np.float64, 2, 132, 1.98e9, (9, 0)) / 2,
                               3.2e11, rtol=0.01)
    assert bench.pair_bound(np.float32, 2, 132, 1.98e9, (8, 0)) is None
    assert bench.main(["--dry-run"]) == 0
    assert "dry run: 4 rows, dtypes checked" in capsys.readouterr().out
