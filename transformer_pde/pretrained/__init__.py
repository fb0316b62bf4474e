"""Pretrained language models as token flows: a BERT-family encoder and GGUF decoders.

:func:`load` reads either

* a model directory (``config.json``, ``model.safetensors``, ``tokenizer.json``, as written
  by Hugging Face ``transformers``) of a post-LN BERT-family encoder and returns a
  :class:`PretrainedEncoder`: the model's weights as the library's own objects, one
  :class:`~transformer_pde.Attention`, :class:`~transformer_pde.blocks.MLP` and pair of
  post-norm :class:`~transformer_pde.blocks.LayerNorm` per layer, and the same stacked into
  per-layer :class:`~transformer_pde.Layers` tables for the whole depth
  (``safetensors``' NumPy API and ``tokenizers``, the ``pretrained`` extra); or
* a ``.gguf`` file of a Llama-family decoder (e.g. SmolLM2-135M, :func:`smollm2_path`) and
  returns a :class:`PretrainedDecoder`: causal attention with rotary positions and grouped
  key/value heads, pre-norm RMSNorms and a gated SiLU MLP as per-layer tables (``gguf``
  dequantises the weights, ``tokenizers`` runs the file's byte-level BPE).

No deep-learning framework is used.  A BERT layer is exactly one explicit Euler step of
size 1 of the library's block flow with Lie splitting and post-norm projections; a decoder
block is one such step of the pre-norm flow.  Both models' ``simulate`` methods give the
networks' continuous-depth versions, :func:`flow_report` and :func:`decoder_flow_report`
run, measure and draw the token flows of a text, and the models' ``plot_*`` methods
(``decoder.plot_attention_sink(text)``, ``encoder.plot_statistics(text)``, ...) draw each
figure of those reports in one call, running only what it draws.

Pre-LN encoders in Hugging Face layout and decoder directories are refused with an error
that says what would be needed (decoders: their GGUF file).

Modules: :mod:`.model` (the encoder's model directory: configuration, weights, tokenizer
and their checks), :mod:`.encoder` (the encoder as a flow, and :func:`load`),
:mod:`.gguf_file` (GGUF files: the architecture table, configuration, dequantisation),
:mod:`.gguf_format` (the binary layout of a GGUF file and its typed metadata),
:mod:`.bpe` (the GGUF tokenizer), :mod:`.decoder` (the decoder as a flow), :mod:`.report`
(the run report), :mod:`.text_args` and :mod:`.depth_args` (the checks of a prompt and of
a continuous-depth run, shared by both models); every public name of the models and
reports is re-exported here.

Damaged files are refused with a :class:`~transformer_pde.errors.ModelDirectoryError` that
names the file and what is wrong (the key, the tensor and entry); a prompt that is not a
non-empty string UTF-8 can encode (a lone surrogate) is refused naming ``text``.
"""

from .bpe import PRE_TOKENIZERS, build_tokenizer
from .decoder import PretrainedDecoder, from_gguf_model, load_gguf
from .decoder_report import (decoder_flow_report, encoder_statistics, first_token_attention,
                             idealised_causal_flow, layer_statistics, run_decoder_flows,
                             sink_channels)
from .encoder import PretrainedEncoder, from_model_directory, load, mean_pooled
from .gguf_file import (ARCHITECTURES, DecoderConfig, GGUFArchitecture, GGUFModel, read_gguf,
                        smollm2_path)
from .model import (LAYER_TENSORS, MODEL_FILES, SUPPORTED_MODEL_TYPES, EncoderConfig,
                    ModelDirectory, read_config, read_model_dir)
from .report import flow_report, run_flows, sample_depths

__all__ = [
    "ARCHITECTURES",
    "DecoderConfig",
    "EncoderConfig",
    "GGUFArchitecture",
    "GGUFModel",
    "LAYER_TENSORS",
    "MODEL_FILES",
    "ModelDirectory",
    "PRE_TOKENIZERS",
    "PretrainedDecoder",
    "PretrainedEncoder",
    "SUPPORTED_MODEL_TYPES",
    "build_tokenizer",
    "decoder_flow_report",
    "encoder_statistics",
    "first_token_attention",
    "flow_report",
    "from_gguf_model",
    "from_model_directory",
    "idealised_causal_flow",
    "layer_statistics",
    "load",
    "load_gguf",
    "mean_pooled",
    "read_config",
    "read_gguf",
    "read_model_dir",
    "run_decoder_flows",
    "run_flows",
    "sample_depths",
    "sink_channels",
    "smollm2_path",
]
