r"""Parameter studies: many runs over a grid, on Dask, with labelled results in Zarr.

A study is a :class:`Grid` (a product of named axes times random draws, each cell seeded
from one base seed through :class:`numpy.random.SeedSequence`) and a cell function
returning named scalars or small arrays.  :func:`run` executes it on an embedded Dask
``LocalCluster``, on an existing cluster (``scheduler=`` address, ``Client`` or
``scheduler_file=``) or serially, writes each finished cell to a Zarr store and returns an
:class:`xarray.Dataset` with the grid axes as coordinates.  A rerun with ``resume=True``
computes only the missing or failed cells.

Example
-------
>>> import numpy as np
>>> from transformer_pde import sweep
>>> def cell(params, rng):
...     return {"mean": float(rng.normal(loc=params["mu"], size=100).mean())}
>>> study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0]}, draws=3, seed=7), cell)
>>> ds = sweep.run(study, scheduler="serial", progress=False)
>>> ds["mean"].shape
(2, 3)
"""

from .cells import (CELLS, STATUS_CODES, ClusterCell, ConeCell, ConePathCell, RankCell,
                    RankSweepCell, StabilityCell, SyncCell, status_code)
from .grid import Cell, Grid
from .run import (CellFailureWarning, SchedulerArgumentError, SchedulerError, check_scheduler,
                  run, summary)
from .store import StoreError, StoreIntegrityError, open_results
from .study import DONE, FAILED, MISSING, Output, Study

__all__ = ["CELLS", "STATUS_CODES", "Cell", "CellFailureWarning", "ClusterCell", "ConeCell",
           "ConePathCell", "RankSweepCell",
           "DONE", "FAILED", "Grid", "MISSING", "Output", "RankCell", "SchedulerArgumentError",
           "SchedulerError", "StabilityCell", "SyncCell", "StoreError", "StoreIntegrityError", "Study",
           "check_scheduler", "open_results", "run", "status_code", "summary"]
