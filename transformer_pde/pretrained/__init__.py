"""A pretrained BERT-family encoder as a token flow.

:func:`load` reads a model directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, as written by Hugging Face ``transformers``) and returns a
:class:`PretrainedEncoder`: the model's weights as the library's own objects, one
:class:`~transformer_pde.Attention`, :class:`~transformer_pde.blocks.MLP` and pair of
post-norm :class:`~transformer_pde.blocks.LayerNorm` per layer, and the same stacked into
per-layer :class:`~transformer_pde.Layers` tables for the whole depth.  No deep-learning
framework is used (``safetensors``' NumPy API and ``tokenizers``, the ``pretrained`` extra).

A BERT layer is exactly one explicit Euler step of size 1 of the library's block flow with
Lie splitting and post-norm projections; :meth:`PretrainedEncoder.simulate` integrates the
residual ODEs inside each layer to give the network's continuous-depth version, and
:func:`flow_report` runs, measures and draws the token flows of a text.

Only post-LN encoders with the BERT layout are supported.  Pre-LN encoders and
decoder-only models are refused with an error that says what would be needed.

Modules: :mod:`.model` (the model directory: configuration, weights, tokenizer and their
checks), :mod:`.encoder` (the encoder as a flow), :mod:`.report` (the run report); every
public name is re-exported here.
"""

from __future__ import annotations

from .encoder import PretrainedEncoder, from_model_directory, load, mean_pooled
from .model import (LAYER_TENSORS, MODEL_FILES, SUPPORTED_MODEL_TYPES, EncoderConfig,
                    ModelDirectory, read_config, read_model_dir)
from .report import flow_report, run_flows, sample_depths

__all__ = [
    "LAYER_TENSORS",
    "MODEL_FILES",
    "SUPPORTED_MODEL_TYPES",
    "EncoderConfig",
    "ModelDirectory",
    "PretrainedEncoder",
    "flow_report",
    "from_model_directory",
    "load",
    "mean_pooled",
    "read_config",
    "read_model_dir",
    "run_flows",
    "sample_depths",
]
