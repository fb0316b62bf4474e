r"""Numba backend: parallel streaming and tiled attention kernels, O(N·d) memory.

Modules, from the bottom up:

* :mod:`~transformer_pde.backends.numba.intrinsics`: the LLVM intrinsics of the kernels
  (bit casts, ``maxnum``) and :func:`vexp`, a vectorisable exponential exact to a few ulp;
* :mod:`~transformer_pde.backends.numba.streaming`: the streaming softmax / lse and
  pointwise kernels (one query at a time, keys streamed in blocks, online log-sum-exp);
* :mod:`~transformer_pde.backends.numba.tiled`: the tiled kernels for wide heads
  (register-blocked micro-kernel generated as LLVM IR, FlashAttention on the CPU);
* :mod:`~transformer_pde.backends.numba.sweep`: the fused Sinkhorn sweep (a whole
  alternating iteration in one pass over the pairs);
* :mod:`~transformer_pde.backends.numba.backend`: :class:`NumbaBackend`, which lays the
  arrays out for the kernels, picks the kernel family, answers non-finite or
  overflowing calls with the NumPy reference and runs the kernels on its threads.

Importing this package without Numba raises
:class:`~transformer_pde.errors.BackendNotAvailable`.
"""

from .intrinsics import vexp  # first: raises BackendNotAvailable without Numba
from .backend import NumbaBackend

__all__ = ["NumbaBackend", "vexp"]
