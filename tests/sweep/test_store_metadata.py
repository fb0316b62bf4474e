"""Damaged metadata of a study's results store: every damage is a StoreError naming the
store and the damaged item, on open (with and without cell verification) and on resume;
never a raw JSONDecodeError, KeyError or TypeError, and never results labelled wrongly.
Genuine version-1 stores (no per-cell digests) still open; a store that carries the
digests under version 1 (its marker was edited) is refused."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import pytest

from transformer_pde import sweep
from transformer_pde.sweep.store import DIGEST_VAR, StoreError, StoreIntegrityError

import sweep_cells


def _study():
    return sweep.Study(sweep.Grid({"mu": [0.0, 1.0]}, draws=2, seed=3), sweep_cells.noisy_mean)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "s.zarr"
    sweep.run(_study(), path, scheduler="serial", progress=False)
    return path


# ------------------------------------------------------------------------- damages
def _attrs(path, var=""):
    return json.loads((path / var / ".zattrs").read_text())


def _set_attrs(path, attrs, var=""):
    (path / var / ".zattrs").write_text(json.dumps(attrs))


def _attr(name, value):
    """Set the store attribute ``name`` (``...`` removes it; a callable edits the text)."""
    def damage(path):
        a = _attrs(path)
        if value is ...:
            a.pop(name)
        else:
            a[name] = value(a[name]) if callable(value) else value
        _set_attrs(path, a)
    return damage


def _fingerprint(edit):
    def damage(path):
        a = _attrs(path)
        fp = json.loads(a["fingerprint"])
        edit(fp)
        a["fingerprint"] = json.dumps(fp)
        _set_attrs(path, a)
    return damage


def _remove(var):
    return lambda path: shutil.rmtree(path / var)


def _truncate(rel, keep=25):
    def damage(path):
        f = path / rel
        f.write_text(f.read_text()[:keep])
    return damage


def _array_attr(var, key, value):
    def damage(path):
        a = _attrs(path, var)
        if value is ...:
            a.pop(key)
        else:
            a[key] = value
        _set_attrs(path, a, var)
    return damage


def _rewrite(var, fn):
    """Rewrite the Zarr array ``var`` with new values of the same shape and dtype."""
    def damage(path):
        import zarr
        arr = zarr.open_group(str(path), mode="r+", zarr_format=2)[var]
        arr[...] = fn(arr[...])
    return damage


def _replace(var, values, dims):
    """Replace the Zarr array ``var`` by ``values`` (another shape or dtype)."""
    def damage(path):
        import zarr
        g = zarr.open_group(str(path), mode="r+", zarr_format=2)
        del g[var]
        arr = g.create_array(var, shape=values.shape, dtype=values.dtype, fill_value=None)
        arr[...] = values
        arr.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    return damage


def _add(var, values, dims):
    def damage(path):
        import zarr
        g = zarr.open_group(str(path), mode="r+", zarr_format=2)
        arr = g.create_array(var, shape=values.shape, dtype=values.dtype, fill_value=None)
        arr[...] = values
        arr.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    return damage


DAMAGES = {
    # the format marker
    "marker truncated": (_attr("transformer_pde_study", lambda s: s[:10]), "transformer_pde_study"),
    "marker missing": (_attr("transformer_pde_study", ...), "transformer_pde_study"),
    "marker a number": (_attr("transformer_pde_study", 5), "transformer_pde_study"),
    # the fingerprint: the study's grid, cell and outputs
    "fingerprint truncated": (_attr("fingerprint", lambda s: s[:30]), "'fingerprint'.*JSON"),
    "fingerprint missing": (_attr("fingerprint", ...), "'fingerprint'.*missing"),
    "fingerprint a list": (_attr("fingerprint", "[1, 2]"), "'fingerprint'.*object"),
    "fingerprint a number": (_attr("fingerprint", 7), "'fingerprint'.*text"),
    "fingerprint without grid": (_fingerprint(lambda fp: fp.pop("grid")), "'fingerprint'.*grid"),
    "fingerprint grid axes": (_fingerprint(lambda fp: fp["grid"].update(axes={"mu": 3})),
                              "'fingerprint'.*grid"),
    "fingerprint grid draws": (_fingerprint(lambda fp: fp["grid"].update(draws="2")),
                               "'fingerprint'.*grid"),
    "fingerprint without outputs": (_fingerprint(lambda fp: fp.pop("outputs")),
                                    "'fingerprint'.*outputs"),
    "fingerprint output dtype": (_fingerprint(lambda fp: fp["outputs"]["mean"].update(
        dtype="complex128")), "'fingerprint'.*output 'mean'"),
    "fingerprint output shape": (_fingerprint(lambda fp: fp["outputs"]["head"].update(
        shape="3")), "'fingerprint'.*output 'head'"),
    "fingerprint cell": (_fingerprint(lambda fp: fp.update(cell=3)), "'fingerprint'.*cell"),
    # the failures of the failed cells
    "failures truncated": (_attr("failures", '{"1": '), "'failures'.*JSON"),
    "failures a list": (_attr("failures", "[1]"), "'failures'.*object"),
    "failures a number": (_attr("failures", 3), "'failures'.*text"),
    "failures message a number": (_attr("failures", '{"1": 3}'), "'failures'.*cell 1"),
    "failures key not a cell": (_attr("failures", '{"x": "boom"}'), "'failures'.*'x'"),
    "failures key out of range": (_attr("failures", '{"99": "boom"}'), "'failures'.*'99'"),
    "failures missing": (_attr("failures", ...), "'failures'.*missing"),
    # the other JSON attributes
    "config truncated": (_attr("config", lambda s: s[:-1]), "'config'.*JSON"),
    "versions truncated": (_attr("versions", "{"), "'versions'.*JSON"),
    "versions a list": (_attr("versions", "[]"), "'versions'.*object"),
    "status_codes truncated": (_attr("status_codes", '["ok"'), "'status_codes'.*JSON"),
    "name a number": (_attr("name", 3), "'name'.*text"),
    # variables and coordinates
    "cell_status missing": (_remove("cell_status"), "variable 'cell_status'.*missing"),
    "cell_digest missing": (_remove(DIGEST_VAR), f"variable '{DIGEST_VAR}'.*missing"),
    "output missing": (_remove("mean"), "variable 'mean'.*missing"),
    "output wrong shape": (_replace("head", np.zeros((2, 2, 4)), ("mu", "draw", "head_0")),
                           "variable 'head'.*shape"),
    "output wrong dims": (_array_attr("head", "_ARRAY_DIMENSIONS", ["mu", "draw", "h"]),
                          "variable 'head'.*dimensions"),
    "output wrong dtype": (_replace("count", np.zeros((2, 2), np.float32), ("mu", "draw")),
                           "variable 'count'.*dtype"),
    "status wrong dtype": (_replace("cell_status", np.ones((2, 2), np.float64),
                                    ("mu", "draw")), "variable 'cell_status'.*dtype"),
    "extra variable": (_add("extra", np.zeros((2, 2)), ("mu", "draw")),
                       "variable 'extra'.*not an output"),
    "grid coordinate missing": (_remove("mu"), "coordinate 'mu'.*missing"),
    "draw coordinate missing": (_remove("draw"), "coordinate 'draw'.*missing"),
    "grid coordinate edited": (_rewrite("mu", lambda v: v + np.array([0.0, 4.0])),
                               "coordinate 'mu'.*grid"),
    "draw coordinate edited": (_rewrite("draw", lambda v: v[::-1].copy()),
                               "coordinate 'draw'.*grid"),
    # Zarr's own metadata files
    "array metadata truncated": (_truncate("cell_status/.zarray"), r"cell_status/\.zarray"),
    "array dimensions missing": (_array_attr("cell_status", "_ARRAY_DIMENSIONS", ...),
                                 r"cell_status/\.zattrs.*_ARRAY_DIMENSIONS"),
    "array attributes truncated": (_truncate("mean/.zattrs"), r"mean/\.zattrs"),
    "store attributes truncated": (_truncate(".zattrs"), r"\.zattrs"),
    "group metadata truncated": (_truncate(".zgroup", 5), r"\.zgroup"),
    "consolidated metadata truncated": (_truncate(".zmetadata"), r"\.zmetadata"),
}


def _calls(path):
    def resume():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
    return {"open": lambda: sweep.open_results(path),
            "open unverified": lambda: sweep.open_results(path, verify=False),
            "summary": lambda: sweep.summary(sweep.open_results(path)),
            "resume": resume}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_metadata_is_a_store_error_naming_the_store_and_the_item(base, tmp_path,
                                                                        case):
    damage, match = DAMAGES[case]
    path = tmp_path / "d.zarr"
    shutil.copytree(base, path)
    damage(path)
    for label, call in _calls(path).items():
        if case == "consolidated metadata truncated" and label == "resume":
            continue  # resuming rewrites the consolidated metadata: tested below
        with pytest.raises(StoreError) as info:
            call()
        msg = str(info.value)
        assert str(path) in msg, (label, msg)
        assert re.search(match, msg), (label, msg)


def test_resume_rewrites_damaged_consolidated_metadata(base, tmp_path):
    import xarray as xr

    path = tmp_path / "d.zarr"
    shutil.copytree(base, path)
    _truncate(".zmetadata")(path)
    ds = sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
    assert ds["mean"].equals(sweep.open_results(base)["mean"])
    assert xr.open_zarr(path)["mean"].load().equals(ds["mean"])


def test_undamaged_store_opens_and_resumes(base, tmp_path):
    path = tmp_path / "d.zarr"
    shutil.copytree(base, path)
    ref = sweep.open_results(base)
    for label, call in _calls(path).items():
        out = call()
        if label != "summary":
            assert out["mean"].equals(ref["mean"]), label
    assert sweep.summary(ref)["done"] == 4


def _write_version_1_store(path, study):
    """A store as version 1 wrote it: no cell_digest, json.dumps attributes, xarray's
    default encodings."""
    ref = sweep.run(study, None, scheduler="serial", progress=False)
    ds = ref.copy()
    ds.attrs = {"transformer_pde_study": json.dumps({"format": "transformer-pde-study",
                                                     "version": 1}),
                "fingerprint": study.fingerprint(), "name": study.name,
                "versions": json.dumps({"numpy": np.__version__}), "failures": "{}",
                "config": "{}"}
    for var in ds.variables.values():
        var.attrs = {}
        var.encoding = {}
    ds.to_zarr(path, zarr_format=2, consolidated=False)
    return ref


def test_genuine_version_1_store_still_opens(tmp_path):
    study = _study()
    path = tmp_path / "v1.zarr"
    ref = _write_version_1_store(path, study)
    for verify in (True, False):
        ds = sweep.open_results(path, verify=verify)
        for name in ("mean", "head", "count", "cell_status"):
            assert ds[name].equals(ref[name]), name
    with pytest.raises(StoreError, match="cannot be resumed"):
        sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)


def test_digests_under_version_1_are_verified_and_refused(base, tmp_path):
    import zarr

    path = tmp_path / "d.zarr"
    shutil.copytree(base, path)
    g = zarr.open_group(str(path), mode="r+", zarr_format=2)
    g.attrs["transformer_pde_study"] = json.dumps({"format": "transformer-pde-study",
                                                   "version": 1})
    with pytest.raises(StoreIntegrityError, match=r"d\.zarr.*version 1.*checksums"):
        sweep.open_results(path)
    with pytest.raises(StoreIntegrityError, match=r"d\.zarr.*version 1.*checksums"):
        sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
    # with a cell edited as well, the edit is what is reported
    v = g["mean"][...]
    v[1, 0] += 1.0
    g["mean"][...] = v
    with pytest.raises(StoreIntegrityError, match=r"d\.zarr: cell 2 \(mu=1\.0, draw=0\)"):
        sweep.open_results(path)


def test_summary_of_a_dataset_with_damaged_failures_names_the_attribute(base):
    ds = sweep.open_results(base)
    ds.attrs["failures"] = '{"1": '
    with pytest.raises(StoreError, match="'failures'"):
        sweep.summary(ds)


def test_resume_with_the_grid_axes_in_another_order_is_refused(tmp_path):
    # the fingerprint's JSON sorts the axes, so both orders have the same fingerprint; the
    # cells are numbered (and seeded) in the axes' order: resuming the store with the
    # other order would relabel every cell
    def study(axes):
        return sweep.Study(sweep.Grid(axes, draws=2, seed=3), sweep_cells.noisy_mean)
    first = study({"mu": [0.0, 1.0], "sigma": [1.0, 2.0]})
    other = study({"sigma": [1.0, 2.0], "mu": [0.0, 1.0]})
    assert first.fingerprint() == other.fingerprint()
    path = tmp_path / "s.zarr"
    ref = sweep.run(first, path, scheduler="serial", progress=False)
    with pytest.raises(StoreError, match=r"s\.zarr .*axes in another order"):
        sweep.run(other, path, scheduler="serial", resume=True, progress=False)
    # the stored order is read back from the store's dimensions
    again = sweep.run(first, path, scheduler="serial", resume=True, progress=False)
    assert again["mean"].equals(ref["mean"])
    assert sweep.open_results(path)["mean"].equals(ref["mean"])
