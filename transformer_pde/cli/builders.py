r"""Library objects from the tables of a ``transformer-pde`` configuration.

Each ``build_*`` function reads one table (through :class:`~transformer_pde.cli.config.Table`,
so every error is a :class:`~transformer_pde.errors.ConfigError` naming the key) and
returns the library object it describes: ``[attention]`` an
:class:`~transformer_pde.Attention` (:func:`build_attention`; matrices in the forms of
:data:`MATRIX_FORM`, :func:`parse_matrix`), ``[tokens]`` the initial tokens
(:func:`build_tokens`), ``[block]`` a :class:`~transformer_pde.Block`
(:func:`build_block`, :func:`build_mlp`, :func:`build_layernorm`), ``run.solver`` a
solver (:func:`build_solver`), ``[field]`` the field options (:func:`build_field`),
``[noise]`` the noise and its solver (:func:`build_noise`), and ``[run]``, ``[field]``,
``[limits]``, ``[block]``, ``[noise]`` together the keyword arguments of
:func:`~transformer_pde.simulate` (:func:`build_simulate`).  The keywords and defaults are those of the library objects'
own signatures, and the objects' own argument checks decide what is refused.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import validation
from ..attention import KINDS, Attention
from ..backends import BACKENDS
from ..blocks import (MLP, NORMALIZATIONS, SPLITTINGS, Block, BlockStepper, LayerNorm,
                      Normalization)
from ..errors import ArgumentError, ConfigError
from ..fields.harmonic import METHODS, isotropic_sign
from ..integrate.loop import Limits, SaveAt
from ..integrate.solvers import SOLVERS
from ..noise import CONVENTIONS, SDE_SOLVERS, Noise, check_grid, refinement_level
from ..particles import FieldOptions
from .config import (Table, check_memory, library_call, numeric_array, read_options,
                     typed_parameters)

__all__ = [
    "DISTRIBUTIONS",
    "MATRIX_FORM",
    "TOKEN_KEYS",
    "build_attention",
    "build_block",
    "build_field",
    "build_layernorm",
    "build_mlp",
    "build_noise",
    "build_simulate",
    "build_solver",
    "build_tokens",
    "covariance",
    "parse_matrix",
]


# =========================================================================== matrices
MATRIX_FORM = ("'identity', 'zeros', a number c (meaning c*I), a d x d list of lists, "
               "or a table {random = 'normal' | 'orthogonal' | 'spd', scale = float, "
               "seed = int} or {diag = [d numbers]}")


def parse_matrix(v: Any, key: str, d: int, rng: np.random.Generator,
                 rows: int | None = None) -> np.ndarray:
    """A matrix with ``d`` columns from its configuration form (:data:`MATRIX_FORM`).

    ``rows`` fixes the number of rows (default: ``d`` for the generated forms, any for a
    list of rows); ``'identity'``, a number, ``diag``, ``orthogonal`` and ``spd`` need a
    square matrix.
    """
    m = d if rows is None else rows
    shape = f"{m} x {d}"

    def square(form: str) -> None:
        if m != d:
            raise ConfigError(f"{key}: {form} needs a square matrix; this one is {shape}")

    if isinstance(v, str):
        if v == "identity":
            square("'identity'")
            return np.eye(d)
        if v == "zeros":
            return np.zeros((m, d))
        raise ConfigError(f"{key}: expected {MATRIX_FORM}; got the string {v!r}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        square("a number c (c*I)")
        if not math.isfinite(v):
            raise ConfigError(f"{key}: expected a finite number, got {v!r}")
        return float(v) * np.eye(d)
    if isinstance(v, dict):
        sec = Table(v, key, ("random", "scale", "seed", "diag"))
        if sec.has("diag"):
            if sec.has("random"):
                raise ConfigError(f"{key}: give either 'diag' or 'random', not both")
            square("'diag'")
            return np.diag(sec.vector("diag", d))
        kind = sec.choice("random", "normal", ("normal", "orthogonal", "spd"))
        scale = sec.number("scale", 1.0)
        g = np.random.default_rng(sec.integer("seed")) if sec.has("seed") else rng
        if kind == "normal":
            return scale * g.normal(size=(m, d)) / math.sqrt(d)
        square(f"random = {kind!r}")
        G = g.normal(size=(d, d))
        if kind == "orthogonal":
            Qm, R = np.linalg.qr(G)
            return scale * Qm * np.sign(np.diag(R))
        return scale * (G @ G.T / d + 1e-3 * np.eye(d))
    arr = numeric_array(v, key, MATRIX_FORM)
    if arr.ndim != 2 or arr.shape[1] != d or (rows is not None and arr.shape[0] != rows):
        want = f"{rows} x {d}" if rows is not None else f"{d} columns"
        raise ConfigError(f"{key}: expected a matrix of {want} ({MATRIX_FORM}); "
                          f"got shape {arr.shape}")
    return arr


def covariance(v: Any, key: str, d: int) -> np.ndarray:
    """A d×d symmetric positive semi-definite matrix (``"identity"`` or a list of rows).

    The package's one rule for covariances (:func:`transformer_pde.validation.covariance`):
    symmetric to :math:`10^{-12}` of the largest entry and positive semi-definite to
    :math:`-10^{-12}` times the sum of the absolute eigenvalues (rounding of values written
    in decimal); anything else is an error, never silently repaired.
    """
    if isinstance(v, str) and v == "identity":
        return np.eye(d)
    form = f"'identity' or a symmetric positive semi-definite {d} x {d} list of lists"
    C = numeric_array(v, key, form)
    if C.shape != (d, d):
        raise ConfigError(f"{key}: expected {form}, got shape {C.shape}")
    try:
        return validation.covariance(key, C, d)
    except ArgumentError as exc:
        raise ConfigError(f"{exc} (expected {form})") from None


# =========================================================================== attention
#: bytes per entry times the number of d×d matrices the attention may hold (Q, K, V, W_O,
#: their products per head, and a copy each): a generous bound for the preflight check
_ATTENTION_MATRICES = 16


def build_attention(table: Any, *, section: str = "attention") -> Any:
    r"""Build an :class:`~transformer_pde.Attention` from a configuration table.

    Keys: ``kind`` (one of :data:`transformer_pde.attention.KINDS`, default
    ``"softmax"``), ``d`` (required), ``Q``, ``K``, ``V`` (default ``"identity"``),
    ``W_O`` (optional), ``seed`` (random matrices), ``score_scale`` (multiplies ``Q``:
    ``"1/sqrt(d)"`` for the paper's :math:`A/\sqrt d`, ``"1/sqrt(k)"`` with
    :math:`k = d/H`, or a number), and every keyword of :class:`~transformer_pde.Attention`
    with its default (``heads``, ``masked``, ``beta``, ``eps``, ``l2_beta``, ``shift``,
    ...; ``shift = beta`` keeps ``kind = "exp"`` finite at large ``beta``).
    """
    # the scalar keywords of Attention (heads, masked, beta, eps, l2_beta, ...)
    spec = typed_parameters(Attention, exclude=("kind", "Q", "K", "V", "W_O"))
    sec = Table(table, section, ("kind", "d", "Q", "K", "V", "W_O", "seed", "score_scale",
                                 *spec))
    kind = sec.choice("kind", "softmax", sorted(KINDS))
    if not sec.has("d"):
        raise ConfigError(f"{sec.key('d')}: required, expected an integer >= 1")
    d = sec.integer("d", minimum=1)
    check_memory(sec.key("d"), 8.0 * _ATTENTION_MATRICES * d * d,
                 f"the {d} x {d} attention matrices")
    kwargs = read_options(sec, spec)
    heads = kwargs.get("heads", spec["heads"][1] if "heads" in spec else 1)
    if isinstance(heads, int) and heads < 1:
        raise ConfigError(f"{sec.key('heads')}: expected an integer >= 1, got {heads}")
    if d % heads:
        raise ConfigError(f"{sec.key('heads')}: must divide {section}.d = {d}, got {heads}")
    rng = np.random.default_rng(sec.integer("seed", 0))
    mats = {name: parse_matrix(sec.raw(name, "identity"), sec.key(name), d, rng)
            for name in ("Q", "K", "V")}
    if sec.has("W_O"):
        kwargs["W_O"] = parse_matrix(sec.raw("W_O"), sec.key("W_O"), d, rng)
    scale = sec.raw("score_scale", 1.0)
    if isinstance(scale, str):
        named = {"1/sqrt(d)": 1.0 / math.sqrt(d), "1/sqrt(k)": 1.0 / math.sqrt(d // heads),
                 "1": 1.0}
        if scale not in named:
            raise ConfigError(f"{sec.key('score_scale')}: expected a number, '1/sqrt(d)' or "
                              f"'1/sqrt(k)', got {scale!r}")
        scale = named[scale]
    else:
        scale = sec.number("score_scale", 1.0, positive=True)
    return library_call(section, Attention, kind, mats["Q"] * scale, mats["K"], mats["V"],
                        names=[k for k in kwargs if k != "W_O"], **kwargs)


# =========================================================================== tokens
TOKEN_KEYS = ("n", "distribution", "mean", "std", "cov", "seed", "file")
DISTRIBUTIONS = ("gaussian", "uniform-ball", "uniform-cube", "sphere")


def _load_npy(key: str, name: str, base: str | None) -> tuple[Path, Any]:
    """The path ``name`` (relative to the configuration's folder ``base``) and what
    ``numpy.load`` reads there; a file that cannot be read or is not NumPy's is a
    :class:`ConfigError` naming ``key``."""
    path = Path(name)
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    try:
        return path, np.load(path, allow_pickle=False)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except (ValueError, EOFError) as exc:
        raise ConfigError(f"{key}: {str(path)!r} is not a .npy array ({exc})") from None


def _token_file(sec: Table, d: int, base: str | None) -> np.ndarray:
    key = sec.key("file")
    name = sec.raw("file")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: expected the path of a .npy file, got {name!r}")
    path, X = _load_npy(key, name, base)
    if not isinstance(X, np.ndarray):  # an .npz archive
        X.close()
        raise ConfigError(f"{key}: {str(path)!r} is an .npz archive; expected a .npy array "
                          f"of shape (N, {d})")
    if np.iscomplexobj(X):
        raise ConfigError(f"{key}: {str(path)!r} holds complex numbers; tokens must be real")
    if X.dtype.kind not in "iuf":
        raise ConfigError(f"{key}: {str(path)!r} holds values of type {X.dtype}, expected "
                          f"numbers (an integer or float array of shape (N, {d}))")
    if X.ndim != 2 or X.shape[1] != d:
        raise ConfigError(f"{key}: {str(path)!r} has shape {X.shape}, expected (N, {d})")
    if X.shape[0] == 0:
        raise ConfigError(f"{key}: {str(path)!r} holds no tokens; expected at least one token")
    X = np.asarray(X, dtype=float)
    if not np.all(np.isfinite(X)):
        raise ConfigError(f"{key}: {str(path)!r} has non-finite values (nan or inf); "
                          "expected finite numbers")
    return X


def build_tokens(table: Any, d: int, *, section: str = "tokens",
                 base: str | None = None) -> np.ndarray:
    """Initial tokens (N, d) from a ``[tokens]`` table.

    ``distribution`` is ``"gaussian"`` (``mean``, ``std`` or a symmetric positive
    semi-definite ``cov``), ``"uniform-ball"`` (radius ``std``), ``"uniform-cube"``
    ([-std, std]^d, shifted by ``mean``) or ``"sphere"`` (uniform on the unit sphere, for
    ``block.constraint = "sphere"``); or ``file`` names a ``.npy`` array (N, d) of real
    finite numbers (a relative path is read from ``base``, the configuration's directory).
    """
    sec = Table(table, section, TOKEN_KEYS)
    if sec.has("file"):
        other = sorted(set(sec.data) - {"file"})
        if other:
            raise ConfigError(f"{sec.key(other[0])}: does not apply with {sec.key('file')} "
                              "(the tokens are read from the file)")
        return _token_file(sec, d, base)
    n = sec.integer("n", 128, minimum=1)
    check_memory(sec.key("n"), 8.0 * 4 * n * d, f"{n} tokens in dimension {d}")
    rng = np.random.default_rng(sec.integer("seed", 0))
    mean = sec.vector("mean", d, [0.0] * d)
    dist = sec.choice("distribution", "gaussian", DISTRIBUTIONS)
    if dist == "gaussian":
        if sec.has("cov"):
            if sec.has("std"):
                raise ConfigError(f"{sec.key('std')}: give either std or cov, not both")
            C = covariance(sec.raw("cov"), sec.key("cov"), d)
            return rng.multivariate_normal(mean, C, size=n, method="eigh")
        return mean + sec.number("std", 1.0, positive=True) * rng.normal(size=(n, d))
    if sec.has("cov"):
        raise ConfigError(f"{sec.key('cov')}: only for distribution = 'gaussian'")
    if dist == "sphere":
        for k in ("mean", "std"):
            if sec.has(k):
                raise ConfigError(f"{sec.key(k)}: does not apply to distribution = 'sphere' "
                                  "(uniform on the unit sphere)")
        G = rng.normal(size=(n, d))
        return G / np.linalg.norm(G, axis=1, keepdims=True)
    std = sec.number("std", 1.0, positive=True)
    if dist == "uniform-cube":
        return mean + std * rng.uniform(-1, 1, size=(n, d))
    G = rng.normal(size=(n, d))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    return mean + std * G * rng.uniform(size=(n, 1)) ** (1.0 / d)


# =========================================================================== block, run
def build_mlp(table: Any, d: int, *, section: str = "block.mlp") -> Any:
    r"""A :class:`~transformer_pde.blocks.MLP` from a ``[block.mlp]`` table.

    Keys: ``hidden`` (width :math:`m`, default ``d``), ``W1`` (:math:`m\times d`), ``W2``
    (:math:`d\times m`) in the matrix forms of :data:`MATRIX_FORM` (default
    ``{random = "normal"}``), ``b1``, ``b2`` (lists of :math:`m` and :math:`d` numbers),
    ``seed``, and the keywords of :class:`~transformer_pde.blocks.MLP` (``activation``).
    """
    spec = typed_parameters(MLP, exclude=("W1", "W2", "b1", "b2"))
    sec = Table(table, section, ("hidden", "W1", "W2", "b1", "b2", "seed", *spec))
    m = sec.integer("hidden", d, minimum=1)
    check_memory(sec.key("hidden"), 8.0 * 8 * m * d, f"the {m} x {d} MLP weights")
    rng = np.random.default_rng(sec.integer("seed", 0))
    W1 = parse_matrix(sec.raw("W1", {"random": "normal"}), sec.key("W1"), d, rng, rows=m)
    W2 = parse_matrix(sec.raw("W2", {"random": "normal"}), sec.key("W2"), m, rng, rows=d)
    b1 = sec.vector("b1", m) if sec.has("b1") else None
    b2 = sec.vector("b2", d) if sec.has("b2") else None
    kwargs = read_options(sec, spec)
    return library_call(section, MLP, W1, W2, b1, b2, names=kwargs, **kwargs)


def build_layernorm(table: Any, *, section: str = "block.layernorm") -> Any:
    """A :class:`~transformer_pde.blocks.LayerNorm` from a ``[block.layernorm]`` table (its
    keywords and defaults: ``mode``, ``variance``, ``eps``)."""
    spec = typed_parameters(LayerNorm)
    sec = Table(table, section, spec)
    kwargs = read_options(sec, spec)
    return library_call(section, LayerNorm, names=kwargs, **kwargs)


def build_block(table: Any, d: int, *, section: str = "block") -> Any:
    """A :class:`~transformer_pde.Block` (or ``None``) from a ``[block]`` table: its
    keywords ``constraint`` (``"none"`` or ``"sphere"``), ``splitting``
    (:data:`transformer_pde.blocks.SPLITTINGS`; only with an MLP), ``normalization`` (a
    scheme of :data:`transformer_pde.blocks.NORMALIZATIONS`, or a table
    ``{scheme = ..., alpha = ..., switch = ...}`` for the options of
    :class:`~transformer_pde.blocks.Normalization`), and
    the sub-tables ``[block.mlp]`` and ``[block.layernorm]`` (``mode = "post"`` makes the
    post-norm constraint)."""
    sec = Table(table, section, ("constraint", "splitting", "mlp", "layernorm",
                                 "normalization"))
    if not sec.data:
        return None
    if sec.has("normalization"):
        nz = _build_normalization(sec.raw("normalization"), section=sec.key("normalization"))
        others = [k for k in ("constraint", "splitting", "mlp", "layernorm") if sec.has(k)]
        if others:
            raise ConfigError(f"{sec.key(others[0])}: does not apply with "
                              f"{sec.key('normalization')} = {nz.scheme!r}, which places the "
                              "normalisation of the attention flow itself (normalization = "
                              "'post' is constraint = 'sphere')")
        return library_call(section, Block, names=["normalization"], normalization=nz)
    constraint = sec.choice("constraint", "none", ["none", "sphere"])
    kwargs: dict[str, Any] = {"constraint": None if constraint == "none" else constraint}
    if sec.has("mlp"):
        kwargs["mlp"] = build_mlp(sec.raw("mlp"), d, section=sec.key("mlp"))
    if sec.has("layernorm"):
        if d < 2:
            raise ConfigError(f"{sec.key('layernorm')}: layer normalisation needs "
                              f"attention.d >= 2, got d = {d}")
        kwargs["layernorm"] = build_layernorm(sec.raw("layernorm"),
                                              section=sec.key("layernorm"))
    if sec.has("splitting"):
        if "mlp" not in kwargs:
            raise ConfigError(f"{sec.key('splitting')}: only applies with an MLP "
                              f"([{sec.key('mlp')}]): it splits the attention and MLP flows")
        kwargs["splitting"] = sec.choice("splitting", "strang", SPLITTINGS)
    if kwargs["constraint"] is None and len(kwargs) == 1:
        return None
    return library_call(section, Block, names=[k for k in kwargs if sec.has(k)], **kwargs)


def _build_normalization(value: Any, *, section: str = "block.normalization") -> Any:
    """A :class:`~transformer_pde.blocks.Normalization` from ``block.normalization``: a
    scheme name (``"pre"``) or a table ``{scheme = "ngpt", alpha = 0.5}`` /
    ``{scheme = "mix", switch = 2.0}`` (an option of another scheme is an error naming
    it)."""
    if isinstance(value, str):
        value = {"scheme": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{section}: expected one of {', '.join(map(repr, NORMALIZATIONS))} "
                          f"or a table {{scheme = ..., alpha = ..., switch = ...}}, got "
                          f"{value!r}")
    sec = Table(value, section, ("scheme", "alpha", "switch"))
    kwargs: dict[str, Any] = {"scheme": sec.choice("scheme", None, NORMALIZATIONS)}
    for k in ("alpha", "switch"):
        if sec.has(k):
            kwargs[k] = sec.number(k, positive=True)
    return library_call(section, Normalization, names=[k for k in kwargs if k != "scheme"],
                        **kwargs)


def build_solver(value: Any, key: str) -> Any:
    """A solver from ``run.solver``: a name of :data:`transformer_pde.integrate.SOLVERS`
    (default options) or a table ``{name = "dopri5", rtol = 1e-8, ...}`` whose other keys
    are that solver's own options (``rtol``/``atol`` of the adaptive pairs, ``tol``/
    ``max_iter`` of the implicit midpoint rule; none for the others)."""
    names = sorted(SOLVERS)
    if isinstance(value, str):
        if value not in SOLVERS:
            raise ConfigError(f"{key}: expected one of {', '.join(map(repr, names))} or a "
                              f"table {{name = ..., <options>}}, got {value!r}")
        return SOLVERS[value]()
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a solver name ({', '.join(map(repr, names))}) or "
                          f"a table {{name = ..., <options>}}, got {value!r}")
    name = value.get("name")
    if not isinstance(name, str) or name not in SOLVERS:
        raise ConfigError(f"{key}.name: expected one of {', '.join(map(repr, names))}, "
                          f"got {name!r}")
    factory = SOLVERS[name]
    spec = typed_parameters(factory) if inspect.isclass(factory) else {}
    options = sorted(set(value) - {"name"})
    unknown = [k for k in options if k not in spec]
    if unknown:
        allowed = ", ".join(sorted(spec)) if spec else "none"
        raise ConfigError(f"{key}.{unknown[0]}: not an option of the {name!r} solver "
                          f"(its options: {allowed})")
    sec = Table(value, key, ("name", *spec))
    kwargs = read_options(sec, spec)
    return library_call(key, factory, names=kwargs, **kwargs)


#: the keys of a ``[noise]`` table
NOISE_KEYS = ("sigma", "common", "convention", "seed", "path", "system", "base_dt", "solver")


def _common_matrices(value: Any, key: str, d: int, base: str | None) -> np.ndarray:
    """``noise.common``: an inline array (K, d, d) or (d, d), or the path of a ``.npy``
    file holding one (relative to the configuration's folder)."""
    if not isinstance(value, str):
        A = numeric_array(value, key, f"an array of shape (K, {d}, {d}) or ({d}, {d})")
    else:
        path, A = _load_npy(key, value, base)
        if not isinstance(A, np.ndarray) or A.dtype.kind not in "iuf":
            raise ConfigError(f"{key}: {str(path)!r} must hold a real .npy array of shape "
                              f"(K, {d}, {d})")
    if A.ndim == 2:
        A = A[None]
    if A.ndim != 3 or A.shape[1:] != (d, d) or A.shape[0] < 1:
        raise ConfigError(f"{key}: expected an array of shape (K, {d}, {d}) or ({d}, {d}) "
                          f"(attention.d = {d}), got shape {A.shape}")
    return A


def build_noise(table: Any, d: int, *, base: str | None = None,
                section: str = "noise") -> tuple[Noise, Any]:
    """The :class:`~transformer_pde.Noise` and the stochastic solver of a ``[noise]`` table:
    ``sigma``, ``common`` (inline (K, d, d) or (d, d) array, or a ``.npy`` file),
    ``convention`` (``"stratonovich"``, ``"ito"``), ``seed``, ``path``, ``system``, ``base_dt`` and
    ``solver`` (a name of :data:`transformer_pde.noise.SDE_SOLVERS`, default
    ``"euler_maruyama"``)."""
    sec = Table(table, section, NOISE_KEYS)
    kwargs: dict[str, Any] = {"sigma": sec.number("sigma", 0.0, nonneg=True),
                              "convention": sec.choice("convention", "stratonovich",
                                                       CONVENTIONS),
                              "seed": sec.integer("seed", 0), "path": sec.integer("path", 0),
                              "system": sec.integer("system", 0)}
    if sec.has("base_dt"):
        kwargs["base_dt"] = sec.number("base_dt", positive=True)
    if sec.has("common"):
        kwargs["common"] = _common_matrices(sec.raw("common"), sec.key("common"), d, base)
    noise = library_call(section, Noise, names=kwargs, **kwargs)
    solver = SDE_SOLVERS[sec.choice("solver", "euler_maruyama", sorted(SDE_SOLVERS))]()
    return noise, solver


def _check_noise(out: dict[str, Any]) -> None:
    """Refuse, naming the key, a noisy run the library would refuse before its first step:
    steps off the grid of the Brownian path, Milstein without commuting noise or on the
    sphere."""
    noise, scheme, saveat = out["noise"], out["solver"], out["saveat"]
    base_dt = out["dt"] if noise.base_dt is None else noise.base_dt
    try:
        refinement_level(base_dt, out["dt"])
    except ArgumentError as exc:
        raise ConfigError(f"run.dt: {exc}") from None
    try:
        check_grid(out["t_max"], out["dt"], saveat.ts)
    except ArgumentError as exc:
        key = "run.save_at" if "saveat" in str(exc) else "run.t_max"
        raise ConfigError(f"{key}: {exc}") from None
    block = out["block"]
    sphere = block is not None and getattr(block.constraint, "name", None) == "sphere"
    if scheme.needs_commuting and not noise.commutative():
        raise ConfigError(f"noise.solver: {scheme.name!r} needs commuting noise (sigma alone, "
                          "or commuting matrices noise.common alone: A_k A_l = A_l A_k); use "
                          "'euler_maruyama' or 'heun_stratonovich'")
    if sphere and not scheme.on_sphere:
        raise ConfigError(f"noise.solver: {scheme.name!r} is not defined on the sphere; use "
                          "'euler_maruyama' or 'heun_stratonovich'")


def build_field(table: Any, att: Any, block: Any = None, *,
                section: str = "field") -> FieldOptions:
    """The :class:`~transformer_pde.FieldOptions` of a ``[field]`` table, checked against
    the attention ``att`` and the ``block`` of the run: ``backend`` (the names of
    :data:`transformer_pde.backends.BACKENDS` and ``"auto"``), ``dtype`` (``"float32"``,
    ``"float64"``), ``sinkhorn_tol``, ``sinkhorn_max_iter`` (Sinkhorn attention only),
    ``method`` (``"direct"`` or ``"harmonic"``: the exact expansion of isotropic attention
    on the circle or :math:`S^2`, which needs ``[block] constraint = "sphere"``) and
    ``harmonic_tol`` (only with ``method = "harmonic"``)."""
    spec = typed_parameters(FieldOptions, exclude=("backend", "dtype", "method"))
    sec = Table(table, section, inspect.signature(FieldOptions).parameters)
    kwargs = read_options(sec, spec)
    for k, options in (("backend", [*BACKENDS, "auto"]), ("dtype", ("float32", "float64")),
                       ("method", METHODS)):
        if sec.has(k):
            kwargs[k] = sec.choice(k, None, options)
    if sec.has("harmonic_tol") and kwargs.get("method") != "harmonic":
        raise ConfigError(f"{sec.key('harmonic_tol')}: applies only with "
                          f"{sec.key('method')} = 'harmonic'")
    if kwargs.get("method") == "harmonic":
        try:
            isotropic_sign(att, sec.key("method"))
        except ArgumentError as exc:
            raise ConfigError(str(exc)) from None
        if kwargs.get("dtype", "float64") != "float64":
            raise ConfigError(f"{sec.key('dtype')}: {sec.key('method')} = 'harmonic' runs "
                              f"in float64, got {kwargs['dtype']!r}")
    fopts = library_call(section, FieldOptions, names=kwargs, **kwargs)
    try:
        fopts.check(att, block)
    except ArgumentError as exc:
        # the library's messages start with the argument they refuse
        if str(exc).startswith("block:"):
            raise ConfigError(f"{sec.key('method')}: 'harmonic' evaluates the field of tokens "
                              "on the unit sphere and needs [block] constraint = 'sphere' "
                              "(without [block.layernorm] or block.normalization)") from None
        library_call(section, fopts.check, att, block, names=kwargs)
    return fopts


#: keys that belong to another table than ``[run]``, and where they are set
_MOVED = {"method": "run.solver", "backend": "[field]", "dtype": "[field]",
          "sinkhorn_tol": "[field]", "sinkhorn_max_iter": "[field]",
          "max_norm": "[limits]", "max_steps": "[limits]",
          "rtol": "run.solver = {name = ..., rtol = ...}",
          "atol": "run.solver = {name = ..., atol = ...}"}


def build_simulate(cfg: dict, att: Any) -> dict[str, Any]:
    """Keyword arguments of :func:`~transformer_pde.simulate` but ``monitor`` (which the
    command line sets) from the tables of a configuration.

    ``[run]``
        ``t_max`` (default 5), ``dt`` (default 0.05), ``solver`` (:func:`build_solver`;
        default ``"rk4"``), ``save_every`` or ``save_at`` (:class:`~transformer_pde.SaveAt`
        ``every`` or ``ts``).
    ``[field]``
        :func:`build_field`: the keywords of :class:`~transformer_pde.FieldOptions`
        (``backend``, ``dtype``, ``sinkhorn_tol``, ``sinkhorn_max_iter``, ``method``,
        ``harmonic_tol``).
    ``[limits]``
        The keywords of :class:`~transformer_pde.Limits` (``max_norm``, ``max_steps``,
        ``max_memory`` in bytes).
    ``[block]``
        :func:`build_block`.
    ``[noise]``
        :func:`build_noise`: the run is stochastic, its solver is ``noise.solver`` (then
        ``run.solver`` must not be set).

    An option that does not apply (Sinkhorn tolerances for another kind, solver options
    of another solver, block options other than ``constraint = "sphere"`` with an
    adaptive solver, a splitting without an MLP, the harmonic field of attention that is
    not isotropic or of tokens off the sphere) is an error naming its key.
    """
    raw_run = cfg.get("run")
    if isinstance(raw_run, dict):
        for k in raw_run:
            if k == "method" and raw_run[k] in METHODS:
                raise ConfigError(f"run.method: unknown key; the field's method "
                                  f"{raw_run[k]!r} is field.method")
            if k in _MOVED:
                raise ConfigError(f"run.{k}: unknown key; this option is now {_MOVED[k]}")
    run = Table(raw_run, "run", ("t_max", "dt", "solver", "save_every", "save_at"))
    out: dict[str, Any] = {"t_max": run.number("t_max", 5.0, positive=True),
                           "dt": run.number("dt", 0.05, positive=True)}
    out["solver"] = build_solver(run.raw("solver", "rk4"), run.key("solver"))
    if run.has("save_at"):
        if run.has("save_every"):
            raise ConfigError("run.save_at: give either save_every or save_at, not both")
        ts = numeric_array(run.raw("save_at"), run.key("save_at"), "a list of times")
        out["saveat"] = library_call(run.key("save_at"), SaveAt, ts=ts)
    else:
        out["saveat"] = SaveAt(every=run.integer("save_every", 1, minimum=1))

    spec = typed_parameters(Limits)
    limits = Table(cfg.get("limits"), "limits", spec)
    kwargs = read_options(limits, spec)
    out["limits"] = library_call("limits", Limits, names=kwargs, **kwargs)

    block = build_block(cfg.get("block"), att.d)
    if block is not None and out["solver"].adaptive:
        # the library's rule: an adaptive solver takes Block(constraint=Sphere()) alone
        library_call("run", BlockStepper, out["solver"], block, att.d, names=["solver"])
    out["block"] = block
    out["field"] = build_field(cfg.get("field"), att, block)
    if cfg.get("noise") is not None:
        if run.has("solver"):
            raise ConfigError("run.solver: with a [noise] table the solver is noise.solver "
                              f"(one of {', '.join(map(repr, sorted(SDE_SOLVERS)))})")
        out["noise"], out["solver"] = build_noise(cfg["noise"], att.d, base=cfg.get("__dir__"))
        _check_noise(out)
    return out
