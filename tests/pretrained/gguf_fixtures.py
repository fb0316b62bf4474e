"""Test helpers for GGUF decoders: tiny synthetic GGUF files and an independent float64
reference forward of a Llama-family decoder.

The reference is written from llama.cpp's definition of the network and reads the file
with ``gguf.GGUFReader`` (not the library's reader): token embedding lookup, then per block
``x += Wo attn(RMS(x) * g1)`` with rotary positions of llama.cpp's rope type NORM (pairs of
adjacent rows ``(2k, 2k+1)`` of every head rotated by ``i * base**(-2k/r)``), grouped
key/value heads (query head ``h`` reads key/value head ``h // (H/G)``), causal softmax of
``q.k / sqrt(m)``, then ``x += W_down(silu(W_gate y) * W_up y)`` with ``y = RMS(x) * g2``;
logits ``E RMS(x) * g_out``.  NumPy only, float64 throughout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# merges of the tiny vocabulary, best first (GPT-2 byte characters: "Ġ" is the space)
TINY_MERGES = (
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "a n", "r e", "Ġ s", "Ġ c", "a t",
    "e n", "i s", "o r", "Ġ f", "Ġ p", "Ġ o", "Ġ w", "Ġ b", "Ġ m", "Ġ d", "Ġ i", "Ġa n",
    "Ġan d", "Ġo f", "Ġi s", "Ġi n", "Ġc at", "Ġs at", "Ġo n", "m at", "Ġm at", "Ġ h",
    "Ġh e", "l l", "e ll", "h ell", "hell o", "Ġ l", "Ġl ay",
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from bytes to printable characters (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def tiny_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """300 tokens: 3 control tokens, the 256 byte characters, one token per merge."""
    tokens = list(CONTROL_TOKENS) + [bytes_to_unicode()[b] for b in range(256)]
    merges = list(TINY_MERGES)
    if "Ġl ay" in merges:  # "ay" must exist for this merge: add it first
        merges.insert(merges.index("Ġl ay"), "a y")
    for m in merges:
        tokens.append(m.replace(" ", ""))
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    return tokens, types, merges


def write_tiny_gguf(path: Path, *, arch: str = "llama", L: int = 2, d: int = 32, H: int = 4,
                    G: int = 2, hidden: int = 48, ctx: int = 64, seed: int = 0,
                    drop: str | None = None, reshape: str | None = None,
                    raw: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
                    extra_block: bool = False, pre: str = "smollm",
                    add_bos: bool = False, omit: tuple[str, ...] = (),
                    kv: dict[str, tuple[object, gguf.GGUFValueType]] | None = None) -> Path:
    """A small random Llama-layout decoder; ``drop`` leaves a tensor out, ``reshape`` gives
    one a wrong shape, ``raw`` writes tensors as given raw bytes of a GGML type, ``omit``
    leaves metadata keys out and ``kv`` writes keys with the given values and types."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocabulary()
    V, m, Q = len(tokens), d // H, gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(hidden)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_rope_freq_base(1000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(m)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    for key in omit:
        del w.kv_data[0][key]
    for key, (value, vtype) in (kv or {}).items():
        w.kv_data[0][key] = gguf.gguf_writer.GGUFValue(value=value, type=vtype)
    f32 = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    tensors: dict[str, tuple[np.ndarray, object]] = {
        "token_embd.weight": (gguf.quants.quantize(f32(V, d), Q.Q8_0), Q.Q8_0),
        "output_norm.weight": (1 + 0.1 * f32(d), None)}
    for ell in range(L + int(extra_block)):
        p = f"blk.{ell}."
        tensors.update({
            p + "attn_norm.weight": (1 + 0.2 * f32(d), None),
            p + "ffn_norm.weight": (1 + 0.2 * f32(d), None),
            p + "attn_q.weight": (f32(d, d) / np.sqrt(d) * 2, None),
            p + "attn_k.weight": (f32(G * m, d) / np.sqrt(d) * 2, None),
            p + "attn_v.weight": (f32(G * m, d) / np.sqrt(d), None),
            p + "attn_output.weight": (f32(d, d) / np.sqrt(d), None),
            p + "ffn_gate.weight": (f32(hidden, d) / np.sqrt(d), None),
            p + "ffn_up.weight": (f32(hidden, d) / np.sqrt(d), None),
            p + "ffn_down.weight": (f32(d, hidden) / np.sqrt(hidden), None)})
    # exercise the dequantisers: Q4_1 and F16 next to Q8_0 and F32
    q = tensors["blk.1.attn_q.weight"][0].astype(np.float32)
    tensors["blk.1.attn_q.weight"] = (gguf.quants.quantize(q, Q.Q4_1), Q.Q4_1)
    tensors["blk.0.ffn_up.weight"] = (tensors["blk.0.ffn_up.weight"][0].astype(np.float16),
                                      None)
    if reshape is not None:
        tensors[reshape] = (f32(3, d), None)
    for name, (data, kind) in (raw or {}).items():
        tensors[name] = (data, kind)
    for name, (data, kind) in tensors.items():
        if name != drop:
            if data.dtype == np.float64:
                data = data.astype(np.float32)
            w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def byte_regions(path: Path) -> tuple[dict[str, tuple[int, int]], int]:
    """Where the parts of a GGUF file lie, found with ``gguf.GGUFReader`` (not the library's
    reader), and where its tensor data begin.

    Keys: ``"key:K"`` (the name of metadata key ``K``), ``"type:K"``, ``"value:K"`` (a
    scalar's bytes, or a string's), ``"value:K[i]"`` (element ``i`` of an array, a string's
    bytes without its length), ``"info:T"`` (the whole directory entry of tensor ``T``),
    ``"info:T:type"``, ``"info:T:offset"``, ``"data:T"`` (its bytes); each a half-open
    byte range ``(start, stop)``."""
    r = gguf.GGUFReader(str(path))
    base = r.data.ctypes.data

    def span(*parts: np.ndarray) -> tuple[int, int]:
        return (parts[0].ctypes.data - base, parts[-1].ctypes.data - base + parts[-1].nbytes)

    out: dict[str, tuple[int, int]] = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        out[f"key:{key}"], out[f"type:{key}"] = span(f.parts[1]), span(f.parts[2])
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            for i, j in enumerate(f.data):
                out[f"value:{key}[{i}]"] = span(f.parts[j])
        else:
            out[f"value:{key}"] = span(*f.parts[3:])
    for t in r.tensors:
        parts = t.field.parts
        out[f"info:{t.name}"] = span(*parts)
        out[f"info:{t.name}:type"], out[f"info:{t.name}:offset"] = span(parts[-2]), \
            span(parts[-1])
        out[f"data:{t.name}"] = (int(t.data_offset), int(t.data_offset) + int(t.n_bytes))
    return out, int(r.data_offset)


def damaged_copy(src: Path, dst: Path, at: int, new: bytes) -> Path:
    """A copy of ``src`` with the bytes from ``at`` on replaced by ``new``."""
    b = bytearray(src.read_bytes())
    b[at:at + len(new)] = new
    dst.write_bytes(bytes(b))
    return dst


# ------------------------------------------------------------------ the reference
def read_reference(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Configuration and every tensor (float64) of a GGUF file, with ``gguf.GGUFReader``."""
    r = gguf.GGUFReader(str(path))
    get = lambda k: r.fields[k].contents()  # noqa: E731
    arch = get("general.architecture")
    cfg = {"L": get(f"{arch}.block_count"), "H": get(f"{arch}.attention.head_count"),
           "G": get(f"{arch}.attention.head_count_kv"),
           "eps": get(f"{arch}.attention.layer_norm_rms_epsilon"),
           "base": get(f"{arch}.rope.freq_base"), "rot": get(f"{arch}.rope.dimension_count"),
           "tokens": get("tokenizer.ggml.tokens")}
    # np.asarray: plain arrays instead of memory maps (dequantising those is much slower)
    T = {t.name: np.asarray(gguf.dequantize(np.asarray(t.data), t.tensor_type),
                            dtype=np.float64) for t in r.tensors}
    return cfg, T


def reference_forward(cfg: dict, T: dict[str, np.ndarray], ids, *, layer_of=None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden states (L + 1, n, d), logits (n, V) and attention matrices (L, H, n, n).

    ``layer_of(l)`` picks the block whose weights run at depth ``l`` (default ``l``)."""
    ids = np.asarray(ids)
    E = T["token_embd.weight"]
    n, d = ids.size, E.shape[1]
    H, G, eps = cfg["H"], cfg["G"], cfg["eps"]
    m, r = d // H, cfg["rot"]
    pos = np.arange(n, dtype=np.float64)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(z):  # z (n, heads, m): llama.cpp rope NORM, pairs of adjacent rows
        out = z.copy()
        for i0 in range(0, r, 2):
            theta = pos * cfg["base"] ** (-i0 / r)
            c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
            x0, x1 = z[:, :, i0], z[:, :, i0 + 1]
            out[:, :, i0] = x0 * c - x1 * s
            out[:, :, i0 + 1] = x0 * s + x1 * c
        return out

    x = E[ids]
    states, mats = [x], []
    causal = np.tril(np.ones((n, n), dtype=bool))
    for depth in range(cfg["L"]):
        p = f"blk.{depth if layer_of is None else layer_of(depth)}."
        y = rms(x, T[p + "attn_norm.weight"])
        q = rope((y @ T[p + "attn_q.weight"].T).reshape(n, H, m))
        k = rope((y @ T[p + "attn_k.weight"].T).reshape(n, G, m))
        v = (y @ T[p + "attn_v.weight"].T).reshape(n, G, m)
        heads, P_all = [], []
        for h in range(H):
            g = h // (H // G)
            s = q[:, h] @ k[:, g].T / np.sqrt(m)
            s = np.where(causal, s, -np.inf)
            P = np.exp(s - s.max(1, keepdims=True))
            P /= P.sum(1, keepdims=True)
            P_all.append(P)
            heads.append(P @ v[:, g])
        mats.append(np.stack(P_all))
        x = x + np.concatenate(heads, axis=1) @ T[p + "attn_output.weight"].T
        y = rms(x, T[p + "ffn_norm.weight"])
        a = y @ T[p + "ffn_gate.weight"].T
        x = x + ((a / (1 + np.exp(-a))) * (y @ T[p + "ffn_up.weight"].T)) \
            @ T[p + "ffn_down.weight"].T
        states.append(x)
    out = T.get("output.weight", E)
    logits = rms(x, T["output_norm.weight"]) @ out.T
    return np.stack(states), logits, np.stack(mats)


def layer_errors(S: np.ndarray, R: np.ndarray) -> np.ndarray:
    """max |S - R| / max |R| of every layer."""
    return np.abs(S - R).max(axis=(1, 2)) / np.abs(R).max(axis=(1, 2))
