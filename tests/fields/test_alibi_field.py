"""The ALiBi glue of the field evaluator: the two passes and their log-sum-exp merge.

``merge_passes`` is checked against ``scipy.special.logsumexp`` of the two passes' joint
logits (exact cases: empty passes, a pass that overflows) and the evaluator against the
dense reference (:mod:`transformer_pde.testing.references`) in the cases where rounding
is hardest: the ``exp`` kind at exponents beyond the float range with ``shift``, ``l2``
tokens far from the origin, a query at either end of [0, 1], an ensemble of systems.
Tolerances: 1e-12 relative (a few ulps of exponents up to about 700), 1e-14 for the merge
of two exact passes.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

import transformer_pde as tp
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.fields import FieldEvaluator
from transformer_pde.fields.alibi import merge_passes
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.testing import references as R


def close(a, b, tol=1e-12):
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.abs(b).max()))


def test_merge_is_the_softmax_over_the_union():
    rng = np.random.default_rng(0)
    m, n, c = 6, 10, 3
    q, k, v = rng.normal(size=(m, 2)), rng.normal(size=(n, 2)), rng.normal(size=(n, c))
    split = np.array([0, 3, 5, 10, 10, 7])          # 0 and 10: one pass is empty
    first = KeyRanges(np.zeros(m, np.int64), split, n)
    second = KeyRanges(split, np.full(m, n), n)
    out1, l1 = R.softmax(q, k, v, None, first)
    out2, l2 = R.softmax(q, k, v, None, second)
    out, lse = merge_passes(np, out1, l1, out2, l2)
    ref_out, ref_lse = R.softmax(q, k, v, None, None)
    close(out, ref_out, 1e-14)
    close(lse, ref_lse, 1e-14)
    np.testing.assert_allclose(lse, logsumexp(q @ k.T, axis=1), rtol=1e-14)


def test_merge_conventions_for_empty_and_overflowing_passes():
    o1, o2 = np.array([[1.0], [2.0], [3.0]]), np.array([[5.0], [0.0], [7.0]])
    inf = np.inf
    out, lse = merge_passes(np, o1, np.array([-inf, 0.0, inf]), o2, np.array([-inf, -inf, 1.0]))
    assert out[0, 0] == 0.0 and lse[0] == -inf          # both empty
    assert out[1, 0] == 2.0 and lse[1] == 0.0           # one empty
    assert out[2, 0] == 3.0 and lse[2] == inf           # one normaliser overflows
    out, _ = merge_passes(np, o1[:1], np.array([inf]), o2[:1], np.array([inf]))
    assert np.isnan(out).all()                          # both overflow: reported, not guessed


def test_exp_beyond_the_float_range_with_shift():
    # scores about 800 on unit-free tokens: e^{800} overflows, e^{800 - shift} does not
    rng = np.random.default_rng(1)
    X = rng.normal(size=(7, 2))
    X = 20.0 * X / np.linalg.norm(X, axis=1, keepdims=True)
    pos = np.linspace(0.0, 1.0, 7)
    att = tp.Attention("exp", np.eye(2), np.eye(2), 0.01 * np.eye(2), beta=2.0, shift=800.0,
                       alibi=40.0)
    got = tp.velocity(att, X, positions=pos)
    ref = R.field("exp", X, np.eye(2), np.eye(2), 0.01 * np.eye(2), beta=2.0, shift=800.0,
                  alibi=40.0, positions=pos, masked=False)
    assert np.all(np.isfinite(got)) and np.abs(ref).max() > 1e-2
    scale = np.abs(ref).max()       # relative to the largest entry (about 0.03)
    close(got / scale, ref / scale)


def test_l2_far_from_the_origin():
    rng = np.random.default_rng(2)
    X = 1e6 + rng.normal(size=(8, 3))
    pos = rng.uniform(size=8)
    att = tp.Attention("l2", np.eye(3), np.eye(3), np.eye(3), alibi=7.0)
    close(tp.velocity(att, X, positions=pos) - 1e6,
          R.velocity(att, X, positions=pos) - 1e6, 1e-9)   # relative to 1e6 coordinates


def test_the_evaluator_is_reusable_and_queries_at_the_ends():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(6, 2))
    pos = np.array([0.0, 1.0, 0.5, 0.5, 0.2, 0.9])
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), alibi=3.0)
    ev = FieldEvaluator(att, 6, positions=pos, backend="numpy")
    first = ev(0.0, X)
    close(ev(0.0, X), first, 0.0)
    close(first, R.velocity(att, X, positions=pos))
    Y, qp = rng.normal(size=(2, 2)), np.array([0.0, 1.0])
    close(tp.velocity(att, X, positions=pos, queries=Y, query_positions=qp),
          R.velocity(att, X, positions=pos, queries=Y, query_positions=qp))


def test_an_ensemble_is_its_systems_run_one_by_one():
    rng = np.random.default_rng(4)
    X0 = rng.normal(size=(3, 5, 2))
    pos = np.linspace(0.0, 1.0, 5)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True, alibi=2.0)
    ens = simulate_ensemble(att, X0, t_max=0.3, dt=0.1, positions=pos,
                            backend="numpy")
    for b in range(3):
        one = tp.simulate(att, X0[b], t_max=0.3, dt=0.1, positions=pos,
                          field=tp.FieldOptions(backend="numpy"))
        close(ens.last[b], one.last, 1e-13)
