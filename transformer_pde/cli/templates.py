"""``transformer-pde init KIND [PATH]``: a commented configuration to start from.

The example configurations are installed with the package (``transformer_pde/cli/configs/``,
read with :mod:`importlib.resources`); ``init`` copies the one of ``KIND`` to ``PATH``
(default ``KIND.toml``; ``-`` writes it to stdout), naming the file in its first comment
line, the command that runs it.  An existing file is kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from importlib import resources
from pathlib import Path

from .exits import ExitCode, UsageError
from .output import OutputError

__all__ = ["TEMPLATES", "cmd_init", "template_text"]

#: ``KIND: (file in transformer_pde/cli/configs, the command that runs it)``
TEMPLATES: dict[str, tuple[str, str]] = {
    "simulate": ("simulate.toml", "simulate"),
    "gaussian": ("gaussian.toml", "gaussian"),
    "cone": ("cone.toml", "cone"),
    "ranks": ("ranks.toml", "ranks"),
    "paper-ranks": ("paper_ranks.toml", "ranks"),
    "sweep": ("sweep_ranks.toml", "sweep"),
}


def template_text(kind: str, path: str | None = None) -> str:
    """The configuration of ``kind`` (:data:`TEMPLATES`), its comments naming ``path``
    (default: the file's own name) where they name the example file."""
    if kind not in TEMPLATES:
        raise UsageError(f"KIND: expected one of {', '.join(TEMPLATES)}, got {kind!r}")
    name, _ = TEMPLATES[kind]
    text = resources.files(__package__).joinpath("configs", name).read_text(encoding="utf-8")
    return text.replace(f"examples/configs/{name}", shlex.quote(path or name))


def cmd_init(args: argparse.Namespace) -> int:
    """Handler of ``transformer-pde init``."""
    name, command = TEMPLATES[args.kind]
    if args.path == "-":
        sys.stdout.write(template_text(args.kind))
        return int(ExitCode.OK)
    path = Path(args.path if args.path is not None else name)
    if args.path is not None and args.path.endswith(("/", os.sep)) and not path.is_dir():
        raise OutputError(f"{args.path}: the directory does not exist (nothing was written)")
    if path.is_dir():
        path = path / name
    if path.exists() and not args.force:
        raise OutputError(f"{path} exists; pass --force to replace it (nothing was written)")
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise OutputError(f"{path}: the directory {path.parent} {what}")
    try:
        path.write_text(template_text(args.kind, str(path)), encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    sys.stdout.write(f"wrote {path}; run it with: transformer-pde {command} "
                     f"{shlex.quote(str(path))}\n")
    return int(ExitCode.OK)
