"""What a run owns, and what a resume must match (issue 40, round 3).

* Exceptions the time loop does not own pass through it: one raised by a signal handler
  (a caller's SIGALRM timeout, whatever its class), ``MemoryError``; the checkpoint on disk
  stays whole and a resume finishes the run bit for bit.  Errors of the run itself (a user
  callable raising, even ``TimeoutError``) still end it with status ``failed``.
* The run's limits are part of what a checkpoint is compared by: a lower ``max_norm`` or a
  ``max_steps`` the checkpoint already spent is refused naming the field; a checkpoint
  written before limits were recorded resumes with a warning saying what was not compared.
* Callables of time are compared at the stage times of the checkpointed steps, not only at
  the saved times; a resumed run carries the probe times of its checkpoint forward.
* A restored loop state is checked against its invariants even when the file's digests
  match (a state edited and signed again with the library's own digest functions): the
  error names the checkpoint and the broken invariant.  A hypothesis fuzz draws the field
  and the edit.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.errors import (ArgumentError, CheckpointError, CheckpointWarning,
                                    EarlyStopWarning, IntegrityError, TrajectoryFileError)
from transformer_pde.integrate import checkpoint as ckmod
from transformer_pde.integrate.loop import owned
from transformer_pde.integrate.state import EvaluationTimes
from transformer_pde.particles.identity import run_identity

RNG = np.random.default_rng(40)
X0 = RNG.normal(size=(5, 2))
M = RNG.normal(size=(2, 2)) / 2
KW = dict(t_max=0.6, dt=0.05)


class Clock:
    """The matrix ``M`` (times ``scale(t)``) as a callable of time.  At its ``at``-th
    evaluation it calls ``action`` (arm a timer, send a signal, raise); it sleeps ``nap``
    seconds per evaluation (so that a timer armed mid-run fires mid-run); it raises
    KeyboardInterrupt once, at its first evaluation after ``t_stop`` (Ctrl-C)."""

    def __init__(self, at=None, action=None, nap=0.0, scale=None, t_stop=None):
        self.calls, self.at, self.action, self.nap = 0, at, action, nap
        self.scale, self.t_stop = scale, t_stop

    def __call__(self, t):
        self.calls += 1
        if self.t_stop is not None and t > self.t_stop:
            self.t_stop = None
            raise KeyboardInterrupt
        if self.calls == self.at:
            self.action()
        if self.nap:
            time.sleep(self.nap)
        return M if self.scale is None else M * self.scale(t)


def att(Q=None):
    return tp.Attention("softmax", Clock() if Q is None else Q, np.eye(2), np.eye(2))


def run(path=None, *, resume=False, a=None, **kw):
    mon = None if path is None else tp.Monitor(checkpoint=path, resume=resume,
                                               checkpoint_every=1e-9)
    return tp.simulate(att() if a is None else a, X0, monitor=mon, **{**KW, **kw})


def assert_same(a, b):
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.states, b.states)
    assert a.info == b.info and a.status == b.status


class Deadline(Exception):
    """A caller's own timeout class."""


@pytest.fixture
def handler():
    """Install a handler on SIGALRM/SIGUSR1 for one test; restores the old ones."""
    old = {s: signal.getsignal(s) for s in (signal.SIGALRM, signal.SIGUSR1)}

    def install(sig, fn):
        signal.signal(sig, fn)
    yield install
    signal.setitimer(signal.ITIMER_REAL, 0.0)
    for s, h in old.items():
        signal.signal(s, h)


def _send_usr1():
    os.kill(os.getpid(), signal.SIGUSR1)


# ------------------------------------------------------------------ exceptions it does not own
def test_a_callers_timeout_reaches_the_caller_and_the_checkpoint_resumes(handler, tmp_path):
    """SIGALRM from setitimer, its handler raising the caller's class, during a run that
    checkpoints at every step: the exception reaches the caller (not status 'failed'),
    with a note saying where the run stood; the checkpoint is whole and the resumed run
    equals the uninterrupted one."""
    ref = run()

    def on_alarm(signum, frame):
        raise Deadline("time is up")
    handler(signal.SIGALRM, on_alarm)
    path = tmp_path / "run.ckpt"
    arm = functools.partial(signal.setitimer, signal.ITIMER_REAL, 0.02)
    with pytest.raises(Deadline, match="time is up") as info:
        # 12 steps x 4 stages, 15 ms each: the timer armed at the 9th evaluation fires
        # 20 ms later, long before the run could end
        run(path, a=att(Clock(at=9, action=arm, nap=0.015)))
    note = " ".join(getattr(info.value, "__notes__", []))
    assert "transformer-pde: the run stopped at t=" in note
    stopped = float(note.split("t=")[1].split(" ")[0])
    assert 0.0 < stopped < KW["t_max"]
    assert path.exists()
    again = run(path, resume=True)
    assert_same(again, ref)


class _Raiser:
    def __init__(self, exc):
        self.exc = exc

    def method(self, signum, frame):
        raise self.exc

    def __call__(self, signum, frame):
        raise self.exc


def _raise(exc, signum, frame):
    raise exc


def _handler_kinds(exc):
    """The same handler written the ways signal.signal accepts a Python callable."""
    def function(signum, frame):
        raise exc
    return {"function": function, "bound_method": _Raiser(exc).method,
            "callable_object": _Raiser(exc), "partial": functools.partial(_raise, exc),
            "lambda_calling_a_helper": lambda s, f: _raise(exc, s, f)}


class _MyRuntime(RuntimeError):
    pass


# every handler kind with the caller's class; then classes the loop would own if the
# computation raised them (RuntimeError, FloatingPointError, the library's own errors)
_CASES = [(kind, Deadline) for kind in _handler_kinds(None)] + [
    ("function", cls) for cls in (TimeoutError, _MyRuntime, FloatingPointError, ArgumentError)]


@pytest.mark.parametrize("kind, cls", _CASES, ids=[f"{k}-{c.__name__}" for k, c in _CASES])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpointed"])
def test_any_exception_of_a_signal_handler_passes_through(kind, cls, checkpoint, handler,
                                                          tmp_path):
    handler(signal.SIGUSR1, _handler_kinds(cls("stop"))[kind])
    path = tmp_path / "run.ckpt" if checkpoint else None
    with pytest.raises(cls, match="stop"):
        run(path, a=att(Clock(at=10, action=_send_usr1)))
    if checkpoint:
        assert_same(run(path, resume=True), run())


def test_a_signal_during_a_checkpoint_write_passes_through(handler, tmp_path, monkeypatch):
    """The checkpoint writer warns about a failed write and goes on, except for an
    exception the run does not own: it propagates and the previous checkpoint stays."""
    handler(signal.SIGUSR1, _handler_kinds(Deadline("stop"))["function"])
    real, calls = ckmod.write_checkpoint, []

    def write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            _send_usr1()
        real(*args, **kwargs)
    monkeypatch.setattr(ckmod, "write_checkpoint", write)
    path = tmp_path / "run.ckpt"
    with pytest.raises(Deadline):
        run(path)
    monkeypatch.setattr(ckmod, "write_checkpoint", real)
    assert_same(run(path, resume=True), run())


def test_memory_error_passes_through_and_the_runs_own_errors_do_not(tmp_path):
    def oom():
        raise MemoryError("cannot allocate")
    with pytest.raises(MemoryError, match="cannot allocate"):
        run(a=att(Clock(at=10, action=oom)))
    # the same classes raised by the computation itself (not by a signal handler) are the
    # run's: status failed, the states saved so far kept
    for exc in (Deadline("mine"), TimeoutError("mine")):
        def bad(exc=exc):
            raise exc
        with pytest.warns(EarlyStopWarning, match="failed"):
            tr = run(a=att(Clock(at=10, action=bad)))
        assert tr.status == "failed" and type(exc).__name__ in tr.message
        assert len(tr.times) >= 2


def test_owned_sorts_by_where_an_exception_was_raised(handler):
    assert owned(ValueError("x")) and owned(FloatingPointError()) and owned(Deadline())
    assert not owned(MemoryError()) and not owned(KeyboardInterrupt()) \
        and not owned(SystemExit(1))
    caught = {}

    def on_usr1(signum, frame):
        raise Deadline("from the handler")
    handler(signal.SIGUSR1, on_usr1)
    for name in ("direct", "chained"):
        try:
            try:
                _send_usr1()
                for _ in range(1000):   # the handler runs at the next bytecode checks
                    pass
            except Deadline as exc:
                if name == "direct":
                    raise
                raise ArgumentError("converted") from exc
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            caught[name] = exc
    assert not owned(caught["direct"])
    assert not owned(caught["chained"])   # raised from the handler's exception


# ------------------------------------------------------------------ limits
def interrupted(path, t_stop=0.3, **kw):
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = run(path, a=att(Clock(t_stop=t_stop)), **kw)
    assert cut.status == "interrupted" and path.exists()
    return cut


def test_a_lower_max_norm_is_refused_a_higher_one_resumes(tmp_path):
    path = tmp_path / "run.ckpt"
    interrupted(path, limits=tp.Limits(max_norm=1e3))
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"different run: limits\.max_norm \(1000 in the "
                                              r"checkpoint, 50 now") as info:
        run(path, resume=True, limits=tp.Limits(max_norm=50.0))
    assert str(path) in str(info.value) and path.read_bytes() == before
    # a larger max_norm: every checkpointed state was below the old one, so a fresh run
    # with the larger one reaches the same checkpoint
    big = tp.Limits(max_norm=1e9)
    assert_same(run(path, resume=True, limits=big), run(limits=big))


def test_a_max_steps_the_checkpoint_spent_is_refused_a_larger_one_resumes(tmp_path):
    path = tmp_path / "run.ckpt"
    kw = dict(solver="dopri5", t_max=3.0, dt=0.2)
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        run(path, a=att(Clock(t_stop=1.5)), **kw)
    n = json.loads(str(np.load(path)["meta"]))   # the checkpoint's attempted steps
    steps = _loop_of(path)["n_steps"]
    assert n["body"]["run"]["limits"]["max_steps"] == 1_000_000 and steps > 3
    with pytest.raises(CheckpointError, match=rf"limits\.max_steps \(the checkpoint took "
                                              rf"{steps} steps; max_steps={steps} now") as info:
        run(path, resume=True, limits=tp.Limits(max_steps=steps), **kw)
    assert str(path) in str(info.value)
    more = tp.Limits(max_steps=steps + 50, max_memory=2 ** 20)   # max_memory never matters
    assert_same(run(path, resume=True, limits=more, **kw), run(limits=more, **kw))


def _identity(record):
    """A RunIdentity equal to the one ``record`` was written with (Q is a Clock)."""
    return ckmod.RunIdentity(record["static"], {"attention.Q(t)": Clock()})


def _loop_of(path):
    record = json.loads(str(np.load(path)["meta"]))["body"]["run"]
    return ckmod.read_checkpoint(path, _identity(record), lambda a: a)["loop"]


def test_a_checkpoint_without_limits_resumes_with_a_warning(tmp_path):
    """What the previous version wrote: the record without limits and with the probe
    times 0, t and the saved times only (no stage times)."""
    path = tmp_path / "run.ckpt"
    cut = interrupted(path)
    meta = json.loads(str(np.load(path)["meta"]))
    record = meta["body"]["run"]
    identity = _identity(record)
    state = ckmod.read_checkpoint(path, identity, lambda a: a)
    old_times = sorted({0.0, state["loop"]["t"], *cut.times.tolist()})
    assert set(old_times) < set(record["probe_times"])   # stage times are recorded now
    old = {"static": record["static"], "probe_times": old_times,
           "probes": identity.probe(old_times)}
    ckmod.write_checkpoint(path, old, state)
    with pytest.warns(CheckpointWarning, match=r"earlier transformer-pde.*limits nor "
                                               r"callables between the probe times"):
        again = run(path, resume=True)
    assert_same(again, run())
    # its saved states are still checked against a lower max_norm
    ckmod.write_checkpoint(path, old, state)
    top = max(np.abs(x).max() for x in state["saver"]["states"])
    with pytest.warns(CheckpointWarning), pytest.raises(
            CheckpointError, match=r"limits\.max_norm \(its states reach") as info:
        run(path, resume=True, limits=tp.Limits(max_norm=top / 2))
    assert str(path) in str(info.value)


# ------------------------------------------------------------------ callables at stage times
def _between(t, lo=0.0, hi=np.inf):
    """2 at the midpoints of the 0.05-steps in (lo, hi), 1 elsewhere: equal at every save
    and step end, different at the RK4 stage times t_n + dt/2."""
    frac = (t / 0.05) % 1.0
    return 2.0 if 0.25 < frac < 0.75 and lo < t < hi else 1.0


def test_a_callable_differing_only_at_stage_times_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    interrupted(path)
    with pytest.raises(CheckpointError, match=r"different run: attention\.Q\(t\) differ"):
        run(path, resume=True, a=att(Clock(scale=_between)))
    assert_same(run(path, resume=True), run())


def test_a_resumed_run_carries_the_probe_times_of_its_checkpoint(tmp_path):
    """Checkpoint at 0.3, resumed and interrupted again at 0.45: the second checkpoint
    still compares the stage times of the first part (0.1 < t < 0.2 here)."""
    path = tmp_path / "run.ckpt"
    interrupted(path, t_stop=0.3)
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        run(path, resume=True, a=att(Clock(t_stop=0.45)))
    with pytest.raises(CheckpointError, match=r"attention\.Q\(t\) differ"):
        run(path, resume=True, a=att(Clock(scale=functools.partial(_between, lo=0.1,
                                                                   hi=0.2))))
    assert_same(run(path, resume=True), run())


# ------------------------------------------------------------------ invariants
def _resign(src, dst, edit):
    """Copy checkpoint ``src`` to ``dst`` with its decoded state edited by ``edit(state)``,
    signed again with the library's own digests (as a bug or an attacker could)."""
    record = json.loads(str(np.load(src)["meta"]))["body"]["run"]
    state = ckmod.read_checkpoint(src, _identity(record), lambda a: a)
    edit(state)
    ckmod.write_checkpoint(dst, record, state)
    return dst


@pytest.fixture(scope="module")
def fixed_ckpt(tmp_path_factory):
    """A mid-run checkpoint of a fixed-step run saving at given times, and its reference."""
    path = tmp_path_factory.mktemp("fixed") / "run.ckpt"
    kw = dict(solver="ab3", saveat=tp.SaveAt(ts=[0.0, 0.2, 0.33, 0.5, 0.6]))

    def go(p=None, resume=False, stop=None):
        return run(p, resume=resume, a=att(Clock(t_stop=stop)), **kw)
    with pytest.warns(EarlyStopWarning):
        go(path, stop=0.36)
    return path, go(), go


@pytest.fixture(scope="module")
def adaptive_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("adaptive") / "run.ckpt"
    kw = dict(solver="dopri5", t_max=2.0, dt=0.1)

    def go(p=None, resume=False, stop=None):
        return run(p, resume=resume, a=att(Clock(t_stop=stop)), **kw)
    with pytest.warns(EarlyStopWarning):
        go(path, stop=1.1)
    return path, go(), go


def _set(field, value):
    def edit(state):
        state["loop"][field] = value(state["loop"][field]) if callable(value) else value
    return edit


def _y(change):
    def edit(state):
        state["loop"]["y"] = change(np.array(state["loop"]["y"]))
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set("t", 0.7), r"t=0\.7 is not a finite time in \[0, t_max=0\.6\]"),
    (_set("t", math.nan), r"t=nan is not a finite time"),
    (_set("t", -0.05), "not a finite time"),
    (_y(lambda y: y[1:]), r"y of shape \(4, 2\).*not the run's \(5, 2\) float64"),
    (_y(lambda y: y.astype(np.float32)), "dtype float32"),
    (_y(lambda y: np.where(y == y.max(), np.inf, y)), "y has non-finite entries"),
    (_set("target", 1), "target 1"),
    (_set("h", 0.1), r"step size h=0\.1"),
    (_set("steps_left", 0), "steps_left=0"),
    (_set("n_rejected", 1), "n_rejected=1"),
    (_set("done", True), "done=True"),
    (lambda s: s["saver"]["times"].reverse(), "saved times"),
    (lambda s: s["saver"]["states"].__setitem__(1, s["saver"]["states"][1][:4]),
     r"saved state 1 of shape \(4, 2\)"),
], ids=["t_beyond_t_max", "t_nan", "t_negative", "row_missing", "float32", "inf_entry",
        "target", "h", "steps_left", "n_rejected", "done", "saved_times", "saved_row"])
def test_a_resigned_state_breaking_an_invariant_is_refused(edit, words, fixed_ckpt, tmp_path):
    src, ref, go = fixed_ckpt
    bad = _resign(src, tmp_path / "bad.ckpt", edit)
    with pytest.raises(IntegrityError, match=words) as info:
        go(bad, resume=True)
    assert f"checkpoint {bad}: its loop state breaks an invariant" in str(info.value)
    # the untouched checkpoint signed the same way resumes into the uninterrupted run
    assert_same(go(_resign(src, tmp_path / "good.ckpt", lambda s: None), resume=True), ref)


# the edits a fuzz draws: values no run could hold there, per field and kind of run
_NAN, _INF = math.nan, math.inf


def _edits(loop, adaptive, t_max, max_steps=1_000_000):
    """Strategies of (field, new value) for a loop state ``loop`` that break an invariant."""
    y = np.asarray(loop["y"])
    n, d = y.shape
    bad_type = st.sampled_from([None, "0.3", [1.0], True])
    weird = st.sampled_from([_NAN, _INF, -_INF])
    rows = st.integers(0, n - 1)
    arrays = st.one_of(
        rows.map(lambda k: np.delete(y, k, axis=0)),                       # a row missing
        st.tuples(rows, st.integers(0, d - 1), weird).map(
            lambda a: _poke(y, *a)),                                       # a non-finite entry
        st.just(y.astype(np.float32)), st.just(np.hstack([y, y[:, :1]])),  # dtype, a column
        st.just(y[None]))
    out = {
        "t": st.one_of(weird, bad_type, st.floats(t_max, 1e300, exclude_min=True),
                       st.floats(-1e300, 0.0, exclude_max=True), st.just(t_max)),
        "target": st.one_of(bad_type, st.integers(-10 ** 6, 10 ** 6).filter(
            lambda k: k != loop["target"])),
        "n_steps": st.one_of(bad_type, st.integers(-10 ** 6, -1),
                             st.integers(max_steps, 10 ** 9), st.just(1.5)),
        "n_rejected": st.one_of(bad_type, st.integers(-10 ** 6, -1),
                                st.integers(loop["n_steps"] + 1, 10 ** 9)),
        "done": st.one_of(st.just(not loop["done"]), st.sampled_from(["yes", 1, None])),
        "y": st.one_of(arrays, bad_type),
    }
    if adaptive:
        out["h"] = st.one_of(weird, bad_type, st.floats(-1e300, 0.0))
        out["err_prev"] = st.one_of(weird, bad_type, st.floats(-1e300, 1e-11))
        out["steps_left"] = st.integers(-5, 10 ** 6)
        out["fy"] = arrays
    else:
        out["h"] = st.one_of(bad_type, st.floats(allow_nan=True).filter(
            lambda h: h != loop["h"]))
        out["err_prev"] = st.one_of(bad_type, st.floats(allow_nan=True).filter(
            lambda e: e != 1.0))
        # a segment of these runs has at most 12 steps (the count is checked within one)
        out["steps_left"] = st.one_of(st.integers(-10 ** 6, 0), st.just(1.5),
                                      st.integers(100, 10 ** 9))
        out["fy"] = st.just(y.copy())
    return out


def _poke(y, i, j, value):
    out = y.copy()
    out[i, j] = value
    return out


@pytest.mark.parametrize("kind", ["fixed", "adaptive"])
@given(data=st.data())
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_resigned_states_are_refused_naming_the_file_or_resume_identically(
        kind, fixed_ckpt, adaptive_ckpt, tmp_path, data):
    src, ref, go = fixed_ckpt if kind == "fixed" else adaptive_ckpt
    loop = _loop_of(src)
    t_max = float(ref.times[-1])
    edits = _edits(loop, kind == "adaptive", t_max)
    field = data.draw(st.sampled_from(sorted(edits) + ["unchanged", "saver.times"]),
                      label="field")
    if field == "unchanged":
        edit = lambda s: None   # noqa: E731 - the identity edit
    elif field == "saver.times":
        how = data.draw(st.sampled_from(["nan", "swap", "beyond_t", "empty"]), label="how")
        edit = functools.partial(_edit_times, how)
    else:
        value = data.draw(edits[field], label=field)
        edit = _set(field, lambda old, v=value: v)
    bad = _resign(src, tmp_path / "fuzz.ckpt", edit)
    try:
        again = go(bad, resume=True)
    except (TrajectoryFileError, CheckpointError) as exc:
        assert str(bad) in str(exc)
        assert field != "unchanged"
        return
    assert field == "unchanged", f"an edit of {field} resumed"
    assert_same(again, ref)


def _edit_times(how, state):
    times = state["saver"]["times"]
    if how == "nan":
        times[-1] = math.nan
    elif how == "swap":
        times[0], times[1] = times[1], times[0]
    elif how == "beyond_t":
        times[-1] = state["loop"]["t"] + 1.0
    else:
        times.clear()


def test_limits_and_stage_times_leave_the_fingerprint_and_plain_records_as_they_were():
    """The compared fields (the fingerprint, ``static``) do not depend on the limits, and a
    run without callables of time records the probe times it recorded before."""
    kw = dict(att=tp.Attention("softmax", M, np.eye(2), np.eye(2)), X0=X0,
              weights=np.full(5, 0.2), positions=np.zeros(5), dtype=np.float64,
              backend="numpy", field_options={}, solver=tp.RK4(), t_max=0.6, dt=0.05,
              saveat=tp.SaveAt(), block=None)
    plain = run_identity(**kw)
    limited = run_identity(**kw, limits=tp.Limits(max_norm=10.0, max_steps=99))
    assert limited.static == plain.static and not any("limit" in k for k in plain.static)
    saved = [0.0, 0.05, 0.1]
    assert plain.record(saved, 0.1) == {"static": plain.static, "probe_times": saved,
                                        "probes": {}}
    assert limited.record(saved, 0.1)["limits"] == {"max_norm": 10.0, "max_steps": 99,
                                                    "max_memory": None}


def test_evaluation_times_keep_first_last_and_spread_attempts_within_a_bound():
    rec = EvaluationTimes(first=2, last=2, spread=16)
    n = 10 ** 5
    for i in range(n):
        rec.add([i + 0.0, i + 0.5])
    kept = rec.times()
    assert {0.0, 0.5, 1.0, 1.5, n - 2.0, n - 1.5, n - 1.0, n - 0.5} <= set(kept)
    assert len(kept) <= 2 * (2 + 2 + 16)
    starts = sorted({int(s) for s in kept})
    gaps = np.diff(starts[2:-2])   # the spread attempts: one stride apart
    assert gaps.size >= 7 and np.all(gaps == rec.stride)
