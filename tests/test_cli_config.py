"""The TOML schema of ``transformer-pde simulate`` follows the library: every method, every
backend that exists (and no other), the Transformer-block options; an option that does not
apply is an error naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_pde import cli, load
from transformer_pde.backends import BACKENDS
from transformer_pde.integrate.solvers import SOLVERS

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
[output]
figure = false
{block}
"""


def _cfg(tmp_path, *, kind="softmax", tokens="", run="", block=""):
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(kind=kind, tokens=tokens, run=run, block=block))
    return str(path)


def _run(tmp_path, capsys, cfg):
    rc = cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q", "--force"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("method", sorted(SOLVERS))
def test_every_method_of_the_library(tmp_path, capsys, method):
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, run=f'method = "{method}"'))
    assert rc == cli.ExitCode.OK, err
    info = json.loads((tmp_path / "o" / "summary.json").read_text())["info"]
    assert info["method"] == SOLVERS[method]().name


def test_backends_are_those_that_exist(tmp_path, capsys):
    for name in [*BACKENDS, "auto"]:
        rc, err = _run(tmp_path, capsys, _cfg(tmp_path, run=f'backend = "{name}"'))
        assert rc == cli.ExitCode.OK, err
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, run='backend = "bogus"'))
    assert rc == cli.ExitCode.USAGE and "run.backend" in err
    for name in BACKENDS:
        assert repr(name) in err


@pytest.mark.parametrize("kwargs, key", [
    ({"run": "rtol = 1e-8"}, "run.rtol"),                      # fixed-step method
    ({"run": "atol = 1e-8"}, "run.atol"),
    ({"run": "sinkhorn_tol = 1e-6"}, "run.sinkhorn_tol"),      # softmax attention
    ({"run": "save_every = 0"}, "run.save_every"),
    ({"run": "max_steps = 1.5"}, "run.max_steps"),
    ({"block": '[block]\nsplitting = "lie"'}, "block.splitting"),  # no MLP to split
    ({"block": '[block]\nconstraint = "torus"'}, "block.constraint"),
    ({"block": "[block.mlp]\nhidden = 0"}, "block.mlp.hidden"),
    ({"block": "[block.mlp]\nW1 = [[1.0, 2.0]]\nhidden = 3"}, "block.mlp.W1"),
    ({"block": '[block.mlp]\nactivation = "tanh"'}, "block.mlp"),
    ({"block": '[block.layernorm]\nmode = "middle"'}, "block.layernorm"),
    ({"block": "[block.layernorm]\nvariance = -1.0"}, "block.layernorm"),
    ({"block": "[block.layernorm]\ncolour = 1"}, "block.layernorm.colour"),
    ({"run": 'method = "dopri5"', "block": '[block]\nconstraint = "sphere"',
      "tokens": 'distribution = "sphere"'}, "run.method"),
    ({"block": '[block]\nconstraint = "sphere"'}, "tokens"),    # tokens not on the sphere
    ({"tokens": 'distribution = "sphere"\nstd = 2.0'}, "tokens.std"),
    ({"tokens": 'file = "x.npy"'}, "tokens.n"),                # n does not apply to a file
])
def test_options_that_do_not_apply_are_errors(tmp_path, capsys, kwargs, key):
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, **kwargs))
    assert rc == cli.ExitCode.USAGE, err
    assert f"configuration error: {key}" in err
    assert not (tmp_path / "o").exists()


def test_adaptive_and_sinkhorn_options_where_they_apply(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, run='method = "dopri5"\nrtol = 1e-8'))
    assert rc == cli.ExitCode.OK, err
    rc, err = _run(tmp_path, capsys, _cfg(tmp_path, kind="sinkhorn",
                                          run="sinkhorn_tol = 1e-7\nsinkhorn_max_iter = 500"))
    assert rc == cli.ExitCode.OK, err


def test_block_on_the_sphere(tmp_path, capsys):
    cfg = _cfg(tmp_path, tokens='distribution = "sphere"', run='method = "heun"',
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
