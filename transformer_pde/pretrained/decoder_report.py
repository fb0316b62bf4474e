r"""The depth statistics of a pretrained decoder beside an encoder and the idealised causal flow.

:func:`decoder_flow_report` runs a text through a GGUF decoder
(:class:`~transformer_pde.pretrained.PretrainedDecoder`, e.g. SmolLM2-135M) and measures,
layer by layer:

* the statistics of :func:`~transformer_pde.diagnostics.depth_statistics` (clusters,
  effective rank of the token covariance, mean cosine similarity);
* the cosine of every token to the first token and the token norms (the growth of the
  residual stream), by :func:`~transformer_pde.diagnostics.decoder.distance_to_first`;
* the attention mass every token puts on the first token (mean over heads, and the largest
  head), from the attention matrices of every block (:func:`first_token_attention`);
* the *attention sink*: the channels that carry the first token's residual
  (:func:`sink_channels`).

Beside them it runs the same statistics for

* an encoder (:class:`~transformer_pde.pretrained.PretrainedEncoder`, e.g. all-MiniLM-L6-v2)
  on the same text, when one is given (:func:`encoder_statistics`);
* the idealised causal flow on the sphere (:func:`idealised_causal_flow`): :math:`Q = K = V
  = I`, masked softmax attention, from the decoder's own token embeddings projected on the
  unit sphere, for several :math:`\beta`, where the first token never moves and every other
  token is drawn to it;
* the decoder's continuous-depth version (``steps_per_layer`` steps of ``solver`` per layer)
  and layers repeated to long times (:func:`run_decoder_flows`).

The figures are drawn by :mod:`transformer_pde.plot.decoder` through :func:`models_figure`,
:func:`attention_sink_figure` and :func:`long_time_figure`, which the decoder's one-call
methods share (``model.plot_statistics(text)``, ``plot_attention_sink``,
``plot_long_time``: each runs only what its figure draws); the summary is written with
:func:`transformer_pde.io.dumps` and the states with :func:`transformer_pde.io.save_npz`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import Attention
from ..attention.matrix import attention_matrix
from ..blocks import Block
from ..diagnostics.decoder import distance_to_first
from ..diagnostics.depth import depth_statistics
from ..errors import ArgumentError
from ..integrate.loop import SaveAt
from ..io import dumps, save_npz
from ..particles import simulate
from ..plot.decoder import ModelCurve, attention_sink, decoder_flows, models_side_by_side
from ..reductions.pairs import causal_pair
from ..validation import real_array
from .report import sample_depths

__all__ = ["attention_sink_figure", "decoder_flow_report", "encoder_statistics",
           "first_token_attention", "idealised_causal_flow", "layer_statistics",
           "long_time_figure", "models_figure", "network_flow", "run_decoder_flows",
           "sink_channels"]

#: settings of :func:`~transformer_pde.diagnostics.depth_statistics` (as the encoder's report)
_CLUSTER_TOL = 0.05
_RANK_RTOL = 1e-6


def _floats(a: Any) -> list:
    """Plain (nested) Python floats for a JSON summary."""
    return np.asarray(a, dtype=float).tolist()


def first_token_attention(weights: Any, *, causal: bool = True) -> dict[str, list]:
    r"""The attention mass every token puts on the first token, layer by layer.

    For attention matrices :math:`P^{\ell h}_{ij}` (layer :math:`\ell`, head :math:`h`, query
    :math:`i`, key :math:`j`; rows sum to one) of :math:`n \ge 2` tokens,

    .. math::
        a^{\ell h} = \frac1{n-1}\sum_{i=1}^{n-1} P^{\ell h}_{i0}, \qquad
        \text{mean}_\ell = \frac1H\sum_h a^{\ell h}, \qquad
        \text{max\_head}_\ell = \max_h a^{\ell h} .

    Token 0 itself is left out (under a causal mask it can only attend to itself).

    Parameters
    ----------
    weights : array (L, H, n, n)
        Row-stochastic attention matrices, e.g.
        :meth:`~transformer_pde.pretrained.PretrainedDecoder.attention_weights`.
    causal : bool, default True
        Whether the matrices are causal; only sets the reference ``uniform``.

    Returns
    -------
    dict of list
        ``mean`` and ``max_head`` (L,), ``per_token`` (L, n: the mean over heads of
        :math:`P_{i0}`), ``per_head`` (L, H: :math:`a^{\ell h}`) and ``uniform``: the same
        mass under uniform attention, :math:`\frac1{n-1}\sum_{i\ge1}\frac1{i+1}` with a
        causal mask and :math:`1/n` without, which is also the limit of the idealised
        causal flow once all tokens have merged.

    Raises
    ------
    ArgumentError
        ``weights`` not of shape (L, H, n, n) with :math:`n \ge 2`, or not finite.
    """
    P = np.asarray(real_array("weights", weights), dtype=float)
    if P.ndim != 4 or P.shape[2] != P.shape[3] or P.shape[2] < 2:
        raise ArgumentError(f"weights must have shape (L, H, n, n) with n >= 2, got {P.shape}")
    if not np.all(np.isfinite(P)):
        raise ArgumentError("weights contain NaN or inf")
    n = P.shape[2]
    per_head = P[:, :, 1:, 0].mean(axis=2)
    uniform = float(np.mean(1.0 / np.arange(2, n + 1))) if causal else 1.0 / n
    return {"mean": _floats(per_head.mean(axis=1)), "max_head": _floats(per_head.max(axis=1)),
            "per_token": _floats(P[:, :, :, 0].mean(axis=1)), "per_head": _floats(per_head),
            "uniform": uniform}


def sink_channels(states: Any, *, token: int = 0, top: int = 2) -> dict[str, list]:
    r"""The channels that carry one token's residual stream, at every depth.

    For states :math:`x_i(t_k)` (T, n, d) and the token :math:`s` (``token``), the ``top``
    channels :math:`c` of largest :math:`|x_{s,c}|` at every depth, their signed values, the
    token's norm, the share :math:`\sum_{c\in\text{top}} x_{s,c}^2/|x_s|^2` of its squared
    norm they hold and, for comparison, the largest :math:`|x_{i,c}|` of the other tokens.

    Returns
    -------
    dict of list
        ``channels`` (T, top) of int, ``values`` (T, top), ``norm``, ``share`` and
        ``others_max_abs`` (T,).

    Raises
    ------
    ArgumentError
        ``states`` not of shape (T, n, d), ``token`` not in [0, n), ``top`` not in [1, d].
    """
    S = np.asarray(real_array("states", states), dtype=float)
    if S.ndim != 3 or S.shape[1] < 1:
        raise ArgumentError(f"states must have shape (T, n, d), got {S.shape}")
    n, d = S.shape[1:]
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < n:
        raise ArgumentError(f"token must be an integer in [0, {n}), got {token!r}")
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 1 <= top <= d:
        raise ArgumentError(f"top must be an integer in [1, {d}], got {top!r}")
    x = S[:, token]
    order = np.argsort(-np.abs(x), axis=1, kind="stable")[:, :top]
    values = np.take_along_axis(x, order, axis=1)
    norm2 = (x * x).sum(axis=1)
    share = np.where(norm2 > 0, (values ** 2).sum(axis=1) / np.where(norm2 > 0, norm2, 1.0), 0.0)
    others = np.delete(S, token, axis=1)
    omax = np.abs(others).max(axis=(1, 2)) if others.shape[1] else np.zeros(len(S))
    return {"channels": order.tolist(), "values": _floats(values),
            "norm": _floats(np.sqrt(norm2)), "share": _floats(share),
            "others_max_abs": _floats(omax)}


def layer_statistics(states: Any, weights: Any = None, *, causal: bool = True) -> dict[str, Any]:
    r"""All per-depth statistics of token states (T, n, d) in one flat dictionary.

    ``n_clusters``, ``numerical_rank``, ``effective_rank``, ``mean_cosine``, ``min_cosine``,
    ``mean_norm``, ``radius`` (:func:`~transformer_pde.diagnostics.depth_statistics`, 5 %
    clusters, rank tolerance 1e-6) and ``relative_radius`` (radius over mean norm); from
    :func:`~transformer_pde.diagnostics.decoder.distance_to_first`: ``first_mean_cosine``,
    ``first_min_cosine``, ``first_max_one_minus_cosine`` (over the tokens :math:`i\ge1`),
    ``norm_mean``, ``norm_max``, ``norm_min`` and ``norm_first`` (token norms); with
    ``weights`` (L, H, n, n) the attention on the first token (:func:`first_token_attention`)
    under ``first_attention``.
    """
    S = np.asarray(states, dtype=float)
    st: dict[str, Any] = depth_statistics(S, cluster_tol=_CLUSTER_TOL, rank_rtol=_RANK_RTOL)
    st["relative_radius"] = [r / m for r, m in zip(st["radius"], st["mean_norm"], strict=True)]
    f = distance_to_first(S)
    st.update({"first_mean_cosine": _floats(f.mean_cosine),
               "first_min_cosine": _floats(f.min_cosine),
               "first_max_one_minus_cosine": _floats(f.max_one_minus_cosine),
               "norm_mean": _floats(f.radius_mean), "norm_max": _floats(f.radius_max),
               "norm_min": _floats(f.radius_min), "norm_first": _floats(f.radius[:, 0])})
    if weights is not None:
        st["first_attention"] = first_token_attention(weights, causal=causal)
    return st


def encoder_statistics(encoder: Any, text: str) -> dict[str, Any]:
    r"""Per-layer statistics of an encoder's hidden states for ``text``.

    The attention matrices of layer :math:`\ell` are those of its attention at the layer's
    input (a post-norm layer attends to its input directly), by
    :func:`~transformer_pde.fields.attention_matrix`; without a mask, token 0 is the
    ``[CLS]`` token.

    Returns
    -------
    dict
        ``tokens``, ``times`` (0..L), ``states`` (L + 1, n, d), ``attention`` (L, H, n, n),
        ``statistics`` (:func:`layer_statistics`, unmasked reference) and ``label`` (its
        model type, e.g. ``"bert encoder"``).
    """
    S = encoder.hidden_states(text)
    P = np.stack([attention_matrix(encoder.attentions[ell], S[ell], t=0.0)
                  for ell in range(encoder.n_layers)])
    if S.shape[1] < 2:
        raise ArgumentError(f"text: {text!r} gives {S.shape[1]} token; at least 2 are needed")
    return {"tokens": encoder.tokens(text), "times": list(range(encoder.n_layers + 1)),
            "states": S, "attention": P, "statistics": layer_statistics(S, P, causal=False),
            "label": f"{encoder.config.model_type} encoder"}


def idealised_causal_flow(X0: Any, betas: Sequence[float] = (1.0, 4.0, 16.0), *,
                          t_max: float = 30.0, dt: float = 0.1) -> dict[str, dict[str, Any]]:
    r"""The causal flow on the sphere with :math:`Q = K = V = I`, from the directions of ``X0``.

    Each token :math:`\theta_i = x_i/|x_i|` moves by

    .. math::
        \dot\theta_i = P_{\theta_i}\sum_{j\le i}
        \frac{e^{\beta\langle\theta_i,\theta_j\rangle}}{\sum_{k\le i}
        e^{\beta\langle\theta_i,\theta_k\rangle}}\,\theta_j ,

    integrated with RK4 (step ``dt``) and saved at the integer times :math:`0, 1, \dots,
    t_{\max}` (one unit of time per layer of the network it is compared with).  The flow
    stays in the span of the initial tokens, so it is integrated exactly in an orthonormal
    basis of that span (:math:`n` coordinates; every inner product, hence every statistic,
    is that of the flow in :math:`\mathbb R^d`).  The theory
    (Karagodin, Polyanskiy, Rigollet, arXiv 2411.04990): token 0 attends only to itself and
    never moves, token 1 follows the causal pair
    :math:`\dot\rho = e^{\beta\rho}(1-\rho^2)/(e^{\beta\rho}+e^\beta)` exactly
    (:func:`~transformer_pde.reductions.causal_pair`), and every token converges to token 0.

    Returns
    -------
    dict
        ``"beta=<b>"`` -> ``beta``, ``times`` (the integers 0..t_max), ``states`` (T, n, n:
        coordinates in the span of the initial tokens, or (T, n, d) when d < n),
        ``attention`` (T, 1, n, n: the attention matrix at every saved time), ``statistics``
        (:func:`layer_statistics`; ``first_attention`` is indexed by the saved times),
        ``first_token_moved`` (the largest change of token 0: 0 in exact arithmetic and in
        floating point) and ``pair_error`` (largest deviation of token 1's cosine to token 0
        from the exact causal pair).

    Raises
    ------
    ArgumentError
        ``X0`` not of shape (n, d) with :math:`n \ge 2` and non-zero rows, ``t_max`` not a
        positive integer, ``dt`` not :math:`1/k`, or a non-positive :math:`\beta`.
    """
    X = np.asarray(real_array("X0", X0), dtype=float)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ArgumentError(f"X0 must have shape (n, d) with n >= 2, got {X.shape}")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    if not np.all(norms > 0):
        raise ArgumentError("X0: every token must be non-zero (its direction is the state)")
    if float(t_max) != int(t_max) or t_max < 1:
        raise ArgumentError(f"t_max must be a positive integer, got {t_max!r}")
    every = round(1.0 / dt) if dt > 0 else 0
    if every < 1 or abs(every * dt - 1.0) > 1e-12:
        raise ArgumentError(f"dt must be 1/k for an integer k >= 1, got {dt!r}")
    U = X / norms
    # the flow stays in the span of the initial tokens (the field is a combination of the
    # tokens, projected on the tangent space): integrate it in an orthonormal basis of that
    # span, an isometry that leaves every inner product, so every statistic, unchanged
    basis, _ = np.linalg.qr(U.T)
    Y = U @ basis
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    n, d = Y.shape
    pos = np.arange(n) / n
    out: dict[str, dict[str, Any]] = {}
    for beta in betas:
        if not float(beta) > 0:
            raise ArgumentError(f"betas must be positive, got {beta!r}")
        eye = np.eye(d)
        att = Attention("softmax", eye, eye, eye, beta=float(beta), masked=True)
        tr = simulate(att, Y, t_max=float(int(t_max)), dt=1.0 / every, solver="rk4",
                      positions=pos, block=Block(constraint="sphere"),
                      saveat=SaveAt(every=every))
        S = np.asarray(tr.states)
        P = np.stack([attention_matrix(att, Z, positions=pos) for Z in S])
        rho = distance_to_first(S).cosine[:, 1]
        pair = causal_pair(float(beta), float(np.clip(S[0, 0] @ S[0, 1], -1.0, 1.0)), tr.times)
        out[f"beta={float(beta):g}"] = {
            "beta": float(beta), "times": [round(float(t)) for t in tr.times],  # k steps of 1/k
            "states": S, "attention": P,
            "statistics": layer_statistics(S, P, causal=True), "status": str(tr.status),
            "first_token_moved": float(np.abs(S[:, 0] - S[0, 0]).max()),
            "pair_error": float(np.abs(rho - pair.rho).max())}
    return out


def _relative_difference(A: np.ndarray, B: np.ndarray) -> list:
    """Per depth: max |A - B| / max |B|."""
    scale = np.abs(B).max(axis=(1, 2))
    return _floats(np.abs(A - B).max(axis=(1, 2)) / np.where(scale > 0, scale, 1.0))


def run_decoder_flows(model: Any, text: str, *, steps_per_layer: int = 4, solver: str = "rk4",
                      long_time: int = 300,
                      repeat_layers: Sequence[int] | None = None) -> dict[str, dict[str, Any]]:
    r"""The decoder's flows of ``text``, with their statistics.

    ``network`` (:meth:`~transformer_pde.pretrained.PretrainedDecoder.hidden_states`, with
    the attention matrices of every block), ``continuous`` (``steps_per_layer`` steps of
    ``solver`` per layer; ``relative_difference`` from the network per layer: max
    :math:`|x^{\mathrm{cont}} - x^{\mathrm{net}}|` over max :math:`|x^{\mathrm{net}}|`) and
    ``repeated_layer_<l>`` for every :math:`l` of ``repeat_layers`` (default: the layers
    :math:`L/6` and :math:`5L/6`) iterated ``long_time`` times (one Euler step per layer),
    saved at the depths of :func:`~transformer_pde.pretrained.sample_depths`.  Every flow
    has ``times``, ``states``, ``statistics`` (:func:`layer_statistics`) and ``sink``
    (:func:`sink_channels` of token 0).

    Raises
    ------
    ArgumentError
        A layer index out of range, ``long_time`` not an integer >= 1, text the model cannot
        read or of fewer than 2 tokens.
    """
    L = model.n_layers
    layers = [L // 6, (5 * L) // 6] if repeat_layers is None else [int(i) for i in repeat_layers]
    for ell in layers:
        model.layer(ell)
    if isinstance(long_time, bool) or not isinstance(long_time, (int, np.integer)) \
            or long_time < 1:
        raise ArgumentError(f"long_time must be an integer >= 1, got {long_time!r}")
    flows: dict[str, dict[str, Any]] = {"network": network_flow(model, text)}
    net = flows["network"]["states"]
    cont = model.simulate(text, steps_per_layer=steps_per_layer, solver=solver)
    C = np.asarray(cont.states)     # fewer than L + 1 states if the run stopped
    flows["continuous"] = {"times": list(range(len(C))), "states": C,
                           "status": str(cont.status),
                           "relative_difference": _relative_difference(C, net[:len(C)])}
    times = sample_depths(int(long_time))
    for ell in layers:
        tr = model.simulate(text, repeat_layer=ell, n_layers=int(long_time))
        S = np.asarray(tr.states)
        kept = [t for t in times if t < len(S)]     # all of them unless the run stopped
        flows[f"repeated_layer_{ell}"] = {
            "times": kept, "states": S[kept], "status": str(tr.status),
            "last_step_change": float(np.abs(S[-1] - S[-2]).max())}
    for f in flows.values():
        f.setdefault("statistics", layer_statistics(f["states"]))  # the network has its own
        f.setdefault("sink", sink_channels(f["states"]))
    return flows


def network_flow(model: Any, text: str) -> dict[str, Any]:
    """The decoder's own layers on ``text``: ``times`` (0..L), ``states`` (L + 1, n, d),
    ``attention`` (L, H, n, n), ``statistics`` (:func:`layer_statistics` with
    ``first_attention``) and ``sink`` (:func:`sink_channels` of token 0).

    Raises
    ------
    ArgumentError
        Text the model cannot read or of fewer than 2 tokens.
    """
    if len(model.tokenize(text)) < 2:
        raise ArgumentError(f"text: {text!r} gives one token; at least 2 are needed")
    net = model.hidden_states(text)
    P = model.attention_weights_of(net)
    return {"times": list(range(model.n_layers + 1)), "states": net, "attention": P,
            "statistics": layer_statistics(net, P), "sink": sink_channels(net)}


def _highlights(flows: dict[str, dict[str, Any]], ideal: dict[str, dict[str, Any]],
                enc: dict[str, Any] | None) -> dict[str, Any]:
    """The numbers a reader looks for first (also printed by the command line)."""
    net = flows["network"]
    st, sink, fa = net["statistics"], net["sink"], net["statistics"]["first_attention"]
    k = int(np.argmax(sink["norm"]))
    out: dict[str, Any] = {
        "sink_max_norm": sink["norm"][k], "sink_max_layer": k,
        "sink_channels": sink["channels"][k], "sink_values": sink["values"][k],
        "sink_share": sink["share"][k], "others_max_abs": sink["others_max_abs"][k],
        "first_attention_mean_of_layers": float(np.mean(fa["mean"])),
        "first_attention_range": [min(fa["mean"]), max(fa["mean"])],
        "first_attention_uniform": fa["uniform"],
        "first_mean_cosine": [st["first_mean_cosine"][0], st["first_mean_cosine"][-1]],
        "norm_mean": [st["norm_mean"][0], st["norm_mean"][-1]],
        "continuous_max_relative_difference": max(flows["continuous"]["relative_difference"]),
        "repeated": {key: {"t": f["times"][-1], "status": f["status"],
                           "first_min_cosine": f["statistics"]["first_min_cosine"][-1],
                           "first_mean_cosine": f["statistics"]["first_mean_cosine"][-1],
                           "norm_mean": f["statistics"]["norm_mean"][-1],
                           "n_clusters": f["statistics"]["n_clusters"][-1]}
                     for key, f in flows.items() if key.startswith("repeated")},
        "idealised": {key: {"first_min_cosine": f["statistics"]["first_min_cosine"][-1],
                            "first_max_one_minus_cosine":
                                f["statistics"]["first_max_one_minus_cosine"][-1],
                            "first_attention_mean": f["statistics"]["first_attention"]["mean"][-1],
                            "first_token_moved": f["first_token_moved"],
                            "pair_error": f["pair_error"]}
                      for key, f in ideal.items()},
    }
    if enc is not None:
        est = enc["statistics"]
        out["encoder"] = {"norm_mean": [min(est["norm_mean"]), max(est["norm_mean"])],
                          "first_attention_mean": est["first_attention"]["mean"],
                          "first_mean_cosine": [est["first_mean_cosine"][0],
                                                est["first_mean_cosine"][-1]]}
    return out


def _name(model: Any) -> str:
    return model.config.name or model.config.architecture


def _network_curve(model: Any, network: dict[str, Any]) -> ModelCurve:
    return ModelCurve(f"decoder ({model.n_layers} layers, causal, pre-norm)", network["times"],
                      network["statistics"], "C3", "o")


def models_figure(model: Any, text: str, network: dict[str, Any],
                  encoder: dict[str, Any] | None = None, encoder_label: str | None = None, *,
                  fig: Any = None) -> Any:
    """The decoder's statistics against the relative depth beside an encoder's
    (:func:`~transformer_pde.plot.models_side_by_side`): ``network`` of :func:`network_flow`,
    ``encoder`` of :func:`encoder_statistics` or None, labelled ``encoder_label`` (default:
    its ``label``).  Returns the figure."""
    curves = [_network_curve(model, network)]
    if encoder is not None:
        curves.append(ModelCurve(f"{encoder_label or encoder['label']} ({len(encoder['times']) - 1} layers, "
                                 "post-norm)", encoder["times"], encoder["statistics"], "C0",
                                 "s"))
    return models_side_by_side(curves, title=f"{_name(model)}: {text!r}", fig=fig)


def attention_sink_figure(model: Any, text: str, network: dict[str, Any],
                          ideal: dict[str, dict[str, Any]], *, fig: Any = None) -> Any:
    """The decoder's attention sink (:func:`~transformer_pde.plot.attention_sink`) and, when
    ``ideal`` (:func:`idealised_causal_flow`) is not empty, the idealised causal flows beside
    it; ``network`` of :func:`network_flow`.  Returns the figure."""
    curves = [ModelCurve(f"idealised causal flow, β = {f['beta']:g}", f["times"],
                         f["statistics"], f"C{k}") for k, f in enumerate(ideal.values())]
    beside = (", beside the idealised causal flow (Q = K = V = I on the sphere, from the same "
              "embeddings)") if curves else ""
    toks = [t.replace("Ġ", "␣") for t in model.tokens(text)]     # GPT-2's byte for a space
    return attention_sink(_network_curve(model, network), network["sink"], curves,
                          tokens=toks, title=f"{_name(model)}: the attention sink{beside}",
                          fig=fig)


def long_time_figure(model: Any, flows: dict[str, dict[str, Any]], *, fig: Any = None) -> Any:
    """Layers repeated to long times and the continuous-depth network against the network
    (:func:`~transformer_pde.plot.decoder_flows`); ``flows`` of :func:`run_decoder_flows`.
    Returns the figure."""
    rep = [ModelCurve(f"layer {key.rsplit('_', 1)[1]} repeated", f["times"], f["statistics"])
           for key, f in flows.items() if key.startswith("repeated")]
    return decoder_flows(rep, flows["continuous"], network=_network_curve(model, flows["network"]),
                         title=f"{_name(model)}: one layer iterated to long times; "
                               "continuous depth", fig=fig)


def decoder_flow_report(model: Any, text: str, out_dir: str | Path, *, encoder: Any = None,
                   steps_per_layer: int = 4, solver: str = "rk4", long_time: int = 300,
                   repeat_layers: Sequence[int] | None = None,
                   betas: Sequence[float] = (1.0, 4.0, 16.0), prefix: str = "decoder",
                   encoder_label: str | None = None, save_states: bool = True) -> dict[str, Any]:
    r"""Depth statistics of ``text`` through a decoder, beside an encoder and the idealised flow.

    Runs :func:`run_decoder_flows` (the network with its attention matrices, its
    continuous-depth version, layers repeated to long times), :func:`idealised_causal_flow`
    from the decoder's embeddings of ``text`` for every :math:`\beta` of ``betas`` over as
    many units of time as the decoder has layers and, with ``encoder``,
    :func:`encoder_statistics` of the same text (labelled ``encoder_label`` in the figures;
    default: its model type).

    Writes into ``out_dir``: ``{prefix}_statistics.png``
    (:func:`~transformer_pde.plot.models_side_by_side`),
    ``{prefix}_attention_sink.png`` (:func:`~transformer_pde.plot.attention_sink`),
    ``{prefix}_long_time.png`` (:func:`~transformer_pde.plot.decoder_flows`),
    ``{prefix}_summary.json`` and, with ``save_states``, ``{prefix}_states.npz``: every
    flow's states under its name and depths under ``<name>__times``, the attention
    matrices under ``network__attention``, the encoder's under ``encoder`` and
    ``encoder__attention``, the idealised flows under ``idealised_beta=<b>``.

    Returns
    -------
    dict
        The JSON summary: ``text``, ``tokens``, ``model``, ``encoder`` (or None),
        ``settings``, ``flows``, ``idealised``, ``highlights`` (the sink's largest norm, layer
        and channels, the attention on the first token, the long-time limits, ...) and the
        ``figures``.

    Raises
    ------
    ArgumentError
        As :func:`run_decoder_flows`, or a text of fewer than 2 tokens for the encoder.
    """
    flows = run_decoder_flows(model, text, steps_per_layer=steps_per_layer, solver=solver,
                              long_time=long_time, repeat_layers=repeat_layers)
    L = model.n_layers
    ideal = idealised_causal_flow(model.embed(text), betas, t_max=L)
    enc = None if encoder is None else encoder_statistics(encoder, text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib only when a report is drawn)

    names = [f"{prefix}_{kind}.png" for kind in ("statistics", "attention_sink", "long_time")]
    figs = (models_figure(model, text, flows["network"], enc, encoder_label),
            attention_sink_figure(model, text, flows["network"], ideal),
            long_time_figure(model, flows))
    for fig, name in zip(figs, names, strict=True):
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
    c = model.config

    def strip(f: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in f.items() if k not in ("states", "attention")}

    summary: dict[str, Any] = {
        "text": text, "tokens": model.tokens(text),
        "model": {"name": c.name, "architecture": c.architecture, "file": str(model.path),
                  "layers": L, "d": model.d, "heads": c.heads, "kv_heads": c.kv_heads},
        "encoder": None if enc is None else {
            "model_dir": str(encoder.model_dir), "type": encoder.config.model_type,
            "layers": encoder.n_layers, "d": encoder.d, "tokens": enc["tokens"],
            "statistics": enc["statistics"]},
        "settings": {"steps_per_layer": int(steps_per_layer), "solver": solver,
                     "long_time": int(long_time),
                     "repeat_layers": [int(k.rsplit("_", 1)[1]) for k in flows
                                       if k.startswith("repeated")],
                     "betas": [float(b) for b in betas], "cluster_tol": _CLUSTER_TOL,
                     "rank_rtol": _RANK_RTOL},
        "flows": {k: strip(f) for k, f in flows.items()},
        "idealised": {k: strip(f) for k, f in ideal.items()},
        "highlights": _highlights(flows, ideal, enc),
        "figures": names,
    }
    (out / f"{prefix}_summary.json").write_text(dumps(summary, indent=1, strict=True))
    if save_states:
        arrays = {**{k: f["states"] for k, f in flows.items()},
                  **{f"{k}__times": np.asarray(f["times"]) for k, f in flows.items()},
                  "network__attention": flows["network"]["attention"],
                  **{f"idealised_{k}": f["states"] for k, f in ideal.items()}}
        if enc is not None:
            arrays.update(encoder=enc["states"], encoder__attention=enc["attention"])
        save_npz(out / f"{prefix}_states.npz", arrays, compressed=True)
    return summary
