"""Matplotlib conventions of every public plot function: ``ax=`` / ``fig=`` in, the Axes
(single panel) or the Figure (several panels) out, new figures made through pyplot (so they
show inline and with ``plt.show()``), no change to the backend or to ``rcParams``."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_pde import plot
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.pretrained.decoder_report import (idealised_causal_flow, layer_statistics,
                                                       sink_channels)


def _covs(n=3, T=5):
    F = np.random.default_rng(0).normal(size=(n, T, 2, 2))
    return F @ np.swapaxes(F, -1, -2)


def _states():
    return np.cumsum(np.random.default_rng(1).normal(size=(6, 5, 2)), axis=0)


#: single-axes functions: name -> (call with keyword arguments, projection of the axes)
SINGLE = {
    "cone": (lambda **kw: plot.cone(_covs(), **kw), "3d"),
    "cone_slice": (lambda **kw: plot.cone_slice(_covs(), **kw), "rectilinear"),
    "particles": (lambda **kw: plot.particles(_states(), **kw), "rectilinear"),
    "rank_histogram": (lambda **kw: plot.rank_histogram([1, 2, 2], **kw), "rectilinear"),
}


def _curve(label):
    return plot.DepthCurve(label, [0, 1, 2], {k: [1.0, 2.0, 3.0]
                                               for k, _ in plot.STATISTICS_PANELS})


def _decoder_states():
    return np.random.default_rng(4).normal(size=(5, 4, 3))


def _decoder_curves():
    """A network curve (random causal weights), an idealised flow and a continuous-depth record."""
    states = _decoder_states()
    rng = np.random.default_rng(0)
    weights = np.tril(rng.random((5, 2, 4, 4)) + 0.01)
    weights /= weights.sum(axis=-1, keepdims=True)
    net = plot.ModelCurve("net", list(range(5)), layer_statistics(states, weights))
    ideal = idealised_causal_flow(states[0], (1.0,), t_max=4)["beta=1"]
    cont = {"times": net.times, "relative_difference": [0.0, 0.1, 0.2, 0.1, 0.3],
            "statistics": net.statistics}
    return net, plot.ModelCurve("ideal", ideal["times"], ideal["statistics"]), cont


S = np.random.default_rng(2).normal(size=(4, 3, 5))
#: multi-panel functions: name -> (call with keyword arguments, number of axes drawn)
MULTI = {
    "token_paths": (lambda **kw: plot.token_paths([plot.PathPanel("a", S), plot.PathPanel("b", S)],
                                                  ["x", "y", "z"], **kw), 2),
    "statistics_along_depth": (lambda **kw: plot.statistics_along_depth(
        [_curve("t")], [_curve("b")], **kw), 2 * len(plot.STATISTICS_PANELS)),
    "cosine_matrices": (lambda **kw: plot.cosine_matrices([("a", [0, 1, 2, 3], S)], ncol=2,
                                                          **kw), 3),   # 2 panels + colour bar
    "models_side_by_side": (lambda **kw: plot.models_side_by_side(_decoder_curves()[:2], **kw),
                            6),
    "attention_sink": (lambda **kw: plot.attention_sink(
        _decoder_curves()[0], sink_channels(_decoder_states()), [_decoder_curves()[1]],
        tokens=list("abcd"), **kw), 5),   # 4 panels + colour bar
    "decoder_flows": (lambda **kw: plot.decoder_flows(
        [_decoder_curves()[1]], _decoder_curves()[2], network=_decoder_curves()[0], **kw), 3),
}


def test_every_public_figure_function_is_covered():
    # a new drawing function of plot must be added to SINGLE or MULTI
    drawing = {n for n in plot.__all__ if callable(getattr(plot, n)) and n[0].islower()}
    helpers = {"cone_coordinates", "principal_plane", "rescaled_states", "animate_particles"}
    assert drawing - helpers == set(SINGLE) | set(MULTI)


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_panel_returns_pyplot_axes(name):
    call, projection = SINGLE[name]
    before = set(plt.get_fignums())
    rc = dict(matplotlib.rcParams)
    backend = matplotlib.get_backend()
    ax = call()
    assert isinstance(ax, Axes) and ax.name == projection
    # a new figure registered with pyplot: plt.show() and Jupyter's inline backend see it
    new = set(plt.get_fignums()) - before
    assert len(new) == 1 and plt.figure(new.pop()) is ax.figure
    assert ax.figure.axes == [ax]
    assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == rc


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_panel_draws_into_given_axes(name):
    call, projection = SINGLE[name]
    fig = Figure()
    ax = fig.add_subplot(1, 2, 2, projection=None if projection == "rectilinear" else projection)
    before = set(plt.get_fignums())
    assert call(ax=ax) is ax
    assert set(plt.get_fignums()) == before   # no figure of its own
    assert ax.has_data()
    with pytest.raises(ArgumentTypeError, match="ax"):
        call(ax=fig)


def test_cone_needs_3d_axes():
    with pytest.raises(ArgumentError, match="3-D"):
        plot.cone(_covs(), ax=Figure().add_subplot())


@pytest.mark.parametrize("name", sorted(MULTI))
def test_multi_panel_returns_pyplot_figure(name):
    call, n_axes = MULTI[name]
    before = set(plt.get_fignums())
    rc = dict(matplotlib.rcParams)
    fig = call()
    assert isinstance(fig, Figure) and len(fig.axes) == n_axes
    new = set(plt.get_fignums()) - before
    assert len(new) == 1 and plt.figure(new.pop()) is fig
    assert dict(matplotlib.rcParams) == rc


@pytest.mark.parametrize("name", sorted(MULTI))
def test_multi_panel_draws_into_given_figure(name):
    call, n_axes = MULTI[name]
    given = Figure()
    before = set(plt.get_fignums())
    assert call(fig=given) is given
    assert len(given.axes) == n_axes and set(plt.get_fignums()) == before
    with pytest.raises(ArgumentTypeError, match="fig"):
        call(fig=given.axes[0])


def test_animation_leaves_no_pyplot_figure(tmp_path):
    before = set(plt.get_fignums())
    plot.animate_particles(_states(), tmp_path / "a.gif", max_frames=3)
    assert set(plt.get_fignums()) == before
