"""The SIMD width of the tiled Numba kernels follows the CPU Numba compiles for.

On a CPU with AVX-512F the micro-kernels use 512-bit registers, elsewhere 256-bit ones
(AVX2).  Numba compiles for ``NUMBA_CPU_FEATURES`` when it is set, so a child process
with the AVX-512 features switched off runs the 256-bit path on any x86-64 machine: the
tests check that the choice follows those features and (slow: a cold compilation of the
kernels in the child) that the 256-bit kernels then agree with the NumPy reference.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba")

import subprocess_runs
from transformer_pde.backends.numba import intrinsics, tiled


def _features_without_avx512() -> str | None:
    import llvmlite.binding

    try:
        feats = llvmlite.binding.get_host_cpu_features()
    except RuntimeError:
        return None
    if not (feats.get("avx2") and feats.get("fma")):
        return None
    for name in list(feats):
        if name.startswith(("avx512", "amx", "avx10")):
            feats[name] = False
    return feats.flatten()


def _child(code: str, tmp_path, features: str) -> dict:
    env = dict(os.environ, NUMBA_CPU_FEATURES=features,
               NUMBA_CACHE_DIR=str(tmp_path / "numba_cache"))
    out = subprocess_runs.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_layout_constants_follow_the_vector_width():
    bits = intrinsics.VECTOR_BITS
    assert bits in (256, 512) and tiled.VECTOR_BITS == bits
    assert tiled.LAYOUT == tiled.tile_layout(bits)
    lay = tiled.LAYOUT
    assert (tiled.MR, tiled.NR, tiled.NR_F32, tiled.QTILE, tiled.KBLOCK) == (
        lay.mr, lay.nr, lay.nr_f32, lay.qtile, lay.kblock)


@pytest.mark.parametrize("bits, registers", [(256, 16), (512, 32)])
def test_both_layouts_keep_their_invariants(bits, registers):
    """Each width's layout, checked on any machine (the AVX2 one had QTILE = 256 with
    MR = 6, so a tile could exceed QTILE and only AVX2 machines saw it)."""
    lay = tiled.tile_layout(bits)
    # two registers of columns per row: NR float64 / NR_F32 float32 numbers
    assert (lay.nr, lay.nr_f32) == (2 * bits // 64, 2 * bits // 32)
    assert lay.mr == (8 if bits == 512 else 6)
    # 2·MR accumulators, two registers of the right operand and one broadcast fit
    assert 2 * lay.mr + 2 + 1 <= registers
    # tiles are whole register groups, blocks whole float32 (and float64) panels
    assert lay.qtile % lay.mr == 0 and lay.qtile <= 256 < lay.qtile + lay.mr
    assert lay.kblock % lay.nr_f32 == 0 and lay.kblock % lay.nr == 0


@pytest.mark.parametrize("bad", [128, 384, 0, -256])
def test_tile_layout_rejects_other_widths(bad):
    from transformer_pde.errors import ArgumentError

    with pytest.raises(ArgumentError, match="vector_bits"):
        tiled.tile_layout(bad)


@pytest.mark.parametrize("name, features, bits", [
    ("haswell", "", 256),                     # the name's own features: AVX2, FMA
    ("skylake-avx512", "", 512),
    ("haswell", "+avx2,+fma,+avx512f", 512),  # an explicit feature string decides
    ("skylake-avx512", "+avx2,-avx512f", 256),
])
def test_vector_width_is_what_llvm_compiles_for(monkeypatch, name, features, bits):
    """``NUMBA_CPU_NAME`` with ``NUMBA_CPU_FEATURES=""`` compiles for that CPU's own
    features, and a feature string naming avx512f decides; the probe asks LLVM."""
    import llvmlite.binding
    import numba

    if not llvmlite.binding.get_default_triple().startswith("x86_64"):
        pytest.skip("x86-64 CPU names")
    monkeypatch.setattr(numba.config, "CPU_NAME", name)
    monkeypatch.setattr(numba.config, "CPU_FEATURES", features)
    assert intrinsics._target_vector_bits() == bits


def test_choice_follows_numba_cpu_features(tmp_path):
    feats = _features_without_avx512()
    if feats is None:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    res = _child("""
        import json
        from transformer_pde.backends.numba import tiled
        print(json.dumps({"bits": tiled.VECTOR_BITS, "nr": tiled.NR}))
        """, tmp_path, feats)
    assert res == {"bits": 256, "nr": 8}
    res = _child("""
        import json
        from transformer_pde.backends.numba import tiled
        print(json.dumps({"bits": tiled.VECTOR_BITS}))
        """, tmp_path, feats.replace("-avx512f", "+avx512f"))
    assert res == {"bits": 512}


@pytest.mark.slow
def test_avx2_path_matches_reference(tmp_path):
    """256-bit kernels (AVX-512 features off) against the NumPy reference: float64 to
    1e-12 relative (the kernels' rounding is ~1e-15), float32 to 2e-5 (float32 logits
    and weights, float64 totals), with general key ranges and without, ragged N and
    widths that are not multiples of the vector width."""
    feats = _features_without_avx512()
    if feats is None:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    res = _child("""
        import json
        import numpy as np
        from transformer_pde.backends.numba import NumbaBackend, tiled
        from transformer_pde.backends.numpy_backend import NumpyBackend
        from transformer_pde.backends.ranges import KeyRanges
        ref, be = NumpyBackend(), NumbaBackend(kernel="tiled")
        rng = np.random.default_rng(3)
        worst = {}
        for dt in (np.float64, np.float32):
            for m, n, r, c in ((53, 301, 13, 9), (61, 403, 128, 130), (45, 170, 33, 4)):
                for masked in (False, True):
                    q, k = rng.normal(size=(m, r)), rng.normal(size=(n, r))
                    v, b = rng.normal(size=(n, c)), rng.normal(size=n)
                    q, k, v, b = (a.astype(dt) for a in (q, k, v, b))
                    hi = rng.integers(0, n + 1, m)
                    lim = KeyRanges(rng.integers(0, hi + 1), hi, n) if masked else None
                    o1, l1 = be.softmax(q, k, v, b, lim)
                    o2, l2 = ref.softmax(q, k, v, b, lim)
                    fin = np.isfinite(l2)
                    assert np.array_equal(np.isfinite(l1), fin)
                    p1 = be.pointwise("sigmoid", q, k, v, np.abs(b), lim)
                    p2 = ref.pointwise("sigmoid", q, k, v, np.abs(b), lim)
                    err = max(np.abs(o1 - o2).max() / np.abs(o2).max(),
                              np.abs(l1[fin] - l2[fin]).max() / np.abs(l2[fin]).max(),
                              np.abs(p1 - p2).max() / np.abs(p2).max())
                    key = np.dtype(dt).name
                    worst[key] = max(worst.get(key, 0.0), float(err))
        print(json.dumps({"bits": tiled.VECTOR_BITS, **worst}))
        """, tmp_path, feats)
    assert res["bits"] == 256
    assert res["float64"] < 1e-12
    assert res["float32"] < 2e-5


def test_wide_vectors_is_a_no_op_for_results():
    """``wide_vectors`` only changes how LLVM vectorises: a loop calling it computes
    the same numbers as one that does not (same operations, fast-math sums aside:
    exact here, integer-valued data)."""
    from numba import njit

    @njit(fastmath=intrinsics.FM_KERNEL)
    def with_hint(x):
        intrinsics.wide_vectors()
        s = 0.0
        for i in range(x.size):
            s += x[i] * 2.0
        return s

    x = np.arange(1000, dtype=np.float64)
    assert with_hint(x) == 2.0 * x.sum()
