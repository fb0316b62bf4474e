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

__all__ = ["ConfigError", "main", "load_config", "count_clusters", "covariance_rank",
           "build_attention"]

logger = logging.getLogger(__name__)

#: relative single-linkage scale of the demo's cluster count (fraction of the RMS radius)
DEMO_CLUSTER_SCALE = 0.05
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


def _diagnostics() -> Any:
    """The diagnostics module if it is available (it is optional for the CLI)."""
    try:
        from . import diagnostics  # noqa: PLC0415
    except ImportError:
        return None
    return diagnostics


def count_clusters(X: Any, rel_scale: float = DEMO_CLUSTER_SCALE) -> tuple[int, np.ndarray]:
    r"""Number of clusters of a point cloud by single linkage at a scale relative to the cloud.

    Two points are in the same cluster when a chain of points joins them with every link
    shorter than :math:`\delta = \text{rel\_scale}\cdot r`, with
    :math:`r = (\frac1N\sum_i |x_i - \bar x|^2)^{1/2}` the RMS radius of the cloud (so
    the count does not change when the cloud is rescaled).

    Returns
    -------
    (int, ndarray of int)
        The number of clusters and each point's label (0, 1, ...).
    """
    from scipy.cluster.hierarchy import fcluster, linkage  # noqa: PLC0415

    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"X must have shape (N, d) with N >= 1, got {X.shape}")
    if not (math.isfinite(rel_scale) and rel_scale > 0):
        raise ValueError(f"rel_scale must be finite and > 0, got {rel_scale!r}")
    if X.shape[0] == 1:
        return 1, np.zeros(1, dtype=int)
    r = float(np.sqrt(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1))))
    if r == 0.0:
        return 1, np.zeros(X.shape[0], dtype=int)
    labels = fcluster(linkage(X, "single"), rel_scale * r, "distance") - 1
    return int(labels.max() + 1), labels.astype(int)


def covariance_rank(X_or_cov: Any, rtol: float = RANK_RTOL, *, is_cov: bool = False) -> int:
    r"""Numerical rank of a covariance: the number of eigenvalues above ``rtol`` times the largest.

    ``X_or_cov`` is a point cloud (N, d) (its weighted-uniform covariance is used) or,
    with ``is_cov=True``, a covariance matrix.
    """
    A = np.asarray(X_or_cov, dtype=float)
    S = A if is_cov else np.atleast_2d(np.cov(A.T, bias=True))
    ev = np.linalg.eigvalsh(0.5 * (S + S.T))
    top = float(ev.max()) if ev.size else 0.0
    if not top > 0:
        return 0
    return int(np.sum(ev > rtol * top))


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
            raise ConfigError(f"{self.key(k)}: expected a list of {n} numbers, got shape {arr.shape}")
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
def _clusters(X: np.ndarray, rel_scale: float) -> tuple[int, np.ndarray]:
    """Cluster count: ``diagnostics.clusters`` when available, else :func:`count_clusters`."""
    diag = _diagnostics()
    fn = getattr(diag, "clusters", None) if diag is not None else None
    if fn is not None:
        try:
            res = fn(X, rel_scale=rel_scale)
            labels = np.asarray(getattr(res, "labels", res), dtype=int)
            if labels.shape == (X.shape[0],):
                return int(np.unique(labels).size), labels
        except TypeError:
            logger.debug("diagnostics.clusters has another signature; using scipy single linkage")
    return count_clusters(X, rel_scale)


def run_demo(out: str | Path = "transformer-pde-demo", *, n: int = 256, seed: int = 0,
             t_max: float = 6.0, dt: float = 0.05, backend: str = "numpy",
             gif: bool = False, rel_scale: float = DEMO_CLUSTER_SCALE) -> dict:
    r"""Run the demo and write its files; returns the summary dictionary.

    Tokens :math:`x_i(0) \sim N(0, I_2)`, :math:`N = 256`, softmax attention with
    :math:`Q = K = V = I`, integrated with RK4 (:math:`h = 0.05`) to :math:`t = 6`.
    With :math:`V = I` the tokens grow like :math:`e^{t}`; in the co-moving frame
    :math:`z = e^{-t} x` they collapse onto a few clusters at vertices of a convex polygon
    (Geshkovski, Letrouit, Polyanskiy, Rigollet 2023).  Clusters are counted by single
    linkage at ``rel_scale`` times the RMS radius of the final cloud.
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
    k_final, labels = _clusters(Z[-1], rel_scale)
    counts = [_clusters(z, rel_scale)[0] for z in Z]
    rank = covariance_rank(Z[-1])
    fig = Figure(figsize=(10.5, 4.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    plot.particles(Z, labels=labels, ax=ax1,
                   title=f"softmax attention, Q=K=V=I: {k_final} clusters")
    ax1.set_xlabel(r"$(e^{-t}x)_1$")
    ax1.set_ylabel(r"$(e^{-t}x)_2$")
    ax2.step(traj.times, counts, where="post", color="C0")
    ax2.set_yscale("log")
    ax2.set_xlabel("depth t")
    ax2.set_ylabel(f"clusters (single linkage, {rel_scale:g} x RMS radius)")
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
        "clusters_final": k_final, "cluster_scale": rel_scale,
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
        f"  final number of clusters: {k_final} (single linkage at {rel_scale:g} x RMS radius, "
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
    ``run``, ``output``); writes ``trajectory.npz``, ``summary.json`` and ``particles.png``."""
    from . import plot  # noqa: PLC0415
    from .particles import simulate  # noqa: PLC0415

    _Section(cfg, "config", ("attention", "tokens", "run", "output", "title"))
    att = build_attention(cfg.get("attention"))
    X0 = build_tokens(cfg.get("tokens"), att.d)
    run = _Section(cfg.get("run"), "run", _RUN_KEYS)
    outp = _Section(cfg.get("output"), "output", _OUT_KEYS)
    rescale_opt = outp.choice("rescale", "none", ("none", "value"))
    rel = outp.number("cluster_scale", DEMO_CLUSTER_SCALE, positive=True)
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
        "covariance_rank": covariance_rank(final), "covariance_rank_rtol": RANK_RTOL,
        "max_abs_final": float(np.max(np.abs(traj.final))), "files": files,
    }
    _write_json(outdir / "summary.json", summary)
    return summary


def _cmd_simulate(args: argparse.Namespace) -> int:
    s = run_simulate(load_config(args.config), args.out, progress=not args.quiet)
    sys.stdout.write(f"simulate: {s['status']} ({s['message']}); {s['clusters_final']} clusters, "
                     f"covariance rank {s['covariance_rank']}; files in {args.out}: "
                     f"{', '.join(s['files'].values())}, summary.json\n")
    return 0 if s["status"] == "ok" else 1


# =========================================================================== main
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

    s = sub.add_parser("simulate", help="particle simulation from a TOML file",
                       description="Simulate tokens from CONFIG.toml (tables [attention], "
                                   "[tokens], [run], [output]); write trajectory.npz, "
                                   "summary.json and particles.png.")
    s.add_argument("config", help="TOML configuration (see examples/configs/simulate.toml)")
    s.add_argument("--out", default="transformer-pde-simulate", help="output directory")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=_cmd_simulate)
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
