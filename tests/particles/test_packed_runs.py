"""Packed sequences: ``simulate(..., segments=...)`` against each segment run alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from block_constraints import Centre
from transformer_pde.errors import ArgumentError, CheckpointError

SIZES = [5, 2, 7, 1]


def on_sphere(rng, *shape):
    X = rng.normal(size=shape)
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def alone(att, X0, sizes, backend, weights=None, positions=None, **kw):
    """The reference: each segment run by itself, its states concatenated (T, N, d)."""
    ends = np.cumsum(sizes)
    runs = []
    for s, e in zip(sizes, ends, strict=True):
        part = slice(e - s, e)
        runs.append(tp.simulate(
            att, X0[part], field=tp.FieldOptions(backend=backend),
            weights=None if weights is None else weights[part],
            positions=None if positions is None else positions[part], **kw))
    return runs


@pytest.mark.parametrize("masked", [False, True])
def test_packed_run_equals_each_segment_alone(rng, backend, masked):
    # the same fixed-step solver on the same backend: each segment moves as if alone, to
    # the order of the sums over its keys (1e-12: three orders above the ~1e-15 observed)
    d, N = 3, sum(SIZES)
    X0 = on_sphere(rng, N, d)
    w = rng.uniform(0.5, 1.5, size=N)
    pos = rng.uniform(size=N) if masked else None
    att = tp.Attention("softmax", np.eye(d) + 0.3 * rng.normal(size=(d, d)),
                       np.eye(d) + 0.3 * rng.normal(size=(d, d)), np.eye(d), heads=1,
                       masked=masked, beta=2.0)
    mlp = tp.blocks.MLP(0.5 * rng.normal(size=(4, d)), 0.5 * rng.normal(size=(d, 4)))
    kw = dict(t_max=0.5, dt=0.05, solver="rk4",
              block=tp.Block(mlp=mlp, constraint="sphere", splitting="strang"))
    packed = tp.simulate(att, X0, weights=w, positions=pos, segments=SIZES,
                         field=tp.FieldOptions(backend=backend), **kw)
    runs = alone(att, X0, SIZES, backend, w, pos, **kw)
    ref = np.concatenate([r.states for r in runs], axis=1)
    assert packed.status == "ok" and packed.info["segments"] == SIZES
    assert np.abs(packed.states - ref).max() < 1e-12
    assert np.abs(packed.states[-1] - packed.states[0]).max() > 1e-2   # the flow moved
    # each segment is its own measure: weights normalised within it, moments per segment
    for b, r in enumerate(runs):
        seg = packed.segment(b)
        np.testing.assert_allclose(seg.weights, r.weights, rtol=1e-15)
        m, c = packed.moments()
        mr, cr = r.moments()
        np.testing.assert_allclose(m[:, b], mr, atol=1e-12)
        np.testing.assert_allclose(c[:, b], cr, atol=1e-12)
        assert "segments" not in seg.info and seg.info["segment"] == b


def test_packed_statistic_gets_per_segment_moments(rng):
    d, N = 2, sum(SIZES)
    X0 = rng.normal(size=(N, d))
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d))
    kw = dict(t_max=0.2, dt=0.1, segments=SIZES, field=tp.FieldOptions(backend="numpy"))
    full = tp.simulate(att, X0, **kw)
    stat = tp.simulate(att, X0, saveat=tp.SaveAt(fn=lambda t, X, w: X.sum()), **kw)
    m, c = full.moments()
    ms, cs = stat.moments()
    assert m.shape == (3, len(SIZES), d) and c.shape == (3, len(SIZES), d, d)
    np.testing.assert_allclose(ms, m, rtol=1e-15)
    np.testing.assert_allclose(cs, c, rtol=1e-15)
    np.testing.assert_allclose(stat.segment(2).moments()[0], m[:, 2], rtol=1e-15)


def test_segments_are_part_of_the_checkpoint_identity(rng, tmp_path):
    d, N = 2, sum(SIZES)
    X0 = rng.normal(size=(N, d))
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d))
    path = tmp_path / "packed.ckpt"
    kw = dict(t_max=0.2, dt=0.1, field=tp.FieldOptions(backend="numpy"))
    tp.simulate(att, X0, segments=SIZES, monitor=tp.Monitor(checkpoint=path), **kw)
    static = json.loads(str(np.load(path)["meta"]))["body"]["run"]["static"]
    assert static["segments"] == repr(SIZES)
    resumed = tp.simulate(att, X0, segments=SIZES,
                          monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    assert resumed.status == "ok"
    with pytest.raises(CheckpointError, match="segments"):
        tp.simulate(att, X0, segments=[N - 1, 1],
                    monitor=tp.Monitor(checkpoint=path, resume=True), **kw)


def test_segment_refusals(rng):
    d, N = 2, 6
    X0 = on_sphere(rng, N, d)
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d))
    kw = dict(t_max=0.1, dt=0.1, field=tp.FieldOptions(backend="numpy"))
    with pytest.raises(ArgumentError, match="segments"):
        tp.simulate(att, X0, segments=[2, 2], **kw)

    with pytest.raises(ArgumentError, match="token-wise"):
        tp.simulate(att, X0, segments=[3, 3], block=tp.Block(constraint=Centre()), **kw)
    # one segment is the plain run (no constraint check, no identity field)
    out = tp.simulate(att, X0, segments=[N], block=tp.Block(constraint=Centre()), **kw)
    assert out.status == "ok"
    with pytest.raises(ArgumentError, match="s must be"):
        tp.simulate(att, X0, segments=[3, 3], **kw).segment(2)


def test_the_backend_is_resolved_once_per_run_and_passed_down(rng, monkeypatch, tmp_path):
    # simulate resolves FieldOptions.backend once ("auto" by the number of tokens); the
    # field evaluator receives the object (never a name to resolve again), and the run's
    # information and checkpoint name the same backend
    from transformer_pde.fields import evaluator
    from transformer_pde.particles import simulation

    resolved, given = [], []
    real = simulation.get_backend

    def spy(name, **kw):
        resolved.append(real(name, **kw))
        return resolved[-1]

    def seen(name, **kw):
        given.append(name)
        return real(name, **kw)

    monkeypatch.setattr(simulation, "get_backend", spy)
    monkeypatch.setattr(evaluator, "get_backend", seen)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    path = tmp_path / "run.ckpt"
    traj = tp.simulate(att, rng.normal(size=(80, 2)), t_max=0.1, dt=0.1, segments=[30, 50],
                       monitor=tp.Monitor(checkpoint=path))
    assert len(resolved) == 1 and given == resolved
    assert traj.info["backend"] == resolved[0].name
    static = json.loads(str(np.load(path)["meta"]))["body"]["run"]["static"]
    assert static["backend"] == resolved[0].name
