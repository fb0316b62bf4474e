"""simulate's grouped options (SaveAt, Limits, Monitor, FieldOptions, solver objects), the
result protocol, preflight refusals, time tolerances relative to the step, failures of
user callables mid-run, Ctrl-C, checkpoints and resuming, and load on bad files
(issues 12 and 13)."""

from __future__ import annotations

import json
import logging
import math
import warnings

import numpy as np
import pytest
from interrupts import StopOnce
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.errors import (ArgumentError, EarlyStopWarning, TransformerPDEError,
                                    TransformerPDEWarning)
from transformer_pde.errors import TrajectoryFileError
from transformer_pde.results import Result, Status


def softmax_att(d=2, seed=0):
    rng = np.random.default_rng(seed)
    return tp.Attention("softmax", rng.normal(size=(d, d)) / 2, np.eye(d), np.eye(d))


X0 = np.random.default_rng(1).normal(size=(7, 2))


# ------------------------------------------------------------------ SaveAt
@pytest.mark.parametrize("solver", ["rk4", tp.Dopri5(rtol=1e-10, atol=1e-12)])
def test_saveat_ts_lands_on_the_requested_times(solver):
    att = softmax_att()
    ts = [0.0, 0.25, 0.3, 0.75, 1.0]
    tr = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver=solver, saveat=tp.SaveAt(ts=ts))
    np.testing.assert_array_equal(tr.times, ts)
    fine = tp.simulate(att, X0, t_max=1.0, dt=0.01, solver=tp.Dop853(rtol=1e-12, atol=1e-14),
                       saveat=tp.SaveAt(ts=ts))
    # RK4 with h <= 0.1 on an O(1) flow: ~1e-6; the adaptive pair: its tolerance
    np.testing.assert_allclose(tr.states, fine.states, atol=1e-5 if solver == "rk4" else 1e-8)
    # without 0 and t_max: exactly the requested times
    tr = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver=solver, saveat=tp.SaveAt(ts=[0.5]))
    np.testing.assert_array_equal(tr.times, [0.5])
    with pytest.raises(ArgumentError, match="t_max"):
        tp.simulate(att, X0, t_max=1.0, dt=0.1, saveat=tp.SaveAt(ts=[2.0]))
    # a run stopped before the first requested time keeps its last state, at its time
    bad = tp.Attention("softmax", _bad_q("raise"), np.eye(2), np.eye(2))
    with pytest.warns(EarlyStopWarning, match="failed"):
        tr = tp.simulate(bad, X0, t_max=1.0, dt=0.1, solver=solver, saveat=tp.SaveAt(ts=[0.9]))
    assert tr.status == "failed" and tr.times.shape == (1,) and 0.2 < tr.times[0] <= 0.45
    assert tr.states.shape == (1, 7, 2) and "saved=1" in repr(tr)


def test_saveat_fn_keeps_a_statistic_and_the_moments(tmp_path):
    att = softmax_att()
    w = np.arange(1.0, 8.0)
    full = tp.simulate(att, X0, t_max=1.0, dt=0.1, weights=w)
    stat = tp.simulate(att, X0, t_max=1.0, dt=0.1, weights=w,
                       saveat=tp.SaveAt(fn=lambda t, X, w: np.abs(X).max(axis=0)))
    assert stat.states is None and stat.values.shape == (11, 2)
    np.testing.assert_array_equal(stat.values, np.abs(full.states).max(axis=1))
    np.testing.assert_array_equal(stat.final, full.final)
    m, c = full.moments()
    ms, cs = stat.moments()
    np.testing.assert_allclose(ms, m, rtol=0, atol=1e-14)
    np.testing.assert_allclose(cs, c, rtol=0, atol=1e-14)
    back = tp.load(stat.save(tmp_path / "stat.npz"))
    assert back.states is None
    np.testing.assert_array_equal(back.values, stat.values)
    np.testing.assert_array_equal(back.moments()[1], cs)
    # a statistic that fails on the initial state is an argument error
    with pytest.raises(ArgumentError, match="SaveAt\\(fn=...\\) failed"):
        tp.simulate(att, X0, t_max=1.0, dt=0.1, saveat=tp.SaveAt(fn=lambda t, X, w: 1 / 0))


def test_result_protocol_and_moments():
    w = np.random.default_rng(2).random(7)
    tr = tp.simulate(softmax_att(), X0, t_max=0.5, dt=0.1, weights=w)
    assert isinstance(tr, Result) and tr.status is Status.OK and tr.success
    means, covs = tr.moments()
    wn = w / w.sum()
    for k in (0, 5):
        np.testing.assert_allclose(means[k], np.average(tr.states[k], axis=0, weights=wn),
                                   atol=1e-14)
        np.testing.assert_allclose(covs[k], np.cov(tr.states[k].T, aweights=wn, bias=True),
                                   atol=1e-14)


def test_dop853_meets_tight_tolerances_with_fewer_steps():
    att = softmax_att()
    ref = tp.simulate(att, X0, t_max=2.0, dt=0.5, solver=tp.Dop853(rtol=1e-13, atol=1e-15))
    d5 = tp.simulate(att, X0, t_max=2.0, dt=0.5, solver=tp.Dopri5(rtol=1e-10, atol=1e-12))
    d8 = tp.simulate(att, X0, t_max=2.0, dt=0.5, solver=tp.Dop853(rtol=1e-10, atol=1e-12))
    for tr in (d5, d8):
        np.testing.assert_allclose(tr.final, ref.final, rtol=0, atol=1e-8)
    assert d8.info["n_steps"] < d5.info["n_steps"]
    assert d8.info["method"] == "dop853"


def test_options_that_do_not_apply_are_errors():
    att = softmax_att()
    with pytest.raises(TypeError, match="rtol"):
        tp.RK4(rtol=1e-6)                              # fixed-step: no tolerances
    with pytest.raises(ValueError, match="splitting='strang' applies only with an mlp"):
        tp.Block(splitting="strang")
    with pytest.raises(ValueError, match="sinkhorn_max_iter"):
        tp.simulate(att, X0, t_max=1.0, dt=0.1, field=tp.FieldOptions(sinkhorn_max_iter=5))


# ------------------------------------------------------------------ time tolerances
def test_time_tolerance_is_relative_to_the_step():
    att = softmax_att()
    tr = tp.simulate(att, X0, t_max=1e-11, dt=1e-13, solver="euler",
                     saveat=tp.SaveAt(every=10))
    assert tr.info["n_steps"] == 100 and tr.times[-1] == 1e-11 and len(tr.times) == 11
    tr = tp.simulate(att, X0, t_max=1e-12, dt=1e-13, solver="rk4")
    assert tr.info["n_steps"] == 10 and tr.times[-1] == 1e-12 and tr.status == "ok"
    # the state moved by t_max * field (not frozen); the difference is exact to the
    # rounding of X0 (|X0| < 4: ulp 8.9e-16) over 10 steps
    G = tp.velocity(att, X0)
    assert np.abs(tr.final - X0).min() > 1e-14
    np.testing.assert_allclose(tr.final - X0, 1e-12 * G, rtol=0, atol=1e-14)
    tr = tp.simulate(att, X0, t_max=1e-12, dt=1e-13, solver="dopri5")
    assert tr.status == "ok" and tr.times[-1] == 1e-12
    np.testing.assert_allclose(tr.final - X0, 1e-12 * G, rtol=0, atol=1e-14)
    # a partial last step is a step of its own; a remainder below 1e-9 dt is not
    assert tp.simulate(att, X0, t_max=1.05, dt=0.1, solver="euler").info["n_steps"] == 11
    assert tp.simulate(att, X0, t_max=1.0 + 1e-12, dt=0.1, solver="euler").info["n_steps"] == 10


# ------------------------------------------------------------------ preflight
def test_runs_that_cannot_finish_are_refused_up_front():
    att = softmax_att()
    with pytest.raises(ArgumentError, match=r"dt=1e-07 needs 10000000 steps.*max_steps"):
        tp.simulate(att, X0, t_max=1.0, dt=1e-7)
    with pytest.raises(ArgumentError, match=r"GiB.*SaveAt\(every=k\).*SaveAt\(fn=\.\.\.\)"):
        tp.simulate(att, X0, t_max=1.0, dt=0.1, limits=tp.Limits(max_memory=1000))
    # saving a statistic needs no memory for states; every=10 saves fewer
    tp.simulate(att, X0, t_max=1.0, dt=0.1, limits=tp.Limits(max_memory=1000),
                saveat=tp.SaveAt(fn=lambda t, X, w: X.mean()))
    tp.simulate(att, X0, t_max=1.0, dt=0.1, limits=tp.Limits(max_memory=400),
                saveat=tp.SaveAt(every=10))
    # the adaptive budget stops the run with its own status
    with pytest.warns(EarlyStopWarning, match="max_steps"):
        tr = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver=tp.Dopri5(rtol=1e-12),
                         limits=tp.Limits(max_steps=5))
    assert tr.status == "max_steps" and not tr.success and len(tr.times) >= 1


# ------------------------------------------------------------------ callables going bad
def _bad_q(mode):
    def Q(t):
        if t > 0.45:
            if mode == "raise":
                raise RuntimeError("weights file vanished")
            if mode == "shape":
                return np.eye(3)
            if mode == "nan":
                return np.full((2, 2), np.nan)
            if mode == "interrupt":
                raise KeyboardInterrupt
        return np.eye(2) * 0.5
    return Q


@pytest.mark.parametrize("mode,status,words", [
    ("raise", "failed", "RuntimeError in the step from t=0.4: weights file vanished"),
    ("shape", "failed", "has 3 columns but the attention was built with d=2"),
    ("nan", "failed", "NaN"),
    ("interrupt", "interrupted", "KeyboardInterrupt"),
])
@pytest.mark.parametrize("solver", ["rk4", "dopri5"])
def test_a_callable_going_bad_mid_run_keeps_every_state(mode, status, words, solver):
    att = tp.Attention("softmax", _bad_q(mode), np.eye(2), np.eye(2))
    with pytest.warns(EarlyStopWarning, match=status):
        tr = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver=solver)
    assert tr.status == status and not tr.success
    assert words in tr.message
    np.testing.assert_allclose(tr.times, [0.0, 0.1, 0.2, 0.3, 0.4], atol=1e-15)
    # the reference is the same computation (same t_max, so the same step sequence) with a
    # callable that never goes bad: the kept states are its first five, bit for bit.  A run
    # to t_max=0.4 would be a different computation (its last step is 0.4 - 0.30000000000000004).
    ok = tp.simulate(tp.Attention("softmax", _bad_q("none"), np.eye(2), np.eye(2)), X0,
                     t_max=1.0, dt=0.1, solver=solver)
    np.testing.assert_array_equal(ok.times[:5], tr.times)
    np.testing.assert_array_equal(tr.states, ok.states[:5])


def test_warnings_are_the_package_classes():
    att = tp.Attention("linear", [[1.0]], [[0.5]], [[1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", TransformerPDEWarning)
        # a blow-up is an answer: reported in the status only, even with warnings as errors
        tr = tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01,
                         limits=tp.Limits(max_norm=100.0))
        assert tr.status == "blowup" and tr.success
        # a spent budget is no answer: the warning is the package's class
        with pytest.raises(EarlyStopWarning, match="max_steps"):
            tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01, solver="dopri5",
                        limits=tp.Limits(max_steps=3))
        # warn=False leaves the status as the only report
        tr = tp.simulate(att, np.array([[1.0]]), t_max=5.0, dt=0.01, solver="dopri5",
                         limits=tp.Limits(max_steps=3), warn=False)
        assert tr.status == "max_steps" and not tr.success


# ------------------------------------------------------------------ progress, checkpoints
def test_progress_is_reported_by_time(caplog):
    with caplog.at_level(logging.INFO, logger="transformer_pde"):
        tr = tp.simulate(softmax_att(), X0, t_max=0.3, dt=0.1,
                         monitor=tp.Monitor(progress=True, report_every=1e-9))
    assert tr.status == "ok"
    assert sum("t = " in r.getMessage() for r in caplog.records) >= 3



def _resume_case(name):
    rng = np.random.default_rng(5)
    M = rng.normal(size=(2, 2)) / 2
    layers = tp.Layers(rng.normal(size=(3, 2, 2)) / 2, layer_time=0.35)
    cases = {
        "rk4": ("softmax", {}, "rk4"),
        "ab3_layers": ("softmax", {"V": layers}, "ab3"),
        "implicit_midpoint": ("softmax", {}, "implicit_midpoint"),
        "dopri5_layers": ("softmax", {"V": layers}, tp.Dopri5(rtol=1e-8)),
        "sinkhorn_rk4": ("sinkhorn", {}, "rk4"),
        "sinkhorn_euler": ("sinkhorn", {}, "euler"),
    }
    kind, extra, solver = cases[name]

    def att(t_stop):
        kw = {"Q": StopOnce(M, t_stop), "K": np.eye(2), "V": np.eye(2), **extra}
        return tp.Attention(kind, **kw)
    return att, solver


@pytest.mark.parametrize("name", ["rk4", "ab3_layers", "implicit_midpoint", "dopri5_layers",
                                  "sinkhorn_rk4", "sinkhorn_euler"])
def test_resumed_run_equals_uninterrupted_bit_for_bit(name, tmp_path):
    att, solver = _resume_case(name)
    kw = dict(t_max=1.0, dt=0.05, solver=solver, saveat=tp.SaveAt(every=3))
    ref = tp.simulate(att(None), X0, **kw)
    path = tmp_path / "run.ckpt"
    mon = tp.Monitor(checkpoint=path, checkpoint_every=1e-9)
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = tp.simulate(att(0.52), X0, monitor=mon, **kw)
    assert cut.status == "interrupted" and path.exists() and cut.times[-1] < 0.6
    again = tp.simulate(att(None), X0, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    assert again.status == "ok"
    np.testing.assert_array_equal(again.times, ref.times)
    np.testing.assert_array_equal(again.states, ref.states)
    assert again.info == ref.info          # step counts, Sinkhorn iterations per evaluation
    # resuming a finished run returns it at once
    done = tp.simulate(att(None), X0, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    np.testing.assert_array_equal(done.states, ref.states)


def test_resume_with_a_block_and_a_solver_object(tmp_path):
    rng = np.random.default_rng(6)
    X = rng.normal(size=(6, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    mlp = tp.blocks.MLP(rng.normal(size=(4, 3)), rng.normal(size=(3, 4)) / 2)
    M = np.eye(3)
    att = lambda t_stop: tp.Attention("softmax", StopOnce(M, t_stop), np.eye(3), np.eye(3))  # noqa: E731
    kw = dict(t_max=0.6, dt=0.05, solver=tp.ImplicitMidpoint(tol=1e-12),
              block=tp.Block(mlp=mlp, constraint="sphere", splitting="lie"))
    ref = tp.simulate(att(None), X, **kw)
    path = tmp_path / "block.ckpt"
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        tp.simulate(att(0.31), X, monitor=tp.Monitor(checkpoint=path, checkpoint_every=1e-9),
                    **kw)
    again = tp.simulate(att(None), X, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    np.testing.assert_array_equal(again.states, ref.states)
    assert again.info == ref.info
    with pytest.raises(ArgumentError, match="different run: solver"):
        tp.simulate(att(None), X, monitor=tp.Monitor(checkpoint=path, resume=True),
                    **{**kw, "solver": tp.ImplicitMidpoint(tol=1e-10)})


def test_ctrl_c_during_a_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C while the checkpoint is being written: no partial file is left behind, the
    previous checkpoint stays readable and resuming from it equals the uninterrupted run."""
    att = softmax_att()
    kw = dict(t_max=0.6, dt=0.05)
    ref = tp.simulate(att, X0, **kw)
    path = tmp_path / "run.ckpt"
    real_savez, calls = np.savez, []

    def savez(fh, **arrays):
        calls.append(1)
        if len(calls) == 4:
            fh.write(b"partial")
            raise KeyboardInterrupt
        real_savez(fh, **arrays)
    monkeypatch.setattr(np, "savez", savez)
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = tp.simulate(att, X0, monitor=tp.Monitor(checkpoint=path, checkpoint_every=1e-9),
                          **kw)
    monkeypatch.setattr(np, "savez", real_savez)
    assert cut.status == "interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]
    again = tp.simulate(att, X0, monitor=tp.Monitor(checkpoint=path, resume=True), **kw)
    np.testing.assert_array_equal(again.states, ref.states)


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    path = tmp_path / "run.ckpt"
    att = softmax_att()
    tp.simulate(att, X0, t_max=0.3, dt=0.1, monitor=tp.Monitor(checkpoint=path))
    with pytest.raises(ArgumentError, match="different run: dt"):
        tp.simulate(att, X0, t_max=0.3, dt=0.05,
                    monitor=tp.Monitor(checkpoint=path, resume=True))
    with pytest.raises(ArgumentError, match="different run: tokens"):
        tp.simulate(att, X0 + 1, t_max=0.3, dt=0.1,
                    monitor=tp.Monitor(checkpoint=path, resume=True))
    # no file yet: a fresh start
    tr = tp.simulate(att, X0, t_max=0.3, dt=0.1,
                     monitor=tp.Monitor(checkpoint=tmp_path / "new.ckpt", resume=True))
    assert tr.status == "ok"


# ------------------------------------------------------------------ load on bad files
def _good(tmp_path):
    tr = tp.simulate(softmax_att(), X0, t_max=0.3, dt=0.1)
    return tr.save(tmp_path / "good.npz")


def _rewrite(src, dst, drop=(), change=None, meta=None):
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files if k not in drop}
    if change:
        arrays.update(change)
    if meta is not None:
        arrays["meta"] = np.array(meta)
    np.savez(dst, **arrays)
    return dst


def test_load_bad_files_raise_one_clear_error(tmp_path):
    good = _good(tmp_path)
    raw = good.read_bytes()
    # the structural errors below are checked on a file without checksums (format version
    # 2): in a version-3 file every such edit is first a checksum mismatch
    # (tests/io/test_file_integrity.py)
    meta = json.loads(str(np.load(good)["meta"]))
    meta = {k: v for k, v in meta.items() if k not in ("checksums", "digest_algorithm")}
    meta["version"] = 2
    good = _rewrite(good, tmp_path / "legacy.npz", drop=("meta_checksum",),
                    meta=json.dumps(meta))
    files = {
        "truncated": (raw[: len(raw) // 2], "truncated or corrupt|not an NPZ"),
        "random": (np.random.default_rng(0).bytes(500), "not an NPZ archive"),
        "empty": (b"", "empty"),
    }
    for name, (data, words) in files.items():
        p = tmp_path / f"{name}.npz"
        p.write_bytes(data)
        with pytest.raises(TrajectoryFileError, match=words) as info:
            tp.load(p)
        assert str(p) in str(info.value)
    p = tmp_path / "plain.npy"
    np.save(p, np.zeros(3))
    with pytest.raises(TrajectoryFileError, match="plain .npy"):
        tp.load(p)
    bad_meta = {**meta, "status": "exploded"}
    cases = [
        (dict(meta="{not json"), "not valid JSON"),
        (dict(meta=json.dumps({**meta, "format": "other"})), "not a transformer-pde trajectory"),
        (dict(meta=json.dumps(bad_meta)), "bad metadata"),
        (dict(drop=("meta",)), "no 'meta' entry"),
        (dict(drop=("times",)), "missing array 'times'"),
        (dict(drop=("states",)), "missing array 'states'"),
        (dict(change={"times": np.zeros(2)}), "inconsistent arrays: states"),
        (dict(change={"weights": np.ones(3)}), "inconsistent arrays"),
        (dict(change={"states": np.zeros((4, 7), dtype=complex)}), "inconsistent arrays"),
        (dict(change={"att__Q": np.zeros((5, 5, 5))}), "stored attention is invalid"),
    ]
    for i, (kw, words) in enumerate(cases):
        p = _rewrite(good, tmp_path / f"case{i}.npz", **kw)
        with pytest.raises(TrajectoryFileError, match=words) as info:
            tp.load(p)
        assert str(p) in str(info.value)
        assert isinstance(info.value, (TransformerPDEError, ValueError))
    with pytest.raises(FileNotFoundError):
        tp.load(tmp_path / "missing.npz")


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(-14, 0.5), ratio=st.floats(0.5, 150.0), every=st.integers(1, 7))
def test_fixed_steps_cover_t_max_exactly(scale, ratio, every):
    # any time scale (t_max <= 3: no growth past max_norm): the step count is
    # ceil(t_max / dt - 1e-9), times increase strictly
    # and end exactly at t_max (issue 13: the tolerance was absolute, 1e-12 max(1, t_max))
    t_max = 10.0 ** scale
    dt = t_max / ratio
    tr = tp.simulate(softmax_att(), X0[:3], t_max=t_max, dt=dt, solver="euler",
                     saveat=tp.SaveAt(every=every))
    n = max(1, math.ceil(t_max / dt - 1e-9))
    assert tr.info["n_steps"] == n and tr.status == "ok"
    assert tr.times[-1] == t_max and np.all(np.diff(tr.times) > 0)
    assert len(tr.times) == math.ceil(n / every) + 1
