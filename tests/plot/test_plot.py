"""Plotting functions: run headless (Agg) and draw exactly the data they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_pde import Attention, plot


def _random_psd_paths(rng, n=4, T=7):
    F = rng.normal(size=(n, T, 2, 2))
    return F @ np.swapaxes(F, -1, -2)


def _lines_by_gid(ax, prefix="trajectory-"):
    lines = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(prefix)]
    return sorted(lines, key=lambda ln: int(ln.get_gid().split("-")[-1]))


# --------------------------------------------------------------------------- coordinates
def test_cone_coordinates_values():
    # hand computed: (a - b, 2c, a + b)
    assert plot.cone_coordinates([[2.0, 0.5], [0.5, 1.0]]).tolist() == [1.0, 1.0, 3.0]
    with pytest.raises(ValueError, match="covs"):
        plot.cone_coordinates(np.eye(3))


@settings(max_examples=60, deadline=None)
@given(st.floats(-np.pi, np.pi), st.floats(1e-3, 1e3), st.floats(0.0, 1.0))
def test_cone_psd_iff_inside(theta, lam, mix):
    # Sigma = lam (a a^T) + lam*mix (b b^T), a ⟂ b: PSD, on the surface iff mix == 0,
    # and the rank-one part lies on the ray lam (cos 2θ, sin 2θ, 1) of docs/conventions.md.
    a = np.array([np.cos(theta), np.sin(theta)])
    b = np.array([-a[1], a[0]])
    S = lam * np.outer(a, a) + lam * mix * np.outer(b, b)
    u, w, v = plot.cone_coordinates(S)
    # v - |(u, w)| = 2 * lambda_min = 2 lam mix (exact up to rounding: rtol 1e-9)
    assert v - np.hypot(u, w) == pytest.approx(2 * lam * mix, rel=1e-9, abs=1e-9 * lam)
    r1 = plot.cone_coordinates(lam * np.outer(a, a))
    np.testing.assert_allclose(r1, lam * np.array([np.cos(2 * theta), np.sin(2 * theta), 1.0]),
                               atol=1e-12 * lam)


# --------------------------------------------------------------------------- cone
def test_cone_lines_match_input_and_surface_drawn():
    rng = np.random.default_rng(0)
    paths = _random_psd_paths(rng)
    ax = plot.cone(list(paths), rank_one_line=[1.0, 0.0], color_by="end")
    fig = ax.figure
    lines = _lines_by_gid(ax)
    assert len(lines) == len(paths)
    for ln, covs in zip(lines, paths, strict=True):
        x, y, z = ln.get_data_3d()
        np.testing.assert_array_equal(np.stack([x, y, z], 1), plot.cone_coordinates(covs))
    assert any(c.get_gid() == "cone-surface" for c in ax.collections)
    ray = [ln for ln in ax.get_lines() if ln.get_gid() == "rank-one-line"][0]
    x, y, z = ray.get_data_3d()
    # e1 e1^T is the ray u = v, w = 0
    np.testing.assert_allclose(x, z)
    np.testing.assert_allclose(y, 0.0)
    fig.canvas.draw()  # renders headless


def test_cone_v_max_cuts_at_first_exit():
    covs = np.array([np.eye(2) * s for s in (0.5, 1.0, 4.0, 1.0)])  # traces 1, 2, 8, 2
    (ln,) = _lines_by_gid(plot.cone(covs, v_max=3.0, surface=False))
    np.testing.assert_array_equal(ln.get_data_3d()[2], [1.0, 2.0])


def test_cone_v_max_keeps_curves_starting_on_the_rim():
    # a covariance rebuilt from a factor has trace 1 + a few ulp: with v_max = 1 the whole
    # (decreasing) curve must be drawn, not cut at its first point
    eps = np.finfo(float).eps
    start = np.array([[0.5 + 2 * eps, 0.1], [0.1, 0.5 + 2 * eps]])
    covs = np.array([start * s for s in (1.0, 0.8, 0.5, 0.2)])
    assert np.trace(covs[0]) > 1.0
    (ln,) = _lines_by_gid(plot.cone(covs, v_max=1.0, surface=False))
    np.testing.assert_array_equal(ln.get_data_3d()[2], np.trace(covs, axis1=1, axis2=2))
    # a curve that really leaves the picture is still cut at its first exit
    up = np.array([start * s for s in (1.0, 1.5, 2.0)])
    (ln,) = _lines_by_gid(plot.cone([covs, up], v_max=1.0, surface=False))[1:]
    assert len(ln.get_data_3d()[2]) == 1


def test_cone_accepts_gaussian_batch_and_drops_nonfinite():
    from transformer_pde import gaussian

    att = Attention("softmax", np.eye(2) / np.sqrt(2), np.eye(2), -np.eye(2))
    covs0 = np.array([np.eye(2), np.diag([1.0, 0.2])])
    t_eval = np.linspace(0.0, 2.0, 5)
    res = gaussian.solve_batch(att, np.zeros((2, 2)), covs0, t_max=2.0, t_eval=t_eval)
    lines = _lines_by_gid(plot.cone(res))
    assert len(lines) == 2
    for ln, covs in zip(lines, res.traj_covs, strict=True):
        np.testing.assert_array_equal(np.stack(ln.get_data_3d(), 1), plot.cone_coordinates(covs))
    padded = np.concatenate([res.traj_covs[0], np.full((2, 2, 2), np.nan)])
    (ln,) = _lines_by_gid(plot.cone(padded))
    assert len(ln.get_data_3d()[0]) == len(t_eval)


def test_cone_bad_input():
    with pytest.raises(ValueError, match="trajectories"):
        plot.cone(np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="color_by"):
        plot.cone(np.array([np.eye(2)]), color_by="middle")
    with pytest.raises(ValueError, match="rank_one_line"):
        plot.cone(np.array([np.eye(2)]), rank_one_line=[0.0, 0.0])


# --------------------------------------------------------------------------- slice
def test_cone_slice_normalises_and_rank_one_on_circle():
    rng = np.random.default_rng(1)
    paths = _random_psd_paths(rng, n=3)
    a = rng.normal(size=(6, 2))
    rank_one = np.einsum("ti,tj->tij", a, a) * 7.0
    lines = _lines_by_gid(plot.cone_slice(list(paths) + [rank_one], color_by=np.arange(4.0)))
    for ln, covs in zip(lines, list(paths) + [rank_one], strict=True):
        p = plot.cone_coordinates(covs)
        np.testing.assert_allclose(np.stack(ln.get_data(), 1), p[:, :2] / p[:, 2:], rtol=1e-14)
        assert np.all(np.hypot(*ln.get_data()) <= 1 + 1e-12)
    # Sigma / tr Sigma of a rank-one matrix lies on the unit circle
    np.testing.assert_allclose(np.hypot(*lines[-1].get_data()), 1.0, rtol=1e-12)


# --------------------------------------------------------------------------- particles
def test_particles_offsets_and_rescaling():
    rng = np.random.default_rng(2)
    times = np.array([0.0, 0.5, 1.0])
    states = rng.normal(size=(3, 10, 2))

    from transformer_pde.particles import ParticleTrajectory

    tr = ParticleTrajectory(times, states, np.full(10, 0.1), None, "ok", "")
    labels = np.repeat([0, 1], 5)
    ax = plot.particles(tr, labels=labels)
    coll = {c.get_gid(): c for c in ax.collections}
    np.testing.assert_array_equal(coll["initial"].get_offsets(), states[0])
    np.testing.assert_array_equal(coll["final"].get_offsets(), states[-1])
    # two labels -> two distinct face colours
    assert len({tuple(c) for c in coll["final"].get_facecolors()}) == 2
    ax = plot.particles(tr, rescale=np.eye(2))
    final = {c.get_gid(): c for c in ax.collections}["final"].get_offsets()
    np.testing.assert_allclose(final, np.exp(-1.0) * states[-1], rtol=1e-12)
    with pytest.raises(ValueError, match="labels"):
        plot.particles(tr, labels=[0, 1])
    with pytest.raises(ValueError, match="dims"):
        plot.particles(tr, dims=(0, 0))


def test_rescale_value_uses_attention_V():
    from transformer_pde import simulate

    V = np.array([[0.5, 0.0], [0.0, -0.3]])
    att = Attention("softmax", np.eye(2), np.eye(2), V)
    traj = simulate(att, np.random.default_rng(3).normal(size=(6, 2)), t_max=0.2, dt=0.1)
    Z = plot.rescaled_states(traj, "value")
    # z(t) = expm(-tV) x(t) with V diagonal: coordinate-wise exp(-t v_i)
    np.testing.assert_allclose(Z[-1], traj.final * np.exp(-0.2 * np.diag(V)), rtol=1e-12)


def test_animate_particles_writes_gif(tmp_path):
    from PIL import Image

    states = np.cumsum(np.random.default_rng(4).normal(size=(9, 5, 2)), axis=0)
    path = plot.animate_particles(states, tmp_path / "a.gif", max_frames=5)
    with Image.open(path) as im:
        assert im.format == "GIF"
        assert im.n_frames == 5


# --------------------------------------------------------------------------- ranks
def test_rank_histogram_heights():
    ranks = {"softmax": [1, 1, 2, 3], "l2": [3, 3, 3, 0]}
    ax = plot.rank_histogram(ranks, d=3)
    heights = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert heights["softmax"] == [0.0, 0.5, 0.25, 0.25]
    assert heights["l2"] == [0.25, 0.0, 0.0, 0.75]
    ax = plot.rank_histogram(np.array([2, 2, 1]), normalize=False)
    assert [p.get_height() for p in ax.containers[0].patches] == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="exceeds d"):
        plot.rank_histogram([4], d=3)
    with pytest.raises(ValueError, match="integers"):
        plot.rank_histogram([1.5])
