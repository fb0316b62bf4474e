"""Command-line interface ``transformer-pde``: a thin shell over the library.

Commands (``transformer-pde COMMAND --help`` for each):

``demo``
    Clustering of a 2-D token cloud under softmax attention (:math:`Q = K = V = I`) on an
    embedded default; writes a figure, a text and a JSON summary (number of clusters,
    covariance rank) and the trajectory into ``./transformer-pde-demo/``.
``simulate CONFIG.toml``
    Particle simulation from a parameter file: trajectory NPZ, JSON summary, figure.
    Ctrl-C keeps the states computed so far (status ``interrupted``, exit status 130).
``gaussian CONFIG.toml``
    Exact mean/covariance ODE of a Gaussian token measure: NPZ, JSON summary, figure.
``cone CONFIG.toml``
    Phase plot of many 2-D covariance trajectories in the PSD cone (or its
    trace-normalised slice).
``ranks [CONFIG.toml]``
    Rank histogram sweep: numerical rank of the limit covariance over random draws.
``sweep CONFIG.toml``
    A parameter study (tables ``[study]``, ``[study.axes]``, ``[cell]``) cell by cell on
    Dask, written to ``results.zarr`` as cells finish (:mod:`transformer_pde.sweep`).
``bench``
    Timing of the particle field / Gaussian solver (or the benchmark scripts, if present).
``pretrained TEXT``
    The tokens of TEXT through a pretrained BERT-family encoder as a flow in depth: token
    paths, clusters, covariance ranks and cosine similarities per layer, for the network,
    its continuous-depth version and repeated layers (:mod:`transformer_pde.cli.pretrained`).

The subpackage is split by concern: :mod:`~transformer_pde.cli.config` reads TOML files
and checks their values (keys and defaults from the library's own signatures; every error
a :class:`~transformer_pde.errors.ConfigError` naming the key),
:mod:`~transformer_pde.cli.builders` turns their tables into library objects,
:mod:`~transformer_pde.cli.output` checks and writes the output directory; the commands
live in :mod:`~transformer_pde.cli.runs` (``demo``, ``simulate``, ``gaussian``),
:mod:`~transformer_pde.cli.studies` (``cone``, ``ranks``, ``sweep``),
:mod:`~transformer_pde.cli.bench` and :mod:`~transformer_pde.cli.pretrained`, each with
its command-line handler; :mod:`~transformer_pde.cli.parser` builds the argument parser,
:mod:`~transformer_pde.cli.exits` holds the exit statuses (:class:`ExitCode`) and
:mod:`~transformer_pde.cli.main` turns every failure into one line and an exit status.
``transformer-pde init KIND`` writes a commented example configuration for each
config-driven command (the files ship with the package, in ``transformer_pde/cli/configs/``).
"""

from ..errors import ConfigError
from .bench import benchmark_scripts, run_bench
from .builders import build_attention, build_tokens
from .config import load_config
from .exits import ExitCode
from .main import main
from .output import OutputDir, OutputError
from .parser import build_parser
from .runs import CLUSTER_TOL, RANK_RTOL, run_demo, run_gaussian, run_simulate
from .studies import run_cone, run_ranks

__all__ = [
    "CLUSTER_TOL",
    "ConfigError",
    "ExitCode",
    "OutputDir",
    "OutputError",
    "RANK_RTOL",
    "benchmark_scripts",
    "build_attention",
    "build_parser",
    "build_tokens",
    "load_config",
    "main",
    "run_bench",
    "run_cone",
    "run_demo",
    "run_gaussian",
    "run_ranks",
    "run_simulate",
]
