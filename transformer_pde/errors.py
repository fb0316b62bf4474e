"""Exceptions and warnings of transformer-pde.

Every exception the package raises on purpose derives from :class:`TransformerPDEError`,
and every warning from :class:`TransformerPDEWarning`, so that a user can catch or
filter the package's conditions as a whole::

    import warnings
    from transformer_pde.errors import TransformerPDEWarning

    warnings.simplefilter("error", TransformerPDEWarning)   # every early stop raises

Argument errors subclass the matching builtin as well (``ArgumentError`` is a
``ValueError``, ``ArgumentTypeError`` a ``TypeError``), so code that catches the
builtins keeps working.

This module imports nothing from the package: every other module may import it.
"""

from __future__ import annotations

__all__ = [
    "TransformerPDEError",
    "ArgumentError",
    "ArgumentTypeError",
    "ConfigError",
    "CheckpointError",
    "ModelDirectoryError",
    "ModelDirectoryNotFound",
    "BackendNotAvailable",
    "MissingDependencyError",
    "SinkhornNotConverged",
    "SolverNotConverged",
    "ScoreOverflowError",
    "TrajectoryFileError",
    "IntegrityError",
    "TransformerPDEWarning",
    "ConvergenceWarning",
    "EarlyStopWarning",
    "CheckpointWarning",
    "IntegrityWarning",
]


class TransformerPDEError(Exception):
    """Base class of every exception raised on purpose by transformer-pde."""


class ArgumentError(TransformerPDEError, ValueError):
    """An argument has the right type but an invalid value; the message names it."""


class ArgumentTypeError(TransformerPDEError, TypeError):
    """An argument has the wrong type; the message names it."""


class ConfigError(ArgumentError):
    """A configuration file (TOML) is invalid; the message names the key."""


class CheckpointError(ArgumentError):
    """A run checkpoint cannot be used: its path cannot or must not be written, or it
    comes from another run (the message names the path and the fields that differ)."""


class ModelDirectoryError(ArgumentError):
    """A pretrained model directory cannot be read: unsupported architecture, a config key
    missing, or weights that do not match the config (the message names the file and key)."""


class ModelDirectoryNotFound(ModelDirectoryError, FileNotFoundError):
    """A pretrained model directory, or a file it must hold, does not exist."""


class BackendNotAvailable(TransformerPDEError, ImportError):
    """A requested backend's library, driver or device is missing."""


class MissingDependencyError(TransformerPDEError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names
    the extra to install (``pip install 'transformer-pde[sweep]'``)."""


class SinkhornNotConverged(TransformerPDEError, RuntimeError):
    """A Sinkhorn solve did not reach its tolerance within its iteration budget."""


class SolverNotConverged(TransformerPDEError, RuntimeError):
    """An implicit time step's nonlinear solve did not converge."""


class ScoreOverflowError(TransformerPDEError, FloatingPointError):
    """Attention scores of finite tokens overflow the floating-point range and the field
    cannot be evaluated faithfully (e.g. l2 scores of tokens spread beyond 1e154)."""


class TrajectoryFileError(TransformerPDEError, ValueError):
    """A trajectory or checkpoint file cannot be read (empty, truncated, not an archive of
    the package, bad metadata, missing arrays, inconsistent shapes); the message names the
    file and what is wrong."""


class IntegrityError(TrajectoryFileError):
    """A file, store or checkpoint written by the package fails its own checks on reading:
    an array does not match its recorded checksum, an invariant is broken (weights not
    normalised, times not increasing, ...) or its format version is unknown.  The message
    names the file and the array or field that fails."""


class TransformerPDEWarning(UserWarning):
    """Base class of every warning issued by transformer-pde."""


class ConvergenceWarning(TransformerPDEWarning):
    """An iterative solve stopped short of its tolerance (the result is still returned)."""


class EarlyStopWarning(TransformerPDEWarning):
    """A run ended before its final time without an answer (non-finite state, failure,
    step budget, interruption); the states computed before the stop are kept in the result.
    A detected blow-up, divergence or convergence is an answer: it is reported in the
    result's ``status`` only (see :class:`~transformer_pde.results.Status`)."""


class CheckpointWarning(TransformerPDEWarning):
    """A checkpoint could not be written during or at the end of a run; the run and its
    result are kept (the message names the file and the reason)."""


class IntegrityWarning(TransformerPDEWarning):
    """Part of a file or store written by the package failed its checksum and is being
    recomputed rather than trusted (e.g. a damaged cell of a study resumed with
    ``resume=True``); the message names the file and the part."""
