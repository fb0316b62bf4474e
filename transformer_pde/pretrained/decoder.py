r"""A Llama-family decoder read from a GGUF file, as a token flow of the library.

:func:`load_gguf` reads a GGUF file (:func:`~transformer_pde.pretrained.read_gguf`)
and returns a :class:`PretrainedDecoder`: the network's weights as the library's own
objects, stacked over depth into :class:`~transformer_pde.Layers` tables: one causal
:class:`~transformer_pde.Attention` with rotary positions
(:class:`~transformer_pde.attention.Rotary`) and grouped key/value heads, one gated
:class:`~transformer_pde.blocks.MLP` (SwiGLU) and a pair of pre-norm
:class:`~transformer_pde.blocks.RMSNorm`.

**A decoder block is one step of the library's flow.**  With the token states
:math:`x_i\in\mathbb R^d` at positions :math:`i = 0, \dots, n-1`, block :math:`\ell` maps

.. math::
    h_i = x_i + \Gamma_\ell\big(\mathrm{RMS}^{(1)}_\ell x\big)_i, \qquad
    x_i^{+} = h_i + m_\ell\big(\mathrm{RMS}^{(2)}_\ell h_i\big),

where :math:`\mathrm{RMS}(x) = \gamma\odot x/\sqrt{\tfrac1d|x|^2+\varepsilon}`,
:math:`m_\ell(x) = W_2\big(\mathrm{SiLU}(W_g x)\odot W_1 x\big)` and :math:`\Gamma_\ell` is
causal softmax attention with :math:`H` query heads of width :math:`m = d/H` sharing
:math:`G` key/value heads (head :math:`h` reads key/value head
:math:`\lfloor h G/H\rfloor`),

.. math::
    \Gamma(y)_i = W_O \bigoplus_{h=1}^{H} \sum_{j \le i}
    \frac{e^{\beta\langle R_i Q_h y_i,\, R_j K_{g(h)} y_j\rangle}}
    {\sum_{k\le i} e^{\beta\langle R_i Q_h y_i,\, R_k K_{g(h)} y_k\rangle}}\, V_{g(h)} y_j,
    \qquad \beta = 1/\sqrt m,

with :math:`R_i` the rotary rotation of position :math:`i`.  This is exactly one explicit
Euler step of size 1, with Lie splitting, of the pre-norm flow

.. math:: \dot x = \Gamma_{\ell(t)}\big(\mathrm{RMS}^{(1)}_{\ell(t)} x\big)
          + m_{\ell(t)}\big(\mathrm{RMS}^{(2)}_{\ell(t)} x\big),
          \qquad \ell(t) = \lfloor t \rfloor,

which is how :meth:`PretrainedDecoder.hidden_states` computes the network (one call of
:func:`~transformer_pde.simulate`).  Tokens carry the positions :math:`p_i = i/\sigma`
with :math:`\sigma` the smallest power of two at least the context length, and the
rotary embedding has ``span`` :math:`\sigma`, so that :math:`\sigma p_i = i` exactly.
The logits are :math:`E\,\mathrm{RMS}_{\mathrm{out}}(x_i)` (``E`` the output matrix, the
token embedding when tied).

**Continuous depth.**  Unlike the post-norm encoder, the pre-norm flow is an ordinary
differential equation whose right-hand side never projects the residual stream, so its
step can simply be refined: :meth:`PretrainedDecoder.simulate` integrates it with
``steps_per_layer`` steps of size :math:`1/k` per layer (Lie splitting by default, which
converges at first order to the flow above), and can repeat one layer's weights to run
the autonomous flow of that layer to long times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..attention import Attention, Layers, Rotary
from ..attention.matrix import attention_matrix
from ..backends import DEFAULT_BACKEND
from ..blocks import MLP, Block, RMSNorm
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.loop import Limits, SaveAt
from ..particles import FieldOptions, ParticleTrajectory
from ..particles import simulate as simulate_particles
from ..results import Status
from ..results_display import summary_html, summary_text
from .decoder_report import (attention_sink_figure, encoder_statistics, idealised_causal_flow,
                             long_time_figure, models_figure, network_flow, run_decoder_flows)
from .depth_args import DepthModel
from .gguf_file import DecoderConfig, GGUFModel, read_gguf
from .text_args import check_text

__all__ = ["PretrainedDecoder", "from_gguf_model", "load_gguf"]

#: prompts of at most this many tokens run their products on one BLAS thread
_ONE_BLAS_THREAD_TOKENS = 512
# a token norm above this ends a run as a blow-up (the residual stream of SmolLM2 reaches ~1e4)
_MAX_NORM = 1e12


def _span(context_length: int) -> float:
    """The smallest power of two >= the context length (positions i / span are exact)."""
    return float(2 ** max(0, math.ceil(math.log2(context_length))))


@dataclass(eq=False)
class PretrainedDecoder(DepthModel):
    r"""A GGUF decoder read by :func:`load_gguf`, as objects of the library.

    Attributes
    ----------
    config : DecoderConfig
        The architecture.
    path : pathlib.Path
        The GGUF file it was read from.
    attention : Attention
        Causal softmax attention of every layer (``Layers`` tables, layer :math:`\ell` on
        :math:`[\ell, \ell+1)`): ``heads=H``, ``kv_heads=G``, ``beta=1/sqrt(m)``, ``W_O``,
        rotary positions.
    mlp : MLP
        The gated SiLU MLP of every layer (``W1`` up, ``gate``, ``W2`` down).
    layernorm : tuple of RMSNorm
        The pre-norm pair (before attention, before the MLP) of every layer.
    output_norm : RMSNorm
        The final normalisation before the logits.
    embedding : ndarray (vocab, d), float64
        Token embedding (the initial measure of a text).
    output : ndarray (vocab, d), float64
        Output matrix of the logits (``embedding`` itself when tied).
    tokenizer : tokenizers.Tokenizer
        The file's byte-level BPE tokenizer.
    quantization : dict of str
        Tensor name -> its type in the file.
    """

    config: DecoderConfig
    path: Path
    attention: Attention = field(repr=False)
    mlp: MLP = field(repr=False)
    layernorm: tuple[RMSNorm, RMSNorm] = field(repr=False)
    output_norm: RMSNorm = field(repr=False)
    embedding: np.ndarray = field(repr=False)
    output: np.ndarray = field(repr=False)
    tokenizer: Any = field(repr=False)
    quantization: dict[str, str] = field(repr=False, default_factory=dict)

    # ------------------------------------------------------------------ display
    def _rows(self) -> list[tuple[str, str]]:
        c = self.config
        kinds: dict[str, int] = {}
        for k in self.quantization.values():
            kinds[k] = kinds.get(k, 0) + 1
        return [("name", c.name or "(unnamed)"), ("file", str(self.path)),
                ("width", f"d={c.d}, heads={c.heads} of width {c.head_dim}, "
                          f"kv_heads={c.kv_heads}"),
                ("mlp", f"gated SiLU, hidden={c.hidden}"),
                ("positions", f"rotary base={c.rope_base:g} dim={c.rope_dim} "
                              f"({c.rope_pairing}), context={c.context_length}"),
                ("vocabulary", f"{c.vocab_size} tokens, "
                               f"{'tied' if c.tied_output else 'separate'} output"),
                ("tensors", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))]

    def _title(self) -> str:
        return f"PretrainedDecoder({self.config.architecture}, layers={self.n_layers})"

    def __repr__(self) -> str:
        return summary_text(self._title(), self._rows())

    def _repr_html_(self) -> str:
        return summary_html(self._title(), self._rows())

    # ------------------------------------------------------------------ text
    def tokenize(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (with ``bos`` in front when the file asks for it).

        Raises
        ------
        ArgumentTypeError
            ``text`` is not a string.
        ArgumentError
            ``text`` is empty, holds a lone surrogate (not UTF-8, see
            :func:`~transformer_pde.pretrained.text_args.check_text`), or has more tokens
            than the context length.
        """
        check_text(text)
        ids = list(self.tokenizer.encode(text).ids)
        c = self.config
        if c.add_bos and c.bos_id is not None and (not ids or ids[0] != c.bos_id):
            ids.insert(0, c.bos_id)
        return self._check_ids(np.asarray(ids, dtype=np.int64), "text")

    def _check_ids(self, ids: np.ndarray, name: str) -> np.ndarray:
        n, c = ids.size, self.config
        if n == 0:
            raise ArgumentError(f"{name} gives no token")
        if n > c.context_length:
            raise ArgumentError(f"{name} has {n} tokens but the model's context_length is "
                                f"{c.context_length}; shorten it (no silent truncation)")
        return ids

    def _ids(self, text: Any, name: str = "text") -> np.ndarray:
        """Token ids of a text, or checked ids given directly."""
        if isinstance(text, (str, bytes, bytearray)):  # bytes: check_text says to decode
            return self.tokenize(text)
        a = np.asarray(text)
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise ArgumentTypeError(f"{name} must be a str or a 1-D array of token ids, got "
                                    f"{type(text).__name__} of shape {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= self.config.vocab_size):
            raise ArgumentError(f"{name}: token ids must lie in [0, {self.config.vocab_size})")
        return self._check_ids(a.astype(np.int64), name)

    def tokens(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings of the vocabulary (bytes as GPT-2 characters)."""
        return [self.tokenizer.id_to_token(int(i)) for i in self.tokenize(text)]

    def detokenize(self, ids: Any) -> str:
        """The text of token ids (control tokens written out): the inverse of
        :meth:`tokenize`."""
        a = np.asarray(ids)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ArgumentTypeError("ids must be a 1-D sequence of integers")
        if a.size and (a.min() < 0 or a.max() >= self.config.vocab_size):
            raise ArgumentError(f"ids must lie in [0, {self.config.vocab_size})")
        return self.tokenizer.decode([int(i) for i in a], skip_special_tokens=False)

    def positions(self, n: int) -> np.ndarray:
        r"""Token positions :math:`p_i = i/\sigma` in [0, 1) of ``n`` tokens (see the module
        docstring)."""
        return np.arange(n, dtype=np.float64) / _span(self.config.context_length)

    def embed(self, text: Any) -> np.ndarray:
        r"""The initial measure: the token embeddings :math:`E[t_i]` of ``text`` (a string or
        token ids), shape (n, d), float64."""
        return np.array(self.embedding[self._ids(text)])

    # ------------------------------------------------------------------ the network
    def layer(self, ell: int) -> tuple[Attention, MLP, tuple[RMSNorm, RMSNorm]]:
        """Attention, MLP and pre-norm pair of layer ``ell`` (0-based), with constant
        weights."""
        ell = self.layer_index(ell)
        a, m, (n1, n2) = self.attention, self.mlp, self.layernorm

        def at(v: Any) -> Any:
            if not isinstance(v, Layers):
                return v
            return v.values[ell][0] if v.values.shape[1] == 1 else v.values[ell]

        att = Attention("softmax", at(a.Q), at(a.K), at(a.V), heads=a.heads,
                        kv_heads=a.kv_heads, masked=True, beta=a.beta, W_O=at(a.W_O),
                        b_Q=at(a.b_Q), b_K=at(a.b_K), b_V=at(a.b_V), b_O=at(a.b_O),
                        rotary=a.rotary)
        mlp = MLP(at(m.W1), at(m.W2), activation=m.activation, gate=at(m.gate))
        return att, mlp, (RMSNorm("pre", n1.eps, scale=at(n1.scale)),
                          RMSNorm("pre", n2.eps, scale=at(n2.scale)))

    def _run(self, X0: np.ndarray, att: Attention, mlp: MLP, norms: tuple[RMSNorm, RMSNorm],
             *, t_max: float, steps: int, solver: Any, splitting: str,
             backend: Any) -> ParticleTrajectory:
        # A prompt's products are small (n x d by d x d): BLAS threads cost more in start-up
        # and spinning than they save.  Measured on 2 cores for a 32-token SmolLM2 forward:
        # 0.37 s of CPU with one BLAS thread, 5.9 s with OpenBLAS's default two.
        limit = 1 if X0.shape[0] <= _ONE_BLAS_THREAD_TOKENS else None
        with threadpool_limits(limits=limit, user_api="blas"):
            return simulate_particles(
                att, X0, t_max=t_max, dt=1.0 / steps, solver=solver,
                saveat=SaveAt(every=steps), positions=self.positions(X0.shape[0]),
                block=Block(mlp=mlp, layernorm=norms, splitting=splitting),
                field=FieldOptions(backend=backend), limits=Limits(max_norm=_MAX_NORM))

    def hidden_states(self, text: Any, *, backend: Any = DEFAULT_BACKEND) -> np.ndarray:
        r"""The residual stream after the embedding and after every block, by the flow.

        Runs :func:`~transformer_pde.simulate` once on the per-layer tables with
        ``solver="euler"``, ``dt=1`` and ``Block(mlp, layernorm=(RMS1, RMS2),
        splitting="lie")`` (pre-norm), from :meth:`embed`, at :meth:`positions`.

        Parameters
        ----------
        text : str or array of int
            Text or token ids.
        backend : str or backend object, default "auto"
            Backend of the attention fields (:data:`~transformer_pde.backends.DEFAULT_BACKEND`).

        Returns
        -------
        ndarray (L + 1, n, d), float64
            Row 0 is the embedding, row :math:`\ell` the output of block :math:`\ell`
            (before the final normalisation).
        """
        X0 = self.embed(text)
        tr = self._run(X0, self.attention, self.mlp, self.layernorm, t_max=float(self.n_layers),
                       steps=1, solver="euler", splitting="lie", backend=backend)
        if tr.status is not Status.OK:
            raise ArgumentError(f"the layer stack did not run to the end: {tr.message}")
        return np.asarray(tr.states)

    def logits_of(self, states: Any) -> np.ndarray:
        r"""Next-token logits :math:`E\,\mathrm{RMS}_{\mathrm{out}}(x_i)` of final states
        (n, d), shape (n, vocab)."""
        X = np.asarray(states, dtype=np.float64)
        return np.asarray(self.output_norm(X)) @ self.output.T

    def logits(self, text: Any, *, backend: Any = DEFAULT_BACKEND) -> np.ndarray:
        """Every position's next-token logits, shape (n, vocab), float64."""
        return self.logits_of(self.hidden_states(text, backend=backend)[-1])

    def generate(self, text: Any, n: int, *, stop_at_eos: bool = True,
                 backend: Any = DEFAULT_BACKEND) -> str:
        """Greedy continuation of ``text`` by ``n`` tokens (fewer when the model emits its
        end-of-sequence token and ``stop_at_eos``); returns the continuation's text only.

        Every new token reruns the whole flow on the prompt and the tokens so far (no key
        and value cache): meant for short continuations."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ArgumentError(f"n must be an integer >= 1, got {n!r}")
        ids = list(self._ids(text))
        start = len(ids)
        for _ in range(int(n)):
            self._check_ids(np.asarray(ids + [0]), "text with its continuation")
            X = self.hidden_states(np.asarray(ids), backend=backend)[-1]
            nxt = int(np.argmax(self.logits_of(X[-1:])[0]))
            if stop_at_eos and nxt == self.config.eos_id:
                break
            ids.append(nxt)
        return self.detokenize(np.asarray(ids[start:], dtype=np.int64))

    def attention_weights(self, text: Any, *, backend: Any = DEFAULT_BACKEND) -> np.ndarray:
        r"""Every layer's attention matrices, shape (L, H, n, n).

        Entry :math:`[\ell, h, i, j]` is the weight query token :math:`i` of head :math:`h`
        puts on token :math:`j` in block :math:`\ell`, computed by
        :func:`~transformer_pde.fields.attention_matrix` at the block's input after its
        first RMSNorm (rows sum to one; :math:`j > i` is exactly 0)."""
        return self.attention_weights_of(self.hidden_states(text, backend=backend))

    def attention_weights_of(self, states: Any) -> np.ndarray:
        r"""The attention matrices (L, H, n, n) of :meth:`attention_weights` for hidden states
        you already have: ``states`` of shape (L + 1, n, d) or (L, n, d), as
        :meth:`hidden_states` returns them (row :math:`\ell` is block :math:`\ell`'s input)."""
        S = np.asarray(states, dtype=np.float64)
        if S.ndim != 3 or S.shape[0] < self.n_layers or S.shape[2] != self.d:
            raise ArgumentError(f"states must have shape (L + 1, n, d) or (L, n, d) with "
                                f"L = {self.n_layers}, d = {self.d}, got {S.shape}")
        pos = self.positions(S.shape[1])
        ln1 = self.layernorm[0]
        return np.stack([attention_matrix(self.attention, ln1(S[ell], float(ell)),
                                          t=float(ell), positions=pos)
                         for ell in range(self.n_layers)])

    def simulate(self, text: Any, *, steps_per_layer: int = 1, solver: Any = "euler",
                 repeat_layer: int | None = None, n_layers: int | None = None,
                 splitting: str = "lie", backend: Any = DEFAULT_BACKEND) -> ParticleTrajectory:
        r"""Continuous-depth flow of the network (see the module docstring).

        Integrates the pre-norm flow :math:`\dot x = \Gamma_\ell(\mathrm{RMS}^{(1)}_\ell x) +
        m_\ell(\mathrm{RMS}^{(2)}_\ell x)` with ``steps_per_layer`` steps of size
        :math:`1/k` per layer, in one call of :func:`~transformer_pde.simulate`.

        Parameters
        ----------
        text : str or array of int
            Text or token ids (their :meth:`embed` is the initial measure).
        steps_per_layer : int, default 1
            Steps :math:`k` per layer.  ``1`` with ``solver="euler"`` and ``splitting="lie"``
            is the network itself (equal to :meth:`hidden_states`).
        solver : {"euler", "heun", "rk4", "implicit_midpoint"} or solver object, default "euler"
            Fixed-step one-step solver of :mod:`transformer_pde.integrate.solvers`.
        repeat_layer : int, optional
            Use layer ``repeat_layer``'s weights at every depth (ALBERT-style weight sharing)
            for ``n_layers`` layers: an autonomous flow that can be run to long times.
        n_layers : int, optional
            Number of layers to run (default: the model's depth; more only with
            ``repeat_layer``).
        splitting : {"lie", "strang", "none"}, default "lie"
            How each step combines the attention and MLP fields (``"none"``: the solver on
            their sum, of the solver's order).
        backend : str or backend object, default "auto"
            Backend of the attention fields (:data:`~transformer_pde.backends.DEFAULT_BACKEND`).

        Returns
        -------
        ParticleTrajectory
            States after every layer, ``times = 0, 1, ..., n_layers``; ``status`` says whether
            the run reached the end (``info`` records the flow's settings).
        """
        self.check_depth_run(steps_per_layer, solver, repeat_layer, n_layers)
        L = self.n_layers if n_layers is None else int(n_layers)
        X0 = self.embed(text)
        if repeat_layer is None:
            att, mlp, norms = self.attention, self.mlp, self.layernorm
        else:
            att, mlp, norms = self.layer(repeat_layer)
        tr = self._run(X0, att, mlp, norms, t_max=float(L), steps=int(steps_per_layer),
                       solver=solver, splitting=splitting, backend=backend)
        tr.info = {**tr.info, "steps_per_layer": int(steps_per_layer),
                   "repeat_layer": repeat_layer, "n_layers": L,
                   "model": self.config.name or self.config.architecture,
                   "model_file": str(self.path),
                   "flow": "pre-norm: x' = Attention(RMS1 x) + MLP(RMS2 x)"}
        return tr

    # ------------------------------------------------------------------ figures
    def plot_statistics(self, text: str, *, encoder: Any = None, encoder_label: str | None = None,
                        fig: Any = None) -> Any:
        """The report's statistics figure of ``text`` in one call: clusters, effective rank,
        mean cosine, cosine to the first token, token norms and attention on the first token
        against the relative depth, beside ``encoder``'s (a
        :class:`~transformer_pde.pretrained.PretrainedEncoder`, labelled ``encoder_label``,
        default its model type) when one is given.  Runs the network only
        (:func:`~transformer_pde.pretrained.decoder_report.models_figure`).

        Returns the :class:`~matplotlib.figure.Figure` (``fig`` or a new pyplot figure)."""
        enc = None if encoder is None else encoder_statistics(encoder, text)
        return models_figure(self, text, network_flow(self, text), enc, encoder_label, fig=fig)

    def plot_attention_sink(self, text: str, *, betas: Sequence[float] = (1.0, 4.0, 16.0),
                            fig: Any = None) -> Any:
        r"""The report's attention-sink figure of ``text`` in one call: (a) the attention on the
        first token per block, (b) the cosine to the first token, (c) each token's attention
        on the first token, (d) the first token's largest channels, with the idealised causal
        flow (:func:`~transformer_pde.pretrained.idealised_causal_flow`, from the decoder's
        embeddings, one unit of time per layer) in (a) and (b) for every :math:`\beta` of
        ``betas`` (``()``: the decoder alone).  Runs the network and the idealised flows only
        (:func:`~transformer_pde.pretrained.decoder_report.attention_sink_figure`).

        Returns the :class:`~matplotlib.figure.Figure` (``fig`` or a new pyplot figure)."""
        net = network_flow(self, text)
        ideal = idealised_causal_flow(self.embed(text), betas, t_max=self.n_layers)
        return attention_sink_figure(self, text, net, ideal, fig=fig)

    def plot_long_time(self, text: str, *, steps_per_layer: int = 4, solver: str = "rk4",
                       long_time: int = 300, repeat_layers: Sequence[int] | None = None,
                       fig: Any = None) -> Any:
        """The report's long-time figure of ``text`` in one call: the layers of
        ``repeat_layers`` (default :math:`L/6` and :math:`5L/6`) iterated ``long_time`` times
        and the continuous-depth network (``steps_per_layer`` steps of ``solver``) against the
        network (:func:`~transformer_pde.pretrained.run_decoder_flows`,
        :func:`~transformer_pde.pretrained.decoder_report.long_time_figure`).

        Returns the :class:`~matplotlib.figure.Figure` (``fig`` or a new pyplot figure)."""
        flows = run_decoder_flows(self, text, steps_per_layer=steps_per_layer, solver=solver,
                                  long_time=long_time, repeat_layers=repeat_layers)
        return long_time_figure(self, flows, fig=fig)


def from_gguf_model(g: GGUFModel) -> PretrainedDecoder:
    """Build the library's objects from the checked contents of a GGUF file."""
    c, w = g.config, g.layers

    def table(name: str) -> Layers | None:
        if name not in w:
            return None
        v = w[name]
        return Layers(v[:, None, :] if v.ndim == 2 else v)

    rotary = Rotary(base=c.rope_base, span=_span(c.context_length), dim=c.rope_dim,
                    pairing=c.rope_pairing)
    att = Attention("softmax", table("Q"), table("K"), table("V"), heads=c.heads,
                    kv_heads=c.kv_heads, masked=True, beta=c.beta, W_O=table("W_O"),
                    b_Q=table("b_Q"), b_K=table("b_K"), b_V=table("b_V"), b_O=table("b_O"),
                    rotary=rotary)
    mlp = MLP(table("W1"), table("W2"), activation="silu", gate=table("gate"))
    norms = (RMSNorm("pre", c.rms_eps, scale=table("attn_norm")),
             RMSNorm("pre", c.rms_eps, scale=table("ffn_norm")))
    return PretrainedDecoder(config=c, path=g.path, attention=att, mlp=mlp, layernorm=norms,
                             output_norm=RMSNorm("post", c.rms_eps, scale=g.output_norm),
                             embedding=g.embedding, output=g.output, tokenizer=g.tokenizer,
                             quantization=dict(g.quantization))


def load_gguf(path: str | Path) -> PretrainedDecoder:
    """Read a GGUF decoder file as a :class:`PretrainedDecoder`.

    Parameters
    ----------
    path : str or path
        The ``.gguf`` file (e.g. :func:`~transformer_pde.pretrained.smollm2_path`).

    Returns
    -------
    PretrainedDecoder

    Raises
    ------
    ModelDirectoryNotFound
        The file does not exist.
    ModelDirectoryError
        Not a GGUF file or a damaged one, an unsupported architecture (the supported ones are
        listed), a metadata key missing or invalid, a missing or mis-shaped tensor, a NaN or
        infinite weight, or a quantisation type that ``gguf`` cannot dequantize (each named
        with the file, see :func:`~transformer_pde.pretrained.read_gguf`).
    MissingDependencyError
        ``gguf`` or ``tokenizers`` is not installed.
    """
    return from_gguf_model(read_gguf(path))
