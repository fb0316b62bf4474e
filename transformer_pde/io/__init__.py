r"""Files of transformer-pde: one container, one JSON encoding, one attention codec.

=====================  ==================================================================
module                 holds
=====================  ==================================================================
:mod:`.digests`        SHA-256 of arrays (:func:`array_digest`) and of JSON descriptions
                       (:func:`json_digest`), :func:`verify_array`, :func:`check_version`,
                       :func:`check_checksum_version` (checksums under an older version)
:mod:`.container`      the checksummed, atomically written NPZ container
                       (:func:`write_npz`, :func:`save_npz`, :func:`load_npz`)
:mod:`.jsonfmt`        the JSON encoding of every JSON text the package writes
                       (:func:`dumps`; :func:`canonical`, the fingerprint text)
:mod:`.codec`          :class:`~transformer_pde.Attention` to plain data and back
:mod:`.labelled`       xarray Datasets saved to netCDF / Zarr, with checksums and the CF
                       global attributes of :func:`provenance` (``Conventions``,
                       ``source``, ``references``, ``history``: also in the NPZ
                       metadata); :func:`zarr_metadata_problem` names a damaged Zarr
                       metadata file
:mod:`.trajectory`     the particle-trajectory files: NPZ layout, invariants, reading and
                       writing (:func:`save_trajectory`, :func:`read_trajectory`)
=====================  ==================================================================

Every file is checked when it is read: an edited, truncated or damaged file is an
:class:`~transformer_pde.errors.IntegrityError` naming the file and the array, never
different data (see the documentation page *Files, checkpoints and their checks*).  A
file's checksums are verified whenever it carries them, whatever its version field says.
"""

from ..errors import IntegrityError, TrajectoryFileError
from .codec import (ATTENTION_PREFIX, attention_data, attention_fields, attention_from_data,
                    attention_from_json, attention_to_json)
from .container import NPZ_CHECKSUMS, load_npz, save_npz, write_npz
from .digests import (DIGEST_ALGORITHM, array_digest, check_checksum_version, check_version,
                      json_digest, verify_array)
from .jsonfmt import canonical, dumps, json_default, tag_arrays, untag_arrays
from .labelled import (DATASET_FORMAT_VERSION, LABELLED_SUFFIXES, gaussian_dataset,
                       open_dataset, package_version, particle_dataset, particle_fields,
                       provenance, save_dataset, zarr_metadata_problem)
from .trajectory import (NPZ_FORMAT_VERSION, NPZ_VERSIONS, TRAJECTORY_FORMAT, check_trajectory,
                         dataset_fields, read_trajectory, save_trajectory)

__all__ = [
    "ATTENTION_PREFIX", "DATASET_FORMAT_VERSION", "DIGEST_ALGORITHM", "LABELLED_SUFFIXES",
    "NPZ_CHECKSUMS", "NPZ_FORMAT_VERSION", "NPZ_VERSIONS", "TRAJECTORY_FORMAT",
    "IntegrityError", "TrajectoryFileError",
    "array_digest", "attention_data", "attention_fields", "attention_from_data",
    "attention_from_json", "attention_to_json", "canonical", "check_checksum_version",
    "check_trajectory", "check_version", "dataset_fields", "dumps", "gaussian_dataset", "json_default",
    "json_digest", "load_npz", "open_dataset", "package_version", "particle_dataset",
    "particle_fields", "provenance", "read_trajectory", "save_dataset", "save_npz", "save_trajectory", "tag_arrays",
    "untag_arrays", "verify_array", "write_npz", "zarr_metadata_problem",
]
