"""Trajectories as labelled xarray Datasets, saved to netCDF or Zarr.

:func:`particle_dataset` and :func:`gaussian_dataset` turn results into
:class:`xarray.Dataset` objects with named dimensions (``time``, ``token``, ``dim``,
``dim_``) whose attributes keep the status, the message, the run information and the
attention specification (as exact JSON: float64 values round-trip exactly through
``repr``).  :func:`save_dataset` writes ``.nc`` (netCDF-4 through h5netcdf) or ``.zarr``
and never overwrites an existing path; :func:`particle_from_dataset` rebuilds a
:class:`~transformer_pde.particles.ParticleTrajectory` from such a Dataset.

xarray is imported only when these functions are called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArgumentError, TrajectoryFileError

__all__ = ["attention_to_json", "attention_from_json", "particle_dataset",
           "particle_fields", "gaussian_dataset", "save_dataset", "open_dataset",
           "TrajectoryFileError", "LABELLED_SUFFIXES"]

#: file suffixes written and read through xarray (NPZ is handled by the trajectory itself)
LABELLED_SUFFIXES = (".nc", ".zarr")


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str,
                "shape": list(value.shape)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"])).reshape(
                value["shape"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def attention_to_json(att: Any) -> str:
    """Exact JSON of ``att.to_dict()`` (``"null"`` for ``None``)."""
    return json.dumps(None if att is None else _encode(att.to_dict()))


def attention_from_json(text: str) -> Any:
    from .attention import Attention  # noqa: PLC0415  (attention imports nothing from here)

    spec = _decode(json.loads(text))
    if spec is None or not spec.get("serialisable", True):
        return None
    return Attention.from_dict(spec)


def particle_dataset(traj: Any) -> Any:
    """:class:`xarray.Dataset` of a particle trajectory: ``states (time, token, dim)`` (or,
    for a run that saved a statistic, ``last (token, dim)``, ``means (time, dim)``,
    ``covs (time, dim, dim_)`` and ``values (time, ...)``), ``weights (token)`` and
    ``positions (token)`` when masked; attributes ``status``, ``message``, ``info`` (JSON)
    and ``attention`` (exact JSON)."""
    import xarray as xr  # noqa: PLC0415

    data: dict[str, Any] = {"weights": (("token",), np.asarray(traj.weights))}
    if traj.states is not None:
        data["states"] = (("time", "token", "dim"), np.asarray(traj.states))
    else:
        data["last"] = (("token", "dim"), np.asarray(traj.last))
        means, covs = traj.moments()
        data["means"] = (("time", "dim"), np.asarray(means))
        data["covs"] = (("time", "dim", "dim_"), np.asarray(covs))
        if traj.values is not None:
            values = np.asarray(traj.values)
            data["values"] = (("time", *(f"values_{i}" for i in range(values.ndim - 1))),
                              values)
    if traj.positions is not None:
        data["positions"] = (("token",), np.asarray(traj.positions))
    attrs = {"transformer_pde": "particle-trajectory", "status": str(traj.status),
             "message": str(traj.message),
             "info": json.dumps(_encode(dict(traj.info)), default=str),
             "attention": attention_to_json(traj.attention)}
    return xr.Dataset(data, coords={"time": np.asarray(traj.times)}, attrs=attrs)


def particle_fields(ds: Any, source: str = "dataset") -> dict:
    """The constructor arguments of a
    :class:`~transformer_pde.particles.ParticleTrajectory` from a Dataset made by
    :func:`particle_dataset` (inverse of it); errors name ``source``."""
    if ds.attrs.get("transformer_pde") != "particle-trajectory":
        raise TrajectoryFileError(f"{source} is not a transformer-pde particle trajectory "
                                  f"(attribute 'transformer_pde' missing)")

    def arr(name: str) -> Any:
        return np.asarray(ds[name].values) if name in ds else None

    try:
        out = {"times": np.asarray(ds["time"].values), "states": arr("states"),
               "weights": np.asarray(ds["weights"].values), "positions": arr("positions"),
               "status": ds.attrs["status"], "message": ds.attrs["message"],
               "attention": attention_from_json(ds.attrs.get("attention", "null")),
               "info": _decode(json.loads(ds.attrs.get("info", "{}"))),
               "values": arr("values"), "last": arr("last"),
               "saved_means": arr("means"), "saved_covs": arr("covs")}
    except (KeyError, ValueError, TypeError) as exc:
        raise TrajectoryFileError(f"{source}: incomplete or inconsistent trajectory "
                                  f"({type(exc).__name__}: {exc})") from None
    T, n = out["times"].shape[0], out["weights"].shape[0]
    states = out["states"]
    if states is None and (out["last"] is None or out["saved_means"] is None):
        raise TrajectoryFileError(f"{source}: neither 'states' nor 'last'/'means' are stored")
    if states is not None and (states.ndim != 3 or states.shape[:2] != (T, n)):
        raise TrajectoryFileError(f"{source}: inconsistent shapes: states {states.shape}, "
                                  f"{T} times, {n} weights")
    return out


def gaussian_dataset(traj: Any) -> Any:
    """:class:`xarray.Dataset` of a Gaussian trajectory: ``means (time, dim)``,
    ``covs (time, dim, dim_)``, ``limit (dim, dim_)``; attributes ``status``,
    ``blowup_time``, ``t_final``, ``message``."""
    import xarray as xr  # noqa: PLC0415

    data = {"means": (("time", "dim"), np.asarray(traj.means)),
            "covs": (("time", "dim", "dim_"), np.asarray(traj.covs)),
            "limit": (("dim", "dim_"), np.asarray(traj.limit))}
    attrs = {"transformer_pde": "gaussian-trajectory", "status": str(traj.status),
             "blowup_time": float(traj.blowup_time), "t_final": float(traj.t_final),
             "message": str(traj.message)}
    return xr.Dataset(data, coords={"time": np.asarray(traj.times)}, attrs=attrs)


def save_dataset(ds: Any, path: str | Path) -> Path:
    """Write ``ds`` to ``path``: ``.nc`` (netCDF-4, h5netcdf) or ``.zarr`` (Zarr v2).
    An existing path is never overwritten."""
    path = Path(path)
    if path.suffix not in LABELLED_SUFFIXES:
        raise ArgumentError(f"path must end in one of {LABELLED_SUFFIXES}, got {path.name!r}")
    if path.exists():
        raise ArgumentError(f"{path} already exists; refusing to overwrite it")
    import dask  # noqa: PLC0415  (xarray's writers go through dask when it is installed)

    # In-memory data: write in this thread even if a Dask Client is the default scheduler.
    with dask.config.set(scheduler="synchronous"):
        if path.suffix == ".nc":
            ds.to_netcdf(path, engine="h5netcdf")
        else:
            ds.to_zarr(path, mode="w-", zarr_format=2, consolidated=False)
    return path


def open_dataset(path: str | Path) -> Any:
    """Read a Dataset written by :func:`save_dataset` (loaded into memory)."""
    import xarray as xr  # noqa: PLC0415

    path = Path(path)
    if not path.exists():
        raise TrajectoryFileError(f"{path} does not exist")
    try:
        if path.suffix == ".nc":
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                return ds.load()
        return xr.open_zarr(path, consolidated=False, zarr_format=2, chunks=None).load()
    except Exception as exc:  # noqa: BLE001 -- every reader failure means a bad file
        raise TrajectoryFileError(f"{path} is not a readable {path.suffix} trajectory "
                                  f"({type(exc).__name__}: {exc})") from None
