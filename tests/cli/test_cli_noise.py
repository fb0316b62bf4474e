"""The ``[noise]`` table of ``transformer-pde simulate``: a stochastic run from a
configuration, equal to the library call, and every bad value named by its key."""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import cli

BASE = """
[attention]
kind = "softmax"
d = 3
[tokens]
n = 8
seed = 1
distribution = "sphere"
[run]
t_max = 0.4
dt = 0.05
[block]
constraint = "sphere"
[output]
figure = false
"""


def _write(tmp_path, text):
    p = tmp_path / "noisy.toml"
    p.write_text(text)
    return str(p)


def test_a_noisy_run_from_a_configuration_is_the_library_run(tmp_path):
    A = np.array([[0.0, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    np.save(tmp_path / "A.npy", A)
    cfg = _write(tmp_path, BASE + """
[noise]
sigma = 0.3
common = "A.npy"
convention = "ito"
seed = 7
path = 2
system = 3
solver = "heun_stratonovich"
""")
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok"
    noise = s["info"]["noise"]
    assert (noise["sigma"], noise["convention"], noise["seed"], noise["path"], noise["system"],
            noise["solver"]) == (0.3, "ito", 7, 2, 3, "heun_stratonovich")
    traj = tp.load(out / "trajectory.npz")
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3))
    ref = tp.simulate(att, traj.states[0], t_max=0.4, dt=0.05, solver="heun_stratonovich",
                      noise=tp.Noise(sigma=0.3, common=A, convention="ito", seed=7, path=2,
                                     system=3),
                      block=tp.Block(constraint=tp.Sphere()))
    np.testing.assert_allclose(traj.states, ref.states, rtol=0, atol=1e-12)


def test_inline_common_matrices(tmp_path):
    cfg = _write(tmp_path, BASE + "[noise]\ncommon = [[0, 1, 0], [-1, 0, 0], [0, 0, 0]]\n")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["info"]["noise"]["n_common"] == 1 and s["info"]["method"] == "euler_maruyama"


@pytest.mark.parametrize("table, key", [
    ("sigma = -1.0", "noise.sigma"),
    ('sigma = "a lot"', "noise.sigma"),
    ('convention = "ito-ish"', "noise.convention"),
    ("seed = 1.5", "noise.seed"),
    ("path = -1", "noise.path"),
    ("system = -2", "noise.system"),
    ("base_dt = 0.03", "run.dt"),
    ('solver = "rk4"', "noise.solver"),
    ('solver = "milstein"', "noise.solver"),
    ("common = [[1, 0], [0, 1]]", "noise.common"),
    ('common = "missing.npy"', "noise.common"),
    ("sigmaa = 0.1", "noise.sigmaa"),
])
def test_bad_noise_values_are_named_without_a_traceback(tmp_path, capsys, table, key):
    cfg = _write(tmp_path, BASE + "[noise]\n" + table + "\n")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_run_solver_and_the_grid_with_noise(tmp_path, capsys):
    cfg = _write(tmp_path, BASE.replace("dt = 0.05", 'dt = 0.05\nsolver = "rk4"')
                 + "[noise]\nsigma = 0.1\n")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "run.solver" in capsys.readouterr().err
    cfg = _write(tmp_path, BASE.replace("t_max = 0.4", "t_max = 0.42") + "[noise]\nsigma = 0.1\n")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "run.t_max" in capsys.readouterr().err
