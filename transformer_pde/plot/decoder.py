r"""Figures of a decoder's depth statistics (see :mod:`transformer_pde.pretrained.decoder_report`).

Three multi-panel figures, each taking ``fig=`` and returning the
:class:`~matplotlib.figure.Figure` (a new pyplot figure when none is given):

* :func:`models_side_by_side`: the statistics of several networks against the relative
  depth :math:`\ell/L` (clusters, effective rank, mean cosine, cosine to the first token,
  token norms, attention mass on the first token);
* :func:`attention_sink`: a decoder's attention mass on its first token and cosine to it,
  layer by layer, beside the idealised causal flow (one unit of time per layer), the mass
  per token and layer, and the channels of the first token's residual stream;
* :func:`decoder_flows`: layers repeated to long times (cosine to the first token, token
  norms) and the continuous-depth network against the network.

The inputs are the dictionaries of :func:`~transformer_pde.pretrained.layer_statistics`
and :func:`~transformer_pde.pretrained.sink_channels`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .axes import new_figure

__all__ = ["ModelCurve", "attention_sink", "decoder_flows", "models_side_by_side"]


@dataclass(frozen=True)
class ModelCurve:
    """One network (or flow) in :func:`models_side_by_side` and :func:`attention_sink`.

    Attributes
    ----------
    label : str
        Legend entry.
    times : sequence of float
        Depths of the statistics (layers 0..L for a network).
    statistics : mapping
        :func:`~transformer_pde.pretrained.layer_statistics` of the states.
    color : str, optional
        Matplotlib colour (the property cycle's when None).
    marker : str
        Marker of the curve.
    """

    label: str
    times: Sequence[float]
    statistics: Mapping[str, Any]
    color: str | None = None
    marker: str = "o"


def _x(curve: ModelCurve, relative: bool) -> np.ndarray:
    t = np.asarray(curve.times, dtype=float)
    if t.size == 0:
        raise ArgumentError(f"curve {curve.label!r} has no depths")
    return t / t[-1] if relative and t[-1] > 0 else t


def _line(ax: Any, x: Any, y: Any, curve: ModelCurve, *, dotted: bool = False,
          label: str | None = None, ms: float = 4.0) -> Any:
    ls = ":" if dotted else "-"
    (ln,) = ax.plot(x, y, ls=ls, marker=None if dotted else curve.marker, ms=ms,
                    color=curve.color, label=label)
    return ln


def models_side_by_side(curves: Sequence[ModelCurve], *, title: str | None = None,
                        fig: Any = None) -> Any:
    r"""Depth statistics of several networks, against the relative depth :math:`\ell/L`.

    Six panels: clusters, effective rank of the token covariance, mean cosine similarity of
    all pairs, cosine to the first token (mean over the tokens, solid; minimum, dotted),
    token norms (mean, solid; max, dotted; logarithmic), and the attention mass on the first
    token at the input of every block (mean over heads, solid; largest head, dotted; uniform
    attention, a thin horizontal line), for every curve that has ``first_attention``.

    Parameters
    ----------
    curves : sequence of ModelCurve
        One per network (its ``times`` are its layers 0..L).
    title : str, optional
        Figure title.
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (default: a new pyplot figure).

    Returns
    -------
    matplotlib.figure.Figure
        With axes (2, 3) in the order above.
    """
    if not curves:
        raise ArgumentError("curves must not be empty")
    fig = new_figure(fig, (14.0, 7.5))
    axes = fig.subplots(2, 3, squeeze=False).ravel()
    simple = (("n_clusters", "clusters (5% of radius)"),
              ("effective_rank", "effective rank of the covariance"),
              ("mean_cosine", "mean cosine similarity (all pairs)"))
    for curve in curves:
        x, st = _x(curve, True), curve.statistics
        for ax, (key, _) in zip(axes[:3], simple, strict=True):
            ln = _line(ax, x, st[key], curve, label=curve.label)
        c = ln.get_color()
        cv = ModelCurve(curve.label, curve.times, st, c, curve.marker)
        _line(axes[3], x, st["first_mean_cosine"], cv, label=f"{curve.label}: mean")
        _line(axes[3], x, st["first_min_cosine"], cv, dotted=True, label="min")
        _line(axes[4], x, st["norm_mean"], cv, label=f"{curve.label}: mean")
        _line(axes[4], x, st["norm_max"], cv, dotted=True, label="max")
        fa = st.get("first_attention")
        if fa is not None:
            xa = x[:len(fa["mean"])]
            _line(axes[5], xa, fa["mean"], cv, label=f"{curve.label}: mean of heads")
            _line(axes[5], xa, fa["max_head"], cv, dotted=True, label="largest head")
            axes[5].axhline(fa["uniform"], color=c, lw=0.7, alpha=0.6)
    for ax, (_, label) in zip(axes[:3], simple, strict=True):
        ax.set_ylabel(label)
    axes[3].set_ylabel("cosine to the first token")
    axes[4].set_ylabel("token norm |x_i|")
    axes[4].set_yscale("log")
    axes[5].set_ylabel("attention on the first token")
    axes[5].set_ylim(0.0, 1.02)
    for k, ax in enumerate(axes):
        ax.set_xlabel("relative depth ℓ / L")
        ax.legend(fontsize=7 if k >= 3 else 8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _ordinal(k: int) -> str:
    """'' for 1 (the largest), '2nd ', '3rd ', '4th ', ..."""
    return "" if k == 1 else f"{k}{ {2: 'nd', 3: 'rd'}.get(k, 'th')} "


def _sink_panel(ax: Any, sink: Mapping[str, Any], times: Sequence[float]) -> None:
    """Top channels of token 0 (|value|), its norm and the other tokens' largest entry."""
    t = np.asarray(times, dtype=float)
    ch, vals = np.asarray(sink["channels"]), np.abs(np.asarray(sink["values"], dtype=float))
    ax.plot(t, sink["norm"], "k-", lw=2, label="|x_0| (first token)")
    for k in range(ch.shape[1]):
        last = int(ch[-1, k]) if len(ch) else -1
        main = np.bincount(ch[:, k]).argmax()
        ax.plot(t, vals[:, k], "o-" if k == 0 else "s--", ms=3,
                label=f"first token's {_ordinal(k + 1)}largest channel (mostly {main}, "
                      f"last {last})")
    ax.plot(t, sink["others_max_abs"], "-", color="0.5", label="other tokens: largest |entry|")
    ax.set_yscale("log")
    ax.set_xlabel("layer (the state after ℓ blocks)")
    ax.set_ylabel("|value|")
    ax.set_title("the sink: the first token's residual", fontsize=9)
    ax.legend(fontsize=7)


def attention_sink(network: ModelCurve, sink: Mapping[str, Any],
                   ideal: Sequence[ModelCurve], *, tokens: Sequence[str] | None = None,
                   title: str | None = None, fig: Any = None) -> Any:
    r"""A decoder's attention sink beside the idealised causal flow.

    Four panels: (a) attention mass on the first token at the input of every block (the
    decoder: mean of heads, solid, largest head, dotted; every idealised flow at the integer
    times, dashed; uniform causal attention, grey); (b) cosine to the first token (mean over
    the tokens, solid; minimum, dotted; the idealised flows likewise, dashed and dotted);
    (c) the mass every token puts on the first token, per layer (mean of heads); (d) the
    first token's largest channels (:func:`~transformer_pde.pretrained.sink_channels`), its
    norm and the other tokens' largest entry.

    Parameters
    ----------
    network : ModelCurve
        The decoder's statistics (with ``first_attention``), ``times`` its layers.
    sink : mapping
        :func:`~transformer_pde.pretrained.sink_channels` of its hidden states.
    ideal : sequence of ModelCurve
        Idealised flows (with ``first_attention``), ``times`` in layers; empty: the decoder
        alone (and no mention of idealised flows in the labels).
    tokens : sequence of str, optional
        Token labels of panel (c).
    title, fig : optional
        As in :func:`models_side_by_side`.

    Returns
    -------
    matplotlib.figure.Figure
        With axes (a), (b), (c), (d) (and the colour bar of (c)).
    """
    if "first_attention" not in network.statistics:
        raise ArgumentError("network.statistics has no 'first_attention' (pass the attention "
                            "matrices to layer_statistics)")
    fig = new_figure(fig, (14.0, 9.0))
    ax_a, ax_b, ax_c, ax_d = fig.subplots(2, 2).ravel()
    fa = network.statistics["first_attention"]
    t = np.asarray(network.times, dtype=float)
    net = ModelCurve(network.label, network.times, network.statistics,
                     network.color or "C3", network.marker)
    _line(ax_a, t[:len(fa["mean"])], fa["mean"], net, label=f"{net.label}: mean of heads")
    _line(ax_a, t[:len(fa["max_head"])], fa["max_head"], net, dotted=True, label="largest head")
    _line(ax_b, t, net.statistics["first_mean_cosine"], net, label=f"{net.label}: mean")
    _line(ax_b, t, net.statistics["first_min_cosine"], net, dotted=True, label="min")
    for k, curve in enumerate(ideal):
        c = curve.color or f"C{k}"
        ti, st = np.asarray(curve.times, dtype=float), curve.statistics
        ax_a.plot(ti, st["first_attention"]["mean"], "--", color=c, label=curve.label)
        ax_b.plot(ti, st["first_mean_cosine"], "--", color=c, label=f"{curve.label}: mean")
        ax_b.plot(ti, st["first_min_cosine"], ":", color=c)
    ax_a.axhline(fa["uniform"], color="0.5", lw=1, label="uniform causal attention")
    ax_a.set_ylim(-0.02, 1.02)     # a flow that puts no mass on the first token stays visible
    ax_a.set_ylabel("attention mass on the first token")
    ax_b.set_ylabel("cosine to the first token")
    for ax in (ax_a, ax_b):
        ax.set_xlabel("layer (idealised flows: time t)" if ideal else "layer")
        ax.legend(fontsize=7)
    per_token = np.asarray(fa["per_token"], dtype=float)
    im = ax_c.imshow(per_token, aspect="auto", origin="lower", vmin=0.0, vmax=1.0,
                     cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax_c, label="attention on the first token (mean of heads)")
    ax_c.set_ylabel("block")
    ax_c.set_title(f"{net.label}: each token's attention on the first token", fontsize=9)
    if tokens is not None:
        ax_c.set_xticks(range(len(tokens)), [str(s) for s in tokens], rotation=60, fontsize=7)
    else:
        ax_c.set_xlabel("token")
    _sink_panel(ax_d, sink, t[:len(sink["norm"])])
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def decoder_flows(repeated: Sequence[ModelCurve], continuous: Mapping[str, Any] | None = None, *,
              network: ModelCurve | None = None, title: str | None = None,
              fig: Any = None) -> Any:
    r"""Layers repeated to long times, and the continuous-depth network against the network.

    Panels: (a) cosine to the first token (mean, solid; minimum, dotted) against the depth
    (symmetric-log axis); (b) token norms (mean, solid; max, dotted) on log-log axes with the
    line :math:`\propto t` for reference; (c) with ``continuous`` (a mapping with ``times``,
    ``relative_difference`` and ``statistics``) and ``network``: the relative difference
    per layer and the mean cosine to the first token of both.

    Returns
    -------
    matplotlib.figure.Figure
        With axes (a), (b) and, with ``continuous``, (c).
    """
    if not repeated:
        raise ArgumentError("repeated must not be empty")
    third = continuous is not None and network is not None
    fig = new_figure(fig, (15.0 if third else 10.5, 4.8))
    axes = fig.subplots(1, 3 if third else 2, squeeze=False).ravel()
    tmax = 1.0
    for k, curve in enumerate(repeated):
        cv = ModelCurve(curve.label, curve.times, curve.statistics, curve.color or f"C{k}",
                        curve.marker)
        t = np.asarray(curve.times, dtype=float)
        tmax = max(tmax, float(t[-1]))
        _line(axes[0], t, cv.statistics["first_mean_cosine"], cv, label=f"{cv.label}: mean", ms=3)
        _line(axes[0], t, cv.statistics["first_min_cosine"], cv, dotted=True, label="min")
        pos = t > 0
        _line(axes[1], t[pos], np.asarray(cv.statistics["norm_mean"])[pos], cv,
              label=f"{cv.label}: mean", ms=3)
        _line(axes[1], t[pos], np.asarray(cv.statistics["norm_max"])[pos], cv, dotted=True,
              label="max")
    axes[0].set_xscale("symlog", linthresh=1.0)
    axes[0].set_ylabel("cosine to the first token")
    ref = np.array([1.0, tmax])
    last = np.asarray(repeated[0].statistics["norm_mean"], dtype=float)[-1]
    axes[1].plot(ref, last * ref / tmax, color="0.6", lw=1, label="∝ t")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("token norm |x_i|")
    for ax in axes[:2]:
        ax.set_xlabel("depth t (layers)")
        ax.legend(fontsize=7)
    if third:
        assert continuous is not None and network is not None
        ax = axes[2]
        tc = np.asarray(continuous["times"], dtype=float)
        ax.plot(tc, continuous["relative_difference"], "k^-", ms=4,
                label="max |continuous − network| / max |network|")
        ax.plot(np.asarray(network.times, dtype=float), network.statistics["first_mean_cosine"],
                "o-", ms=3, color="C3", label="network: mean cosine to the first token")
        ax.plot(tc, continuous["statistics"]["first_mean_cosine"], "s--", ms=3, color="C0",
                label="continuous: mean cosine to the first token")
        ax.set_xlabel("layer")
        ax.set_title("continuous depth against the network", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
