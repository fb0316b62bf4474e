"""Grouped key/value heads (``Attention(kv_heads=G)``, grouped-query attention).

The field must equal that of the same attention with ``K``, ``V``, ``b_K``, ``b_V``
expanded by hand (each key/value head's rows repeated for the ``H/G`` query heads it
serves), for every kind, masks, ``Layers`` tables and backends.  Both evaluate the same
per-head arrays; the only difference is where the rows live in memory, which BLAS may
sum in another order: tolerance 1e-15 relative (1e-12 between backends).  Also checked:
the dense loop reference, the errors naming ``kv_heads`` / ``K`` / ``V``, the
description, the codec and the run fingerprint of checkpoints (old fingerprints keep
their fields).
"""

from __future__ import annotations

import numpy as np
import pytest
from rotary_reference import expand_groups, reference_field

import transformer_pde as tp
from transformer_pde.attention import KINDS, Layers, Rotary
from transformer_pde.errors import ArgumentError, ArgumentTypeError, CheckpointError
from transformer_pde.particles.identity import run_identity
from transformer_pde.io.codec import (attention_data, attention_fields, attention_from_data,
                                      attention_from_json, attention_to_json)
from transformer_pde.particles.ensemble import simulate_ensemble

D, H, G = 8, 4, 2
M = D // H


def grouped(seed=0, biases=True):
    rng = np.random.default_rng(seed)
    kw = dict(Q=0.6 * rng.normal(size=(D, D)), K=0.6 * rng.normal(size=(G * M, D)),
              V=rng.normal(size=(G * M, D)))
    if biases:
        kw.update(b_Q=rng.normal(size=D), b_K=rng.normal(size=G * M),
                  b_V=rng.normal(size=G * M), b_O=rng.normal(size=D))
    return kw


def expanded(kw):
    out = dict(kw)
    for name in ("K", "V", "b_K", "b_V"):
        if name in kw:
            out[name] = expand_groups(kw[name], H, G, M)
    return out


def close(a, b, tol=1e-15):
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.abs(b).max()))


def test_expansion_helper_repeats_consecutive_groups():
    K = np.arange(G * M)[:, None] * np.ones((1, D))
    assert expand_groups(K, H, G, M)[:, 0].tolist() == [0, 1, 0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("masked", [False, True])
def test_field_equals_the_hand_expanded_attention(kind, masked):
    if masked and not KINDS[kind].maskable:
        pytest.skip("not maskable")
    kw = grouped(seed=1, biases=kind not in ("galerkin", "fourier"))
    beta = 1.0 if kind == "l2" else 0.7
    rng = np.random.default_rng(2)
    X, pos, w = rng.normal(size=(9, D)), rng.permutation(9) / 9.0, rng.uniform(0.1, 1, 9)
    opts = dict(beta=beta, heads=H, masked=masked)
    att = tp.Attention(kind, kv_heads=G, **opts, **kw)
    ref = tp.Attention(kind, **opts, **expanded(kw))
    got = tp.velocity(att, X, weights=w, positions=pos, sinkhorn_tol=1e-12)
    close(got, tp.velocity(ref, X, weights=w, positions=pos, sinkhorn_tol=1e-12))
    heads = att.at(0.0).heads
    assert [h.K.shape for h in heads] == [(M, D)] * H
    np.testing.assert_array_equal(heads[1].V, heads[0].V)
    np.testing.assert_array_equal(heads[2].K, kw["K"][M:])


def test_field_matches_the_loop_reference_with_rotary():
    kw = grouped(seed=3)
    rng = np.random.default_rng(4)
    X, pos = rng.normal(size=(6, D)), rng.permutation(6) / 8.0
    att = tp.Attention("softmax", heads=H, kv_heads=G, masked=True,
                       rotary=Rotary(span=8.0), **kw)
    ref = reference_field("softmax", X, heads=H, kv_heads=G, masked=True, positions=pos,
                          rotary=(10000.0, 8.0, None, "interleaved"), **kw)
    close(tp.velocity(att, X, positions=pos), ref, 1e-12)


def test_layers_tables_are_grouped_per_layer():
    rng = np.random.default_rng(5)
    L = 3
    Q = Layers(rng.normal(size=(L, D, D)))
    K = Layers(rng.normal(size=(L, G * M, D)))
    V = Layers(rng.normal(size=(L, G * M, D)))
    bK = Layers(rng.normal(size=(L, 1, G * M)))
    att = tp.Attention("softmax", Q, K, V, heads=H, kv_heads=G, b_K=bK)
    ref = tp.Attention("softmax", Q, Layers([expand_groups(k, H, G, M) for k in K.values]),
                       Layers([expand_groups(v, H, G, M) for v in V.values]), heads=H,
                       b_K=Layers([expand_groups(b[0], H, G, M)[None] for b in bK.values]))
    X = rng.normal(size=(5, D))
    for t in (0.0, 1.0, 2.5):
        close(tp.velocity(att, X, t=t), tp.velocity(ref, X, t=t))


def test_backends_and_the_ensemble_agree():
    kw = grouped(seed=6)
    att = tp.Attention("softmax", heads=H, kv_heads=G, masked=True, beta=0.4, **kw)
    rng = np.random.default_rng(7)
    X, pos = rng.normal(size=(11, D)), rng.permutation(11) / 11.0
    close(tp.velocity(att, X, positions=pos, backend="numba"),
          tp.velocity(att, X, positions=pos), 1e-12)
    X0 = rng.normal(size=(2, 5, D))
    ens = simulate_ensemble(att, X0, t_max=0.2, dt=0.1, positions=pos[:5])
    one = tp.simulate(att, X0[1], t_max=0.2, dt=0.1, positions=pos[:5])
    close(ens.states[-1, 1], one.states[-1], 1e-13)


def test_kv_heads_equal_to_heads_is_the_plain_layout():
    kw = expanded(grouped(seed=8))
    X = np.random.default_rng(9).normal(size=(4, D))
    plain = tp.Attention("softmax", heads=H, **kw)
    close(tp.velocity(plain.replace(kv_heads=H), X), tp.velocity(plain, X))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("heads, kv, error, match", [
    (4, 3, ArgumentError, "kv_heads=3 must be a positive divisor of heads=4"),
    (4, 0, ArgumentError, "kv_heads=0"),
    (4, 8, ArgumentError, "kv_heads=8"),
    (1, 2, ArgumentError, "kv_heads=2"),
    (4, 2.0, ArgumentTypeError, "kv_heads"),
    (4, True, ArgumentTypeError, "kv_heads"),
    (4, "2", ArgumentTypeError, "kv_heads"),
])
def test_kv_heads_must_divide_heads(heads, kv, error, match):
    I8 = np.eye(D)
    with pytest.raises(error, match=match):
        tp.Attention("softmax", I8, I8, I8, heads=heads, kv_heads=kv)


@pytest.mark.parametrize("name, shape", [("K", (D, D)), ("V", (D, D)), ("K", (G * M, D + 1)),
                                         ("V", (G * M + 1, D))])
def test_key_and_value_maps_need_their_group_rows(name, shape):
    kw = grouped(biases=False)
    kw[name] = np.ones(shape)
    with pytest.raises(ArgumentError, match=f"kv_heads=2, {name} must have kv_heads"):
        tp.Attention("softmax", heads=H, kv_heads=G, **kw)


@pytest.mark.parametrize("name", ["b_K", "b_V"])
def test_key_and_value_biases_need_their_group_rows(name):
    kw = grouped(biases=False)
    kw[name] = np.ones(D)
    with pytest.raises(ArgumentError, match=f"{name} must have {G * M} entries"):
        tp.Attention("softmax", heads=H, kv_heads=G, **kw)


# ------------------------------------------------------------------ description, fingerprint
def test_description_codec_replace_and_repr():
    att = tp.Attention("softmax", heads=H, kv_heads=G, **grouped(seed=10))
    assert att.to_dict()["kv_heads"] == G and "kv_heads=2" in repr(att)
    arrays = {}
    for back in (attention_from_json(attention_to_json(att)),
                 attention_from_data(attention_data(att, arrays), arrays)):
        assert back.kv_heads == G
        np.testing.assert_array_equal(back.K, att.K)
    one = att.replace(kv_heads=1, K=att.K[:M], V=att.V[:M], b_K=None, b_V=None)
    assert one.kv_heads == 1 and one.at(0.0).heads[3].K.shape == (M, D)


def test_descriptions_without_the_options_keep_their_fields():
    I4 = np.eye(4)
    old = tp.Attention("softmax", I4, I4, I4, heads=2, masked=True)
    assert set(old.to_dict()) == {"kind", "heads", "masked", "beta", "eps", "l2_beta",
                                  "serialisable", "Q", "K", "V", "W_O"}
    assert set(attention_fields(old)) == set(old.to_dict()) - {"serialisable"}
    new = old.replace(kv_heads=1, K=I4[:2], V=I4[:2], rotary=Rotary())
    assert set(attention_fields(new)) - set(attention_fields(old)) == {"kv_heads", "rotary"}


def _identity(att):
    X0 = np.eye(4)[:3]
    return run_identity(att=att, X0=X0, weights=np.full(3, 1 / 3), positions=np.zeros(3),
                        dtype=np.float64, backend="numpy", field_options={}, solver="rk4",
                        t_max=1.0, dt=0.1, saveat=tp.SaveAt(), block=None).static


def test_fingerprints_differ_between_settings_and_old_ones_are_unchanged():
    I4 = np.eye(4)
    old = tp.Attention("softmax", I4, I4, I4, heads=2)
    base = _identity(old)
    assert not any("rotary" in k or "kv_heads" in k for k in base)
    assert _identity(tp.Attention("softmax", I4, I4, I4, heads=2)) == base
    variants = [old.replace(kv_heads=2), old.replace(kv_heads=1, K=I4[:2], V=I4[:2]),
                old.replace(rotary=Rotary()), old.replace(rotary=Rotary(dim=2)),
                old.replace(rotary=Rotary(pairing="half")), old.replace(rotary=Rotary(span=2.0))]
    ids = [_identity(a) for a in variants]
    for i, a in enumerate(ids):
        assert a != base
        assert all(a != b for b in ids[i + 1:])


def test_a_checkpoint_with_other_groups_or_rotary_does_not_resume(tmp_path):
    rng = np.random.default_rng(11)
    X0 = rng.normal(size=(4, 4))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    pos = np.arange(4) / 4.0
    path = tmp_path / "run.ckpt"
    I4 = np.eye(4)
    plain = tp.Attention("softmax", I4, I4, I4, heads=2)

    def run(att, resume):
        mon = tp.Monitor(checkpoint=path, resume=resume, checkpoint_every=1e-9)
        return tp.simulate(att, X0, t_max=0.2, dt=0.1, positions=pos, monitor=mon,
                           block=tp.Block(constraint="sphere"))

    done = run(plain, False)
    with pytest.raises(CheckpointError, match=r"attention\.kv_heads"):
        run(plain.replace(kv_heads=1, K=I4[:2], V=I4[:2]), True)
    with pytest.raises(CheckpointError, match=r"attention\.rotary"):
        run(plain.replace(rotary=Rotary()), True)
    np.testing.assert_array_equal(run(plain, True).states, done.states)
