"""Figures of token flows along depth: they draw exactly the data they are given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from transformer_pde import plot
from transformer_pde.diagnostics import cosine_similarity, depth_statistics
from transformer_pde.errors import ArgumentError


def _flow(rng, T=5, N=4, d=6):
    return rng.normal(size=(T, N, d)) + np.linspace(0, 1, T)[:, None, None]


def test_principal_plane_spans_the_two_largest_directions():
    rng = np.random.default_rng(0)
    # tokens spread along e0 (variance 100) and e1 (variance 1), almost nothing along e2
    Z = rng.normal(size=(400, 3)) * np.array([10.0, 1.0, 1e-3]) + np.array([1.0, 2.0, 3.0])
    mu, B = plot.principal_plane(Z.reshape(4, 100, 3))
    np.testing.assert_allclose(mu, Z.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(np.abs(B), np.eye(3)[:2], atol=0.02)
    np.testing.assert_allclose(B @ B.T, np.eye(2), atol=1e-12)


def test_token_paths_draw_the_projection_of_each_panel():
    rng = np.random.default_rng(1)
    A, C = _flow(rng), _flow(rng, T=3)
    toks = ["a", "b", "c", "d"]
    fig = plot.token_paths([plot.PathPanel("shared", A, basis=C, labelled=True),
                            plot.PathPanel("own", C)], toks, title="t")
    ax0, ax1 = fig.axes
    for ax, S, basis in ((ax0, A, C), (ax1, C, C)):
        mu, B = plot.principal_plane(basis)
        Y = (S - mu) @ B.T
        lines = ax.get_lines()
        assert len(lines) == 3 * len(toks)
        for i in range(len(toks)):
            np.testing.assert_array_equal(np.stack(lines[3 * i].get_data(), 1), Y[:, i])
    assert [t.get_text() for t in ax0.texts] == toks and not ax1.texts
    with pytest.raises(ArgumentError, match="states must have shape"):
        plot.token_paths([plot.PathPanel("x", A)], toks[:3])


def test_statistics_along_depth_draws_each_curve_in_each_panel():
    rng = np.random.default_rng(2)
    flows = [_flow(rng) for _ in range(3)]
    stats = [depth_statistics(S) for S in flows]
    for st in stats:
        st["relative_radius"] = [r / m for r, m in zip(st["radius"], st["mean_norm"],
                                                       strict=True)]
    times = [0, 1, 2, 3, 4]
    curves = [plot.DepthCurve(f"f{k}", times, st) for k, st in enumerate(stats)]
    fig = plot.statistics_along_depth(curves[:1], curves[1:])
    axes = np.array(fig.axes).reshape(2, len(plot.STATISTICS_PANELS))
    for j, (key, label) in enumerate(plot.STATISTICS_PANELS):
        for row, cs in ((0, curves[:1]), (1, curves[1:])):
            ax = axes[row, j]
            assert ax.get_ylabel() == label
            for line, c in zip(ax.get_lines(), cs, strict=True):
                np.testing.assert_array_equal(line.get_xdata(), times)
                np.testing.assert_array_equal(line.get_ydata(), c.statistics[key])
    assert axes[1, 0].get_xscale() == "symlog" and axes[1, 3].get_yscale() == "log"


def test_cosine_matrices_show_the_cosines_at_evenly_spaced_depths():
    rng = np.random.default_rng(3)
    S, R = _flow(rng, T=9), _flow(rng, T=2)
    fig = plot.cosine_matrices([("a", list(range(9)), S), ("b", [0, 7], R)], ncol=3)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(axes) == 6
    for ax, (label, t, X) in zip(axes, [("a", 0, S[0]), ("a", 4, S[4]), ("a", 8, S[8]),
                                        ("b", 0, R[0]), ("b", 7, R[1])], strict=False):
        assert ax.get_title() == f"{label} {t}"
        np.testing.assert_array_equal(ax.get_images()[0].get_array(), cosine_similarity(X))
    assert not axes[5].get_images() and not axes[5].axison
    with pytest.raises(ArgumentError, match="ncol"):
        plot.cosine_matrices([("a", [0], S[:1])], ncol=0)
