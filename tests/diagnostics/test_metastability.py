"""Interaction energy and merge events of attention flows on the sphere.

The energy E_beta = (1/2beta) sum_ij w_i w_j e^{beta<x_i,x_j> - c} is checked against a
direct sum, stays finite at beta = 1e4 with c = beta, and increases along USA and SA runs
(its derivative sum_i w_i |P A_i|^2 (/Z_i) is checked against finite differences of a
run).  Merge events count connected components at a distance and find the merge times.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.diagnostics.metastability import (MergeEvents, interaction_energy,
                                                       merge_events)
from transformer_pde.errors import ArgumentError, ArgumentTypeError, ScoreOverflowError


def circle(theta):
    theta = np.asarray(theta, dtype=float)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def unit(n, d, seed):
    X = np.random.default_rng(seed).normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


# ------------------------------------------------------------------ energy
def test_energy_is_the_double_sum():
    """Direct double loop at moderate beta (no overflow): rtol 1e-13 (sums of 36 terms)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 6, 3))
    w = rng.uniform(0.1, 1.0, size=6)
    beta, c = 2.5, 0.7
    p = w / w.sum()
    ref = [sum(p[i] * p[j] * np.exp(beta * X[t, i] @ X[t, j] - c)
               for i in range(6) for j in range(6)) / (2 * beta) for t in range(3)]
    np.testing.assert_allclose(interaction_energy(X, beta, shift=c, weights=w), ref,
                               rtol=1e-13)
    # one state (N, d) is a run of one time; zero weights drop tokens
    w0 = np.r_[w[:5], 0.0]
    np.testing.assert_allclose(interaction_energy(X[0], beta, weights=w0),
                               interaction_energy(X[0, :5], beta, weights=w[:5]), rtol=1e-14)


def test_energy_at_beta_1e4_is_finite_with_shift():
    X = circle([0.0, 1e-3, 2.0])
    beta = 1e4
    with pytest.raises(ScoreOverflowError, match="shift=beta"):
        interaction_energy(X, beta)
    E = interaction_energy(X, beta, shift=beta)
    # pairs: 3 diagonal terms 1, 2 * e^{beta(cos 1e-3 - 1)}, the rest underflow to ~0
    ref = (3 + 2 * np.exp(beta * (np.cos(1e-3) - 1))) / 9 / (2 * beta)
    np.testing.assert_allclose(E, [ref], rtol=1e-12)


@pytest.mark.parametrize("kind", ["exp", "softmax"])
def test_energy_increases_along_attention_on_the_sphere(kind):
    """Non-decreasing along USA and SA runs (rounding slack 1e-14 relative), and its rate
    equals sum_i w_i |P A_i|^2 (USA) or sum_i w_i |P A_i|^2 / Z_i (SA), checked by
    central differences of a fine RK4 run (O(dt^2) ~ 1e-5 relative)."""
    beta = 6.0
    X0 = unit(10, 3, seed=1)
    att = tp.Attention(kind, np.eye(3), np.eye(3), np.eye(3), beta=beta, shift=beta)
    traj = tp.simulate(att, X0, t_max=4.0, dt=0.01, block=tp.Block(constraint="sphere"))
    E = interaction_energy(traj, beta, shift=beta)
    assert np.all(np.diff(E) >= -1e-14 * E[1:])
    assert E[-1] > 1.05 * E[0]                      # it really moves
    k = 100
    X = traj.states[k]
    w = traj.weights
    K = np.exp(beta * (X @ X.T) - beta)
    A = (K * w[None, :]) @ X
    PA = A - np.sum(A * X, axis=1, keepdims=True) * X
    rate = np.sum(w * np.sum(PA * PA, axis=1) / (1.0 if kind == "exp" else K @ w))
    fd = (E[k + 1] - E[k - 1]) / (traj.times[k + 1] - traj.times[k - 1])
    np.testing.assert_allclose(fd, rate, rtol=1e-4)


def test_energy_arguments_are_checked():
    X = unit(4, 3, seed=2)
    with pytest.raises(ArgumentError, match="beta"):
        interaction_energy(X, 0.0)
    with pytest.raises(ArgumentError, match="shift"):
        interaction_energy(X, 1.0, shift=np.inf)
    with pytest.raises(ArgumentError, match="weights"):
        interaction_energy(X, 1.0, weights=[1.0, 2.0])
    with pytest.raises(ArgumentError, match="NaN"):
        interaction_energy(np.full((4, 3), np.nan), 1.0)
    with pytest.raises(ArgumentError, match="shape"):
        interaction_energy(np.ones(3), 1.0)
    with pytest.raises(ArgumentTypeError, match="traj_or_states"):
        interaction_energy("tokens", 1.0)


# ------------------------------------------------------------------ merges
def test_counts_are_connected_components_not_ranks():
    """A chain of tokens 0.009 apart is one component at tol 0.01 although its ends are
    far apart; three well separated pairs are three.  (The rank of a thresholded Gram
    matrix would count the chain as several.)"""
    chain = circle(np.arange(20) * 0.009)
    far = circle([0.0, 1e-4, 2.0, 2.0 + 1e-4, 4.0, 4.0 + 1e-4])
    ev = merge_events(np.stack([np.r_[chain[:6]], far]), tol=0.01)
    assert ev.counts.tolist() == [1, 3]
    assert ev.splits == [(1.0, 1, 3)] and ev.events == []
    assert merge_events(chain, tol=0.01).counts.tolist() == [1]
    assert merge_events(chain, tol=0.005).counts.tolist() == [20]


def test_merge_events_of_designed_states():
    states = np.stack([circle([0.0, 0.5, 1.5, 3.0]), circle([0.0, 0.0, 1.5, 3.0]),
                       circle([0.0, 0.0, 0.0, 3.0]), circle([0.0, 0.0, 0.0, 0.0])])
    ev = merge_events(states, tol=1e-3, times=[0.0, 1.0, 10.0, 100.0])
    assert isinstance(ev, MergeEvents)
    assert ev.counts.tolist() == [4, 3, 2, 1]
    assert ev.events == [(1.0, 4, 3), (10.0, 3, 2), (100.0, 2, 1)]
    np.testing.assert_array_equal(ev.merge_times, [1.0, 10.0, 100.0])
    with pytest.raises(ArgumentError, match="times"):
        merge_events(states, times=[0.0, 1.0])
    with pytest.raises(ArgumentError, match="tol"):
        merge_events(states, tol=-1.0)


def test_merge_time_of_a_pair_matches_the_pairing_law():
    """Two USA tokens with shift = beta: phi' = -e^{-beta(1 - cos phi)} sin phi (masses
    1/2 + 1/2).  In s with ds/dt = (1/2) e^{-beta(1-cos phi)} (M = 1 here, so ds/dt is half
    the exponential), tan(phi/2) = tan(phi0/2) e^{-2s}: the time to reach the chord tol is
    t = int_0^{s_tol} 2 e^{beta(1 - cos phi(s))} ds.  The event is seen at the first saved
    time after it: the saving grid (ratio 1.01) bounds the error."""
    from scipy.integrate import quad
    beta, phi0, tol = 20.0, 0.6, 1e-2
    phi_tol = 2 * np.arcsin(tol / 2)
    s_tol = 0.5 * np.log(np.tan(phi0 / 2) / np.tan(phi_tol / 2))

    def phi(s):
        return 2 * np.arctan(np.tan(phi0 / 2) * np.exp(-2 * s))
    t_pred = quad(lambda s: 2 * np.exp(beta * (1 - np.cos(phi(s)))), 0, s_tol,
                  epsabs=0, epsrel=1e-10, limit=200)[0]
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=beta, shift=beta)
    ts = np.r_[0.0, np.geomspace(1.0, 2 * t_pred, 400)]
    traj = tp.simulate(att, circle([0.0, phi0]), t_max=ts[-1], dt=0.05,
                       saveat=tp.SaveAt(ts=ts), block=tp.Block(constraint="sphere"))
    ev = merge_events(traj, tol=tol)
    assert ev.counts[0] == 2 and ev.counts[-1] == 1 and len(ev.events) == 1
    t_seen = ev.events[0][0]
    assert t_pred <= t_seen <= t_pred * 1.01 * (1 + 1e-6)
    with pytest.raises(ArgumentError, match="times"):
        merge_events(traj, times=ts)
