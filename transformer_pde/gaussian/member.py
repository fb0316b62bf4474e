r"""The setup of the integrator of :func:`~transformer_pde.gaussian.solve_batch`
(:mod:`~transformer_pde.gaussian.lockstep`: DOP853 on the reparametrised moment system of
each member, with its own step control and events): the parameter tables of the members,
the settings array and :func:`run_members`, which runs the integrator compiled by numba
(members in SIMD lanes, chunks of a large batch on numba's threads) or, with
``compiled=False`` or without numba, interpreted member
by member: the very same code, so ``solve_batch(..., use_numba=False)`` takes the same
steps as the compiled path and differs from it only by rounding (the compiled and the
interpreted ``exp`` / ``log`` may differ in the last bit: a few ulps per step, amplified
over a run like any perturbation of the initial value).

Arguments are grouped: the parameters of a member as a table ``prm`` (segment, head,
[value map, score matrix, key Gram matrix], d, d) with constants ``con = [kind code,
kappa, 2 l2_beta, eps]``; the stops as ``(3, n)`` tables ``[time, output row or -1,
parameter segment]``; the controller and tolerances in ``ctl`` (indices
``lockstep.CTL_*``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..attention import Attention
from ..integrate.controller import PIController, initial_step
from ..integrate.tableaux import DOP853
from . import lockstep
from .member_field import KIND_CODES
from .system import MomentSystem

__all__ = ["PAR_MIN_MEMBERS", "controls", "param_table", "run_members"]

try:  # numba is optional: without it the interpreter runs the same code
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None

#: Batches at least this large run their members on numba's threads (chunks of members).
PAR_MIN_MEMBERS = 256


def param_table(atts: Sequence[Attention], kind: str, bounds: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(prm, con)`` of the integrator (:mod:`.lockstep`) for every parameter set (one, or one per
    member): ``prm`` (P, segments, H, 3, d, d) holds per segment and head ``[W_O E_h V_h,
    beta K_h^T Q_h, K_h^T K_h]`` (the last only for ``l2``), ``con`` (P, 4) ``[kind code,
    kappa, 2 l2_beta, eps]``.  The segments are the intervals between ``bounds`` (layer
    breakpoints, sorted), evaluated at interior points (``t = 0`` without breakpoints)."""
    nb = bounds.size
    ts = [0.0] if nb == 0 else (
        [0.5 * bounds[0]] + [0.5 * (bounds[j - 1] + bounds[j]) for j in range(1, nb)]
        + [bounds[-1] + 1.0])
    prm, con = [], []
    for a in atts:
        rows = []
        for t in ts:
            p = a.at(float(t))
            W = np.eye(a.d) if p.W_O is None else p.W_O
            rows.append([np.stack([W[:, hd.rows] @ hd.V, p.beta * hd.A,
                                   hd.K.T @ hd.K if kind == "l2" else np.zeros((a.d, a.d))])
                         for hd in p.heads])
        prm.append(rows)
        p0 = a.at(0.0)
        con.append([KIND_CODES[kind], 0.0, 2.0 * p0.l2_beta, p0.eps])
    return np.ascontiguousarray(prm, dtype=float), np.array(con, dtype=float)


def controls(rtol: float, atol: float, log_thr: float, log_thr_c: float, converge_tol: float,
             conv_mode: int, budget: int) -> np.ndarray:
    """The settings array ``ctl`` of the integrator (indices ``lockstep.CTL_*``), with the
    package's PI controller for DOP853's error order."""
    ctrl = PIController(DOP853.error_order)
    return np.array([rtol, atol, log_thr, log_thr_c, converge_tol, conv_mode, budget,
                     ctrl.alpha, ctrl.beta, ctrl.safety, ctrl.fmin, ctrl.fmax], dtype=float)


def run_members(sysm: MomentSystem, Y: np.ndarray, traj: np.ndarray, prm: np.ndarray,
                con: np.ndarray, stops: np.ndarray, stops_c: np.ndarray, ctl: np.ndarray,
                atol_vec: np.ndarray, compiled: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Integrate every member of ``Y`` (rows of packed states at ``t = 0``, replaced by the
    final states) with the integrator of :mod:`.lockstep`: compiled (in SIMD lanes; on
    numba's threads from :data:`PAR_MIN_MEMBERS` members on) or interpreted (member by
    member); ``traj`` (B, T, n) receives the states at the output stops.  The first trial
    steps are the package's heuristic
    (:func:`~transformer_pde.integrate.controller.initial_step`) on ``sysm``'s field.
    Returns ``(code, n_steps, Yc, continuation code)`` per member."""
    B = Y.shape[0]
    con = con.copy()
    con[:, 1] = sysm.kappa
    idx = np.arange(B)
    h0 = np.ascontiguousarray(initial_step(Y, sysm.rhs(Y, idx), ctl[lockstep.CTL_RTOL],
                                           atol_vec, f=lambda z: sysm.rhs(z, idx),
                                           error_order=DOP853.error_order))
    codes = np.zeros((B, 3), dtype=np.int64)
    Yc = np.empty_like(Y)
    threads = _nb.get_num_threads() if _nb is not None and B >= PAR_MIN_MEMBERS else 1
    lockstep.run(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec,
                 (DOP853.A, DOP853.b, DOP853.e, DOP853.e_aux), codes,
                 sysm.kind in ("l2", "sinkhorn"), threads, compiled=compiled)
    return codes[:, 0], codes[:, 2], Yc, codes[:, 1]
