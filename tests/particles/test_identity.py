"""The particle-run identity of checkpoints (``particles/identity.py``).

Fingerprints of existing runs must not change when the identity moves or grows: the
digests below were computed by running this file as a script at commit c9033c2 (before
the identity left ``integrate/checkpoint.py`` and before segments existed)::

    git worktree add /tmp/base c9033c2
    PYTHONPATH=/tmp/base python tests/particles/test_identity.py

Each case is a small ``simulate`` run with a checkpoint; its fingerprint is the digest of
the ``static`` fields the checkpoint records (what a resume compares for equality).  The
cases avoid callables defined here (their qualified names contain this module's name and
their code digests depend on the Python version).
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.io.digests import json_digest

#: json_digest of each case's recorded static fields at commit c9033c2
GOLDEN = {
    "softmax":
        "e08de90c68f2193bee5bd093a3161b30cd8d3bd52910eab204a0477a6a5bf789",
    "masked_heads_f32_dopri5_ts":
        "b5854539f7422029db4ec238b5e7f1afa30fea341138e908d70ca617734a0235",
    "sinkhorn_sphere_layers_callable":
        "3bf653152aaef6b70abe272e20aba7730b030048bde517a72850c4bbe95c9438",
    "mlp_block_heun_limits":
        "b517e3f2aa951f06885b1d268ef99b5d8cbc5c09784c75217ea51c6fc2e0e2f5",
}


def _cases() -> dict[str, dict]:
    rng = np.random.default_rng(7)
    M = rng.normal(size=(2, 2))
    X0 = rng.normal(size=(5, 2))
    S = X0 / np.linalg.norm(X0, axis=1, keepdims=True)
    Q4, K4, V4 = (rng.normal(size=(4, 4)) for _ in range(3))
    mlp = tp.MLP(rng.normal(size=(3, 2)), rng.normal(size=(2, 3)), np.zeros(3), np.zeros(2))
    return {
        "softmax": dict(att=tp.Attention("softmax", M, np.eye(2), np.eye(2)), X0=X0,
                        solver="rk4"),
        "masked_heads_f32_dopri5_ts": dict(
            att=tp.Attention("softmax", Q4, K4, V4, heads=2, masked=True),
            X0=rng.normal(size=(6, 4)).astype(np.float32), positions=np.linspace(0, 1, 6),
            weights=np.arange(1.0, 7.0), solver=tp.Dopri5(rtol=1e-6, atol=1e-8),
            saveat=tp.SaveAt(ts=[0.0, 0.1, 0.2])),
        "sinkhorn_sphere_layers_callable": dict(
            att=tp.Attention("sinkhorn", M, functools.partial(np.full, (2, 2)),
                             tp.Layers(np.stack([np.eye(2), 2 * np.eye(2)]), layer_time=0.1)),
            X0=S, block=tp.Block(constraint="sphere"),
            field=tp.FieldOptions(sinkhorn_tol=1e-8, sinkhorn_max_iter=500)),
        "mlp_block_heun_limits": dict(
            att=tp.Attention("softmax", M, M, np.eye(2), beta=2.0), X0=X0, solver="heun",
            block=tp.Block(mlp=mlp), limits=tp.Limits(max_norm=50.0)),
    }


def fingerprint(case: str, folder: Path) -> str:
    """The digest of the static fields a checkpoint of ``case`` records."""
    kw = dict(_cases()[case])
    path = folder / f"{case}.ckpt"
    kw.setdefault("field", tp.FieldOptions(backend="numpy"))
    if kw["field"].backend != "numpy":
        kw["field"] = tp.FieldOptions(backend="numpy", sinkhorn_tol=kw["field"].sinkhorn_tol,
                                      sinkhorn_max_iter=kw["field"].sinkhorn_max_iter)
    tp.simulate(t_max=0.2, dt=0.1, monitor=tp.Monitor(checkpoint=path), warn=False, **kw)
    record = json.loads(str(np.load(path)["meta"]))["body"]["run"]
    return json_digest(record["static"])


def test_fingerprints_of_existing_runs_are_those_of_c9033c2(tmp_path):
    for case, want in GOLDEN.items():
        assert fingerprint(case, tmp_path) == want, case


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps({c: fingerprint(c, Path(tmp)) for c in GOLDEN}, indent=1))
    sys.exit(0)
