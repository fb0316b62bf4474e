r"""transformer-pde: deep Transformers as a mean-field PDE on token measures.

Tokens are a probability measure on :math:`\mathbb R^d`, depth is time, and each residual
attention layer is one Euler step of :math:`dx/dt = \Gamma_\mu(x)`.  Main entry points:

- :class:`~transformer_pde.attention.Attention` / :class:`~transformer_pde.attention.Layers`
  -- the attention specification (attention/)
- :func:`~transformer_pde.fields.velocity` / :func:`~transformer_pde.particles.simulate` /
  :func:`~transformer_pde.particles.load` -- the particle engine (:mod:`transformer_pde.particles`)
- :mod:`transformer_pde.gaussian` -- closed-form mean/covariance ODEs
- :mod:`transformer_pde.reductions` -- exact reductions of the dynamics on the sphere
  (equiangular tokens, the Gram flow, mode growth rates), the oracles of the particle runs
- :mod:`transformer_pde.meanfield` -- the mean-field PDE itself, solved on the circle and
  the line, and particles measured against it
- :mod:`transformer_pde.diagnostics` -- stability, rank collapse, blow-up, clusters
- :mod:`transformer_pde.plot` -- covariance cone, particles, rank histograms, token flows
  along depth
- :mod:`transformer_pde.pretrained` -- a pretrained BERT-family encoder as a token flow

The conventions (score without hidden :math:`1/\sqrt d`, temperatures, kernels, multi-head
layout) are in ``docs/conventions.md``.
"""

import importlib
from typing import Any

from .attention import KINDS, Attention, AttentionParams, Head, Kind, Layers, Rotary, register_kind
from .backends import BackendNotAvailable, available_backends, get_backend
from .blocks import MLP, Block, LayerNorm, Normalization, PostLayerNorm, RMSNorm, Sphere
from .errors import SinkhornNotConverged
from .fields import FieldEvaluator, attention_matrix
from .integrate.loop import Limits, Monitor, SaveAt
from .integrate.solvers import (AdamsBashforth, Dop853, Dopri5, Euler, Heun, ImplicitMidpoint,
                                RK4)
from .noise import EulerMaruyama, HeunStratonovich, Milstein, Noise
from .particles import FieldOptions, ParticleTrajectory, load, simulate, velocity
from .particles import simulate_ensemble
from .results import Status
from .sinkhorn import sinkhorn_coupling, sinkhorn_summary

__version__ = "0.1.0"

# Submodules loaded on first attribute access (``tp.gaussian``, ``tp.plot``...), so that
# ``import transformer_pde`` does not pull in POT, matplotlib or hypothesis.
_LAZY_SUBMODULES = ("gaussian", "diagnostics", "plot", "cli", "paper", "testing",
                    "integrate", "pretrained", "reductions", "meanfield",
                    "blocks", "sinkhorn", "fields", "particles", "attention", "backends",
                    "noise")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdamsBashforth",
    "Attention",
    "Block",
    "Dop853",
    "Dopri5",
    "Euler",
    "FieldOptions",
    "Heun",
    "ImplicitMidpoint",
    "Limits",
    "Monitor",
    "PostLayerNorm",
    "RMSNorm",
    "Rotary",
    "RK4",
    "SaveAt",
    "Sphere",
    "Status",
    "AttentionParams",
    "BackendNotAvailable",
    "FieldEvaluator",
    "Head",
    "Kind",
    "KINDS",
    "LayerNorm",
    "Layers",
    "MLP",
    "Normalization",
    "ParticleTrajectory",
    "SinkhornNotConverged",
    "available_backends",
    "get_backend",
    "load",
    "register_kind",
    "simulate",
    "simulate_ensemble",
    "EulerMaruyama",
    "HeunStratonovich",
    "Milstein",
    "Noise",
    "sinkhorn_coupling",
    "sinkhorn_summary",
    "attention_matrix",
    "velocity",
    "__version__",
]
