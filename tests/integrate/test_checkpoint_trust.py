"""Checkpoints can be trusted: a resume continues only the same run from an intact file.

A checkpoint of another run (other block weights, LayerNorm scale, callable parameters,
SaveAt(fn), Sinkhorn tolerance) is refused naming the fields that differ; an edited,
truncated or random file is an IntegrityError naming it; bad checkpoint paths are refused
before the first step and never overwritten; a failed write keeps the run; one solver
object can serve concurrent runs; and resuming an unchanged run stays bit for bit."""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.blocks import LayerNorm, MLP
from transformer_pde.errors import (ArgumentError, ArgumentTypeError, CheckpointError,
                                    CheckpointWarning, EarlyStopWarning, IntegrityError,
                                    TrajectoryFileError)
from transformer_pde.integrate import checkpoint as ckmod
from transformer_pde.integrate.loop import LoopState

RNG = np.random.default_rng(11)
X0 = RNG.normal(size=(5, 2))
M = RNG.normal(size=(2, 2)) / 2
W1, W2 = RNG.normal(size=(3, 2)), RNG.normal(size=(2, 3)) / 2
KW = dict(t_max=0.6, dt=0.05)


def att(Q=M, kind="softmax", **extra):
    return tp.Attention(kind, Q, np.eye(2), np.eye(2), **extra)


class Stop:
    """A matrix of time, ``M`` up to ``switch`` and ``M2`` after, that raises
    KeyboardInterrupt once, at its first evaluation after ``t_stop`` (never for ``None``)."""

    def __init__(self, M, t_stop=None, switch=np.inf, M2=None):
        self.M, self.t_stop, self.fired = M, t_stop, t_stop is None
        self.switch, self.M2 = switch, M2

    def __call__(self, t):
        if not self.fired and t > self.t_stop:
            self.fired = True
            raise KeyboardInterrupt
        return self.M if t <= self.switch else self.M2


def run(path=None, *, resume=False, every=1e-9, a=None, **kw):
    mon = None if path is None else tp.Monitor(checkpoint=path, resume=resume,
                                               checkpoint_every=every)
    return tp.simulate(att() if a is None else a, X0, monitor=mon, **{**KW, **kw})


def interrupted(path, t_stop=0.3, **kw):
    """Run with a checkpoint, Ctrl-C after ``t_stop``: the checkpoint is mid-run."""
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = run(path, a=att(Stop(M, t_stop)), **kw)
    assert cut.status == "interrupted" and path.exists()
    return cut


def assert_same(a, b):
    np.testing.assert_array_equal(a.times, b.times)
    if a.states is None:
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.last, b.last)
    else:
        np.testing.assert_array_equal(a.states, b.states)
    assert a.info == b.info


# ------------------------------------------------------------------ another run
def _mean(t, X, w):
    return X.mean(axis=0)


def _std(t, X, w):
    return X.std(axis=0)


_MISMATCHES = {
    # name: (options of the written run, options of the resumed run, field named)
    "mlp_weights": (dict(block=tp.Block(mlp=MLP(W1, W2), splitting="lie")),
                    dict(block=tp.Block(mlp=MLP(W1 * 1.001, W2), splitting="lie")),
                    "block.mlp.W1"),
    "mlp_bias": (dict(block=tp.Block(mlp=MLP(W1, W2, b2=[0.0, 0.1]))),
                 dict(block=tp.Block(mlp=MLP(W1, W2, b2=[0.0, 0.2]))), "block.mlp.b2"),
    "mlp_callable": (dict(block=tp.Block(mlp=MLP(lambda t: W1 * (1 + t), W2))),
                     dict(block=tp.Block(mlp=MLP(lambda t: W1 * (1 + 2 * t), W2))),
                     r"block.mlp.W1\(t\)"),
    "layernorm_scale": (dict(block=tp.Block(layernorm=LayerNorm(scale=[1.0, 2.0]))),
                        dict(block=tp.Block(layernorm=LayerNorm(scale=[1.0, 2.5]))),
                        "block.layernorm.attention.scale"),
    "post_layernorm": (dict(block=tp.Block(layernorm=LayerNorm("post", variance=1.0))),
                       dict(block=tp.Block(layernorm=LayerNorm("post", variance=2.0))),
                       "block.constraint.layernorm.variance"),
    "no_block": (dict(), dict(block=tp.Block(mlp=MLP(W1, W2))), "block"),
    "callable_Q": (dict(a=att(lambda t: M * (1 + t))), dict(a=att(lambda t: M * (1 - t))),
                   r"attention.Q\(t\)"),
    "layers_V": (dict(a=tp.Attention("softmax", M, np.eye(2), tp.Layers(
                     np.stack([np.eye(2), 2 * np.eye(2)]), layer_time=0.3))),
                 dict(a=tp.Attention("softmax", M, np.eye(2), tp.Layers(
                     np.stack([np.eye(2), 2.001 * np.eye(2)]), layer_time=0.3))),
                 "attention.V"),
    "saveat_fn": (dict(saveat=tp.SaveAt(fn=_mean)), dict(saveat=tp.SaveAt(fn=_std)),
                  "saveat.fn"),
    "saveat_every": (dict(saveat=tp.SaveAt(every=2)), dict(saveat=tp.SaveAt(every=3)),
                     "saveat.every"),
    "solver_options": (dict(solver=tp.Dopri5(rtol=1e-6)), dict(solver=tp.Dopri5(rtol=1e-7)),
                       "solver"),
    "sinkhorn_tol": (dict(a=att(kind="sinkhorn"), field=tp.FieldOptions(sinkhorn_tol=1e-9)),
                     dict(a=att(kind="sinkhorn"), field=tp.FieldOptions(sinkhorn_tol=1e-7)),
                     "field.sinkhorn_tol"),
}


@pytest.mark.parametrize("name", sorted(_MISMATCHES))
def test_resume_refuses_a_checkpoint_of_another_run(name, tmp_path):
    first, second, field = _MISMATCHES[name]
    path = tmp_path / "run.ckpt"
    done = run(path, **first)
    assert done.status == "ok"
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=f"different run: .*{field}") as info:
        run(path, resume=True, **second)
    assert isinstance(info.value, ArgumentError) and str(path) in str(info.value)
    assert path.read_bytes() == before          # the refused checkpoint is kept as it was
    # the same options, as fresh equal objects, resume (the finished run, at once)
    again = run(path, resume=True, **copy.deepcopy(first))
    assert_same(again, done)


def test_a_callable_is_compared_where_the_checkpoint_used_it(tmp_path):
    """Q(t) that differs only after the checkpoint's time continues the same computation
    (the resumed part is the new run's); one that differs before it is refused."""
    path = tmp_path / "run.ckpt"
    cut = interrupted(path, t_stop=0.3)
    assert cut.times[-1] <= 0.3
    ref = run(a=att(Stop(M, switch=0.45, M2=2 * M)))
    again = run(path, resume=True, a=att(Stop(M, switch=0.45, M2=2 * M)))
    assert_same(again, ref)
    interrupted(path, t_stop=0.3)
    with pytest.raises(CheckpointError, match=r"different run: attention.Q\(t\) differ"):
        run(path, resume=True, a=att(Stop(M, switch=0.1, M2=2 * M)))


# ------------------------------------------------------------------ same run
@pytest.mark.parametrize("opts", [
    dict(block=tp.Block(mlp=MLP(W1, W2), layernorm=LayerNorm(scale=[1.0, 2.0]),
                        splitting="lie")),
    dict(saveat=tp.SaveAt(fn=_mean)),
    dict(solver="ab3"),
    dict(a=att(kind="sinkhorn"), solver="rk4"),
], ids=["block", "saveat_fn", "ab3", "sinkhorn"])
def test_resuming_the_same_run_is_bit_for_bit(opts, tmp_path):
    opts = dict(opts)
    kind = opts.pop("a", att()).kind
    ref = run(a=att(Stop(M), kind=kind), **copy.deepcopy(opts))
    path = tmp_path / "run.ckpt"
    with pytest.warns(EarlyStopWarning, match="interrupted"):
        cut = run(path, a=att(Stop(M, 0.3), kind=kind), **opts)
    assert cut.times[-1] < 0.45
    again = run(path, resume=True, a=att(Stop(M), kind=kind), **copy.deepcopy(opts))
    assert again.status == "ok"
    assert_same(again, ref)


def test_state_objects_round_trip_as_plain_versioned_data():
    st_ = LoopState(t=0.25, y=np.ones((2, 2)), n_steps=5, steps_left=3, h=0.05)
    data = st_.get_state()
    assert data["version"] == LoopState.VERSION and data["t"] == 0.25
    back = LoopState.from_state(data)
    assert (back.t, back.n_steps, back.steps_left, back.h, back.fy) == (0.25, 5, 3, 0.05, None)
    assert back.y is st_.y
    with pytest.raises(ValueError, match="version"):
        LoopState.from_state({**data, "version": 7})
    with pytest.raises(ValueError, match="n_steps"):
        LoopState.from_state({**data, "n_steps": 1.5})
    ab = tp.AdamsBashforth(3)
    assert ab.get_state() == {"version": 1, "fs": [], "hs": [], "t_next": None}
    with pytest.raises(ValueError, match="version"):
        ab.set_state({"fs": [], "hs": [], "t_next": None})
    # the codec stores plain data only
    with pytest.raises(TypeError, match="cannot checkpoint an object"):
        ckmod.encode({"solver": ab}, {})
    arrays = {}
    desc = ckmod.encode({"a": [1, -0.0, float("nan"), (np.float32(2.5), None)],
                         (1, None): np.arange(3)}, arrays)
    out = ckmod.decode(json.loads(json.dumps(desc)), arrays, lambda x: x)
    assert math_equal(out["a"][1], -0.0) and np.isnan(out["a"][2])
    assert out["a"][3][0].dtype == np.float32 and out["a"][3][0] == 2.5
    np.testing.assert_array_equal(out[(1, None)], np.arange(3))


def math_equal(x, y):
    return x == y and np.signbit(x) == np.signbit(y)


# ------------------------------------------------------------------ corrupt files
def _rewrite(src: Path, dst: Path, *, arrays=None, meta=None) -> Path:
    """Copy the checkpoint ``src`` to ``dst`` with arrays and/or metadata edited."""
    with np.load(src) as z:
        data = {k: z[k] for k in z.files}
    if arrays is not None:
        arrays(data)
    if meta is not None:
        m = json.loads(str(data["meta"]))
        meta(m)
        data["meta"] = np.array(json.dumps(m))
    with open(dst, "wb") as fh:
        np.savez(fh, **data)
    return dst


def _scale_largest(data):
    key = max((k for k in data if k != "meta"), key=lambda k: data[k].size)
    data[key] = data[key] * 1.001


def _edit_time(m):
    def walk(node):
        if isinstance(node, dict) and "dict" in node:
            for k, v in node["dict"]:
                if k == {"v": "t"} and "f" in v:
                    v["f"] = repr(float(v["f"]) + 0.05)
                    return True
                if walk(v):
                    return True
        return False
    assert walk(m["body"]["state"])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A mid-run checkpoint, and the uninterrupted run it must resume into."""
    folder = tmp_path_factory.mktemp("ckpt")
    path = folder / "run.ckpt"
    with pytest.warns(EarlyStopWarning):
        run(path, a=att(Stop(M, 0.3)), solver="ab3")
    return path, run(a=att(Stop(M)), solver="ab3")


@pytest.mark.parametrize("how, words", [
    (dict(arrays=_scale_largest), "does not match its checksum"),
    (dict(meta=_edit_time), "metadata does not match its checksum"),
    (dict(meta=lambda m: m.update(version=99)), "format version 99"),
    (dict(meta=lambda m: m.update(version=1)), "format version 1"),
    (dict(meta=lambda m: m.update(format="something-else")), "not a transformer-pde checkpoint"),
    (dict(arrays=lambda d: d.pop("a0")), "arrays stored differ"),
], ids=["scaled_array", "edited_time", "unknown_version", "old_version", "format", "missing"])
def test_an_edited_checkpoint_is_an_integrity_error(how, words, written, tmp_path):
    src, _ = written
    bad = _rewrite(src, tmp_path / "bad.ckpt", **how)
    with pytest.raises(IntegrityError, match=words) as info:
        run(bad, resume=True, a=att(Stop(M)), solver="ab3")
    assert str(bad) in str(info.value)


def test_a_truncated_or_random_file_is_an_integrity_error(written, tmp_path):
    src, _ = written
    raw = src.read_bytes()
    for i, content in enumerate([raw[: len(raw) // 2], raw[:-1], b"",
                                 np.random.default_rng(0).bytes(len(raw))]):
        bad = tmp_path / f"bad{i}.ckpt"
        bad.write_bytes(content)
        with pytest.raises(IntegrityError, match="bad") as info:
            run(bad, resume=True, a=att(Stop(M)), solver="ab3")
        assert str(bad) in str(info.value)
        assert bad.read_bytes() == content   # never replaced


def test_the_untouched_fixture_checkpoint_resumes(written, tmp_path):
    src, ref = written
    good = tmp_path / "good.ckpt"
    shutil.copyfile(src, good)
    assert_same(run(good, resume=True, a=att(Stop(M)), solver="ab3"), ref)


@given(data=st.data())
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_checkpoints_fail_cleanly_or_resume_identically(written, tmp_path, data):
    src, ref = written
    raw = bytearray(src.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        cut = data.draw(st.integers(0, len(raw) - 1), label="length")
        raw = raw[:cut]
    else:
        for _ in range(data.draw(st.integers(1, 3), label="flips")):
            pos = data.draw(st.integers(0, len(raw) - 1), label="offset")
            raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
    bad = tmp_path / "fuzz.ckpt"
    bad.write_bytes(bytes(raw))
    try:
        again = run(bad, resume=True, a=att(Stop(M)), solver="ab3")
    except TrajectoryFileError as exc:
        assert str(bad) in str(exc)
        return
    assert_same(again, ref)   # the change hit bytes nobody reads (zip padding, ...)


# ------------------------------------------------------------------ paths
class _Clock:
    """A matrix of time that records the times it is evaluated at."""

    def __init__(self):
        self.times = []

    def __call__(self, t):
        self.times.append(t)
        return M


@pytest.mark.parametrize("where, words", [
    (lambda p: p / "missing" / "run.ckpt", "folder .* does not exist"),
    (lambda p: p, "is a folder"),
    (lambda p: Path("."), "is a folder"),
    (lambda p: _fifo(p / "pipe"), "special file"),
    (lambda p: _symlink(p / "missing" / "x", p / "link"), "broken symbolic link"),
], ids=["missing_folder", "folder", "dot", "fifo", "dangling_link"])
def test_bad_paths_are_refused_before_the_first_step(where, words, tmp_path):
    path = where(tmp_path)
    clock = _Clock()
    with pytest.raises(CheckpointError, match=words) as info:
        run(path, a=att(clock))
    assert str(path) in str(info.value)
    assert max(clock.times, default=0.0) == 0.0      # no step was taken
    assert not os.path.lexists(path) or not stat.S_ISREG(os.lstat(path).st_mode)


def _fifo(path):
    os.mkfifo(path)
    return path


def _symlink(target, path):
    path.symlink_to(target)
    return path


def test_a_device_is_refused_by_the_path_check():
    # checked without running: if the check were wrong, a run would replace the device
    with pytest.raises(CheckpointError, match="/dev/null' is a special file"):
        ckmod.check_path(Path(os.devnull), resume=False)
    with pytest.raises(CheckpointError, match="special file"):
        ckmod.check_path(Path(os.devnull), resume=True)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("resume, error", [(False, CheckpointError), (True, IntegrityError)])
def test_an_existing_file_that_is_not_a_checkpoint_is_never_overwritten(resume, error,
                                                                      tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[run]\nt_max = 0.6\n')
    before = config.read_bytes()
    with pytest.raises(error, match="not a transformer-pde checkpoint") as info:
        run(config, resume=resume)
    assert str(config) in str(info.value)
    assert config.read_bytes() == before
    # another archive (a trajectory NPZ) is not a checkpoint either
    traj = run().save(tmp_path / "traj.npz")
    before = traj.read_bytes()
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        run(traj)
    assert traj.read_bytes() == before


def test_an_existing_checkpoint_is_replaced_by_a_fresh_run(tmp_path):
    path = tmp_path / "run.ckpt"
    run(path, a=att(lambda t: M * (1 + t)))
    fresh = run(path)                       # resume=False: a checkpoint may be replaced
    assert_same(run(path, resume=True), fresh)


def test_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    # permissions are not enforced for root: a read-only file system is, for everyone
    ro = Path("/sys") if os.geteuid() == 0 else tmp_path / "ro"
    if ro != Path("/sys"):
        ro.mkdir()
        ro.chmod(0o555)
    elif os.access(ro, os.W_OK) and _can_create_in(ro):
        pytest.skip("/sys is writable here")
    with pytest.raises(CheckpointError, match="cannot create a file in the folder"):
        run(ro / "run.ckpt")
    # the same refusal when the folder refuses for any reason (here: simulated)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(ckmod.tempfile, "mkstemp", refuse)
    with pytest.raises(CheckpointError, match=f"{tmp_path}.*Permission denied"):
        run(tmp_path / "run.ckpt")
    assert not (tmp_path / "run.ckpt").exists()


def _can_create_in(folder):
    try:
        (folder / ".probe").touch()
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


# ------------------------------------------------------------------ failed writes
def test_a_failed_write_warns_and_returns_the_trajectory(tmp_path, monkeypatch):
    ref = run()
    calls = []

    def full_disk(*args, **kwargs):
        calls.append(1)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ckmod, "write_checkpoint", full_disk)
    path = tmp_path / "run.ckpt"
    with pytest.warns(CheckpointWarning, match="No space left on device") as rec:
        tr = run(path)
    assert tr.status == "ok" and len(calls) > 3
    assert sum(issubclass(w.category, CheckpointWarning) for w in rec) == 1  # warned once
    assert str(path) in str(rec[0].message)
    assert_same(tr, ref)
    assert not path.exists()


def test_a_folder_removed_mid_run_keeps_the_run(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    ref = run()

    def q(t):
        if t > 0.3 and folder.exists():
            shutil.rmtree(folder)
        return M
    with pytest.warns(CheckpointWarning, match=str(folder)):
        tr = run(folder / "run.ckpt", a=att(q))
    assert tr.status == "ok"
    np.testing.assert_array_equal(tr.states, ref.states)


# ------------------------------------------------------------------ solver objects
def test_one_solver_object_serves_concurrent_runs():
    shared = tp.AdamsBashforth(3)
    starts = [np.random.default_rng(s).normal(size=(6, 2)) for s in range(6)]
    kw = dict(t_max=2.0, dt=0.01, solver=shared)
    serial = [tp.simulate(att(), x, **{**kw, "solver": tp.AdamsBashforth(3)}) for x in starts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        par = list(pool.map(lambda x: tp.simulate(att(), x, **kw), starts))
    for a, b in zip(par, serial, strict=True):
        assert a.status == "ok"
        np.testing.assert_array_equal(a.states, b.states)
    assert shared.get_state() == {"version": 1, "fs": [], "hs": [], "t_next": None}


def test_a_solver_class_is_refused_with_a_hint():
    with pytest.raises(ArgumentTypeError, match=r"class RK4; pass an instance such as RK4\(\)"):
        tp.simulate(att(), X0, solver=tp.RK4, **KW)
    with pytest.raises(ArgumentTypeError, match=r"Dopri5\(\)"):
        tp.simulate(att(), X0, solver=tp.Dopri5, **KW)


def test_the_checkpoint_archive_lists_a_digest_for_every_array(written):
    src, _ = written
    with zipfile.ZipFile(src) as zf:
        names = {n.removesuffix(".npy") for n in zf.namelist()}
    with np.load(src) as z:
        meta = json.loads(str(z["meta"]))
    assert meta["format"] == ckmod.FORMAT and meta["version"] == ckmod.VERSION
    assert set(meta["body"]["arrays"]) | {"meta"} == names
    assert "attention.Q(t)" in meta["body"]["run"]["probes"]


def test_a_loop_state_of_an_earlier_version_is_a_checkpoint_error(tmp_path):
    """A checkpoint whose loop state an earlier version wrote (version 1: separate segment
    and save-grid counters) is intact and of the same run, but cannot be continued: a
    CheckpointError naming the file and the version, never a silent migration."""
    path = tmp_path / "run.ckpt"
    ref = run(path)
    meta = json.loads(str(np.load(path)["meta"]))
    state = ckmod.read_checkpoint(path, _identity_of_file(meta), lambda a: a)
    loop = state["loop"]
    old = {"version": 1, "t": loop["t"], "y": loop["y"], "n_steps": loop["n_steps"],
           "n_rejected": loop["n_rejected"], "stop": 0, "seg_left": loop["steps_left"],
           "step_idx": loop["n_steps"], "h": loop["h"], "fy": None, "ctrl_prev": 1.0,
           "save_k": 1, "done": True}
    ckmod.write_checkpoint(path, meta["body"]["run"], {**state, "loop": old})
    with pytest.raises(CheckpointError, match=r"version 1.*earlier version") as err:
        run(path, resume=True)
    assert str(path) in str(err.value)
    # the current version reads back
    ckmod.write_checkpoint(path, meta["body"]["run"], state)
    assert_same(run(path, resume=True), ref)


def _identity_of_file(meta):
    """A RunIdentity equal to the one recorded in a checkpoint's metadata (a run without
    callable parameters)."""
    run_ = meta["body"]["run"]
    return ckmod.RunIdentity(run_["static"], {})
