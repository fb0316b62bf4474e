"""Text and HTML summaries of results: a few lines, never the arrays, HTML escaped."""

import html
import warnings

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import results_display as display
from transformer_pde.gaussian.batch import GaussianBatch, solve_batch
from transformer_pde.gaussian.trajectory import solve
from transformer_pde.particles import ParticleTrajectory

HOSTILE = "<script>alert('x')</script> & more"


def _att(d=3):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=1.0)


@pytest.fixture(scope="module")
def batch24():
    """A 24-member batch with the arrays of a real one (built directly: solving 24 members
    without numba takes seconds; the summary only reads the fields)."""
    rng = np.random.default_rng(0)
    B, T, d = 24, 41, 3
    status = np.array(["blowup"] * 15 + ["converged"] * 6 + ["ok"] * 3)
    t_eval = np.linspace(0.0, 2.0, T)
    blow = np.where(status == "blowup", rng.uniform(0.3, 1.9, B), np.nan)
    covs = np.stack([np.eye(d)] * B) * rng.uniform(0.1, 2, (B, 1, 1))
    traj_c = np.repeat(covs[:, None], T, axis=1)
    return GaussianBatch(status, blow, np.where(np.isnan(blow), 2.0, blow),
                         rng.normal(size=(B, d)), covs, covs / 3, rng.integers(20, 90, B),
                         t_eval, rng.normal(size=(B, T, d)), traj_c,
                         [f"member {i}: fine" for i in range(B)])


def test_a_solved_batch_has_the_same_summary_layout():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = solve_batch(_att(2), np.zeros((2, 2)), np.stack([np.eye(2) * 0.1, np.eye(2)]),
                        t_max=1.0, use_numba=False)
    lines = repr(b).splitlines()
    assert lines[0] == "GaussianBatch(members=2, d=2)" and len(lines) <= 8
    assert "none (final states only)" in repr(b)


@pytest.fixture(scope="module")
def particles():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(9, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return tp.simulate(_att(), X, t_max=1.0, dt=0.1, block=tp.Block(constraint="sphere"))


def _no_array_dump(text):
    """No numpy array printout: arrays print as 'array(' or bracketed rows of numbers."""
    return "array(" not in text and "[[" not in text and "e-01" not in text


def test_a_24_member_batch_is_summarised_in_under_15_lines(batch24):
    text = repr(batch24)
    lines = text.splitlines()
    assert len(lines) < 15, text
    assert lines[0] == "GaussianBatch(members=24, d=3)"
    counts = batch24.counts()
    # the status row is the counts of the members, largest first
    status_row = next(ln for ln in lines if ln.strip().startswith("status"))
    for k, v in counts.items():
        assert (f"{v} {k}" in status_row) == (v > 0)
    assert "0 … 2 (41 times)" in text and _no_array_dump(text)
    assert str(batch24) == text


def test_gaussian_trajectory_summary_states_the_status_times_and_shapes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = solve(_att(), np.zeros(3), np.eye(3), t_max=2.0)
    text = repr(r)
    assert text.splitlines()[0] == f"GaussianTrajectory(status='{r.status}', d=3)"
    assert f"({len(r.times)} saved)" in text
    assert f"({len(r.times)}, 3, 3) float64" in text and _no_array_dump(text)
    assert len(text.splitlines()) <= 10
    if r.status == "blowup":
        assert f"blowup_time    {r.blowup_time:.4g}" in text


def test_particle_trajectory_summary(particles):
    text = repr(particles)
    lines = text.splitlines()
    assert lines[0] == "ParticleTrajectory(status='ok', saved=11, N=9, d=3)"
    assert "(11, 9, 3) float64" in text and "softmax" in text and "rk4" in text
    assert _no_array_dump(text) and len(lines) <= 10


def test_html_escapes_every_text_and_holds_the_same_rows(particles):
    tr = ParticleTrajectory(particles.times, particles.states, particles.weights, None, "ok",
                            HOSTILE, attention=particles.attention, info=particles.info)
    out = tr._repr_html_()
    assert "<script>" not in out and html.escape(HOSTILE) in out
    assert out.count("<tr>") == len(repr(tr).splitlines()) - 1
    assert HOSTILE in repr(tr)          # the text repr keeps the message as it is


def test_html_of_gaussian_results_is_a_table(batch24):
    out = batch24._repr_html_()
    assert out.startswith("<div") and "<table>" in out and "GaussianBatch(members=24" in out
    member = batch24[0]
    assert "<table>" in member._repr_html_() and "GaussianTrajectory" in member._repr_html_()


def test_long_messages_are_cut_to_one_line():
    text = display.summary_text("T", [("message", "word\nword " * 100)])
    (row,) = text.splitlines()[1:]
    assert row.endswith("…") and len(row) <= display.MAX_TEXT + 20


@pytest.mark.parametrize("values, expected", [
    ([], "none finite"), ([np.nan, 2.0], "2"),
    ([1.0, 2.0, 4.0, np.inf], "min 1, median 2, max 4 (3 finite)")])
def test_stats_text(values, expected):
    assert display.stats_text(values) == expected


def test_time_span_and_counts():
    assert display.time_span([]) == "none"
    assert display.time_span([0.5]) == "0.5 (1 saved)"
    assert display.time_span(np.linspace(0, 3, 4), "times") == "0 … 3 (4 times)"
    assert display.counts_text({"ok": 1, "blowup": 3, "failed": 0}) == "3 blowup, 1 ok"
    assert display.counts_text({"ok": 0}) == "none"


# ------------------------------------------------------------------ other results
def _check_summary(obj, title_start, must, max_lines=10):
    text = repr(obj)
    lines = text.splitlines()
    assert lines[0].startswith(title_start), text
    assert len(lines) <= max_lines and _no_array_dump(text), text
    for piece in must:
        assert piece in text, (piece, text)
    out = obj._repr_html_()
    assert out.count("<tr>") == len(lines) - 1 and "<table>" in out


def test_ensemble_summary():
    from transformer_pde.particles.ensemble import simulate_ensemble
    rng = np.random.default_rng(2)
    X = rng.normal(size=(4, 5, 3))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    ens = simulate_ensemble(_att(), X, t_max=0.5, dt=0.1, block=tp.Block(constraint="sphere"))
    _check_summary(ens, f"EnsembleTrajectory(status='ok', saved={len(ens.times)}, B=4, n=5",
                   ["(6, 4, 5, 3) float64", "0 … 0.5 (6 saved)"])


def test_meanfield_solution_summaries():
    from transformer_pde.meanfield.circle import solve_circle
    from transformer_pde.meanfield.line import solve_line
    from scipy import stats
    sol = solve_circle(lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi), 1.0,
                       np.linspace(0.0, 0.5, 3))
    _check_summary(sol, f"CircleSolution(status='{sol.status}', model='sa', beta=1, saved=3",
                   ["0 … 0.5 (3 saved)", f"{sol.theta.size} angles"])
    line = solve_line(stats.norm(0.0, 0.5), np.linspace(0.0, 0.5, 3), n_nodes=41)
    _check_summary(line, f"LineSolution(status='{line.status}', saved=3, nodes=41",
                   ["(3, 41) float64", "beta=1"])


def test_reduction_summaries():
    from transformer_pde import reductions as red
    eq = red.equiangular(1.0, 8, 0.2, np.linspace(0.0, 3.0, 7))
    _check_summary(eq, "EquiangularSolution(model='sa', beta=1, n=8)",
                   [f"0.2 → {display.number(eq.rho[-1])}", "(7 times)"])
    pair = red.causal_pair(1.0, 0.1, np.linspace(0.0, 2.0, 5))
    _check_summary(pair, "CausalPair(beta=1, rho0=0.1)", [f"→ {display.number(pair.rho[-1])}"])
    G0 = red.random_gram(5, 3, np.random.default_rng(0))
    flow = red.gram_flow(G0, 1.0, np.linspace(0.0, 1.0, 4))
    _check_summary(flow, "GramFlow(status='ok', model='sa', beta=1)", ["(4, 5, 5) float64"])


def test_clusters_summary():
    from transformer_pde.diagnostics.clustering import clusters
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(0, 1e-3, (6, 2)) + c for c in ([0, 0], [5, 0], [0, 5])])
    cl = clusters(X)
    _check_summary(cl, "Clusters(n_clusters=3, N=18)", ["0.3333, 0.3333, 0.3333", "(3, 2) float64"])
    many = type(cl)(np.arange(12), np.zeros((12, 2)), np.full(12, 1 / 12), 0.0)
    assert "0.08333, …" in repr(many)   # at most 8 masses shown


def test_progress_bars_come_from_tqdm_auto(monkeypatch):
    """``progress=True`` draws through ``tqdm.auto`` (a widget in notebooks, text in a
    terminal)."""
    import tqdm.auto
    from transformer_pde.integrate.loop import Progress
    made = []

    class FakeBar:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.n = kwargs.get("initial", 0.0)

        def update(self, dt):
            self.n += dt

        def close(self):
            made.append("closed")
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    bar = Progress(total=2.0, enabled=True, every=1e9, desc="run")
    bar.update(0.5)
    bar.update(2.0)
    bar.close()
    assert made[0]["total"] == 2.0 and made[-1] == "closed" and bar.bar.n == 2.0


def test_every_summarised_class_keeps_the_summary_repr():
    """A dataclass that inherits ``Summarised`` without ``repr=False`` would print its
    fields (arrays included): every subclass in the package must keep the mixin's
    ``__repr__`` and ``_repr_html_``."""
    import importlib
    import pkgutil

    for mod in pkgutil.walk_packages(tp.__path__, "transformer_pde."):
        if not mod.name.endswith("__main__"):      # __main__ runs the CLI
            importlib.import_module(mod.name)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    found = list(subclasses(display.Summarised))
    assert len(found) >= 6
    for cls in found:
        assert cls.__repr__ is display.Summarised.__repr__, cls
        assert cls._repr_html_ is display.Summarised._repr_html_, cls
