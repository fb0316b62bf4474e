"""Files of packed sequences (``simulate(..., segments=...)``): the weights sum to 1 in each
segment and the saved moments are per segment, so the file checks follow the segments."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import IntegrityError, TrajectoryFileError
from transformer_pde.io import check_trajectory

ATT = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
X0 = np.random.default_rng(0).normal(size=(7, 2))


@pytest.mark.parametrize("suffix", [".npz", ".nc"])
@pytest.mark.parametrize("statistic", [False, True])
def test_a_packed_trajectory_round_trips(tmp_path, suffix, statistic):
    if suffix == ".nc":
        pytest.importorskip("xarray")
    saveat = tp.SaveAt(fn=lambda t, X, w: X.sum()) if statistic else None
    traj = tp.simulate(ATT, X0, t_max=0.3, dt=0.1, segments=[3, 4], saveat=saveat)
    back = tp.load(traj.save(tmp_path / f"run{suffix}"))
    assert back.segments == [3, 4]
    if statistic:                       # moments of each segment: (T, S, d), (T, S, d, d)
        assert back.saved_means.shape == (4, 2, 2)
        np.testing.assert_array_equal(back.saved_covs, traj.saved_covs)
    else:
        np.testing.assert_array_equal(back.states, traj.states)
    np.testing.assert_array_equal(back.weights, traj.weights)


def _fields(traj, **change):
    f = {k: getattr(traj, k) for k in ("times", "states", "weights", "positions", "last",
                                       "saved_means", "saved_covs", "values", "info")}
    f["status"] = traj.status
    f.update(change)
    return f


def test_weights_are_checked_segment_by_segment():
    traj = tp.simulate(ATT, X0, t_max=0.2, dt=0.1, segments=[3, 4])
    check_trajectory("ok", _fields(traj))
    w = traj.weights.copy()
    w[0], w[3] = w[0] + 0.1, w[3] - 0.1     # the total is still 2, each segment is not 1
    with pytest.raises(IntegrityError, match="in segment 0"):
        check_trajectory("edited", _fields(traj, weights=w))
    with pytest.raises(IntegrityError, match="sums to"):          # segments dropped
        check_trajectory("edited", _fields(traj, info={}))
    with pytest.raises(TrajectoryFileError, match="segments"):
        check_trajectory("edited", _fields(traj, info={"segments": [3, 3]}))
