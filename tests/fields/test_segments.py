"""Packed segments and sliding windows of the field evaluator (key ranges in the field).

Two independent references:

* a token set in ``segments`` must move exactly as its segments run one by one (separate
  evaluators, no ranges involved): 1e-12, the rounding of a few hundred operations on
  O(1) numbers, far below any wrong key or wrong normalisation (O(1e-2) here);
* a sliding window is checked against a dense visibility mask built here by sorting each
  segment's keys by (position, index) and keeping the last ``w`` at or before the query,
  fed to the per-query loops of :mod:`transformer_pde.testing.references`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.attention import KINDS, Rotary
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.fields import FieldEvaluator
from transformer_pde.testing import CORE_KINDS, references

ALL_KINDS = sorted(CORE_KINDS)
MASKABLE = [k for k in ALL_KINDS if KINDS[k].maskable]
SIZES = [3, 5, 1, 4]
#: agreement of a packed run with its separate runs (see the module docstring)
TOL = 1e-12


def _attention(kind: str, rng: np.random.Generator, *, masked: bool, window=None):
    """Two query heads sharing one key/value head, every bias, W_O, a shift where the kind
    has one and rotary positions where it is defined."""
    d = 4
    kw = dict(heads=2, kv_heads=1, masked=masked, window=window, W_O=rng.normal(size=(d, d)),
              b_Q=rng.normal(size=d), b_K=rng.normal(size=2), b_V=rng.normal(size=2),
              b_O=rng.normal(size=d))
    if kind in ("exp", "softmax", "l2", "sinkhorn"):
        kw["shift"] = 0.3
    if kind not in ("galerkin", "fourier"):
        kw["rotary"] = Rotary(base=7.0, span=4.0)
    if kind != "l2":
        kw["beta"] = 0.7
    return tp.Attention(kind, 0.6 * rng.normal(size=(d, d)), 0.6 * rng.normal(size=(2, d)),
                        rng.normal(size=(2, d)), **kw)


def _separately(att, X, w, pos, sizes, backend):
    out, o = [], 0
    for n in sizes:
        part = slice(o, o + n)
        ev = FieldEvaluator(att, n, weights=w[part], positions=pos[part], backend=backend)
        out.append(ev.be.to_numpy(ev(0.0, ev.be.asarray(X[part]))))
        o += n
    return np.concatenate(out)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_packed_run_equals_its_segments_run_alone(kind, masked, backend, rng):
    if masked and not KINDS[kind].maskable:
        pytest.skip(f"{kind} cannot be masked")
    att = _attention(kind, rng, masked=masked)
    N = sum(SIZES)
    X = rng.normal(size=(N, 4))
    w = rng.uniform(0.2, 1.0, size=N)                   # masses, normalised per segment
    pos = rng.choice([0.0, 0.25, 0.5, 1.0], size=N)     # ties inside segments
    ev = FieldEvaluator(att, N, weights=w, positions=pos, segments=SIZES, backend=backend)
    got = ev.be.to_numpy(ev(0.0, ev.be.asarray(X)))
    np.testing.assert_allclose(got, _separately(att, X, w, pos, SIZES, backend),
                               rtol=0, atol=TOL)


@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=5),
       window=st.none() | st.integers(1, 6), seed=st.integers(0, 2**16))
def test_any_packing_equals_its_segments_alone(sizes, window, seed, backend):
    # random layouts: single-token segments, windows wider than a segment, tied positions
    rng = np.random.default_rng(seed)
    att = tp.Attention("softmax", *rng.normal(size=(3, 2, 2)), masked=True, window=window)
    N = sum(sizes)
    X, w = rng.normal(size=(N, 2)), rng.uniform(0.1, 1.0, size=N)
    pos = rng.choice([0.0, 0.5, 1.0], size=N)
    ev = FieldEvaluator(att, N, weights=w, positions=pos, segments=sizes, backend=backend)
    got = ev.be.to_numpy(ev(0.0, ev.be.asarray(X)))
    np.testing.assert_allclose(got, _separately(att, X, w, pos, sizes, backend),
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", ["softmax", "linear", "sinkhorn"])
def test_velocity_with_segments_equals_separate_calls(kind, backend, rng):
    att = tp.Attention(kind, *rng.normal(size=(3, 3, 3)))
    X = rng.normal(size=(sum(SIZES), 3))
    got = tp.velocity(att, X, segments=SIZES, backend=backend)
    ends = np.cumsum(SIZES)
    want = np.concatenate([tp.velocity(att, X[e - n:e], backend=backend)
                           for n, e in zip(SIZES, ends, strict=True)])
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_l2_segments_far_apart_are_as_accurate_as_alone(masked, backend, rng):
    # each segment is centred on its own keys' midrange: a shared one (here ~5e3 away from
    # both) would cancel |k - c|^2 ~ 2.5e7 and lose ~1e-9 of the logits
    att = tp.Attention("l2", *rng.normal(size=(3, 2, 2)), masked=masked)
    X = np.concatenate([rng.normal(size=(4, 2)), 1e4 + rng.normal(size=(5, 2))])
    pos = rng.uniform(size=9)
    got = tp.velocity(att, X, positions=pos, segments=[4, 5], backend=backend)
    want = np.concatenate([tp.velocity(att, X[:4], positions=pos[:4], backend=backend),
                           tp.velocity(att, X[4:], positions=pos[4:], backend=backend)])
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("kind", MASKABLE)
def test_one_segment_and_a_window_past_the_end_change_nothing(kind, rng):
    # bit for bit: one segment is no segment, a window of all tokens is the causal mask
    att = _attention(kind, rng, masked=True)
    X, pos = rng.normal(size=(7, 4)), rng.uniform(size=7)
    plain = tp.velocity(att, X, positions=pos, backend="numpy")
    assert np.array_equal(tp.velocity(att, X, positions=pos, segments=[7], backend="numpy"),
                          plain)
    wide = att.replace(window=7)
    assert np.array_equal(tp.velocity(wide, X, positions=pos, backend="numpy"), plain)


# --------------------------------------------------------------------------- windows
def _window_mask(pos: np.ndarray, sizes: list[int], w: int) -> np.ndarray:
    """visible[i, j]: j is among the last w keys of i's segment at or before i's position,
    keys ordered by (position, index)."""
    N = pos.size
    seg = np.repeat(np.arange(len(sizes)), sizes)
    visible = np.zeros((N, N), dtype=bool)
    for i in range(N):
        keys = sorted((pos[j], j) for j in range(N) if seg[j] == seg[i] and pos[j] <= pos[i])
        for _, j in keys[-w:]:
            visible[i, j] = True
    return visible


def _window_reference(att, X, w, pos, sizes, window):
    P = att.at(0.0)
    (head,) = P.score_heads
    seg_w = np.concatenate([w[e - n:e] / w[e - n:e].sum()
                            for n, e in zip(sizes, np.cumsum(sizes), strict=True)])
    problem = references.HeadProblem(
        q=X @ head.Q.T, k=X @ head.K.T, v=X @ head.V.T, q_tokens=X @ head.Q.T, w=seg_w,
        visible=_window_mask(pos, sizes, window), beta=P.beta, l2_beta=P.l2_beta,
        shift=P.shift)
    return references.REFERENCES[att.kind](problem)


@pytest.mark.parametrize("sizes", [[9], [4, 5]], ids=["one segment", "two segments"])
@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("kind", MASKABLE)
def test_a_sliding_window_matches_a_dense_mask(kind, window, sizes, backend, rng):
    kw = {"shift": 0.2} if kind == "exp" else {}
    att = tp.Attention(kind, *(0.7 * rng.normal(size=(3, 3, 3))), masked=True, window=window,
                       **kw)
    N = sum(sizes)
    X = rng.normal(size=(N, 3))
    w = rng.uniform(0.2, 1.0, size=N)
    pos = rng.choice([0.0, 0.5, 0.75, 1.0], size=N)     # ties: a window counts keys
    got = tp.velocity(att, X, weights=w, positions=pos, segments=sizes, backend=backend)
    np.testing.assert_allclose(got, _window_reference(att, X, w, pos, sizes, window),
                               rtol=1e-12, atol=1e-12)


@given(pos=st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0]), min_size=1, max_size=8),
       window=st.integers(1, 9))
def test_window_of_queries_matches_the_dense_mask(pos, window):
    # queries at the tokens' own positions see exactly what the tokens see
    rng = np.random.default_rng(len(pos) * 10 + window)
    att = tp.Attention("softmax", *rng.normal(size=(3, 2, 2)), masked=True, window=window)
    X, p = rng.normal(size=(len(pos), 2)), np.array(pos)
    at_tokens = tp.velocity(att, X, positions=p, backend="numpy")
    at_queries = tp.velocity(att, X, positions=p, queries=X, query_positions=p,
                             backend="numpy")
    np.testing.assert_allclose(at_queries, at_tokens, rtol=0, atol=1e-15)
    np.testing.assert_allclose(at_tokens, _window_reference(att, X, np.ones(len(pos)), p,
                                                            [len(pos)], window),
                               rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- state, spec
def test_sinkhorn_warm_starts_per_segment_round_trip(rng):
    att = tp.Attention("sinkhorn", *rng.normal(size=(3, 2, 2)))
    X = rng.normal(size=(sum(SIZES), 2))
    ev = FieldEvaluator(att, X.shape[0], segments=SIZES, backend="numpy")
    ev(0.0, X)
    state = ev.get_state()
    assert sorted(w["segment"] for w in state["warm_starts"]) == [0, 1, 2, 3]
    assert len(state["info"]["sinkhorn_iterations"]) == len(SIZES)
    other = FieldEvaluator(att, X.shape[0], segments=SIZES, backend="numpy")
    other.set_state(state)
    np.testing.assert_array_equal(other(0.1, X + 0.01), ev(0.1, X + 0.01))


def test_the_default_backend_is_auto():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    ev = FieldEvaluator(att, 5)
    assert ev.be is tp.backends.get_backend("auto", n_tokens=5)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("segments, error, match", [
    ([3, 3], ArgumentError, "summing to the number of tokens 7"),
    ([], ArgumentError, "summing to the number of tokens"),
    ([7, 0], ArgumentError, r"segments\[1\] must be an integer >= 1"),
    ([3.5, 3.5], ArgumentError, r"segments\[0\] must be an integer"),
    ([True, 6], ArgumentTypeError, r"segments\[0\]"),
    ("7", ArgumentTypeError, "segments must be a sequence"),
    ([[3, 4]], ArgumentTypeError, "segments must be a sequence"),
    ([[3], [2, 2]], ArgumentTypeError, "segments must be a sequence"),
    (7, ArgumentTypeError, "segments must be a sequence"),
])
def test_bad_segments_are_refused_naming_them(segments, error, match):
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(error, match=match):
        FieldEvaluator(att, 7, segments=segments, backend="numpy")


def test_segments_refuse_queries_and_a_weightless_segment():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X = np.zeros((4, 2))
    with pytest.raises(ArgumentError, match="segments: the field of a token set in segments"):
        tp.velocity(att, X, segments=[2, 2], queries=X, backend="numpy")
    ev = FieldEvaluator(att, 4, segments=[2, 2], backend="numpy")
    with pytest.raises(ArgumentError, match="queries: a field evaluator with segments"):
        ev(0.0, X, X)
    with pytest.raises(ArgumentError, match="weights of segment 1 .tokens 2 to 3. are all zero"):
        FieldEvaluator(att, 4, weights=[1.0, 1.0, 0.0, 0.0], segments=[2, 2], backend="numpy")
