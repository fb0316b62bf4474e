"""The tiled softmax kernel over several query tiles: masked, ragged widths, any thread count.

The tile size (:func:`query_tile`) is checked for both SIMD layouts (AVX2: MR = 6, AVX-512:
MR = 8) whatever the machine, since the layout is a pure function of the vector width.

A call with more queries than one tile (:func:`query_tile` caps a tile at ``QTILE``) must give
the NumPy reference's field to float64 rounding (1e-12 relative: both sum the same terms, in
different orders) and the same bits on one thread as on two (each query's row of a tile
product is summed in the same order whatever its tile)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.backends.numba.tiled import (
    LAYOUT,
    MR,
    QTILE,
    query_tile,
    softmax_tiled_kernel,
    tile_layout,
    tiled_layout,
)


def _check_query_tile(m, threads, layout):
    """The invariants of :func:`query_tile`: a multiple of ``mr`` between ``mr`` and
    ``qtile`` (buffers are sized by ``qtile``); the tiles cover the queries with none
    empty; no thread runs more tiles than the fewest rounds of ``qtile``-query tiles need;
    and the tile is the smallest multiple of ``mr`` that keeps to those rounds."""
    def ceil(a, b):
        return -(-a // b)

    mr, qtile = layout.mr, layout.qtile
    tile = query_tile(m, threads, layout)
    assert tile % mr == 0 and mr <= tile <= qtile
    n_tiles = ceil(m, tile)
    assert n_tiles * tile >= m and (n_tiles - 1) * tile < m
    rounds = ceil(m, qtile * threads)              # fewest tile rounds a thread can run
    assert ceil(n_tiles, threads) == rounds
    if tile > mr:                                  # one mr smaller needs another round
        assert ceil(ceil(m, tile - mr), threads) > rounds


LAYOUTS = [tile_layout(256), tile_layout(512)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["avx2", "avx512"])
@pytest.mark.parametrize("m, threads", [(1, 1), (7, 2), (1003, 1), (1003, 2), (4096, 2),
                                        (3 * 256 + 1, 2), (8448, 2), (300, 16), (4096, 64)])
def test_query_tile_covers_the_queries_in_even_tiles(m, threads, layout):
    # both layouts on any machine: AVX2's (mr = 6) was wrong (4096 queries on 2 threads
    # gave 258 > QTILE = 256) and went unseen on AVX-512 machines
    _check_query_tile(m, threads, layout)


@given(m=st.integers(1, 200_000), threads=st.integers(1, 256),
       layout=st.sampled_from(LAYOUTS))
def test_query_tile_invariants_hold_for_any_call(m, threads, layout):
    _check_query_tile(m, threads, layout)


def test_the_compiled_layout_is_one_of_the_tested_ones():
    assert LAYOUT in LAYOUTS and query_tile(4096, 2) == query_tile(4096, 2, LAYOUT)
    assert (MR, QTILE) == (LAYOUT.mr, LAYOUT.qtile)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_results_do_not_depend_on_the_query_tile(dtype):
    """Any tile size (a multiple of MR up to QTILE) gives the same bits: each query's
    row of a tile product is summed in the same order whatever its tile; general key
    ranges (a tile's key blocks start at its smallest lo, rounded down to a key panel),
    with value widths that leave a panel partly used."""
    rng = np.random.default_rng(5)
    m, n, r, c = 3 * MR + 5, 300, 24, 20
    q, k = rng.normal(size=(m, r)).astype(dtype), rng.normal(size=(n, r)).astype(dtype)
    v, b = rng.normal(size=(n, c)).astype(dtype), rng.normal(size=n).astype(dtype)
    hi = rng.integers(0, n + 1, m)
    lo = rng.integers(0, hi + 1)
    _, qpk, kpk, vpk, bp, lop, hip, nr = tiled_layout(dtype, q, k, v, b, lo, hi)
    outs = []
    for qtile in sorted({MR, 2 * MR, 3 * MR, QTILE}):
        out = np.zeros((lop.shape[0], vpk.shape[0] * nr))
        lse = np.full(lop.shape[0], -np.inf)
        softmax_tiled_kernel(qpk, kpk, vpk, bp, lop, hip, nr, c, qtile, 2, 2, out, lse)
        outs.append((out, lse))
    for out, lse in outs[1:]:
        assert np.array_equal(out, outs[0][0]) and np.array_equal(lse, outs[0][1])


@pytest.mark.parametrize("d, masked", [(64, True), (100, False), (16, True)])
def test_several_tiles_match_the_reference_and_do_not_depend_on_threads(d, masked):
    rng = np.random.default_rng(d)
    n = 1003                                        # more queries than one tile, ragged
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    V = rng.normal(size=(d, d))                     # d = 100: not a multiple of a panel
    att = tp.Attention("softmax", Q, K, V, masked=masked, beta=0.5)
    pos = rng.permutation(n) / n if masked else None
    ref = tp.velocity(att, X, positions=pos, backend="numpy")
    before = numba.get_num_threads()
    try:
        out = {}
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            out[threads] = tp.velocity(att, X, positions=pos, backend="numba")
    finally:
        numba.set_num_threads(before)
    for field in out.values():
        assert np.max(np.abs(field - ref)) <= 1e-12 * np.max(np.abs(ref))
    fields = list(out.values())
    assert all(np.array_equal(f, fields[0]) for f in fields)
