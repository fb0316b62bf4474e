"""Rotary positions (``Attention(rotary=Rotary(...))``).

Checked against a dense loop reference with explicit 2x2 rotations (``rotary_reference``,
both pairings, rotated width below the head width, masks, biases, heads and grouped heads),
against the relative-position property (a common shift of every position leaves the field
unchanged), against the rotary-free field at position 0 (bit for bit), against the
llama.cpp row permutation that turns the "half" pairing into the "interleaved" one, across
backends, and for its errors.

Tolerances: the library and the reference form the same sums in another order, each term
of relative rounding error a few ulps times the angles' magnitude (below 20 rad here), so
1e-12 relative to the largest value; two backends of the library differ by the same
amount.
"""

from __future__ import annotations

import numpy as np
import pytest
from rotary_reference import reference_field, rotation

import transformer_pde as tp
from transformer_pde.attention import Rotary
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.particles.ensemble import simulate_ensemble

TOL = 1e-12


def problem(d=8, heads=2, kv_heads=None, n=7, seed=0, biases=True):
    rng = np.random.default_rng(seed)
    m = d // heads
    G = heads if kv_heads is None else kv_heads
    kw = dict(Q=0.7 * rng.normal(size=(d, d)), K=0.7 * rng.normal(size=(G * m, d)),
              V=rng.normal(size=(G * m, d)))
    if biases:
        kw.update(b_Q=rng.normal(size=d), b_K=rng.normal(size=G * m),
                  b_V=rng.normal(size=G * m), W_O=rng.normal(size=(d, d)),
                  b_O=rng.normal(size=d))
    X = rng.normal(size=(n, d))
    pos = rng.permutation(n) / 16.0            # shuffled: masks and key order are tested
    w = rng.uniform(0.2, 1.0, size=n)
    return kw, X, pos, w


def close(a, b, tol=TOL):
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.abs(b).max()))


# ------------------------------------------------------------------ the reference
@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("dim", [None, 2])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", ["softmax", "l2", "exp"])
def test_field_matches_the_dense_rotation_reference(pairing, dim, masked, kind):
    kw, X, pos, w = problem(heads=2, kv_heads=None if kind == "l2" else 1)
    rot = Rotary(base=10.0, span=16.0, dim=dim, pairing=pairing)
    beta = 1.0 if kind == "l2" else 0.8
    att = tp.Attention(kind, heads=2, kv_heads=None if kind == "l2" else 1, beta=beta,
                       masked=masked, rotary=rot, **kw)
    got = tp.velocity(att, X, weights=w, positions=pos)
    ref = reference_field(kind, X, heads=2, kv_heads=att.kv_heads, beta=beta, masked=masked,
                          rotary=(10.0, 16.0, dim, pairing), positions=pos, weights=w, **kw)
    close(got, ref)


def test_a_single_head_with_a_narrow_query_map_matches_the_reference():
    rng = np.random.default_rng(5)
    d, k = 5, 4
    Q, K, V = rng.normal(size=(k, d)), rng.normal(size=(k, d)), rng.normal(size=(d, d))
    X, pos = rng.normal(size=(6, d)), np.linspace(0.0, 1.0, 6)
    att = tp.Attention("softmax", Q, K, V, masked=True, rotary=Rotary(span=3.0, base=7.0))
    ref = reference_field("softmax", X, Q, K, V, masked=True, positions=pos,
                          rotary=(7.0, 3.0, None, "interleaved"))
    close(tp.velocity(att, X, positions=pos), ref)


def test_rotate_is_the_block_rotation():
    rng = np.random.default_rng(1)
    x, p = rng.normal(size=(4, 6)), np.array([0.0, 0.1, 0.5, 1.0])
    for pairing in ("interleaved", "half"):
        rot = Rotary(base=50.0, span=9.0, dim=4, pairing=pairing)
        ref = np.stack([rotation(pi, 6, 4, 50.0, 9.0, pairing) @ xi for pi, xi in zip(p, x, strict=True)])
        close(rot.rotate(x, p), ref, 1e-15)


# ------------------------------------------------------------------ properties
@pytest.mark.parametrize("masked", [False, True])
def test_a_common_shift_of_the_positions_leaves_the_field_unchanged(masked):
    # R(p)^T R(p') = R(p' - p): the scores see position differences only (the mask too)
    kw, X, pos, w = problem(heads=2)
    att = tp.Attention("softmax", heads=2, masked=masked, rotary=Rotary(span=16.0), **kw)
    a = tp.velocity(att, X, weights=w, positions=pos)
    b = tp.velocity(att, X, weights=w, positions=pos + 0.5)
    close(a, b, 1e-13)
    assert np.abs(a - tp.velocity(att, X, weights=w, positions=pos[::-1])).max() > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_at_position_zero_the_field_is_the_rotary_free_one_bit_for_bit(backend):
    kw, X, _, w = problem(heads=2)
    del kw["b_K"]    # without rotary b_K is dropped for softmax; with it, it is kept
    att = tp.Attention("softmax", heads=2, masked=True, **kw)
    zero = np.zeros(len(X))
    plain = tp.velocity(att, X, weights=w, positions=zero, backend=backend)
    rotated = tp.velocity(att.replace(rotary=Rotary(span=1000.0)), X, weights=w,
                          positions=zero, backend=backend)
    np.testing.assert_array_equal(rotated, plain)


def _llama_permutation(M, heads):
    """The converter's row permutation of Q and K (Hugging Face -> GGUF) per head."""
    rows = M.shape[0] // heads
    shape = (heads, 2, rows // 2) + M.shape[1:]
    return M.reshape(shape).swapaxes(1, 2).reshape(M.shape)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_half_pairing_equals_interleaved_after_the_converter_permutation(kv_heads):
    kw, X, pos, w = problem(heads=2, kv_heads=kv_heads)
    G = 2 if kv_heads is None else kv_heads
    half = tp.Attention("softmax", heads=2, kv_heads=kv_heads, masked=True,
                        rotary=Rotary(span=16.0, pairing="half"), **kw)
    perm = dict(kw, Q=_llama_permutation(kw["Q"], 2), K=_llama_permutation(kw["K"], G),
                b_Q=_llama_permutation(kw["b_Q"], 2), b_K=_llama_permutation(kw["b_K"], G))
    inter = tp.Attention("softmax", heads=2, kv_heads=kv_heads, masked=True,
                         rotary=Rotary(span=16.0, pairing="interleaved"), **perm)
    close(tp.velocity(inter, X, weights=w, positions=pos),
          tp.velocity(half, X, weights=w, positions=pos), 1e-13)
    # the same matrices with the other pairing give another field
    other = tp.velocity(half.replace(rotary=Rotary(span=16.0)), X, weights=w, positions=pos)
    assert np.abs(other - tp.velocity(half, X, weights=w, positions=pos)).max() > 1e-3


def test_the_key_bias_no_longer_cancels():
    kw, X, pos, w = problem(heads=2)
    att = tp.Attention("softmax", heads=2, **kw)
    no_bk = att.replace(b_K=None)
    # without rotary b_K adds <q, b_K>, the same for every key: it cancels exactly
    close(tp.velocity(att, X, weights=w), tp.velocity(no_bk, X, weights=w), 1e-15)
    rot = Rotary(span=16.0)
    with_bk = tp.velocity(att.replace(rotary=rot), X, weights=w, positions=pos)
    without = tp.velocity(no_bk.replace(rotary=rot), X, weights=w, positions=pos)
    assert np.abs(with_bk - without).max() > 1e-3
    ref = reference_field("softmax", X, heads=2, rotary=(10000.0, 16.0, None, "interleaved"),
                          positions=pos, weights=w, **kw)
    close(with_bk, ref)


@pytest.mark.parametrize("kind", ["softmax", "exp", "linear", "sigmoid", "l2"])
def test_numba_agrees_with_numpy(kind):
    kw, X, pos, w = problem(heads=2, kv_heads=1, n=9, seed=3)
    att = tp.Attention(kind, heads=2, kv_heads=1, masked=True, rotary=Rotary(span=16.0),
                       beta=1.0 if kind == "l2" else 0.5, **kw)
    close(tp.velocity(att, X, weights=w, positions=pos, backend="numba"),
          tp.velocity(att, X, weights=w, positions=pos))


def test_the_gpu_backends_kernels_compiled_for_the_cpu_agree():
    # the CuPy backend's CUDA kernels built as C++ (the CPU shim), NumPy standing in for
    # CuPy: rotated queries and keys reach the GPU kernels like any projection
    from transformer_pde.backends import cupy_backend as cb
    from transformer_pde.backends.cuda_cpu import CpuLauncher, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot be built for the CPU")
    be = cb.CupyBackend(CpuLauncher([cb.softmax_kernel_name(np.float64, 4, 4)]),
                        target_blocks=1)
    kw, X, pos, w = problem(heads=2, kv_heads=1)
    att = tp.Attention("softmax", heads=2, kv_heads=1, masked=True,
                       rotary=Rotary(span=16.0, pairing="half"), **kw)
    close(tp.velocity(att, X, weights=w, positions=pos, backend=be),
          tp.velocity(att, X, weights=w, positions=pos))


def test_queries_are_rotated_by_their_own_positions():
    kw, X, pos, w = problem(heads=2)
    att = tp.Attention("softmax", heads=2, masked=True, rotary=Rotary(span=16.0), **kw)
    full = tp.velocity(att, X, weights=w, positions=pos)
    sel = [4, 0, 2]
    at_q = tp.velocity(att, X, weights=w, positions=pos, queries=X[sel],
                       query_positions=pos[sel])
    close(at_q, full[sel], 1e-14)
    with pytest.raises(ArgumentError, match="query_positions"):
        tp.velocity(att.replace(masked=False), X, weights=w, positions=pos, queries=X[sel])


def test_sinkhorn_with_rotary_uses_the_general_solve():
    # with Q = K the plain score is symmetric, the rotated one is not; at position 0 the
    # rotary field is the plain one (the general and the symmetric solves agree to tol)
    rng = np.random.default_rng(4)
    A = rng.normal(size=(4, 4))
    X = rng.normal(size=(6, 4))
    att = tp.Attention("sinkhorn", A, A, np.eye(4), eps=0.7)
    rot = att.replace(rotary=Rotary(span=16.0))
    zero = np.zeros(6)
    close(tp.velocity(rot, X, positions=zero, sinkhorn_tol=1e-13),
          tp.velocity(att, X, sinkhorn_tol=1e-13), 1e-10)
    pos = np.arange(6) / 16.0
    moved = tp.velocity(rot, X, positions=pos, sinkhorn_tol=1e-13)
    assert np.abs(moved - tp.velocity(att, X, sinkhorn_tol=1e-13)).max() > 1e-3


def test_simulate_and_the_ensemble_rotate_alike():
    kw, _, pos, w = problem(heads=2, kv_heads=1, n=5, seed=6)
    att = tp.Attention("softmax", heads=2, kv_heads=1, masked=True, beta=0.3,
                       rotary=Rotary(span=16.0), **kw)
    X0 = np.random.default_rng(7).normal(size=(3, 5, 8))
    ens = simulate_ensemble(att, X0, t_max=0.3, dt=0.1, weights=w, positions=pos)
    for b in range(3):
        one = tp.simulate(att, X0[b], t_max=0.3, dt=0.1, weights=w, positions=pos)
        close(ens.states[-1, b], one.states[-1], 1e-13)
    with pytest.raises(ArgumentError, match="rotary.*positions"):
        simulate_ensemble(att.replace(masked=False), X0, t_max=0.3, dt=0.1)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("bad, error, match", [
    (dict(dim=3), ArgumentError, "dim"),
    (dict(dim=0), ArgumentError, "dim"),
    (dict(dim=2.0), ArgumentTypeError, "dim"),
    (dict(dim=True), ArgumentTypeError, "dim"),
    (dict(pairing="neox"), ArgumentError, "pairing"),
    (dict(pairing=1), ArgumentTypeError, "pairing"),
    (dict(base=0.0), ArgumentError, "base"),
    (dict(base=-2.0), ArgumentError, "base"),
    (dict(base=float("inf")), ArgumentError, "base"),
    (dict(span=0.0), ArgumentError, "span"),
    (dict(span=-1.0), ArgumentError, "span"),
    (dict(span="8"), ArgumentTypeError, "span"),
])
def test_rotary_refuses_bad_settings(bad, error, match):
    with pytest.raises(error, match=match):
        Rotary(**bad)


def test_attention_refuses_what_it_cannot_rotate():
    I4 = np.eye(4)
    with pytest.raises(ArgumentError, match="dim=4 exceeds the head width 2"):
        tp.Attention("softmax", I4, I4, I4, heads=2, rotary=Rotary(dim=4))
    with pytest.raises(ArgumentError, match="odd"):
        tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), rotary=Rotary())
    ok = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), rotary=Rotary(dim=2))
    assert ok.rotary.dim == 2
    for kind in ("galerkin", "fourier"):
        with pytest.raises(ArgumentError, match="rotary"):
            tp.Attention(kind, I4, I4, I4, rotary=Rotary())
    with pytest.raises(ArgumentTypeError, match="rotary"):
        tp.Attention("softmax", I4, I4, I4, rotary={"base": 10.0})


def test_rotary_needs_positions():
    att = tp.Attention("softmax", np.eye(4), np.eye(4), np.eye(4), rotary=Rotary())
    X = np.random.default_rng(0).normal(size=(3, 4))
    with pytest.raises(ArgumentError, match="rotary.*positions"):
        tp.velocity(att, X)
    with pytest.raises(ArgumentError, match="rotary.*positions"):
        tp.simulate(att, X, t_max=0.1, dt=0.1)
    with pytest.raises(ArgumentError, match="positions"):
        tp.velocity(att, X, positions=[0.0, 2.0, 0.5])


def test_rotary_in_description_codec_replace_and_repr():
    from transformer_pde.io.codec import (attention_data, attention_from_data,
                                          attention_from_json, attention_to_json)
    att = tp.Attention("softmax", np.eye(4), np.eye(4), np.eye(4),
                       rotary=Rotary(base=500.0, span=64.0, dim=2, pairing="half"))
    assert att.to_dict()["rotary"] == {"base": 500.0, "span": 64.0, "dim": 2,
                                       "pairing": "half"}
    arrays = {}
    for back in (attention_from_json(attention_to_json(att)),
                 attention_from_data(attention_data(att, arrays), arrays),
                 tp.Attention.from_dict(att.to_dict())):
        assert back.rotary == att.rotary
    assert "rotary=Rotary(base=500.0" in repr(att)
    assert att.replace(rotary=None).rotary is None
    assert "rotary" not in att.replace(rotary=None).to_dict()
