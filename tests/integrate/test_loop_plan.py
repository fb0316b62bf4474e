"""The step rule, the run plan and the step-size controllers of the one time loop.

A fixed-step run takes ``n_fixed_steps`` steps per segment (the count relative to the
step, so ``t_max=0.07, dt=0.01`` is 7 steps, not ceil(7.000000000000001) = 8), the last
one landing exactly on the stop; ``planned_steps`` / ``planned_saves`` / ``preflight`` are
the counts and refusals ``simulate`` itself follows; the constant and PI controllers speak
one protocol (propose, accept, reject) over the loop state."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import integrate
from transformer_pde.errors import ArgumentError
from transformer_pde.integrate import (ConstantStepSize, LoopState, PIController, TimeLoop,
                                       n_fixed_steps, planned_saves, planned_steps, preflight)
from transformer_pde.integrate.controller import pi_factor

ATT = tp.Attention("softmax", np.eye(2), np.eye(2), np.array([[0.3, -1.0], [1.0, 0.2]]))
X0 = np.random.default_rng(5).normal(size=(7, 2))


@pytest.mark.parametrize("t_max, dt, steps", [(0.07, 0.01, 7), (1.0, 0.3, 4), (1.0, 0.1, 10),
                                              (1e-11, 1e-13, 100), (0.5, 1.0, 1)])
def test_fixed_step_count_is_relative_to_the_step(t_max, dt, steps):
    assert n_fixed_steps(t_max, dt) == steps
    assert planned_steps(t_max, dt) == steps
    tr = tp.simulate(ATT, X0, t_max=t_max, dt=dt, solver="euler")
    assert tr.info["n_steps"] == steps and len(tr.times) == steps + 1
    assert tr.times[-1] == t_max   # the last step lands exactly on t_max


def test_the_library_count_differs_from_a_naive_ceil():
    assert math.ceil(0.07 / 0.01) == 8 and planned_steps(0.07, 0.01) == 7


def test_plan_matches_what_a_run_does():
    saveat = tp.SaveAt(ts=[0.0, 0.25, 0.33, 1.0])
    assert planned_steps(1.0, 0.1, saveat) == 3 + 1 + 7   # segments 0.25, 0.08, 0.67
    for sa, solver in [(saveat, "rk4"), (tp.SaveAt(every=3), "heun"),
                       (tp.SaveAt(every=2), "dopri5"), (tp.SaveAt(ts=[0.5, 0.9]), "dopri5")]:
        adaptive = solver == "dopri5"
        tr = tp.simulate(ATT, X0, t_max=1.0, dt=0.1, solver=solver, saveat=sa)
        assert len(tr.times) == planned_saves(1.0, 0.1, sa, adaptive=adaptive)
        if not adaptive:
            assert tr.info["n_steps"] == planned_steps(1.0, 0.1, sa)
    assert planned_steps(1.0, 0.1, adaptive=True) is None


def test_preflight_refuses_what_simulate_refuses():
    cases = [dict(t_max=5.0, dt=0.1, limits=tp.Limits(max_steps=12)),
             dict(t_max=1.0, dt=0.1, limits=tp.Limits(max_memory=100))]
    for kw in cases:
        with pytest.raises(ArgumentError) as lib:
            tp.simulate(ATT, X0, solver="rk4", **kw)
        with pytest.raises(ArgumentError) as pre:
            preflight(kw["t_max"], kw["dt"], saveat=tp.SaveAt(), limits=kw["limits"],
                      adaptive=False, state_shape=X0.shape, dtype=np.float64)
        assert str(pre.value) == str(lib.value)
    # exactly the budget is allowed; a statistic is never refused for memory
    preflight(1.0, 0.1, saveat=tp.SaveAt(fn=lambda t, X, w: X.sum()),
              limits=tp.Limits(max_steps=10, max_memory=1), adaptive=False,
              state_shape=(10 ** 6, 100), dtype=np.float64)
    assert "preflight" in integrate.__all__ and "planned_steps" in integrate.__all__


def test_time_loop_refuses_a_fixed_step_run_over_its_budget():
    loop = TimeLoop(tp.RK4(), lambda t, y, left, stage: -y, t_max=1.0, dt=0.1,
                    saveat=tp.SaveAt(), limits=tp.Limits(max_steps=9), tables=(), xp=np,
                    save=lambda t, y: None)
    with pytest.raises(ArgumentError, match="needs 10 steps"):
        loop.run(loop.initial_state(np.ones(2)))


def test_constant_step_size_cuts_a_segment_and_lands_on_its_end():
    ctrl, st = ConstantStepSize(0.3), LoopState(t=0.0, h=0.3)
    steps = []
    while True:
        step = ctrl.propose(st, 1.0, True)
        steps.append(step)
        assert ctrl.reject(st, step, 0.0) is None   # never retried
        ctrl.accept(st, step, 0.0)
        st.t = step.t_end
        if step.lands:
            break
    assert [s.h for s in steps[:3]] == [0.3, 0.3, 0.3]
    assert math.isclose(steps[-1].h, 0.1) and steps[-1].t_end == 1.0
    assert [s.final for s in steps] == [False, False, False, True]
    assert st.steps_left is None   # the next segment is counted afresh


def test_pi_controller_protocol_follows_the_pi_rule():
    ctrl = PIController(4)
    st = LoopState(t=0.0, h=0.2)
    step = ctrl.propose(st, 0.5, False)
    assert (step.h, step.lands, step.final) == (0.2, False, False)
    assert ctrl.propose(st, 0.15, False).lands    # clipped to the target, lands on it
    fac, prev = pi_factor(0.5, 1.0, True, ctrl.alpha, ctrl.beta, ctrl.safety, ctrl.fmin,
                          ctrl.fmax)
    ctrl.accept(st, step, 0.5)
    assert st.h == 0.2 * fac and st.err_prev == prev
    h_before, prev_before = st.h, st.err_prev
    retry = ctrl.reject(st, ctrl.propose(st, 5.0, False), 7.0)
    assert retry < h_before and st.err_prev == prev_before   # history kept on rejection
    assert ctrl.reject(st, step, 0.5) == 0.2 * 0.2            # non-finite state, error ok


def test_solver_state_of_a_solver_without_state_methods():
    class Plain:
        adaptive, multistep, name, order = False, False, "plain", 1

        def step(self, f, t, y, h):
            return y + h * f(t, y)

        def reset(self):
            pass

    s = Plain()
    assert integrate.solvers.solver_state(s) == {}
    integrate.solvers.restore_solver_state(s, {})
    with pytest.raises(ValueError, match="keeps no state"):
        integrate.solvers.restore_solver_state(s, {"version": 1, "fs": []})
    tr = tp.simulate(ATT, X0, t_max=0.3, dt=0.1, solver=Plain())
    ref = tp.simulate(ATT, X0, t_max=0.3, dt=0.1, solver="euler")
    np.testing.assert_array_equal(tr.states, ref.states)
