"""attention.visibility: the kernel order and key ranges of causal order, segments and
windows, worked out by hand; the ``window`` of an :class:`~transformer_pde.Attention`."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.attention.visibility import query_ranges, token_visibility
from transformer_pde.errors import ArgumentError, ArgumentTypeError


def test_causal_segments_and_windows_by_hand():
    # segment 0 = tokens 0-2 at positions (0.5, 0.0, 0.5), segment 1 = tokens 3-4 at (1, 0)
    pos = np.array([0.5, 0.0, 0.5, 1.0, 0.0])
    sizes = np.array([3, 2])
    vis = token_visibility(pos, sizes, masked=True)
    assert vis.perm.tolist() == [1, 0, 2, 4, 3]           # sorted inside each segment
    assert vis.lo.tolist() == [0, 0, 0, 3, 3]
    assert vis.hi.tolist() == [3, 1, 3, 5, 4]             # tied tokens 0 and 2 see each other
    assert vis.bounds == [(0, 3), (3, 5)]
    win = token_visibility(pos, sizes, masked=True, window=1)
    assert win.lo.tolist() == [2, 0, 2, 4, 3]             # the last key at or before each
    unmasked = token_visibility(None, sizes, masked=False)
    assert unmasked.perm is None
    assert (unmasked.lo.tolist(), unmasked.hi.tolist()) == ([0, 0, 0, 3, 3], [3, 3, 3, 5, 5])
    lo, hi = query_ranges(np.array([0.0, 0.5, 0.5]), np.array([0.2, 1.0]), window=2)
    assert (lo.tolist(), hi.tolist()) == ([0, 1], [1, 3])


def test_one_segment_is_the_stable_sort_of_today():
    rng = np.random.default_rng(5)
    pos = rng.choice([0.0, 0.1, 0.7], size=20)
    vis = token_visibility(pos, None, masked=True)
    perm = np.argsort(pos, kind="stable")
    assert vis.perm.tolist() == perm.tolist()
    assert vis.hi.tolist() == np.searchsorted(pos[perm], pos, side="right").tolist()
    assert not vis.lo.any()


def test_window_is_part_of_the_attention_description():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True, window=3)
    assert "window=3" in repr(att)
    assert att.to_dict()["window"] == 3
    assert tp.Attention.from_dict(att.to_dict()).window == 3
    assert att.replace(beta=2.0).window == 3
    plain = att.replace(window=None)
    assert "window" not in plain.to_dict() and "window" not in repr(plain)


@pytest.mark.parametrize("kw, error, match", [
    ({"window": 2}, ArgumentError, "window=2 is a sliding causal window and needs masked=True"),
    ({"window": 0, "masked": True}, ArgumentError, "window must be an integer >= 1"),
    ({"window": 2.5, "masked": True}, ArgumentError, "window must be an integer"),
    ({"window": True, "masked": True}, ArgumentTypeError, "window must be an integer"),
    ({"window": "3", "masked": True}, ArgumentTypeError, "window must be an integer"),
])
def test_bad_windows_are_refused_naming_them(kw, error, match):
    with pytest.raises(error, match=match):
        tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), **kw)


def test_a_windowed_run_keeps_its_window_in_files_and_configurations(tmp_path):
    from transformer_pde.cli.builders import build_attention
    from transformer_pde.errors import ConfigError

    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True, window=2)
    X = np.random.default_rng(0).normal(size=(5, 2))
    traj = tp.simulate(att, X, positions=np.linspace(0, 1, 5), t_max=0.2, dt=0.1)
    path = tp.io.save_trajectory(traj, tmp_path / "run.npz")
    assert tp.io.read_trajectory(path)["attention"].window == 2
    assert build_attention({"d": 2, "masked": True, "window": 3}).window == 3
    with pytest.raises(ConfigError, match="window"):
        build_attention({"d": 2, "window": 3})


def test_a_checkpoint_with_another_window_does_not_resume(tmp_path):
    from transformer_pde.errors import CheckpointError

    X0 = np.random.default_rng(8).normal(size=(5, 2))
    path = tmp_path / "run.ckpt"

    def run(window, resume):
        att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True,
                           window=window)
        mon = tp.Monitor(checkpoint=path, resume=resume, checkpoint_every=1e-9)
        return tp.simulate(att, X0, positions=np.linspace(0, 1, 5), t_max=0.3, dt=0.1,
                           monitor=mon)

    done = run(2, False)
    for other in (3, None):
        with pytest.raises(CheckpointError, match=r"different run: .*attention\.window"):
            run(other, True)
    np.testing.assert_array_equal(run(2, True).states, done.states)
