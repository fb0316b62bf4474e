"""Figures: covariance cone and its trace-normalised slice, token paths, rank histograms
and token flows through the layers of a network.

Every function draws with Matplotlib's object API, never calls ``plt.show`` and returns
the :class:`matplotlib.figure.Figure` it drew on, so it works headless (Agg) and in
notebooks alike, and leaves the caller's ``pyplot`` figures and backend alone.  Pass
``ax=`` to draw into an existing axes where a function draws a single axes.

Modules, by what they draw: :mod:`.covariance` (covariance trajectories of 2-D Gaussians
in the PSD cone and its trace-normalised slice), :mod:`.tokens` (particle runs),
:mod:`.ranks` (rank histograms), :mod:`.pretrained` (token flows through the layers of a
network); every public name is re-exported here.
"""

from __future__ import annotations

from .covariance import cone, cone_coordinates, cone_slice
from .pretrained import (STATISTICS_PANELS, DepthCurve, PathPanel, cosine_matrices,
                         principal_plane, statistics_along_depth, token_paths)
from .ranks import rank_histogram
from .tokens import animate_particles, particles, rescaled_states

__all__ = [
    "STATISTICS_PANELS",
    "DepthCurve",
    "PathPanel",
    "animate_particles",
    "cone",
    "cone_coordinates",
    "cone_slice",
    "cosine_matrices",
    "particles",
    "principal_plane",
    "rank_histogram",
    "rescaled_states",
    "statistics_along_depth",
    "token_paths",
]
