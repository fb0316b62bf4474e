"""Idealised decoder flows: what the theory predicts for causal and pre-norm attention.

With :math:`Q = K = V = I` (the derivations are on the page *Decoder blocks as flows*):

* causal mask on the sphere: token 0 attends only to itself and never moves; token 1 is
  the exact causal pair :math:`\\rho' = e^{\\beta\\rho}(1-\\rho^2)/(e^{\\beta\\rho}+e^\\beta)`
  whatever the number of tokens; every token converges to token 0 with
  :math:`1 - \\cos \\sim e^{-t}`;
* pre-norm (:math:`\\dot x = A(\\Theta)`): radii grow like :math:`t`, and the angular
  contraction is polynomial, :math:`1-\\rho \\propto r^{-2}` (equiangular, unmasked) and
  :math:`\\propto r^{-1}` (causal), against the exponential :math:`e^{-2t}` (equiangular)
  and :math:`e^{-t}` (causal) of post-norm.

References: the exact reductions of the library (``causal_pair``, ``equiangular``, DOP853 at
``rtol=2.5e-14``), scipy's DOP853 for the pre-norm pair, and the derived exponents.
Tolerances are the measured RK4 errors of the runs (fourth order in dt) with a margin.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.diagnostics.decoder import FirstTokenDistances, distance_to_first
from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.equiangular_flow import equiangular
from transformer_pde.reductions.pairs import causal_pair


def identity_attention(d, beta, masked):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta, masked=masked)


def causal_tokens(n, d, seed):
    """Random unit tokens with token 0 = e_1 exactly (so that x/|x| maps it to itself
    in floating point, whatever the CPU)."""
    X = np.random.default_rng(seed).normal(size=(n, d))
    X[0] = np.eye(d)[0]
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def equiangular_tokens(n, d, rho0):
    """n unit tokens with every pairwise inner product rho0 >= 0 (needs d > n)."""
    X = np.zeros((n, d))
    X[:, :n] = np.sqrt(1.0 - rho0) * np.eye(n)
    X[:, n] = np.sqrt(rho0)
    return X


def slope(x, y):
    return float(np.polyfit(x, y, 1)[0])


# ------------------------------------------------------------------ causal, on the sphere
def test_causal_sphere_first_token_fixed_and_the_others_converge_to_it():
    n, d, beta = 6, 3, 1.0
    X0 = causal_tokens(n, d, seed=5)
    tr = tp.simulate(identity_attention(d, beta, True), X0, t_max=45.0, dt=0.1, solver="rk4",
                     positions=np.arange(n) / n, block=tp.Block(constraint="sphere"),
                     saveat=tp.SaveAt(every=5))
    assert tr.status == "ok"
    # token 0 sees only itself: A_0 = x_0 exactly, P_{x_0} x_0 = x_0 - 1.0 x_0 = 0 exactly
    np.testing.assert_array_equal(tr.states[:, 0], np.broadcast_to(X0[0], (len(tr.times), d)))
    r = distance_to_first(tr)
    t = r.times
    # the minimum cosine to token 0 increases from a short transient on ...
    late = t >= 1.0
    assert np.all(np.diff(r.min_cosine[late]) >= -1e-15)
    # ... and reaches 1 - 1e-6 by t = 20 (measured: 1 - min cos = 4.9e-8 at t = 20)
    assert r.max_one_minus_cosine[t >= 20.0].max() < 1e-6
    # rate: linearising at the merged state, the tangent offsets obey
    # delta_i' = mean_{j<=i} delta_j - delta_i, eigenvalues -i/(i+1): the slowest is -1/2, so
    # 1 - cos = |delta|^2/2 decays like e^{-t} (the next mode adds O(e^{-t/6}))
    w = (t >= 30.0) & (t <= 45.0)
    assert abs(slope(t[w], np.log(r.max_one_minus_cosine[w])) + 1.0) < 0.02
    # token 1 attends to tokens 0 and 1 only: the exact causal pair, whatever n
    # (RK4 at dt = 0.1: 2.2e-8; 1.4e-9 at dt = 0.05)
    pair = causal_pair(beta, float(X0[0] @ X0[1]), t)
    np.testing.assert_allclose(r.cosine[:, 1], pair.rho, rtol=0, atol=5e-8)


@pytest.mark.parametrize("beta", [1.0, 4.0])
def test_causal_pair_angle_follows_the_exact_ode(beta):
    # rho' = e^{beta rho} (1 - rho^2) / (e^{beta rho} + e^{beta}); RK4 with dt = 0.01 is
    # accurate to a few 1e-12 here (1.6e-10 at dt = 0.025, fourth order)
    X0 = np.array([[1.0, 0.0, 0.0], [np.cos(2.5), np.sin(2.5), 0.0]])
    tr = tp.simulate(identity_attention(3, beta, True), X0, t_max=10.0, dt=0.01, solver="rk4",
                     positions=np.array([0.0, 0.5]), block=tp.Block(constraint="sphere"),
                     saveat=tp.SaveAt(every=20))
    r = distance_to_first(tr)
    ref = causal_pair(beta, float(np.cos(2.5)), r.times)
    np.testing.assert_allclose(r.cosine[:, 1], ref.rho, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(tr.states[:, 0], np.broadcast_to(X0[0], tr.states[:, 0].shape))
    assert r.min_cosine[-1] > r.min_cosine[0]


# ------------------------------------------------------------------ pre-norm against post-norm
def test_pre_norm_equiangular_linear_radius_and_polynomial_contraction():
    n, d, beta, rho0 = 4, 5, 1.0, 0.3
    X0 = equiangular_tokens(n, d, rho0)
    att = identity_attention(d, beta, False)
    pre = tp.simulate(att, X0, t_max=60.0, dt=0.1, solver="rk4",
                      block=tp.Block(normalization="pre"), saveat=tp.SaveAt(every=5))
    r = distance_to_first(pre)
    t, u = r.times, r.one_minus_cosine[:, 1]
    ref = equiangular(beta, n, rho0, t, normalization="pre")
    # RK4 error at dt = 0.1: 1.8e-7 in rho, 1e-7 relative in r (1/16 of it at dt = 0.05)
    np.testing.assert_allclose(r.cosine[:, 1], ref.rho, rtol=0, atol=1e-6)
    np.testing.assert_allclose(r.radius, np.broadcast_to(ref.r[:, None], r.radius.shape),
                               rtol=1e-6)
    w = t >= 30.0
    # radius: r' = <theta, A> = 1 - O(1 - rho) (u = 1e-3 at t = 30)
    assert abs(slope(t[w], r.radius_mean[w]) - 1.0) < 1e-3
    # contraction: d log u / d log r = -2 (1 + O(u)), the slope of the exact reduction
    s_run, s_ref = slope(np.log(r.radius[w, 0]), np.log(u[w])), \
        slope(np.log(ref.r[w]), np.log(ref.one_minus_rho[w]))
    assert abs(s_run - s_ref) < 1e-6 and abs(s_run + 2.0) < 1e-3
    # in t: 1 - rho ~ C t^-2 (the offset r0 makes the finite-window slope -2 (1 - O(1/t)))
    assert abs(slope(np.log(t[w]), np.log(u[w])) + 2.0) < 0.03
    # post-norm on the same tokens: exponential, 1 - rho ~ e^{-2t}
    post = tp.simulate(att, X0, t_max=12.0, dt=0.05, solver="rk4",
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(every=5))
    q = distance_to_first(post)
    ref_post = equiangular(beta, n, rho0, q.times)
    np.testing.assert_allclose(q.one_minus_cosine[:, 1], ref_post.one_minus_rho, rtol=1e-5)
    wp = q.times >= 6.0
    assert abs(slope(q.times[wp], np.log(q.one_minus_cosine[wp, 1])) + 2.0) < 1e-3
    # ... while pre-norm's exponential rate over its late window is only -2/t
    assert abs(slope(t[w], np.log(u[w]))) < 0.1
    np.testing.assert_allclose(q.radius, 1.0, rtol=1e-14)


def test_causal_pre_norm_pair_and_first_token_radius():
    # token 0: x_0' = theta_0, so r_0 = 1 + t along the fixed direction e_1.  Token 1:
    # r' = (rho e^{b rho} + e^b)/Z, rho' = e^{b rho}(1 - rho^2)/(Z r), Z = e^{b rho} + e^b
    n, d, beta = 5, 3, 1.0
    X0 = causal_tokens(n, d, seed=7)
    X0[1] = [np.cos(0.45), np.sin(0.45), 0.0]       # 1 - rho0 = 0.1
    tr = tp.simulate(identity_attention(d, beta, True), X0, t_max=60.0, dt=0.05,
                     solver="rk4", positions=np.arange(n) / n,
                     block=tp.Block(normalization="pre"), saveat=tp.SaveAt(every=20))
    r = distance_to_first(tr)
    t = r.times
    np.testing.assert_allclose(r.radius[:, 0], 1.0 + t, rtol=1e-13)
    np.testing.assert_array_equal(tr.states[:, 0, 1:], 0.0)

    def rhs(_, y):
        rho, rad = y
        e, eb = np.exp(beta * rho), np.exp(beta)
        return [e * (1.0 - rho * rho) / ((e + eb) * rad), (rho * e + eb) / (e + eb)]

    sol = solve_ivp(rhs, (0.0, 60.0), [float(X0[0] @ X0[1]), 1.0], method="DOP853",
                    t_eval=t, rtol=1e-13, atol=1e-15)
    # RK4 at dt = 0.05: about 1e-8 (1.2e-7 at dt = 0.1)
    np.testing.assert_allclose(r.cosine[:, 1], sol.y[0], rtol=0, atol=5e-8)
    np.testing.assert_allclose(r.radius[:, 1], sol.y[1], rtol=1e-8)
    # polynomial contraction of the pair: d log u / d log r -> -1 (u' = -u/r (1 + O(u)))
    w = t >= 30.0
    assert abs(slope(np.log(r.radius[w, 1]), np.log(r.one_minus_cosine[w, 1])) + 1.0) < 0.01
    # the other tokens are drawn in too, more slowly; every radius grows
    assert np.all(np.diff(r.min_cosine[t >= 10.0]) > 0) and np.all(np.diff(r.radius_min) > 0)


# ------------------------------------------------------------------ the diagnostic itself
def test_distance_to_first_values_and_accuracy_near_one():
    S = np.array([[[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0]],
                  [[2.0, 0.0], [1.0, 1e-9], [0.0, 0.0]]])
    r = distance_to_first(S, times=[0.0, 1.5])
    assert isinstance(r, FirstTokenDistances)
    np.testing.assert_array_equal(r.cosine[0], [1.0, 0.0, -1.0])
    np.testing.assert_allclose(r.angle[0], [0.0, np.pi / 2, np.pi], rtol=1e-15)
    np.testing.assert_allclose(r.distance[0], [0.0, np.sqrt(13.0), 3.0], rtol=1e-15)
    np.testing.assert_array_equal(r.radius[0], [2.0, 3.0, 1.0])
    # 1 - cos(1e-9) = 5e-19, which 1 - cosine cannot resolve
    np.testing.assert_allclose(r.one_minus_cosine[1, 1], 5e-19, rtol=1e-6)
    np.testing.assert_allclose(r.angle[1, 1], 1e-9, rtol=1e-6)
    assert np.isnan(r.cosine[1, 2]) and r.radius[1, 2] == 0.0   # a zero token: no direction
    np.testing.assert_array_equal(r.radius_max, [3.0, 2.0])
    np.testing.assert_allclose(r.radius_mean, [2.0, (3.0 + 1e-18) / 3], rtol=1e-15)
    d = r.as_dict()
    assert d["times"] == [0.0, 1.5] and d["min_cosine"][0] == -1.0
    single = distance_to_first(np.ones((3, 1, 2)))
    np.testing.assert_array_equal(single.min_cosine, 1.0)
    np.testing.assert_array_equal(single.max_one_minus_cosine, 0.0)


def test_distance_to_first_refuses_bad_input():
    with pytest.raises(ArgumentError, match="states must have shape"):
        distance_to_first(np.ones((2, 3, 4, 5)))
    with pytest.raises(ArgumentError, match="NaN or inf"):
        distance_to_first(np.array([[[1.0, np.nan]]]))
    with pytest.raises(ArgumentError, match="times must have 2 entries"):
        distance_to_first(np.ones((2, 3, 4)), times=[0.0])
