"""sweep.run on the active Dask client, and the workers' warnings and log records brought
back to the calling process (each distinct one once)."""

import logging
import sys
import threading
import warnings

import pytest

from transformer_pde import sweep
from transformer_pde.sweep.run import active_client
from transformer_pde.sweep.worker_output import MAX_EVENTS, process_id, reemit, run_captured

distributed = pytest.importorskip("distributed")


def _where(params, rng):
    """Whether the cell ran in a Dask worker, and its value (depends on the seed)."""
    try:
        distributed.get_worker()
        on_worker = 1
    except ValueError:
        on_worker = 0
    return {"on_worker": on_worker, "value": float(rng.normal(loc=params["mu"]))}


def _noisy(params, rng):
    """A cell that warns and logs the same text in every cell, and its own text once."""
    warnings.warn("overflow in the test cell", RuntimeWarning, stacklevel=1)
    logging.getLogger("tests.noisy_cell").warning("cell note %s", "same")
    return {"value": float(rng.uniform())}


def _study(fn, outputs=None):
    # declared outputs: no cell runs in this process to infer them
    return sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=2, seed=5), fn,
                       outputs=outputs or {"value": sweep.Output()})


_WHERE = {"on_worker": sweep.Output((), "int64"), "value": sweep.Output()}


@pytest.fixture
def client():
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                       dashboard_address=":0")
    c = distributed.Client(cluster)  # set_as_default: the active client
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def test_no_active_client_without_one():
    assert active_client() is None


def test_run_uses_the_active_client_and_leaves_it_running(client):
    assert active_client() is client
    ds = sweep.run(_study(_where, _WHERE), progress=False, batch_size=1)
    # every cell ran in the client's worker, and the results are those of a serial run
    assert (ds["on_worker"].values == 1).all()
    ref = sweep.run(_study(_where, _WHERE), scheduler="serial", progress=False)
    assert (ref["on_worker"].values == 0).all()
    assert ds["value"].equals(ref["value"])
    assert client.status == "running"  # not closed by run: it is the user's
    assert active_client() is client


class _Started(Exception):
    pass


def test_workers_argument_still_asks_for_an_embedded_cluster(client, monkeypatch):
    # workers= means "start my own cluster": the active client is not taken
    import importlib

    run_module = importlib.import_module("transformer_pde.sweep.run")

    def fake_cluster(*args, **kwargs):
        raise _Started(kwargs.get("n_workers"))

    monkeypatch.setattr(distributed, "LocalCluster", fake_cluster)
    with pytest.raises(_Started, match="^1$"):
        run_module._connect(None, 1, None)
    ex = run_module._connect(None, None, None)  # no workers=: the active client
    assert ex.client is client and not ex.owned


def test_worker_process_warnings_and_logs_are_issued_once_in_the_caller(caplog):
    # an embedded cluster of one worker process: the cells' warnings and records would go
    # to the worker's stderr; they are issued in this process instead, each once
    cloudpickle = pytest.importorskip("cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import us
    caplog.set_level(logging.WARNING, logger="tests.noisy_cell")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = sweep.run(_study(_noisy), workers=1, progress=False, batch_size=1)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert (ds["cell_status"].values == 1).all()
    ours = [w for w in caught if "overflow in the test cell" in str(w.message)]
    # six cells in six tasks warned; the caller sees the warning once, with its category
    # and the cell's source line (the file is cloudpickle's name for code sent by value)
    assert len(ours) == 1
    assert ours[0].category is RuntimeWarning
    assert ours[0].lineno == _noisy.__code__.co_firstlineno + 2
    notes = [r for r in caplog.records if r.name == "tests.noisy_cell"]
    assert [r.getMessage() for r in notes] == ["cell note same"]
    assert notes[0].levelno == logging.WARNING


def test_threaded_workers_of_this_process_are_not_captured(client):
    # a worker thread of the calling process: its warnings reach the caller directly
    assert run_captured(process_id(), lambda: 3) == (3, [])


def test_run_captured_keeps_the_thread_s_events_and_their_counts():
    def work():
        for _ in range(3):
            warnings.warn_explicit("w1", UserWarning, "f.py", 1)
        logging.getLogger("tests.capture").error("e%d", 1)
        return 7

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result, events = run_captured("elsewhere:0", work)
    assert result == 7
    counts = {e[:4]: n for e, n in events}
    assert counts[("warning", "builtins:UserWarning", logging.WARNING, "w1")] == 3
    assert counts[("log", "tests.capture", logging.ERROR, "e1")] == 1
    # another thread, not capturing, is not collected
    other: list = []
    t = threading.Thread(target=lambda: other.append(run_captured("elsewhere:0", lambda: 1)[1]))
    t.start()
    t.join()
    assert other == [[]]


def test_run_captured_keeps_at_most_max_events():
    def many():
        for i in range(MAX_EVENTS + 10):
            warnings.warn_explicit(f"w{i}", UserWarning, "f.py", i + 1)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        _, events = run_captured("elsewhere:0", many)
    assert len(events) == MAX_EVENTS


def test_reemit_unknown_category_becomes_userwarning_and_dedups():
    event = ("warning", "no_such_module_xyz:Gone", logging.WARNING, "lost class", "g.py", 3)
    seen: set = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reemit([(event, 2)], seen)
        reemit([(event, 5)], seen)
    assert [(w.category, str(w.message), w.filename, w.lineno) for w in caught] == [
        (UserWarning, "lost class", "g.py", 3)]
