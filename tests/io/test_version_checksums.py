"""Checksums are verified whenever a file carries them, whatever its version field says.

A trajectory file whose data were edited and whose version field was set back to one
written before checksums existed must be refused (naming the file), never loaded; a file
whose version field disagrees with what it carries (checksums under a version without
them) is refused even when its data are intact; genuine older files, built here the way
the older versions wrote them, still load.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import IntegrityError
from transformer_pde.io import labelled
from transformer_pde.io.digests import array_digest, check_checksum_version
from transformer_pde.particles import ParticleTrajectory


def _traj():
    rng = np.random.default_rng(11)
    times = np.linspace(0.0, 1.0, 3)
    w = rng.uniform(0.5, 1.5, 5)
    return ParticleTrajectory(times, rng.normal(size=(3, 5, 2)), w / w.sum(), None, "ok",
                              "fine", info={"method": "rk4"})


def _bump(states):
    out = np.array(states, copy=True)
    out[1, 2, 0] = np.nextafter(out[1, 2, 0], np.inf)  # one ulp: the smallest edit
    return out


# ------------------------------------------------------------------------- labelled files
def _rewrite_labelled(src, dst, *, version="keep", checksums=True, edit=False):
    """Copy the labelled file ``src`` to ``dst`` with its attributes and data changed the
    way an editor would (``version``: "keep", "drop" or a value for ``format_version``)."""
    ds = labelled.open_dataset(src)
    if edit:
        ds["states"] = (ds["states"].dims, _bump(ds["states"].values), ds["states"].attrs)
    attrs = dict(ds.attrs)
    if version == "drop":
        attrs.pop("format_version")
    elif version != "keep":
        attrs["format_version"] = version
    if not checksums:
        attrs.pop("checksums")
    ds.attrs = attrs
    encoding = {str(n): {"_FillValue": None} for n in ds.variables}
    if dst.suffix == ".nc":
        ds.to_netcdf(dst, engine="h5netcdf", encoding=encoding)
    else:
        ds.to_zarr(dst, zarr_format=2, consolidated=False, encoding=encoding)
    return dst


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_labelled_edited_data_with_version_set_back_to_1_is_refused(tmp_path, suffix):
    # the reproducer: edit the data, set format_version back to 1 (checksums kept)
    src = _traj().save(tmp_path / f"orig{suffix}")
    bad = _rewrite_labelled(src, tmp_path / f"edited{suffix}", version=1, edit=True)
    with pytest.raises(IntegrityError, match=rf"edited\{suffix}: array 'states' does not "
                                             r"match its checksum"):
        tp.load(bad)
    # intact data under a version that does not carry checksums: the version was edited
    bad = _rewrite_labelled(src, tmp_path / f"v1{suffix}", version=1)
    with pytest.raises(IntegrityError, match=rf"v1\{suffix}.*format version 1.*checksums"):
        tp.load(bad)


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_genuine_version_1_labelled_files_still_load(tmp_path, suffix):
    tr = _traj()
    # written the way version 1 wrote them: no format_version, no checksums
    ds = labelled.particle_dataset(tr)
    old = tmp_path / f"old{suffix}"
    if suffix == ".nc":
        ds.to_netcdf(old, engine="h5netcdf")
    else:
        ds.to_zarr(old, zarr_format=2, consolidated=False)
    back = tp.load(old)
    assert np.array_equal(back.states, tr.states) and back.message == "fine"
    # an explicit format_version = 1 without checksums is version 1 as well
    src = tr.save(tmp_path / f"new{suffix}")
    back = tp.load(_rewrite_labelled(src, tmp_path / f"explicit{suffix}", version=1,
                                     checksums=False))
    assert np.array_equal(back.states, tr.states)


# ------------------------------------------------------------------------- NPZ files
def _rewrite_npz(src, dst, *, version, edit=False, keep=("meta_checksum", "checksums",
                                                         "digest_algorithm")):
    """Copy the NPZ trajectory ``src`` to ``dst`` with the meta ``version`` set, the data
    optionally edited, and only the checksum-bearing fields in ``keep`` left (a kept
    ``meta_checksum`` is recomputed, as an editor who knows the format would)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    if edit:
        arrays["states"] = _bump(arrays["states"])
    meta = json.loads(str(arrays["meta"]))
    meta["version"] = version
    for key in ("checksums", "digest_algorithm"):
        if key not in keep:
            meta.pop(key)
    arrays["meta"] = np.array(json.dumps(meta))
    if "meta_checksum" in keep:
        arrays["meta_checksum"] = np.array(array_digest(arrays["meta"]))
    else:
        arrays.pop("meta_checksum")
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)
    return dst


@pytest.mark.parametrize("version", [1, 2])
def test_npz_edited_data_with_version_set_back_is_refused(tmp_path, version):
    src = _traj().save(tmp_path / "orig.npz")
    bad = _rewrite_npz(src, tmp_path / "edited.npz", version=version, edit=True)
    with pytest.raises(IntegrityError, match=r"edited\.npz: array 'states' does not match "
                                             r"its checksum"):
        tp.load(bad)
    bad = _rewrite_npz(src, tmp_path / "intact.npz", version=version)
    with pytest.raises(IntegrityError, match=rf"intact\.npz.*format version {version}.*"
                                             r"checksums"):
        tp.load(bad)


def test_genuine_old_npz_files_still_load(tmp_path):
    tr = _traj()
    for version in (1, 2):
        # written the way versions 1 and 2 wrote them: a meta entry without any checksum
        meta = {"format": "transformer-pde-trajectory", "version": version, "status": "ok",
                "message": "fine", "info": {}, "attention": None}
        path = tmp_path / f"v{version}.npz"
        with open(path, "wb") as fh:
            np.savez(fh, meta=np.array(json.dumps(meta)), times=tr.times, weights=tr.weights,
                     states=tr.states)
        back = tp.load(path)
        assert np.array_equal(back.states, tr.states) and back.message == "fine"


# ------------------------------------------------------------------------- the whole table
_NPZ_FIELDS = ("meta_checksum", "checksums", "digest_algorithm")
_NPZ_TABLE = [(v, keep, edit) for v in (1, 2, 3)
              for n in range(len(_NPZ_FIELDS) + 1)
              for keep in itertools.combinations(_NPZ_FIELDS, n)
              for edit in (False, True)]


@pytest.mark.parametrize("version, keep, edit", _NPZ_TABLE,
                         ids=[f"v{v}-{'+'.join(k) or 'none'}-{'edited' if e else 'intact'}"
                              for v, k, e in _NPZ_TABLE])
def test_npz_any_version_and_any_checksum_fields_never_load_other_data(tmp_path, version,
                                                                       keep, edit):
    """Every combination of claimed version, checksum-bearing fields left in place and an
    edit of the data: the file loads with exactly the data it certifies, or is refused
    naming the file.  Only a file stripped of every checksum field loads unverified, and
    only under a version without checksums (that is a genuine old file: nothing in it can
    tell an edit)."""
    tr = _traj()
    src = tr.save(tmp_path / "orig.npz")
    path = _rewrite_npz(src, tmp_path / "t.npz", version=version, edit=edit, keep=keep)
    legacy = version < 3 and not keep
    if legacy:
        back = tp.load(path)
        assert np.array_equal(back.states, _bump(tr.states) if edit else tr.states)
        return
    if version == 3 and set(keep) == set(_NPZ_FIELDS) and not edit:
        assert np.array_equal(tp.load(path).states, tr.states)
        return
    with pytest.raises(IntegrityError, match=r"t\.npz"):
        tp.load(path)


_LABELLED_TABLE = [(s, v, c, e) for s in (".nc", ".zarr") for v in ("keep", "drop", 1)
                   for c in (True, False) for e in (False, True)]


@pytest.mark.parametrize("suffix, version, checksums, edit", _LABELLED_TABLE)
def test_labelled_any_version_and_checksums_never_load_other_data(tmp_path, suffix, version,
                                                                  checksums, edit):
    """As for NPZ: a labelled file loads with exactly the data it certifies, or is refused
    naming the file; only a file without checksums and with version 1 (or none) loads
    unverified (a genuine version-1 file)."""
    tr = _traj()
    src = tr.save(tmp_path / f"orig{suffix}")
    path = _rewrite_labelled(src, tmp_path / f"t{suffix}", version=version,
                             checksums=checksums, edit=edit)
    if not checksums and version != "keep":
        back = tp.load(path)
        assert np.array_equal(back.states, _bump(tr.states) if edit else tr.states)
        return
    if checksums and version == "keep" and not edit:
        assert np.array_equal(tp.load(path).states, tr.states)
        return
    with pytest.raises(IntegrityError, match=rf"t\{suffix}"):
        tp.load(path)


def test_check_checksum_version_names_the_source():
    check_checksum_version(3, carries=True, first=3, what="trajectory ", source="f.npz")
    check_checksum_version(2, carries=False, first=3, what="trajectory ", source="f.npz")
    check_checksum_version(None, carries=False, first=2, what="", source="f.nc")
    for version in (None, 1, 2):
        with pytest.raises(IntegrityError, match=r"f\.npz: .*checksums"):
            check_checksum_version(version, carries=True, first=3, what="trajectory ",
                                   source="f.npz")
