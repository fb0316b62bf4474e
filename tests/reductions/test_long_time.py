"""Long-time flows finish: the Gram flow's consensus tail and the equiangular flow's
saturated tail, against direct integrations and closed forms."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_pde.reductions.equiangular_flow import equiangular
from transformer_pde.reductions.gram import consensus_radius, gram_flow, random_gram
from transformer_pde.reductions.hitting import equiangular_time


def _wall(call):
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


@pytest.mark.parametrize("model, beta, shift", [("sa", 1.0, 0.0), ("sa", 8.0, 0.0),
                                                ("usa", 2.0, 0.0), ("usa", 3.0, 3.5)])
def test_gram_tail_equals_direct_integration_at_t_1e3(model, beta, shift):
    # the direct run is the old code path (one TimeLoop to t = 1e3, capped by stability at
    # steps ~ 3/kappa); the tail run must agree to the solver's tolerance rtol + atol
    # (the bound of consensus_radius), and both are within 1e-10 of the exact consensus
    G0 = random_gram(6, 8, np.random.default_rng(11))
    ts = np.array([0.0, 0.5, 3.0, 40.0, 1e3])
    fast = gram_flow(G0, beta, ts, model=model, shift=shift)
    assert fast.status == "ok" and "consensus tail" in fast.message
    slow = gram_flow(G0, beta, ts, model=model, shift=shift, tail=False)
    assert slow.status == "ok" and "tail" not in slow.message
    np.testing.assert_array_equal(fast.times, ts)
    assert np.abs(fast.grams - slow.grams).max() <= 2 * (1e-10 + 1e-12)
    # consensus: every pair has merged (e^{-2 kappa t} underflows)
    assert np.abs(fast.grams[-1] - 1.0).max() <= 1e-10


def test_gram_flow_at_t_1e12_finishes_in_a_second():
    # the reproducer: at t = 1e12 the old loop ran for minutes (steps capped near
    # 3 once the tokens merged); wall time is checked loosely here (the unit suite holds
    # no timed assertions beyond "did not run for minutes")
    G0 = random_gram(6, 8, np.random.default_rng(0))
    flow, wall = _wall(lambda: gram_flow(G0, 1.0, [1e12]))
    assert flow.status == "ok"
    assert wall < 5.0
    np.testing.assert_array_equal(flow.grams[-1], np.ones((6, 6)))
    batch = gram_flow(random_gram(5, 3, 1, batch=4), 2.0, [0.0, 1e300])
    assert batch.status == "ok"
    np.testing.assert_array_equal(batch.grams[-1], np.ones((4, 5, 5)))


def test_gram_tail_is_the_linearisation_of_the_equiangular_flow():
    # equiangular tokens near consensus: 1 - rho(t) from the equiangular ODE (its own
    # DOP853 at rtol 2.5e-14) and the Gram tail agree to the bound K eps^2 of the tail
    n, beta = 5, 3.0
    rho0 = 1.0 - 1e-7
    G0 = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    ts = np.array([0.0, 1.0, 2.0, 5.0])
    flow = gram_flow(G0, beta, ts, rtol=1e-12, atol=1e-14)
    assert "consensus tail" in flow.message
    gap = equiangular(beta, n, rho0, ts).one_minus_rho
    off = ~np.eye(n, dtype=bool)
    K = 3.0 + 9.0 * beta
    assert np.abs((1.0 - flow.grams[:, off]) - gap[:, None]).max() <= K * 1e-14 + 1e-14
    # and the tail decays at the linear rate 2: 1 - rho(t) ~ e^{-2t}(1 - rho0)
    np.testing.assert_allclose(gap, (1 - rho0) * np.exp(-2 * ts), rtol=1e-5)


def test_consensus_radius_bounds():
    # K eps^2 <= rtol + atol, beta eps <= 0.05, K eps <= 0.5 with K = 3 + 9 beta
    for beta in (0.0, 1.0, 1e3, 1e8):
        for rtol, atol in ((1e-10, 1e-12), (1e-3, 1e-3)):
            eps = consensus_radius(beta, rtol, atol)
            K = 3.0 + 9.0 * beta
            assert 0 < eps and K * eps ** 2 <= (rtol + atol) * (1 + 1e-12)
            assert beta * eps <= 0.05 and K * eps <= 0.5


def test_gram_exact_equilibria_stay():
    # an antipodal pair and the cross +-e1, +-e2 (unstable rest points, exact in floating
    # point): the field is exactly zero, so the flow keeps them at any time
    cross = np.kron(np.eye(2), np.array([[1.0, -1.0], [-1.0, 1.0]]))
    for G0 in (np.array([[1.0, -1.0], [-1.0, 1.0]]), cross):
        for model in ("sa", "usa"):
            flow, wall = _wall(lambda G0=G0, model=model: gram_flow(G0, 2.0, [1.0, 1e12],
                                                                     model=model))
            assert flow.status == "ok" and wall < 5.0
            assert "rest point" in flow.message or "t_max=1e+12 in" in flow.message
            np.testing.assert_array_equal(flow.grams, np.broadcast_to(G0, flow.grams.shape))


def test_gram_batch_of_a_rest_point_and_a_merging_start():
    # one member at a rest point (an antipodal pair twice: the cross), one that merges:
    # each ends its own way, and t = 1e12 answers at once
    cross = np.kron(np.eye(2), np.array([[1.0, -1.0], [-1.0, 1.0]]))
    G0 = np.stack([cross, random_gram(4, 3, 5)])
    flow, wall = _wall(lambda: gram_flow(G0, 1.5, [1.0, 1e3, 1e12]))
    assert flow.status == "ok" and wall < 5.0
    assert "rest point" in flow.message and "consensus tail" in flow.message
    np.testing.assert_array_equal(flow.grams[:, 0], np.broadcast_to(cross, (3, 4, 4)))
    np.testing.assert_array_equal(flow.grams[-1, 1], np.ones((4, 4)))
    alone = gram_flow(G0[1], 1.5, [1.0, 1e3], tail=False)
    assert np.abs(flow.grams[:2, 1] - alone.grams).max() <= 2 * (1e-10 + 1e-12)


def test_gram_step_budget_reports_the_absolute_time():
    G0 = random_gram(6, 8, np.random.default_rng(0))
    with pytest.warns(Warning, match="max_steps"):
        flow = gram_flow(G0, 1.0, [1e3], tail=False, max_steps=50)
    assert flow.status == "max_steps" and "1000" in flow.message


# --------------------------------------------------------------- equiangular
import transformer_pde.reductions.equiangular_flow as eqf  # noqa: E402

TAIL_CASES = [("post", {}), ("pre", {}), ("peri", {}), ("ngpt", {"alpha": 0.5}),
              ("cod", {}), ("mix", {"switch": 3.0})]


@pytest.mark.parametrize("model, shift", [("sa", 0.0), ("usa", 0.0), ("usa", 2.5)])
@pytest.mark.parametrize("scheme, opts", TAIL_CASES)
def test_equiangular_tail_equals_direct_integration(monkeypatch, scheme, opts, model, shift):
    # saturation lowered to v = 60 (1 - rho ~ n e^-60 ~ 1e-25, so the saturated rates are
    # exact to a relative beta (1 - rho) ~ 1e-25), against the same solve with no tail
    # (saturation at v = inf): the closed-form r(t) and rho = 1 agree to 1e-12 relative,
    # the accuracy of the DOP853 solve (rtol 2.5e-14) over these ranges
    n, beta, rho0 = 6, 1.5, 0.2
    r0 = 1.0 if scheme in ("post", "ngpt", "mix") else 1.3
    ts = np.concatenate([[0.0], np.geomspace(1e-2, 1e16, 19)])
    kw = dict(model=model, shift=shift, normalization=scheme, r0=r0, **opts)
    monkeypatch.setattr(eqf, "saturation_level", lambda n: 60.0)
    tail = eqf.equiangular(beta, n, rho0, ts, **kw)
    monkeypatch.setattr(eqf, "saturation_level", lambda n: math.inf)
    direct = eqf.equiangular(beta, n, rho0, ts, **kw)
    np.testing.assert_allclose(tail.r, direct.r, rtol=1e-12)
    np.testing.assert_allclose(tail.rho, direct.rho, rtol=0, atol=1e-13)
    # 1 - rho to full relative accuracy before the tail; after it (1 - rho <= n e^-60,
    # where the tail keeps v = 60) the direct solve is below that level too
    sat = tail.one_minus_rho <= n * math.exp(-60.0) * (1 + 1e-9)
    np.testing.assert_allclose(tail.one_minus_rho[~sat], direct.one_minus_rho[~sat],
                               rtol=1e-10)
    assert np.all(direct.one_minus_rho[sat] <= n * math.exp(-60.0) * (1 + 1e-9))


def test_equiangular_post_ln_saturates_on_its_closed_form():
    # SA post-LN: once beta (1 - rho) < 1e-17, v' = 2n e^{-beta u}/(1 + (n-1)e^{-beta u})
    # is 2 to the last bit, so 1 - rho = n/(e^v + n - 1) decays exactly like e^{-2t}; the
    # tail then gives rho = 1, 1 - rho = 0 (below the smallest double) at any later time
    n, beta = 6, 2.0
    ts = np.array([40.0, 100.0, 300.0, 360.0, 380.0, 1e3, 1e12, 1e300])
    sol = eqf.equiangular(beta, n, 0.0, ts)
    ref = sol.one_minus_rho[0] * np.exp(-2.0 * (ts[1:4] - ts[0]))
    np.testing.assert_allclose(sol.one_minus_rho[1:4], ref, rtol=1e-11)
    assert np.all(sol.one_minus_rho[4:] == 0.0) and np.all(sol.rho[4:] == 1.0)
    assert np.all(sol.r == 1.0)


@pytest.mark.parametrize("scheme, opts, model, beta, shift", [
    ("post", {}, "usa", 1.0, 0.0), ("post", {}, "usa", 30.0, 0.0), ("post", {}, "usa", 1.0, 30.0),
    ("post", {}, "usa", 30.0, -30.0), ("post", {}, "sa", 30.0, 0.0),
    ("ngpt", {"alpha": 0.5}, "usa", 30.0, 0.0), ("pre", {}, "usa", 30.0, 0.0),
    ("peri", {}, "usa", 1.0, 0.0), ("cod", {}, "usa", 30.0, -30.0),
    ("mix", {"switch": 3.0}, "usa", 1.0, 30.0)])
def test_equiangular_at_t_1e300_is_finite_and_fast(scheme, opts, model, beta, shift):
    # the reproducers: USA at t = 1e300 raised SolverNotConverged (v overflowed),
    # returned NaN, or overflowed in a trial stage (pre-LN, e^{beta - shift} = e^30); every
    # scheme now answers, with rho in range and r > 0
    sol, wall = _wall(lambda: eqf.equiangular(beta, 6, 0.0, [0.0, 1e3, 1e12, 1e300],
                                              model=model, shift=shift,
                                              normalization=scheme, **opts))
    assert wall < 10.0
    assert not np.isnan(sol.rho).any() and not np.isnan(sol.r).any()
    assert np.all((sol.rho >= -0.2) & (sol.rho <= 1.0)) and np.all(sol.one_minus_rho >= 0)
    assert np.all(np.diff(sol.rho) >= 0) and np.all(sol.r > 0)


def test_equiangular_radius_past_the_float_range_is_inf():
    # pre-LN USA with e^{beta - shift} = e^{630}: r ~ e^{630} t, beyond the float range at
    # t = 1e300, so r = inf there (and finite while e^{630} t < 1.8e308)
    sol = eqf.equiangular(30.0, 6, 1.0, [1e-100, 1e300], model="usa", shift=-600.0,
                          normalization="pre")
    assert np.isfinite(sol.r[0]) and sol.r[0] == pytest.approx(
        1.0 + math.exp(630.0) * 1e-100, rel=1e-12)
    assert sol.r[1] == math.inf


# --------------------------------------------------------------- fuzz
@settings(max_examples=25, deadline=None)
@given(scheme=st.sampled_from(["post", "pre", "peri", "ngpt", "cod", "mix"]),
       model=st.sampled_from(["sa", "usa"]), log_beta=st.floats(-2.0, 2.5),
       shift=st.floats(-40.0, 40.0), rho0=st.floats(-0.2, 1.0), log_t=st.floats(-3.0, 40.0))
def test_fuzz_equiangular_long_times(scheme, model, log_beta, shift, rho0, log_t):
    # any scheme, model, beta in [0.01, 316], shift in [-40, 40] (e^{beta - shift} up to
    # e^356), start and time up to 1e40: an answer
    # (never NaN, never a solver failure), rho in [-1/(n-1), 1] and non-decreasing in t
    # (rho' = 2 s tau >= 0), 1 - rho >= 0, r > 0 and non-decreasing where it moves
    n = 6
    beta = 10.0 ** log_beta
    kw = {"model": model, "normalization": scheme,
          "shift": shift if model == "usa" else 0.0}
    if scheme == "ngpt":
        kw["alpha"] = 0.7
    if scheme == "mix":
        kw["switch"] = 1.5
    ts = np.array([0.0, 10.0 ** log_t / 7, 10.0 ** log_t])
    sol = eqf.equiangular(beta, n, max(rho0, -1 / (n - 1)), ts, **kw)
    assert not np.isnan(sol.rho).any() and not np.isnan(sol.r).any()
    assert np.all(sol.rho >= -1 / (n - 1) - 1e-15) and np.all(sol.rho <= 1.0)
    assert np.all(np.diff(sol.rho) >= -1e-13) and np.all(sol.one_minus_rho >= 0)
    assert np.all(sol.r > 0) and np.all(np.diff(sol.r) >= -1e-12 * sol.r[1:])


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(2, 7), d=st.integers(2, 6),
       model=st.sampled_from(["sa", "usa"]), log_beta=st.floats(-2.0, 0.9))
def test_fuzz_gram_tail_agrees_with_integration(seed, n, d, model, log_beta):
    # random Gram matrices, both models, beta in [0.01, 8]: the run with the consensus tail
    # and the direct run to t = 200 agree to twice rtol + atol wherever both finish, and
    # the tail run answers t = 1e300 at once when it reached the tail
    beta = 10.0 ** log_beta
    G0 = random_gram(n, d, seed)
    ts = [0.0, 1.0, 30.0, 200.0]
    kw = {"model": model, "shift": beta if model == "usa" else 0.0, "warn": False}
    fast = gram_flow(G0, beta, ts, **kw)
    slow = gram_flow(G0, beta, ts, tail=False, max_steps=20_000, **kw)
    if fast.status == "ok" and slow.status == "ok":
        assert np.abs(fast.grams - slow.grams).max() <= 2 * (1e-10 + 1e-12)
    if "consensus tail" in fast.message:
        far = gram_flow(G0, beta, [1e300], **kw)
        assert far.status == "ok" and np.all(far.grams[-1] == 1.0)


@pytest.mark.parametrize("beta, rho0, model, t_rise", [
    (40.0, 0.0, "sa", 2.70572426e15), (50.0, 0.0, "sa", 4.83821077e19),
    (133.0, 0.6875, "sa", None), (56.0, 0.0, "usa", None), (100.0, 0.0, "usa", None)])
def test_equiangular_rise_shorter_than_the_float_spacing(beta, rho0, model, t_rise):
    # these raised SolverNotConverged ("Required step size is less than spacing between
    # numbers"): the rise to rho = 1 after a plateau of ~e^{beta(1 - rho0)} (SA), or under
    # a kernel e^{beta - shift} >= e^56 (USA), is shorter than the float spacing of t there.
    # The solve now continues with v as the clock; before the rise it agrees with the
    # closed-form hitting time (equiangular_time, SA) to the conditioning 1e-12, and after
    # it rho = 1
    n = 6
    ts = [1e-3, 1.0, 1e30]
    if t_rise is not None:
        rho = np.array([0.01, 0.1])
        ts = list(equiangular_time(beta, n, rho0, rho)) + [t_rise * 1.001, 1e30]
    sol = eqf.equiangular(beta, n, rho0, ts, model=model)
    assert sol.rho[-1] == 1.0 and sol.one_minus_rho[-1] == 0.0
    if t_rise is not None:
        np.testing.assert_allclose(sol.rho[:2], rho, rtol=1e-10)
        assert sol.rho[2] == 1.0
