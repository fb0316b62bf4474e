"""The harmonic field (transformer_pde.fields.harmonic) against independent references.

References: the direct kernel sums written out here in the form that is accurate in
float64 (for unit vectors beta <x, y> - |beta| = -|beta| |x -+ y|^2 / 2, so no
cancellation in the exponent), the direct field of `velocity` (the default method), the
series of scipy's Bessel functions summed far beyond the truncation, and the other
backend.  Every tolerance is stated where it is used.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ive

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.fields import FieldEvaluator, velocity
from transformer_pde.fields.harmonic import HarmonicField, harmonic_modes
from transformer_pde.fields.harmonic_sphere import real_harmonics

BETAS = [-50.0, -1.0, 0.1, 1.0, 5.0, 100.0, 1000.0]
HARMONIC_BACKENDS = [b for b in tp.backends.available_backends() if b in ("numpy", "numba")]


def unit(X):
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def random_tokens(rng, n, d):
    return unit(rng.normal(size=(n, d)))


def clustered_tokens(rng, n, d, clusters=3, width=1e-3, antipodal=False):
    """``clusters`` tight groups (angular width ~``width``): every token has a large mass
    near it, so the harmonic expansion serves every query (no direct fallback);
    ``antipodal``: the groups come in pairs +-c (for beta < 0 the mass that matters sits
    at the antipode of the query)."""
    centres = random_tokens(rng, clusters, d)
    if antipodal:
        centres = np.concatenate([centres, -centres])
    X = centres[rng.integers(0, len(centres), size=n)] + width * rng.normal(size=(n, d))
    return unit(X)


def att_of(kind, d, beta, sign=1.0):
    shift = abs(beta) if kind == "exp" else 0.0     # e^{beta <x,y> - |beta|} <= 1: no overflow
    return tp.Attention(kind, np.eye(d), np.eye(d), sign * np.eye(d), beta=beta, shift=shift)


def direct_sums(X, w, Q, beta):
    """Scaled F_w(q) = sum_j w_j e^{beta <q, x_j> - |beta|} and the numerator (with x_j),
    with the exponent -|beta| |q -+ x_j|^2 / 2 (exact for unit vectors, no cancellation)."""
    sgn = 1.0 if beta >= 0 else -1.0
    diff = Q[:, None, :] - sgn * X[None, :, :]
    E = np.exp(-0.5 * abs(beta) * (diff * diff).sum(axis=2)) * w[None, :]
    return E.sum(axis=1), E @ X


# ------------------------------------------------------------------ the expansion
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", BETAS + [0.0])
def test_modes_meet_the_tail_bound(d, beta):
    # reference tail: scipy's coefficients summed term by term 4000 orders beyond K (the
    # terms decay faster than geometrically there, so the rest is below 1e-300)
    tol = 1e-13
    m = harmonic_modes(beta, d, tol)
    k = np.arange(m.order + 1, m.order + 4000, dtype=float)
    x = abs(beta)
    if d == 2:
        ref = 2.0 * ive(k, x).sum()
        total = ive(0.0, x) + 2.0 * ive(np.arange(1.0, m.order + 4000), x).sum()
    else:
        ref = 0.0 if x == 0 else ((2 * k + 1) * math.sqrt(math.pi / (2 * x)) * ive(k + 0.5, x)).sum()
        kk = np.arange(0.0, m.order + 4000)
        total = 1.0 if x == 0 else ((2 * kk + 1) * math.sqrt(math.pi / (2 * x))
                                    * ive(kk + 0.5, x)).sum()
    assert m.tail >= ref * (1 - 1e-12)            # a bound, never below the true tail
    target = min(tol / 64, 2.0 ** -53)
    assert m.tail <= target                       # and small enough
    # the scaled coefficients sum to one (the kernel at <x, y> = 1): 1e-13 for the
    # summation of up to ~8000 terms of size <= 1
    assert abs(total - 1.0) < 1e-13
    if m.order > 0:                               # K is the smallest such order
        smaller = 2.0 * ive(np.arange(m.order, m.order + 4000.0), x).sum() if d == 2 else \
            ((2 * np.arange(m.order, m.order + 4000.0) + 1) * math.sqrt(math.pi / (2 * x))
             * ive(np.arange(m.order, m.order + 4000.0) + 0.5, x)).sum()
        assert smaller > target * 0.5


def test_real_harmonics_are_orthonormal_and_obey_the_addition_theorem(rng):
    # addition theorem: sum_m Y_lm(x) Y_lm(y) = (2l+1)/(4 pi) P_l(x.y), P_l from numpy's
    # Legendre series; round-off of the recurrences ~1e-15 per degree up to L = 40
    L = 40
    X, Y = random_tokens(rng, 20, 3), random_tokens(rng, 20, 3)
    YX, YY = real_harmonics(X, L), real_harmonics(Y, L)
    c = (X * Y).sum(axis=1)
    for ell in (0, 1, 2, 7, 40):
        rows = slice(ell * ell, (ell + 1) ** 2)
        lhs = (YX[rows] * YY[rows]).sum(axis=0)
        coef = np.zeros(ell + 1)
        coef[ell] = 1.0
        rhs = (2 * ell + 1) / (4 * np.pi) * np.polynomial.legendre.legval(c, coef)
        np.testing.assert_allclose(lhs, rhs, atol=1e-12)
    # poles: no division by zero, the sectoral terms vanish
    P = real_harmonics(np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]), 5)
    assert np.all(np.isfinite(P))


@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("beta", BETAS)
def test_expansion_sums_within_their_bound(be_name, d, beta, rng):
    # the raw harmonic sums (no fallback) at every query, random and clustered tokens with
    # random masses and two segments: |F^ - F| and |N^ - N| within E_K + R, the bound the
    # per-query check uses, up to the reference's own round-off (4e-16 per unit mass)
    if d == 3 and be_name == "numpy" and abs(beta) >= 1000:
        pytest.skip("L = 256 harmonics in NumPy loops take minutes; the Numba case runs")
    n = 120
    for X in (random_tokens(rng, n, d), clustered_tokens(rng, n, d)):
        w = rng.random(n) + 0.1
        w[:50] /= w[:50].sum()
        w[50:] /= w[50:].sum()
        be = tp.backends.get_backend(be_name)
        hf = HarmonicField(att_of("softmax", d, beta), n, w, [(0, 50), (50, n)], be, 1e-13)
        seg = np.repeat([0, 1], [50, n - 50])
        F, N = hf._sums(X, X, seg)
        slack = hf.modes.tail + hf.R + 4e-16
        for s, (a, b) in enumerate([(0, 50), (50, n)]):
            Fr, Nr = direct_sums(X[a:b], w[a:b], X[seg == s], beta)
            assert np.abs(F[seg == s] - Fr).max() <= slack
            assert np.abs(N[seg == s] - Nr).max() <= slack


# ------------------------------------------------------------------ the field
@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("kind", ["softmax", "exp"])
@pytest.mark.parametrize("beta", BETAS)
def test_field_matches_the_direct_field(be_name, d, kind, beta, rng):
    # max-norm error over tokens relative to max |Gamma| <= 1e-12: the per-query bound is
    # 1e-13 against the local scale; the direct field itself carries |beta| u ~ 1e-13
    # relative at beta = 1000 (its exponents), which the comparison must absorb
    if d == 3 and be_name == "numpy" and abs(beta) >= 1000:
        pytest.skip("L = 256 harmonics in NumPy loops take minutes; the Numba case runs")
    n = 150
    served = 0
    groups = dict(clusters=1, antipodal=True) if beta < 0 else dict(clusters=2)
    for X, sign in ((clustered_tokens(rng, n, d, **groups), 1.0),
                    (random_tokens(rng, n, d), -1.0)):
        w = rng.random(n) + 0.05
        att = att_of(kind, d, beta, sign)
        ref = velocity(att, X, weights=w, backend="numpy")
        ev = FieldEvaluator(att, n, weights=w, backend=be_name, method="harmonic")
        out = ev(0.0, X)
        scale = np.abs(ref).max()
        assert np.abs(out - ref).max() <= 1e-12 * scale
        served += n - ev.info["harmonic_direct_queries"]
        via = velocity(att, X, weights=w, backend=be_name, method="harmonic")
        np.testing.assert_array_equal(via, out)
    assert served > 0          # the expansion itself answered, not only the direct sum


@pytest.mark.parametrize("d", [2, 3])
def test_numba_and_numpy_agree(d, rng):
    # two implementations of the same sums (different orders of summation): 1e-14
    # relative, ~50 u for the mode sums at beta = 20
    if "numba" not in HARMONIC_BACKENDS:
        pytest.skip("Numba not installed")
    X = clustered_tokens(rng, 200, d)
    att = att_of("softmax", d, 20.0)
    a = velocity(att, X, backend="numpy", method="harmonic", harmonic_tol=1e-11)
    b = velocity(att, X, backend="numba", method="harmonic", harmonic_tol=1e-11)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14 * np.abs(a).max())


@pytest.mark.parametrize("d", [2, 3])
def test_numba_result_does_not_depend_on_the_thread_count(d, rng):
    # fixed blocks, and the same arithmetic for every query whatever the chunking: one
    # thread and two give the same bits.  N is large enough that the launcher gives the
    # kernels (moments and mode sums) two threads, checked first so the test can fail
    if "numba" not in HARMONIC_BACKENDS:
        pytest.skip("Numba not installed")
    import numba  # Numba is optional: imported once the test knows it is installed

    from transformer_pde.backends.numba import NumbaBackend  # (same)
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread")
    n = 80_000 if d == 2 else 4_000
    X = clustered_tokens(rng, n, d, clusters=5, width=0.3)
    att = att_of("softmax", d, 5.0)
    one, two = NumbaBackend(n_threads=1), NumbaBackend(n_threads=2)
    ev1 = FieldEvaluator(att, n, backend=one, method="harmonic")
    order = ev1._harmonic.modes.order
    work = n * (order + 1) ** (d - 1)                       # the mode sums' work
    assert two.threads(work) == 2 and one.threads(work) == 1
    a = ev1(0.0, X)
    b = FieldEvaluator(att, n, backend=two, method="harmonic")(0.0, X)
    np.testing.assert_array_equal(a, b)


def test_numba_circle_groups_of_mixed_segments_equal_single_segment_groups(rng):
    # the Numba mode sums broadcast one segment's coefficients over a group of queries,
    # and take each query's own segment when a group mixes them: the same arithmetic,
    # so the same bits.  And the fused field (softmax N / F in the kernel) equals the
    # raw sums divided afterwards, bit for bit
    if "numba" not in HARMONIC_BACKENDS:
        pytest.skip("Numba not installed")
    n, m = 100, 64
    X = clustered_tokens(rng, n, 2, clusters=2, width=0.2)
    w = rng.random(n) + 0.1
    w[:50] /= w[:50].sum()
    w[50:] /= w[50:].sum()
    be = tp.backends.get_backend("numba")
    att = att_of("softmax", 2, 5.0)
    hf = HarmonicField(att, n, w, [(0, 50), (50, n)], be, 1e-13)
    Q = random_tokens(rng, m, 2)
    alt = np.arange(m) % 2
    F, N = hf._sums(X, Q, alt)
    for s in (0, 1):
        Fs, Ns = hf._sums(X, Q, np.full(m, s))
        np.testing.assert_array_equal(F[alt == s], Fs[alt == s])
        np.testing.assert_array_equal(N[alt == s], Ns[alt == s])
    Xu = hf._unit(X, "X")                                   # the rows the field uses
    F, N = hf._sums(Xu, Xu, hf.seg)
    out = hf(att.at(0.0), X)
    assert hf.info["harmonic_direct_queries"] == 0
    np.testing.assert_array_equal(out, N * (1.0 / F)[:, None])


@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
@pytest.mark.parametrize("d", [2, 3])
def test_segments_equal_separate_fields(be_name, d, rng):
    # each segment's moments alone: as if evaluated one by one (direct field, 1e-12 relative)
    sizes = [7, 40, 1, 52]
    X = np.concatenate([clustered_tokens(rng, s, d, clusters=2) for s in sizes])
    w = rng.random(X.shape[0]) + 0.1
    att = att_of("softmax", d, 8.0)
    out = velocity(att, X, weights=w, segments=sizes, backend=be_name, method="harmonic")
    edges = np.cumsum([0] + sizes)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        ref = velocity(att, X[a:b], weights=w[a:b], backend="numpy")
        np.testing.assert_allclose(out[a:b], ref, rtol=0, atol=1e-12 * max(np.abs(ref).max(), 1e-300))


@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
def test_queries_off_the_token_set(be_name, rng):
    X = clustered_tokens(rng, 80, 2)
    Q = random_tokens(rng, 30, 2)
    att = att_of("softmax", 2, 3.0)
    ref = velocity(att, X, queries=Q, backend="numpy")
    out = velocity(att, X, queries=Q, backend=be_name, method="harmonic")
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ fallback and refusals
@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
def test_query_with_little_mass_near_it_is_evaluated_directly(be_name, rng):
    # a heavy cluster at angle 0 and one token of mass 1e-9 at angle pi, beta = 100: at the
    # lone token F_w ~ 1e-9 while the expansion's absolute error is ~1e-15, a relative
    # 1e-6 -- its bound exceeds tol, so it is evaluated by the direct sum, and counted
    n = 60
    th = np.concatenate([1e-3 * rng.normal(size=n - 1), [np.pi]])
    X = np.stack([np.cos(th), np.sin(th)], axis=1)
    w = np.concatenate([np.full(n - 1, 1.0), [1e-9 * (n - 1)]])
    att = att_of("softmax", 2, 100.0)
    ev = FieldEvaluator(att, n, weights=w, backend=be_name, method="harmonic")
    out = ev(0.0, X)
    assert ev.info["harmonic_direct_queries"] >= 1
    ref = velocity(att, X, weights=w, backend="numpy")
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()
    # the lone token moves by its own weight only (its field is itself, x = (-1, 0))
    np.testing.assert_allclose(out[-1], [-1.0, 0.0], atol=1e-12)


def test_unreachable_tolerance_is_refused_naming_it():
    # tol 1e-15 at beta = 1000: the round-off of the sums alone is ~1e-14
    att = att_of("softmax", 2, 1000.0)
    with pytest.raises(ArgumentError, match="harmonic_tol.*smallest achievable"):
        FieldEvaluator(att, 10, backend="numpy", method="harmonic", harmonic_tol=1e-15)
    FieldEvaluator(att, 10, backend="numpy", method="harmonic", harmonic_tol=1e-12)


@pytest.mark.parametrize("make, what", [
    (lambda: tp.Attention("l2", np.eye(2), np.eye(2), np.eye(2)), "kind='l2'"),
    (lambda: tp.Attention("linear", np.eye(2), np.eye(2), np.eye(2)), "kind='linear'"),
    (lambda: tp.Attention("softmax", np.eye(4), np.eye(4), np.eye(4)), "d=4"),
    (lambda: tp.Attention("softmax", 2 * np.eye(2), np.eye(2), np.eye(2)), "Q is not"),
    (lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.diag([1.0, -1.0])), "V is neither"),
    (lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), heads=2), "heads=2"),
    (lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True), "masked"),
    (lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), b_V=np.ones(2)), "bias"),
    (lambda: tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), W_O=np.eye(2)), "W_O"),
    (lambda: tp.Attention("softmax", lambda t: np.eye(2), np.eye(2), np.eye(2)), "time"),
])
def test_attention_that_is_not_isotropic_is_refused(make, what):
    att = make()
    with pytest.raises(ArgumentError, match=f"field: method='harmonic'.*{what}"):
        FieldEvaluator(att, 5, backend="numpy", method="harmonic")


def test_bad_arguments(rng):
    att = att_of("softmax", 2, 1.0)
    X = random_tokens(rng, 5, 2)
    with pytest.raises(ArgumentError, match="method"):
        velocity(att, X, method="fast")
    with pytest.raises(ArgumentError, match="harmonic_tol"):
        velocity(att, X, method="harmonic", harmonic_tol=0.0)
    with pytest.raises(ArgumentTypeError, match="harmonic_tol"):
        velocity(att, X, method="harmonic", harmonic_tol="1e-13")
    with pytest.raises(ArgumentError, match="X: method='harmonic'.*unit sphere"):
        velocity(att, 1.01 * X, method="harmonic")
    with pytest.raises(ArgumentError, match="queries: method='harmonic'.*unit sphere"):
        velocity(att, X, queries=2 * X, method="harmonic")
    with pytest.raises(ArgumentError, match="dtype"):
        velocity(att, X.astype(np.float32), method="harmonic")
    with pytest.raises(ArgumentError, match="harmonic_tol.*only with method='harmonic'"):
        tp.FieldOptions(harmonic_tol=1e-12)
    with pytest.raises(ArgumentError, match="method"):
        tp.FieldOptions(method="fft")
    # tokens within 1e-6 of the sphere are accepted and used through x / |x|
    Y = X * (1 + 5e-7)
    np.testing.assert_allclose(velocity(att, Y, method="harmonic"),
                               velocity(att, X, method="harmonic"), atol=1e-15)


@pytest.mark.parametrize("be_name", HARMONIC_BACKENDS)
@pytest.mark.parametrize("beta, shift", [(100.0, 0.0), (1000.0, 295.0)])
def test_exp_field_beyond_the_exponential_range(be_name, beta, shift, rng):
    # e^{|beta| - shift} = e^{705} alone is near the float64 limit (1.8e308) while the field
    # is finite: the harmonic field scales by a power of two apart, like the direct one.
    # 1e-12 relative: both carry |beta| u ~ 1e-13 from the exponent
    X = clustered_tokens(rng, 60, 2, clusters=2)
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=beta, shift=shift)
    ref = velocity(att, X, backend="numpy")
    out = velocity(att, X, backend=be_name, method="harmonic")
    assert np.all(np.isfinite(out)) and np.abs(ref).max() > 1e300 * (shift > 0)
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()
