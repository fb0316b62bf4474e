"""One call per figure: the ``plot_*`` methods of the pretrained models.

Each method draws one figure of the reports (``decoder_flow_report``, ``flow_report``) from
the text alone, through the same drawing functions as the report.  References: the curves
are checked against quantities computed here independently of the figure code (the model's
own hidden states and attention matrices, :func:`first_token_attention` of them, the token
norms), the labels against what is drawn (no idealised flow named when none is drawn).
Small models and short runs keep it fast: the tiny synthetic GGUF decoder, MiniLM (6 layers)
with one Euler step per layer and a few repeated layers.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from matplotlib.figure import Figure

from transformer_pde import pretrained
from transformer_pde.errors import ArgumentError
from transformer_pde.plot import principal_plane
from transformer_pde.pretrained.decoder_report import first_token_attention

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny(tiny_file):
    return pretrained.load(tiny_file)


def _labels(fig: Figure) -> list[str]:
    """Every text of the figure: titles, axis labels, legend entries, suptitle."""
    out = [fig.get_suptitle()]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        leg = ax.get_legend()
        if leg is not None:
            out += [t.get_text() for t in leg.get_texts()]
    return out


def test_decoder_attention_sink_in_one_call(tiny):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = tiny.plot_attention_sink(TEXT, betas=(1.0, 4.0))
    assert isinstance(fig, Figure) and plt.get_fignums() == [*before, fig.number]
    plt.close(fig)
    fig = tiny.plot_attention_sink(TEXT, betas=(1.0, 4.0), fig=Figure())
    ax_a, ax_b, ax_c, ax_d = fig.axes[:4]
    # (a): the decoder's mean and largest head of the attention on the first token, from
    # the model's own attention matrices
    ref = first_token_attention(tiny.attention_weights(TEXT))
    np.testing.assert_allclose(ax_a.lines[0].get_ydata(), ref["mean"], rtol=1e-12)
    np.testing.assert_allclose(ax_a.lines[1].get_ydata(), ref["max_head"], rtol=1e-12)
    legend = [t.get_text() for t in ax_a.get_legend().get_texts()]
    assert [s for s in legend if "idealised" in s] == ["idealised causal flow, β = 1",
                                                        "idealised causal flow, β = 4"]
    assert "idealised" in ax_a.get_xlabel() and "idealised" in fig.get_suptitle()
    # (c): each token's attention on the first token, (L, n)
    n = len(tiny.tokenize(TEXT))
    assert ax_c.images[0].get_array().shape == (tiny.n_layers, n)
    # (d): the first token's norm at every depth, from the hidden states
    H = tiny.hidden_states(TEXT)
    np.testing.assert_allclose(ax_d.lines[0].get_ydata(), np.linalg.norm(H[:, 0], axis=1),
                               rtol=1e-12)
    assert any("2nd largest channel" in s for s in _labels(fig))


def test_decoder_attention_sink_alone_names_no_idealised_flow(tiny):
    fig = tiny.plot_attention_sink(TEXT, betas=(), fig=Figure())
    assert not [s for s in _labels(fig) if "idealised" in s]
    # the decoder's mean and largest head, and the uniform attention
    assert len(fig.axes[0].lines) == 3


def test_decoder_statistics_and_long_time_in_one_call(tiny):
    fig = tiny.plot_statistics(TEXT, fig=Figure())
    assert len(fig.axes) == 6
    H = tiny.hidden_states(TEXT)
    # panel (e): mean token norm per layer against the relative depth
    x, y = fig.axes[4].lines[0].get_data()
    np.testing.assert_allclose(x, np.arange(tiny.n_layers + 1) / tiny.n_layers)
    np.testing.assert_allclose(y, np.linalg.norm(H, axis=2).mean(axis=1), rtol=1e-12)
    assert fig.axes[0].get_legend().get_texts()[0].get_text().startswith("decoder (2 layers")

    fig = tiny.plot_long_time(TEXT, steps_per_layer=1, solver="euler", long_time=3,
                              repeat_layers=[1], fig=Figure())
    assert len(fig.axes) == 3
    x, _ = fig.axes[0].lines[0].get_data()
    np.testing.assert_array_equal(x, [0, 1, 2, 3])
    # (c): one Euler step per layer is the network: the relative difference is rounding
    assert max(fig.axes[2].lines[0].get_ydata()) < 1e-14
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "layer 1 repeated: mean"
    with pytest.raises(ArgumentError, match="long_time"):
        tiny.plot_long_time(TEXT, long_time=0, fig=Figure())
    with pytest.raises(ArgumentError, match="at least 2"):
        tiny.plot_attention_sink("a", fig=Figure())


def test_decoder_statistics_beside_an_encoder(tiny, encoder):
    fig = tiny.plot_statistics(TEXT, encoder=encoder, fig=Figure())
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[1] == "bert encoder (6 layers, post-norm)"
    fig = tiny.plot_statistics(TEXT, encoder=encoder, encoder_label="MiniLM", fig=Figure())
    assert fig.axes[0].get_legend().get_texts()[1].get_text().startswith("MiniLM (6 layers")


# ------------------------------------------------------------------ the encoder
SHORT = {"steps_per_layer": 1, "solver": "euler", "long_time": 3, "continuous_long_time": 2,
         "continuous_steps": 1}


def test_encoder_figures_in_one_call(encoder):
    text = "The cat sat."
    H = encoder.hidden_states(text)
    n = H.shape[1]
    fig = encoder.plot_token_paths(text, fig=Figure(), **SHORT)
    assert len(fig.axes) == 4 and len(fig.axes[0].lines) == 3 * n
    # the network's panel: token 0's path is the projection of its hidden states
    mu, B = principal_plane(H)
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xydata(), (H[:, 0] - mu) @ B.T,
                               atol=1e-9)
    assert fig.axes[2].get_title() == "layer 5 repeated, t ≤ 3"    # the last layer by default

    fig = encoder.plot_statistics(text, repeat_layers=[0, 5], fig=Figure(), **SHORT)
    assert len(fig.axes) == 8
    top = [ln.get_label() for ln in fig.axes[0].lines]
    bottom = [ln.get_label() for ln in fig.axes[4].lines]
    assert top == ["network", "continuous depth"]
    assert bottom == ["layer 0 repeated", "layer 5 repeated", "layer 5 repeated, continuous"]
    # one Euler step per layer: the continuous curve is the network's
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), fig.axes[0].lines[0].get_ydata())

    fig = encoder.plot_cosine(text, repeat_layers=[0, 5], fig=Figure(), **SHORT)
    first = fig.axes[0].images[0].get_array()
    U = H[0] / np.linalg.norm(H[0], axis=1, keepdims=True)
    np.testing.assert_allclose(first, U @ U.T, atol=1e-12)
    with pytest.raises(ArgumentError, match="layer"):
        encoder.plot_statistics(text, repeat_layers=[6], fig=Figure(), **SHORT)
