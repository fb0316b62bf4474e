"""transformer-pde: deep Transformers as a mean-field PDE on token measures.

Tokens are a probability measure on R^d, depth is time, and each residual attention
layer is one Euler step of dx/dt = Gamma_mu(x).  Main entry points:

- :class:`Attention` / :class:`Layers` -- the attention specification (attention.py)
- :func:`velocity` / :func:`simulate` / :func:`load` -- the particle engine (particles.py)
- :mod:`transformer_pde.gaussian` -- closed-form mean/covariance ODEs
- :mod:`transformer_pde.diagnostics` -- stability, rank collapse, blow-up, clusters
- :mod:`transformer_pde.plot` -- covariance cone, particles, rank histograms
"""

from .attention import KINDS, Attention, AttentionParams, Head, Kind, Layers, register_kind
from .backends import BackendNotAvailable, available_backends, get_backend
from .fields import FieldEvaluator, SinkhornNotConverged
from .particles import ParticleTrajectory, load, simulate, velocity

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "AttentionParams",
    "BackendNotAvailable",
    "FieldEvaluator",
    "Head",
    "Kind",
    "KINDS",
    "Layers",
    "ParticleTrajectory",
    "SinkhornNotConverged",
    "available_backends",
    "get_backend",
    "load",
    "register_kind",
    "simulate",
    "velocity",
    "__version__",
]
