"""One Brownian stream per system: the generator is NumPy's Philox, a system's noise
depends only on ``(seed, path)``, its index and its own size, and member b of a noisy
ensemble is the single run with ``Noise(system=b)``."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import transformer_pde as tp
from transformer_pde import Noise, simulate, simulate_ensemble
from transformer_pde.noise import BrownianPath
from transformer_pde.noise.philox import philox_words

NP = tp.FieldOptions(backend="numpy")
#: tolerance of a run against the same run packed with others: the increments are equal
#: to the bit (tested on the path), the packed field and noise products differ from the
#: single system's only in the order of the floating-point operations (measured: <= 4e-16
#: after 20 steps)
RUN_TOL = 1e-14


# ------------------------------------------------------------------ the generator
@pytest.mark.parametrize("seed, path", [(0, 0), (3, 4), (2**31, 77)])
def test_philox_is_numpys_philox(seed, path):
    """The compiled bijection equals NumPy's ``Philox`` stream word for word (NumPy
    increments the counter before each block, with the carry into the next word)."""
    key = np.random.SeedSequence([seed, path]).generate_state(2, np.uint64)
    for ctr in [(0, 0, 0, 0), (5, 7, 2, 9), (2**64 - 2, 3, 1, 2**40), (17, 2**63, 20, 3)]:
        ref = np.random.Philox(key=key, counter=np.array(ctr, dtype=np.uint64)).random_raw(16)
        c = [ctr[0] + i + 1 for i in range(4)]
        counters = np.array([[x % 2**64, ctr[1] + x // 2**64, ctr[2], ctr[3]] for x in c],
                            dtype=np.uint64)
        out = np.empty_like(counters)
        philox_words(counters, key, out)
        assert np.array_equal(out.ravel(), ref)


def _box_muller(words):
    """NumPy's Box–Muller of 64-bit words (an independent evaluation of the transform)."""
    u = ((words >> np.uint64(11)).astype(float) + 0.5) * 2.0 ** -53
    r, a = np.sqrt(-2.0 * np.log(u[0::2])), 2.0 * np.pi * u[1::2]
    return np.stack([r * np.cos(a), r * np.sin(a)], axis=-1).ravel()


@pytest.mark.parametrize("level, rows", [(0, 1), (3, 4)])
def test_a_stream_is_box_muller_of_numpys_philox_blocks(level, rows):
    """Coordinate i, row r of system g at (level, j) is number q = i R + r of the
    Box–Muller normals of NumPy's Philox blocks with the counters (c, g, level, j), c = 0,
    1, ... (NumPy started one before: (2**64 - 1, g - 1, level, j)); the transcendental
    functions of the two evaluations may differ by an ulp, so to 1e-14 relative."""
    seed, path, g, j, dims = 2, 9, 5, 11, 7
    key = np.random.SeedSequence([seed, path]).generate_state(2, np.uint64)
    start = np.array([2**64 - 1, g - 1, level, j], dtype=np.uint64)
    words = np.random.Philox(key=key, counter=start).random_raw(4 * (-(-dims * rows // 4)))
    ref = _box_muller(words)[:dims * rows].reshape(dims, rows).T
    got = BrownianPath(seed, path, dims, 1.0, level, system=g)._normals(j, level, rows)
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=1e-15)


def test_the_stream_normals_have_the_normal_law():
    """2**18 normals from the streams of 4096 systems: the Kolmogorov–Smirnov test against
    N(0, 1) (p > 1e-7), the mean and variance within 5.5 standard errors, and the
    correlation of the two members of a Box–Muller pair within 5.5 standard errors of 0."""
    path = BrownianPath(1, 2, [64] * 4096, 1.0, 0)
    z = path.coarse_increments(3)[0]
    n = z.size
    assert stats.kstest(z, "norm").pvalue > 1e-7
    assert abs(z.mean()) < 5.5 / np.sqrt(n)
    assert abs(z.var() - 1.0) < 5.5 * np.sqrt(2.0 / n)
    pairs = z.reshape(-1, 2)
    assert abs(np.mean(pairs[:, 0] * pairs[:, 1])) < 5.5 / np.sqrt(n / 2)


# ------------------------------------------------------------------ the path
@pytest.mark.parametrize("level", [0, 3])
def test_a_systems_path_does_not_depend_on_the_others(level):
    """System g's columns of a packed path equal, bit for bit, the path of system g
    alone, whatever the number and the sizes of the systems packed with it."""
    dims = [7, 1, 12, 3, 7]
    packed = BrownianPath(4, 2, dims, 0.5, level, system=10)
    starts = np.cumsum([0] + dims)
    for j in (0, 5):
        F = packed.coarse_increments(j)
        for g, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
            alone = BrownianPath(4, 2, dims[g], 0.5, level, system=10 + g)
            assert np.array_equal(F[:, a:b], alone.coarse_increments(j))
    other = BrownianPath(4, 2, [2, 12, 30], 0.5, level, system=11)   # system 12 again
    assert np.array_equal(other.coarse_increments(5)[:, 2:14],
                          packed.coarse_increments(5)[:, 8:20])
    # distinct systems, seeds and paths draw distinct numbers
    one = BrownianPath(4, 2, [7, 7], 0.5, level).coarse_increments(1)
    assert not np.any(one[:, :7] == one[:, 7:])


def test_common_noise_and_first_tokens_do_not_depend_on_the_system_size():
    """Within a stream the numbers go coordinate by coordinate, the K common ones first:
    a system of more tokens keeps the common path and the first tokens' noise (bit for
    bit, at every refinement level)."""
    K, d = 2, 3
    for level in (0, 2):
        small = BrownianPath(0, 1, K + 4 * d, 0.1, level, system=3).coarse_increments(2)
        large = BrownianPath(0, 1, K + 9 * d, 0.1, level, system=3).coarse_increments(2)
        assert np.array_equal(large[:, :K + 4 * d], small)


def test_the_path_state_names_the_systems():
    a = BrownianPath(1, 1, [5, 5, 5, 2], 0.1, 1, system=4)
    state = a.get_state()
    assert state["dims"] == [[5, 3], [2, 1]] and state["system"] == 4
    a.check_state(state)
    for other in (BrownianPath(1, 1, [5, 5, 2, 5], 0.1, 1, system=4),
                  BrownianPath(1, 1, [5, 5, 5, 2], 0.1, 1, system=5)):
        with pytest.raises(ValueError, match="Brownian path"):
            other.check_state(state)


# ------------------------------------------------------------------ runs
def _att(d):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=1.0)


def _X0(B, n, d, sphere, seed=0):
    X = np.random.default_rng(seed).normal(size=(B, n, d))
    return X / np.linalg.norm(X, axis=-1, keepdims=True) if sphere else X


NOISES = {
    "individual": dict(sigma=0.4),
    "common": dict(common=0.3 * np.array([[0.0, 1.0, 0.2], [-1.0, 0.0, 0.5],
                                          [0.1, -0.5, 0.3]])),
    "both": dict(sigma=0.2, common=0.3 * np.eye(3)[None]),
}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("sphere", [False, True])
@pytest.mark.parametrize("kind", sorted(NOISES))
def test_an_ensemble_member_is_the_single_run_of_its_system(kind, sphere, backend):
    """Member b of ``simulate_ensemble(X0, noise=Noise(seed, path))`` equals
    ``simulate(X0[b], noise=Noise(seed, path, system=b))``, with a refined path
    (dt = base_dt / 2) and Stratonovich Heun, to RUN_TOL: the packed run and the single
    one are two computations (with common matrices the packed run multiplies in one einsum,
    the single run by a matmul: measured 4e-16; with individual noise alone measured 0)."""
    B, n, d = 4, 5, 3
    X0 = _X0(B, n, d, sphere)
    kw = dict(t_max=0.4, dt=0.02, solver="heun_stratonovich")
    noise = dict(NOISES[kind], seed=7, path=2, base_dt=0.04)
    ens = simulate_ensemble(_att(d), X0, noise=Noise(**noise), backend=backend,
                            block="sphere" if sphere else None, **kw)
    assert str(ens.status) == "ok"
    block = tp.Block(constraint=tp.Sphere()) if sphere else None
    for b in (0, 3):
        one = simulate(_att(d), X0[b], noise=Noise(**noise, system=b), block=block,
                       field=tp.FieldOptions(backend=backend), **kw)
        # a packed run and a single one are two computations (the backend may reduce the
        # keys of a segment in another layout): equal to RUN_TOL, not bit for bit
        np.testing.assert_allclose(one.states, ens.states[:, b], rtol=0, atol=RUN_TOL)
    # the member's noise matters: another system's stream is another run
    other = simulate(_att(d), X0[3], noise=Noise(**noise, system=2), block=block,
                     field=tp.FieldOptions(backend=backend), **kw)
    assert np.max(np.abs(other.last - ens.last[3])) > 1e-3


def test_a_segment_does_not_depend_on_the_segments_packed_with_it():
    """Segment s of a packed run with unequal segments is system ``system + s``: the same
    tokens in another packing (other sizes, other neighbours, a shifted ``system``) or
    alone follow the same path."""
    d = 3
    rng = np.random.default_rng(4)
    X = [rng.normal(size=(m, d)) for m in (3, 6, 2)]
    kw = dict(t_max=0.3, dt=0.03, solver="euler_maruyama", field=NP)
    noise = dict(NOISES["both"], seed=1, path=5)
    packed = simulate(_att(d), np.concatenate(X), segments=[3, 6, 2], noise=Noise(**noise), **kw)
    seg1 = packed.last[3:9]
    other = simulate(_att(d), np.concatenate([rng.normal(size=(5, d)), X[1]]),
                     segments=[5, 6], noise=Noise(**noise), **kw)           # seg 1 again
    shifted = simulate(_att(d), np.concatenate([X[1], X[2]]), segments=[6, 2],
                       noise=Noise(**noise, system=1), **kw)
    alone = simulate(_att(d), X[1], noise=Noise(**noise, system=1), **kw)
    for run in (other.last[5:], shifted.last[:6], alone.last):
        np.testing.assert_allclose(run, seg1, rtol=0, atol=RUN_TOL)
    np.testing.assert_allclose(shifted.last[6:], packed.last[9:], rtol=0, atol=RUN_TOL)
    assert alone.info["noise"]["system"] == 1
