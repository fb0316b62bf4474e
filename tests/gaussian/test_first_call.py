"""A first small ``solve_batch`` does not wait for its kernel's compiler: while the kernel
is neither compiled nor cached it runs the same integrator in the interpreter (results equal
to rounding) and the kernel compiles on the background thread."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.gaussian import batch

ATT = tp.Attention("softmax", np.array([[0.4, 0.1], [-0.2, 0.6]]), np.eye(2), np.eye(2))
COVS = np.array([[[0.6, 0.1], [0.1, 0.4]], [[0.3, 0.0], [0.0, 0.7]], [[1.0, 0.2], [0.2, 0.5]]])


def _solve(**kw):
    return tp.gaussian.solve_batch(ATT, np.zeros((3, 2)), COVS, t_max=5.0,
                                   t_eval=np.linspace(0, 5, 6), warn=False, **kw)


def test_a_small_batch_runs_interpreted_while_its_kernel_compiles(monkeypatch):
    compiled = _solve()
    calls = []

    def not_ready(key, kernels, job):
        calls.append(key)
        return False                    # the background thread has not finished

    monkeypatch.setattr(batch.compile_notice, "ready_or_background", not_ready)
    waiting = _solve()
    assert calls == ["solve_batch kernel (softmax / linear)"]
    # the same integrator, interpreted: the same statuses, states equal to rounding (a
    # step decision on the edge of the tolerance may flip with the last bits: one step)
    np.testing.assert_array_equal(waiting.status, compiled.status)
    assert np.all(np.abs(waiting.n_steps - compiled.n_steps) <= 1)
    np.testing.assert_allclose(waiting.traj_covs, compiled.traj_covs, rtol=1e-12, atol=1e-14)


def test_large_batches_and_explicit_choices_do_not_fall_back(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("no fallback expected")

    monkeypatch.setattr(batch.compile_notice, "ready_or_background", fail)
    _solve(use_numba=False)
    covs = np.repeat(COVS[:1], batch._INTERPRET_WHILE_COMPILING + 1, axis=0)
    tp.gaussian.solve_batch(ATT, np.zeros((covs.shape[0], 2)), covs, t_max=0.5, warn=False)


@pytest.mark.parametrize("general", [False, True])
def test_compile_kernel_compiles_without_falling_back(general, monkeypatch):
    monkeypatch.setattr(batch.compile_notice, "ready_or_background",
                        lambda *a: pytest.fail("compile_kernel must compile, not fall back"))
    batch.compile_kernel(general)
