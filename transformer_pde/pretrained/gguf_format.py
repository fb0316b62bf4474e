r"""The binary layout of a GGUF file: header, metadata, tensor directory and tensor data.

A GGUF file (little-endian, versions 2 and 3) is

* the magic ``GGUF``, the version (uint32), the number of tensors and of metadata entries
  (uint64 each);
* the metadata: per entry a key (a string: uint64 length and UTF-8 bytes), a value type
  (uint32, :data:`VALUE_TYPES`) and the value (scalars, strings, arrays of either);
* the tensor directory: per tensor a name, the number of dimensions (at most 4), the
  dimensions (uint64, innermost first), the GGML type and the offset of its data;
* the tensor data, from the first multiple of ``general.alignment`` (default 32) after the
  directory: the tensors one after another, each padded to the alignment, so tensor
  :math:`k` starts at :math:`o_k = \sum_{j<k} \lceil n_j / a \rceil a` for :math:`n_j` bytes
  of tensor :math:`j` (llama.cpp refuses a file whose offsets differ; so does this reader).

:func:`read_layout` reads the whole structure in one pass over the file's bytes and checks
it: every length within the file, known value and tensor types, no key or tensor twice, at
most 4 dimensions, whole quantisation blocks, a power-of-two alignment and the offsets
above.  The offsets are what turns a damaged tensor type (F32 read as F16) or directory
entry into an error instead of a tensor read from the wrong bytes.  Each failure is a
``ValueError`` whose message says what is wrong (:func:`~transformer_pde.pretrained.read_gguf`
adds the file's name).  Strings are decoded with ``surrogateescape``, so that a damaged byte
in a string the model does not use is no error; the strings it does use are checked by their
reader.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingDependencyError, ModelDirectoryError

__all__ = ["INTEGER_TYPES", "VALUE_TYPES", "Layout", "Metadata", "TensorData", "check_finite",
           "gguf_package", "read_layout"]

#: GGUF metadata value type -> its name
VALUE_TYPES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32",
               6: "FLOAT32", 7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64",
               12: "FLOAT64"}
#: the value types of integers
INTEGER_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
          10: "<u8", 11: "<i8", 12: "<f8"}
_MAGIC = b"GGUF"
_MAX_DIMS = 4  # GGML_MAX_DIMS
_TRUNCATED = "the file ends inside its {} (truncated?)"


def gguf_package() -> Any:
    """The ``gguf`` package (llama.cpp's Python side), or an error saying how to install it."""
    try:
        import gguf  # noqa: PLC0415 - optional dependency, only for GGUF files
    except ImportError as exc:
        raise MissingDependencyError("reading a GGUF file needs the 'gguf' package "
                                     "(pip install gguf)") from exc
    return gguf


@dataclass(frozen=True)
class TensorData:
    """A tensor of the file: its GGUF type and its bytes, as ``gguf.dequantize`` takes them."""

    name: str
    tensor_type: Any
    shape: tuple[int, ...]  # NumPy order (rows, ..., columns)
    data: np.ndarray  # uint8 (rows, ..., bytes per row)


@dataclass(frozen=True)
class Layout:
    """The checked structure of a GGUF file (see :func:`read_layout`).

    Attributes
    ----------
    fields : dict
        Metadata key -> value (int, float, bool, str, or a list of them).
    types : dict
        Metadata key -> (value type, element type of an array or None), as
        :data:`VALUE_TYPES` numbers.
    tensors : dict of TensorData
        Tensor name -> its type, shape and bytes, in the order of the directory.
    """

    fields: dict[str, Any]
    types: dict[str, tuple[int, int | None]]
    tensors: dict[str, TensorData]


class _Parser:
    """One pass over the bytes; ``what`` names the part being read for truncation errors."""

    def __init__(self, raw: np.ndarray):
        self.buf = memoryview(raw)
        self.raw = raw
        self.o = 0
        self.what = "header"

    def _need(self, n: int) -> None:
        if n > self.raw.size - self.o:
            raise ValueError(_TRUNCATED.format(self.what))

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        v = struct.unpack_from(fmt, self.buf, self.o)[0]
        self.o += size
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        self._need(n)
        s = bytes(self.buf[self.o:self.o + n]).decode("utf-8", errors="surrogateescape")
        self.o += n
        return s

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind != 9:
            raise ValueError(f"{self.what} has the unknown value type {kind}")
        sub, n = self.scalar("<I"), self.scalar("<Q")
        if sub in _NUMPY:
            size = np.dtype(_NUMPY[sub]).itemsize
            self._need(n * size)
            a = np.frombuffer(self.raw, dtype=_NUMPY[sub], count=n, offset=self.o)
            self.o += a.nbytes
            return a.tolist()
        if sub not in (8, 9):
            raise ValueError(f"{self.what} is an array of the unknown value type {sub}")
        return [self.value(sub) for _ in range(n)]

    def header(self) -> tuple[int, int]:
        if self.raw.size < 4 or bytes(self.buf[:4]) != _MAGIC:
            raise ValueError("it does not start with the GGUF magic bytes" if self.raw.size >= 4
                             else _TRUNCATED.format("magic bytes"))
        self.o = 4
        version = self.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are; a "
                             "big-endian file is not)")
        return self.scalar("<Q"), self.scalar("<Q")

    def metadata(self, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[int, int | None]]]:
        fields: dict[str, Any] = {}
        types: dict[str, tuple[int, int | None]] = {}
        for i in range(n_kv):
            self.what = f"metadata entry {i}"
            key = self.string()
            if key in fields:
                raise ValueError(f"the metadata key {key!r} appears twice")
            self.what = f"metadata key {key!r}"
            kind = self.scalar("<I")
            sub = None
            if kind == 9:  # peek the element type; value() reads it again
                self._need(4)
                sub = struct.unpack_from("<I", self.buf, self.o)[0]
            fields[key] = self.value(kind)
            types[key] = (kind, sub)
        return fields, types

    def directory(self, n_tensors: int) -> list[tuple[str, tuple[int, ...], int, int]]:
        infos, names = [], set()
        for i in range(n_tensors):
            self.what = f"tensor directory (entry {i})"
            name = self.string()
            if name in names:
                raise ValueError(f"tensor {name!r} appears twice in the tensor directory")
            names.add(name)
            self.what = f"tensor directory (tensor {name!r})"
            n_dims = self.scalar("<I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to "
                                 f"{_MAX_DIMS})")
            dims = [self.scalar("<Q") for _ in range(n_dims)]
            infos.append((name, tuple(reversed(dims)), self.scalar("<I"), self.scalar("<Q")))
        return infos


def _alignment(fields: dict[str, Any], types: dict[str, tuple[int, int | None]]) -> int:
    a = fields.get("general.alignment", 32)
    if ("general.alignment" in types and types["general.alignment"][0] not in INTEGER_TYPES) \
            or isinstance(a, bool) or not isinstance(a, int) or a < 1 or a & (a - 1):
        raise ValueError(f"general.alignment={a!r} must be a power of two")
    return a


def _tensor_data(raw: np.ndarray, infos: list[tuple[str, tuple[int, ...], int, int]],
                 start: int, align: int) -> dict[str, TensorData]:
    gguf = gguf_package()
    tensors = {}
    expect = 0
    for name, shape, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
            block, size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name!r} has the type id {kind}, unknown to the "
                             "installed gguf package") from None
        if shape[-1] % block:
            raise ValueError(f"tensor {name!r}: {shape[-1]} columns are not whole "
                             f"{qtype.name} blocks of {block}")
        if offset != expect:
            raise ValueError(f"tensor {name!r} has the data offset {offset} but the tensors "
                             f"before it end at offset {expect} (GGUF stores the tensors one "
                             f"after another, each padded to {align} bytes): a damaged tensor "
                             "directory")
        row = shape[-1] // block * size
        n = row * math.prod(shape[:-1])
        lo = start + offset
        if n > raw.size - lo:
            raise ValueError(f"tensor {name!r} lies beyond the end of the file (truncated?)")
        tensors[name] = TensorData(name, qtype, shape, raw[lo:lo + n].reshape(shape[:-1] + (row,)))
        expect = offset + -(-n // align) * align
    return tensors


def read_layout(raw: np.ndarray) -> Layout:
    """The checked structure of a GGUF file's bytes ``raw`` (uint8).

    Raises
    ------
    ValueError
        Not a GGUF file (magic, version), truncated (names the part), an unknown value or
        tensor type, a key or tensor twice, more than 4 dimensions, columns that are not
        whole quantisation blocks, an alignment that is not a power of two, or a tensor
        whose data offset is not where the tensors before it end (names the tensor).
    MissingDependencyError
        ``gguf`` is not installed.
    """
    p = _Parser(raw)
    n_tensors, n_kv = p.header()
    fields, types = p.metadata(n_kv)
    infos = p.directory(n_tensors)
    align = _alignment(fields, types)
    start = -(-p.o // align) * align
    return Layout(fields, types, _tensor_data(raw, infos, start, align))


# ------------------------------------------------------------------ typed metadata
def _known_keys(arch: str | None) -> frozenset[str]:
    """Every key name the installed ``gguf`` package defines (for ``arch``)."""
    gguf = gguf_package()
    out: list[str] = []

    def walk(c: Any) -> None:
        for name, v in vars(c).items():
            if isinstance(v, str) and not name.startswith("_"):
                out.append(v.replace("{arch}", arch or "{arch}"))
            elif isinstance(v, type):
                walk(v)

    walk(gguf.Keys)
    return frozenset(out)


def _one_apart(a: str, b: str) -> bool:
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1


class Metadata:
    """Typed access to a GGUF file's metadata; every error names the file and the key.

    Integers must be stored as integers, numbers as floats, flags as booleans and texts as
    valid UTF-8 strings, as llama.cpp writes them; a value stored otherwise is a damaged
    file (a float rotary base read from a damaged type byte as a uint32 would be 1.1e9).
    """

    def __init__(self, layout: Layout, where: str):
        self.fields, self.types, self.where = layout.fields, layout.types, where

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def _error(self, key: str, what: str) -> ModelDirectoryError:
        return ModelDirectoryError(f"{self.where}: {key}={self.fields.get(key)!r} {what}")

    def _type(self, key: str, kinds: Any, what: str) -> None:
        kind, sub = self.types.get(key, (None, None))
        if kind is not None and kind not in kinds:
            name = VALUE_TYPES.get(kind, str(kind))
            if kind == 9:
                name = f"an array of {VALUE_TYPES.get(-1 if sub is None else sub, str(sub))}"
            raise ModelDirectoryError(f"{self.where}: the metadata key {key!r} is stored as "
                                      f"{name}; GGUF stores it as {what} (a damaged file?)")

    def required(self, key: str) -> Any:
        if key not in self.fields:
            raise ModelDirectoryError(f"{self.where} lacks the metadata key {key!r}")
        return self.fields[key]

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        v = self.required(key) if default is None else self.get(key, default)
        self._type(key, INTEGER_TYPES, "an integer")
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise self._error(key, f"must be an integer >= {minimum}")
        return v

    def number(self, key: str, default: float, *, positive: bool = False) -> float:
        v = self.get(key, default)
        self._type(key, (6, 12), "a float")
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v == 0):
            raise self._error(key, f"must be a finite number {'>' if positive else '>='} 0")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        self._type(key, (7,), "a bool")
        return bool(self.get(key, default))

    def text(self, key: str, default: str | None = None) -> str:
        v = self.required(key) if default is None else self.get(key, default)
        self._type(key, (8,), "a string")
        self._utf8(key, v)
        return v

    def strings(self, key: str, default: list[str] | None = None) -> list[str]:
        v = self.required(key) if default is None else self.get(key, default)
        kind, sub = self.types.get(key, (9, 8))
        if kind != 9 or sub != 8:
            self._type(key, (), "an array of strings")
        for i, s in enumerate(v):
            self._utf8(f"{key}[{i}]", s)
        return v

    def integers(self, key: str) -> list[int] | None:
        if key not in self.fields:
            return None
        kind, sub = self.types[key]
        if kind != 9 or sub not in INTEGER_TYPES:
            self._type(key, (), "an array of integers")
        return self.fields[key]

    def token_id(self, key: str, n_tokens: int) -> int | None:
        if key not in self.fields:
            return None
        v = self.integer(key, minimum=-(2 ** 63))
        if not 0 <= v < n_tokens:
            raise self._error(key, f"is not a token id: the vocabulary has {n_tokens} tokens")
        return v

    def _utf8(self, key: str, s: str) -> None:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raw = s.encode("utf-8", errors="surrogateescape")
            raise ModelDirectoryError(f"{self.where}: {key} is not valid UTF-8 (bytes "
                                      f"{raw!r}): a damaged file") from None

    def check_key_names(self, read: list[str], arch: str | None) -> None:
        """Refuse a key the ``gguf`` package does not know that differs in one character
        from a key of ``read`` that the file lacks: a damaged key name, which would
        otherwise make an optional key fall back to its default without a word."""
        known = _known_keys(arch)
        absent = [k for k in read if k not in self.fields]
        for key in self.fields:
            if key in known or key in read:
                continue
            for k in absent:
                if _one_apart(key, k):
                    raise ModelDirectoryError(
                        f"{self.where}: the metadata key {key!r} differs in one character from "
                        f"{k!r}, which the file lacks: a damaged key name (a damaged file)")


def check_finite(a: np.ndarray, where: str, name: str) -> np.ndarray:
    """``a``, a weight tensor ``name`` of the file ``where``, if every entry is finite.

    Shared by the GGUF reader and the encoder's model directory: a NaN or an infinity in a
    weight (a damaged file, or a damaged quantisation block scale) would make every output
    NaN; the error names the file, the tensor, the first bad entry and how many there are.
    """
    finite = np.isfinite(a)
    if not finite.all():
        at = np.unravel_index(int(np.argmin(finite)), a.shape)
        bad = "NaN" if np.isnan(a[at]) else ("inf" if a[at] > 0 else "-inf")
        raise ModelDirectoryError(
            f"{where}: tensor {name!r} holds {bad} at [{', '.join(str(int(i)) for i in at)}] "
            f"({int(a.size - finite.sum())} of its {a.size} entries are NaN or infinite): a "
            "damaged file (the weights of a model are finite numbers)")
    return a
