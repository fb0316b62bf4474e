"""``[field] method = "harmonic"`` of ``transformer-pde simulate``: a run from a
configuration equals the library's direct-field run, and every value that does not apply
is refused naming its key, without a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import cli

BASE = """
[attention]
kind = "softmax"
d = 2
beta = 4.0
[tokens]
n = 40
seed = 3
distribution = "sphere"
[run]
t_max = 0.5
dt = 0.05
[block]
constraint = "sphere"
[output]
figure = false
"""

CIRCLE = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=4.0)


def _write(tmp_path, text):
    p = tmp_path / "harmonic.toml"
    p.write_text(text)
    return str(p)


def _run(tmp_path, text):
    out = tmp_path / "o"
    assert cli.main(["simulate", _write(tmp_path, text), "--out", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    return summary, tp.load(out / "trajectory.npz")


def test_a_harmonic_run_from_a_configuration_is_the_direct_field_run(tmp_path):
    summary, traj = _run(tmp_path, BASE.replace("dt = 0.05", "dt = 0.0125")
                         + '[field]\nmethod = "harmonic"\nharmonic_tol = 1e-12\n')
    info = summary["info"]
    assert info["harmonic_modes"] > 0 and info["harmonic_direct_queries"] == 0
    assert info["n_steps"] == 40
    ref = tp.simulate(CIRCLE, traj.states[0], t_max=0.5, dt=0.0125,
                      block=tp.Block(constraint=tp.Sphere()),
                      field=tp.FieldOptions(method="direct", backend="numpy"))
    # on the circle the harmonic field is the direct one to harmonic_tol = 1e-12; at the
    # RK4 stage points off it, it is the field at the radial projection, so the two runs
    # are two RK4 discretisations of one flow on the circle and differ by O(dt^4)
    # (measured: 4.6e-10 at dt = 0.05, 2.9e-11 at 0.025, so ~2e-12 at dt = 0.0125);
    # 1e-10 leaves a margin of 50 and is far below what a wrong mode or sign would give
    np.testing.assert_allclose(traj.states, ref.states, rtol=0, atol=1e-10)


def test_an_adaptive_solver_takes_the_sphere_block_with_the_harmonic_field(tmp_path):
    text = BASE.replace("dt = 0.05", 'dt = 0.05\nsolver = {name = "dop853", rtol = 1e-10, '
                        'atol = 1e-12}\nsave_at = [0.0, 0.5]')
    summary, traj = _run(tmp_path, text + '[field]\nmethod = "harmonic"\n')
    assert summary["info"]["method"] == "dop853"
    ref = tp.simulate(CIRCLE, traj.states[0], t_max=0.5, dt=0.05,
                      solver=tp.integrate.SOLVERS["dop853"](rtol=1e-10, atol=1e-12),
                      saveat=tp.SaveAt(ts=[0.0, 0.5]), block=tp.Block(constraint=tp.Sphere()),
                      field=tp.FieldOptions(method="direct", backend="numpy"))
    # both runs are within the solver's tolerances (rtol 1e-10) of the exact flow on the
    # circle (measured difference: 3e-14, both in 4 steps); their step sequences could
    # differ, so 1e-8 (100x the tolerance) is the bound, far below a wrong field's O(1e-2)
    np.testing.assert_allclose(traj.states[-1], ref.states[-1], rtol=0, atol=1e-8)


@pytest.mark.parametrize("edit, key, words", [
    ('[field]\nmethod = "harmnic"\n', "field.method", "expected one of 'direct', 'harmonic'"),
    ("[field]\nmethod = 2\n", "field.method", "expected one of"),
    ("[field]\nharmonic_tol = 1e-10\n", "field.harmonic_tol", "method = 'harmonic'"),
    ('[field]\nmethod = "direct"\nharmonic_tol = 1e-10\n', "field.harmonic_tol",
     "method = 'harmonic'"),
    ('[field]\nmethod = "harmonic"\nharmonic_tol = -1.0\n', "field.harmonic_tol", "> 0"),
    ('[field]\nmethod = "harmonic"\nharmonic_tol = "small"\n', "field.harmonic_tol",
     "expected a number"),
    ('[field]\nmethod = "harmonic"\nmethods = 1\n', "field.methods", "did you mean 'method'"),
    ('[field]\nmethod = "harmonic"\ndtype = "float32"\n', "field.dtype", "runs in float64"),
])
def test_bad_field_values_are_named(tmp_path, capsys, edit, key, words):
    cfg = _write(tmp_path, BASE + edit)
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"configuration error: {key}: " in err and words in err, err
    assert "Traceback" not in err and not (tmp_path / "o" / "trajectory.npz").exists()


@pytest.mark.parametrize("old, new, words", [
    ('[block]\nconstraint = "sphere"\n', "", "constraint = 'sphere'"),
    ('constraint = "sphere"\n', 'constraint = "sphere"\n[block.layernorm]\nmode = "pre"\n',
     "constraint = 'sphere'"),
    ("d = 2", "d = 4", "d=4"),
    ('kind = "softmax"', 'kind = "linear"', "kind='linear'"),
    ("beta = 4.0", 'beta = 4.0\nV = {random = "normal"}', "V is neither I nor -I"),
    ("beta = 4.0", "beta = 4.0\nheads = 2", "heads=2"),
])
def test_the_harmonic_field_of_another_flow_is_refused(tmp_path, capsys, old, new, words):
    assert old in BASE
    cfg = _write(tmp_path, BASE.replace(old, new) + '[field]\nmethod = "harmonic"\n')
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: field.method: " in err and words in err, err
    assert "Traceback" not in err


def test_an_adaptive_solver_with_more_than_the_sphere_is_refused(tmp_path, capsys):
    text = BASE.replace("dt = 0.05", 'dt = 0.05\nsolver = "dopri5"') + \
        "[block.mlp]\nhidden = 2\n"
    assert cli.main(["simulate", _write(tmp_path, text), "--out", str(tmp_path / "o"),
                     "-q"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: run.solver: " in err and "fixed-step" in err, err


def test_the_simulate_template_names_the_field_and_noise_keys():
    # the commented defaults of examples/configs/simulate.toml are the library's, and its
    # commented [noise] table lists exactly the keys the command reads
    import re
    from pathlib import Path

    from transformer_pde.cli.builders import NOISE_KEYS
    from transformer_pde.fields.harmonic import DEFAULT_HARMONIC_TOL

    text = (Path(__file__).resolve().parents[2] / "examples" / "configs"
            / "simulate.toml").read_text()
    assert float(re.search(r"# harmonic_tol = (\S+)", text).group(1)) == DEFAULT_HARMONIC_TOL
    assert re.search(r'# method = "direct" ', text)
    noise = text[text.index("# [noise]"):text.index("[output]")]
    assert set(re.findall(r"^# (\w+) = ", noise, flags=re.M)) == set(NOISE_KEYS)


def test_the_method_in_the_run_table_points_to_the_field_table(tmp_path, capsys):
    cfg = _write(tmp_path, BASE.replace("dt = 0.05", 'dt = 0.05\nmethod = "harmonic"'))
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "run.method: unknown key; the field's method 'harmonic' is field.method" in \
        capsys.readouterr().err


def test_a_noisy_run_takes_the_harmonic_field(tmp_path):
    # the same Brownian path (seed, path) with either field: two Euler-Maruyama runs whose
    # drifts agree to harmonic_tol on the circle (the scheme evaluates the field at the
    # tokens, which stay on it): the states agree to 1e-12 (measured: 3e-16)
    noise = '[noise]\nsigma = 0.3\nseed = 5\n'
    _, harmonic = _run(tmp_path, BASE + noise + '[field]\nmethod = "harmonic"\n')
    ref = tp.simulate(CIRCLE, harmonic.states[0], t_max=0.5, dt=0.05,
                      solver="euler_maruyama", noise=tp.Noise(sigma=0.3, seed=5),
                      block=tp.Block(constraint=tp.Sphere()),
                      field=tp.FieldOptions(backend="numpy"))
    np.testing.assert_allclose(harmonic.states, ref.states, rtol=0, atol=1e-12)
