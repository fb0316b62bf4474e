r"""The run report of a pretrained encoder: four token flows of one text, their statistics,
figures, a JSON summary and the states.

:func:`flow_report` runs, from the embedding output of a text,

1. ``network``: the model itself (:meth:`~transformer_pde.pretrained.PretrainedEncoder.hidden_states`);
2. ``continuous``: the continuous-depth network (``steps_per_layer`` steps of ``solver``
   per sub-layer, :meth:`~transformer_pde.pretrained.PretrainedEncoder.simulate`);
3. ``repeated_layer_<l>``: each layer :math:`\ell` of ``repeat_layers`` iterated
   ``long_time`` times with its own weights (one Euler step per layer, ALBERT-style weight
   sharing), saved at the depths 0, 1, 2, 3, 5, 10, 20, 30, 50, 100, ... and the last;
4. ``continuous_repeated_layer_<l>``: one layer repeated in continuous depth (RK4).

Each flow gets :func:`~transformer_pde.diagnostics.depth_statistics` at its saved depths
plus ``relative_radius`` (cloud radius over mean token norm: below ~1e-15 the cloud is one
point to rounding).  The figures are drawn by :func:`transformer_pde.plot.token_paths`,
:func:`~transformer_pde.plot.statistics_along_depth` and
:func:`~transformer_pde.plot.cosine_matrices`; the summary is written with the package's
JSON encoding (:func:`transformer_pde.io.dumps`) and the states in its checksummed NPZ
container (:func:`transformer_pde.io.save_npz`).

Each figure is one function of the flows (:func:`paths_figure`, :func:`statistics_figure`,
:func:`cosine_figure`), which the report and the encoder's one-call methods
(``model.plot_token_paths(text)``, ``plot_statistics``, ``plot_cosine``: only the flows a
figure draws are run) share.  The model is annotated as the models' common base
:class:`~transformer_pde.pretrained.depth_args.DepthModel`: the encoder imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import plot
from ..diagnostics.depth import depth_statistics
from ..errors import ArgumentError
from ..io import dumps, save_npz
from .depth_args import DepthModel

__all__ = ["cosine_figure", "flow_report", "flow_settings", "paths_figure", "run_flows",
           "sample_depths", "statistics_figure"]

#: settings of :func:`~transformer_pde.diagnostics.depth_statistics` used by the report
_CLUSTER_TOL = 0.05
_RANK_RTOL = 1e-6


def sample_depths(t_max: int) -> list[int]:
    """Depths 0, 1, 2, 3, 5, 10, 20, 30, 50, 100, ... up to ``t_max`` (and ``t_max``)."""
    out = [0]
    for dec in (1, 10, 100, 1000, 10000):
        for m in (1, 2, 3, 5):
            if m * dec <= t_max:
                out.append(m * dec)
    if out[-1] != t_max:
        out.append(t_max)
    return sorted(set(out))


def _repeated(tr: Any, times: list[int]) -> dict[str, Any]:
    return {"times": times, "states": tr.states[times], "status": str(tr.status),
            "last_step_change": float(np.abs(tr.states[-1] - tr.states[-2]).max())}


def run_flows(model: DepthModel, text: str, *, steps_per_layer: int = 8,
              solver: str = "rk4", long_time: int = 300,
              repeat_layers: Sequence[int] | None = None, continuous_long_time: int = 50,
              continuous_layer: int | None = None,
              continuous_steps: int = 4) -> dict[str, dict[str, Any]]:
    """The four flows of :func:`flow_report`, with their statistics.

    Returns
    -------
    dict
        Flow name -> ``times`` (list of depths), ``states`` (T, N, d), ``statistics``
        (:func:`~transformer_pde.diagnostics.depth_statistics` with ``relative_radius``)
        and, except for ``network``, ``status``; the repeated flows also carry
        ``last_step_change`` (largest coordinate change over the last layer).

    Raises
    ------
    ArgumentError
        A layer index out of range, ``long_time`` or ``continuous_long_time`` not an
        integer >= 1, or text the model cannot read.
    """
    L = model.n_layers
    settings = flow_settings(model, repeat_layers=repeat_layers, continuous_layer=continuous_layer)
    layers, c_layer = settings["repeat_layers"], settings["continuous_layer"]
    for ell in [*layers, c_layer]:
        model.layer(ell)
    for name, v in (("long_time", long_time), ("continuous_long_time", continuous_long_time)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ArgumentError(f"{name} must be an integer >= 1, got {v!r}")
    model.tokens(text)

    flows: dict[str, dict[str, Any]] = {}
    flows["network"] = {"times": list(range(L + 1)), "states": model.hidden_states(text)}
    cont = model.simulate(text, steps_per_layer=steps_per_layer, solver=solver)
    flows["continuous"] = {"times": list(range(L + 1)), "states": cont.states,
                           "status": str(cont.status)}
    rep_times = sample_depths(int(long_time))
    for ell in layers:
        tr = model.simulate(text, repeat_layer=ell, n_layers=int(long_time))
        flows[f"repeated_layer_{ell}"] = _repeated(tr, rep_times)
    tr = model.simulate(text, repeat_layer=c_layer, n_layers=int(continuous_long_time),
                        steps_per_layer=continuous_steps, solver="rk4")
    flows[f"continuous_repeated_layer_{c_layer}"] = _repeated(
        tr, sample_depths(int(continuous_long_time)))
    for f in flows.values():
        st = depth_statistics(f["states"], cluster_tol=_CLUSTER_TOL, rank_rtol=_RANK_RTOL)
        st["relative_radius"] = [r / m for r, m in zip(st["radius"], st["mean_norm"], strict=True)]
        f["statistics"] = st
    return flows


def flow_settings(model: DepthModel, *, steps_per_layer: int = 8, solver: str = "rk4",
                  long_time: int = 300, repeat_layers: Sequence[int] | None = None,
                  continuous_long_time: int = 50, continuous_layer: int | None = None,
                  continuous_steps: int = 4) -> dict[str, Any]:
    """The settings of :func:`run_flows` with their defaults filled in (the report's
    ``settings``), and the statistics' tolerances."""
    L = model.n_layers
    return {"steps_per_layer": steps_per_layer, "solver": solver, "long_time": int(long_time),
            "repeat_layers": list(range(L)) if repeat_layers is None
            else [int(i) for i in repeat_layers],
            "continuous_layer": L - 1 if continuous_layer is None else int(continuous_layer),
            "continuous_long_time": int(continuous_long_time),
            "continuous_steps": continuous_steps, "cluster_tol": _CLUSTER_TOL,
            "rank_rtol": _RANK_RTOL}


def _flows(settings: dict[str, Any]) -> tuple[str, str]:
    """The names of the last repeated flow and of the continuous repeated flow."""
    return (f"repeated_layer_{settings['repeat_layers'][-1]}",
            f"continuous_repeated_layer_{settings['continuous_layer']}")


def paths_figure(model: DepthModel, text: str, flows: dict[str, dict[str, Any]],
                 settings: dict[str, Any], *, fig: Any = None) -> Any:
    """Token paths of the network, its continuous-depth version, the last layer of
    ``settings['repeat_layers']`` repeated and the continuous repeated layer
    (:func:`~transformer_pde.plot.token_paths`); ``flows`` of :func:`run_flows`,
    ``settings`` of :func:`flow_settings`.  Returns the figure."""
    rep, crep = _flows(settings)
    net = flows["network"]["states"]
    return plot.token_paths(
        [plot.PathPanel(f"the network ({model.n_layers} layers)", net, net, labelled=True),
         plot.PathPanel(f"continuous depth ({settings['solver']}, "
                        f"{settings['steps_per_layer']} steps/layer)",
                        flows["continuous"]["states"], net, labelled=True),
         plot.PathPanel(f"layer {settings['repeat_layers'][-1]} repeated, "
                        f"t ≤ {settings['long_time']}", flows[rep]["states"]),
         plot.PathPanel(f"layer {settings['continuous_layer']} repeated, continuous, "
                        f"t ≤ {settings['continuous_long_time']}", flows[crep]["states"])],
        model.tokens(text), title=f"token paths along depth (o start, ■ end): {text!r}",
        fig=fig)


def statistics_figure(model: DepthModel, text: str, flows: dict[str, dict[str, Any]],
                      settings: dict[str, Any], *, fig: Any = None) -> Any:
    """Statistics along depth (:func:`~transformer_pde.plot.statistics_along_depth`): the
    network and its continuous-depth version (top), every repeated layer and the continuous
    repeated layer (bottom).  Arguments as :func:`paths_figure`; returns the figure."""
    _, crep = _flows(settings)

    def curve(key: str, label: str, style: str, ms: float | None = None) -> Any:
        return plot.DepthCurve(label, flows[key]["times"], flows[key]["statistics"], style, ms)

    return plot.statistics_along_depth(
        [curve("network", "network", "o-"), curve("continuous", "continuous depth", "s--")],
        [curve(f"repeated_layer_{ell}", f"layer {ell} repeated", "o-", 3)
         for ell in settings["repeat_layers"]]
        + [curve(crep, f"layer {settings['continuous_layer']} repeated, continuous", "k^--",
                 4)],
        title=f"{len(model.tokens(text))} tokens, d = {model.d}: the network and its "
              "continuous-depth version (top), layers repeated to long times (bottom)",
        fig=fig)


def cosine_figure(model: DepthModel, text: str, flows: dict[str, dict[str, Any]],
                  settings: dict[str, Any], *, fig: Any = None) -> Any:
    """Cosine-similarity matrices (:func:`~transformer_pde.plot.cosine_matrices`) along the
    network, the repeated layers ending with the fewest and with the most clusters, and the
    continuous repeated layer.  Arguments as :func:`paths_figure`; returns the figure."""
    layers, c_layer = settings["repeat_layers"], settings["continuous_layer"]
    final = {ell: flows[f"repeated_layer_{ell}"]["statistics"]["n_clusters"][-1]
             for ell in layers}
    shown = sorted({min(layers, key=lambda e: (final[e], -e)),
                    max(layers, key=lambda e: (final[e], -e))})
    rows = [("layer", flows["network"])]
    rows += [(f"layer {ell}×, t", flows[f"repeated_layer_{ell}"]) for ell in shown]
    rows.append((f"layer {c_layer} cont., t", flows[_flows(settings)[1]]))
    return plot.cosine_matrices([(lab, f["times"], f["states"]) for lab, f in rows],
                                ncol=max(model.n_layers + 1, 7), fig=fig)


def flow_report(model: DepthModel, text: str, out_dir: str | Path, *,
                steps_per_layer: int = 8, solver: str = "rk4", long_time: int = 300,
                repeat_layers: Sequence[int] | None = None,
                continuous_long_time: int = 50, continuous_layer: int | None = None,
                continuous_steps: int = 4, prefix: str = "pretrained",
                save_states: bool = True) -> dict[str, Any]:
    r"""Token flow of ``text`` through ``model``: figures, statistics and a JSON summary.

    Runs the four flows of :func:`run_flows` (see the module docstring): the network, its
    continuous-depth version, each layer of ``repeat_layers`` (default: all) repeated for
    ``long_time`` layers, and layer ``continuous_layer`` (default: the last) repeated for
    ``continuous_long_time`` layers in continuous depth (``continuous_steps`` RK4 steps per
    sub-layer).

    Writes into ``out_dir``: ``{prefix}_paths.png`` (token paths along depth in the plane of
    the first two principal components of the states), ``{prefix}_statistics.png``
    (clusters, effective covariance rank, mean cosine similarity and relative radius against
    depth), ``{prefix}_cosine.png`` (cosine-similarity matrices per layer and along the long
    flows), ``{prefix}_summary.json`` and, with ``save_states``, ``{prefix}_states.npz``
    (each flow's states under its name and its depths under ``<name>__times``).

    Returns
    -------
    dict
        The JSON summary: ``text``, ``tokens``, ``model_dir``, ``model``, ``settings``,
        per flow (``flows``) the depths, status and statistics, and the figure file names.
    """
    kw = {"steps_per_layer": steps_per_layer, "solver": solver, "long_time": long_time,
          "repeat_layers": repeat_layers, "continuous_long_time": continuous_long_time,
          "continuous_layer": continuous_layer, "continuous_steps": continuous_steps}
    flows = run_flows(model, text, **kw)
    settings = flow_settings(model, **kw)
    toks = model.tokens(text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib only when a report is drawn)

    names = [f"{prefix}_{kind}.png" for kind in ("paths", "statistics", "cosine")]
    for draw, name, dpi in zip((paths_figure, statistics_figure, cosine_figure), names,
                               (110, 110, 100), strict=True):
        fig = draw(model, text, flows, settings)
        fig.savefig(out / name, dpi=dpi)
        plt.close(fig)
    summary: dict[str, Any] = {
        "text": text, "tokens": toks, "model_dir": str(model.model_dir),
        "model": {"type": model.config.model_type, "layers": model.n_layers, "d": model.d,
                  "heads": model.config.heads},
        "settings": settings,
        "flows": {k: {kk: vv for kk, vv in f.items() if kk != "states"}
                  for k, f in flows.items()},
        "figures": names,
    }
    (out / f"{prefix}_summary.json").write_text(dumps(summary, indent=1, strict=True))
    if save_states:
        save_npz(out / f"{prefix}_states.npz",
                 {**{k: f["states"] for k, f in flows.items()},
                  **{f"{k}__times": np.asarray(f["times"]) for k, f in flows.items()}},
                 compressed=True)
    return summary
