"""The Brownian path: counter-based, refinable by bridges, the same in every run that
names it (backends, save grids, refinements, checkpoints and resumes)."""

from __future__ import annotations

import numpy as np
import pytest
from interrupts import StopOnce

import transformer_pde as tp
from transformer_pde import Noise, simulate, simulate_ensemble
from transformer_pde.errors import CheckpointError, EarlyStopWarning
from transformer_pde.noise import BrownianPath

NP = tp.FieldOptions(backend="numpy")
Z = 5.5


@pytest.mark.parametrize("level", [1, 3, 6])
def test_fine_increments_sum_to_the_coarse_ones(level):
    """Each bridge level splits an increment into two that sum to it: the sums over a
    coarse step equal the coarse increment to rounding (1e-15 times its scale, 1 here)."""
    coarse = BrownianPath(3, 1, 50, 0.5, 0)
    fine = BrownianPath(3, 1, 50, 0.5, level)
    for j in (0, 1, 7):
        F = fine.coarse_increments(j)
        assert F.shape == (2 ** level, 50)
        np.testing.assert_allclose(F.sum(axis=0), coarse.increment(j), rtol=0, atol=1e-15)
        # and every intermediate level is the pairwise sum of the next one
        for lev in range(level):
            G = fine.coarse_increments(j, lev)
            H = fine.coarse_increments(j, lev + 1)
            np.testing.assert_allclose(H[0::2] + H[1::2], G, rtol=0, atol=1e-15)


def test_increments_are_counter_based():
    """A step's increment does not depend on which steps were drawn before, or on the
    object that draws it: (seed, path, step, level) name it."""
    a = BrownianPath(5, 2, 7, 0.1, 2)
    seq = [a.increment(k).copy() for k in range(12)]
    b = BrownianPath(5, 2, 7, 0.1, 2)
    for k in (11, 3, 0, 7, 3):
        assert np.array_equal(b.increment(k), seq[k])
    assert not np.allclose(BrownianPath(5, 3, 7, 0.1, 2).increment(0), seq[0])
    assert not np.allclose(BrownianPath(6, 2, 7, 0.1, 2).increment(0), seq[0])


def test_refined_increments_are_independent_with_variance_dt():
    """The bridge gives the 2^L sub-increments of a coarse step the law of independent
    N(0, dt) variables: their sample covariance over D = 20000 coordinates is dt I
    within 5.5 standard errors (dt sqrt(2/D) on the diagonal, dt/sqrt(D) off it)."""
    D, L, b = 20000, 3, 0.8
    dt = b / 2 ** L
    F = BrownianPath(0, 0, D, b, L).coarse_increments(4)
    C = F @ F.T / D
    diag, off = np.diag(C), C[~np.eye(2 ** L, dtype=bool)]
    assert np.all(np.abs(diag - dt) <= Z * dt * np.sqrt(2 / D))
    assert np.all(np.abs(off) <= Z * dt / np.sqrt(D))
    assert np.all(np.abs(F.mean(axis=1)) <= Z * np.sqrt(dt / D))


def test_runs_at_every_refinement_see_the_same_path():
    """With a zero field and additive noise Euler–Maruyama gives x(T) = x0 + sigma W(T)
    exactly, whatever dt: runs at base_dt / 2^L agree to rounding."""
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.zeros((2, 2)))
    X0 = np.random.default_rng(0).normal(size=(6, 2))
    ends = [simulate(att, X0, t_max=1.0, dt=0.25 / 2 ** L, solver="euler_maruyama",
                     noise=Noise(sigma=0.7, base_dt=0.25), field=NP,
                     saveat=tp.SaveAt(ts=[1.0])).last for L in range(5)]
    for e in ends[1:]:
        np.testing.assert_allclose(e, ends[0], rtol=0, atol=1e-14)
    path = BrownianPath(0, 0, 12, 0.25, 0)
    W = sum(path.increment(k) for k in range(4)).reshape(6, 2)
    np.testing.assert_allclose(ends[0], X0 + 0.7 * W, rtol=0, atol=1e-14)


def test_the_save_grid_does_not_change_the_path():
    """Save times cut the run into segments; the steps stay on the grid and draw the same
    increments.  The last step of a segment is ``target - t`` rather than ``dt`` (a
    rounding of 1e-16, as in deterministic runs), hence agreement to 1e-13."""
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X0 = np.random.default_rng(1).normal(size=(5, 2))
    kw = dict(t_max=1.0, dt=0.05, solver="heun_stratonovich", field=NP,
              noise=Noise(sigma=0.4, common=0.3 * np.eye(2), seed=2))
    a = simulate(att, X0, **kw)
    b = simulate(att, X0, saveat=tp.SaveAt(ts=[0.25, 0.5, 1.0]), **kw)
    c = simulate(att, X0, saveat=tp.SaveAt(every=4), **kw)
    np.testing.assert_allclose(b.states, a.states[[5, 10, 20]], rtol=0, atol=1e-13)
    assert np.array_equal(a.states[::4], c.states)



@pytest.mark.parametrize("sphere", [False, True])
def test_a_resumed_noisy_run_continues_the_same_path_bit_for_bit(tmp_path, sphere):
    B, n, d = 3, 4, 3
    X0 = np.random.default_rng(2).normal(size=(B, n, d))
    if sphere:
        X0 /= np.linalg.norm(X0, axis=-1, keepdims=True)
    path = tmp_path / "noisy.ckpt"
    noise = Noise(sigma=0.3, common=0.2 * np.eye(d)[None], seed=4, path=1)
    kw = dict(t_max=0.6, dt=0.05, solver="euler_maruyama", noise=noise, backend="numpy",
              block="sphere" if sphere else None)
    ref = simulate_ensemble(tp.Attention("softmax", StopOnce(np.eye(d)), np.eye(d), np.eye(d)),
                            X0, **kw)
    att = tp.Attention("softmax", StopOnce(np.eye(d), t_stop=0.3), np.eye(d), np.eye(d))
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = simulate_ensemble(att, X0, monitor=tp.Monitor(checkpoint=path,
                                                            checkpoint_every=1e-9), **kw)
    assert cut.status == "interrupted" and path.exists()
    again = simulate_ensemble(att, X0, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    np.testing.assert_array_equal(again.states, ref.states)   # bit for bit
    # the checkpoint names the path: another seed or path is another run
    for other in (Noise(sigma=0.3, common=0.2 * np.eye(d)[None], seed=5, path=1),
                  Noise(sigma=0.3, common=0.2 * np.eye(d)[None], seed=4, path=2),
                  Noise(sigma=0.3, common=0.2 * np.eye(d)[None], seed=4, path=1, system=1)):
        with pytest.raises(CheckpointError, match="noise"):
            simulate_ensemble(att, X0, monitor=tp.Monitor(checkpoint=path, resume=True),
                              **dict(kw, noise=other))
