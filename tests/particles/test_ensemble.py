"""Ensembles: simulate_ensemble (the engine over B segments) against separate simulate runs."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import transformer_pde as tp
from block_constraints import Centre
from interrupts import StopOnce
from transformer_pde.errors import ArgumentError, ArgumentTypeError, EarlyStopWarning
from transformer_pde.particles.ensemble import (EnsembleTrajectory, ensemble_moments,
                                                simulate_ensemble)


def on_sphere(rng, *shape):
    X = rng.normal(size=shape)
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def near_identity(rng, d, scale=1.0):
    return scale * (np.eye(d) + 0.3 * rng.normal(size=(d, d)))


def separate(att, X0, backend="numpy", **kw):
    """The reference: one simulate run per system, stacked as (T, B, n, d)."""
    field = tp.FieldOptions(backend=backend)
    return np.stack([tp.simulate(att, X, field=field, **kw).states for X in X0], axis=1)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# ------------------------------------------------------------------ against simulate
@pytest.mark.parametrize("kind", ["softmax", "exp", "l2", "sinkhorn"])
@pytest.mark.parametrize("sphere", [False, True])
def test_ensemble_equals_separate_simulate_runs(rng, backend, kind, sphere):
    # Same solver, same dt, same backend: member b is simulate(X0[b]) up to the order of
    # the sums over a system's keys (the backends may tile B n keys differently from n);
    # 1e-12 relative leaves three orders of magnitude above the observed ~1e-15.
    B, n, d = 4, 7, 3
    X0 = on_sphere(rng, B, n, d)
    scale = 1.0 if sphere else 0.3
    att = tp.Attention(kind, near_identity(rng, d), near_identity(rng, d),
                       near_identity(rng, d, scale),
                       beta=1.0 if kind == "l2" else 1.3 if sphere else 0.5)
    block = tp.Block(constraint="sphere") if sphere else None
    kw = dict(t_max=1.0, dt=0.05, solver="rk4")
    ens = simulate_ensemble(att, X0, block="sphere" if sphere else None, backend=backend, **kw)
    ref = separate(att, X0, backend, block=block, **kw)
    assert ens.status == "ok" and ens.states.shape == (21, B, n, d)
    assert ens.info["backend"] == backend and ens.info["n_systems"] == B
    assert ens.states.dtype == np.float64
    assert rel(ens.states, ref) < 1e-12
    # the flow moved: the comparison is not between initial states
    assert np.abs(ens.states[-1] - ens.states[0]).max() > 1e-2
    if sphere:
        np.testing.assert_allclose(np.linalg.norm(ens.states, axis=-1), 1.0, atol=1e-13)


def test_ensemble_masked_heads_biases_output_map(rng, backend):
    B, n, d = 3, 6, 4
    X0 = on_sphere(rng, B, n, d)
    pos = rng.uniform(size=n)
    att = tp.Attention("softmax", near_identity(rng, d), near_identity(rng, d),
                       near_identity(rng, d), heads=2, masked=True, beta=2.0,
                       W_O=near_identity(rng, d), b_Q=rng.normal(size=d),
                       b_K=rng.normal(size=d), b_V=rng.normal(size=d), b_O=rng.normal(size=d))
    kw = dict(t_max=0.5, dt=0.05, positions=pos)
    ens = simulate_ensemble(att, X0, block="sphere", backend=backend, **kw)
    ref = separate(att, X0, backend, block=tp.Block(constraint="sphere"), **kw)
    assert rel(ens.states, ref) < 1e-12
    np.testing.assert_array_equal(ens.positions, pos)


def test_ensemble_weights_and_mlp_block(rng):
    B, n, d = 2, 5, 4
    X0 = on_sphere(rng, B, n, d)
    w = rng.uniform(0.5, 1.5, size=n)
    mlp = tp.blocks.MLP(rng.normal(size=(6, d)), rng.normal(size=(d, 6)) * 0.3)
    block = tp.Block(mlp=mlp, constraint="sphere", splitting="lie")
    att = tp.Attention("exp", np.eye(d), np.eye(d), np.eye(d), beta=2.0)
    kw = dict(t_max=0.5, dt=0.05, solver="heun", weights=w, block=block)
    ens = simulate_ensemble(att, X0, **kw)
    assert rel(ens.states, separate(att, X0, **kw)) < 1e-12
    np.testing.assert_allclose(ens.weights, w / w.sum(), rtol=1e-15)


def test_ensemble_adaptive_solver_within_tolerance(rng):
    # one step size for the whole ensemble: members differ from separate adaptive runs
    # within the tolerance, not to rounding
    B, n, d = 3, 5, 3
    X0 = on_sphere(rng, B, n, d)
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=1.0)
    solver = tp.integrate.Dop853(rtol=1e-10, atol=1e-12)
    kw = dict(t_max=2.0, dt=0.5, solver=solver)
    ens = simulate_ensemble(att, X0, **kw)
    assert ens.info["n_rejected"] >= 0 and ens.status == "ok"
    np.testing.assert_allclose(ens.states, separate(att, X0, **kw), atol=1e-8)


def test_ensemble_float32_runs_in_float32(rng):
    X0 = on_sphere(rng, 2, 5, 3).astype(np.float32)
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=1.0)
    ens = simulate_ensemble(att, X0, t_max=0.5, dt=0.1, block="sphere")
    assert ens.states.dtype == np.float32
    ref = separate(att, X0.astype(np.float64), t_max=0.5, dt=0.1,
                   block=tp.Block(constraint="sphere"))
    assert rel(ens.states, ref) < 1e-5   # float32 rounding, 5 steps


# ------------------------------------------------------------------ saving and results
def test_ensemble_saveat_ts_and_fn(rng):
    X0 = on_sphere(rng, 3, 4, 3)
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=1.0)
    ts = [0.25, 0.5, 1.0]
    ens = simulate_ensemble(att, X0, t_max=1.0, dt=0.1, saveat=tp.SaveAt(ts=ts))
    np.testing.assert_allclose(ens.times, ts)
    stat = simulate_ensemble(att, X0, t_max=1.0, dt=0.1, saveat=tp.SaveAt(
        ts=ts, fn=lambda t, X, w: np.einsum("bnd,bmd->b", X, X)))
    assert stat.states is None and stat.values.shape == (3, 3)
    np.testing.assert_allclose(stat.values, np.einsum("tbnd,tbmd->tb", ens.states, ens.states),
                               rtol=1e-14)
    np.testing.assert_allclose(stat.last, ens.states[-1], rtol=1e-15)
    with pytest.raises(ArgumentError, match="moments"):
        stat.moments()
    with pytest.raises(ArgumentError, match="SaveAt"):
        simulate_ensemble(att, X0, t_max=1.0, dt=0.1,
                          saveat=tp.SaveAt(fn=lambda t, X, w: "text"))


def test_ensemble_members_and_moments(rng):
    X0 = on_sphere(rng, 3, 4, 2)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    ens = simulate_ensemble(att, X0, t_max=0.3, dt=0.1)
    assert isinstance(ens, EnsembleTrajectory) and ens.success and len(ens) == 4
    m, c = ens.moments()
    assert m.shape == (4, 3, 2) and c.shape == (4, 3, 2, 2)
    member = ens.member(1)
    assert isinstance(member, tp.ParticleTrajectory)
    np.testing.assert_array_equal(member.states, ens.states[:, 1])
    mm, cc = member.moments()
    np.testing.assert_allclose(m[:, 1], mm, atol=1e-15)
    np.testing.assert_allclose(c[:, 1], cc, atol=1e-15)
    m2, _ = ensemble_moments(ens.states, ens.weights)
    np.testing.assert_array_equal(m, m2)
    with pytest.raises(ArgumentError, match="b must be"):
        ens.member(3)
    # functions taking one trajectory refuse the ensemble instead of misreading its axes
    with pytest.raises(ArgumentTypeError, match="EnsembleTrajectory"):
        tp.diagnostics.cluster_counts(ens)


def test_ensemble_stops_when_any_system_blows_up(rng):
    # exp attention without a constraint blows up; the systems share the steps, so the
    # first system to leave the float range stops all of them, with a warning
    X0 = np.stack([on_sphere(rng, 4, 2), 3.0 * on_sphere(rng, 4, 2)])
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=4.0)
    with pytest.warns(EarlyStopWarning):
        ens = simulate_ensemble(att, X0, t_max=5.0, dt=0.01)
    assert ens.status in ("nonfinite", "blowup") and not ens.success
    assert ens.times[-1] < 5.0 and np.all(np.isfinite(ens.states))
    with warnings.catch_warnings():   # warn=False: the status is the only report
        warnings.simplefilter("error", EarlyStopWarning)
        quiet = simulate_ensemble(att, X0, t_max=5.0, dt=0.01, warn=False)
    assert quiet.status == ens.status and quiet.message == ens.message


# ------------------------------------------------------------------ refusals
def test_ensemble_refusals(rng):
    X0 = on_sphere(rng, 2, 3, 3)
    soft = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3))
    kw = dict(t_max=0.1, dt=0.1)
    with pytest.raises(ArgumentError, match="backend"):
        simulate_ensemble(soft, X0, backend="fortran", **kw)
    with pytest.raises(ArgumentError, match="X0 must have shape"):
        simulate_ensemble(soft, X0[0], **kw)
    with pytest.raises(ArgumentError, match="X0 must have shape"):
        simulate_ensemble(soft, X0[..., :2], **kw)
    bad = X0.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ArgumentError, match="X0 contains NaN"):
        simulate_ensemble(soft, bad, **kw)
    with pytest.raises(ArgumentTypeError, match="att"):
        simulate_ensemble("softmax", X0, **kw)
    with pytest.raises(ArgumentError, match="block"):
        simulate_ensemble(soft, X0, block="ball", **kw)
    with pytest.raises(ArgumentTypeError, match="block"):
        simulate_ensemble(soft, X0, block=3, **kw)
    with pytest.raises(ArgumentError, match="X0 must lie on the unit sphere"):
        simulate_ensemble(soft, 2 * X0, block="sphere", **kw)
    with pytest.raises(ArgumentError, match="fixed-step solver"):
        simulate_ensemble(soft, X0, block=tp.Block(normalization="pre"), solver="dop853", **kw)
    with pytest.raises(ArgumentError, match="weights"):
        simulate_ensemble(soft, X0, weights=np.ones(4), **kw)
    with pytest.raises(ArgumentError, match="positions"):
        simulate_ensemble(tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3),
                                       masked=True), X0, **kw)
    with pytest.raises(ArgumentTypeError, match="limits"):
        simulate_ensemble(soft, X0, limits=5, **kw)

    with pytest.raises(ArgumentError, match="token-wise"):
        simulate_ensemble(soft, X0, block=tp.Block(constraint=Centre()), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert simulate_ensemble(soft, X0, **kw).status == "ok"


# ------------------------------------------------------------------ against the Gram flow
def test_ensemble_gram_matches_gram_flow(rng):
    # G = X X^T of Q = K = V = I post-LN tokens follows the d-independent Gram flow.
    # Measured difference: 9e-12 at dt = 0.01 and 1e-14 at dt = 0.002 (RK4's fourth order,
    # gram_flow at rtol 1e-12 below both); 1e-9 leaves a wide margin.
    from transformer_pde.reductions.gram import gram_flow

    B, n, d, beta = 3, 6, 5, 2.5
    X0 = on_sphere(rng, B, n, d)
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta)
    ts = [0.0, 0.5, 1.0]
    ens = simulate_ensemble(att, X0, t_max=1.0, dt=0.002, block="sphere",
                            saveat=tp.SaveAt(ts=ts))
    G_ens = np.einsum("tbnd,tbmd->tbnm", ens.states, ens.states)
    flow = gram_flow(G_ens[0], beta, ts, rtol=1e-12, atol=1e-14)
    assert flow.grams.shape == (3, B, n, n)
    np.testing.assert_allclose(flow.grams, G_ens, rtol=0, atol=1e-9)
    assert np.abs(G_ens[-1] - G_ens[0]).max() > 0.05      # the Gram matrices moved


# ------------------------------------------------------------------ the engine's features
@pytest.mark.parametrize("solver", ["euler", "heun", "ab2", "ab3", "implicit_midpoint"])
def test_ensemble_every_fixed_step_solver_equals_separate_runs(rng, solver):
    # multistep histories and implicit iterations cover the whole state: one ensemble
    # step is B separate steps (the implicit iteration stops on a norm over all systems,
    # so its tolerance is tightened to leave rounding only)
    B, n, d = 3, 5, 3
    X0 = on_sphere(rng, B, n, d)
    att = tp.Attention("softmax", near_identity(rng, d), near_identity(rng, d),
                       near_identity(rng, d, 0.5), beta=1.5)
    if solver == "implicit_midpoint":
        solver = tp.integrate.ImplicitMidpoint(tol=1e-15)
    kw = dict(t_max=0.4, dt=0.05, solver=solver)
    ens = simulate_ensemble(att, X0, **kw)
    assert rel(ens.states, separate(att, X0, **kw)) < 1e-12



def test_ensemble_checkpoint_resumes_to_the_uninterrupted_run(rng, tmp_path):
    B, n, d = 3, 4, 2
    X0 = on_sphere(rng, B, n, d)
    M = near_identity(rng, d)
    path = tmp_path / "ens.ckpt"
    kw = dict(t_max=0.6, dt=0.05, block="sphere")
    ref = simulate_ensemble(tp.Attention("softmax", StopOnce(M), np.eye(d), np.eye(d)), X0,
                            **kw)
    stop = StopOnce(M, t_stop=0.3)
    att = tp.Attention("softmax", stop, np.eye(d), np.eye(d))
    mon = tp.Monitor(checkpoint=path, checkpoint_every=1e-9)
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = simulate_ensemble(att, X0, monitor=mon, **kw)
    assert cut.status == "interrupted" and path.exists()
    again = simulate_ensemble(att, X0, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    np.testing.assert_array_equal(again.states, ref.states)   # bit for bit
    np.testing.assert_array_equal(again.times, ref.times)
    # the checkpoint belongs to this ensemble: other systems' sizes are another run
    with pytest.raises(tp.errors.CheckpointError, match="segments"):
        simulate_ensemble(att, X0.reshape(2 * B, n // 2, d),
                          monitor=tp.Monitor(checkpoint=path, resume=True), **kw)


def test_ensemble_statistic_is_named_in_the_checkpoint(rng, tmp_path):
    X0 = on_sphere(rng, 2, 3, 2)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    path = tmp_path / "stat.ckpt"

    def spread(t, X, w):
        return np.einsum("n,bnd->bd", w, X)

    out = simulate_ensemble(att, X0, t_max=0.2, dt=0.1, saveat=tp.SaveAt(fn=spread),
                            monitor=tp.Monitor(checkpoint=path))
    assert out.values.shape == (3, 2, 2)
    static = json.loads(str(np.load(path)["meta"]))["body"]["run"]["static"]
    assert static["saveat.fn"].endswith("spread")
