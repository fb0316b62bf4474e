"""``transformer-pde warmup``: compiles the named paths, a line per kernel as it starts and
ends (at INFO: expected), a line per path; each path once (older names are aliases);
unknown names are a usage error (exit 2, no traceback)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from transformer_pde import cli
from transformer_pde.backends import compile_notice as cn
from transformer_pde.cli import warmup as wu
from transformer_pde.cli.warmup import WARMUP_PATHS

numba = pytest.importorskip("numba")


def test_warmup_compiles_the_named_paths(capsys):
    assert cli.main(["warmup", "clusters", "gaussian"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.endswith(" s)")
             and " ready " in ln]
    assert [ln.split()[1] for ln in lines] == ["clusters", "gaussian"]
    assert all(ln.startswith("warmup: ") for ln in lines)


class _Levels(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.levels: list[int] = []

    def emit(self, record):
        self.levels.append(record.levelno)


def test_every_kernel_is_said_when_it_starts_and_ends_at_info(monkeypatch, capsys):
    # a fresh package function stands in for a path's kernel: its compilation is said
    # as it starts (before it ends), with its time at the end, at INFO, then the path
    scope: dict = {"__name__": "transformer_pde._warmup_probe"}
    exec("def add_one(x):\n    return x + 1\n", scope)
    kernel = numba.njit(cache=False)(scope["add_one"])
    monkeypatch.setitem(WARMUP_PATHS, "clusters", lambda: kernel(np.ones(2)))
    levels = _Levels()
    logging.getLogger(cn.LOGGER_NAME).addHandler(levels)
    try:
        assert cli.main(["warmup", "clusters"]) == 0
    finally:
        logging.getLogger(cn.LOGGER_NAME).removeHandler(levels)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("warmup: compiling the Numba kernel add_one (float64) for first use "
                      "(cached afterwards: later runs skip this)")
    assert out[1].startswith("warmup: compiled add_one (float64) in ")
    assert out[2].startswith("warmup: clusters ready (") and len(out) == 3
    assert levels.levels == [logging.INFO, logging.INFO]     # expected: never WARNING


def test_each_path_runs_once_and_old_names_are_aliases(monkeypatch):
    calls = []
    monkeypatch.setitem(WARMUP_PATHS, "backend", lambda: calls.append("backend"))
    done = wu.warmup(["particles", "sinkhorn", "backend"])
    assert [name for name, _ in done] == ["backend"] and calls == ["backend"]


def test_warmup_refuses_an_unknown_path(capsys):
    assert cli.main(["warmup", "particle"]) == 2
    err = capsys.readouterr().err
    assert "unknown warmup path" in err and "Traceback" not in err
    assert all(name in err for name in WARMUP_PATHS)


def test_the_harmonic_path_compiles_the_harmonic_kernels(capsys):
    # after it, a harmonic run on the circle and on S^2 with the Numba backend needs no
    # compilation: every kernel of backends.numba.harmonic has a compiled signature
    from transformer_pde.backends.numba import harmonic as nb

    assert cli.main(["warmup", "harmonic"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("warmup: harmonic ready (")
    # the kernels the launchers call (inlined helpers compile inside them)
    for name in ("unit_rows_kernel", "_circle_moments", "_circle_eval",
                 "_sphere_block_moments", "_sphere_eval"):
        assert getattr(nb, name).signatures, name
