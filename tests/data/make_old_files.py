"""Files written by transformer-pde at commit c9033c2 (before CF global attributes and
structured metadata), kept so that tests/io/test_old_files.py checks that they still load.

Made once, with a worktree of that commit::

    git worktree add /tmp/r3base c9033c2
    PYTHONPATH=/tmp/r3base python tests/data/make_old_files.py

Do not regenerate with a later version: the point of these files is that they were
written by the old one.  ``expected.npz`` holds what they contain, written with plain
``np.savez`` (arrays) and JSON text (status, message, info, attention, attributes), so the
test compares what the reader returns with what the old writer was given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde import gaussian, sweep
from transformer_pde.sweep.cells import ConePathCell

OUT = Path(__file__).with_name("files_c9033c2")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    X0 = rng.standard_normal((5, 2))
    att = tp.Attention("softmax", Q=np.eye(2), K=np.eye(2), V=np.array([[1.0, 0.2], [0.0, 0.5]]))
    field = tp.FieldOptions(backend="numpy")
    traj = tp.simulate(att, X0, t_max=0.5, dt=0.05, saveat=tp.SaveAt(every=4), field=field)
    stats = tp.simulate(att, X0, t_max=0.5, dt=0.05, field=field,
                        saveat=tp.SaveAt(every=4, fn=lambda t, X, w: np.sum(X * X, axis=1)))
    gauss = gaussian.solve(att, np.zeros(2), np.eye(2), t_max=0.5,
                           t_eval=np.linspace(0.0, 0.5, 3))
    traj.save(OUT / "particles.nc")
    traj.save(OUT / "particles.npz")
    stats.save(OUT / "statistic.nc")
    tp.io.save_dataset(gauss.to_xarray(), OUT / "gaussian.nc")
    expected = {"states": traj.states, "times": traj.times, "weights": traj.weights,
                "stats_last": stats.last, "stats_times": stats.times,
                "stats_means": stats.saved_means, "stats_covs": stats.saved_covs,
                "stats_values": stats.values, "gauss_means": gauss.means,
                "gauss_covs": gauss.covs, "gauss_limit": gauss.limit,
                "gauss_times": gauss.times}
    text = {"particles": {"status": str(traj.status), "message": traj.message,
                          "info": tp.io.tag_arrays(dict(traj.info)),
                          "attention": tp.io.attention_to_json(traj.attention)},
            "statistic": {"status": str(stats.status), "message": stats.message,
                          "info": tp.io.tag_arrays(dict(stats.info))},
            "gaussian": {"status": str(gauss.status), "message": gauss.message,
                         "blowup_time": gauss.blowup_time, "t_final": gauss.t_final}}
    # a study store of the cone command's cell, its attention label JSON text as the CLI
    # writes it: the fingerprint is JSON inside JSON inside JSON
    label = tp.io.dumps({"kind": "softmax", "V": [[1.0, 0.2], [0.0, 0.5]]}, sort_keys=True,
                        describe=True)
    cell = ConePathCell(att, (((1.0, 0.0), (0.0, 1.0)), ((2.0, 0.1), (0.1, 0.5))), 0.5, 3,
                        (), label)
    study = sweep.Study(sweep.Grid({"run": [0, 1]}, draws=1), cell, name="cone")
    ds = sweep.run(study, store=OUT / "cone.zarr", scheduler="serial", progress=False)
    for name in ds.data_vars:
        expected[f"cone_{name}"] = ds[name].values
    text["cone"] = {"fingerprint": ds.attrs["fingerprint"], "label": label}
    expected["text"] = np.array(json.dumps(text, sort_keys=True))
    np.savez(OUT / "expected.npz", **expected)


if __name__ == "__main__":
    main()
