"""Running a study: in this process, on an embedded Dask ``LocalCluster``, or on an
existing Dask cluster.

Scheduling is Dask's (``distributed``): tasks are batches of cells, results come back to
this process as they finish (``as_completed``) and are written to the store in groups (at
most one write per Zarr chunk and second).  If a worker dies, Dask reschedules its tasks
on the others; because every cell's random stream is seeded from its place in the grid,
the results are bit for bit those of a serial run whatever the scheduling.

Without ``scheduler=``, a study runs on the active ``distributed.Client`` if there is one
(the client a notebook created with ``Client()``), else on an embedded ``LocalCluster``
whose worker processes ignore Ctrl-C (the calling process stops them); on Linux they are
forked from the calling process where that is safe, so that they start with its imports and
compiled kernels instead of paying them again.  The warnings and
log records of the cells that workers run are issued again in the calling process, each
distinct one once (:mod:`~transformer_pde.sweep.worker_output`), where its warning filters
and logging configuration apply.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import compile_notice
from ..errors import ArgumentError, ArgumentTypeError, TransformerPDEError, TransformerPDEWarning
from ..extras import progress_bar, require
from ..io.jsonfmt import dumps
from .store import ResultStore, StoreError, read_fingerprint, stored_failures
from .cells import STATUS_CODES
from .study import DONE, FAILED, Output, Study, cell_name, run_cell, run_cells
from .worker_output import process_id, reemit, run_captured

__all__ = ["run", "SchedulerError", "SchedulerArgumentError", "CellFailureWarning",
           "active_client", "check_scheduler", "summary", "CONNECT_TIMEOUT"]

logger = logging.getLogger(__name__)


class SchedulerError(TransformerPDEError):
    """The Dask scheduler could not be reached or the cluster could not be started."""


class SchedulerArgumentError(SchedulerError, ArgumentError):
    """A scheduler address or scheduler file that cannot be used (checked before any
    connection is tried); the message names the argument."""


class CellFailureWarning(TransformerPDEWarning):
    """Some cells of a study raised; they are recorded as failed (``cell_status == 2``)
    with their messages in the ``failures`` attribute, and a resumed run retries them."""


#: Dask settings of the embedded ``LocalCluster`` (its workers, nannies and scheduler are
#: created under them).  Its cells are CPU-bound and every core has a worker, so each
#: helper thread that wakes up takes the GIL or a core from a cell: Dask's statistical
#: profiler samples the running task's stack every 10 ms, the event loops tick every 20 ms,
#: the system monitor polls every 0.5 s and each nanny reads its worker's memory every
#: 0.1 s.  On the 2-core benchmark (``benchmarks/sweep.py``) they cost the cells about 5 %
#: of their CPU time and the study as much wall time.  The embedded cluster's dashboard is
#: shown to nobody, so the profiles are not missed; memory is still watched, every 2 s.
#: An existing cluster (``scheduler=``) keeps its own configuration.
_EMBEDDED_CLUSTER_CONFIG: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "2s",
}


def _embedded_start_method() -> str:
    """How the embedded cluster starts its worker processes: ``"fork"`` where it is safe,
    else Dask's configured method (``"spawn"`` by default).

    A forked worker starts in a fraction of a second with this process's imports and
    compiled Numba kernels; a spawned one starts a new interpreter, imports Dask, the
    package, NumPy, SciPy and Numba and loads every kernel from the disk cache (about 2 s
    of CPU each).  Fork is used on Linux when Dask's method is its default ``"spawn"``
    (a user's explicit ``"forkserver"`` is kept) and Numba's thread pool has not been
    started in this process: the OpenMP and workqueue pools are not fork-safe (a forked
    child entering a parallel region is terminated, or waits for threads it does not have).
    Nor while a kernel compiles on the package's background thread
    (:func:`~transformer_pde.backends.compile_notice.running`): a forked child would inherit
    Numba's compiler lock held by a thread it does not have, and hang at its first compile.
    """
    try:
        import dask  # noqa: PLC0415  (an optional dependency, imported by _connect anyway)
    except ImportError:
        configured = "spawn"
    else:
        configured = str(dask.config.get("distributed.worker.multiprocessing-method", "spawn"))
    if (configured != "spawn" or sys.platform != "linux"
            or "fork" not in multiprocessing.get_all_start_methods()
            or compile_notice.running()):
        return configured
    if "numba" in sys.modules:
        parallel = sys.modules.get("numba.np.ufunc.parallel")
        if parallel is not None and getattr(parallel, "_is_initialized", True):
            return configured  # threads running (or an unknown Numba): not fork-safe
    return "fork"


@contextlib.contextmanager
def _quiet_fork() -> Any:
    """Python >= 3.12 warns (DeprecationWarning) on every fork of a process with threads;
    here the forking thread is Dask's event loop and the calling thread waits for it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                category=DeprecationWarning)
        yield


#: seconds to wait for an existing Dask scheduler to answer before giving up
CONNECT_TIMEOUT = 10.0

#: ``[scheme://]host:port`` of a Dask scheduler (``inproc://`` addresses are taken as they are)
_ADDRESS_RE = re.compile(r"^(?:(?P<scheme>tcp|tls|ws|wss|ucx)://)?"
                         r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?)"
                         r":(?P<port>[0-9]{1,5})/?$")
_ADDRESS_EXAMPLE = "an address such as tcp://10.0.0.5:8786 ([tcp://]host:port)"
#: the largest scheduler file read (the files Dask writes are a few hundred bytes)
_SCHEDULER_FILE_MAX = 1 << 20


def _check_address(address: str, name: str) -> None:
    if address.startswith("inproc://"):
        return
    m = _ADDRESS_RE.match(address)
    if m is None or not 0 < int(m.group("port")) < 65536:
        raise SchedulerArgumentError(f"{name} {address!r}: expected 'serial' or {_ADDRESS_EXAMPLE}")


def check_scheduler(scheduler: Any = None, scheduler_file: str | Path | None = None, *,
                    names: tuple[str, str] = ("scheduler", "scheduler_file")) -> None:
    """Check ``scheduler`` and ``scheduler_file`` as :func:`run` takes them, before any
    connection is tried.

    ``scheduler`` must be None, ``"serial"``, a ``distributed.Client`` or an address
    ``[scheme://]host:port`` (scheme ``tcp``, ``tls``, ``ws``, ``wss``, ``ucx``; or an
    ``inproc://`` address); ``scheduler_file`` must be a readable file holding the JSON
    object that ``dask scheduler --scheduler-file`` writes, whose ``address`` is such an
    address.  ``names`` are the names used in the messages (the CLI passes its options).

    Raises
    ------
    SchedulerArgumentError
        (an :class:`~transformer_pde.errors.ArgumentError` and a :class:`SchedulerError`)
        The message names the argument and says what is wrong.
    ArgumentTypeError
        ``scheduler`` is neither a string nor a client.
    """
    sname, fname = names
    if isinstance(scheduler, str):
        if scheduler != "serial":
            _check_address(scheduler, sname)
    elif scheduler is not None and not hasattr(scheduler, "submit"):
        raise ArgumentTypeError(f"{sname} must be None, 'serial', an address or a "
                                f"distributed.Client, got {type(scheduler).__name__}")
    if scheduler_file is None:
        return
    path = Path(scheduler_file)
    if not path.exists():
        raise SchedulerArgumentError(f"{fname} {path}: does not exist")
    if not path.is_file():
        raise SchedulerArgumentError(f"{fname} {path}: is not a regular file")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SCHEDULER_FILE_MAX + 1)
    except OSError as exc:
        raise SchedulerArgumentError(f"{fname} {path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > _SCHEDULER_FILE_MAX:
        raise SchedulerArgumentError(f"{fname} {path}: too large for a Dask scheduler file")
    try:
        info = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SchedulerArgumentError(f"{fname} {path}: not a Dask scheduler file (not text)") from None
    except json.JSONDecodeError as exc:
        raise SchedulerArgumentError(f"{fname} {path}: not a Dask scheduler file (not JSON: {exc.msg} "
                            f"at line {exc.lineno})") from None
    address = info.get("address") if isinstance(info, dict) else None
    if not isinstance(address, str):
        raise SchedulerArgumentError(f"{fname} {path}: not a Dask scheduler file (no \"address\" "
                            "string in its JSON object)")
    if not address.startswith("inproc://"):
        m = _ADDRESS_RE.match(address)
        if m is None or not 0 < int(m.group("port")) < 65536:
            raise SchedulerArgumentError(f"{fname} {path}: its address {address!r} is not "
                                f"{_ADDRESS_EXAMPLE}")


@dataclass
class _Executor:
    client: Any = None
    cluster: Any = None
    owned: bool = True  # False for a Client passed in by the user: never closed here

    def close(self) -> None:
        if not self.owned:
            return
        for obj in (self.client, self.cluster):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    logger.debug("error while closing %r", obj, exc_info=True)


def active_client() -> Any:
    """The active ``distributed.Client`` of this process (the default client, as Dask's
    own collections use it), or None: none was created, it is closed, or ``distributed``
    was never imported (then there cannot be one)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        client = distributed.default_client()
    except ValueError:  # "No clients found"
        return None
    return client if getattr(client, "status", None) == "running" else None


@contextlib.contextmanager
def _children_ignore_sigint() -> Any:
    """SIGINT ignored while the embedded cluster starts its worker processes, which inherit
    the disposition: Ctrl-C in a terminal signals the whole process group, and the
    workers, stopped by this process, then print no traceback.  (Only in the main thread,
    where Python handles signals.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None
                      else signal.default_int_handler)


def _connect(scheduler: Any, workers: int | None, scheduler_file: str | Path | None) -> _Executor:
    distributed = require("distributed", "running a parameter study")
    Client, LocalCluster = distributed.Client, distributed.LocalCluster
    if scheduler is not None and not isinstance(scheduler, str):
        return _Executor(client=scheduler, owned=False)  # the user's distributed.Client
    if scheduler is None and scheduler_file is None and workers is None:
        client = active_client()
        if client is not None:
            logger.info("running on the active Dask client %s", client)
            return _Executor(client=client, owned=False)
    timeout = f"{float(CONNECT_TIMEOUT):g}s"
    try:
        if scheduler_file is not None:
            if not Path(scheduler_file).is_file():
                raise SchedulerError(f"scheduler file {scheduler_file} does not exist")
            return _Executor(client=Client(scheduler_file=str(scheduler_file), timeout=timeout,
                                              set_as_default=False))
        if scheduler is not None:
            return _Executor(client=Client(scheduler, timeout=timeout, set_as_default=False))
        n = workers or os.cpu_count() or 1
        # One single-threaded worker process per core; numba inside each is set to one thread.
        # Worker logs are silenced: under load, workers log a traceback when their
        # heartbeat meets the closing scheduler; a real failure reaches this process anyway
        # (a failed cell's message, or the exception of a lost task).
        try:
            dask = require("dask", "running a parameter study")
            settings = {**_EMBEDDED_CLUSTER_CONFIG,
                        "distributed.worker.multiprocessing-method": _embedded_start_method()}
            with dask.config.set(settings), _children_ignore_sigint(), _quiet_fork():
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.CRITICAL)
        except RuntimeError as exc:
            raise SchedulerError(
                f"could not start a local Dask cluster of {n} worker processes ({exc}). "
                f"Worker processes re-import the main script: in a script, call "
                f"sweep.run under `if __name__ == \"__main__\":`") from None
        return _Executor(client=Client(cluster, set_as_default=False), cluster=cluster)
    except SchedulerError:
        raise
    except (OSError, TimeoutError, ValueError, ImportError) as exc:
        where = (f"of the scheduler file {scheduler_file}" if scheduler_file is not None
                 else f"at {scheduler}")
        raise SchedulerError(f"cannot reach the Dask scheduler {where} within "
                             f"{float(CONNECT_TIMEOUT):g} s: {_flat(exc)}") from None


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _infer_outputs(study: Study, pending: list[int]) -> tuple[dict, list]:
    """Run cells in this process until one succeeds; its values fix the outputs."""
    tried = []
    for index in pending[:10]:
        res = run_cell(study.cell, study.grid, index, None)
        tried.append(res)
        if res.status == DONE:
            return {k: Output.infer(v) for k, v in res.values.items()}, tried
    raise ArgumentError(
        "cannot infer the outputs of the cell function: the first "
        f"{len(tried)} cells failed (first error: {tried[0].message}); pass outputs=")


def _batches(pending: list[int], n_workers: int, batch_size: int | None,
             serial: bool = False) -> list[list[int]]:
    if batch_size is None and serial:  # in-process: 8 groups (progress), at most 64 cells
        batch_size = max(1, min(64, math.ceil(len(pending) / 8)))
    if batch_size is not None:
        return [pending[i:i + batch_size] for i in range(0, len(pending), batch_size)]
    # Guided: each task takes 1/(8 W) of the cells not yet in a task (1 to 64 cells), so
    # the first tasks are large (few tasks: a task costs a few ms of scheduling) and the
    # last ones single cells: cells differ in cost, and the last tasks decide when the
    # study ends (with equal tasks of 8 per worker, one worker idled for up to a twelfth of
    # the run).  Dask hands the tasks out in this order as workers free up.
    per = 8 * max(n_workers, 1)
    out, i = [], 0
    while i < len(pending):
        size = max(1, min(64, math.ceil((len(pending) - i) / per)))
        out.append(pending[i:i + size])
        i += size
    return out


def run(study: Study, store: str | Path | None = None, *, scheduler: Any = None,
        workers: int | None = None, scheduler_file: str | Path | None = None,
        resume: bool = False, batch_size: int | None = None, progress: bool = True,
        config: dict | None = None) -> Any:
    """Run every cell of ``study`` and return the results as an :class:`xarray.Dataset`.

    Parameters
    ----------
    study : Study
    store : path, optional
        Zarr directory written cell by cell as results arrive (``results.zarr``).  An
        existing store is only completed with ``resume=True``, and only by the same study.
    scheduler : None, "serial", address str or distributed.Client
        ``None``: the active ``distributed.Client`` if there is one (a client created
        earlier in this process with ``Client(...)`` and not closed, which Dask's own
        collections would use; it is left running), unless ``workers`` is given; otherwise an
        embedded ``LocalCluster`` (one single-threaded worker process per core,
        or ``workers``) started and stopped with the call; its workers run without Dask's
        statistical profiler and with slower housekeeping timers (a few % more CPU time
        for the cells), and ignore Ctrl-C (this process stops them).  On Linux they are
        forked from this process, with its imports and compiled kernels (they start in a
        fraction of a second), unless Numba's thread pool already runs here (it is not
        fork-safe) or Dask's ``distributed.worker.multiprocessing-method`` is set to
        another method than its default; otherwise they are spawned (a new interpreter
        each, which imports the package and loads the kernels: about 2 s of CPU).
        ``"serial"``: every cell in this process, in order (debugging, and the reference
        the distributed runs equal).  An
        address such as ``"tcp://10.0.0.5:8786"`` or a ``Client``: an existing cluster.
    workers : int, optional
        Worker processes of the embedded cluster (default: the number of cores); given, an
        embedded cluster is started even when a client is active.
    scheduler_file : path, optional
        The JSON file written by ``dask scheduler --scheduler-file``.
    resume : bool
        Complete an existing store: only missing and failed cells are computed.
    batch_size : int, optional
        Cells per Dask task (default: about 24 tasks per worker, at most 64 cells each);
        a cell function with ``run_batch`` gets a task's cells together.
    progress : bool
        Show a tqdm progress bar.
    config : dict, optional
        JSON-able configuration stored in the ``config`` attribute.

    Returns
    -------
    xarray.Dataset
        One variable per output, ``cell_status`` (0 missing, 1 done, 2 failed), the grid
        axes and ``draw`` as coordinates; attributes ``config``, ``versions``, ``failures``.

    Warns
    -----
    CellFailureWarning
        When some cells failed (the study still completes the others).
    Warning
        The warnings of the cells run by Dask workers, issued again here (each distinct
        one once, with its category and source location); their log records go to their
        loggers here.

    Raises
    ------
    StoreError
        The store exists without ``resume``, is corrupt or foreign, or was written by a
        different study (for example the grid changed).
    SchedulerError
        The scheduler cannot be reached or the local cluster cannot be started.
    """
    if not isinstance(study, Study):
        raise ArgumentTypeError(f"study must be a transformer_pde.sweep.Study, got "
                                f"{type(study).__name__}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ArgumentError(f"workers must be a positive integer, got {workers!r}")
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, int) or batch_size < 1):
        raise ArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
    if scheduler == "serial" and (workers is not None or scheduler_file is not None):
        raise ArgumentError("workers and scheduler_file do not apply to scheduler='serial'")
    if scheduler_file is not None and scheduler is not None:
        raise ArgumentError("give scheduler or scheduler_file, not both")
    if workers is not None and (scheduler is not None or scheduler_file is not None):
        raise ArgumentError("workers applies to the embedded cluster only (scheduler=None); "
                            "an existing cluster has its own workers")
    check_scheduler(scheduler, scheduler_file)

    early: list = []
    stored = None   # the store's fingerprint and outputs, read once (its metadata checked)
    if store is not None and Path(store).exists() and resume:
        try:
            stored = read_fingerprint(store)
        except StoreError:
            if study.outputs is None:
                raise   # the outputs must be read back from it
            # not a readable store of a study: the store's own checks report it
        if stored is not None:
            _check_cell_version(study, store, stored[0])
    if study.outputs is None:
        if stored is not None:
            # the fingerprint includes the outputs: read them back from the store
            study.outputs = stored[1]
        else:
            study.outputs, early = _infer_outputs(study, list(range(study.grid.n_cells)))
    attrs = {"config": dumps(config or {}, sort_keys=True, describe=True),
             "status_codes": dumps(STATUS_CODES)}
    # Connect before touching the store: an unreachable scheduler leaves nothing behind.
    ex = None if scheduler == "serial" else _connect(scheduler, workers, scheduler_file)
    bar = None
    results = None
    t0 = time.perf_counter()
    try:
        results = ResultStore(study, store, resume=resume, attrs=attrs)
        for res in early:
            results.record(res)
        pending = results.pending()
        bar = _bar(progress, study.grid.n_cells, study.grid.n_cells - len(pending), study.name)
        if ex is None:
            if getattr(type(study.cell), "run_batch", None) is None:
                for index in pending:
                    _record(results, run_cell(study.cell, study.grid, index, study.outputs),
                            bar)
            else:
                for batch in _batches(pending, 1, batch_size, serial=True):
                    for res in run_cells(study.cell, study.grid, batch, study.outputs):
                        _record(results, res, bar)
        elif pending:
            _run_dask(ex, study, results, pending, batch_size, bar)
    finally:
        if results is not None:
            results.flush()  # also on Ctrl-C: the finished cells are kept
        if bar is not None:
            bar.close()
        if ex is not None:
            ex.close()
    ds = results.dataset()
    n_failed = int(np.sum(ds["cell_status"].values == FAILED))
    logger.info("study %r: %d cells computed in %.2f s, %d failed", study.name, len(pending),
                time.perf_counter() - t0, n_failed)
    if n_failed:
        first = next(iter(results.failures.values()))
        warnings.warn(f"{n_failed} of {study.grid.n_cells} cells failed (first: {first}); "
                      f"see the 'failures' attribute; resume=True retries them",
                      CellFailureWarning, stacklevel=2)
    return ds


def _check_cell_version(study: Study, store: str | Path, fingerprint: dict) -> None:
    """Refuse to complete ``store`` (whose parsed fingerprint is ``fingerprint``) with
    another version of its cell function (same ``module:qualname``, different code): the
    message names the function.  Only the metadata is read for it: damaged cells are found
    (and recomputed) by the store's own check on resume, and must not hide a changed cell
    function."""
    stored = fingerprint["cell"]
    now = json.loads(study.fingerprint())["cell"]
    if not isinstance(stored, str) or stored == now or "#" not in now:
        return
    name = cell_name(study.cell)
    if stored.split("#", 1)[0] == name:
        raise StoreError(
            f"{store} was written by another version of the cell function {name} (its code, "
            "defaults or closure values changed since); it cannot complete this store: "
            "restore that version, or write to a new path")


def _bar(progress: bool, total: int, done: int, name: str) -> Any:
    if not progress:
        return None
    # the package's bar: its final state stays readable in an executed notebook
    return progress_bar(total=total, initial=done, desc=name, unit="cell")


def _record(results: ResultStore, res: Any, bar: Any) -> None:
    results.record(res)
    results.flush(force=False)  # grouped writes: at most one per second
    if bar is not None:
        bar.update(1)


def _run_dask(ex: _Executor, study: Study, results: ResultStore, pending: list[int],
              batch_size: int | None, bar: Any) -> None:
    as_completed = require("distributed", "running a parameter study").as_completed

    n_workers = max(1, len(ex.client.scheduler_info().get("workers", {})))
    with ex.client.as_current():  # current for this block only: no global default scheduler
        fn, grid, outs = ex.client.scatter([study.cell, study.grid, study.outputs],
                                           broadcast=True)
        tag = f"{study.name}-{time.time_ns()}"
        futures = [ex.client.submit(run_captured, process_id(), run_cells, fn, grid,
                                    batch, outs, pure=False,
                                    key=f"{tag}-cells-{batch[0]}-{batch[-1]}")
                   for batch in _batches(pending, n_workers, batch_size)]
        seen: set = set()
        for fut in as_completed(futures):
            done, events = fut.result()
            reemit(events, seen)  # the workers' warnings and log records, each once
            for res in done:
                results.record(res)
            results.flush(force=False)  # grouped writes: at most one per second
            if bar is not None:
                bar.update(len(done))
            fut.release()


def summary(ds: Any) -> dict:
    """Counts of done / failed / missing cells and the failure messages grouped by text.

    Raises
    ------
    StoreError
        ``ds`` has no ``cell_status`` variable, or its ``failures`` attribute is not a JSON
        object of messages (the message names the item)."""
    if "cell_status" not in getattr(ds, "data_vars", ()):
        raise StoreError("the results dataset has no variable 'cell_status' (not the results "
                         "of a study)")
    status = ds["cell_status"].values
    failures = (stored_failures("the results dataset", ds.attrs, int(status.size))
                if "failures" in ds.attrs else {})
    grouped: dict[str, int] = {}
    for msg in failures.values():
        grouped[msg] = grouped.get(msg, 0) + 1
    return {"cells": int(status.size), "done": int(np.sum(status == DONE)),
            "failed": int(np.sum(status == FAILED)), "missing": int(np.sum(status == 0)),
            "failures": grouped}
