"""Tests of the ``transformer-pde`` command line: each subcommand on a tiny configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_pde import cli


def test_demo_writes_files_and_counts_clusters(tmp_path):
    out = tmp_path / "demo"
    # tiny run: 60 tokens to t = 4 is enough for the co-moving frame to collapse onto
    # the hull vertices (the count is read from the summary, not asserted to a constant)
    assert cli.main(["demo", "--out", str(out), "--n", "60", "--t-max", "4"]) == 0
    for name in ("demo.png", "summary.txt", "summary.json", "trajectory.npz"):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok"
    assert 1 <= s["clusters_final"] < 60
    assert sum(s["cluster_sizes"]) == 60
    assert s["covariance_rank"] in (1, 2)
    assert "final number of clusters" in (out / "summary.txt").read_text()


def test_count_clusters_separated_blobs():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + 1e-3 * rng.normal(size=(20, 2)) for c in centres])
    k, labels = cli.count_clusters(X, 0.05)
    assert k == 3
    # the labels partition exactly the three blobs
    assert len({tuple(np.unique(labels[i * 20:(i + 1) * 20])) for i in range(3)}) == 3
    # invariant under scaling of the cloud (scale is relative to the RMS radius)
    assert cli.count_clusters(1e6 * X, 0.05)[0] == 3


def test_covariance_rank():
    rng = np.random.default_rng(2)
    line = rng.normal(size=(50, 1)) * np.array([[1.0, 2.0, -1.0]])
    assert cli.covariance_rank(line) == 1
    assert cli.covariance_rank(rng.normal(size=(50, 3))) == 3
    assert cli.covariance_rank(np.zeros((3, 3)), is_cov=True) == 0
