r"""Command-line interface ``transformer-pde``.

Subcommands (``transformer-pde <command> --help`` for each):

``demo``
    Clustering of a 2-D token cloud under softmax attention (:math:`Q = K = V = I`) on an
    embedded default; writes a figure, a text and a JSON summary (number of clusters,
    covariance rank) and the trajectory into ``./transformer-pde-demo/``.
``simulate CONFIG.toml``
    Particle simulation from a parameter file: trajectory NPZ, JSON summary, figure.
``gaussian CONFIG.toml``
    Exact mean/covariance ODE of a Gaussian token measure: NPZ, JSON summary, figure.
``cone CONFIG.toml``
    Phase plot of many 2-D covariance trajectories in the PSD cone (or its
    trace-normalised slice).
``ranks [CONFIG.toml]``
    Rank histogram sweep: numerical rank of the limit covariance over random draws.
``bench``
    Timing of the particle field / Gaussian solver (or the benchmark scripts, if present).

Configuration files are TOML (``tomllib``, or ``tomli`` on Python 3.10).  Every error in
a configuration names the offending key and the expected form (:class:`ConfigError`).
Example files live in ``examples/configs/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .paper import (STATUS_COLOURS, RankSweep, paper_attention, rank_figure, rank_sweep,
                    run_figure_script, slice_covariances, solve_paths)

__all__ = [
    "ConfigError",
    "RankSweep",
    "build_attention",
    "benchmark_scripts",
    "build_tokens",
    "load_config",
    "main",
    "paper_attention",
    "rank_figure",
    "rank_sweep",
    "run_bench",
    "run_cone",
    "run_demo",
    "run_figure_script",
    "run_gaussian",
    "run_ranks",
    "run_simulate",
    "slice_covariances",
    "solve_paths",
]

logger = logging.getLogger(__name__)

#: single-linkage scale of the cluster counts: a fraction of the cloud radius (largest
#: distance to the mean), as in :func:`transformer_pde.diagnostics.clusters`
CLUSTER_TOL = 0.02
#: relative tolerance of the covariance numerical rank reported by the CLI
RANK_RTOL = 1e-6


class ConfigError(ValueError):
    """A configuration value is missing or malformed; the message names the key."""


# =========================================================================== helpers
class _Bar:
    """Minimal text progress bar on stderr (a long-running loop's only output)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.total = max(int(total), 1)
        self.desc = desc
        self.enabled = enabled and total > 1
        self.n = 0
        self.t0 = time.perf_counter()

    def update(self, k: int = 1) -> None:
        self.n += k
        if not self.enabled:
            return
        frac = min(self.n / self.total, 1.0)
        width = 30
        el = time.perf_counter() - self.t0
        eta = el / frac - el if frac > 0 else float("nan")
        sys.stderr.write(f"\r{self.desc} [{'#' * int(width * frac):<{width}}] "
                         f"{self.n}/{self.total} {el:5.1f}s eta {eta:4.0f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _cloud_rank(X: np.ndarray) -> int:
    """Numerical rank (relative tolerance :data:`RANK_RTOL`) of the covariance of a cloud."""
    from .diagnostics import numerical_rank  # noqa: PLC0415

    Y = X - X.mean(axis=0)
    return numerical_rank(Y.T @ Y / X.shape[0], RANK_RTOL)


def _clusters(X: np.ndarray, tol: float) -> tuple[int, np.ndarray]:
    """Number of clusters and labels by :func:`transformer_pde.diagnostics.clusters`
    (single linkage at ``tol`` times the cloud radius)."""
    from .diagnostics import clusters  # noqa: PLC0415

    res = clusters(X, tol=tol)
    return res.n_clusters, res.labels


def _write_json(path: Path, data: dict) -> Path:
    def default(o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, Path):
            return str(o)
        raise TypeError(f"cannot write {type(o).__name__} to JSON")

    path.write_text(json.dumps(data, indent=2, default=default) + "\n")
    return path


def _outdir(path: str | Path) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _savefig(fig: Any, path: Path, dpi: int = 110) -> Path:
    fig.savefig(path, dpi=dpi)
    return path


# =========================================================================== config
def load_config(path: str | Path) -> dict:
    """Read a TOML configuration file (``tomllib``; ``tomli`` on Python 3.10)."""
    try:
        import tomllib  # noqa: PLC0415
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]  # noqa: PLC0415
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {str(path)!r} does not exist")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


class _Section:
    """Typed access to one table of the configuration, naming keys in errors."""

    def __init__(self, data: Any, name: str, allowed: Iterable[str]):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"[{name}] must be a table, got {type(data).__name__}")
        self.data = data
        self.name = name
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ConfigError(f"{name}.{unknown[0]}: unknown key; allowed keys are "
                              f"{', '.join(sorted(allowed))}")

    def key(self, k: str) -> str:
        return f"{self.name}.{k}"

    def has(self, k: str) -> bool:
        return k in self.data

    def raw(self, k: str, default: Any = None) -> Any:
        return self.data.get(k, default)

    def number(self, k: str, default: Any = None, *, positive: bool = False,
               nonneg: bool = False) -> float:
        v = self.data.get(k, default)
        if v is None:
            raise ConfigError(f"{self.key(k)}: required, expected a number")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{self.key(k)}: expected a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v) or (positive and v <= 0) or (nonneg and v < 0):
            cond = "> 0" if positive else ">= 0" if nonneg else "finite"
            raise ConfigError(f"{self.key(k)}: expected a finite number {cond}, got {v!r}")
        return v

    def integer(self, k: str, default: Any = None, *, minimum: int = 0) -> int:
        v = self.data.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{self.key(k)}: expected an integer >= {minimum}, got {v!r}")
        if v < minimum:
            raise ConfigError(f"{self.key(k)}: expected an integer >= {minimum}, got {v}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        v = self.data.get(k, default)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.key(k)}: expected true or false, got {v!r}")
        return v

    def choice(self, k: str, default: str, options: Sequence[str]) -> str:
        v = self.data.get(k, default)
        if v not in options:
            raise ConfigError(f"{self.key(k)}: expected one of {', '.join(map(repr, options))}, "
                              f"got {v!r}")
        return v

    def vector(self, k: str, n: int, default: Any = None) -> np.ndarray:
        v = self.data.get(k, default)
        arr = _numeric_array(v, self.key(k), f"a list of {n} numbers")
        if arr.shape != (n,):
            raise ConfigError(f"{self.key(k)}: expected a list of {n} numbers, "
                              f"got shape {arr.shape}")
        return arr


def _numeric_array(v: Any, key: str, form: str) -> np.ndarray:
    try:
        arr = np.array(v, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {form}, got {v!r}") from None
    if arr.dtype == object or not np.all(np.isfinite(arr)):
        raise ConfigError(f"{key}: expected {form} (finite numbers), got {v!r}")
    return arr


_MATRIX_FORM = ("'identity', 'zeros', a number c (meaning c*I), a d x d list of lists, "
                "or a table {random = 'normal' | 'orthogonal' | 'spd', scale = float, seed = int} "
                "or {diag = [d numbers]}")


def _matrix(v: Any, key: str, d: int, rng: np.random.Generator) -> np.ndarray:
    """Parse a matrix description (see ``_MATRIX_FORM``)."""
    if isinstance(v, str):
        if v == "identity":
            return np.eye(d)
        if v == "zeros":
            return np.zeros((d, d))
        raise ConfigError(f"{key}: expected {_MATRIX_FORM}; got the string {v!r}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) * np.eye(d)
    if isinstance(v, dict):
        sec = _Section(v, key, ("random", "scale", "seed", "diag"))
        if sec.has("diag"):
            if sec.has("random"):
                raise ConfigError(f"{key}: give either 'diag' or 'random', not both")
            return np.diag(sec.vector("diag", d))
        kind = sec.choice("random", "normal", ("normal", "orthogonal", "spd"))
        scale = sec.number("scale", 1.0)
        g = np.random.default_rng(sec.integer("seed")) if sec.has("seed") else rng
        G = g.normal(size=(d, d))
        if kind == "normal":
            return scale * G / math.sqrt(d)
        if kind == "orthogonal":
            Qm, R = np.linalg.qr(G)
            return scale * Qm * np.sign(np.diag(R))
        return scale * (G @ G.T / d + 1e-3 * np.eye(d))
    arr = _numeric_array(v, key, _MATRIX_FORM)
    if arr.ndim != 2 or arr.shape[1] != d:
        raise ConfigError(f"{key}: expected a matrix with {d} columns ({_MATRIX_FORM}); "
                          f"got shape {arr.shape}")
    return arr


_ATT_KEYS = ("kind", "d", "heads", "beta", "eps", "l2_beta", "masked", "Q", "K", "V", "W_O",
             "seed", "score_scale")


def build_attention(table: Any, *, section: str = "attention") -> Any:
    r"""Build an :class:`~transformer_pde.Attention` from a configuration table.

    Keys: ``kind`` (default ``"softmax"``), ``d`` (required), ``heads`` (1), ``beta`` (1),
    ``eps`` (1), ``l2_beta`` (0.5), ``masked`` (false), ``Q``, ``K``, ``V`` (default
    ``"identity"``), ``W_O`` (optional), ``seed`` (random matrices), and
    ``score_scale`` (multiplies ``Q``: e.g. ``"1/sqrt(d)"`` for the paper's
    :math:`A/\sqrt d`; also ``"1/sqrt(k)"`` with :math:`k = d/H` or a number).
    """
    from .attention import KINDS, Attention  # noqa: PLC0415

    sec = _Section(table, section, _ATT_KEYS)
    kind = sec.choice("kind", "softmax", sorted(KINDS))
    d = sec.integer("d", sec.raw("d"), minimum=1)
    heads = sec.integer("heads", 1, minimum=1)
    if d % heads:
        raise ConfigError(f"{sec.key('heads')}: must divide {section}.d = {d}, got {heads}")
    rng = np.random.default_rng(sec.integer("seed", 0))
    mats = {name: _matrix(sec.raw(name, "identity"), sec.key(name), d, rng)
            for name in ("Q", "K", "V")}
    W_O = _matrix(sec.raw("W_O"), sec.key("W_O"), d, rng) if sec.has("W_O") else None
    scale = sec.raw("score_scale", 1.0)
    if isinstance(scale, str):
        table_ = {"1/sqrt(d)": 1.0 / math.sqrt(d), "1/sqrt(k)": 1.0 / math.sqrt(d // heads),
                  "1": 1.0}
        if scale not in table_:
            raise ConfigError(f"{sec.key('score_scale')}: expected a number, '1/sqrt(d)' or "
                              f"'1/sqrt(k)', got {scale!r}")
        scale = table_[scale]
    else:
        scale = sec.number("score_scale", 1.0, positive=True)
    try:
        return Attention(kind, mats["Q"] * scale, mats["K"], mats["V"], heads=heads,
                         masked=sec.boolean("masked", False), beta=sec.number("beta", 1.0),
                         eps=sec.number("eps", 1.0, positive=True),
                         l2_beta=sec.number("l2_beta", 0.5, positive=True), W_O=W_O)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{section}]: {exc}") from None


_TOKEN_KEYS = ("n", "distribution", "mean", "std", "cov", "seed", "file")


def build_tokens(table: Any, d: int, *, section: str = "tokens") -> np.ndarray:
    """Initial tokens (N, d) from a ``[tokens]`` table.

    ``distribution`` is ``"gaussian"`` (``mean``, ``std`` or ``cov``), ``"uniform-ball"``
    (radius ``std``) or ``"uniform-cube"`` ([-std, std]^d, shifted by ``mean``); or
    ``file`` names a ``.npy`` array (N, d).
    """
    sec = _Section(table, section, _TOKEN_KEYS)
    if sec.has("file"):
        try:
            X = np.load(str(sec.raw("file")), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{sec.key('file')}: cannot read a .npy array: {exc}") from None
        if X.ndim != 2 or X.shape[1] != d:
            raise ConfigError(f"{sec.key('file')}: expected an array of shape (N, {d}), "
                              f"got {X.shape}")
        return np.asarray(X, dtype=float)
    n = sec.integer("n", 128, minimum=1)
    rng = np.random.default_rng(sec.integer("seed", 0))
    mean = sec.vector("mean", d, [0.0] * d)
    dist = sec.choice("distribution", "gaussian", ("gaussian", "uniform-ball", "uniform-cube"))
    std = sec.number("std", 1.0, positive=True)
    if dist == "gaussian":
        if sec.has("cov"):
            C = _numeric_array(sec.raw("cov"), sec.key("cov"), f"a {d} x {d} list of lists")
            if C.shape != (d, d):
                raise ConfigError(f"{sec.key('cov')}: expected a {d} x {d} list of lists, "
                                  f"got shape {C.shape}")
            return rng.multivariate_normal(mean, C, size=n, method="eigh")
        return mean + std * rng.normal(size=(n, d))
    if dist == "uniform-cube":
        return mean + std * rng.uniform(-1, 1, size=(n, d))
    G = rng.normal(size=(n, d))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    return mean + std * G * rng.uniform(size=(n, 1)) ** (1.0 / d)


# =========================================================================== demo
def run_demo(out: str | Path = "transformer-pde-demo", *, n: int = 256, seed: int = 0,
             t_max: float = 6.0, dt: float = 0.05, backend: str = "numpy",
             gif: bool = False, cluster_tol: float = CLUSTER_TOL) -> dict:
    r"""Run the demo and write its files; returns the summary dictionary.

    Tokens :math:`x_i(0) \sim N(0, I_2)`, :math:`N = 256`, softmax attention with
    :math:`Q = K = V = I`, integrated with RK4 (:math:`h = 0.05`) to :math:`t = 6`.
    With :math:`V = I` the tokens grow like :math:`e^{t}`; in the co-moving frame
    :math:`z = e^{-t} x` they collapse onto a few clusters at vertices of a convex polygon
    (Geshkovski, Letrouit, Polyanskiy, Rigollet 2023).  Clusters are counted by single
    linkage at ``cluster_tol`` times the radius of the final cloud
    (:func:`transformer_pde.diagnostics.clusters`).
    """
    from matplotlib.figure import Figure  # noqa: PLC0415

    from . import plot  # noqa: PLC0415
    from .attention import Attention  # noqa: PLC0415
    from .particles import simulate  # noqa: PLC0415

    outdir = _outdir(out)
    rng = np.random.default_rng(seed)
    X0 = rng.normal(size=(n, 2))
    att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    t0 = time.perf_counter()
    traj = simulate(att, X0, t_max=t_max, dt=dt, method="rk4", backend=backend)
    elapsed = time.perf_counter() - t0
    Z = plot.rescaled_states(traj, np.eye(2))
    k_final, labels = _clusters(Z[-1], cluster_tol)
    counts = [_clusters(z, cluster_tol)[0] for z in Z]
    rank = _cloud_rank(Z[-1])
    fig = Figure(figsize=(10.5, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    plot.particles(Z, labels=labels, ax=ax1,
                   title=f"softmax attention, Q=K=V=I: {k_final} clusters")
    ax1.set_xlabel(r"$(e^{-t}x)_1$")
    ax1.set_ylabel(r"$(e^{-t}x)_2$")
    ax2.step(traj.times, counts, where="post", color="C0")
    ax2.set_yscale("log")
    ax2.set_xlabel("depth t")
    ax2.set_ylabel(f"clusters (single linkage, {cluster_tol:g} x cloud radius)")
    ax2.set_title("number of clusters along depth")
    ax2.grid(alpha=0.3)
    figpath = _savefig(fig, outdir / "demo.png")
    files = {"figure": figpath.name, "trajectory": traj.save(outdir / "trajectory.npz").name}
    if gif:
        files["animation"] = plot.animate_particles(Z, outdir / "demo.gif").name
    summary = {
        "command": "demo", "n_tokens": n, "d": 2, "kind": "softmax", "Q=K=V": "identity",
        "t_max": t_max, "dt": dt, "method": "rk4", "backend": traj.info.get("backend", backend),
        "status": traj.status, "seconds": round(elapsed, 3),
        "clusters_final": k_final, "cluster_scale": cluster_tol,
        "cluster_sizes": np.bincount(labels).tolist(),
        "covariance_rank": rank, "covariance_rank_rtol": RANK_RTOL,
        "frame": "z = exp(-t) x (co-moving frame of V = I)", "files": files,
    }
    _write_json(outdir / "summary.json", summary)
    text = (
        "transformer-pde demo: clustering of 2-D tokens under softmax attention\n"
        f"  tokens: N = {n} drawn from N(0, I_2) (seed {seed}); Q = K = V = I; RK4, dt = {dt}, "
        f"t in [0, {t_max:g}]\n"
        f"  run: {traj.status} in {elapsed:.2f} s ({summary['backend']} backend)\n"
        f"  final number of clusters: {k_final} (single linkage at {cluster_tol:g} x cloud radius, "
        f"frame e^(-t) x)\n"
        f"  cluster sizes: {summary['cluster_sizes']}\n"
        f"  covariance numerical rank of the final tokens: {rank} of 2 "
        f"(eigenvalues > {RANK_RTOL:g} x largest)\n"
        f"  files: {', '.join(files.values())}, summary.json, summary.txt in {outdir}\n")
    (outdir / "summary.txt").write_text(text)
    summary["text"] = text
    return summary


def _cmd_demo(args: argparse.Namespace) -> int:
    s = run_demo(args.out, n=args.n, seed=args.seed, t_max=args.t_max, backend=args.backend,
                 gif=args.gif)
    sys.stdout.write(s["text"])
    return 0


# =========================================================================== simulate
_RUN_KEYS = ("t_max", "dt", "method", "backend", "save_every", "max_norm", "dtype")
_OUT_KEYS = ("rescale", "cluster_scale", "figure", "gif")


def run_simulate(cfg: dict, out: str | Path, *, progress: bool = True) -> dict:
    """Particle simulation from a configuration dict (tables ``attention``, ``tokens``,
    ``run``, ``output``); writes ``trajectory.npz``, ``summary.json`` and ``particles.png``.

    With ``masked = true`` the tokens get positions ``linspace(0, 1, N)`` in input order
    (token ``i`` attends to tokens ``j <= i``)."""
    from . import plot  # noqa: PLC0415
    from .particles import simulate  # noqa: PLC0415

    _Section(cfg, "config", ("attention", "tokens", "run", "output", "title"))
    att = build_attention(cfg.get("attention"))
    X0 = build_tokens(cfg.get("tokens"), att.d)
    run = _Section(cfg.get("run"), "run", _RUN_KEYS)
    outp = _Section(cfg.get("output"), "output", _OUT_KEYS)
    rescale_opt = outp.choice("rescale", "none", ("none", "value"))
    rel = outp.number("cluster_scale", CLUSTER_TOL, positive=True)
    positions = None
    if att.masked:
        positions = np.linspace(0.0, 1.0, X0.shape[0])
    outdir = _outdir(out)
    t0 = time.perf_counter()
    try:
        traj = simulate(att, X0, t_max=run.number("t_max", 5.0, positive=True),
                        dt=run.number("dt", 0.05, positive=True),
                        method=run.choice("method", "rk4", ("euler", "rk4", "dopri5")),
                        backend=run.choice("backend", "numpy", ("numpy", "numba", "cupy", "auto")),
                        save_every=run.integer("save_every", 1, minimum=1),
                        max_norm=run.number("max_norm", 1e8, positive=True),
                        dtype=run.choice("dtype", "float64", ("float32", "float64")),
                        positions=positions, progress=progress)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"[run]: {exc}") from None
    elapsed = time.perf_counter() - t0
    files = {"trajectory": traj.save(outdir / "trajectory.npz").name}
    Z = plot.rescaled_states(traj, "value" if rescale_opt == "value" else None)
    final = Z[-1]
    k, labels = _clusters(final, rel)
    if outp.boolean("figure", True) and att.d >= 2:
        fig = plot.particles(Z, labels=labels, title=str(cfg.get("title", f"{att.kind} attention")))
        files["figure"] = _savefig(fig, outdir / "particles.png").name
    if outp.boolean("gif", False) and att.d >= 2:
        files["animation"] = plot.animate_particles(Z, outdir / "particles.gif").name
    summary = {
        "command": "simulate", "attention": repr(att), "n_tokens": int(X0.shape[0]), "d": att.d,
        "status": traj.status, "message": traj.message, "t_final": traj.t_final,
        "seconds": round(elapsed, 3), "info": traj.info, "frame": rescale_opt,
        "clusters_final": k, "cluster_scale": rel,
        "covariance_rank": _cloud_rank(final), "covariance_rank_rtol": RANK_RTOL,
        "max_abs_final": float(np.max(np.abs(traj.final))), "files": files,
    }
    _write_json(outdir / "summary.json", summary)
    return summary


def _cmd_simulate(args: argparse.Namespace) -> int:
    if not args.quiet:  # simulate reports progress as INFO lines (a bar when tqdm is installed)
        logging.getLogger("transformer_pde.particles").setLevel(logging.INFO)
    s = run_simulate(load_config(args.config), args.out, progress=not args.quiet)
    sys.stdout.write(f"simulate: {s['status']} ({s['message']}); {s['clusters_final']} clusters, "
                     f"covariance rank {s['covariance_rank']}; files in {args.out}: "
                     f"{', '.join(s['files'].values())}, summary.json\n")
    return 0 if s["status"] == "ok" else 1


# =========================================================================== gaussian
_GAUSS_KEYS = ("mean", "cov", "t_max", "n_eval", "rtol", "atol", "blowup_threshold",
               "converge_tol")


def _solver_options(sec: _Section, t_max: float) -> dict:
    return {"t_max": sec.number("t_max", t_max, positive=True),
            "rtol": sec.number("rtol", 1e-10, positive=True),
            "atol": sec.number("atol", 1e-12, positive=True),
            "blowup_threshold": sec.number("blowup_threshold", 1e8, positive=True),
            "converge_tol": sec.number("converge_tol", 1e-10, positive=True)}


def run_gaussian(cfg: dict, out: str | Path) -> dict:
    r"""Gaussian moment ODE from a configuration (tables ``attention`` and ``gaussian``).

    Writes ``gaussian.npz`` (times, means, covs, limit), ``summary.json`` (status, blow-up
    time, ranks of the limit) and ``gaussian.png`` (eigenvalues of :math:`\Sigma(t)`).
    """
    from matplotlib.figure import Figure  # noqa: PLC0415

    from . import gaussian  # noqa: PLC0415
    from .diagnostics import effective_rank, numerical_rank  # noqa: PLC0415

    _Section(cfg, "config", ("attention", "gaussian", "title"))
    att = build_attention(cfg.get("attention"))
    d = att.d
    sec = _Section(cfg.get("gaussian"), "gaussian", _GAUSS_KEYS)
    mean = sec.vector("mean", d, [0.0] * d)
    cov = sec.raw("cov", "identity")
    form = f"'identity' or a {d} x {d} list of lists"
    cov = np.eye(d) if cov == "identity" else _numeric_array(cov, sec.key("cov"), form)
    if cov.shape != (d, d):
        raise ConfigError(f"{sec.key('cov')}: expected 'identity' or a {d} x {d} list of lists, "
                          f"got shape {cov.shape}")
    opts = _solver_options(sec, 10.0)
    n_eval = sec.integer("n_eval", 200, minimum=2)
    try:
        traj = gaussian.solve(att, mean, cov, t_eval=np.linspace(0.0, opts["t_max"], n_eval),
                              **opts)
    except ValueError as exc:
        raise ConfigError(f"[gaussian]: {exc}") from None
    outdir = _outdir(out)
    np.savez(outdir / "gaussian.npz", times=traj.times, means=traj.means, covs=traj.covs,
             limit=traj.limit)
    lam = np.linalg.eigvalsh(traj.covs)
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for i in range(d):
        ax.semilogy(traj.times, np.clip(lam[:, i], 1e-300, None), label=f"$\\lambda_{i + 1}$")
    if np.isfinite(traj.blowup_time):
        ax.axvline(traj.blowup_time, color="k", ls="--", lw=0.8, label="$T^*$")
    ax.set_xlabel("t")
    ax.set_ylabel(r"eigenvalues of $\Sigma(t)$")
    ax.set_title(str(cfg.get("title", f"{att.kind}: {traj.status}")))
    ax.legend(fontsize="small")
    _savefig(fig, outdir / "gaussian.png")
    summary = {"command": "gaussian", "attention": repr(att), "status": traj.status,
               "message": traj.message, "blowup_time": traj.blowup_time, "t_final": traj.t_final,
               "trace_final": float(np.trace(traj.covs[-1])),
               "limit_numerical_rank": numerical_rank(traj.limit, RANK_RTOL),
               "limit_rank_rtol": RANK_RTOL, "limit_effective_rank": effective_rank(traj.limit),
               "mean_final": traj.means[-1], "nfev": traj.nfev,
               "files": {"data": "gaussian.npz", "figure": "gaussian.png"}}
    _write_json(outdir / "summary.json", summary)
    return summary


def _cmd_gaussian(args: argparse.Namespace) -> int:
    s = run_gaussian(load_config(args.config), args.out)
    sys.stdout.write(f"gaussian: {s['status']} ({s['message']}); limit rank "
                     f"{s['limit_numerical_rank']}; files in {args.out}: gaussian.npz, "
                     "gaussian.png, summary.json\n")
    return 0


# =========================================================================== cone
_CONE_KEYS = ("n", "init", "radius", "trace", "seed", "t_max", "n_eval", "view", "color_by",
              "rank_one_line", "v_max", "rtol", "atol", "blowup_threshold", "converge_tol")


def run_cone(cfg: dict, out: str | Path) -> dict:
    """Phase plot of many 2-D covariance trajectories (tables ``attention`` and ``cone``).

    Writes ``cone.npz`` (``covs0``; ``times_<i>``, ``covs_<i>`` per run, each up to its own end;
    ``status``, ``blowup_time``, ``limit``), ``summary.json`` and ``cone.png``."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    from . import plot  # noqa: PLC0415

    _Section(cfg, "config", ("attention", "cone", "title"))
    att = build_attention(cfg.get("attention"))
    if att.d != 2:
        raise ConfigError(f"attention.d: the cone phase plot needs d = 2, got {att.d}")
    sec = _Section(cfg.get("cone"), "cone", _CONE_KEYS)
    n = sec.integer("n", 24, minimum=1)
    radius = sec.number("radius", 0.7, nonneg=True)
    if radius >= 1:
        raise ConfigError(f"{sec.key('radius')}: expected a number in [0, 1), got {radius}")
    covs0 = slice_covariances(n, radius=radius, trace=sec.number("trace", 1.0, positive=True),
                              init=sec.choice("init", "circle", ("circle", "random")),
                              seed=sec.integer("seed", 0))
    opts = _solver_options(sec, 20.0)
    n_eval = sec.integer("n_eval", 200, minimum=2)
    view = sec.choice("view", "both", ("cone", "slice", "both"))
    color_by = sec.choice("color_by", "start", ("start", "end", "status"))
    line = sec.vector("rank_one_line", 2) if sec.has("rank_one_line") else None
    v_max = sec.number("v_max", 0.0, positive=True) if sec.has("v_max") else None
    t_max = opts.pop("t_max")
    try:
        runs = solve_paths(att, covs0, t_max=t_max, n_eval=n_eval, **opts)
    except ValueError as exc:
        raise ConfigError(f"[cone]: {exc}") from None
    status = [r.status for r in runs]
    colours = ([STATUS_COLOURS[s] for s in status] if color_by == "status" else color_by)
    panels = ["cone", "slice"] if view == "both" else [view]
    fig = Figure(figsize=(5.5 * len(panels), 5.0), layout="constrained")
    title = str(cfg.get("title", repr(att)))
    for i, panel in enumerate(panels):
        if panel == "cone":
            ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
            plot.cone(runs, color_by=colours, rank_one_line=line, v_max=v_max, ax=ax)
        else:
            ax = fig.add_subplot(1, len(panels), i + 1)
            plot.cone_slice(runs, color_by=colours, rank_one_line=line, ax=ax)
    fig.suptitle(title)
    outdir = _outdir(out)
    _savefig(fig, outdir / "cone.png")
    arrays = {"covs0": covs0, "status": np.asarray(status, dtype=str),
              "blowup_time": np.array([r.blowup_time for r in runs]),
              "limit": np.stack([r.limit for r in runs])}
    for i, r in enumerate(runs):
        arrays[f"times_{i}"], arrays[f"covs_{i}"] = r.times, r.covs
    np.savez(outdir / "cone.npz", **arrays)
    summary = {"command": "cone", "attention": repr(att), "n": n,
               "status_counts": {k: status.count(k) for k in STATUS_COLOURS},
               "blowup_times": arrays["blowup_time"], "t_final": [r.t_final for r in runs],
               "files": {"data": "cone.npz", "figure": "cone.png"}}
    _write_json(outdir / "summary.json", summary)
    return summary


def _cmd_cone(args: argparse.Namespace) -> int:
    s = run_cone(load_config(args.config), args.out)
    counts = ", ".join(f"{k} {v}" for k, v in s["status_counts"].items() if v)
    sys.stdout.write(f"cone: {s['n']} trajectories ({counts}); files in {args.out}: cone.png, "
                     "cone.npz, summary.json\n")
    return 0


# =========================================================================== ranks
_RANK_KEYS = ("kinds", "dims", "values", "draws", "seed", "t_max", "blowup_threshold", "rtol")


def run_ranks(cfg: dict, out: str | Path, *, progress: bool = True) -> dict:
    """Rank-histogram sweep (table ``ranks``); writes ``ranks.npz``, ``summary.json`` and
    ``ranks.png`` (:func:`rank_figure`: one panel per (kind, value), bars grouped by
    dimension)."""
    _Section(cfg, "config", ("ranks", "title"))
    sec = _Section(cfg.get("ranks"), "ranks", _RANK_KEYS)

    def str_list(key: str, default: list, options: Sequence[str]) -> list:
        v = sec.raw(key, default)
        if not isinstance(v, list) or not v or any(x not in options for x in v):
            raise ConfigError(f"{sec.key(key)}: expected a non-empty list of "
                              f"{', '.join(map(repr, options))}, got {v!r}")
        return v

    kinds = str_list("kinds", ["softmax", "l2"], ("softmax", "l2", "sinkhorn"))
    values = str_list("values", ["identity", "random"], ("identity", "random"))
    dims = sec.raw("dims", [3, 4, 5])
    if (not isinstance(dims, list) or not dims
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in dims)):
        raise ConfigError(f"{sec.key('dims')}: expected a non-empty list of integers >= 1, "
                          f"got {dims!r}")
    opts = {"draws": sec.integer("draws", 100, minimum=1), "seed": sec.integer("seed", 0),
            "t_max": sec.number("t_max", 30.0, positive=True),
            "blowup_threshold": sec.number("blowup_threshold", 1e3, positive=True),
            "rtol": sec.number("rtol", 1e-3, positive=True)}
    if opts["rtol"] >= 1:
        raise ConfigError(f"{sec.key('rtol')}: expected a number in (0, 1), got {opts['rtol']}")
    jobs = [(k, v, d) for k in kinds for v in values for d in dims]
    bar = _Bar(len(jobs), "ranks", progress)
    sweeps = []
    for k, v, d in jobs:
        sweeps.append(rank_sweep(k, d, value=v, **opts))
        bar.update()
    bar.close()
    fig = rank_figure(sweeps, str(cfg.get("title", f"numerical rank (rtol {opts['rtol']:g}) of "
                                                 f"the limit covariance, {opts['draws']} draws")))
    outdir = _outdir(out)
    _savefig(fig, outdir / "ranks.png")
    np.savez(outdir / "ranks.npz", **{f"{s.kind}_{s.value}_d{s.d}": s.ranks for s in sweeps},
             **{f"{s.kind}_{s.value}_d{s.d}_status": s.status.astype(str) for s in sweeps})
    summary = {"command": "ranks", "sweeps": [s.summary() for s in sweeps],
               "files": {"data": "ranks.npz", "figure": "ranks.png"}}
    _write_json(outdir / "summary.json", summary)
    return summary


def _cmd_ranks(args: argparse.Namespace) -> int:
    cfg = load_config(args.config) if args.config else {}
    table = dict(cfg.get("ranks", {}) or {})
    for key in ("kinds", "dims", "values", "draws", "seed"):
        if getattr(args, key) is not None:
            table[key] = getattr(args, key)
    cfg = {**cfg, "ranks": table}
    s = run_ranks(cfg, args.out, progress=not args.quiet)
    for sw in s["sweeps"]:
        sys.stdout.write(f"{sw['kind']:>8s} V={sw['value']:<8s} d={sw['d']}: ranks 0..{sw['d']} "
                         f"-> {sw['rank_counts']}\n")
    sys.stdout.write(f"files in {args.out}: ranks.png, ranks.npz, summary.json\n")
    return 0


# =========================================================================== bench
def run_bench(*, quick: bool = True, out: str | Path | None = None,
              backends: Sequence[str] | None = None) -> dict:
    r"""Small built-in timing: particle field evaluations and a Gaussian batch solve.

    Times (best of 3 repeats, after one warm-up call that also compiles numba kernels) one
    evaluation of the softmax field :math:`\Gamma_{\mu_N}` at
    all :math:`N` tokens in :math:`d = 16` on each available CPU backend, and one
    :func:`~transformer_pde.gaussian.solve_batch` of 256 random 4-D softmax Gaussians with
    :math:`V = I` (random :math:`Q, K`, most of which blow up in finite time).
    The project's full benchmark scripts are in ``benchmarks/``.
    """
    import platform  # noqa: PLC0415

    from . import gaussian  # noqa: PLC0415
    from .attention import Attention  # noqa: PLC0415
    from .backends import available_backends  # noqa: PLC0415
    from .fields import FieldEvaluator  # noqa: PLC0415

    rng = np.random.default_rng(0)
    d = 16
    sizes = (256, 1024) if quick else (256, 1024, 4096, 16384)
    att = Attention("softmax", rng.normal(size=(d, d)) / d, rng.normal(size=(d, d)) / math.sqrt(d),
                    np.eye(d))
    rows = []
    wanted = ("numpy", "numba") if backends is None else tuple(backends)
    backends = [b for b in available_backends() if b in wanted]
    for be in backends:
        for n in sizes:
            X = rng.normal(size=(n, d))
            ev = FieldEvaluator(att, n, backend=be)
            ev(0.0, ev.be.asarray(X, np.float64))  # warm-up (JIT compilation for numba)
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                ev(0.0, ev.be.asarray(X, np.float64))
                best = min(best, time.perf_counter() - t0)
            rows.append({"task": "softmax field", "backend": be, "N": n, "d": d, "seconds": best})
    B, dg = 256, 4
    atts = [Attention("softmax", rng.normal(size=(dg, dg)) / 2, rng.normal(size=(dg, dg)),
                      np.eye(dg)) for _ in range(B)]
    F = rng.normal(size=(B, dg, dg))
    t0 = time.perf_counter()
    res = gaussian.solve_batch(atts, np.zeros((B, dg)), F @ np.swapaxes(F, -1, -2) / dg,
                               t_max=10.0, blowup_threshold=1e3, rtol=1e-8, atol=1e-10)
    rows.append({"task": "gaussian solve_batch", "backend": "numpy", "N": B, "d": dg,
                 "seconds": time.perf_counter() - t0, "status_counts": res.counts()})
    result = {"command": "bench", "quick": quick, "machine": platform.platform(),
              "python": platform.python_version(), "cpu_count": __import__("os").cpu_count(),
              "rows": rows}
    if out is not None:
        outdir = _outdir(out)
        _write_json(outdir / "bench.json", result)
    return result


def benchmark_scripts(root: str | Path | None = None) -> list[Path]:
    """The project's benchmark scripts (``benchmarks/*.py`` of a source checkout: ``root``, or
    the directory above the installed package)."""
    base = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    return sorted(p for p in (base / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.scripts:
        import subprocess  # noqa: PLC0415

        scripts = benchmark_scripts()
        if not scripts:
            sys.stderr.write("transformer-pde bench: no benchmarks/*.py next to the package "
                             "(they come with a source checkout)\n")
            return 2
        rc = 0
        for script in scripts:
            cmd = [sys.executable, str(script)] + ([] if args.full else ["--quick"])
            sys.stdout.write(f"$ {' '.join(cmd)}\n")
            sys.stdout.flush()
            rc = max(rc, subprocess.run(cmd, check=False).returncode)
        return rc
    res = run_bench(quick=not args.full, out=args.out, backends=args.backends)
    sys.stdout.write(f"{'task':<22s} {'backend':<8s} {'N':>7s} {'d':>3s} {'seconds':>10s}\n")
    for r in res["rows"]:
        sys.stdout.write(f"{r['task']:<22s} {r['backend']:<8s} {r['N']:>7d} {r['d']:>3d} "
                         f"{r['seconds']:>10.4f}\n")
    if args.out:
        sys.stdout.write(f"written {Path(args.out) / 'bench.json'}\n")
    return 0


# =========================================================================== main
def _config_command(sub: Any, name: str, func: Callable, help_: str, description: str) -> Any:
    """A subcommand taking ``CONFIG.toml`` and ``--out``."""
    p = sub.add_parser(name, help=help_, description=description)
    p.add_argument("config", help=f"TOML configuration (see examples/configs/{name}.toml)")
    p.add_argument("--out", default=f"transformer-pde-{name}", help="output directory")
    p.set_defaults(func=func)
    return p


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="transformer-pde",
        description="Deep Transformers as a mean-field PDE: simulate token clouds, Gaussian "
                    "moment ODEs, phase plots and rank statistics.",
        epilog="Run 'transformer-pde COMMAND --help' for the options of each command; example "
               "configurations are in examples/configs/.")
    p.add_argument("-v", "--verbose", action="store_true", help="log INFO messages to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("demo", help="clustering of a 2-D token cloud (embedded default)",
                       description="Simulate clustering of a 2-D token cloud under softmax "
                                   "attention (Q = K = V = I) and write demo.png, summary.txt, "
                                   "summary.json and trajectory.npz.")
    d.add_argument("--out", default="transformer-pde-demo",
                   help="output directory (default: ./transformer-pde-demo)")
    d.add_argument("--n", type=int, default=256, help="number of tokens (default 256)")
    d.add_argument("--seed", type=int, default=0, help="random seed of the tokens (default 0)")
    d.add_argument("--t-max", type=float, default=6.0, help="final depth (default 6)")
    d.add_argument("--backend", default="numpy", help="particle backend (default numpy)")
    d.add_argument("--gif", action="store_true", help="also write an animation demo.gif")
    d.set_defaults(func=_cmd_demo)

    s = _config_command(sub, "simulate", _cmd_simulate, "particle simulation from a TOML file",
                        "Simulate tokens from CONFIG.toml (tables [attention], [tokens], [run], "
                        "[output]); write trajectory.npz, summary.json and particles.png.")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    _config_command(sub, "gaussian", _cmd_gaussian, "Gaussian mean/covariance ODE from a TOML file",
                    "Solve the exact moment ODE of a Gaussian token measure from CONFIG.toml "
                    "(tables [attention], [gaussian]); write gaussian.npz, gaussian.png and "
                    "summary.json.")

    _config_command(sub, "cone", _cmd_cone, "phase plot of 2-D covariances in the PSD cone",
                    "Solve many 2-D Gaussian runs from CONFIG.toml (tables [attention] with "
                    "d = 2, [cone]) and draw them in the PSD cone and its trace-normalised "
                    "slice; write cone.png, cone.npz and summary.json.")

    r = sub.add_parser("ranks", help="rank histogram sweep over random draws",
                       description="Numerical rank of the limit covariance over random "
                                   "parameters and initial covariances, per kind, value matrix "
                                   "and dimension; write ranks.png, ranks.npz, summary.json. "
                                   "Options override the [ranks] table of CONFIG.")
    r.add_argument("config", nargs="?", help="optional TOML file with a [ranks] table")
    r.add_argument("--out", default="transformer-pde-ranks", help="output directory")
    r.add_argument("--kinds", nargs="+", choices=("softmax", "l2", "sinkhorn"),
                   help="attention kinds (default softmax l2)")
    r.add_argument("--dims", nargs="+", type=int, help="dimensions (default 3 4 5)")
    r.add_argument("--values", nargs="+", choices=("identity", "random"),
                   help="value matrices V (default identity random)")
    r.add_argument("--draws", type=int, help="random draws per case (default 100)")
    r.add_argument("--seed", type=int, help="random seed (default 0)")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_ranks)

    b = sub.add_parser("bench", help="small built-in timing",
                       description="Time the softmax particle field on the CPU backends and a "
                                   "batched Gaussian solve; --scripts runs the project's "
                                   "benchmark scripts in benchmarks/ instead.")
    b.add_argument("--full", action="store_true",
                   help="larger token counts (slower); with --scripts, the full benchmarks")
    b.add_argument("--scripts", action="store_true",
                   help="run the project's benchmarks/*.py (with --quick unless --full); each "
                        "prints its table and writes benchmarks/results/<name>.json")
    b.add_argument("--out", default=None, help="directory for bench.json (optional)")
    b.add_argument("--backends", nargs="+", choices=("numpy", "numba"),
                   help="CPU backends to time (default: those available of numpy, numba)")
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``transformer-pde`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except ConfigError as exc:
        sys.stderr.write(f"transformer-pde {args.command}: configuration error: {exc}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
