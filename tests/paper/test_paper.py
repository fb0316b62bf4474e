"""Tests of :mod:`transformer_pde.paper`: the paper's scalings, covariance grids and rank sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde import paper
from transformer_pde.testing import references


def test_paper_attention_scalings_match_spec():
    from transformer_pde import velocity

    rng = np.random.default_rng(5)
    d = 4
    Q, K, V = rng.normal(size=(3, d, d))
    X = rng.normal(size=(7, d))
    # softmax: score <Qx, Ky>/sqrt(d)
    ref = references.field("softmax", X, Q, K, V, beta=1 / np.sqrt(d))
    np.testing.assert_allclose(velocity(paper.paper_attention("softmax", Q, K, V), X), ref,
                               rtol=1e-10)
    # L2: kernel exp(-|Qx/sqrt(d) - Ky|^2)
    ref = references.field("l2", X, Q / np.sqrt(d), K, V, l2_beta=1.0)
    np.testing.assert_allclose(velocity(paper.paper_attention("l2", Q, K, V), X), ref, rtol=1e-10)
    # multi-head: each head's score scaled by 1/sqrt(k)
    att = paper.paper_attention("softmax", Q, K, V, heads=2)
    for head in att.at(0.0).heads:
        # rounding: the scale is applied to Q before the product (a few ulp of the largest entry)
        np.testing.assert_allclose(head.A, K[head.rows].T @ Q[head.rows] / np.sqrt(2), rtol=1e-12,
                                   atol=1e-15)
    # sinkhorn: unscaled (a factor 1/sqrt(d) would halve A), eps = 1; A = K^T Q to rounding
    att = paper.paper_attention("sinkhorn", Q, K, V)
    np.testing.assert_allclose(att.at(0.0).heads[0].A, K.T @ Q, rtol=1e-14, atol=1e-15)
    assert att.eps == 1.0
    with pytest.raises(ValueError, match="kind"):
        paper.paper_attention("linear", Q, K, V)


def test_slice_covariances():
    S = paper.slice_covariances(8, radius=0.6, trace=2.5)
    np.testing.assert_allclose(np.trace(S, axis1=1, axis2=2), 2.5, rtol=1e-14)
    from transformer_pde.plot import cone_coordinates

    p = cone_coordinates(S)
    np.testing.assert_allclose(np.hypot(p[:, 0], p[:, 1]) / p[:, 2], 0.6, rtol=1e-14)
    R = paper.slice_covariances(5, init="random", trace=1.0, seed=2)
    np.testing.assert_allclose(np.trace(R, axis1=1, axis2=2), 1.0, rtol=1e-14)
    assert np.all(np.linalg.eigvalsh(R) >= 0)
    with pytest.raises(ValueError, match="radius"):
        paper.slice_covariances(3, radius=1.0)


def test_rank_sweep_identity_value_blows_up_to_rank_one():
    # V = I: Sigma^-1(t) = Sigma0^-1 - t (A + A^T) becomes singular along one direction, so
    # the blow-up limit Sigma / tr Sigma is rank one (exact reference solution)
    sw = paper.rank_sweep("softmax", 3, value="identity", draws=6, seed=1, t_max=200.0)
    blown = sw.status == "blowup"
    assert blown.any()
    assert np.all(sw.ranks[blown] == 1)


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name, n, first", [
    ("zero", 100, [[0.25, -0.25], [-0.25, 0.75]]),
    ("twolines", 276, [[0.052632, -0.184211], [-0.184211, 0.947368]]),
    ("blowup", 1184, [[0.025641, -0.141026], [-0.141026, 0.974359]]),
    ("initial", 648, [[0.034483, -0.155172], [-0.155172, 0.965517]]),
])
def test_init_grid_counts_and_first_matrix(name, n, first):
    # the counts and first matrices of the paper's grids (recorded from its code, 6 digits)
    S = paper.paper_figure(name).grid.covariances()
    assert S.shape == (n, 2, 2)
    np.testing.assert_allclose(S[0], first, atol=5e-7)
    np.testing.assert_allclose(np.trace(S, axis1=1, axis2=2), 1.0, rtol=1e-15)
    from transformer_pde.plot import cone_coordinates

    u, w, v = cone_coordinates(S).T
    assert np.all(v * v - u * u > w * w)  # strictly inside the cone


def test_paper_runs_table():
    runs = paper.paper_runs()
    assert [(r.figure, r.variant) for r in runs][:4] == [
        ("zero", "trad"), ("zero", "L2"), ("zero", "multihead"), ("zero", "sinkhorn")]
    assert len(runs) == 16 and all(r.paper for r in runs)
    assert paper.paper_run("initial", "multihead").heads == 1  # the paper's single-head "multihead"
    extra = paper.paper_run("initial", "multihead2")
    assert extra.heads == 2 and not extra.paper
    r = paper.paper_run("blowup", "L2")
    assert (r.rule.step, r.rule.tol_low, r.rule.tol_high, r.rule.max_iter) == (0.001, 1e-5, 1e4, 50_000)
    np.testing.assert_array_equal(paper.paper_run("line", "trad").K, -paper.paper_run("line", "trad").Q)
    with pytest.raises(ValueError, match="variant"):
        paper.paper_run("zero", "nope")
    with pytest.raises(ValueError, match="name"):
        paper.paper_figure("nope")


def test_plane_second_head_is_empty():
    # Q, K with one row and two heads: head 0 gets the row (scaled by 1/sqrt(k), k = 1), head 1
    # gets none, A_1 = 0 -- the paper's slicing
    r = paper.paper_run("plane", "multihead")
    heads = r.attention().at(0.0).heads
    np.testing.assert_allclose(heads[0].A[:1], (r.K.T @ r.Q)[:1], rtol=1e-14)
    np.testing.assert_array_equal(heads[1].A, np.zeros((2, 2)))


@pytest.mark.parametrize("run", paper.paper_runs(extras=True), ids=lambda r: f"{r.figure}-{r.variant}{r.heads}")
def test_moment_rhs_matches_library(run):
    # two independent writings of Sigma' (the reference from the raw matrices, the library
    # from its Attention): equal to rounding
    from transformer_pde import gaussian

    covs = run.covariances()[::9] * 2.3
    F = paper.moment_rhs(run.kind, run.Q, run.K, run.V, covs, heads=run.heads)
    G = np.stack([gaussian.moment_ode(run.attention(), np.zeros(2), S)[1] for S in covs])
    np.testing.assert_allclose(F, G, rtol=0, atol=1e-13 * np.abs(G).max())


def test_euler_reference_exact_1d_and_stops():
    # d = 1 softmax, V = 1, A = -1/1: sigma' = -2 sigma^2; Euler sigma_{n+1} = sigma_n - 2h sigma_n^2
    h, s = 0.1, [0.5]
    res = paper.euler_reference("softmax", [[1.0]], [[-1.0]], [[1.0]], [[[s[0]]]], step=h,
                                tol_low=1e-3, tol_high=10.0, max_iter=1000, save_every=1)
    while 2 * s[-1] ** 2 >= 1e-3:
        s.append(s[-1] - 2 * h * s[-1] ** 2)
    assert res.outcome[0] == "converged" and res.n_steps[0] == len(s) - 1
    np.testing.assert_allclose(res.path[0, :len(s), 0, 0], s, rtol=1e-14)
    assert np.isnan(res.path[0, len(s):]).all()
    # growth: sigma' = 2 sigma^2 exceeds the threshold; a zero budget ends at max_iter
    res = paper.euler_reference("softmax", [[1.0]], [[1.0]], [[1.0]], [[[0.5]], [[1.0]]], step=h,
                                tol_low=1e-3, tol_high=10.0, max_iter=1000)
    assert res.outcome.tolist() == ["exceeded", "exceeded"]
    assert np.all(res.covs[:, 0, 0] > 10.0)
    res = paper.euler_reference("softmax", [[1.0]], [[1.0]], [[1.0]], [[[0.5]]], step=h,
                                tol_low=1e-3, tol_high=10.0, max_iter=0)
    assert res.outcome[0] == "max_iter" and res.t_stop[0] == 0.0


def _outcomes(run, idx, t_max=None):
    from transformer_pde import gaussian

    covs = run.covariances()[idx]
    lib = gaussian.solve_batch(run.attention(), np.zeros((len(covs), 2)), covs,
                               t_max=t_max or run.rule.t_max, rtol=1e-8, atol=1e-12,
                               blowup_threshold=run.rule.tol_high)
    ref = paper.euler_run(run, covs)
    # the paper's Euler stops at the first crossing of tr Sigma = tol_high; the library's
    # status is the long-time answer, and a path that crosses the threshold transiently and
    # then converges stops its saved path at the crossing (its message says so): both are
    # "exceeded" in the paper's sense
    crossed = np.trace(lib.covs, axis1=1, axis2=2) >= run.rule.tol_high * (1 - 1e-9)
    return np.isin(lib.status, ["blowup", "diverging"]) | crossed, ref.outcome == "exceeded"


@pytest.mark.parametrize("figure, variant, stride", [
    ("blowup", "trad", 37), ("blowup", "multihead", 37), ("blowup", "sinkhorn", 37),
    ("initial", "trad", 13),
])
def test_outcome_matches_euler_reference_on_paper_grids(figure, variant, stride):
    # per initial condition: the exact flow crosses tr Sigma = tol_high before converging
    # exactly when the paper's Euler stops as "exceeded" (a subsample of each grid; the
    # full grids in the slow test below)
    run = paper.paper_run(figure, variant)
    lib, ref = _outcomes(run, slice(None, None, stride))
    np.testing.assert_array_equal(lib, ref)
    if figure == "initial":
        assert 0 < ref.sum() < ref.size  # both outcomes are in the subsample


@pytest.mark.slow
@pytest.mark.parametrize("run", [r for r in paper.paper_runs(extras=True)
                                 if r.figure not in ("zero", "line", "plane")],
                         ids=lambda r: f"{r.figure}-{r.variant}{r.heads}")
def test_outcome_matches_euler_reference_full_grids(run):
    lib, ref = _outcomes(run, slice(None))
    bad = np.flatnonzero(lib != ref)
    if (run.figure, run.variant) == ("initial", "L2"):
        # one grid point where the paper's Euler (h = 0.002) is wrong: with h/4 it converges,
        # as the exact flow does
        assert bad.tolist() == [83]
        fine = paper.euler_reference(run.kind, run.Q, run.K, run.V, run.covariances()[bad],
                                     step=run.rule.step / 4, tol_low=run.rule.tol_low,
                                     tol_high=run.rule.tol_high, max_iter=4 * run.rule.max_iter)
        assert fine.outcome.tolist() == ["converged"]
    else:
        assert bad.size == 0


# --------------------------------------------------------------------------- rank study
def test_draw_rank_parameters_paper_distribution():
    rng = np.random.default_rng(3)
    for d in (2, 3, 5):
        Q, K, V = paper.draw_rank_parameters(d, "psd", rng)
        assert Q.shape == (d // 2, d)
        np.testing.assert_array_equal(K, -Q)
        np.testing.assert_array_equal(V, V.T)
        assert np.linalg.eigvalsh(V).min() >= -1e-12
        assert np.array_equal(paper.draw_rank_parameters(d, "identity", rng)[2], np.eye(d))
    S = paper.draw_rank_covariance(4, rng)
    np.testing.assert_array_equal(S, S.T)
    with pytest.raises(ValueError, match="value"):
        paper.draw_rank_parameters(3, "random", rng)  # not the paper's
    with pytest.raises(ValueError, match="distribution"):
        paper.draw_rank_parameters(3, "identity", rng, distribution="other")


def test_count_rank_threshold():
    assert paper.count_rank(np.diag([2.0, 0.2, 0.1, 0.05])) == 2  # strictly above 0.1
    assert paper.count_rank(np.diag([2.0, 0.2, 0.1]), threshold=0.01) == 3


def test_paper_trace_cannot_grow_for_psd_values():
    # V >= 0 and A = -Q^T Q / sqrt(d) <= 0: (tr Sigma)' = 2 tr(V^1/2 Sigma A Sigma V^1/2) <= 0, so an
    # exact softmax run never "exceeds"; the paper's discarded trials are Euler artefacts
    rng = np.random.default_rng(0)
    for d in (3, 4, 6):
        for value in ("identity", "psd"):
            Q, K, V = paper.draw_rank_parameters(d, value, rng)
            S = np.stack([paper.draw_rank_covariance(d, rng) for _ in range(20)])
            F = paper.moment_rhs("softmax", Q, K, V, S)
            assert np.all(np.trace(F, axis1=1, axis2=2) <= 1e-12 * np.trace(S, axis1=1, axis2=2) ** 2)


def test_rank_trial_and_study_agree_and_converge():
    study = paper.paper_rank_study("softmax", 3, "identity", trials=4, seed=7, t_max=5000.0)
    for i in range(4):
        t = paper.rank_trial("softmax", 3, "identity", np.random.default_rng([7, 3, i]),
                             t_max=5000.0)
        np.testing.assert_array_equal(t.cov0, study.cov0[i])
        assert t.rank == study.ranks[i]
        assert t.redraws == 0 == study.redraws[i]  # the trace cannot grow: every run converges
        # Q has rank 1 in d = 3: the limit keeps at most d - 1 = 2 directions
        assert 0 <= t.rank <= 2
        np.testing.assert_array_less(np.linalg.norm(
            paper.moment_rhs("softmax", t.Q, t.K, t.V, t.cov)), 1.001e-4)  # lands on the criterion


def test_paper_rank_study_with_euler_reports_agreement():
    res = paper.paper_rank_study("softmax", 2, "identity", trials=3, seed=1, t_max=5000.0,
                                 euler={"step": 0.01, "tol_high": 1e3, "max_iter": 400_000})
    assert res.euler_outcome.tolist() == ["converged"] * 3
    assert 0.0 <= res.agreement() <= 1.0


# --------------------------------------------------------------------------- figure helpers
def test_solve_run_stops_on_the_papers_criterion():
    run = paper.paper_run("plane", "multihead")
    covs0 = run.covariances()[::25]
    batch = paper.solve_run(run, covs0, n_eval=40)
    assert set(map(str, batch.status)) <= {"converged", "ok"}
    paths = paper.run_paths(batch)
    for i, p in enumerate(paths):
        np.testing.assert_array_equal(p[0], covs0[i])
        np.testing.assert_allclose(p[-1], batch.covs[i], rtol=0, atol=1e-12)
        if batch.status[i] == "converged":
            F = paper.moment_rhs(run.kind, run.Q, run.K, run.V, p[-1], heads=run.heads)
            assert np.linalg.norm(F) < 1.01 * run.rule.tol_low


def test_rank_sweep_paper_distribution_and_cli_config(tmp_path):
    sw = paper.rank_sweep("softmax", 3, value="psd", draws=3, seed=2, t_max=5000.0,
                          distribution="paper")
    st = paper.paper_rank_study("softmax", 3, "psd", trials=3, seed=2, t_max=5000.0,
                                rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(sw.ranks, st.ranks)
    assert set(sw.status.tolist()) <= {"converged", "failed"}
    with pytest.raises(ValueError, match="distribution"):
        paper.rank_sweep("softmax", 3, distribution="nope")
    # the CLI config expresses the paper's study (examples/configs/paper_ranks.toml, small)
    import json

    from transformer_pde import cli

    cfg = tmp_path / "r.toml"
    cfg.write_text('[ranks]\ndistribution = "paper"\nkinds = ["softmax"]\nvalues = ["psd"]\n'
                   'dims = [3]\ndraws = 3\nseed = 2\nt_max = 5000.0\n')
    assert cli.main(["ranks", str(cfg), "--out", str(tmp_path / "o"), "-q",
                     "--scheduler", "serial"]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["sweeps"][0]["rank_counts"] == np.bincount(sw.ranks, minlength=4).tolist()
    cfg.write_text('[ranks]\ndistribution = "paper"\nvalues = ["random"]\n')
    assert cli.main(["ranks", str(cfg), "--out", str(tmp_path / "p"), "-q"]) == 2


def test_rank_figure_says_when_a_dimension_has_no_converged_draw():
    # a (kind, value) panel whose draws of one dimension all failed to converge: the figure
    # is drawn (the other dimension's bars) and the panel says which dimension had none
    from transformer_pde.paper import RankSweep, rank_figure
    common = dict(kind="softmax", value="identity", rtol=1e-3, blowup_threshold=1e3, t_max=5.0)
    ok = RankSweep(d=2, ranks=np.array([1, 1, 2]), status=np.array(["converged"] * 3), **common)
    none = RankSweep(d=3, ranks=np.array([-1, -1]), status=np.array(["ok", "ok"]), **common)
    fig = rank_figure([ok, none], "ranks")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["no converged draw: d = 3"]
    assert [c.get_label() for c in ax.containers] == ["d = 2"]
    only_none = rank_figure([none], "ranks")
    assert [t.get_text() for t in only_none.axes[0].texts] == ["no converged draw: d = 3"]
