"""The reference implementations of transformer_pde.testing.references.

They are the yardstick of the field and backend tests, so they are checked here on their
own: against values worked out by hand, against POT's entropic OT solver (Sinkhorn),
against each other (head references vs the dense primitives), for the conventions the
backends share (empty prefixes, non-finite logits), and for their independence (no
import of the package, no hypothesis needed).
"""

from __future__ import annotations

import ast
import math
import os
import sys
from pathlib import Path

import numpy as np
import ot
import pytest

import subprocess_runs
import transformer_pde as tp
from transformer_pde.attention import KINDS, Layers
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.blocks import SOFTMAX_FREE_LN_EPS
from transformer_pde.testing import references as R

E = math.e
ONE = [[1.0]]


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def test_every_builtin_kind_has_a_reference():
    assert set(KINDS) <= set(R.REFERENCES)
    assert R.LAYER_NORM_EPS == SOFTMAX_FREE_LN_EPS


# 1-D, Q = K = V = 1, beta = eps = 1, l2_beta = 1/2, tokens (0, 1), uniform weights:
# s(x, y) = x y.  Sinkhorn: the 2x2 coupling with uniform marginals has the cross ratio
# e^{S11 + S22 - S12 - S21} = e, so Gamma(x1) = (sqrt(e) x1 + x2) / (1 + sqrt(e)).
HAND_N2 = {
    "softmax": [0.5, E / (1 + E)],
    "linear": [0.0, 0.5],
    "l2": [math.exp(-0.5) / (1 + math.exp(-0.5)), 1 / (1 + math.exp(-0.5))],
    "sinkhorn": [1 / (1 + math.sqrt(E)), math.sqrt(E) / (1 + math.sqrt(E))],
    "sigmoid": [0.25, sig(1.0) / 2],
    "relu": [0.0, 0.5],
    "exp": [0.5, E / 2],
}


@pytest.mark.parametrize("kind", sorted(HAND_N2))
def test_hand_computed_two_tokens(kind):
    got = R.field(kind, np.array([[0.0], [1.0]]), ONE, ONE, ONE)
    # closed forms in double precision; sinkhorn to the reference's 1e-13 marginal tolerance
    np.testing.assert_allclose(got[:, 0], HAND_N2[kind], rtol=1e-12, atol=1e-15)


def test_hand_computed_galerkin_and_fourier():
    # k = 2 features: LN((a, -a)) = (a, -a) / sqrt(a^2 + eps); Q = K = V = I, tokens
    # x1 = (1, -1), x2 = (2, -2): LN(x_j) = x_j |x_j|_inf / sqrt(|x_j|_inf^2 + eps)
    X = np.array([[1.0, -1.0], [2.0, -2.0]])
    ln = X / np.sqrt(np.array([[1.0], [4.0]]) + R.LAYER_NORM_EPS)
    want_g = 0.5 * sum((X @ ln[j])[:, None] * ln[j][None, :] for j in range(2))
    want_f = 0.5 * sum((ln @ ln[j])[:, None] * X[j][None, :] for j in range(2))
    I2 = np.eye(2)
    np.testing.assert_allclose(R.field("galerkin", X, I2, I2, I2), want_g, rtol=1e-14)
    np.testing.assert_allclose(R.field("fourier", X, I2, I2, I2), want_f, rtol=1e-14)


def test_masking_heads_biases_and_output_map():
    X = np.array([[0.5], [1.0]])
    # masked: the first token sees itself only; unnormalised kinds keep the weights w_j = 1/2
    got = R.field("softmax", X, ONE, ONE, ONE, positions=[0.0, 1.0])
    e = math.exp(0.5), math.exp(1.0)
    np.testing.assert_allclose(got[:, 0], [0.5, (0.5 * e[0] + e[1]) / (e[0] + e[1])], rtol=1e-14)
    got = R.field("linear", X, ONE, ONE, ONE, positions=[0.0, 1.0])
    np.testing.assert_allclose(got[:, 0], [0.5 * 0.25 * 0.5, 0.5 * 0.5 * 0.5 + 0.5], rtol=1e-14)
    # a query before every token sees nothing: field 0
    got = R.field("softmax", X, ONE, ONE, ONE, positions=[0.5, 1.0], queries=[[3.0]],
                  query_positions=[0.1])
    assert got.tolist() == [[0.0]]
    # two heads of the linear kind, W_O and b_O: head h is the 1-D field of coordinate h
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 2))
    W, bO = rng.normal(size=(2, 2)), rng.normal(size=2)
    heads = R.field("linear", X, np.eye(2), np.eye(2), np.eye(2), heads=2, W_O=W, b_O=bO)
    cols = [R.field("linear", X[:, [h]], ONE, ONE, ONE)[:, 0] for h in range(2)]
    np.testing.assert_allclose(heads, np.stack(cols, axis=1) @ W.T + bO, rtol=1e-13)
    # biases: b_V adds b_V to every value, so a normalised field moves by exactly b_V
    shift = R.field("softmax", X, np.eye(2), np.eye(2), np.eye(2), b_V=[1.0, -2.0])
    np.testing.assert_allclose(shift - R.field("softmax", X, np.eye(2), np.eye(2), np.eye(2)),
                               np.tile([1.0, -2.0], (4, 1)), rtol=1e-13)


def test_velocity_reads_the_attention_at_t():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(5, 2))
    Q0, K0, V0 = rng.normal(size=(3, 2, 2))
    b = rng.normal(size=(2, 2))
    att = tp.Attention("softmax", Layers(np.stack([Q0, 2 * Q0])), K0, lambda t: (1 + t) * V0,
                       b_V=Layers(b[:, None, :]), masked=True)
    pos = np.linspace(0, 1, 5)
    got = R.velocity(att, X, t=1.5, positions=pos)
    want = R.field("softmax", X, 2 * Q0, K0, 2.5 * V0, b_V=b[1], positions=pos)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    with pytest.raises(ValueError, match="positions"):
        R.velocity(att, X)


# --------------------------------------------------------------------------- Sinkhorn
@pytest.mark.parametrize("eps", [1.0, 0.1])
def test_sinkhorn_coupling_matches_pot(eps):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(6, 2))
    A = np.array([[0.0, -1.0], [1.0, 0.3]])          # non-symmetric score
    S = X @ A @ X.T
    w = rng.uniform(0.2, 1.0, 6)
    w /= w.sum()
    f, g = R.sinkhorn_potentials(S, w, eps)
    plan = w[:, None] * w[None, :] * np.exp((f[:, None] + g[None, :] + S) / eps)
    pot = ot.sinkhorn(w, w, -S, eps, method="sinkhorn_log", numItermax=100_000,
                      stopThr=1e-15, warn=False)
    # both plans hold their marginals to ~1e-13: entries agree to that order
    np.testing.assert_allclose(plan.sum(1), w, rtol=0, atol=1e-13)
    np.testing.assert_allclose(plan.sum(0), w, rtol=0, atol=1e-13)
    np.testing.assert_allclose(plan, pot, rtol=0, atol=1e-11)


def test_sinkhorn_field_is_the_coupling_average_and_out_of_sample():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(5, 2))
    A = rng.normal(size=(2, 2))
    S = X @ A.T @ X.T                                  # s(x_i, x_j) = <A x_i, x_j>
    f, g = R.sinkhorn_potentials(S, np.full(5, 0.2), 1.0)
    plan = 0.04 * np.exp(f[:, None] + g[None, :] + S)
    got = R.field("sinkhorn", X, A, np.eye(2), np.eye(2))
    np.testing.assert_allclose(got, (plan / 0.2) @ X, rtol=1e-12)
    # a query equal to a token gets that token's field
    q = R.field("sinkhorn", X, A, np.eye(2), np.eye(2), queries=X[2:3])
    np.testing.assert_allclose(q, got[2:3], rtol=1e-12)


def test_sinkhorn_refuses_masks_and_reports_non_convergence():
    X = np.array([[0.0], [1.0], [3.0]])
    with pytest.raises(ValueError, match="cannot be masked"):
        R.field("sinkhorn", X, ONE, ONE, ONE, positions=[0.0, 0.5, 1.0])
    with pytest.raises(R.SinkhornReferenceError, match="did not reach"):
        R.sinkhorn_potentials(X @ X.T, np.full(3, 1 / 3), 0.05, max_iter=2)


# --------------------------------------------------------------------------- primitives
def test_primitives_agree_with_the_head_references():
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(6, 3)), rng.normal(size=(9, 3)), rng.normal(size=(9, 2))
    w = rng.uniform(0.1, 1.0, 9)
    w /= w.sum()
    ranges = KeyRanges(np.array([0, 0, 2, 0, 5, 1]), np.array([0, 1, 4, 9, 9, 3]), 9)
    visible = ranges.mask()          # every query a different range, one of them empty
    p = R.HeadProblem(q=q, k=k, v=v, q_tokens=k, w=w, visible=visible, beta=1.0)
    out, lse = R.softmax(q, k, v, np.log(w), ranges)
    np.testing.assert_allclose(out, R.softmax_head(p), rtol=1e-13, atol=1e-15)
    assert lse[0] == -np.inf and np.all(np.isfinite(lse[1:]))
    np.testing.assert_allclose(lse[1:], [np.log(np.sum(w[a:b] * np.exp(k[a:b] @ q[i])))
                                         for i, (a, b) in enumerate(zip(ranges.lo, ranges.hi, strict=True))
                                         if b > a], rtol=1e-13)
    np.testing.assert_array_equal(R.lse(q, k, np.log(w), ranges), lse)   # the same computation
    for phi, head in (("identity", R.linear_head), ("sigmoid", R.sigmoid_head),
                      ("relu", R.relu_head)):
        np.testing.assert_allclose(R.pointwise(phi, q, k, v, w, ranges), head(p), rtol=1e-13,
                                   atol=1e-15)
    with pytest.raises(ValueError, match="one range per query"):
        R.lse(q, k, None, ranges.take(slice(0, 5)))


def test_primitive_conventions_for_non_finite_rows():
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    bias = np.zeros(6)
    bias[4] = np.nan
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[5], v_bad[5] = np.nan, np.nan                   # never visible: never read
    out, lse = R.softmax(q, k_bad, v_bad, bias, KeyRanges(np.array([0, 1, 0]),
                                                          np.array([4, 5, 0]), 6))
    assert np.all(np.isfinite(out[0])) and np.isfinite(lse[0])
    assert out[1:].tolist() == [[0.0, 0.0], [0.0, 0.0]] and np.all(np.isneginf(lse[1:]))
    assert np.all(np.isfinite(R.pointwise("relu", q, k_bad, v_bad, np.ones(6),
                                              KeyRanges.prefix([5, 5, 5], 6))))
    out, lse = R.softmax(q, k, v, np.full(6, -np.inf), None)    # every weight zero
    assert np.all(out == 0.0) and np.all(np.isneginf(lse))


# --------------------------------------------------------------------------- independence
def test_references_import_nothing_from_the_package():
    path = Path(R.__file__)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("transformer_pde"), \
                ast.dump(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("transformer_pde") for a in node.names)


_WITHOUT_HYPOTHESIS = r'''
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hypothesis":
            raise ImportError("blocked for this test: " + name)
sys.meta_path.insert(0, Block())
import numpy as np
from transformer_pde.testing import references
print(sorted(references.REFERENCES)[0])
import transformer_pde.testing as T
try:
    T.measures
except ImportError as exc:
    print("strategies:", exc)
'''


def test_references_import_without_hypothesis():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    res = subprocess_runs.run([sys.executable, "-c", _WITHOUT_HYPOTHESIS], capture_output=True,
                              text=True, cwd=root, env=env, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "exp"
    assert lines[1].startswith("strategies:") and "hypothesis" in lines[1]
