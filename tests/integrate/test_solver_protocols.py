"""The Solver / AdaptiveSolver protocols: every built-in solver satisfies exactly one, a
user's own object satisfying one runs like the built-in it wraps, and an object that
satisfies neither is refused naming ``solver`` and what it lacks."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.blocks import BlockStepper
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.integrate import (SOLVERS, AdaptiveSolver, Dopri5, Solver, check_solver,
                                       get_solver)

ATT = tp.Attention("softmax", np.eye(2), np.eye(2), np.array([[0.3, -1.0], [1.0, 0.2]]))
X0 = np.random.default_rng(11).normal(size=(6, 2))


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_every_built_in_solver_satisfies_exactly_its_protocol(name):
    s = get_solver(name)
    assert isinstance(s, AdaptiveSolver) is s.adaptive
    assert isinstance(s, Solver) is not s.adaptive
    assert check_solver(s) is s


class MyPair:
    """A user's adaptive solver: Dopri5 behind the protocol, not a subclass."""
    name, order, adaptive, multistep = "my_pair", 5, True, False

    def __init__(self):
        self.inner = Dopri5(rtol=1e-7)

    def reset(self):
        self.inner.reset()

    def controller(self):
        return self.inner.controller()

    def attempt(self, f, t, y, h, fy):
        return self.inner.attempt(f, t, y, h, fy)


class MyEuler:
    name, order, adaptive, multistep = "my_euler", 1, False, False

    def reset(self):
        pass

    def step(self, f, t, y, h):
        return y + h * f(t, y)


def test_a_users_adaptive_solver_runs_like_the_built_in_it_wraps():
    mine = tp.simulate(ATT, X0, t_max=1.0, dt=0.1, solver=MyPair())
    ref = tp.simulate(ATT, X0, t_max=1.0, dt=0.1, solver=Dopri5(rtol=1e-7))
    assert mine.status == ref.status == "ok"
    np.testing.assert_array_equal(mine.states, ref.states)   # the same arithmetic
    assert mine.info["method"] == "my_pair"


def test_a_users_fixed_step_solver_runs_with_a_block():
    block = tp.Block(constraint="sphere")
    Y0 = X0 / np.linalg.norm(X0, axis=1, keepdims=True)
    mine = tp.simulate(ATT, Y0, t_max=0.3, dt=0.1, solver=MyEuler(), block=block)
    ref = tp.simulate(ATT, Y0, t_max=0.3, dt=0.1, solver="euler", block=block)
    assert mine.status == ref.status == "ok"
    np.testing.assert_array_equal(mine.states, ref.states)


def _without(cls, member):
    return type(f"No_{member}", (cls,), {member: property(lambda self: _raise())})


def _raise():
    raise AttributeError


@pytest.mark.parametrize("cls, member", [(MyEuler, "step"), (MyEuler, "reset"),
                                         (MyEuler, "name"), (MyEuler, "multistep"),
                                         (MyPair, "controller"), (MyPair, "attempt"),
                                         (MyPair, "order")])
def test_an_object_lacking_a_member_is_refused_naming_it(cls, member):
    bad = _without(cls, member)()
    with pytest.raises(ArgumentTypeError, match=rf"^solver must be .*lacks {member}$"):
        get_solver(bad)
    with pytest.raises(ArgumentTypeError, match=f"lacks {member}"):
        tp.simulate(ATT, X0, t_max=0.1, dt=0.1, solver=bad)


def test_an_object_without_adaptive_is_held_to_the_fixed_step_protocol():
    class Bare:
        def step(self, f, t, y, h):
            return y

    with pytest.raises(ArgumentTypeError, match="Solver protocol.*lacks name, order, "
                                                "adaptive, multistep, reset$"):
        get_solver(Bare())
    with pytest.raises(ArgumentTypeError, match="lacks name, order, adaptive, multistep, "
                                                "reset, step$"):
        get_solver(3)


def test_a_block_refuses_an_adaptive_solver_by_its_protocol():
    with pytest.raises(ArgumentError, match="solver='my_pair'.*fixed-step"):
        BlockStepper(MyPair(), tp.Block(normalization="pre"), 2)
