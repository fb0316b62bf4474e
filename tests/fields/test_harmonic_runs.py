"""Runs of the particle engine with the harmonic field (FieldOptions(method="harmonic")):
solvers, ensembles, checkpoints, refusals.

The harmonic field is evaluated at the radial projections of the tokens, so a run equals
the same scheme with the direct field evaluated at the projections (the reference loop
here, written out), to the field's round-off accumulated over the steps."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.blocks.normalization import sphere_retract, tangent_project
from transformer_pde.errors import ArgumentError, CheckpointError, EarlyStopWarning
from transformer_pde.fields import velocity
from transformer_pde.particles.ensemble import simulate_ensemble

HARMONIC = tp.FieldOptions(backend="numpy", method="harmonic")


def unit(X):
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def reference_run(att, X0, dt, steps, tableau):
    """The block stepper's scheme (explicit RK on the tangent field, then x -> x/|x|) with
    the direct field at the radial projections of the stage points."""
    def f(z):
        return tangent_project(z, velocity(att, unit(z), backend="numpy"))
    A, b = tableau
    X = X0.copy()
    out = [X]
    for _ in range(steps):
        ks = []
        for i in range(len(b)):
            z = X + dt * sum((A[i][j] * ks[j] for j in range(i)), np.zeros_like(X))
            ks.append(f(z))
        X = sphere_retract(X + dt * sum(bi * k for bi, k in zip(b, ks, strict=True)))
        out.append(X)
    return np.array(out)


RK4 = ([[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 3, 1 / 6])
HEUN = ([[], [1.0]], [0.5, 0.5])


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("solver, tableau", [("rk4", RK4), ("heun", HEUN)])
def test_run_equals_the_scheme_with_the_direct_field(d, solver, tableau, rng):
    # 20 steps; each field value within ~1e-13 of the direct one: 1e-10 leaves room for the
    # growth of the difference along the flow (Lipschitz ~ beta)
    X0 = unit(rng.normal(size=(40, d)))
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=4.0)
    traj = tp.simulate(att, X0, t_max=1.0, dt=0.05, solver=solver,
                       block=tp.Block(constraint="sphere"), field=HARMONIC)
    ref = reference_run(att, X0, 0.05, 20, tableau)
    assert str(traj.status) == "ok"
    np.testing.assert_allclose(traj.states, ref, rtol=0, atol=1e-10)
    assert traj.info["harmonic_evaluations"] == 20 * len(tableau[1])
    assert traj.info["harmonic_modes"] > 0


def test_run_is_close_to_the_direct_run(rng):
    # the direct run evaluates the field at the stage points themselves, slightly off the
    # sphere, the harmonic run at their projections: a difference that vanishes with dt
    # (dt = 0.01, beta = 2: measured 7e-13; asserted 1e-9)
    X0 = unit(rng.normal(size=(30, 2)))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=2.0)
    kw = dict(t_max=1.0, dt=0.01, block=tp.Block(constraint="sphere"))
    a = tp.simulate(att, X0, field=HARMONIC, **kw)
    b = tp.simulate(att, X0, field=tp.FieldOptions(backend="numpy"), **kw)
    assert np.abs(a.states - b.states).max() < 1e-9


def test_ensemble_members_equal_single_runs(rng):
    # moments per system (segments): each member as if run alone, to round-off (1e-13)
    X0 = unit(rng.normal(size=(3, 12, 3)))
    att = tp.Attention("exp", np.eye(3), np.eye(3), -np.eye(3), beta=3.0, shift=3.0)
    ens = simulate_ensemble(att, X0, t_max=0.5, dt=0.05, block="sphere", field=HARMONIC)
    for b in range(3):
        one = tp.simulate(att, X0[b], t_max=0.5, dt=0.05, block=tp.Block(constraint="sphere"),
                          field=HARMONIC)
        np.testing.assert_allclose(ens.states[:, b], one.states, rtol=0, atol=1e-13)
    with pytest.raises(ArgumentError, match="backend"):
        simulate_ensemble(att, X0, t_max=0.5, dt=0.05, block="sphere", field=HARMONIC,
                          backend="numpy")


class StopOnce:
    """A statistic that interrupts the run once, after ``t_stop`` (Ctrl-C)."""

    def __init__(self, t_stop):
        self.t_stop = t_stop

    def __call__(self, t, X, w):
        if self.t_stop is not None and t > self.t_stop:
            self.t_stop = None
            raise KeyboardInterrupt
        return np.array(X, copy=True)


def test_checkpoint_resumes_to_the_uninterrupted_run(rng, tmp_path):
    X0 = unit(rng.normal(size=(20, 2)))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=5.0)
    path = tmp_path / "harm.ckpt"
    kw = dict(t_max=0.6, dt=0.05, block=tp.Block(constraint="sphere"), field=HARMONIC)
    ref = tp.simulate(att, X0, saveat=tp.SaveAt(fn=StopOnce(None)), **kw)
    stop = tp.SaveAt(fn=StopOnce(0.3))
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = tp.simulate(att, X0, saveat=stop, monitor=tp.Monitor(checkpoint=path,
                                                                  checkpoint_every=1e-9), **kw)
    assert str(cut.status) == "interrupted" and path.exists()
    again = tp.simulate(att, X0, saveat=stop, monitor=tp.Monitor(checkpoint=path, resume=True),
                        **kw)
    np.testing.assert_array_equal(np.asarray(again.values), np.asarray(ref.values))  # bit for bit
    assert again.info["harmonic_evaluations"] == ref.info["harmonic_evaluations"]
    # the method is part of the run's identity: the direct method is another run
    with pytest.raises(CheckpointError, match="method"):
        tp.simulate(att, X0, saveat=stop, monitor=tp.Monitor(checkpoint=path, resume=True),
                    **{**kw, "field": tp.FieldOptions(backend="numpy")})


def test_runs_that_leave_the_sphere_are_refused(rng):
    X0 = unit(rng.normal(size=(5, 2)))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ArgumentError, match="block: FieldOptions\\(method='harmonic'\\)"):
        tp.simulate(att, X0, t_max=0.1, dt=0.05, field=HARMONIC)
    ln = tp.Block(constraint="sphere", layernorm=tp.LayerNorm(mode="pre"))
    with pytest.raises(ArgumentError, match="pre-LayerNorm"):
        tp.simulate(att, X0, t_max=0.1, dt=0.05, block=ln, field=HARMONIC)
    # adaptive solvers integrate Block(constraint=Sphere()) alone, not with other options
    with pytest.raises(ArgumentError, match="fixed-step solver"):
        tp.simulate(att, X0, t_max=0.1, dt=0.05, solver="dop853",
                    block=tp.Block(constraint="sphere", mlp=tp.MLP(np.ones((3, 2)), np.ones((2, 3)))),
                    field=HARMONIC)
    with pytest.raises(ArgumentError, match="field: method='harmonic'.*kind='l2'"):
        tp.simulate(tp.Attention("l2", np.eye(2), np.eye(2), np.eye(2)), X0, t_max=0.1,
                    dt=0.05, block=tp.Block(constraint="sphere"), field=HARMONIC)
