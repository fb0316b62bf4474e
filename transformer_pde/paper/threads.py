r"""One BLAS thread for computations whose decisions must not depend on where they run.

A rank study decides each draw's status (``blowup`` or ``diverging``) by thresholds on
measured quantities.  A multi-threaded BLAS may split a product differently with the
number of threads and round it differently, so a quantity near a threshold could be
decided one way in the command's own process (as many BLAS threads as cores) and the
other way on a Dask worker (one thread).  Computed under :func:`single_blas_thread`, the
numbers are the same everywhere.

The thread pools are controlled with :mod:`threadpoolctl` (OpenBLAS, MKL, BLIS).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["blas_threads", "single_blas_thread"]


def blas_threads() -> list[int]:
    """Thread counts of the BLAS libraries loaded in this process (empty if none is known)."""
    return [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]


@contextlib.contextmanager
def single_blas_thread() -> Iterator[None]:
    """Run the block with one BLAS thread, then restore the previous counts.

    The count is per process: threads of the same process running BLAS meanwhile are
    limited too.

    Examples
    --------
    >>> with single_blas_thread():
    ...     inside = blas_threads()
    >>> all(n == 1 for n in inside)
    True
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield
