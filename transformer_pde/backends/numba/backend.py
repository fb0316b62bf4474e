r"""The Numba backend: dispatch to the streaming or tiled kernels, fallbacks, threads.

:class:`NumbaBackend` implements the three primitives of :mod:`transformer_pde.backends`
with compiled parallel kernels that never form an N×N matrix: the streaming kernels
(:mod:`~transformer_pde.backends.numba.streaming`, one query at a time, SIMD across
keys) for narrow projections and the tiled kernels
(:mod:`~transformer_pde.backends.numba.tiled`, register-blocked tile products) from
projection width :data:`~transformer_pde.backends.numba.tiled.TILED_MIN_WIDTH`
(:meth:`NumbaBackend.kernel_for`).  It also provides the optional backend method
:meth:`NumbaBackend.sinkhorn_sweep`, a whole Sinkhorn iteration in one pass
(:mod:`~transformer_pde.backends.numba.sweep`).

Each query reduces over its key range :math:`[\mathrm{lo}_i, \mathrm{hi}_i)`
(:class:`~transformer_pde.backends.ranges.KeyRanges`; ``None``: all keys).  Keys of zero
weight (bias :math:`-\infty`) are removed before the kernels run (both ends of every
range are recounted), so the kernels only see finite numbers and can be
compiled with fast-math reductions; a bias containing NaN or :math:`+\infty` (or
``pointwise`` weights that are not all finite) is handed to the NumPy reference
unchanged, so every backend returns the same non-finite answer.  So are calls whose
logits could come near the float range (:func:`~transformer_pde.backends.numpy_backend.overflow_scale`:
:math:`r\max|q|\max|k| + \max|b|` beyond :math:`2^{-10}` of the largest float), which
the reference computes exactly by a power-of-two rescaling.

Threads: ``NumbaBackend(n_threads=k)`` runs the kernels on ``k`` threads (default: all
of Numba's threads, ``NUMBA_NUM_THREADS``), fewer for small calls (at least
500 000 pair interactions per thread).  Calls from several Python
threads are safe under every threading layer: with ``workqueue`` (not thread-safe in
Numba) kernel launches are serialised by a lock.  Before the first parallel launch of
the process, ``OMP_WAIT_POLICY`` is set to ``PASSIVE`` unless the user set it: with
the ``omp`` layer, GNU OpenMP's workers otherwise spin for a while after every kernel,
burning a core while the caller does its NumPy work between kernels (an ensemble run,
B = 64, n = 256, d = 8, RK4: 1.2 CPU-s spinning, 0.8 passive, same wall time on a
2-core machine); a passive worker wakes in microseconds, and a kernel gets at least
~0.5 ms per thread.  Kernels are compiled with
``cache=True``; one specialisation per dtype (float32, float64) and kernel.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numba
import numpy as np

from ...errors import ArgumentError, ArgumentTypeError
from ..compile_notice import install as _install_compile_notice
from ..numpy_backend import NumpyBackend, overflow_scale
from ..ranges import KeyRanges, check_ranges
from .streaming import TILE, pointwise_kernel, softmax_kernel
from .sweep import fused_sweep
from .tiled import (
    TILED_MIN_WIDTH,
    TILED_MIN_WIDTH_F32,
    pointwise_tiled_kernel,
    query_layout,
    query_tile,
    softmax_tiled_kernel,
    tiled_layout,
)

__all__ = ["NumbaBackend"]

_install_compile_notice()  # a cold kernel compilation is said (compile_notice)

_PHI_CODES = {"identity": 0, "sigmoid": 1, "relu": 2}
#: the ``mode`` of :meth:`NumbaBackend._launch` for softmax / lse (else a phi code)
_SOFTMAX = -1

#: smallest number of query-key pairs worth giving to one more thread
_MIN_PAIRS_PER_THREAD = 500_000

#: most key-range objects whose query layout a backend keeps (NumbaBackend._queries)
_LAYOUT_CACHE_SIZE = 16

# answers calls with non-finite biases or weights (see the module docstring)
_REFERENCE = NumpyBackend()

# Numba's "workqueue" threading layer aborts the process (SIGABRT) when two Python
# threads launch parallel kernels at once; "tbb" and "omp" are thread-safe.  Launches
# are serialised by this lock unless the layer in use is known to be thread-safe
# (before the first launch the layer is not chosen yet: locked too).
_LAUNCH_LOCK = threading.Lock()
_THREADSAFE_LAYERS = ("tbb", "omp")


def _needs_reference(q, k, bias) -> bool:
    """Logits that may come near the float range, or non-finite q / k: the kernels
    (compiled for finite numbers) leave such calls to the NumPy reference."""
    if q.size == 0 or k.size == 0:
        return False
    if not (np.isfinite(np.abs(q).max()) and np.isfinite(np.abs(k).max())):
        return True
    return overflow_scale(q, k, bias) != 1.0


def _range_ends(ranges: KeyRanges | None, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of checked ``ranges`` as writeable int64 arrays (``None``: all ``n``
    keys; read-only arrays would compile second kernel specialisations)."""
    if ranges is None:
        return np.zeros(m, dtype=np.int64), np.full(m, n, dtype=np.int64)
    return np.array(ranges.lo), np.array(ranges.hi)


def _launch_is_threadsafe() -> bool:
    try:
        return numba.threading_layer() in _THREADSAFE_LAYERS
    except ValueError:         # no parallel region has run yet
        return False


class NumbaBackend:
    """Parallel CPU backend: streaming and tiled kernels, O(N·d) memory.

    Parameters
    ----------
    n_threads : int, optional
        Number of threads for the kernels (1 … ``numba.config.NUMBA_NUM_THREADS``);
        default all of them.  Can be changed later with :meth:`set_threads`.
    kernel : {"auto", "tiled", "streaming"}, default "auto"
        Kernel family: ``"auto"`` follows the measured crossover of
        :meth:`kernel_for`; the others force one (for tests and benchmarks).

    Raises
    ------
    ArgumentError
        ``kernel`` not one of the three, or ``n_threads`` out of range.
    ArgumentTypeError
        ``n_threads`` not an integer.

    Notes
    -----
    Besides the three primitives it provides the optional backend method
    :meth:`sinkhorn_sweep` (see :mod:`transformer_pde.backends`).  Inputs may be
    float32 or float64 (mixed inputs are promoted like NumPy); outputs have the
    promoted dtype.  Memory use is O((N + M)·(r + c)) for M queries, N keys, projection
    width r and value width c.
    """

    name = "numba"
    xp = np

    def __init__(self, n_threads: int | None = None, kernel: str = "auto") -> None:
        if kernel not in ("auto", "tiled", "streaming"):
            raise ArgumentError(f"kernel must be 'auto', 'tiled' or 'streaming', "
                                f"got {kernel!r}")
        self.kernel = kernel
        self.n_threads: int | None = None
        # query layouts (tiled.query_layout) of the KeyRanges seen lately, by identity
        self._layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.set_threads(n_threads)

    def set_threads(self, n_threads: int | None) -> None:
        """Use ``n_threads`` threads (``None``: all of Numba's threads).

        Raises :class:`~transformer_pde.errors.ArgumentTypeError` for a non-integer and
        :class:`~transformer_pde.errors.ArgumentError` outside ``[1, NUMBA_NUM_THREADS]``.
        """
        if n_threads is not None:
            if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)):
                raise ArgumentTypeError(f"n_threads must be a positive integer or None, "
                                        f"got {n_threads!r}")
            top = numba.config.NUMBA_NUM_THREADS
            if not 1 <= n_threads <= top:
                raise ArgumentError(f"n_threads must be in [1, {top}] "
                                    f"(NUMBA_NUM_THREADS), got {n_threads}")
            n_threads = int(n_threads)
        self.n_threads = n_threads

    def __repr__(self) -> str:
        return f"NumbaBackend(n_threads={self.n_threads}, kernel={self.kernel!r})"

    # ------------------------------------------------------------------ arrays
    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    # ------------------------------------------------------------------ helpers
    def _threads(self) -> int:
        return self.n_threads or numba.config.NUMBA_NUM_THREADS

    def _threads_for(self, work: int) -> int:
        # at least _MIN_PAIRS_PER_THREAD pair interactions (~0.5 ms) per thread: below
        # that, waking threads costs more than it saves, and on a loaded machine a
        # parallel call waits for every thread to be scheduled
        return int(min(self._threads(), max(1, work // _MIN_PAIRS_PER_THREAD)))

    def _run(self, kernel: Any, work: int, *args: Any) -> None:
        """Run a compiled parallel kernel on :meth:`threads` ``(work)`` threads, launches
        serialised where the threading layer needs it."""
        n = self._threads_for(work)
        # read when the first launch (or get_num_threads) loads the threading layer
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # see the module docstring
        old = numba.get_num_threads()
        if n != old:
            numba.set_num_threads(n)
        try:
            if _launch_is_threadsafe():
                kernel(*args)
            else:
                with _LAUNCH_LOCK:
                    kernel(*args)
        finally:
            if n != old:
                numba.set_num_threads(old)

    def threads(self, work: int | None = None) -> int:
        """Number of threads the kernels run on (for ``work`` pair interactions: fewer
        for small calls)."""
        return self._threads() if work is None else self._threads_for(work)

    def _groups(self, m: int, tile: int, work: int) -> tuple[int, int]:
        """``(n_groups, n_threads)`` for a kernel over ``m`` queries in tiles of ``tile``:
        up to 8 strided groups of tiles per thread (see
        :func:`~transformer_pde.backends.numba.streaming.first_tile`), a multiple
        of the threads :meth:`_run` uses for ``work`` pairs."""
        n = self._threads_for(work)
        n_tiles = -(-m // tile)
        per = max(1, min(8, -(-n_tiles // n)))
        return n * per, n

    @staticmethod
    def _prepare(q, k, others, bias, ranges):
        """Common dtype, int64 range ends, -inf keys removed, keys past every range dropped.

        ``bias = None`` gives a zero bias, ``ranges = None`` all keys.  Returns ``None``
        when ``bias`` holds NaN or +inf (caller falls back to NumPy); otherwise ``(dtype,
        q, k, others, bias, lo, hi, same)`` with ``k`` (N', r) and ``others`` (N', c) not
        yet laid out for a kernel, and ``same`` the checked ``ranges`` when ``lo``, ``hi``
        are its ends unchanged (no key removed), else ``None``.
        """
        q = np.asarray(q)
        k = np.asarray(k)
        others = [np.asarray(o) for o in others]
        dtype = np.result_type(q, k, *others, np.float32)
        if dtype not in (np.float32, np.float64):
            dtype = np.dtype(np.float64)
        if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1]:
            raise ArgumentError(f"q and k must be (M, r) and (N, r), got {q.shape} and "
                                f"{k.shape}")
        n = k.shape[0]
        m = q.shape[0]
        if bias is None:
            b = np.zeros(n, dtype=dtype)
        else:
            b = np.asarray(bias, dtype=dtype)
            if b.shape != (n,):
                raise ArgumentError(f"bias must have shape ({n},), got {b.shape}")
        same = check_ranges(ranges, m, n)
        lo, hi = _range_ends(same, m, n)
        finite = np.isfinite(b)
        if not finite.all():
            if np.isnan(b).any() or (b == np.inf).any():
                return None
            same = None
            # -inf: zero-weight keys contribute nothing; csum[j] = finite keys before j
            csum = np.concatenate(([0], np.cumsum(finite, dtype=np.int64)))
            lo, hi = csum[lo], csum[hi]
            b = b[finite]
            k = k[finite]
            others = [o[finite] for o in others]
        top = int(hi.max(initial=0))
        if top < k.shape[0]:                   # keys no query can see are never read
            k, b, others = k[:top], b[:top], [o[:top] for o in others]
        return dtype, np.ascontiguousarray(q, dtype=dtype), k, others, b, lo, hi, same

    def kernel_for(self, r: int, dtype: Any = np.float64) -> str:
        """``"tiled"`` or ``"streaming"``: the kernel used for projection width ``r``.

        With ``kernel="auto"`` the tiled kernels (register-blocked tile products) are
        used from ``r >=`` :data:`TILED_MIN_WIDTH` = 8 (float64) or
        :data:`TILED_MIN_WIDTH_F32` = 12 (float32): there a pair's ``r`` multiply-adds
        outweigh its exponential, and below it the streaming kernels (one query at a
        time, SIMD across keys) are faster.  Crossovers measured on a 2-core AVX2
        machine (AMD EPYC, Zen 3) at N = 2e4, c = r, one thread, streaming time over
        tiled time: float64 0.87 (r = 2), 1.05 (4), 1.03 (6), 1.53 (8), 1.61 (16);
        float32 0.78 (4), 0.93 (6), 1.04 (8), 1.30 (12), 1.64 (16)
        (``benchmarks/particles.py`` records both kernels for d >= 8).  On CPUs with
        AVX-512F the tiled kernels' products run on 512-bit registers
        (:data:`~transformer_pde.backends.numba.intrinsics.VECTOR_BITS`); the thresholds
        above, measured with 256-bit products, are used there too.
        """
        if self.kernel != "auto":
            return self.kernel
        top = TILED_MIN_WIDTH_F32 if np.dtype(dtype) == np.float32 else TILED_MIN_WIDTH
        return "tiled" if r >= top else "streaming"

    def _queries(self, ranges, lo, hi, n):
        """:func:`~transformer_pde.backends.numba.tiled.query_layout` of ``lo``, ``hi``,
        kept per ``ranges`` (the :class:`KeyRanges` they are the ends of, or ``None``):
        a ``KeyRanges`` is immutable and a run passes the same one to every evaluation, so
        its sort and padding are made once (at most :data:`_LAYOUT_CACHE_SIZE` kept,
        dropped with their ranges)."""
        if ranges is None:
            return query_layout(lo, hi, n)
        hit = self._layouts.get(ranges)
        if hit is None or hit[0] != n:     # n: the keys left after dropping unseen ones
            if len(self._layouts) >= _LAYOUT_CACHE_SIZE:
                self._layouts.clear()
            hit = (n, query_layout(lo, hi, n))
            self._layouts[ranges] = hit
        return hit[1]

    @staticmethod
    def _unpermute(a, order, m):
        if order is None:
            return a[:m]
        res = np.empty_like(a[:m])
        res[order] = a[:m]
        return res

    # ------------------------------------------------------------------ primitives
    def _launch(self, mode, dtype, qc, kk, vv, bw, lo, hi, same):
        """Run the kernel (:meth:`kernel_for`) of ``mode`` (``_SOFTMAX``, ``bw`` the bias,
        or a pointwise phi code, ``bw`` the weights) on prepared operands (``vv = None``:
        lse alone; ``same`` as returned by :meth:`_prepare`); returns ``(out (M, c), lse
        (M,))`` (pointwise: ``lse`` unused)."""
        m, r = qc.shape
        c = 0 if vv is None else vv.shape[1]
        work = int((hi - lo).sum())
        if self.kernel_for(r, dtype) == "tiled":
            order, qp, kpk, vpk, bp, lop, hip, nr = tiled_layout(
                dtype, qc, kk, vv, bw, lo, hi, self._queries(same, lo, hi, kk.shape[0]),
                scratch=True)
            out = np.zeros((lop.shape[0], vpk.shape[0] * nr), dtype=dtype)
            lse = np.full(lop.shape[0], -np.inf, dtype=dtype)
            qt = query_tile(lop.shape[0], self._threads_for(work))
            args = (qp, kpk, vpk, bp, lop, hip, nr, c, qt,
                    *self._groups(lop.shape[0], qt, work), out)
            if mode == _SOFTMAX:
                self._run(softmax_tiled_kernel, work, *args, lse)
            else:
                self._run(pointwise_tiled_kernel, work, np.int64(mode), *args)
            return (self._unpermute(out[:, :c], order, m),
                    self._unpermute(lse, order, m))
        kT = np.ascontiguousarray(kk.T, dtype=dtype)
        vT = (np.empty((0, kT.shape[1]), dtype=dtype) if vv is None
              else np.ascontiguousarray(vv.T, dtype=dtype))
        bw = np.ascontiguousarray(bw, dtype=dtype)
        out = np.zeros((m, c), dtype=dtype)              # no visible mass: out = 0,
        lse = np.full(m, -np.inf, dtype=dtype)           # lse = -inf
        groups = self._groups(m, TILE, work)
        if mode == _SOFTMAX:
            self._run(softmax_kernel, work, qc, kT, vT, bw, lo, hi, *groups, out, lse)
        else:                                            # unbiased logits, weights bw
            self._run(pointwise_kernel, work, np.int64(mode), qc, kT, vT, bw, np.zeros_like(bw),
                      lo, hi, *groups, out)
        return out, lse

    def _reduce(self, q, k, v, bias, ranges):
        """Run a softmax kernel; ``v = None`` computes the lse alone."""
        prep = self._prepare(q, k, [] if v is None else [v], bias, ranges)
        if prep is None or _needs_reference(prep[1], prep[2], prep[4]):
            return None
        dtype, qc, kk, oo, b, lo, hi, same = prep
        return self._launch(_SOFTMAX, dtype, qc, kk, oo[0] if oo else None, b, lo, hi, same)

    def softmax(self, q: Any, k: Any, v: Any, bias: Any, ranges: KeyRanges | None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Softmax: ``(out (M, c), lse (M,))``; see :mod:`transformer_pde.backends`."""
        res = self._reduce(q, k, v, bias, ranges)
        if res is None:       # NaN / +inf bias or logits that may overflow: the reference
            # defines the answer (it rescales overflowing logits exactly)
            return _REFERENCE.softmax(q, k, v, bias, ranges)
        return res

    def lse(self, q: Any, k: Any, bias: Any, ranges: KeyRanges | None) -> np.ndarray:
        r""":math:`\mathrm{lse}_i = \log\sum_{\mathrm{lo}_i \le j<\mathrm{hi}_i}
        e^{q_i\cdot k_j + b_j}` (M,).

        The primitive of log-domain Sinkhorn: one pass over the keys per query, O(N)
        memory, ``-inf`` for a query whose visible keys all have weight zero.
        """
        res = self._reduce(q, k, None, bias, ranges)
        if res is None:
            return _REFERENCE.lse(q, k, bias, ranges)
        return res[1]

    def pointwise(self, phi: str, q: Any, k: Any, v: Any, w: Any, ranges: KeyRanges | None
                  ) -> np.ndarray:
        r"""``out_i = sum_{lo_i <= j < hi_i} w_j phi(q_i . k_j) v_j`` for ``phi`` in
        identity/sigmoid/relu."""
        if phi not in _PHI_CODES:
            raise ArgumentError(f"phi must be one of {sorted(_PHI_CODES)}, got {phi!r}")
        wa = np.asarray(w)
        if not np.all(np.isfinite(wa)):
            return _REFERENCE.pointwise(phi, q, k, v, w, ranges)
        if wa.shape != (np.shape(k)[0],):
            raise ArgumentError(f"w must have shape ({np.shape(k)[0]},), got {wa.shape}")
        dtype, qc, kk, (vv,), _, lo, hi, same = self._prepare(q, k, [v], None, ranges)
        if _needs_reference(qc, kk, None):      # keys past every range already dropped
            return _REFERENCE.pointwise(phi, q, k, v, w, ranges)
        ww = wa[:kk.shape[0]].astype(dtype)          # no bias: keys are only truncated
        return self._launch(_PHI_CODES[phi], dtype, qc, kk, vv, ww, lo, hi, same)[0]

    # ------------------------------------------------------------------ optional methods
    def sinkhorn_sweep(self, q: Any, k: Any, v: Any, bias: Any, w: Any, *,
                       ranges: KeyRanges | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r"""One alternating Sinkhorn iteration in one pass: ``(out, lse, col)``.

        With logits :math:`\ell_{ij} = q_i\cdot k_j + b_j`, the row softmax
        :math:`P_{ij} = e^{\ell_{ij} - \mathrm{lse}_i}` and row weights :math:`w_i`,

        .. math:: \mathrm{lse}_i = \log\sum_j e^{\ell_{ij}},\qquad
                  \mathrm{out}_i = \sum_j P_{ij}\, v_j,\qquad
                  \mathrm{col}_j = \sum_i w_i\, P_{ij},

        computed with one exponential per pair (the kernel of
        :mod:`~transformer_pde.backends.numba.sweep`).  With ``ranges`` row :math:`i`
        sees only the keys :math:`\mathrm{lo}_i \le j < \mathrm{hi}_i` and
        :math:`\mathrm{col}_j` sums over the rows whose range contains :math:`j`:
        block-diagonal ranges (:meth:`KeyRanges.segments
        <transformer_pde.backends.ranges.KeyRanges.segments>`) sweep independent
        systems at once.  In log-domain Sinkhorn for the
        self-coupling of :math:`\mu = \sum_j w_j\delta_{x_j}` with scores
        :math:`s_{ij}` at temperature :math:`\varepsilon`, with ``q``, ``k`` giving
        :math:`q_i\cdot k_j = s_{ij}/\varepsilon` and :math:`b_j = \log w_j +
        g_j/\varepsilon`, this is a whole iteration: the row potential is
        :math:`f_i = -\varepsilon\,\mathrm{lse}_i`, ``out`` the attention field, and the
        column update :math:`g'_j = -\varepsilon\,\mathrm{LSE}_i\big(\log w_i + (f_i +
        s_{ij})/\varepsilon\big)` follows from the column sums of the plan
        :math:`\pi_{ij} = w_i P_{ij}` without a second pass:

        .. math:: g'_j = g_j - \varepsilon\log\frac{\mathrm{col}_j}{w_j},

        and :math:`\max_j|\log(\mathrm{col}_j/w_j)| = \|g' - g\|_\infty/\varepsilon` is
        the stopping quantity.  That relation keeps the relative accuracy of
        :math:`\mathrm{col}_j`; where a column sum is not a normal positive number (a
        column that receives almost no mass) callers take the column update from an
        ``lse`` pass instead.

        Parameters
        ----------
        q : array (M, r)
        k : array (N, r)
        v : array (N, c) or None
            Values averaged by the row softmax; ``None`` skips them (``out`` is then
            (M, 0)).
        bias : array (N,)
        w : array (M,)
            Row weights of the column sums.
        ranges : KeyRanges or None, keyword-only
            Per-row key ranges (``None``: all keys); a row with an empty range gets
            ``out = 0``, ``lse = -inf`` and adds nothing to the column sums.

        Returns
        -------
        out : ndarray (M, c)
        lse : ndarray (M,)
        col : ndarray (N,), float64

        Raises
        ------
        ArgumentError
            Shapes that do not match, or ``ranges`` not one range per row over the keys.
        ArgumentTypeError
            ``ranges`` not ``None`` or a :class:`~transformer_pde.backends.ranges.KeyRanges`.

        Notes
        -----
        Preconditions, not checked (the check would cost as much as a small sweep; the
        Sinkhorn solver makes it once per iteration and otherwise takes its two
        log-domain passes): ``q``, ``k``, ``bias`` and ``w`` finite, and logits well
        inside the float range
        (:func:`~transformer_pde.backends.numpy_backend.overflow_scale` returns 1).
        Computed in the promoted dtype of ``q`` and ``k`` (float32 or float64; ``v``
        and ``bias`` are cast to it), column sums in float64.  Accuracy against dense
        ``scipy.special.logsumexp`` logits: about 1e-13 relative in float64, 2e-5 in
        float32.  The rows are split into a fixed number of chunks with their own
        column sums, added in order, so the result does not depend on the number of
        threads.
        """
        m, n = np.shape(q), np.shape(k)
        if len(m) != 2 or len(n) != 2 or m[1] != n[1]:
            raise ArgumentError(f"q and k must be (M, r) and (N, r), got {m} and {n}")
        if v is not None and (np.ndim(v) != 2 or np.shape(v)[0] != n[0]):
            raise ArgumentError(f"v must be None or have shape ({n[0]}, c), "
                                f"got {np.shape(v)}")
        if np.shape(bias) != (n[0],):
            raise ArgumentError(f"bias must have shape ({n[0]},), got {np.shape(bias)}")
        if np.shape(w) != (m[0],):
            raise ArgumentError(f"w must have shape ({m[0]},), got {np.shape(w)}")
        return fused_sweep(self._run, q, k, v, bias, w, check_ranges(ranges, m[0], n[0]))
