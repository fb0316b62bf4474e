"""Tests of the ``transformer-pde`` command line: each subcommand on a tiny configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_pde import cli
from transformer_pde.io.labelled import open_dataset


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_demo_writes_files_and_counts_clusters(tmp_path):
    out = tmp_path / "demo"
    # tiny run: 60 tokens to t = 4 is enough for the co-moving frame to collapse onto
    # the hull vertices (the count is read from the summary, not asserted to a constant)
    assert cli.main(["demo", "--out", str(out), "--n", "60", "--t-max", "4"]) == 0
    for name in ("demo.png", "summary.txt", "summary.json", "trajectory.npz"):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok"
    assert 1 <= s["clusters_final"] < 60
    assert sum(s["cluster_sizes"]) == 60
    assert s["covariance_rank"] in (1, 2)
    assert "final number of clusters" in (out / "summary.txt").read_text()


def test_simulate_summary_counts_clusters_and_rank(tmp_path):
    # V = 0: tokens do not move, so the summary describes the input exactly: three groups of
    # identical points on the line y = 2x -> 3 clusters, covariance rank 1
    X = np.repeat(np.array([[0.0, 0.0], [1.0, 2.0], [-3.0, -6.0]]), [5, 7, 9], axis=0)
    np.save(tmp_path / "x.npy", X)
    cfg = _write(tmp_path, "s.toml", f"""
[attention]
d = 2
V = "zeros"
[tokens]
file = "{tmp_path / 'x.npy'}"
[run]
t_max = 0.2
dt = 0.1
[output]
figure = false
""")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["clusters_final"] == 3
    assert s["covariance_rank"] == 1
    assert not (tmp_path / "o" / "particles.png").exists()


# --------------------------------------------------------------------------- subcommands
def test_simulate_tiny(tmp_path):
    from transformer_pde import load

    cfg = _write(tmp_path, "s.toml", """
[attention]
kind = "softmax"
d = 2
V = -1.0
[tokens]
n = 12
seed = 3
[run]
t_max = 0.5
dt = 0.1
[output]
gif = true
""")
    out = tmp_path / "sim"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == 0
    for name in ("trajectory.npz", "summary.json", "particles.png", "particles.gif"):
        assert (out / name).is_file(), name
    traj = load(out / "trajectory.npz")
    assert traj.states.shape == (6, 12, 2)
    # the tokens are the configured ones: N(0, I) with seed 3
    np.testing.assert_array_equal(traj.states[0], np.random.default_rng(3).normal(size=(12, 2)))
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and s["n_tokens"] == 12


def test_gaussian_tiny_blowup_time_exact(tmp_path):
    # V = I, A = I/sqrt(2): T* = 1 / lambda_max(Sigma0^{1/2} (A + A^T) Sigma0^{1/2})  (exact solution)
    cfg = _write(tmp_path, "g.toml", """
[attention]
d = 2
score_scale = "1/sqrt(d)"
[gaussian]
cov = [[1.0, 0.3], [0.3, 0.5]]
t_max = 2.0
n_eval = 20
""")
    out = tmp_path / "g"
    assert cli.main(["gaussian", cfg, "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    lam = np.linalg.eigvalsh(np.array([[1.0, 0.3], [0.3, 0.5]])).max()
    assert s["status"] == "blowup"
    # solver tolerance 1e-10; the estimate of T* is accurate to ~1e-9 relative
    assert s["blowup_time"] == pytest.approx(1.0 / (np.sqrt(2.0) * lam), rel=1e-7)
    assert s["limit_numerical_rank"] == 1
    z = open_dataset(out / "gaussian.nc")
    assert z["covs"].shape[1:] == (2, 2) and z["time"].values[0] == 0.0
    assert z.attrs["status"] == "blowup" and z.attrs["command"] == "gaussian"
    assert (out / "gaussian.png").is_file()


def test_cone_tiny(tmp_path):
    cfg = _write(tmp_path, "c.toml", """
[attention]
d = 2
V = -1.0
score_scale = "1/sqrt(d)"
[cone]
n = 4
t_max = 1.0
n_eval = 6
color_by = "status"
rank_one_line = [1.0, 0.0]
""")
    out = tmp_path / "c"
    assert cli.main(["cone", cfg, "--out", str(out), "--scheduler", "serial"]) == 0
    z = open_dataset(out / "cone.nc")
    for i in range(4):
        n = int(z["n_times"].values[i])
        times, covs = z["times"].values[i, :n], z["covs"].values[i, :n]
        covs0 = z["covs0"].values[i]
        assert covs.shape == (6, 2, 2) and times[-1] == pytest.approx(1.0)
        np.testing.assert_allclose(covs[0], covs0, rtol=1e-12)
        # V = -I: Sigma' = -sqrt(2) Sigma^2, Sigma(t) = (Sigma0^-1 + sqrt(2) t I)^-1 exactly;
        # solver rtol 1e-10, so 1e-7 leaves room for the dense-output interpolation
        inv0 = np.linalg.inv(covs0)
        exact = np.linalg.inv(inv0 + np.sqrt(2.0) * times[-1] * np.eye(2))
        np.testing.assert_allclose(covs[-1], exact, rtol=1e-7)
    s = json.loads((out / "summary.json").read_text())
    assert sum(s["status_counts"].values()) == 4
    assert (out / "cone.png").is_file()


def test_ranks_tiny(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["ranks", "--dims", "2", "--draws", "4", "--kinds", "softmax",
                     "--values", "identity", "--out", str(out), "-q", "--scheduler",
                     "serial"]) == 0
    s = json.loads((out / "summary.json").read_text())
    (sw,) = s["sweeps"]
    assert sum(sw["rank_counts"]) == 4 and sw["d"] == 2
    z = open_dataset(out / "ranks.nc")
    assert z["rank"].sel(kind="softmax", value="identity", d=2).shape == (4,)
    assert (out / "ranks.png").is_file()


def test_bench_numpy_only(tmp_path, capsys):
    assert cli.main(["bench", "--backends", "numpy", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert {r["task"] for r in res["rows"]} == {"softmax field", "gaussian solve_batch"}
    assert all(r["seconds"] > 0 for r in res["rows"])
    assert "seconds" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["demo", "simulate", "gaussian", "cone", "ranks", "bench"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: transformer-pde" in capsys.readouterr().out


# --------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("text, key", [
    ('[attention]\nd = 2\nQ = "eye"\n', "attention.Q"),
    ('[attention]\nd = 2\nQ = [[1, 2, 3]]\n', "attention.Q"),
    ('[attention]\nd = 2\nbeta = "hot"\n', "attention.beta"),
    ('[attention]\nd = 2\nkind = "cosine"\n', "attention.kind"),
    ('[attention]\nd = 2\nheads = 3\n', "attention.heads"),
    ('[attention]\nd = 2\ncolour = 1\n', "attention.colour"),
    ('[attention]\nd = 2.5\n', "attention.d"),
    ('[attention]\nd = 2\n[tokens]\nn = -1\n', "tokens.n"),
    ('[attention]\nd = 2\n[tokens]\nmean = [0, 0, 0]\n', "tokens.mean"),
    ('[attention]\nd = 2\n[run]\nsolver = "leapfrog"\n', "run.solver"),
    ('[attention]\nd = 2\n[run]\nsolver = {name = "rk4", rtol = 1e-8}\n', "run.solver.rtol"),
    ('[attention]\nd = 2\n[field]\nbackend = "cupyy"\n', "field.backend"),
    ('[attention]\nd = 2\n[limits]\nmax_norm = -1.0\n', "limits.max_norm"),
    ('[attention]\nd = 2\n[run]\nt_max = 0\n', "run.t_max"),
])
def test_config_errors_name_the_key(tmp_path, capsys, text, key):
    cfg = _write(tmp_path, "bad.toml", text)
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert key in err
    assert any(word in err for word in ("expected", "must divide", "unknown key; allowed",
                                        "not an option", "must be"))


def test_config_file_errors(tmp_path, capsys):
    assert cli.main(["gaussian", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    cfg = _write(tmp_path, "broken.toml", "[attention\n")
    assert cli.main(["cone", cfg]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    cfg = _write(tmp_path, "d3.toml", "[attention]\nd = 3\n")
    assert cli.main(["cone", cfg, "--out", str(tmp_path / "o")]) == 2
    assert "attention.d" in capsys.readouterr().err


def test_bench_scripts_runs_each_with_quick(tmp_path, monkeypatch, capfd):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "_helper.py").write_text("raise SystemExit(3)\n")  # private: not run
    (bench / "tiny.py").write_text("import sys\nprint('tiny args', sys.argv[1:])\n")
    assert cli.benchmark_scripts(tmp_path) == [bench / "tiny.py"]
    monkeypatch.setattr(cli.bench, "benchmark_scripts", lambda root=None: [bench / "tiny.py"])
    assert cli.main(["bench", "--scripts"]) == 0
    assert "tiny args ['--quick']" in capfd.readouterr().out
    # a failing script: one line naming it, exit status 4
    (bench / "bad.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setattr(cli.bench, "benchmark_scripts", lambda root=None: [bench / "bad.py"])
    assert cli.main(["bench", "--scripts"]) == cli.ExitCode.ERROR
    assert "bad.py exited with status 3" in capfd.readouterr().err
    monkeypatch.setattr(cli.bench, "benchmark_scripts", lambda root=None: [])
    assert cli.main(["bench", "--scripts"]) == 2


# --------------------------------------------------------------------------- helpers
def test_build_attention_forms():
    att = cli.build_attention({"d": 2, "kind": "l2", "Q": 2.0, "K": {"diag": [1, 3]},
                               "V": [[0, 1], [1, 0]], "score_scale": "1/sqrt(d)",
                               "l2_beta": 1.0})
    P = att.at(0.0)
    np.testing.assert_allclose(P.heads[0].Q, 2.0 / np.sqrt(2) * np.eye(2))
    np.testing.assert_array_equal(P.heads[0].K, np.diag([1.0, 3.0]))
    np.testing.assert_array_equal(P.heads[0].V, [[0.0, 1.0], [1.0, 0.0]])
    assert att.kind == "l2" and att.l2_beta == 1.0
    # random matrices are reproducible from their own seed, orthogonal ones orthogonal
    t = {"d": 3, "Q": {"random": "orthogonal", "seed": 4}, "K": {"random": "normal", "seed": 1}}
    a1, a2 = cli.build_attention(t), cli.build_attention(t)
    np.testing.assert_array_equal(a1.at(0.0).heads[0].K, a2.at(0.0).heads[0].K)
    Qm = a1.at(0.0).heads[0].Q
    np.testing.assert_allclose(Qm @ Qm.T, np.eye(3), atol=1e-12)


def test_build_tokens_distributions():
    X = cli.build_tokens({"n": 500, "distribution": "uniform-ball", "std": 2.0, "seed": 1}, 3)
    assert X.shape == (500, 3) and np.linalg.norm(X, axis=1).max() <= 2.0
    X = cli.build_tokens({"n": 50, "distribution": "uniform-cube", "mean": [1, 1]}, 2)
    assert np.all(np.abs(X - 1.0) <= 1.0)
    C = [[2.0, 0.5], [0.5, 1.0]]
    X = cli.build_tokens({"n": 20000, "cov": C, "seed": 0}, 2)
    # sample covariance of 2e4 draws: standard error ~ 2/sqrt(2e4) = 0.014 -> tolerance 0.06
    np.testing.assert_allclose(np.cov(X.T), C, atol=0.06)


def test_simulate_masked_first_token_fixed(tmp_path):
    # causal softmax, V = I: token 0 (position 0) only sees itself, so it moves with
    # velocity V x_0 = x_0 and x_0(t) = e^t x_0(0) exactly (RK4 with dt = 0.1: ~1e-7 rel.)
    cfg = _write(tmp_path, "m.toml", """
[attention]
d = 2
masked = true
[tokens]
n = 6
[run]
t_max = 0.5
dt = 0.1
[output]
figure = false
""")
    out = tmp_path / "m"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == 0
    from transformer_pde import load

    traj = load(out / "trajectory.npz")
    np.testing.assert_allclose(traj.positions, np.linspace(0, 1, 6))
    np.testing.assert_allclose(traj.final[0], np.exp(0.5) * traj.states[0, 0], rtol=1e-6)
