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
- :func:`run_figure_script` -- the command line of the ``examples/`` figure scripts.
"""

from .paths import STATUS_COLOURS, slice_covariances, solve_paths
from .ranks import RankSweep, rank_figure, rank_sweep
from .scalings import paper_attention
from .scripts import run_figure_script

__all__ = [
    "STATUS_COLOURS",
    "RankSweep",
    "paper_attention",
    "rank_figure",
    "rank_sweep",
    "run_figure_script",
    "slice_covariances",
    "solve_paths",
]
