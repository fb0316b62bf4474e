"""transformer-pde: deep Transformers as a mean-field PDE on token measures."""

from .attention import KINDS, Attention, AttentionParams, Head, Kind, Layers, register_kind

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "AttentionParams",
    "Head",
    "Kind",
    "KINDS",
    "Layers",
    "register_kind",
    "__version__",
]
