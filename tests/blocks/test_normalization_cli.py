"""``block.normalization`` in a ``transformer-pde simulate`` configuration: a scheme name or a
table of its options; what does not apply is an error naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import cli, load
from transformer_pde.blocks.normalization import Normalization

CONFIG = """
[attention]
kind = "softmax"
d = 3
[tokens]
n = 5
distribution = "{dist}"
seed = 1
[run]
t_max = 0.2
dt = 0.05
[output]
figure = false
[block]
{block}
"""


def _run(tmp_path, capsys, block, dist="sphere"):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(block=block, dist=dist))
    rc = cli.main(["simulate", str(path), "--out", str(tmp_path / "o"), "-q", "--force"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("block, want", [
    ('normalization = "pre"', Normalization("pre")),
    ('normalization = {scheme = "ngpt", alpha = 0.5}', Normalization("ngpt", alpha=0.5)),
    ('normalization = {scheme = "mix", switch = 0.1}', Normalization("mix", switch=0.1)),
])
def test_scheme_from_the_config_runs_as_the_library(tmp_path, capsys, block, want):
    rc, err = _run(tmp_path, capsys, block)
    assert rc == cli.ExitCode.OK, err
    info = json.loads((tmp_path / "o" / "summary.json").read_text())["info"]
    assert info["normalization"] == want.scheme
    traj = load(tmp_path / "o" / "trajectory.npz")
    ref = tp.simulate(traj.attention, traj.states[0], t_max=0.2, dt=0.05,
                      block=tp.Block(normalization=want))
    np.testing.assert_array_equal(traj.states, ref.states)


@pytest.mark.parametrize("block, key", [
    ('normalization = "middle"', "block.normalization.scheme"),
    ("normalization = 3", "block.normalization"),
    ('normalization = {scheme = "pre", alpha = 0.5}', "block.normalization.alpha"),
    ('normalization = {scheme = "mix"}', "block.normalization"),
    ('normalization = {scheme = "mix", switch = -1.0}', "block.normalization.switch"),
    ('normalization = {scheme = "ngpt", colour = 1}', "block.normalization.colour"),
    ('normalization = "pre"\nconstraint = "sphere"', "block.constraint"),
    ('normalization = "pre"\n[block.layernorm]\nmode = "pre"', "block.layernorm"),
    ('normalization = "pre"\n[block.mlp]\nhidden = 2', "block.mlp"),
])
def test_options_that_do_not_apply_are_errors(tmp_path, capsys, block, key):
    rc, err = _run(tmp_path, capsys, block)
    assert rc == cli.ExitCode.USAGE, err
    assert f"configuration error: {key}" in err
    assert not (tmp_path / "o").exists()


def test_tokens_off_the_sphere_are_refused_for_post(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, 'normalization = "post"', dist="gaussian")
    assert rc != cli.ExitCode.OK
    assert "unit sphere" in err
