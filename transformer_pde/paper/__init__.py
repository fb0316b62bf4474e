r"""The paper's experiments as library objects.

Castin, Ablin, Carrillo & Peyré, *A Unified Perspective on the Dynamics of Deep
Transformers* (arXiv:2501.18322), study the covariance dynamics of Gaussian token
measures.  This subpackage holds what its figures need:

- :func:`paper_attention` -- the paper's score scalings (softmax :math:`A = K^\top Q/\sqrt d`,
  :math:`1/\sqrt k` per head; L2 kernel :math:`\exp(-|Qx/\sqrt d - Ky|^2)`; Sinkhorn
  :math:`\varepsilon = 1`, unscaled);
- :func:`slice_covariances`, :func:`solve_paths`, :data:`STATUS_COLOURS` -- initial covariances
  and batched Gaussian paths for the 2-D phase plots;
- :class:`RankSweep`, :func:`rank_sweep`, :func:`rank_figure` -- rank histograms of the limit
  covariance over random draws;
- :func:`init_grid`, :func:`paper_figure`, :func:`paper_run`, :func:`paper_runs`,
  :data:`FIGURE_NAMES`, :data:`EXTRA_RUNS` -- the parameters of the paper's 2-D figures
  (matrices, grids, Euler steps and stopping rules) as data;
- :func:`euler_reference`, :func:`euler_run`, :func:`moment_rhs` -- the paper's projected
  explicit Euler with its stopping rules, written independently of
  :mod:`transformer_pde.gaussian`, as a reference;
- :func:`solve_run`, :func:`run_paths`, :func:`draw_run`, :func:`paper_figure_plot` -- the
  figures redrawn with the exact batched solver;
- :func:`draw_rank_trial`, :func:`rank_trial`, :func:`count_rank`, :func:`paper_rank_study` --
  the paper's rank study (:math:`K = -Q` of rank :math:`\lfloor d/2\rfloor`, converged runs
  only, eigenvalues above 0.1);
- :func:`save_figures`, :func:`fast_configuration`, :func:`output_folder`, :func:`show_pngs`
  -- what the ``examples/`` scripts share.
"""

from .euler import EulerResult, euler_reference, euler_run, moment_rhs
from .parameters import (EXTRA_RUNS, FIGURE_NAMES, Figure, CovarianceGrid, PaperRun, StopRule,
                         init_grid, paper_figure, paper_run, paper_runs)
from .figures import draw_run, paper_figure_plot, run_paths, solve_run
from .rankstudy import (RANK_THRESHOLD, RankStudyResult, RankTrial, count_rank,
                        draw_rank_covariance, draw_rank_parameters, draw_rank_trial,
                        paper_rank_study, rank_trial)
from .paths import STATUS_COLOURS, slice_covariances, solve_paths
from .ranks import RankSweep, rank_figure, rank_sweep, rank_sweep_trials
from .scalings import paper_attention
from .scripts import fast_configuration, output_folder, save_figures, show_pngs

__all__ = ["CovarianceGrid", "EXTRA_RUNS", "EulerResult", "FIGURE_NAMES", "Figure", "PaperRun",
           "RANK_THRESHOLD", "RankStudyResult", "RankSweep", "RankTrial", "STATUS_COLOURS",
           "StopRule", "count_rank", "draw_rank_covariance", "draw_rank_parameters",
           "draw_rank_trial", "draw_run", "euler_reference", "euler_run", "fast_configuration",
           "init_grid", "output_folder",
           "moment_rhs", "paper_attention", "paper_figure", "paper_figure_plot",
           "paper_rank_study", "paper_run", "paper_runs", "rank_figure", "rank_sweep",
           "rank_sweep_trials", "rank_trial", "run_paths", "save_figures", "show_pngs",
           "slice_covariances", "solve_paths", "solve_run"]
