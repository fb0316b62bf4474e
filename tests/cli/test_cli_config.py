"""The TOML schema of ``transformer-pde simulate`` follows the library: every solver and its
own options, every backend that exists (and no other), the field options, limits and
Transformer-block options; an option that does not apply is an error naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_pde import cli, load
from transformer_pde.backends import BACKENDS, available_backends
from transformer_pde.integrate.solvers import SOLVERS
from transformer_pde.particles import FieldOptions

BASE = """
[attention]
kind = "{kind}"
d = 2
V = -1.0
[tokens]
n = 6
{tokens}
[run]
t_max = 0.2
dt = 0.1
{run}
[field]
{field}
[limits]
{limits}
[output]
figure = false
{block}
"""


def _cfg(tmp_path, *, kind="softmax", tokens="", run="", field="", limits="", block=""):
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(kind=kind, tokens=tokens, run=run, field=field, limits=limits,
                                block=block))
    return str(path)


def _run(tmp_path, capsys, cfg):
    rc = cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q", "--force"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_every_solver_of_the_library(tmp_path, capsys, solver):
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, run=f'solver = "{solver}"'))
    assert rc == cli.ExitCode.OK, err
    info = json.loads((tmp_path / "o" / "summary.json").read_text())["info"]
    assert SOLVERS[solver]().name in json.dumps(info)


def test_backends_are_those_that_exist(tmp_path, capsys):
    here = set(available_backends())
    for name in [*BACKENDS, "auto"]:
        rc, err = _run(tmp_path, capsys, _cfg(tmp_path, field=f'backend = "{name}"'))
        if name == "auto" or name in here:
            assert rc == cli.ExitCode.OK, err
        else:   # e.g. cupy on a machine without a GPU: one line saying why
            assert rc == cli.ExitCode.ERROR and f"backend={name!r}" in err, err
            assert err.strip().count("\n") == 0, err
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, field='backend = "bogus"'))
    assert rc == cli.ExitCode.USAGE and "field.backend" in err
    for name in BACKENDS:
        assert repr(name) in err


@pytest.mark.parametrize("kwargs, key", [
    ({"run": 'solver = {name = "rk4", rtol = 1e-8}'}, "run.solver.rtol"),  # fixed-step
    ({"run": 'solver = {name = "dopri5", tol = 1e-8}'}, "run.solver.tol"),
    ({"run": 'solver = {name = "dopri5", rtol = -1.0}'}, "run.solver.rtol"),
    ({"run": 'solver = {rtol = 1e-8}'}, "run.solver.name"),
    ({"run": "solver = 4"}, "run.solver"),
    ({"run": 'method = "rk4"'}, "run.method"),                  # moved: names its new place
    ({"run": "rtol = 1e-8"}, "run.rtol"),
    ({"run": 'backend = "numpy"'}, "run.backend"),
    ({"run": "save_every = 0"}, "run.save_every"),
    ({"run": "save_every = 2\nsave_at = [0.1]"}, "run.save_at"),
    ({"run": "save_at = [0.2, 0.1]"}, "run.save_at"),
    ({"field": "sinkhorn_tol = 1e-6"}, "field.sinkhorn_tol"),   # softmax attention
    ({"field": 'dtype = "float16"'}, "field.dtype"),
    ({"field": "colour = 1"}, "field.colour"),
    ({"limits": "max_steps = 1.5"}, "limits.max_steps"),
    ({"limits": "max_steps = 0"}, "limits.max_steps"),
    ({"limits": "max_steps = 1"}, "run.dt"),                    # 2 steps > 1, refused up front
    ({"limits": "max_memory = 100.0"}, "run.save_every"),       # saved states > 100 bytes
    ({"run": "save_at = [0.1]", "limits": "max_memory = 10.0"}, "run.save_at"),
    ({"block": '[block]\nsplitting = "lie"'}, "block.splitting"),  # no MLP to split
    ({"block": '[block]\nconstraint = "torus"'}, "block.constraint"),
    ({"block": "[block.mlp]\nhidden = 0"}, "block.mlp.hidden"),
    ({"block": "[block.mlp]\nW1 = [[1.0, 2.0]]\nhidden = 3"}, "block.mlp.W1"),
    ({"block": '[block.mlp]\nactivation = "tanh"'}, "block.mlp.activation"),
    ({"block": '[block.layernorm]\nmode = "middle"'}, "block.layernorm.mode"),
    ({"block": "[block.layernorm]\nvariance = -1.0"}, "block.layernorm.variance"),
    ({"block": "[block.layernorm]\ncolour = 1"}, "block.layernorm.colour"),
    ({"block": '[block]\nconstraint = "sphere"\n[block.layernorm]\nmode = "post"',
      "tokens": 'distribution = "sphere"'}, "block"),           # two constraints
    # an adaptive solver takes constraint = "sphere" alone, not an MLP
    ({"run": 'solver = "dopri5"', "block": '[block]\nconstraint = "sphere"\n[block.mlp]',
      "tokens": 'distribution = "sphere"'}, "run.solver"),
    ({"block": '[block]\nconstraint = "sphere"'}, "tokens"),    # tokens not on the sphere
    ({"tokens": 'distribution = "sphere"\nstd = 2.0'}, "tokens.std"),
    ({"tokens": 'file = "x.npy"'}, "tokens.n"),                # n does not apply to a file
])
def test_options_that_do_not_apply_are_errors(tmp_path, capsys, kwargs, key):
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, **kwargs))
    assert rc == cli.ExitCode.USAGE, err
    assert f"configuration error: {key}" in err
    assert not (tmp_path / "o").exists()


def test_solver_field_and_limit_options_where_they_apply(tmp_path, capsys):
    cfg = _cfg(tmp_path, run='solver = {name = "dopri5", rtol = 1e-8, atol = 1e-11}\n'
                             "save_at = [0.05, 0.2]",
               field='dtype = "float32"', limits="max_norm = 1e6\nmax_steps = 5000")
    rc, err = _run(tmp_path, capsys, cfg)
    assert rc == cli.ExitCode.OK, err
    traj = load(tmp_path / "o" / "trajectory.npz")
    assert traj.states.dtype == np.float32
    np.testing.assert_allclose(traj.times, [0.05, 0.2])  # SaveAt(ts): exactly these times
    # the CLI passes exactly these options: the same run through the Python API is identical
    import transformer_pde as tp
    from transformer_pde.integrate import Dopri5, Limits, SaveAt

    X0 = np.random.default_rng(0).normal(size=(6, 2))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), -np.eye(2))
    ref = tp.simulate(att, X0, t_max=0.2, dt=0.1, solver=Dopri5(rtol=1e-8, atol=1e-11),
                      saveat=SaveAt(ts=[0.05, 0.2]), field=FieldOptions(dtype="float32"),
                      limits=Limits(max_norm=1e6, max_steps=5000))
    np.testing.assert_array_equal(traj.states, ref.states)
    assert traj.info["n_steps"] == ref.info["n_steps"]
    cfg = _cfg(tmp_path, run='solver = {name = "implicit_midpoint", tol = 1e-12}')
    rc, err = _run(tmp_path, capsys, cfg)
    assert rc == cli.ExitCode.OK, err
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, kind="sinkhorn",
                                          field="sinkhorn_tol = 1e-7\nsinkhorn_max_iter = 500"))
    assert rc == cli.ExitCode.OK, err


def test_field_keys_follow_the_library(tmp_path, capsys):
    import inspect

    path = _cfg(tmp_path, field="not_a_key = 1")
    rc, err = _run(tmp_path, capsys, path)
    assert rc == cli.ExitCode.USAGE
    for name in inspect.signature(FieldOptions).parameters:
        assert name in err


def test_block_on_the_sphere(tmp_path, capsys):
    cfg = _cfg(tmp_path, tokens='distribution = "sphere"', run='solver = "heun"',
               block='[block]\nconstraint = "sphere"\nsplitting = "strang"\n'
                     '[block.mlp]\nhidden = 4\nseed = 2\n[block.layernorm]\nmode = "pre"')
    rc, err = _run(tmp_path, capsys, cfg)
    assert rc == cli.ExitCode.OK, err
    traj = load(tmp_path / "o" / "trajectory.npz")
    # the retraction keeps every token on the unit sphere to rounding
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-14)
    info = json.loads((tmp_path / "o" / "summary.json").read_text())["info"]
    assert info["constraint"] == "sphere" and info["splitting"] == "strang"
    assert info["layernorm"] == "pre"


def test_token_file_relative_to_the_config(tmp_path, capsys):
    X = np.arange(12.0).reshape(6, 2) / 10
    np.save(tmp_path / "x.npy", X)
    path = tmp_path / "c.toml"
    path.write_text('[attention]\nd = 2\nV = "zeros"\n[tokens]\nfile = "x.npy"\n'
                    "[run]\nt_max = 0.1\ndt = 0.1\n[output]\nfigure = false\n")
    rc, err = _run(tmp_path, capsys, str(path))
    assert rc == cli.ExitCode.OK, err
    np.testing.assert_array_equal(load(tmp_path / "o" / "trajectory.npz").states[0], X)


def test_attention_keys_follow_the_library(tmp_path, capsys):
    # every keyword of Attention with a scalar default is a key of [attention]
    import inspect

    from transformer_pde import Attention

    params = [p for p in inspect.signature(Attention).parameters.values()
              if isinstance(p.default, (bool, int, float, str))]
    assert {"heads", "masked", "beta", "eps", "l2_beta"} <= {p.name for p in params}
    path = tmp_path / "c.toml"
    path.write_text("[attention]\nd = 2\nnot_a_key = 1\n")
    rc, err = _run(tmp_path, capsys, str(path))
    assert rc == cli.ExitCode.USAGE
    for p in params:
        assert p.name in err


@pytest.mark.parametrize("command, table, key, value", [
    ("gaussian", "gaussian", "convergence", '"bogus"'),
    ("gaussian", "gaussian", "rtol", "-1.0"),
    ("gaussian", "gaussian", "bogus", "1"),
    ("cone", "cone", "converge_tol", "0.0"),
    ("cone", "cone", "convergence", "3"),
    ("ranks", "ranks", "solver_rtol", "-1e-6"),
    ("ranks", "ranks", "draws", "0"),
    ("ranks", "ranks", "rtol", "2.0"),
])
def test_gaussian_options_follow_the_library(tmp_path, capsys, command, table, key, value):
    # [gaussian] and [cone] take the keywords of gaussian.solve, [ranks] those of
    # paper.rank_sweep, with the library's defaults; a bad value names its key
    path = tmp_path / "c.toml"
    path.write_text(f"[attention]\nd = 2\n[{table}]\n{key} = {value}\n" if command != "ranks"
                    else f"[{table}]\n{key} = {value}\ndims = [2]\n")
    rc = cli.main([command, str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == cli.ExitCode.USAGE, err
    assert f"{table}.{key}" in err
    assert not (tmp_path / "o").exists()


def test_gaussian_defaults_are_the_library_defaults(tmp_path):
    # no solver option in the file: the CLI run equals gaussian.solve with its own defaults
    from transformer_pde import Attention, gaussian

    path = tmp_path / "c.toml"
    path.write_text("[attention]\nd = 2\nV = -1.0\n[gaussian]\nt_max = 0.5\nn_eval = 3\n"
                    "cov = [[1.0, 0.2], [0.2, 0.5]]\n")
    assert cli.main(["gaussian", str(path), "--out", str(tmp_path / "o")]) == cli.ExitCode.OK
    ref = gaussian.solve(Attention("softmax", np.eye(2), np.eye(2), -np.eye(2)), np.zeros(2),
                         np.array([[1.0, 0.2], [0.2, 0.5]]), t_max=0.5,
                         t_eval=np.linspace(0.0, 0.5, 3))
    from transformer_pde.io.labelled import open_dataset

    np.testing.assert_array_equal(open_dataset(tmp_path / "o" / "gaussian.nc")["covs"].values,
                                  ref.covs)


@pytest.mark.parametrize("name", [[], {}, 3, None])
def test_solver_table_with_a_name_of_the_wrong_type_is_a_config_error(name):
    from transformer_pde.cli.builders import build_solver
    from transformer_pde.errors import ConfigError

    with pytest.raises(ConfigError, match=r"run\.solver\.name"):
        build_solver({"name": name}, "run.solver")


@pytest.mark.parametrize("t_max, dt, run, field, limits", [
    (0.07, 0.01, "", "", "max_steps = 7"),     # t_max / dt = 7.000000000000001: 7 steps
    (0.07, 0.01, "", "", "max_steps = 6"),
    (0.3, 0.1, "", "", "max_steps = 3"),
    (0.2, 0.1, "save_at = [0.05, 0.15]", "", "max_steps = 4"),   # segments end at saves
    (0.2, 0.1, "save_at = [0.05, 0.15]", "", "max_steps = 3"),
    (0.07, 0.01, "", 'dtype = "float32"', "max_memory = 384.0"),  # 8 states x 12 x 4 bytes
    (0.07, 0.01, "", 'dtype = "float32"', "max_memory = 383.0"),
    (0.07, 0.01, "save_every = 3", "", "max_memory = 384.0"),     # 4 states x 12 x 8 bytes
    (0.07, 0.01, "save_every = 3", "", "max_memory = 383.0"),
])
def test_cli_refuses_exactly_the_runs_the_library_refuses(tmp_path, capsys, t_max, dt, run,
                                                          field, limits):
    """The step and memory preflight of ``simulate`` is the library's: a configuration
    runs from the command line exactly when the same ``simulate`` call runs, with as many
    steps; a refused one names its key before anything is written."""
    import transformer_pde as tp
    from transformer_pde.cli.builders import build_simulate
    from transformer_pde.cli.config import load_config

    text = BASE.format(kind="softmax", tokens="", run=run, field=field, limits=limits,
                       block="").replace("t_max = 0.2\ndt = 0.1",
                                         f"t_max = {t_max!r}\ndt = {dt!r}")
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(text)
    cfg = load_config(cfg_path)
    att = tp.Attention("softmax", np.eye(2), np.eye(2), -np.eye(2))
    opts = build_simulate(cfg, att)
    X0 = np.random.default_rng(0).normal(size=(6, 2))
    try:
        ref = tp.simulate(att, X0, **opts)
    except tp.errors.ArgumentError:
        ref = None
    rc, err = _run(tmp_path, capsys, str(cfg_path))
    if ref is None:
        assert rc == cli.ExitCode.USAGE, err
        assert ("configuration error: run.dt" in err or "configuration error: run.save" in err), err
        assert not (tmp_path / "o").exists()
    else:
        assert rc == cli.ExitCode.OK, err
        traj = load(tmp_path / "o" / "trajectory.npz")
        assert traj.info["n_steps"] == ref.info["n_steps"]
        np.testing.assert_array_equal(traj.times, ref.times)


@pytest.mark.parametrize("sysconf, cli_limit, run_limit", [
    ({"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}, 4096000, 2048000.0),
    ({"SC_PHYS_PAGES": 10 ** 7, "SC_PAGE_SIZE": 4096}, 4096 * 10 ** 7, 8.0 * 2 ** 30),
    (None, 1 << 40, 8.0 * 2 ** 30),               # the platform does not report it
    ({"SC_PHYS_PAGES": -1, "SC_PAGE_SIZE": 4096}, 1 << 40, 8.0 * 2 ** 30),
])
def test_memory_checks_read_one_physical_memory(monkeypatch, sysconf, cli_limit, run_limit):
    """The configuration's size check refuses exactly what exceeds the physical memory
    (1 TiB where it cannot be read), and ``Limits.memory_limit`` is the smaller of 8 GiB
    and half of the same reading (8 GiB where it cannot be read)."""
    import os

    from transformer_pde import Limits
    from transformer_pde.cli.config import check_memory
    from transformer_pde.errors import ConfigError

    def fake(name):
        if sysconf is None:
            raise ValueError(f"unsupported configuration name: {name}")
        return sysconf[name]

    monkeypatch.setattr(os, "sysconf", fake)
    assert Limits().memory_limit() == run_limit
    check_memory("tokens.n", cli_limit, "the tokens")
    with pytest.raises(ConfigError, match=r"^tokens\.n: the tokens would need .* more than "
                                          r"this machine's"):
        check_memory("tokens.n", cli_limit + 1, "the tokens")
