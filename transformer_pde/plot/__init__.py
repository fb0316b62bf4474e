"""Figures: covariance cone and its trace-normalised slice, token paths, rank histograms
and token flows through the layers of a network.

Matplotlib conventions: a function that draws one axes takes ``ax=`` and returns the
:class:`~matplotlib.axes.Axes` it drew on; a multi-panel function takes ``fig=`` and
returns the :class:`~matplotlib.figure.Figure`.  Without them a new figure is made through
:mod:`matplotlib.pyplot`, so it shows inline in Jupyter and with ``plt.show()``; the
functions never call ``plt.show``, never select a backend and never change ``rcParams``.
A script that only saves a figure closes it (``plt.close(ax.figure)``).
:func:`animate_particles` writes a file and keeps no figure open.

Modules, by what they draw: :mod:`.covariance` (covariance trajectories of 2-D Gaussians
in the PSD cone and its trace-normalised slice), :mod:`.tokens` (particle runs),
:mod:`.ranks` (rank histograms), :mod:`.pretrained` (token flows through the layers of a
network), :mod:`.decoder` (a causal decoder's depth statistics beside other flows, its
attention sink); every public name is re-exported here.
"""

from .covariance import cone, cone_coordinates, cone_slice
from .decoder import ModelCurve, attention_sink, decoder_flows, models_side_by_side
from .pretrained import (STATISTICS_PANELS, DepthCurve, PathPanel, cosine_matrices,
                         principal_plane, statistics_along_depth, token_paths)
from .ranks import rank_histogram
from .tokens import animate_particles, particles, rescaled_states

__all__ = ["STATISTICS_PANELS", "DepthCurve", "ModelCurve", "PathPanel", "animate_particles",
           "attention_sink", "cone", "cone_coordinates", "cone_slice", "cosine_matrices",
           "decoder_flows", "models_side_by_side", "particles", "principal_plane",
           "rank_histogram", "rescaled_states", "statistics_along_depth", "token_paths"]
