"""ALiBi (``Attention(alibi=slopes)``): the score of head h loses lambda_h |p_i - p_j|.

Checked against the dense NumPy reference (:mod:`transformer_pde.testing.references`, whose
exponents subtract lambda |p_i - p_j| as written) on every backend of the fixture and the
GPU backend's kernels compiled for the CPU, with masks, windows, heads, grouped key/value
heads, biases, rotary positions, segments, weights, queries, tied positions and a large
slope (500: the kernel e^{-500 |p_i - p_j|} spans e^{-500}); against its refusals; through
the codec (files and checkpoints), the attention matrix and a ``simulate`` run.

Tolerance 1e-12 relative to the largest value: the library adds lambda p_j to the key bias
and subtracts lambda p_i from the log-sum-exp where the reference subtracts
lambda |p_i - p_j|; with lambda <= 500 the exponents then differ by a few ulps of 500
(about 1e-13), the plain sums by a few ulps.
"""

from __future__ import annotations

import numpy as np
import pytest
from rotary_reference import expand_groups, rotation

import transformer_pde as tp
from transformer_pde.attention import Rotary
from transformer_pde.attention.matrix import attention_matrix
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.io.codec import (attention_data, attention_from_data,
                                      attention_from_json, attention_to_json)
from transformer_pde.testing import references as R

TOL = 1e-12


def close(a, b, tol=TOL):
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.abs(b).max()))


def problem(d=4, n=9, seed=0, biases=True, kv_rows=None):
    rng = np.random.default_rng(seed)
    kv = d if kv_rows is None else kv_rows
    kw = dict(Q=0.6 * rng.normal(size=(d, d)), K=0.6 * rng.normal(size=(kv, d)),
              V=rng.normal(size=(kv, d)))
    if biases:
        kw.update(b_Q=rng.normal(size=d), b_K=rng.normal(size=kv), b_V=rng.normal(size=kv),
                  W_O=rng.normal(size=(d, d)), b_O=rng.normal(size=d))
    X = rng.normal(size=(n, d))
    pos = rng.permutation(n) / max(10.0, n - 1.0)
    pos[2] = pos[6]                         # two tokens tied at one position
    w = rng.uniform(0.2, 1.0, size=n)
    return kw, X, pos, w


def dense(kind, X, pos, w, *, Q, K, V, heads=1, kv_heads=None, beta=1.0, l2_beta=0.5,
          alibi=0.0, masked=False, window=None, rotary=None, b_Q=None, b_K=None, b_V=None,
          W_O=None, b_O=None):
    """A loop over heads, queries and keys from the formula (windows, groups, rotary)."""
    n, d = X.shape
    m = d // heads
    G = heads if kv_heads is None else kv_heads
    lam = np.broadcast_to(np.asarray(alibi, float), (heads,))
    order = np.argsort(pos, kind="stable")
    wn = w / w.sum()
    out = np.zeros((n, d))
    for h in range(heads):
        g = h // (heads // G)
        qr, kr = slice(h * m, (h + 1) * m), slice(g * m, (g + 1) * m)

        def proj(M, b, x, rows):
            y = M[rows] @ x
            return y if b is None else y + b[rows]

        def rot(p):
            return np.eye(m) if rotary is None else rotation(p, m, m, rotary, 16.0,
                                                             "interleaved")
        for i in range(n):
            q = rot(pos[i]) @ proj(Q, b_Q, X[i], qr)
            s = np.empty(n)
            for j in range(n):
                k = rot(pos[j]) @ proj(K, b_K, X[j], kr)
                s[j] = beta * (q @ k) if kind != "l2" else -l2_beta * np.sum((q - k) ** 2)
                s[j] -= lam[h] * abs(pos[i] - pos[j])
            vis = np.ones(n, bool) if not masked else pos <= pos[i]
            if window is not None:
                seen = [j for j in order if pos[j] <= pos[i]][-window:]
                vis = np.isin(np.arange(n), seen)
            vals = np.array([proj(V, b_V, X[j], kr) for j in range(n)])
            a = np.where(vis, wn * np.exp(s - s[vis].max()), 0.0)
            res = (a @ vals) * np.exp(s[vis].max()) if kind == "exp" else (a @ vals) / a.sum()
            out[i, qr] = res
    if W_O is not None:
        out = out @ W_O.T
    return out if b_O is None else out + b_O


# ------------------------------------------------------------------ against the reference
@pytest.mark.parametrize("lam", [0.7, 500.0])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", ["softmax", "exp", "l2"])
def test_field_matches_the_dense_reference_on_every_backend(backend, kind, masked, lam):
    kw, X, pos, w = problem()
    beta = 1.0 if kind == "l2" else 0.8
    att = tp.Attention(kind, heads=2, beta=beta, masked=masked, alibi=[lam, 0.3 * lam], **kw)
    got = tp.velocity(att, X, weights=w, positions=pos, backend=backend)
    close(got, R.velocity(att, X, weights=w, positions=pos))


@pytest.mark.parametrize("kind", ["softmax", "exp", "l2"])
def test_the_loop_reference_agrees_with_the_library_reference(kind):
    # the two references of this file (the loop and testing.references) are independent
    kw, X, pos, w = problem()
    beta = 1.0 if kind == "l2" else 0.8
    att = tp.Attention(kind, heads=2, beta=beta, alibi=[1.5, 0.2], **kw)
    close(dense(kind, X, pos, w, heads=2, beta=beta, alibi=[1.5, 0.2], **kw),
          R.velocity(att, X, weights=w, positions=pos))


def test_a_zero_slope_is_the_plain_field():
    kw, X, pos, w = problem()
    for masked in (False, True):
        plain = tp.Attention("softmax", heads=2, masked=masked, **kw)
        close(tp.velocity(plain.replace(alibi=0.0), X, weights=w, positions=pos),
              tp.velocity(plain, X, weights=w, positions=pos), 1e-14)


@pytest.mark.parametrize("kind", ["softmax", "exp"])
def test_windows_match_the_loop_reference(backend, kind):
    kw, X, pos, w = problem(biases=False)
    att = tp.Attention(kind, masked=True, window=3, alibi=2.5, **kw)
    close(tp.velocity(att, X, weights=w, positions=pos, backend=backend),
          dense(kind, X, pos, w, masked=True, window=3, alibi=2.5, **kw))


@pytest.mark.parametrize("masked", [False, True])
def test_grouped_heads_are_the_expanded_maps(backend, masked):
    # kv_heads=1 shares one key/value head: the same field as the maps repeated per head
    kw, X, pos, w = problem(d=4, kv_rows=2)
    att = tp.Attention("softmax", heads=2, kv_heads=1, masked=masked, alibi=[3.0, 0.5], **kw)
    full = dict(kw, K=expand_groups(kw["K"], 2, 1, 2), V=expand_groups(kw["V"], 2, 1, 2),
                b_K=expand_groups(kw["b_K"], 2, 1, 2), b_V=expand_groups(kw["b_V"], 2, 1, 2))
    ref_att = tp.Attention("softmax", heads=2, masked=masked, alibi=[3.0, 0.5], **full)
    close(tp.velocity(att, X, weights=w, positions=pos, backend=backend),
          R.velocity(ref_att, X, weights=w, positions=pos))


@pytest.mark.parametrize("masked", [False, True])
def test_rotary_and_alibi_together(backend, masked):
    kw, X, pos, w = problem()
    att = tp.Attention("softmax", heads=2, masked=masked, alibi=[4.0, 1.0],
                       rotary=Rotary(base=10.0, span=16.0), **kw)
    close(tp.velocity(att, X, weights=w, positions=pos, backend=backend),
          dense("softmax", X, pos, w, heads=2, masked=masked, alibi=[4.0, 1.0],
                rotary=10.0, **kw))


@pytest.mark.parametrize("masked", [False, True])
def test_segments_move_as_if_alone(backend, masked):
    kw, X, pos, w = problem(n=11)
    sizes = [4, 7]
    att = tp.Attention("exp", heads=2, masked=masked, alibi=[2.0, 9.0], **kw)
    got = tp.velocity(att, X, weights=w, positions=pos, segments=sizes, backend=backend)
    parts = [R.velocity(att, X[s:e], weights=w[s:e], positions=pos[s:e])
             for s, e in ((0, 4), (4, 11))]
    close(got, np.concatenate(parts))


@pytest.mark.parametrize("masked", [False, True])
def test_queries_at_their_own_positions(backend, masked):
    kw, X, pos, w = problem()
    att = tp.Attention("softmax", heads=2, masked=masked, alibi=[1.0, 6.0], **kw)
    Y = np.random.default_rng(9).normal(size=(5, 4))
    qp = np.array([0.0, 0.35, 0.4, 0.85, 1.0])     # 0.4: tied with a token
    got = tp.velocity(att, X, weights=w, positions=pos, queries=Y, query_positions=qp,
                      backend=backend)
    close(got, R.velocity(att, X, weights=w, positions=pos, queries=Y, query_positions=qp))
    with pytest.raises(ArgumentError, match="query_positions"):
        tp.velocity(att, X, weights=w, positions=pos, queries=Y)


def test_the_gpu_backends_kernels_compiled_for_the_cpu_agree():
    from transformer_pde.backends import cupy_backend as cb
    from transformer_pde.backends.cuda_cpu import CpuLauncher, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler: the CUDA kernels cannot be built for the CPU")
    be = cb.CupyBackend(CpuLauncher([cb.softmax_kernel_name(np.float64, 4, 4)]),
                        target_blocks=1)
    kw, X, pos, w = problem(d=8, n=13, kv_rows=4)
    for masked in (False, True):
        att = tp.Attention("softmax", heads=2, kv_heads=1, masked=masked, alibi=[0.5, 30.0],
                           **kw)
        close(tp.velocity(att, X, weights=w, positions=pos, backend=be),
              tp.velocity(att, X, weights=w, positions=pos, backend="numpy"))


def test_a_large_slope_is_exact_and_finite():
    # lambda = 500 with positions 0.1 apart: neighbours weigh e^{-50}; the exp field's
    # factor e^{-lambda p_i} reaches e^{-450} and is applied in the log domain
    kw, X, pos, w = problem(biases=False)
    for kind in ("softmax", "exp"):
        att = tp.Attention(kind, alibi=500.0, **kw)
        got = tp.velocity(att, X, weights=w, positions=pos)
        assert np.all(np.isfinite(got))
        close(got, R.velocity(att, X, weights=w, positions=pos))


def test_float32_runs_in_float32():
    kw, X, pos, w = problem()
    att = tp.Attention("softmax", heads=2, alibi=[2.0, 0.1], **kw)
    got = tp.velocity(att, X.astype(np.float32), weights=w, positions=pos)
    assert got.dtype == np.float32
    close(got, R.velocity(att, X, weights=w, positions=pos), 1e-5)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kind", ["linear", "sigmoid", "relu", "sinkhorn", "galerkin",
                                  "fourier"])
def test_kinds_without_an_exponential_kernel_refuse_it(kind):
    with pytest.raises(ArgumentError, match="alibi .*kind=") as info:
        tp.Attention(kind, np.eye(2), np.eye(2), np.eye(2), alibi=1.0)
    assert "e^(-lambda |p_i - p_j|)" in str(info.value)


@pytest.mark.parametrize("value, error, match", [
    (-0.5, ArgumentError, ">= 0"),
    (float("nan"), ArgumentError, "finite"),
    (float("inf"), ArgumentError, "finite"),
    ([1.0, 2.0, 3.0], ArgumentError, "heads=2"),
    ([[1.0, 2.0]], ArgumentError, "heads=2"),
    (True, ArgumentTypeError, "alibi"),
    ("1", ArgumentTypeError, "alibi"),
    (1j, ArgumentTypeError, "alibi"),
])
def test_bad_slopes_are_refused_naming_alibi(value, error, match):
    with pytest.raises(error, match=match) as info:
        tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), heads=2, alibi=value)
    assert "alibi" in str(info.value)


def test_positions_are_required():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), alibi=1.0)
    X = np.eye(2)
    with pytest.raises(ArgumentError, match="positions"):
        tp.velocity(att, X)
    with pytest.raises(ArgumentError, match="positions"):
        attention_matrix(att, X)
    with pytest.raises(ArgumentError, match="positions"):
        tp.simulate(att, X, t_max=0.1, dt=0.1)


# ------------------------------------------------------------------ codec, matrix, simulate
def test_the_codec_round_trips_it_and_old_descriptions_load():
    kw, X, pos, w = problem()
    for alibi in (0.25, np.array([0.5, 2.0])):
        att = tp.Attention("softmax", heads=2, alibi=alibi, **kw)
        back = attention_from_json(attention_to_json(att))
        np.testing.assert_array_equal(back.alibi, att.alibi)
        arrays: dict = {}
        again = attention_from_data(attention_data(att, arrays), arrays)
        np.testing.assert_array_equal(again.alibi, att.alibi)
        assert type(again.alibi) is type(att.alibi)
        assert repr(back) == repr(att)
    plain = tp.Attention("softmax", heads=2, **kw)
    assert "alibi" not in plain.to_dict()       # files without ALiBi stay as they were
    assert attention_from_json(attention_to_json(plain)).alibi is None


def test_the_attention_matrix_gives_the_field():
    kw, X, pos, w = problem(biases=False)
    att = tp.Attention("softmax", heads=2, masked=True, alibi=[3.0, 0.0], **kw)
    P = attention_matrix(att, X, weights=w, positions=pos)
    vals = X @ kw["V"].T
    field = np.concatenate([P[h] @ vals[:, 2 * h:2 * h + 2] for h in range(2)], axis=1)
    close(field, tp.velocity(att.replace(W_O=None), X, weights=w, positions=pos))


def test_simulate_is_rk4_on_the_reference_field(tmp_path):
    # two RK4 steps of the library against RK4 written here on the reference field
    kw, X, pos, w = problem(biases=False)
    att = tp.Attention("softmax", masked=True, alibi=2.0, **kw)
    traj = tp.simulate(att, X, t_max=0.2, dt=0.1, weights=w, positions=pos,
                       field=tp.FieldOptions(backend="numpy"))

    def f(Y):
        return R.velocity(att, Y, weights=w, positions=pos)
    Y = X.copy()
    for _ in range(2):
        k1 = f(Y)
        k2 = f(Y + 0.05 * k1)
        k3 = f(Y + 0.05 * k2)
        k4 = f(Y + 0.1 * k3)
        Y = Y + 0.1 / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    close(traj.last, Y)
    path = traj.save(tmp_path / "run.npz")
    back = tp.load(path)
    assert back.attention.alibi == 2.0


def test_position_free_solvers_refuse_it():
    from transformer_pde.diagnostics.stability import stability_bound
    from transformer_pde.gaussian.affine import check_attention
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), alibi=1.0)
    with pytest.raises(ArgumentError, match="alibi"):
        check_attention(att)
    with pytest.raises(ArgumentError, match="alibi"):
        stability_bound(att, 1.0, [0.0, 1.0])


def test_the_configuration_reads_it():
    from transformer_pde.cli.builders import build_attention
    from transformer_pde.cli.config import ConfigError
    assert build_attention({"d": 2, "alibi": 1.5}).alibi == 1.5
    with pytest.raises(ConfigError, match="attention.alibi"):
        build_attention({"d": 2, "alibi": 1.0, "kind": "linear"})


def test_the_harmonic_field_refuses_it():
    # the exact harmonic expansion is that of position-free (isotropic) attention
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), alibi=1.0)
    X = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    with pytest.raises(ArgumentError, match="alibi"):
        tp.velocity(att, X, positions=[0.0, 0.5, 1.0], method="harmonic")
