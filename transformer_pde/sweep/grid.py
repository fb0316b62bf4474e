"""The grid of a study: a product of named axes times a number of random draws.

Every cell of a :class:`Grid` has a flat index ``0 … n_cells - 1`` (row-major over the
axes, then the draw), its parameters (one value per axis) and its own random generator,
seeded by ``numpy.random.SeedSequence(seed, spawn_key=(flat_index,))``.  A cell's random
stream therefore depends only on the base seed and on where the cell sits in the grid,
never on which worker runs it, in which order, or whether the study was resumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..io.jsonfmt import dumps

__all__ = ["Grid", "Cell"]

_SCALARS = (bool, int, float, str, np.integer, np.floating, np.bool_, np.str_)


def _axis_values(name: str, values: Any) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray):
        raise ArgumentTypeError(f"grid axis {name!r} must be a list of values, got "
                                f"{type(values).__name__}")
    vals = tuple(np.asarray(values).tolist()) if isinstance(values, np.ndarray) else tuple(values)
    if not vals:
        raise ArgumentError(f"grid axis {name!r} is empty")
    for v in vals:
        if not isinstance(v, _SCALARS):
            raise ArgumentTypeError(f"grid axis {name!r}: values must be numbers or strings, "
                                    f"got {v!r} ({type(v).__name__})")
        if isinstance(v, float) and not math.isfinite(v):
            raise ArgumentError(f"grid axis {name!r}: values must be finite, got {v!r}")
    kinds = {isinstance(v, (str, np.str_)) for v in vals}
    if len(kinds) > 1:
        raise ArgumentTypeError(f"grid axis {name!r} mixes strings and numbers: {list(vals)!r}")
    vals = tuple(v.item() if isinstance(v, np.generic) else v for v in vals)
    if len(set(vals)) != len(vals):
        raise ArgumentError(f"grid axis {name!r} repeats a value: {list(vals)!r}")
    return vals


@dataclass(frozen=True)
class Cell:
    """One cell of a grid: its flat index, parameters, draw number and seed sequence."""

    index: int
    params: dict
    draw: int
    seed: np.random.SeedSequence = field(repr=False)

    def rng(self) -> np.random.Generator:
        """A fresh generator for this cell (the same stream every time it is asked for)."""
        return np.random.default_rng(self.seed)


@dataclass(frozen=True, init=False)
class Grid:
    """A product of named axes, each cell repeated for ``draws`` random draws.

    Parameters
    ----------
    axes : mapping of str to sequence
        Axis name -> the values it takes (numbers or strings, no repeats).  Order matters:
        it is the order of the dimensions of the results.  ``"draw"`` is reserved.
    draws : int
        Random draws per combination of axis values (``>= 1``).
    seed : int
        Base seed; cell ``i`` uses ``SeedSequence(seed, spawn_key=(i,))``.

    Examples
    --------
    >>> g = Grid({"kind": ["softmax", "l2"], "d": [3, 4]}, draws=10, seed=1)
    >>> g.shape, g.n_cells
    ((2, 2, 10), 40)
    >>> g.cell(13).params, g.cell(13).draw
    ({'kind': 'softmax', 'd': 4}, 3)
    """

    axes: dict
    draws: int
    seed: int

    def __init__(self, axes: Mapping[str, Sequence], draws: int = 1, seed: int = 0) -> None:
        if not isinstance(axes, Mapping):
            raise ArgumentTypeError(f"axes must be a mapping of axis name to values, got "
                                    f"{type(axes).__name__}")
        clean = {}
        for name, values in axes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ArgumentError(f"grid axis names must be identifiers, got {name!r}")
            if name == "draw":
                raise ArgumentError("grid axis name 'draw' is reserved for the random draws")
            clean[name] = _axis_values(name, values)
        for key, value in (("draws", draws), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ArgumentTypeError(f"{key} must be an integer, got {value!r}")
        if draws < 1:
            raise ArgumentError(f"draws must be >= 1, got {draws}")
        if seed < 0:
            raise ArgumentError(f"seed must be >= 0, got {seed}")
        object.__setattr__(self, "axes", clean)
        object.__setattr__(self, "draws", int(draws))
        object.__setattr__(self, "seed", int(seed))

    @property
    def dims(self) -> tuple[str, ...]:
        """Dimension names of the results: the axes, then ``"draw"``."""
        return (*self.axes, "draw")

    @property
    def shape(self) -> tuple[int, ...]:
        return (*(len(v) for v in self.axes.values()), self.draws)

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape))

    def coords(self) -> dict[str, Any]:
        """Coordinates of the results (``draw`` is ``0 … draws-1``)."""
        out: dict[str, Any] = {k: list(v) for k, v in self.axes.items()}
        out["draw"] = np.arange(self.draws)
        return out

    def position(self, index: int) -> tuple[int, ...]:
        """Multi-index (one entry per dimension) of flat cell ``index``."""
        if not 0 <= int(index) < self.n_cells:
            raise ArgumentError(f"cell index must be in [0, {self.n_cells}), got {index}")
        return tuple(int(i) for i in np.unravel_index(int(index), self.shape))

    def cell(self, index: int) -> Cell:
        pos = self.position(index)
        params = {name: values[i] for (name, values), i in zip(self.axes.items(), pos[:-1], strict=True)}
        return Cell(int(index), params, pos[-1],
                    np.random.SeedSequence(self.seed, spawn_key=(int(index),)))

    def __iter__(self) -> Iterator[Cell]:
        return (self.cell(i) for i in range(self.n_cells))

    def to_dict(self) -> dict:
        """A JSON-able description; two grids are the same study grid iff these agree."""
        return {"axes": {k: list(v) for k, v in self.axes.items()}, "draws": self.draws,
                "seed": self.seed}

    def fingerprint(self) -> str:
        return dumps(self.to_dict(), sort_keys=True)

    def chunks(self, item_size: int, target: int = 1 << 16) -> tuple[int, ...]:
        """Chunk shape over the grid dimensions for cells of ``item_size`` bytes: about
        ``target`` bytes of consecutive cells (whole trailing dimensions first), so that a
        group of finished cells -- consecutive in the grid's order -- is written as few
        chunks.  (One chunk per cell, as with chunks of 1 along every axis but the draws,
        costs a Zarr write per cell: ~9 ms each.)"""
        cells = max(1, target // max(item_size, 1))
        chunks = []
        for n in reversed(self.shape):
            take = int(max(1, min(n, cells)))
            chunks.append(take)
            cells = cells // n if take == n else 1
        return tuple(reversed(chunks))
