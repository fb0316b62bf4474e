"""Sphinx configuration of the transformer-pde documentation.

Build (warnings are errors in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The site needs no network: intersphinx reads the small inventories committed in
``docs/_inventories`` (``python docs/make_inventories.py`` rewrites them), and MathJax is
served from the build (``sphinx-mathjax-offline``).  The gallery runs every example of
``examples/`` in its fast configuration (``TRANSFORMER_PDE_FAST=1``); set
``TRANSFORMER_PDE_GALLERY=all`` for the full configuration (the committed figures; about
17 minutes on 2 cores), ``none`` to run none, or a regular expression to run only the
matching examples (see ``docs/gallery_support.py``); the examples that do not run are shown
with the figures committed in ``figures/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import api_pages  # noqa: E402  (docs/api_pages.py: one page per public module)
import gallery_support  # noqa: E402  (docs/gallery_support.py: what the gallery runs)
import make_inventories  # noqa: E402  (docs/make_inventories.py: offline intersphinx)

import transformer_pde  # noqa: E402

project = "transformer-pde"
author = "the transformer-pde developers"
copyright = "2026, the transformer-pde developers"
release = version = transformer_pde.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",    # MathJax served from the build (no CDN)
    "numpydoc",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "_inventories", "_templates",
                    "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "auto_examples/*.md5"]
templates_path = ["_templates"]

# --- Markdown (MyST) --------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# --- API reference ------------------------------------------------------------------------
api_pages.write(DOCS / "api")
autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # numpydoc sections carry the types
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# --- Cross-references to other projects, offline ------------------------------------------
_INV = DOCS / "_inventories"
intersphinx_mapping = {key: (url, (str(_INV / f"{key}.inv"), None))
                       for key, url in make_inventories.URLS.items()}
# a hosted build (Read the Docs sets READTHEDOCS) may fetch the full inventories instead
if os.environ.get("READTHEDOCS") == "True":
    intersphinx_mapping = {k: (url, (None, local)) for k, (url, (local, _)) in
                           intersphinx_mapping.items()}
intersphinx_timeout = 10

# --- Gallery of examples/ ----------------------------------------------------------------
GALLERY_PATTERN, GALLERY_RUNS, GALLERY_FAST = gallery_support.selection()
# the examples run in this process and read their configuration from the environment
os.environ["TRANSFORMER_PDE_FAST"] = "1" if GALLERY_FAST else "0"
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": GALLERY_PATTERN,
    "ignore_pattern": r"__init__\.py",
    "reset_argv": "gallery_support.reset_argv",
    "image_scrapers": ("gallery_support.png_scraper",),
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "min_reported_time": 1,
    "abort_on_example_error": True,
    "plot_gallery": "True",
}


def _committed_figures(app) -> None:
    gallery_support.show_committed_figures(GALLERY_PATTERN, GALLERY_RUNS)


def setup(app) -> None:
    # after sphinx-gallery has written auto_examples/ (its handler has priority 500)
    app.connect("builder-inited", _committed_figures, priority=900)


# --- HTML ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "transformer-pde"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "navigation_with_keys": False,
    # every top-level page in the header, the API reference included (none under "More")
    "header_links_before_dropdown": 8,
    "show_toc_level": 2,
    # the benchmark tables need the whole width: no table of contents beside them
    "secondary_sidebar_items": {"**": ["page-toc"], "benchmarks": []},
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
html_sidebars = {"benchmarks": [], "getting-started": [], "architecture": []}
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
