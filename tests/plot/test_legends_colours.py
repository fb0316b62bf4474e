"""Legends say what is drawn, colours stay visible: the cone's rank-one legend defines
its vector, its default colours are viridis without the pale end, its tick labels are few
enough not to overlap, and ``particles``' legend marker matches no cluster."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pytest

from transformer_pde import plot


def _paths(n=6, T=5):
    F = np.random.default_rng(0).normal(size=(n, T, 2, 2))
    return F @ np.swapaxes(F, -1, -2)


def _luminance(rgba):
    """Relative luminance (sRGB, WCAG) of an RGBA colour."""
    c = np.asarray(rgba[:3], dtype=float)
    c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(c @ [0.2126, 0.7152, 0.0722])


@pytest.mark.parametrize("draw", [plot.cone, plot.cone_slice])
def test_rank_one_legend_names_the_unit_vector(draw):
    ax = draw(_paths(), rank_one_line=[0.0, 3.0])
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    # the vector a of lambda a a^T is written out (unit length), not left undefined
    assert texts == [r"rank one $\lambda\,aa^\top$, $a = (0, 1)$"]
    plt.close(ax.figure)


@pytest.mark.parametrize("draw", [plot.cone, plot.cone_slice])
def test_default_colours_are_viridis_without_its_pale_end(draw):
    # color_by="start": the angle of each start point in (-pi, pi] is mapped to 0 ... 0.85
    # of viridis; the colours must be exactly those, and all darker than the grey cone
    paths = _paths()
    ax = draw(paths)
    lines = sorted((ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("traj")),
                   key=lambda ln: int(ln.get_gid().split("-")[-1]))
    u, w, v = plot.cone_coordinates(paths[:, 0]).T
    frac = (np.arctan2(w / v, u / v) + np.pi) / (2 * np.pi)
    expected = mpl.colormaps["viridis"](0.85 * frac)
    got = np.array([mpl.colors.to_rgba(ln.get_color()) for ln in lines])
    np.testing.assert_allclose(got, expected, atol=1e-12)  # same floats, same lookup
    # the cone surface is 0.6 grey at alpha 0.15 over white: luminance 0.87; the palest
    # viridis used (0.85) has luminance 0.57, twilight's ends 0.71 (the runs that vanished)
    assert max(_luminance(c) for c in got) < 0.6
    plt.close(ax.figure)


def test_cone_has_at_most_five_ticks_per_axis():
    ax = plot.cone(_paths(), v_max=1.0)
    ax.figure.canvas.draw()
    for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
        lo, hi = sorted(axis.get_view_interval())
        shown = [t for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]
        assert 2 <= len(shown) <= 5
    plt.close(ax.figure)


def test_particles_legend_marker_matches_no_cluster():
    rng = np.random.default_rng(1)
    states = rng.normal(size=(3, 12, 2))
    labels = np.repeat([0, 1, 2], 4)
    ax = plot.particles(states, labels=labels)
    leg = ax.get_legend()
    texts = [t.get_text() for t in leg.get_texts()]
    assert texts == ["initial tokens", "final tokens (colour: cluster)"]
    handle = leg.legend_handles[1]
    face = mpl.colors.to_rgba(handle.get_markerfacecolor())
    final = next(c for c in ax.collections if c.get_gid() == "final")
    cluster_colours = {tuple(np.round(c, 6)) for c in final.get_facecolors()}
    assert len(cluster_colours) == 3
    assert face == (1.0, 1.0, 1.0, 1.0) and tuple(np.round(face, 6)) not in cluster_colours
    # a later ax.legend() (an example adding its own entry) shows the same neutral entry
    ax.scatter([0.0], [0.0], marker="*", label="token 0")
    texts = [t.get_text() for t in ax.legend().get_texts()]
    assert texts == ["initial tokens", "final tokens (colour: cluster)", "token 0"]
    # without labels the final tokens have one colour, which the legend shows
    ax2 = plot.particles(states)
    assert [t.get_text() for t in ax2.get_legend().get_texts()] == ["initial tokens",
                                                                     "final tokens"]
    plt.close("all")
