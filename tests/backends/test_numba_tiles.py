"""The tiled softmax kernel over several query tiles: masked, ragged widths, any thread count.

A call with more queries than one tile (:func:`query_tile` caps a tile at ``QTILE``) must give
the NumPy reference's field to float64 rounding (1e-12 relative: both sum the same terms, in
different orders) and the same bits on one thread as on two (each query's row of a tile
product is summed in the same order whatever its tile)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.backends.numba.tiled import MR, QTILE, query_tile


@pytest.mark.parametrize("m, threads", [(1, 1), (7, 2), (1003, 1), (1003, 2), (4096, 2),
                                        (QTILE * 3 + 1, 2)])
def test_query_tile_covers_the_queries_in_even_tiles(m, threads):
    tile = query_tile(m, threads)
    assert tile % MR == 0 and MR <= tile <= max(QTILE, MR)
    n_tiles = -(-m // tile)
    assert n_tiles * tile >= m
    if m > QTILE:       # several tiles, as many on every thread, none nearly empty
        assert n_tiles % threads == 0 and (n_tiles - 1) * tile < m


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
