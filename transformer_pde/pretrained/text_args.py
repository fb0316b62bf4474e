"""The text of a pretrained model's prompt, checked once for every model.

:class:`~transformer_pde.pretrained.PretrainedEncoder` and
:class:`~transformer_pde.pretrained.PretrainedDecoder` hand a prompt to ``tokenizers``, which
takes only strings that can be written as UTF-8.  A Python ``str`` can hold what UTF-8
cannot: a lone surrogate (a code point in U+D800..U+DFFF outside a pair), which is what
Python makes of the undecodable bytes of a command-line argument or a file name
(``surrogateescape``).  ``tokenizers`` refuses such a string with its own TypeError
("TextInputSequence must be str"); :func:`check_text` refuses it first, naming the argument,
the character and its index.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import type_name

__all__ = ["check_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: Any, name: str = "text") -> str:
    """``text`` if it is a non-empty string that UTF-8 can encode.

    Parameters
    ----------
    text : object
        The prompt.
    name : str, default "text"
        The argument's name in the messages.

    Returns
    -------
    str

    Raises
    ------
    ArgumentTypeError
        ``text`` is not a ``str`` (for ``bytes`` the message says to decode them).
    ArgumentError
        ``text`` is empty, or holds a lone surrogate (the character and its index are named).
    """
    if not isinstance(text, str):
        hint = " (decode the bytes first: text.decode('utf-8'))" \
            if isinstance(text, (bytes, bytearray)) else ""
        raise ArgumentTypeError(f"{name} must be a str, got {type_name(text)}{hint}")
    if not text:
        raise ArgumentError(f"{name} must not be empty (a model needs at least one token)")
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise ArgumentError(f"{name} holds a lone surrogate {bad.group()!r} at index "
                            f"{bad.start()}, which is not valid UTF-8 and which no tokenizer "
                            "reads (undecodable bytes of a command line or file?)")
    return text
