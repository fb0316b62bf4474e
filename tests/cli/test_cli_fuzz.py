"""Property test of the command line's rule (issues 13 and 40): whatever a configuration
holds, the command ends with a documented exit status -- for a configuration, 0, 1 or 2,
never "computation failed" (4) or an internal error -- and never a traceback; a refused
configuration writes nothing and its one-line message names a key of the file."""

from __future__ import annotations

import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from transformer_pde import cli  # noqa: E402

#: a tiny valid run; each example replaces or adds one key
BASE = {
    "attention": {"kind": "softmax", "d": 2, "V": -1.0},
    "tokens": {"n": 5, "seed": 1},
    "run": {"t_max": 0.2, "dt": 0.1},
    "field": {"backend": "numpy"},
    "limits": {},
    "output": {"figure": False},
}
KEYS = {
    "attention": ["kind", "d", "heads", "beta", "eps", "l2_beta", "masked", "Q", "K", "V", "W_O",
                  "seed", "score_scale", "bogus"],
    "tokens": ["n", "distribution", "mean", "std", "cov", "seed", "file", "bogus"],
    "run": ["t_max", "dt", "solver", "save_every", "save_at", "method", "bogus"],
    "field": ["backend", "dtype", "sinkhorn_tol", "sinkhorn_max_iter", "bogus"],
    "limits": ["max_norm", "max_steps", "max_memory", "bogus"],
    "block": ["constraint", "splitting", "mlp", "layernorm", "bogus"],
    "output": ["rescale", "cluster_scale", "figure", "gif", "bogus"],
}

scalars = st.one_of(
    st.sampled_from([0, 1, 2, 3, -1, 2 ** 62, -(2 ** 63), 10 ** 9]),
    st.sampled_from([0.0, -0.0, 0.5, -1.5, 1e-300, 1e300, math.inf, -math.inf, math.nan]),
    st.sampled_from([True, False]),
    st.sampled_from(["", "identity", "zeros", "rk4", "dopri5", "sphere", "numba", "auto",
                     "1/sqrt(d)", "float32", "gaussian", "none", "x", "é", "1.0", "softmax",
                     "sinkhorn", "l2", "post", "lie"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["random", "diag", "seed", "scale", "name", "rtol",
                                     "hidden", "mode", "bogus"]), inner, max_size=3)),
    max_leaves=6)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"


def _document(cfg: dict) -> str:
    lines = []
    for table, entries in cfg.items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {_toml(v)}" for k, v in entries.items()]
    return "\n".join(lines) + "\n"


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(table=st.sampled_from(sorted(KEYS)), data=st.data(), value=values)
def test_any_single_key_ends_cleanly(tmp_path_factory, table, data, value):
    key = data.draw(st.sampled_from(KEYS[table]))
    cfg = {t: dict(v) for t, v in BASE.items()}
    cfg.setdefault(table, {})[key] = value
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "c.toml"
    path.write_text(_document(cfg), encoding="utf-8")
    out = tmp / "o"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["simulate", str(path), "--out", str(out), "-q"])
    text = err.getvalue()
    # a tiny run has nothing to fail on: whatever one key holds is answered (0, 1) or
    # refused as configuration (2) -- never "computation failed" (4) or a bug (5)
    assert rc in {cli.ExitCode.OK, cli.ExitCode.UNSUCCESSFUL, cli.ExitCode.USAGE}, text
    assert "Traceback" not in text
    if rc == cli.ExitCode.USAGE:
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1, text
        assert f"{table}." in lines[0] or f"{table}:" in lines[0] or "tokens" in lines[0], text
        assert not out.exists()
