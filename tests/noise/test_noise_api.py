"""Noise: checked arguments, clear refusals, deterministic runs unchanged, the engine's
noisy runs on every backend and in ensembles."""

from __future__ import annotations

import numpy as np
import pytest
from block_constraints import Centre

import transformer_pde as tp
from transformer_pde import Noise, simulate, simulate_ensemble
from transformer_pde.errors import ArgumentError, ArgumentTypeError

NP = tp.FieldOptions(backend="numpy")


def _att(d=2):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=1.0)


def _sphere(n, d, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


# ------------------------------------------------------------------ Noise
@pytest.mark.parametrize("kwargs, name", [
    ({"sigma": -0.1}, "noise.sigma"), ({"sigma": np.inf}, "noise.sigma"),
    ({"sigma": np.nan}, "noise.sigma"),
    ({"convention": "ito-ish"}, "noise.convention"),
    ({"seed": 1.5}, "noise.seed"), ({"seed": -1}, "noise.seed"),
    ({"path": 0.5}, "noise.path"), ({"path": -2}, "noise.path"),
    ({"system": -1}, "noise.system"), ({"system": 2.5}, "noise.system"),
    ({"base_dt": 0.0}, "noise.base_dt"),
    ({"common": np.zeros((2, 2, 3))}, "noise.common"),
    ({"common": np.zeros(3)}, "noise.common"),
    ({"common": np.full((1, 2, 2), np.nan)}, "noise.common"),
])
def test_bad_noise_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ArgumentError, match=name):
        Noise(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    ({"seed": "0"}, "noise.seed"), ({"path": None}, "noise.path"),
    ({"system": "1"}, "noise.system"),
    ({"sigma": "0.1"}, "noise.sigma"), ({"common": "A"}, "noise.common"),
])
def test_noise_arguments_of_the_wrong_type(kwargs, name):
    with pytest.raises(ArgumentTypeError, match=name):
        Noise(**kwargs)


def test_noise_is_frozen_and_keeps_a_copy_of_the_matrices():
    A = np.eye(2)
    nz = Noise(sigma=0.2, common=A)
    A[0, 0] = 5.0
    assert nz.common.shape == (1, 2, 2) and nz.common[0, 0, 0] == 1.0
    with pytest.raises(ValueError):
        nz.common[0, 0, 0] = 2.0
    with pytest.raises(AttributeError):
        nz.sigma = 1.0


def test_common_matrices_of_another_dimension_are_refused():
    with pytest.raises(ArgumentError, match="noise.common"):
        simulate(_att(2), np.zeros((3, 2)), t_max=0.1, dt=0.01, solver="euler_maruyama",
                 noise=Noise(common=np.eye(3)), field=NP)


# ------------------------------------------------------------------ refusals
def test_a_deterministic_solver_with_noise_is_refused():
    with pytest.raises(ArgumentError, match="solver='rk4' is not a stochastic solver"):
        simulate(_att(), np.zeros((3, 2)), t_max=0.1, dt=0.01, solver="rk4",
                 noise=Noise(sigma=0.1), field=NP)
    with pytest.raises(ArgumentTypeError, match="solver"):
        simulate(_att(), np.zeros((3, 2)), t_max=0.1, dt=0.01, solver=tp.Dopri5(),
                 noise=Noise(sigma=0.1), field=NP)


@pytest.mark.parametrize("solver", ["euler_maruyama", tp.HeunStratonovich()])
def test_a_stochastic_solver_without_noise_is_refused(solver):
    with pytest.raises(ArgumentError, match="noise=Noise"):
        simulate(_att(), np.zeros((3, 2)), t_max=0.1, dt=0.01, solver=solver, field=NP)


def test_noise_must_be_a_noise_object():
    with pytest.raises(ArgumentTypeError, match="noise must be a transformer_pde.Noise"):
        simulate(_att(), np.zeros((3, 2)), t_max=0.1, dt=0.01, solver="euler_maruyama",
                 noise=0.3, field=NP)


def test_steps_off_the_grid_are_refused():
    X = np.zeros((3, 2))
    with pytest.raises(ArgumentError, match="t_max"):
        simulate(_att(), X, t_max=0.105, dt=0.01, solver="euler_maruyama",
                 noise=Noise(sigma=0.1), field=NP)
    with pytest.raises(ArgumentError, match="t_max"):   # the loop would add a short step
        simulate(_att(), X, t_max=0.1 + 1e-10, dt=0.01, solver="euler_maruyama",
                 noise=Noise(sigma=0.1), field=NP)
    simulate(_att(), X, t_max=0.07, dt=0.01, solver="euler_maruyama",   # 7.000000000000001
             noise=Noise(sigma=0.1), field=NP)
    with pytest.raises(ArgumentError, match="saveat.ts"):
        simulate(_att(), X, t_max=0.1, dt=0.01, solver="euler_maruyama",
                 saveat=tp.SaveAt(ts=[0.0, 0.055, 0.1]), noise=Noise(sigma=0.1), field=NP)
    with pytest.raises(ArgumentError, match="dt=0.03"):
        simulate(_att(), X, t_max=0.12, dt=0.03, solver="euler_maruyama",
                 noise=Noise(sigma=0.1, base_dt=0.1), field=NP)


def test_milstein_refuses_non_commuting_matrices_and_the_sphere():
    A = np.array([[[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]])
    with pytest.raises(ArgumentError, match="commuting"):
        simulate(_att(), np.ones((3, 2)), t_max=0.1, dt=0.01, solver="milstein",
                 noise=Noise(common=A), field=NP)
    with pytest.raises(ArgumentError, match="individual noise .* do not commute"):
        simulate(_att(), np.ones((3, 2)), t_max=0.1, dt=0.01, solver="milstein",
                 noise=Noise(sigma=0.1, common=np.eye(2)), field=NP)
    with pytest.raises(ArgumentError, match="sphere"):
        simulate(_att(), _sphere(3, 2), t_max=0.1, dt=0.01, solver="milstein",
                 noise=Noise(sigma=0.1), block=tp.Block(constraint=tp.Sphere()), field=NP)


def test_blocks_without_a_defined_noise_are_refused():
    mlp = tp.MLP(np.eye(2), np.eye(2))
    with pytest.raises(ArgumentError, match="splitting='none'"):
        simulate(_att(), np.ones((3, 2)), t_max=0.1, dt=0.01, solver="euler_maruyama",
                 noise=Noise(sigma=0.1), block=tp.Block(mlp=mlp), field=NP)
    post = tp.PostLayerNorm(tp.LayerNorm(mode="post"))
    with pytest.raises(ArgumentError, match="PostLayerNorm"):
        simulate(_att(), np.ones((3, 2)) * [1, -1], t_max=0.1, dt=0.01,
                 solver="euler_maruyama", noise=Noise(sigma=0.1),
                 block=tp.Block(constraint=post), field=NP)


# ------------------------------------------------------------------ deterministic runs
@pytest.mark.parametrize("sde, ode", [("euler_maruyama", "euler"), ("heun_stratonovich", "heun"),
                                      ("milstein", "euler")])
def test_zero_noise_is_the_deterministic_scheme_to_the_bit(sde, ode):
    X0 = np.random.default_rng(1).normal(size=(12, 2))
    a = simulate(_att(), X0, t_max=0.5, dt=0.05, solver=sde, noise=Noise(), field=NP)
    b = simulate(_att(), X0, t_max=0.5, dt=0.05, solver=ode, field=NP)
    assert np.array_equal(a.states, b.states)


# ------------------------------------------------------------------ noisy runs
def test_info_records_the_noise():
    tr = simulate(_att(), np.ones((3, 2)), t_max=0.1, dt=0.01, solver="heun_stratonovich",
                  noise=Noise(sigma=0.3, common=np.eye(2), convention="ito", seed=4, path=7),
                  field=NP)
    info = tr.info["noise"]
    assert (info["sigma"], info["convention"], info["seed"], info["path"], info["solver"],
            info["n_common"], info["base_dt"]) == (0.3, "ito", 4, 7, "heun_stratonovich", 1,
                                                   0.01)
    assert tr.info["method"] == "heun_stratonovich"


def test_the_path_is_named_by_seed_and_path():
    X0 = np.random.default_rng(2).normal(size=(5, 2))

    def run(**kw):
        return simulate(_att(), X0, t_max=0.2, dt=0.01, solver="euler_maruyama",
                        noise=Noise(sigma=0.5, **kw), field=NP).states[-1]
    assert np.array_equal(run(seed=1, path=2), run(seed=1, path=2))
    assert not np.allclose(run(seed=1, path=2), run(seed=1, path=3))
    assert not np.allclose(run(seed=1, path=2), run(seed=2, path=2))


@pytest.mark.parametrize("solver", ["euler_maruyama", "heun_stratonovich"])
def test_sphere_runs_stay_on_the_sphere(solver):
    A = np.array([[0.0, 1.0, 0.5], [-1.0, 0.0, 0.2], [-0.5, -0.2, 0.3]])
    tr = simulate(_att(3), _sphere(10, 3), t_max=1.0, dt=0.01, solver=solver,
                  noise=Noise(sigma=0.4, common=A), block=tp.Block(constraint=tp.Sphere()),
                  field=NP)
    assert str(tr.status) == "ok"
    assert np.max(np.abs(np.linalg.norm(tr.states, axis=-1) - 1.0)) < 1e-14


def test_same_path_on_numpy_and_numba():
    """The increments are drawn on the host, so both backends integrate the same path:
    they differ only by the field's rounding (1e-12 after 50 steps of size 0.02)."""
    X0 = _sphere(40, 3, seed=3)
    kw = dict(t_max=1.0, dt=0.02, solver="heun_stratonovich",
              noise=Noise(sigma=0.3, common=np.eye(3)[None] * 0.2, seed=9),
              block=tp.Block(constraint=tp.Sphere()))
    a = simulate(_att(3), X0, field=NP, **kw)
    b = simulate(_att(3), X0, field=tp.FieldOptions(backend="numba"), **kw)
    assert np.max(np.abs(a.states - b.states)) < 1e-12


def test_ensemble_members_and_segments_are_independent_systems():
    """Each member gets its own individual and common increments; member b of an ensemble
    is the run of the packed segments (the ensemble is that run)."""
    X0 = np.stack([_sphere(4, 3, seed=5)] * 3)
    A = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    ens = simulate_ensemble(_att(3), X0, t_max=0.5, dt=0.05, solver="euler_maruyama",
                            noise=Noise(common=A), block="sphere", backend="numpy")
    last = ens.last
    # common noise only: within a member the tokens turn together, across members not
    assert not np.allclose(last[0], last[1]) and not np.allclose(last[1], last[2])
    packed = simulate(_att(3), X0.reshape(-1, 3), t_max=0.5, dt=0.05, solver="euler_maruyama",
                      noise=Noise(common=A), block=tp.Block(constraint=tp.Sphere()),
                      segments=[4, 4, 4], field=NP)
    assert np.array_equal(packed.last.reshape(3, 4, 3), last)


def test_unequal_segments_each_get_their_own_common_noise():
    """Zero field, common noise only, Euler–Maruyama in R^d: every step multiplies the
    tokens of segment s by the same matrix I + h T + M_s, so X_s(T) = Phi_s X_s(0) with one
    Phi_s per segment: a token that is a combination of its segment's basis tokens stays
    that combination (to rounding), and the two segments' Phi differ."""
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.zeros((2, 2)))
    X0 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 2.0],
                   [1.0, 0.0], [0.0, 1.0], [3.0, -1.0], [0.5, 0.5]])
    A = np.array([[[0.3, -1.0], [1.0, 0.1]], [[0.2, 0.0], [0.0, -0.4]]])
    tr = simulate(att, X0, t_max=1.0, dt=0.05, solver="euler_maruyama", segments=[3, 4],
                  noise=Noise(common=A, seed=3), field=NP)
    X = tr.last
    phi0, phi1 = X[0:2].T, X[3:5].T          # columns: the images of e1, e2
    np.testing.assert_allclose(X[2], phi0 @ [1.0, 2.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(X[5], phi1 @ [3.0, -1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(X[6], phi1 @ [0.5, 0.5], rtol=0, atol=1e-12)
    assert not np.allclose(phi0, phi1, atol=1e-3)


def test_normalisation_schemes_and_other_constraints_are_refused():
    X = _sphere(3, 2)
    for block, what in ((tp.Block(normalization="pre"), "normalization"),
                        (tp.Block(constraint=Centre()), "Centre")):
        with pytest.raises(ArgumentError, match=f"noise: .*{what}"):
            simulate(_att(), X, t_max=0.1, dt=0.01, solver="euler_maruyama",
                     noise=Noise(sigma=0.1), block=block, field=NP)


def test_same_path_on_every_numba_thread_count():
    from transformer_pde.backends.numba import NumbaBackend

    X0 = _sphere(30, 3, seed=6)
    kw = dict(t_max=0.5, dt=0.05, solver="euler_maruyama",
              noise=Noise(sigma=0.3, common=0.2 * np.eye(3), seed=1),
              block=tp.Block(constraint=tp.Sphere()))
    a, b = (simulate(_att(3), X0, field=tp.FieldOptions(backend=NumbaBackend(n_threads=k)),
                     **kw) for k in (1, 2))
    assert np.max(np.abs(a.states - b.states)) < 1e-12


def test_float32_runs_draw_the_float64_path_and_cast_it():
    """The increments are drawn in float64 and cast: a float32 run follows the float64 run
    of the same path to float32 rounding (1e-5 after 20 steps)."""
    X0 = np.random.default_rng(7).normal(size=(10, 2))
    kw = dict(t_max=1.0, dt=0.05, solver="heun_stratonovich", field=NP,
              noise=Noise(sigma=0.3, common=0.2 * np.eye(2), seed=1))
    a = simulate(_att(), X0.astype(np.float32), **kw)
    b = simulate(_att(), X0, **kw)
    assert a.states.dtype == np.float32
    np.testing.assert_allclose(a.states, b.states, rtol=0, atol=1e-5)


def test_an_mlp_block_without_splitting_carries_the_noise():
    """With splitting 'none' the noise drives the combined field: zero noise is the
    deterministic block run to the bit, and noise moves it."""
    mlp = tp.MLP(0.5 * np.eye(2), 0.5 * np.eye(2))
    block = tp.Block(mlp=mlp, splitting="none")
    X0 = np.random.default_rng(8).normal(size=(6, 2))
    kw = dict(t_max=0.5, dt=0.05, block=block, field=NP)
    quiet = simulate(_att(), X0, solver="euler_maruyama", noise=Noise(), **kw)
    plain = simulate(_att(), X0, solver="euler", **kw)
    noisy = simulate(_att(), X0, solver="euler_maruyama", noise=Noise(sigma=0.2), **kw)
    assert np.array_equal(quiet.states, plain.states)
    assert not np.allclose(noisy.last, plain.last, atol=1e-3)
