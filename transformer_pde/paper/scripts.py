r"""Command line shared by the figure scripts of ``examples/``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["run_figure_script", "script_argv"]


def script_argv() -> list[str] | None:
    """The arguments an example's ``main(argv)`` parses: ``None`` (that is, ``sys.argv``)
    from the shell and in the gallery build, ``[]`` (the defaults) inside a Jupyter kernel,
    whose ``sys.argv`` holds the kernel's own options.  So an example run as a notebook
    executes ``main`` with its defaults instead of stopping in ``argparse``."""
    return [] if "ipykernel" in sys.modules else None


def run_figure_script(doc: str, make: Callable[[argparse.Namespace], dict],
                      argv: Sequence[str] | None = None,
                      options: Callable[[argparse.ArgumentParser], None] | None = None
                      ) -> list[Path]:
    """Command line of the ``examples/`` figure scripts: parse ``--out`` (default: the
    repository's ``figures/``) and any extra ``options``, call ``make(args)`` -> ``{name:
    Figure}`` and save each figure as ``<out>/<name>.png``; returns the paths written.
    Without ``argv`` the arguments are :func:`script_argv`'s.  The figures stay open, so a
    notebook shows them."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])  # the title
    p.add_argument("--out", default=str(Path.cwd() / "figures"),
                   help="output directory (default: ./figures)")
    if options is not None:
        options(p)
    args = p.parse_args(script_argv() if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in make(args).items():
        fig.savefig(out / f"{name}.png", dpi=100)
        written.append(out / f"{name}.png")
        sys.stdout.write(f"{written[-1]}\n")
    return written
