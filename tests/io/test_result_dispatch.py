"""Diagnostics and plots dispatch on the result protocol (``result_kind``), never on
attribute names: a wrong type is an ArgumentTypeError naming the argument, and a result
that merely has attributes of the same names is not mistaken for another kind."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import diagnostics, gaussian, plot
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.results import Result, ResultKind, kind_of, require_kind

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), -np.eye(2))
    X0 = np.random.default_rng(0).normal(size=(12, 2))
    particles = tp.simulate(att, X0, t_max=0.5, dt=0.05, solver="rk4")
    stat = tp.simulate(att, X0, t_max=0.5, dt=0.05, solver="rk4",
                       saveat=tp.SaveAt(fn=lambda t, X, w: X.max()))
    g = gaussian.solve(att, np.zeros(2), np.eye(2), t_max=0.5, t_eval=np.linspace(0, 0.5, 6))
    batch = gaussian.solve_batch(att, np.zeros((3, 2)), np.stack([np.eye(2)] * 3), t_max=0.5)
    batch_t = gaussian.solve_batch(att, np.zeros((3, 2)), np.stack([np.eye(2)] * 3),
                                   t_max=0.5, t_eval=np.linspace(0, 0.5, 6))
    return {"particles": particles, "stat": stat, "gaussian": g, "batch": batch,
            "batch_t": batch_t}


def test_each_result_class_declares_its_kind(runs):
    assert kind_of(runs["particles"]) is ResultKind.PARTICLES
    assert kind_of(runs["gaussian"]) is ResultKind.GAUSSIAN
    assert kind_of(runs["batch"]) is ResultKind.GAUSSIAN_BATCH
    for r in runs.values():
        assert isinstance(r, Result)
    assert kind_of(np.zeros((3, 2, 2))) is None and kind_of([1, 2]) is None


class _LookAlike:
    """Has the attribute names of a Gaussian trajectory, but is not a result."""

    times = np.zeros(2)
    means = np.zeros((2, 2))
    covs = np.stack([np.eye(2)] * 2)
    states = np.zeros((2, 3, 2))
    weights = np.full(3, 1 / 3)


def GROWTH_BOUND(t):
    return diagnostics.exponential_growth_bound(t)


@pytest.mark.parametrize("call", [
    lambda t: diagnostics.classify(t),
    lambda t: diagnostics.rank_profile(t),
    lambda t: diagnostics.cluster_counts(t),
    lambda t: diagnostics.kinetic_energy(t),
    GROWTH_BOUND,
])
@pytest.mark.parametrize("bad", ["array", "lookalike", "batch"])
def test_diagnostics_refuse_other_types_naming_traj(runs, call, bad):
    obj = {"array": np.zeros((2, 3, 2)), "lookalike": _LookAlike(), "batch": runs["batch"]}[bad]
    if bad == "batch" and call is GROWTH_BOUND:  # a Gaussian result: no a-priori bound
        assert call(obj) is None
        return
    with pytest.raises(ArgumentTypeError, match=r"^traj must be a ") as exc:
        call(obj)
    assert type(obj).__name__ in str(exc.value)


def test_batch_is_no_longer_read_as_one_trajectory(runs):
    # a GaussianBatch has .means/.covs (final states of its members): it used to be read as
    # one trajectory of B "times"; it is refused now
    with pytest.raises(ArgumentTypeError, match="traj must be a ParticleTrajectory or "
                                                "GaussianTrajectory, got GaussianBatch"):
        diagnostics.rank_profile(runs["batch"])


def test_particle_diagnostics_need_particles(runs):
    with pytest.raises(ArgumentTypeError, match="traj must be a ParticleTrajectory, got "
                                                "GaussianTrajectory"):
        diagnostics.cluster_counts(runs["gaussian"])
    assert diagnostics.exponential_growth_bound(runs["gaussian"]) is None
    assert diagnostics.exponential_growth_bound(runs["particles"]) == pytest.approx(1.0)


def test_statistic_only_runs_use_their_saved_moments(runs):
    full, stat = runs["particles"], runs["stat"]
    assert stat.states is None
    a, b = diagnostics.rank_profile(full), diagnostics.rank_profile(stat)
    np.testing.assert_array_equal(a.numerical, b.numerical)
    np.testing.assert_allclose(a.effective, b.effective, rtol=1e-12)
    assert diagnostics.classify(stat).kind == diagnostics.classify(full).kind
    with pytest.raises(ArgumentError, match="no states"):
        diagnostics.cluster_counts(stat)
    with pytest.raises(ArgumentError, match="no states"):
        diagnostics.kinetic_energy(stat)
    with pytest.raises(ArgumentError, match="no states"):
        plot.particles(stat)


def test_gaussian_and_particle_moments_agree_in_kind_dispatch(runs):
    g = runs["gaussian"]
    times, means, covs = diagnostics.common.trajectory_moments(g)
    np.testing.assert_array_equal(covs, g.covs)
    np.testing.assert_array_equal(means, g.means)
    _, _, covs = diagnostics.common.trajectory_moments(runs["particles"])
    _, S = runs["particles"].moments()
    np.testing.assert_allclose(covs, S, rtol=1e-12, atol=1e-15)


def test_plot_inputs(runs):
    import matplotlib

    matplotlib.use("Agg")
    # a batch with paths, a trajectory, a list of them, arrays: all drawn
    for obj in (runs["batch_t"], runs["gaussian"], [runs["gaussian"], runs["gaussian"].covs]):
        plot.cone_slice(obj)
    with pytest.raises(ArgumentError, match="t_eval"):
        plot.cone_slice(runs["batch"])
    with pytest.raises(ArgumentTypeError, match=r"trajectories\[1\] is a GaussianBatch"):
        plot.cone_slice([runs["gaussian"], runs["batch_t"]])
    with pytest.raises(ArgumentTypeError, match="trajectories must be"):
        plot.cone_slice(3.0)
    with pytest.raises(ArgumentTypeError, match="traj must be a ParticleTrajectory, got "
                                                "GaussianTrajectory"):
        plot.particles(runs["gaussian"])
    plot.particles(runs["particles"])
    plot.particles(runs["particles"].states)


def test_require_kind_message():
    with pytest.raises(ArgumentTypeError, match="^x must be a GaussianTrajectory, got dict$"):
        require_kind({}, "x", (ResultKind.GAUSSIAN,))


def test_no_attribute_dispatch_left():
    """Diagnostics and plots dispatch on result_kind, not on hasattr(traj, ...)."""
    files = [*sorted((ROOT / "transformer_pde" / "plot").glob("*.py")),
             *sorted((ROOT / "transformer_pde" / "diagnostics").glob("*.py"))]
    pattern = re.compile(r"hasattr\((traj|trajectories|item)\b|getattr\((traj|trajectories|item)"
                         r", \"(states|covs|means|traj_covs)\"")
    offenders = [f"{f.name}:{i}" for f in files
                 for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
