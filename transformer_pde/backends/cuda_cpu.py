"""Run the GPU backend's CUDA kernels on the CPU: the same source, compiled as C++.

:class:`CpuLauncher` compiles ``kernels/attention.cu`` with ``kernels/cpu_shim.h`` (which
maps ``__global__``, ``__shared__``, ``__syncthreads``, ``threadIdx`` and ``blockIdx``
onto C++ threads and a barrier) into a shared library with a C++ compiler (``g++`` or
``$CXX``), and launches its kernels through :mod:`ctypes` on NumPy arrays.  Passed to
:class:`~transformer_pde.backends.cupy_backend.CupyBackend`, it runs the whole GPU backend
(kernels and host code) with NumPy standing in for CuPy.  This is a testing tool (a few
million pairs per second, each block's threads are OS threads): it lets every CI machine
check the kernels' arithmetic, masking, tiling, key split and barriers.

Compiled libraries are cached in ``$TMPDIR/transformer_pde_cpu_kernels``, keyed by a
hash of the sources, the kernel list and the compiler command.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendNotAvailable

__all__ = ["CpuLauncher", "find_compiler"]

_FLAGS = ["-std=c++17", "-O0", "-shared", "-fPIC", "-pthread", "-Wno-unknown-pragmas"]


def find_compiler() -> str | None:
    """Path of the C++ compiler (``$CXX``, else ``g++``, else ``clang++``), or ``None``."""
    for cand in (os.environ.get("CXX"), "g++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _harness(names: Sequence[str]) -> str:
    lines = ['#include "cpu_shim.h"', '#include "attention.cu"', ""]
    for i, name in enumerate(names):
        lines.append(f'extern "C" void tpde_k{i}(void** p, unsigned gx, unsigned gy, '
                     f'unsigned nt) {{ tpde_cpu_run(&{name}, p, gx, gy, nt); }}')
    return "\n".join(lines) + "\n"


class CpuLauncher:
    """Launch the kernels of ``kernels/attention.cu`` on the CPU (see the module docstring).

    Parameters
    ----------
    names : iterable of str, optional
        Kernel name expressions to compile up front (one compiler run); any other kernel
        is compiled when first launched.
    n_multiprocessors : int, default 4
        Pretended multiprocessor count (sets when the backend splits the keys).

    Raises
    ------
    BackendNotAvailable
        No C++ compiler was found.
    """

    def __init__(self, names: Iterable[str] = (), *, n_multiprocessors: int = 4):
        self.compiler = find_compiler()
        if self.compiler is None:
            raise BackendNotAvailable("CpuLauncher needs a C++ compiler (g++ or clang++, or "
                                      "$CXX) to build the kernels for the CPU")
        self.xp = np
        self.n_multiprocessors = int(n_multiprocessors)
        self._functions: dict[str, Any] = {}
        self._libs: list[ctypes.CDLL] = []
        names = list(dict.fromkeys(names))
        if names:
            # one compiler process per core, each on its share of the kernels
            n_jobs = max(1, min(os.cpu_count() or 1, len(names) // 8))
            groups = [names[i::n_jobs] for i in range(n_jobs)]
            with ThreadPoolExecutor(n_jobs) as pool:
                for g, lib in zip(groups, pool.map(self._compile, groups), strict=True):
                    self._load(g, lib)

    def _build(self, names: list[str]) -> None:
        self._load(names, self._compile(names))

    def _compile(self, names: list[str]) -> Path:
        kdir = resources.files(__package__).joinpath("kernels")
        shim = kdir.joinpath("cpu_shim.h").read_text()
        src = kdir.joinpath("attention.cu").read_text()
        harness = _harness(names)
        cmd = [self.compiler, *_FLAGS]
        key = hashlib.sha256("\0".join([shim, src, harness, *cmd]).encode()).hexdigest()[:24]
        cache = Path(tempfile.gettempdir()) / "transformer_pde_cpu_kernels"
        cache.mkdir(parents=True, exist_ok=True)
        lib = cache / f"kernels-{key}.so"
        if not lib.exists():
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                t = Path(tmp)
                (t / "cpu_shim.h").write_text(shim)
                (t / "attention.cu").write_text(src)
                (t / "harness.cpp").write_text(harness)
                out = t / "lib.so"
                res = subprocess.run([*cmd, "-x", "c++", str(t / "harness.cpp"), "-o", str(out)],
                                     capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    raise RuntimeError(f"compiling the kernels for the CPU failed:\n{res.stderr}")
                os.replace(out, lib)
        return lib

    def _load(self, names: list[str], lib: Path) -> None:
        dll = ctypes.CDLL(str(lib))
        self._libs.append(dll)
        for i, name in enumerate(names):
            fn = getattr(dll, f"tpde_k{i}")
            fn.restype = None
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint]
            self._functions[name] = fn

    def launch(self, name: str, grid: tuple[int, int], block: int,
               args: Sequence[Any]) -> None:
        """Run kernel ``name`` on ``grid`` blocks of ``block`` threads.

        ``args`` are C-contiguous NumPy arrays (passed as pointers) and Python integers
        (passed as ``int``), in the kernel's parameter order."""
        if name not in self._functions:
            self._build([name])
        holders = []
        for a in args:
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError("kernel arrays must be C-contiguous")
                holders.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, (int, np.integer)):
                holders.append(ctypes.c_int(int(a)))
            else:
                raise TypeError(f"unsupported kernel argument {type(a).__name__}")
        params = (ctypes.c_void_p * len(holders))(
            *[ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in holders])
        self._functions[name](params, int(grid[0]), int(grid[1]), int(block))
