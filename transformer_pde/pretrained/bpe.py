r"""The byte-level BPE tokenizer of a GGUF file, built with ``tokenizers``.

A GGUF file carries its tokenizer as metadata: the vocabulary
(``tokenizer.ggml.tokens``, the id of a token is its index), the kind of each token
(``tokenizer.ggml.token_type``), the ranked merges (``tokenizer.ggml.merges``, one
``"left right"`` string per merge, best first), the model (``tokenizer.ggml.model``) and the
name of the pre-tokenizer (``tokenizer.ggml.pre``).  :func:`build_tokenizer` turns them into a
``tokenizers.Tokenizer``:

* the model is byte-level BPE (GGUF model ``"gpt2"``): text is split into pieces by the
  pre-tokenizer, each piece's UTF-8 bytes are written as printable characters (GPT-2's
  byte-to-unicode table, e.g. the space as ``Ġ``) and merged pair by pair, the
  best-ranked merge first, until no merge applies; the ids are the merged symbols'
  vocabulary indices;
* the pre-tokenizer is looked up by name in :data:`PRE_TOKENIZERS` (``"smollm"``: every digit
  is a piece of its own, then GPT-2's regular expression
  ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``);
* control tokens (token type 3, e.g. ``<|im_start|>``) and user-defined tokens (type 4) are
  recognised in the text as single tokens before the pre-tokenizer runs;
* decoding maps the byte characters back to bytes and those to UTF-8 text, so that
  ``decode(encode(s)) == s`` for every string (control tokens are written out verbatim).

No special token is added around the text (the GGUF's ``tokenizer.ggml.add_bos_token`` is
honoured by the decoder model, not here).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import MissingDependencyError, ModelDirectoryError

__all__ = ["CONTROL", "NORMAL", "PRE_TOKENIZERS", "TOKENIZER_MODELS", "USER_DEFINED",
           "build_tokenizer"]

#: ``tokenizer.ggml.token_type`` of a normal token (a word of byte characters)
NORMAL = 1
#: ``tokenizer.ggml.token_type`` of a control token (recognised as one special token)
CONTROL = 3
#: ``tokenizer.ggml.token_type`` of a user-defined token (recognised as one token)
USER_DEFINED = 4
#: values of ``tokenizer.ggml.model`` that :func:`build_tokenizer` reads
TOKENIZER_MODELS = ("gpt2",)


def _byte_level(pre: Any) -> list[Any]:
    return [pre.ByteLevel(add_prefix_space=False, use_regex=True)]


def _smollm(pre: Any) -> list[Any]:
    return [pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False,
                                                              use_regex=True)]


#: ``tokenizer.ggml.pre`` -> what it splits the text into before byte-level BPE
PRE_TOKENIZERS: dict[str, tuple[str, Callable[[Any], list[Any]]]] = {
    "gpt2": ("GPT-2's regular expression", _byte_level),
    "default": ("GPT-2's regular expression", _byte_level),
    "smollm": ("every digit apart, then GPT-2's regular expression", _smollm),
}


def _tokenizers() -> Any:
    try:
        import tokenizers  # noqa: PLC0415 - optional dependency
    except ImportError as exc:  # pragma: no cover - a test dependency
        raise MissingDependencyError("reading a GGUF tokenizer needs the 'tokenizers' package "
                                     "(pip install 'transformer-pde[pretrained]')") from exc
    return tokenizers


def _merge_pairs(merges: Sequence[str], where: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    rank: dict[tuple[str, str], int] = {}
    for i, m in enumerate(merges):
        left, sep, right = m.partition(" ") if isinstance(m, str) else ("", "", "")
        if not sep or not left or not right or " " in right:
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.merges[{i}] = {m!r} is not "
                                      "two symbols separated by one space")
        if (left, right) in rank:  # two ranks for one merge: which one applies is undefined
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.merges[{i}] = {m!r} is "
                                      f"tokenizer.ggml.merges[{rank[left, right]}] twice")
        rank[left, right] = i
        pairs.append((left, right))
    return pairs


def _check_normal_tokens(tokens: Sequence[str], token_types: Sequence[int],
                         alphabet: set[str], where: str) -> None:
    """Normal tokens (type 1) of byte-level BPE are words of the 256 byte characters; any
    other character is a damaged vocabulary (control and user-defined tokens are free text)."""
    for i, k in enumerate(token_types):
        if int(k) == NORMAL and not alphabet.issuperset(tokens[i]):
            ch = next(c for c in tokens[i] if c not in alphabet)
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.tokens[{i}] = {tokens[i]!r} is "
                                      f"a normal token with the character {ch!r}, which is not "
                                      "one of byte-level BPE's 256 byte characters: a damaged "
                                      "vocabulary")


def build_tokenizer(tokens: Sequence[str], token_types: Sequence[int] | None,
                    merges: Sequence[str], *, model: str = "gpt2", pre: str = "default",
                    where: str = "GGUF file") -> Any:
    """A ``tokenizers.Tokenizer`` from a GGUF file's tokenizer metadata.

    Parameters
    ----------
    tokens : sequence of str
        ``tokenizer.ggml.tokens``: the vocabulary, token ``i`` has id ``i``.
    token_types : sequence of int or None
        ``tokenizer.ggml.token_type`` (same length); types :data:`CONTROL` and
        :data:`USER_DEFINED` become added tokens.  ``None``: no added tokens.
    merges : sequence of str
        ``tokenizer.ggml.merges``, best first.
    model : str, default "gpt2"
        ``tokenizer.ggml.model`` (one of :data:`TOKENIZER_MODELS`).
    pre : str, default "default"
        ``tokenizer.ggml.pre`` (a key of :data:`PRE_TOKENIZERS`).
    where : str
        The file, named in error messages.

    Returns
    -------
    tokenizers.Tokenizer
        Without padding, truncation or post-processing.

    Raises
    ------
    ModelDirectoryError
        An unsupported tokenizer model or pre-tokenizer (the supported ones are listed), an
        empty or duplicate token, a normal token with a character outside the byte-level
        alphabet, a malformed or duplicate merge or one whose result is not in the
        vocabulary, token types of the wrong length, or a vocabulary ``tokenizers`` refuses
        (each names the entry).
    """
    tk = _tokenizers()
    if model not in TOKENIZER_MODELS:
        raise ModelDirectoryError(f"{where}: tokenizer.ggml.model={model!r} is not supported "
                                  f"(byte-level BPE models are: {list(TOKENIZER_MODELS)})")
    if pre not in PRE_TOKENIZERS:
        raise ModelDirectoryError(f"{where}: tokenizer.ggml.pre={pre!r} is not supported; "
                                  f"known pre-tokenizers: {sorted(PRE_TOKENIZERS)}")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not isinstance(t, str) or not t:
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.tokens[{i}] = {t!r} is not a "
                                      "token (a non-empty string)")
        if t in vocab:
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.tokens[{i}] = {t!r} is "
                                      f"tokenizer.ggml.tokens[{vocab[t]}] twice")
        vocab[t] = i
    pairs = _merge_pairs(merges, where)
    for i, (a, b) in enumerate(pairs):
        if a + b not in vocab or a not in vocab or b not in vocab:
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.merges[{i}] = '{a} {b}' "
                                      "joins symbols that are not all in the vocabulary")
    try:
        bpe = tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises untyped errors from Rust
        raise ModelDirectoryError(f"{where}: tokenizers cannot build the vocabulary "
                                  f"(tokenizer.ggml.tokens, tokenizer.ggml.merges): {exc}") \
            from None
    tok = tk.Tokenizer(bpe)
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(PRE_TOKENIZERS[pre][1](tk.pre_tokenizers))
    tok.decoder = tk.decoders.ByteLevel()
    if token_types is not None:
        if len(token_types) != len(tokens):
            raise ModelDirectoryError(f"{where}: tokenizer.ggml.token_type has "
                                      f"{len(token_types)} entries for {len(tokens)} tokens")
        _check_normal_tokens(tokens, token_types, set(tk.pre_tokenizers.ByteLevel.alphabet()),
                             where)
        special = [tk.AddedToken(tokens[i], special=True, normalized=False)
                   for i, k in enumerate(token_types) if int(k) == CONTROL]
        user = [tk.AddedToken(tokens[i], special=False, normalized=False)
                for i, k in enumerate(token_types) if int(k) == USER_DEFINED]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)
    tok.no_padding()
    tok.no_truncation()
    return tok
