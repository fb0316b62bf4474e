"""Normalisation schemes of the attention flow, ``Block(normalization=...)``.

Every scheme is checked against the exact equiangular law: n tokens with pairwise cosine
rho and common radius r stay equiangular under Q = K = V = I (the symmetry group of the
configuration permutes the tokens), and (rho, r) obey the two-dimensional ODE

    rho' = 2 s tau,  r' = g a,
    Z = e^b + (n-1) e^{b rho} (SA) or n (USA),  tau = e^{b rho}(1-rho)(1+(n-1)rho)/Z,
    a = (e^b + (n-1) rho e^{b rho})/Z,
    |A|^2 = (e^{2b} + 2(n-1) rho e^b e^{b rho} + (n-1)(1+(n-2)rho) e^{2 b rho})/Z^2,

with the speed factor s and radial factor g of the scheme.  The reference below integrates
it with scipy's DOP853 at rtol 1e-13 (an independent solver of a 2-D system, so its error
is far below the 1e-10 asked of the particle runs).  The particle runs use RK4 with
dt = 2e-3: the fields have rates of order beta e^beta / Z <= 3 here, the RK4 global error
is about (rate * dt)^4 * T ~ 1e-11, and halving dt is checked to change the result by less
than 1e-10 (test_rk4_step_is_converged).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.blocks.block import Block
from transformer_pde.blocks.normalization import (NORMALIZATIONS, Normalization, speed_factors,
                                                  unit_rows)
from transformer_pde.errors import ArgumentError, ArgumentTypeError, EarlyStopWarning

DT = 2e-3
TOL = 1e-10


# ------------------------------------------------------------------ reference
def _law(beta: float, n: int, rho: float, model: str):
    """(tau, a, |A|) of the equiangular configuration."""
    eb, er = math.exp(beta), math.exp(beta * rho)
    Z = eb + (n - 1) * er if model == "sa" else float(n)
    tau = er * (1 - rho) * (1 + (n - 1) * rho) / Z
    a = (eb + (n - 1) * rho * er) / Z
    A2 = (eb * eb + 2 * (n - 1) * rho * eb * er + (n - 1) * (1 + (n - 2) * rho) * er * er) / Z**2
    return tau, a, math.sqrt(A2)


def _factors(scheme: str, t: float, r: float, normA: float, alpha: float):
    """(s, g) of a plain scheme."""
    c = 1.0 / math.sqrt(1.0 + t)
    return {"post": (1.0, 0.0), "pre": (1.0 / r, 1.0), "peri": (1.0 / (r * normA), 1.0 / normA),
            "ngpt": (alpha / normA, 0.0), "cod": (c / r, c)}[scheme]


def reference(beta, n, rho0, r0, times, scheme, *, model="sa", alpha=1.0, switch=None):
    """(rho(t), r(t)) at ``times`` from scipy's DOP853 (mix: post up to the switch, then pre)."""
    def rhs(plain):
        def f(t, y):
            tau, a, nA = _law(beta, n, y[0], model)
            s, g = _factors(plain, t, y[1], nA, alpha)
            return [2 * s * tau, g * a]
        return f

    times = np.asarray(times, dtype=float)
    pieces = [(scheme, 0.0, times[-1])] if scheme != "mix" else \
        [("post", 0.0, switch), ("pre", switch, times[-1])]
    y, out = [rho0, r0], np.empty((times.size, 2))
    for plain, a, b in pieces:
        mask = (times >= a) & (times <= b)
        sol = solve_ivp(rhs(plain), (a, b), y, method="DOP853", rtol=1e-13, atol=1e-14,
                        t_eval=times[mask], dense_output=True)
        assert sol.success
        out[mask] = sol.y.T
        y = sol.sol(b)
    return out[:, 0], out[:, 1]


def equiangular_start(n: int, rho0: float, r0: float) -> np.ndarray:
    """Rows of chol((1-rho0) I + rho0 11^T), times r0: pairwise cosine rho0, norm r0."""
    G = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    return r0 * np.linalg.cholesky(G)


def field_of(att, tr):
    """The run's attention field ``(t, X) -> A``, for :func:`speed_factors`."""
    return lambda t, X: tp.velocity(att, X, weights=tr.weights, t=t)


def run(scheme, n=6, beta=1.0, rho0=0.3, r0=1.0, t_max=2.0, dt=DT, model="sa", **kw):
    eye = np.eye(n)
    att = tp.Attention("softmax" if model == "sa" else "exp", eye, eye, eye, beta=beta)
    nz = Normalization(scheme, **kw)
    tr = tp.simulate(att, equiangular_start(n, rho0, r0), t_max=t_max, dt=dt,
                     block=Block(normalization=nz), saveat=tp.SaveAt(every=round(0.25 / dt)))
    assert tr.status == "ok", tr.message
    return tr, att, nz


def errors(tr, beta, rho0, r0, scheme, model="sa", **kw):
    n = tr.states.shape[1]
    rho, r = reference(beta, n, rho0, r0, tr.times, scheme, model=model, **kw)
    radii = np.linalg.norm(tr.states, axis=2)
    theta = tr.states / radii[..., None]
    cos = np.einsum("tid,tjd->tij", theta, theta)
    off = ~np.eye(n, dtype=bool)
    e_rho = np.abs(cos[:, off] - rho[:, None]).max()
    e_r = np.abs(radii - r[:, None]).max()
    return e_rho, e_r, rho, r


CASES = [  # scheme, options, r0, t_max
    ("post", {}, 1.0, 5.0),
    ("pre", {}, 1.5, 5.0),
    ("peri", {}, 1.5, 5.0),
    ("ngpt", {"alpha": 0.5}, 1.0, 5.0),
    ("cod", {}, 1.5, 5.0),
    ("mix", {"switch": 1.0}, 1.0, 3.0),
]


@pytest.mark.parametrize("beta", [1.0, 3.0])
@pytest.mark.parametrize("scheme, kw, r0, t_max", CASES, ids=[c[0] for c in CASES])
def test_scheme_follows_the_exact_equiangular_law(scheme, kw, r0, t_max, beta):
    n = 6 if beta == 1.0 else 8
    tr, _, _ = run(scheme, n=n, beta=beta, r0=r0, t_max=t_max, **kw)
    e_rho, e_r, rho, r = errors(tr, beta, 0.3, r0, scheme, **kw)
    assert e_rho <= TOL and e_r <= TOL, (e_rho, e_r)
    assert rho[-1] > 0.5   # the run did move: the check is not of a frozen state


@pytest.mark.parametrize("scheme, kw", [("pre", {}), ("peri", {}), ("ngpt", {"alpha": 2.0})])
def test_unnormalised_attention_follows_the_law(scheme, kw):
    r0 = 1.0 if scheme == "ngpt" else 0.7
    tr, _, _ = run(scheme, n=7, beta=1.0, r0=r0, t_max=3.0, model="usa", **kw)
    e_rho, e_r, _, _ = errors(tr, 1.0, 0.3, r0, scheme, model="usa", **kw)
    assert e_rho <= TOL and e_r <= TOL, (e_rho, e_r)


def test_rk4_step_is_converged():
    """Halving dt changes the pre run by < 1e-10: the particle error is below the tolerance
    for the step of the other tests, not only by agreement with the reference."""
    a, _, _ = run("pre", beta=3.0, n=8, r0=1.5, t_max=5.0)
    b, _, _ = run("pre", beta=3.0, n=8, r0=1.5, t_max=5.0, dt=DT / 2)
    assert np.abs(a.states - b.states).max() < TOL


def test_against_the_library_reduction():
    red = pytest.importorskip("transformer_pde.reductions",
                              reason="transformer_pde.reductions is not available")
    equiangular = getattr(red, "equiangular", None)
    if equiangular is None:
        pytest.skip("transformer_pde.reductions.equiangular is not available")
    for scheme, kw, r0, t_max in CASES:
        for model in ("sa", "usa"):
            rho, r = reference(3.0, 8, 0.3, r0, [0.0, t_max / 2, t_max], scheme,
                               model=model, **kw)
            sol = equiangular(3.0, 8, 0.3, np.array([0.0, t_max / 2, t_max]),
                                 model=model, normalization=scheme, r0=r0,
                                 alpha=kw.get("alpha", 1.0), switch=kw.get("switch"))
            np.testing.assert_allclose(sol.rho, rho, rtol=0, atol=1e-9)
            np.testing.assert_allclose(sol.r, r, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------ post, speed factors
def test_post_is_the_sphere_constraint_bit_for_bit():
    rng = np.random.default_rng(3)
    X0 = rng.normal(size=(12, 5))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention("softmax", rng.normal(size=(5, 5)), rng.normal(size=(5, 5)),
                       np.eye(5), beta=2.0)
    for solver in ("rk4", "heun", "ab2"):
        a = tp.simulate(att, X0, t_max=1.0, dt=0.05, solver=solver,
                        block=Block(constraint="sphere"))
        b = tp.simulate(att, X0, t_max=1.0, dt=0.05, solver=solver,
                        block=Block(normalization="post"))
        assert np.array_equal(a.states, b.states)
        assert b.info["normalization"] == "post" and a.info["normalization"] is None


def test_speed_factor_of_pre_is_one_over_r():
    tr, att, nz = run("pre", n=6, beta=1.0, r0=1.5, t_max=2.0)
    s = speed_factors(tr, field_of(att, tr))
    np.testing.assert_allclose(s, 1.0 / np.linalg.norm(tr.states, axis=2), rtol=1e-14)
    ev = tp.fields.FieldEvaluator(att, 6, weights=tr.weights)
    np.testing.assert_array_equal(s, speed_factors(tr, ev, "pre"))
    assert s.shape == tr.states.shape[:2]


@pytest.mark.parametrize("scheme, kw", [("post", {}), ("peri", {}), ("ngpt", {"alpha": 0.5}),
                                        ("cod", {}), ("mix", {"switch": 1.0})])
def test_speed_factors_along_the_run_match_the_law(scheme, kw):
    r0 = 1.0 if scheme in ("post", "ngpt", "mix") else 1.5
    tr, att, nz = run(scheme, n=6, beta=1.0, r0=r0, t_max=2.0, **kw)
    _, _, rho, r = errors(tr, 1.0, 0.3, r0, scheme, **kw)
    want = []
    for t, rh, rr in zip(tr.times, rho, r, strict=True):
        plain = scheme if scheme != "mix" else ("post" if t < kw["switch"] else "pre")
        want.append(_factors(plain, t, rr, _law(1.0, 6, rh, "sa")[2], kw.get("alpha", 1.0))[0])
    s = speed_factors(tr, field_of(att, tr), nz)
    np.testing.assert_allclose(s, np.repeat(np.array(want)[:, None], 6, axis=1), rtol=1e-9)


def test_speed_and_radial_factors_reproduce_the_stream():
    """theta' = s P_theta A and r' = g <theta, A> for the stream field of every scheme."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5, 4)) * rng.uniform(0.5, 2.0, size=(5, 1))
    A = rng.normal(size=(5, 4))
    r = np.linalg.norm(X, axis=1)
    th = X / r[:, None]
    for nz in (Normalization(s) for s in ("pre", "peri", "cod", "post")):
        if nz.scheme == "post":   # its tokens are on the sphere
            X, r = th, np.ones(5)
        F = nz.field(0.7, X, A)
        s, g = nz.speed_factor(0.7, X, A), nz.radial_factor(0.7, X, A)
        PA = A - (th * A).sum(1, keepdims=True) * th
        PF = F - (th * F).sum(1, keepdims=True) * th
        np.testing.assert_allclose(PF / r[:, None], s[:, None] * PA, rtol=1e-13, atol=1e-15)
        if nz.scheme != "post":
            np.testing.assert_allclose((th * F).sum(1), g * (th * A).sum(1), rtol=1e-13)
    ngpt = Normalization("ngpt", alpha=0.3)
    Xs = th
    F = ngpt.field(0.0, Xs, A)
    PA = A - (th * A).sum(1, keepdims=True) * th
    np.testing.assert_allclose(F, ngpt.speed_factor(0.0, Xs, A)[:, None] * PA, rtol=1e-13)


def test_mix_switch_off_the_step_grid_is_cut_exactly():
    """A step over the switch is cut there: the run follows the law with switch = 0.5013."""
    tr, _, _ = run("mix", n=6, beta=1.0, t_max=2.0, dt=DT, switch=0.5013)
    e_rho, e_r, _, _ = errors(tr, 1.0, 0.3, 1.0, "mix", switch=0.5013)
    assert e_rho <= TOL and e_r <= TOL, (e_rho, e_r)


# ------------------------------------------------------------------ failures, errors
@pytest.mark.parametrize("scheme", ["peri", "ngpt"])
def test_zero_field_stops_as_nonfinite(scheme):
    """V = 0 gives A = 0: the normalised field is undefined and the run stops cleanly."""
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.zeros((3, 3)))
    X0 = equiangular_start(3, 0.2, 1.0)
    with pytest.warns(EarlyStopWarning):
        tr = tp.simulate(att, X0, t_max=1.0, dt=0.1, block=Block(normalization=scheme))
    assert tr.status == "nonfinite" and not tr.success
    assert np.all(np.isfinite(tr.states))   # only the finite states were kept
    assert np.isnan(speed_factors(tr, field_of(att, tr))).all()


def test_unit_rows_of_a_zero_row_is_nan():
    out = unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out[0].tolist() == [0.6, 0.8] and np.isnan(out[1]).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"scheme": "layer"}, "scheme"),
    ({"scheme": "pre", "alpha": 0.5}, "alpha"),
    ({"scheme": "mix", "alpha": 0.5, "switch": 1.0}, "alpha"),
    ({"scheme": "post", "switch": 1.0}, "switch"),
    ({"scheme": "mix"}, "switch"),
    ({"scheme": "mix", "switch": 0.0}, "switch"),
    ({"scheme": "ngpt", "alpha": -1.0}, "alpha"),
    ({"scheme": "ngpt", "alpha": float("nan")}, "alpha"),
])
def test_normalization_errors_name_the_option(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        Normalization(**kwargs)


def test_block_refuses_what_normalization_replaces():
    eye = np.eye(2)
    with pytest.raises(ArgumentError, match="constraint='sphere'"):
        Block(normalization="pre", constraint="sphere")
    with pytest.raises(ArgumentError, match="layernorm"):
        Block(normalization="pre", layernorm=tp.blocks.LayerNorm())
    with pytest.raises(ArgumentError, match="mlp"):
        Block(normalization="peri", mlp=tp.blocks.MLP(eye, eye))
    with pytest.raises(ArgumentError, match="normalization: scheme"):
        Block(normalization="middle")
    with pytest.raises(ArgumentTypeError, match="normalization"):
        Block(normalization=3)
    with pytest.raises(ArgumentTypeError, match="instance"):
        Block(normalization=Normalization)
    assert Block(normalization="ngpt").normalization == Normalization("ngpt", alpha=1.0)


def test_run_level_errors():
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3))
    X0 = equiangular_start(3, 0.2, 2.0)
    for scheme in ("post", "ngpt", Normalization("mix", switch=1.0)):
        with pytest.raises(ArgumentError, match="unit sphere"):
            tp.simulate(att, X0, t_max=0.1, dt=0.05, block=Block(normalization=scheme))
    with pytest.raises(ArgumentError, match="zero row"):
        tp.simulate(att, np.vstack([X0[:2], np.zeros(3)]), t_max=0.1, dt=0.05,
                    block=Block(normalization="pre"))
    with pytest.raises(ArgumentError, match="fixed-step"):
        tp.simulate(att, X0, t_max=0.1, dt=0.05, solver="dopri5",
                    block=Block(normalization="pre"))
    with pytest.raises(ArgumentError, match="multistep"):
        tp.simulate(att, X0 / 2.0, t_max=0.1, dt=0.05, solver="ab2",
                    block=Block(normalization=Normalization("mix", switch=1.0)))


def test_speed_factors_errors():
    tr, att, _ = run("pre", n=4, t_max=0.5, r0=1.5)
    field = field_of(att, tr)
    with pytest.raises(ArgumentError, match="not the run's"):
        speed_factors(tr, field, "peri")
    with pytest.raises(ArgumentTypeError, match="FieldEvaluator"):
        speed_factors(tr, att)
    with pytest.raises(ArgumentError, match="shape"):
        speed_factors(tr, lambda t, X: X[:, :2])
    plain = tp.simulate(att, tr.states[0], t_max=0.1, dt=0.05)
    with pytest.raises(ArgumentError, match="normalization"):
        speed_factors(plain, field)
    assert speed_factors(plain, field, "pre").shape == plain.states.shape[:2]
    stat = tp.simulate(att, tr.states[0], t_max=0.1, dt=0.05, block=Block(normalization="pre"),
                       saveat=tp.SaveAt(fn=lambda t, X, w: X.mean()))
    with pytest.raises(ArgumentError, match="saved states"):
        speed_factors(stat, field)


# ------------------------------------------------------------------ records, checkpoints
def test_parameters_and_describe_name_the_scheme():
    p = Block(normalization=Normalization("mix", switch=2.0)).parameters()
    assert p["normalization"] == "mix" and p["normalization.switch"] == 2.0
    assert p["normalization.alpha"] is None and p["constraint"] is None
    d = Block(normalization=Normalization("ngpt", alpha=0.5)).describe()
    assert d["normalization"] == "ngpt" and d["normalization_alpha"] == 0.5
    assert "normalization" not in Block(constraint="sphere").parameters()
    assert Block(normalization="pre").parameters() != Block(normalization="peri").parameters()


def test_checkpoint_of_one_scheme_refuses_another(tmp_path):
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3))
    X0 = equiangular_start(3, 0.2, 1.5)
    path = tmp_path / "run.ckpt"
    mon = tp.Monitor(checkpoint=path, checkpoint_every=1e-9)
    tp.simulate(att, X0, t_max=0.5, dt=0.05, block=Block(normalization="pre"), monitor=mon)
    again = tp.Monitor(checkpoint=path, resume=True)
    with pytest.raises(tp.errors.CheckpointError, match="block.normalization"):
        tp.simulate(att, X0, t_max=0.5, dt=0.05, block=Block(normalization="peri"),
                    monitor=again)
    same = tp.simulate(att, X0, t_max=0.5, dt=0.05, block=Block(normalization="pre"),
                       monitor=again)
    fresh = tp.simulate(att, X0, t_max=0.5, dt=0.05, block=Block(normalization="pre"))
    np.testing.assert_array_equal(same.final, fresh.final)


def test_trajectory_round_trip_keeps_the_scheme(tmp_path):
    pytest.importorskip("xarray")
    tr, att, _ = run("ngpt", n=4, t_max=0.5, alpha=0.5)
    back = tp.load(tr.save(tmp_path / "tr.nc"))
    np.testing.assert_array_equal(speed_factors(back, field_of(att, tr)),
                                  speed_factors(tr, field_of(att, tr)))


def test_schemes_constant():
    assert set(NORMALIZATIONS) == {"post", "pre", "mix", "peri", "ngpt", "cod"}
