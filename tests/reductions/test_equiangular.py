"""The equiangular reduction equals particle runs of the library and its own closed form."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.integrate import Dop853, Limits, SaveAt, TimeLoop
from transformer_pde.reductions.equiangular_flow import SCHEMES, equiangular, equiangular_rates
from transformer_pde.reductions.hitting import equiangular_time

KINDS = {"sa": "softmax", "usa": "exp"}


def equiangular_tokens(n: int, rho0: float, r0: float = 1.0) -> np.ndarray:
    """Rows of chol((1 - rho0) I + rho0 11^T): n unit vectors with pairwise product rho0."""
    return r0 * np.linalg.cholesky((1 - rho0) * np.eye(n) + rho0 * np.ones((n, n)))


def pair_stats(states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean off-diagonal cosine, max deviation of the cosines from it, mean norm)."""
    r = np.linalg.norm(states, axis=-1)
    U = states / r[..., None]
    G = np.einsum("tid,tjd->tij", U, U)
    n = G.shape[1]
    off = ~np.eye(n, dtype=bool)
    mean = G[:, off].mean(axis=1)
    spread = np.abs(G[:, off] - mean[:, None]).max(axis=1)
    return mean, spread, r.mean(axis=1)


# --------------------------------------------------------------- post-LN vs simulate
def post_ln_error(model, n, beta, rho0, t_max, dt):
    """Max |mean pair cosine of a particle run - rho(t)|, the spread of the pair cosines,
    and rho at t_max."""
    ts = np.linspace(0.0, t_max, 9)
    att = tp.Attention(KINDS[model], np.eye(n), np.eye(n), np.eye(n), beta=beta)
    traj = tp.simulate(att, equiangular_tokens(n, rho0), t_max=t_max, dt=dt, solver="rk4",
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(ts=ts))
    mean, spread, _ = pair_stats(traj.states)
    sol = equiangular(beta, n, rho0, ts, model=model)
    return np.abs(mean - sol.rho).max(), spread.max(), sol.rho[-1]


# RK4 with dt = 1e-3 and the sphere retraction: the global error grows like (lambda dt)^4
# with the fastest rate lambda of the run (USA at beta = 4 merges at about 2e^4 ~ 110);
# measured below 4e-11 for these runs, so 1e-10 is the bound.
POST_CASES = [("sa", 5, 1.0, -0.1, 2.0), ("sa", 8, 4.0, 0.3, 2.0), ("sa", 6, 4.0, 0.0, 2.0),
              ("usa", 7, 1.0, 0.0, 2.0), ("usa", 6, 4.0, -0.1, 1.0), ("usa", 8, 1.0, 0.3, 2.0)]


@pytest.mark.parametrize("model, n, beta, rho0, t_max", POST_CASES)
def test_post_ln_equals_particles(model, n, beta, rho0, t_max):
    err, spread, rho_end = post_ln_error(model, n, beta, rho0, t_max, 1e-3)
    assert err <= 1e-10
    assert spread <= 1e-12          # the configuration stays equiangular
    assert rho_end > rho0 + 0.05    # the flow moved


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("beta", [1.0, 4.0])
@pytest.mark.parametrize("rho0", [-0.1, 0.0, 0.3])
def test_post_ln_equals_particles_grid(model, beta, rho0):
    # USA at beta = 4 merges at the rate 2 e^4 ~ 110: dt = 2.5e-4 keeps lambda dt <= 0.03
    dt = 2.5e-4 if model == "usa" and beta > 1 else 1e-3
    for n in (5, 8):
        err, spread, _ = post_ln_error(model, n, beta, rho0, 1.0, dt)
        assert err <= 1e-10 and spread <= 1e-12


# --------------------------------------------------------------- every scheme vs a stream
def stream_run(model, n, beta, rho0, ts, scheme, r0=1.0, alpha=1.0, switch=None):
    """The residual stream of each scheme, integrated by the library's TimeLoop (DOP853)
    with the attention field of tp.velocity on the normalised tokens."""
    att = tp.Attention(KINDS[model], np.eye(n), np.eye(n), np.eye(n), beta=beta)

    def field(t, X, left=False, stage=None):
        r = np.linalg.norm(X, axis=1, keepdims=True)
        A = tp.velocity(att, X / r)
        name = scheme
        if scheme == "mix":
            name = "post" if t < switch or (left and t <= switch) else "pre"
        if name == "pre":
            return A
        if name == "peri":
            return A / np.linalg.norm(A, axis=1, keepdims=True)
        if name == "cod":
            return A / math.sqrt(1.0 + t)
        F = alpha * A / np.linalg.norm(A, axis=1, keepdims=True) if name == "ngpt" else A
        return F - np.sum(F * X, axis=1, keepdims=True) * X / r ** 2

    saved = []
    stops = np.union1d(ts, [] if switch is None else [switch])
    loop = TimeLoop(Dop853(rtol=1e-12, atol=1e-14), field, t_max=float(ts[-1]), dt=1e-3,
                    saveat=SaveAt(ts=stops), limits=Limits(), tables=[], xp=np,
                    save=lambda t, y: saved.append((t, y.copy())))
    X0 = equiangular_tokens(n, rho0, r0)
    status, message, _ = loop.run(loop.initial_state(X0))
    assert status == "ok", message
    states = np.array([X0] + [y for t, y in saved if t in set(ts)])
    return pair_stats(states)


SCHEME_CASES = [("pre", {}), ("peri", {}), ("cod", {}), ("ngpt", {"alpha": 0.7}),
                ("mix", {"switch": 0.8}), ("pre", {"r0": 2.5}), ("peri", {"r0": 0.5})]


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("scheme, opts", SCHEME_CASES)
def test_schemes_equal_stream_particles(model, scheme, opts):
    # DOP853 at rtol 1e-12 on O(1) states: errors ~1e-12, the bound 1e-10 leaves margin
    n, beta, rho0 = 6, 3.0, 0.1
    ts = np.linspace(0.0, 2.0, 6)
    mean, spread, r = stream_run(model, n, beta, rho0, ts, scheme, **opts)
    sol = equiangular(beta, n, rho0, ts, model=model, normalization=scheme, **opts)
    assert np.abs(mean - sol.rho).max() <= 1e-10
    assert np.abs(r - sol.r).max() <= 1e-10 * max(1.0, sol.r.max())
    assert spread.max() <= 1e-11


def _normalization(scheme, opts):
    """The block's normalisation object, or a skip while the block has none."""
    if "normalization" not in {f.name for f in dataclasses.fields(tp.Block)}:
        pytest.skip("tp.Block has no normalization= option yet (added with the normalisation "
                    "schemes of the block); the stream test above checks the same laws")
    from transformer_pde.blocks import Normalization
    return Normalization(scheme, **opts)


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("scheme, opts", [("post", {}), ("pre", {}), ("peri", {}), ("cod", {}),
                                          ("ngpt", {"alpha": 0.7}), ("mix", {"switch": 0.5})])
def test_schemes_equal_block_particles(model, scheme, opts):
    # RK4, dt = 1e-3 over t <= 1 (the error constant is as in the post-LN runs)
    n, beta, rho0, t_max = 6, 3.0, 0.1, 1.0
    ts = np.linspace(0.0, t_max, 5)
    att = tp.Attention(KINDS[model], np.eye(n), np.eye(n), np.eye(n), beta=beta)
    traj = tp.simulate(att, equiangular_tokens(n, rho0), t_max=t_max, dt=1e-3, solver="rk4",
                       block=tp.Block(normalization=_normalization(scheme, opts)),
                       saveat=tp.SaveAt(ts=ts))
    mean, _, r = pair_stats(traj.states)
    sol = equiangular(beta, n, rho0, ts, model=model, normalization=scheme, **opts)
    assert np.abs(mean - sol.rho).max() <= 1e-10
    assert np.abs(r - sol.r).max() <= 1e-10 * sol.r.max()


# --------------------------------------------------------------- closed form, accuracy
@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("n, beta, rho0", [(2, 0.5, 0.0), (8, 4.0, -0.1), (32, 9.0, 0.3),
                                           (32, 2.0, 0.0), (5, 0.0, 0.2)])
def test_post_ln_inverts_the_hitting_time_to_1e12(model, n, beta, rho0):
    # rho = 1 - 10^-k down to 1 - 1e-14: absolute 1e-12 in rho and 1e-10 relative in 1 - rho
    # (the relative error allowed grows with |d log(1-rho)/dt| * t * 1e-14, the conditioning
    # of rho(t) on the rounding of t)
    gaps = np.geomspace(0.5 * (1 - rho0), 1e-14, 25)
    rho = 1.0 - gaps
    gaps = 1.0 - rho                       # the gaps rho really has
    t = equiangular_time(beta, n, rho0, rho, model=model)
    sol = equiangular(beta, n, rho0, t, model=model)
    rate = np.array([2 * equiangular_rates(u, 1 - u, beta, n, model)[0] * (n - (n - 1) * u)
                     for u in gaps])
    cond = 1e-14 * rate * t
    assert np.all(np.abs(sol.rho - rho) <= 1e-12)
    assert np.all(np.abs(sol.one_minus_rho / gaps - 1.0) <= 1e-10 + cond)


def test_beta_zero_law_and_fixed_points():
    n, rho0 = 6, 0.2
    t = np.linspace(0.0, 3.0, 7)
    sol = equiangular(0.0, n, rho0, t)
    ratio = (1 + (n - 1) * rho0) / (1 - rho0) * np.exp(2 * t)
    np.testing.assert_allclose((1 + (n - 1) * sol.rho) / (1 - sol.rho), ratio, rtol=1e-12)
    same = equiangular(0.0, n, rho0, t, model="usa")
    np.testing.assert_allclose(same.rho, sol.rho, rtol=0, atol=1e-14)
    simplex = equiangular(2.0, n, -1 / (n - 1), t)
    assert np.all(simplex.rho == -1 / (n - 1))
    one = equiangular(2.0, n, 1.0, t, normalization="pre")
    assert np.all(one.rho == 1.0)
    np.testing.assert_allclose(one.r, 1.0 + t, rtol=1e-13)     # r' = a = 1 at rho = 1


def test_shift_rescales_time_and_scalar_time():
    a = equiangular(3.0, 6, 0.0, 2.0, model="usa", shift=1.5)
    b = equiangular(3.0, 6, 0.0, 2.0 * math.exp(-1.5), model="usa")
    assert a.rho.shape == () and abs(float(a.rho) - float(b.rho)) <= 1e-13
    big = equiangular(1e4, 8, 0.999, [0.0, 1.0, 50.0], model="usa", shift=1e4)
    assert np.all(np.isfinite(big.rho)) and big.rho[2] > big.rho[1] > 0.999


def test_solution_keeps_its_inputs():
    sol = equiangular(2.0, 4, 0.1, [0.0, 1.0], normalization="ngpt", alpha=0.5)
    assert (sol.beta, sol.n, sol.rho0, sol.normalization, sol.alpha) == (2.0, 4, 0.1, "ngpt", 0.5)
    assert set(SCHEMES) == {"post", "pre", "peri", "ngpt", "cod", "mix"}


# --------------------------------------------------------------- argument errors
@pytest.mark.parametrize("kwargs, name", [
    ({"rho0": -0.5}, "rho0"), ({"rho0": 1.1}, "rho0"), ({"beta": -1.0}, "beta"),
    ({"n": 1}, "n"), ({"model": "hard"}, "model"), ({"normalization": "x"}, "normalization"),
    ({"r0": 2.0}, "r0"), ({"normalization": "pre", "r0": 0.0}, "r0"),
    ({"alpha": 2.0}, "alpha"), ({"normalization": "ngpt", "alpha": -1.0}, "alpha"),
    ({"switch": 1.0}, "switch"), ({"normalization": "mix"}, "switch"),
    ({"normalization": "mix", "switch": 0.0}, "switch"), ({"shift": 1.0}, "shift"),
    ({"model": "usa", "beta": 800.0}, "shift"), ({"t": [1.0, 0.5]}, "t"), ({"t": -1.0}, "t"),
    ({"beta": 0.0, "rho0": -0.25, "normalization": "peri"}, "rho0"),
])
def test_argument_errors(kwargs, name):
    args = {"beta": 1.0, "n": 5, "rho0": 0.0, "t": [0.0, 1.0], **kwargs}
    with pytest.raises(ArgumentError, match=name):
        equiangular(args.pop("beta"), args.pop("n"), args.pop("rho0"), args.pop("t"), **args)


def test_argument_type_errors():
    with pytest.raises(ArgumentTypeError, match="beta"):
        equiangular("1", 5, 0.0, 1.0)
    with pytest.raises(ArgumentTypeError, match="t"):
        equiangular(1.0, 5, 0.0, "soon")
