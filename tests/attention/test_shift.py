"""``Attention(shift=c)``: the exponential kernel e^{s - c}.

For the unnormalised kind "exp" the field is multiplied by e^{-c} exactly (the same flow,
time rescaled by e^{c}), computed inside the exponent: on the unit sphere with
Q = K = V = I and c = beta the field stays finite up to beta = 1e4 and equals an
independent extended-precision evaluation.  For the normalised kinds the shift cancels
(bit-identical fields); for kinds without an exponential kernel a non-zero shift is an
error.  The shift is part of the description, the codec, ``replace``, ``repr`` and the
run fingerprint of checkpoints.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.attention import KINDS
from transformer_pde.errors import (ArgumentError, ArgumentTypeError, CheckpointError,
                                    ScoreOverflowError)
from transformer_pde.io.codec import attention_from_json, attention_to_json

EPS = np.finfo(float).eps


def unit_tokens(n, d, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def general(kind, seed=1, d=4, **kw):
    rng = np.random.default_rng(seed)
    Q, K, V = (0.6 * rng.normal(size=(d, d)) for _ in range(3))
    beta = 1.0 if kind == "l2" else 1.3
    return tp.Attention(kind, Q, K, V, beta=beta, **kw)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("kind", ["linear", "sigmoid", "relu", "galerkin", "fourier"])
def test_a_nonzero_shift_without_an_exponential_kernel_is_refused(kind):
    with pytest.raises(ArgumentError, match=r"shift=2 .*" + kind):
        general(kind, shift=2.0)
    assert general(kind, shift=0.0).shift == 0.0   # zero is the identity, always accepted


@pytest.mark.parametrize("bad, error", [(np.inf, ArgumentError), (np.nan, ArgumentError),
                                        ("1", ArgumentTypeError), (True, ArgumentTypeError),
                                        (None, ArgumentTypeError), (1j, ArgumentTypeError)])
def test_shift_must_be_a_finite_real_number(bad, error):
    with pytest.raises(error, match="shift"):
        general("exp", shift=bad)


def test_shift_is_in_the_description_replace_and_repr():
    att = general("exp", shift=12.5)
    assert "shift=12.5" in repr(att) and "shift" not in repr(att.replace(shift=0.0))
    assert att.replace(beta=2.0).shift == 12.5            # replace keeps it
    assert att.to_dict()["shift"] == 12.5
    assert "shift" not in general("exp").to_dict()          # unshifted: as before
    back = tp.Attention.from_dict(att.to_dict())
    assert back.shift == 12.5 and back.beta == att.beta
    old = general("exp").to_dict()                          # a description without shift
    assert tp.Attention.from_dict(old).shift == 0.0
    assert attention_from_json(attention_to_json(att)).shift == 12.5
    assert general("exp", shift=-0.0).to_dict().get("shift") is None


def test_shift_survives_a_trajectory_file(tmp_path):
    att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=30.0, shift=30.0)
    traj = tp.simulate(att, unit_tokens(5, 3), t_max=0.2, dt=0.1,
                       block=tp.Block(constraint="sphere"))
    path = tp.io.save_trajectory(traj, tmp_path / "run.npz")
    assert tp.io.read_trajectory(path)["attention"].shift == 30.0


def test_the_configuration_table_reads_shift():
    from transformer_pde.cli.builders import build_attention
    from transformer_pde.errors import ConfigError
    assert build_attention({"kind": "exp", "d": 3, "beta": 50.0, "shift": 50.0}).shift == 50.0
    assert build_attention({"kind": "exp", "d": 3}).shift == 0.0
    with pytest.raises(ConfigError, match="shift"):
        build_attention({"kind": "linear", "d": 3, "shift": 1.0})
    with pytest.raises(ConfigError, match="shift"):
        build_attention({"kind": "exp", "d": 3, "shift": "big"})


# ------------------------------------------------------------------ the field
@pytest.mark.parametrize("kind", ["softmax", "l2", "sinkhorn"])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_a_shift_changes_nothing_for_normalised_kinds(kind, heads, masked, backend):
    if masked and not KINDS[kind].maskable:
        pytest.skip(f"{kind} is not maskable")
    X = np.random.default_rng(2).normal(size=(9, 4))
    pos = np.linspace(0.0, 1.0, 9)[::-1] if masked else None
    plain = general(kind, heads=heads, masked=masked)
    shifted = plain.replace(shift=123.0)
    a = tp.velocity(plain, X, positions=pos, backend=backend)
    b = tp.velocity(shifted, X, positions=pos, backend=backend)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_exp_field_is_scaled_by_exp_minus_shift(heads, masked, backend):
    """Where both are finite, the shifted field is e^{-c} times the unshifted one.

    Both are e^{lse} times the same softmax average; lse - c is exact (Sterbenz) and the
    rest is two roundings of exp and products: rtol 1e-13."""
    X = np.random.default_rng(3).normal(size=(9, 4))
    pos = np.random.default_rng(4).uniform(size=9) if masked else None
    w = np.random.default_rng(5).uniform(0.5, 1.0, size=9)
    rng = np.random.default_rng(6)
    b_V = rng.normal(size=4)
    plain = general("exp", heads=heads, masked=masked, b_V=b_V, W_O=rng.normal(size=(4, 4)))
    for c in (-3.0, 0.7, 40.0):
        a = tp.velocity(plain, X, weights=w, positions=pos, backend=backend)
        b = tp.velocity(plain.replace(shift=c), X, weights=w, positions=pos, backend=backend)
        # W_O mixes the heads, each scaled by e^{-c}: the product is linear in them
        np.testing.assert_allclose(b, np.exp(-c) * a, rtol=1e-13, atol=0)


def log_domain_reference(X, beta, shift, kind):
    """Field of USA/SA with Q = K = V = I at the tokens, in 80-bit extended precision from
    the same float64 tokens: exp of the scores minus their row maximum (log domain)."""
    XL = X.astype(np.longdouble)
    S = beta * (XL @ XL.T)
    m = S.max(axis=1, keepdims=True)
    E = np.exp(S - m)
    if kind == "softmax":
        return (E @ XL) / E.sum(axis=1, keepdims=True)
    return (E @ XL) * np.exp(m - shift) / X.shape[0]


@pytest.mark.parametrize("kind", ["exp", "softmax"])
@pytest.mark.parametrize("beta", [1e2, 1e3, 1e4])
def test_large_beta_field_on_the_sphere_is_finite_and_exact(kind, beta, backend):
    """At beta = 1e4 the unshifted USA field overflows (e^{1e4}); with shift = beta it is
    finite and equals the extended-precision log-domain reference.

    Tolerance: a score beta<x, y> ~ beta is a float64 with absolute rounding ~ beta * eps /
    2, which is a relative error of each kernel value e^{s}: no float64 evaluation (the
    library's or a NumPy one) is closer than ~beta * eps to the true field of the given
    tokens (measured: 1.6e-12 to 2e-12 at beta = 1e4, for both).  rtol = max(1e-12,
    4 beta eps) (= 1e-12 up to beta ~ 1e3, 8.9e-12 at 1e4), relative to each row's
    largest entry."""
    X = unit_tokens(12, 3, seed=int(beta))
    att = tp.Attention(kind, np.eye(3), np.eye(3), np.eye(3), beta=beta, shift=beta)
    v = tp.velocity(att, X, backend=backend)
    assert np.all(np.isfinite(v))
    ref = log_domain_reference(X, beta, beta, kind)
    scale = np.abs(ref).max(axis=1, keepdims=True)
    err = float((np.abs(v - ref) / scale).max())
    assert err <= max(1e-12, 4 * beta * EPS), err
    if kind == "exp":
        assert float(np.abs(v).max()) <= 1.0   # e^{beta(<x,y> - 1)} <= 1


@pytest.mark.parametrize("beta", [1e3, 1e4])
def test_unshifted_overflow_raises_and_suggests_shift(beta):
    att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=beta)
    with pytest.raises(ScoreOverflowError, match=r"shift=c\).*time rescaled"):
        tp.velocity(att, unit_tokens(6, 3))


def test_unshifted_overflow_stops_a_run_as_nonfinite():
    att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=1e3)
    with pytest.warns(tp.errors.EarlyStopWarning):
        traj = tp.simulate(att, unit_tokens(6, 3), t_max=0.1, dt=0.05,
                           block=tp.Block(constraint="sphere"))
    assert traj.status == "nonfinite" and traj.states.shape[0] == 1


# ------------------------------------------------------------------ runs
def equiangular_tokens(n, rho):
    """n unit vectors of R^{n+1} with pairwise inner products rho."""
    X = np.zeros((n, n + 1))
    X[:, :n] = np.sqrt(1.0 - rho) * np.eye(n)
    X[:, n] = np.sqrt(rho)
    return X


def equiangular_reference(beta, n, rho0, t, model, shift):
    r"""The inner product rho(t) of n equiangular tokens under USA / SA with Q = K = V = I.

    With :math:`\langle x_i, x_j\rangle = \rho` for all i != j, P_{x_i} x_j = x_j - rho x_i
    and x_i' = g(rho) sum_{j != i}(x_j - rho x_i) with g = e^{beta rho - c}/n (USA) or
    e^{beta rho}/(e^beta + (n - 1) e^{beta rho}) (SA), so
    rho' = 2 <x_i', x_k> = 2 g(rho) (1 - rho)((n - 1) rho + 1)."""
    try:
        from transformer_pde.reductions.equiangular import equiangular
    except ImportError:
        equiangular = None
    if equiangular is not None:
        # the reduction refuses a shift for "sa", where it cancels
        shift_kw = {"shift": shift} if model == "usa" else {}
        return 1.0 - equiangular(beta, n, rho0, t, model=model, **shift_kw).one_minus_rho

    def rhs(_, y):
        r = y[0]
        if model == "usa":
            g = np.exp(beta * (r - 1.0) + (beta - shift)) / n
        else:
            e = np.exp(beta * (r - 1.0))
            g = e / (1.0 + (n - 1) * e)
        return [2.0 * g * (1.0 - r) * ((n - 1) * r + 1.0)]
    sol = solve_ivp(rhs, (0.0, float(t[-1])), [rho0], t_eval=t, method="DOP853",
                    rtol=1e-13, atol=1e-16)
    return sol.y[0]


@pytest.mark.parametrize("kind, model", [("exp", "usa"), ("softmax", "sa")])
@pytest.mark.parametrize("beta", [1e3, 1e4])
def test_large_beta_run_follows_the_equiangular_law(kind, model, beta):
    """rho0 = 1 - 2/beta: u = beta(1 - rho) solves u' ~ -2 e^{-u} u, an O(1) motion at any
    beta.  RK4 with dt = 0.01 on that time scale: local errors ~1e-10; compared on u with
    rtol 1e-6 (measured 2e-9 to 2e-7).  The tokens stay equiangular to rounding."""
    n = 4
    rho0 = 1.0 - 2.0 / beta
    d = n + 1
    att = tp.Attention(kind, np.eye(d), np.eye(d), np.eye(d), beta=beta, shift=beta)
    traj = tp.simulate(att, equiangular_tokens(n, rho0), t_max=3.0, dt=0.01, solver="rk4",
                       block=tp.Block(constraint="sphere"))
    assert traj.status == "ok"
    G = np.einsum("tid,tjd->tij", traj.states, traj.states)
    off = ~np.eye(n, dtype=bool)
    assert float(np.ptp(G[:, off], axis=1).max()) < 1e-14
    rho = G[:, off].mean(axis=1)
    ref = equiangular_reference(beta, n, float(rho[0]), traj.times, model, beta)
    u, u_ref = beta * (1.0 - rho), beta * (1.0 - ref)
    assert u[-1] < 0.5 * u[0]                           # the run really moved
    np.testing.assert_allclose(u, u_ref, rtol=1e-6)


def test_a_shift_rescales_time():
    """USA with shift c and step h e^c is the unshifted run with step h, step for step
    (the RK4 increments h f are equal up to rounding): rtol 1e-12."""
    X0 = unit_tokens(6, 3, seed=7)
    c = 3.0
    att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=4.0)
    slow = tp.simulate(att.replace(shift=c), X0, t_max=1.0 * np.exp(c), dt=0.05 * np.exp(c),
                       block=tp.Block(constraint="sphere"))
    plain = tp.simulate(att, X0, t_max=1.0, dt=0.05, block=tp.Block(constraint="sphere"))
    np.testing.assert_allclose(slow.times * np.exp(-c), plain.times, rtol=1e-13)
    np.testing.assert_allclose(slow.states, plain.states, rtol=0, atol=1e-12)


def test_a_checkpoint_with_another_shift_does_not_resume(tmp_path):
    X0 = unit_tokens(5, 3, seed=8)
    kw = dict(t_max=0.3, dt=0.1, block=tp.Block(constraint="sphere"))
    path = tmp_path / "run.ckpt"

    def run(shift, resume):
        att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=5.0, shift=shift)
        mon = tp.Monitor(checkpoint=path, resume=resume, checkpoint_every=1e-9)
        return tp.simulate(att, X0, monitor=mon, **kw)

    done = run(1.0, False)
    for other in (2.0, 0.0):
        with pytest.raises(CheckpointError, match=r"different run: .*attention\.shift"):
            run(other, True)
    np.testing.assert_array_equal(run(1.0, True).states, done.states)
    path.unlink()
    run(0.0, False)
    with pytest.raises(CheckpointError, match=r"attention\.shift"):
        run(0.5, True)


def test_a_nonfinite_stop_of_the_exp_kernel_suggests_shift():
    # USA at beta = 1000 on the sphere overflows e^(beta <x, y>) without a shift: the run
    # stops with status "nonfinite" and its message says how shift avoids it
    rng = np.random.default_rng(3)
    X0 = rng.normal(size=(6, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention("exp", np.eye(3), np.eye(3), np.eye(3), beta=1000.0)
    with pytest.warns(tp.errors.EarlyStopWarning, match="shift"):
        traj = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver="rk4",
                           block=tp.Block(constraint="sphere"))
    assert traj.status == "nonfinite" and "Attention(..., shift=c)" in traj.message
    ok = tp.simulate(att.replace(shift=1000.0), X0, t_max=1.0, dt=0.1, solver="rk4",
                     block=tp.Block(constraint="sphere"))
    assert ok.status == "ok"


@pytest.mark.parametrize("kind", ["exp", "softmax"])
def test_the_plain_reference_takes_the_shift(kind):
    # transformer_pde.testing.references.field with shift= is the library's field with
    # Attention(shift=...): one rounding of each sum apart (rtol 1e-12)
    from transformer_pde.testing import references
    rng = np.random.default_rng(11)
    X = rng.normal(size=(9, 4))
    Q, K, V = (rng.normal(size=(4, 4)) for _ in range(3))
    att = tp.Attention(kind, Q, K, V, beta=0.8, shift=2.5)
    want = references.field(kind, X, Q, K, V, beta=0.8, shift=2.5)
    np.testing.assert_allclose(tp.velocity(att, X), want, rtol=1e-12, atol=1e-14)
