r"""Solver objects for :math:`\dot y = F(t, y)`: each carries its own options.

Two protocols say what a solver is (a user's own object works wherever it satisfies one):
both have ``name``, ``order``, ``adaptive`` and ``multistep`` and a ``reset()`` (called at
the start of a run and where the history must not reach across a jump), and

* :class:`Solver` (``adaptive = False``, fixed steps): ``step(f, t, y, h) -> y_next``;
* :class:`AdaptiveSolver` (``adaptive = True``, embedded pairs):
  ``attempt(f, t, y, h, fy) -> (y_next, err, f_next)``, where ``err`` is the scaled error
  norm (accept when ``<= 1``) and ``f_next`` the field at the new point
  (first-same-as-last), and ``controller()``, a fresh :class:`~.controller.PIController`
  with exponents from the pair's error order.

:func:`get_solver` checks an object against them (:func:`check_solver`); past it, callers
read ``solver.adaptive`` and ``solver.name`` directly.

The explicit Runge–Kutta methods are all the one stepper of :mod:`~.rk` driven by a
:class:`~.tableaux.ButcherTableau`.  Plain names select a solver with default options
(:data:`SOLVERS`, :func:`get_solver`): ``simulate(..., solver="dopri5")`` is
``simulate(..., solver=Dopri5())``; options go on the object, ``Dopri5(rtol=1e-8)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, SolverNotConverged
from ..validation import integer, nonnegative, positive
from .controller import PIController
from ..backends import array_namespace
from .rk import rk_attempt, rk_step
from .tableaux import CLASSICAL_RK4, DOP853, DOPRI5, EULER, HEUN, ButcherTableau

__all__ = ["SOLVERS", "AdamsBashforth", "AdaptiveSolver", "Dop853", "Dopri5",
           "EmbeddedRungeKutta", "Euler", "ExplicitRungeKutta", "Heun", "ImplicitMidpoint",
           "RK4", "Solver", "SolverNotConverged", "STATE_VERSION", "adams_bashforth_weights",
           "check_solver", "get_solver", "restore_solver_state", "solver_state"]

Field = Callable[[float, Any], Any]


@runtime_checkable
class Solver(Protocol):
    """A fixed-step solver (``adaptive = False``): :meth:`step` advances by a given ``h``."""

    #: the method's name, recorded in a trajectory's ``info["method"]``
    name: str
    #: order of accuracy
    order: int
    #: ``False``: the time loop chooses the steps
    adaptive: bool
    #: ``True`` when the solver keeps a history of past steps (Adams–Bashforth)
    multistep: bool

    def reset(self) -> None:
        """Forget any history (start of a run, a jump of the field's parameters)."""

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        """One step of size ``h`` from ``(t, y)``: the state at ``t + h``."""


@runtime_checkable
class AdaptiveSolver(Protocol):
    """An embedded pair (``adaptive = True``): :meth:`attempt` proposes a step and its error,
    a :class:`~.controller.PIController` from :meth:`controller` sizes the next one."""

    name: str
    order: int
    adaptive: bool
    multistep: bool

    def reset(self) -> None:
        """Forget any history (start of a run, a jump of the field's parameters)."""

    def controller(self) -> PIController:
        """A fresh step-size controller for one run."""

    def attempt(self, f: Field, t: float, y: Any, h: float, fy: Any) -> tuple[Any, float, Any]:
        """Trial step ``(y_new, err, f_new)`` from ``(t, y)`` with ``fy = f(t, y)``."""


def _members(protocol: type) -> list[str]:
    """The attributes and methods a protocol asks for, in the order it declares them."""
    return [*protocol.__annotations__,
            *(k for k, v in vars(protocol).items() if callable(v) and not k.startswith("_"))]


def check_solver(solver: Any, name: str = "solver") -> Solver | AdaptiveSolver:
    """``solver`` itself if it satisfies :class:`Solver` (``adaptive`` false) or
    :class:`AdaptiveSolver` (``adaptive`` true).

    Raises
    ------
    ArgumentTypeError
        Naming ``name`` and the attributes or methods the object lacks (an object whose
        ``adaptive`` is true is held to :class:`AdaptiveSolver`, any other to
        :class:`Solver`)."""
    adaptive = bool(getattr(solver, "adaptive", False))
    protocol: type = AdaptiveSolver if adaptive else Solver
    if isinstance(solver, protocol):
        return solver
    missing = [m for m in _members(protocol) if not hasattr(solver, m)]
    raise ArgumentTypeError(
        f"{name} must be a solver name ({', '.join(sorted(SOLVERS))}) or an object of the "
        f"{protocol.__name__} protocol of transformer_pde.integrate.solvers; "
        f"{type(solver).__name__} lacks {', '.join(missing)}")

#: version of the plain data returned by the solvers' ``get_state()``
STATE_VERSION = 1


def _check_state(solver: Any, state: Any, keys: tuple[str, ...]) -> None:
    """Refuse solver state data of another version or with other keys."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{solver!r}: solver state version {got!r} is not supported "
                         f"(expected {STATE_VERSION})")
    if set(state) != {"version", *keys}:
        raise ValueError(f"{solver!r}: solver state has keys {sorted(state)}, expected "
                         f"{sorted({'version', *keys})}")


def solver_state(solver: Any) -> dict[str, Any]:
    """What a checkpoint keeps of ``solver``: ``solver.get_state()``, plain versioned data.

    A solver object that keeps nothing between steps may have no ``get_state``; its state
    is then the empty mapping ``{}``."""
    get = getattr(solver, "get_state", None)
    return {} if get is None else get()


def restore_solver_state(solver: Any, state: dict[str, Any]) -> None:
    """Restore :func:`solver_state`'s data into ``solver`` (``solver.set_state(state)``).

    Raises
    ------
    ValueError
        Data of another version or shape, or non-empty data for a solver object without
        ``set_state``."""
    restore = getattr(solver, "set_state", None)
    if restore is not None:
        restore(state)
    elif state != {}:
        raise ValueError(f"{solver!r} keeps no state, but the checkpoint holds solver state "
                         f"{str(state)[:60]}")


class _TableauMethod:
    """What the Runge–Kutta solvers share: a tableau, its name and order, no history."""

    multistep = False

    def __init__(self, tableau: ButcherTableau):
        self.tableau = tableau
        self.name = tableau.name
        self.order = tableau.order

    def reset(self) -> None:
        """No history to forget."""

    def get_state(self) -> dict[str, Any]:
        """What a checkpoint must keep: plain data with a ``"version"`` (no history; an
        adaptive run's step-size memory is part of the loop state)."""
        return {"version": STATE_VERSION}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version)."""
        _check_state(self, state, ())


class ExplicitRungeKutta(_TableauMethod):
    """Fixed-step explicit Runge–Kutta method given by a Butcher tableau."""

    adaptive = False

    def __init__(self, tableau: ButcherTableau):
        if not isinstance(tableau, ButcherTableau):
            raise ArgumentTypeError(
                f"tableau must be a ButcherTableau, got {type(tableau).__name__}")
        super().__init__(tableau)

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        """One step of size ``h`` from ``(t, y)``."""
        return rk_step(self.tableau, f, t, y, h)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Euler(ExplicitRungeKutta):
    r"""Explicit Euler, order 1: :math:`y_{n+1} = y_n + h F(t_n, y_n)`.

    With ``h = 1`` one step is exactly one residual attention layer
    :math:`x \leftarrow x + \mathrm{Attn}(x)`."""

    def __init__(self) -> None:
        super().__init__(EULER)


class Heun(ExplicitRungeKutta):
    r"""Heun's method (explicit trapezoidal rule, RK2), order 2.

    .. math:: k_1 = F(t_n, y_n),\quad k_2 = F(t_n + h, y_n + h k_1),\quad
              y_{n+1} = y_n + \tfrac{h}{2}(k_1 + k_2).
    """

    def __init__(self) -> None:
        super().__init__(HEUN)


class RK4(ExplicitRungeKutta):
    """Classical fourth-order Runge–Kutta."""

    def __init__(self) -> None:
        super().__init__(CLASSICAL_RK4)


class EmbeddedRungeKutta(_TableauMethod):
    r"""Adaptive embedded Runge–Kutta pair given by a Butcher tableau with error weights.

    The error estimate is scaled componentwise by
    :math:`\mathrm{atol} + \mathrm{rtol}\max(|y_n|, |y_{n+1}|)` (see
    :func:`~.rk.error_norm`); steps are accepted when the scaled norm is :math:`\le 1` and
    sized by a :class:`~.controller.PIController`.

    Parameters
    ----------
    tableau : ButcherTableau
        An embedded FSAL pair (``tableau.adaptive``).
    rtol : float, default 1e-6
        Relative tolerance (> 0).
    atol : float, default 1e-9
        Absolute tolerance (>= 0).
    """

    adaptive = True

    def __init__(self, tableau: ButcherTableau, rtol: float = 1e-6, atol: float = 1e-9):
        if not isinstance(tableau, ButcherTableau) or not tableau.adaptive or not tableau.fsal:
            raise ArgumentError("tableau must be an embedded first-same-as-last pair")
        super().__init__(tableau)
        self.rtol = positive("rtol", rtol)
        self.atol = nonnegative("atol", atol)

    def controller(self) -> PIController:
        """A fresh step-size controller with exponents from the error order."""
        return PIController(self.tableau.error_order)

    def attempt(self, f: Field, t: float, y: Any, h: float, fy: Any):
        """Trial step: ``(y_new, err, f_new)`` (see :func:`~.rk.rk_attempt`)."""
        return rk_attempt(self.tableau, f, t, y, h, fy, self.rtol, self.atol)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rtol={self.rtol:g}, atol={self.atol:g})"


class Dopri5(EmbeddedRungeKutta):
    """Dormand–Prince 5(4) with first-same-as-last (the pair of ``ode45`` / ``RK45``)."""

    def __init__(self, rtol: float = 1e-6, atol: float = 1e-9):
        super().__init__(DOPRI5, rtol, atol)


class Dop853(EmbeddedRungeKutta):
    """Dormand–Prince 8(5,3) of Hairer's DOP853: efficient at tight tolerances."""

    def __init__(self, rtol: float = 1e-6, atol: float = 1e-9):
        super().__init__(DOP853, rtol, atol)


def adams_bashforth_weights(steps: Any) -> np.ndarray:
    r"""Variable-step Adams–Bashforth weights.

    For the past step sizes ``steps = (h_n, h_{n-1}, ..., h_{n-k+1})`` (newest first, with
    :math:`h_n` the step about to be taken) the :math:`k`-step method is

    .. math:: y_{n+1} = y_n + h_n \sum_{i=0}^{k-1} b_i F(t_{n-i}, y_{n-i}),

    where :math:`b_i = \frac{1}{h_n}\int_{t_n}^{t_n+h_n} \ell_i(\tau)\,d\tau` and
    :math:`\ell_i` is the Lagrange basis polynomial of the nodes :math:`t_n, t_{n-1}, \dots`.
    Equivalently :math:`\sum_i b_i \tau_i^m = h_n^m/(m+1)` for :math:`m < k` with
    :math:`\tau_i = t_{n-i} - t_n`, solved here in units of :math:`h_n`.  For equal steps
    this gives the classical weights, e.g. ``(3/2, -1/2)`` and ``(23/12, -16/12, 5/12)``.
    """
    h = np.asarray(steps, dtype=float)
    k = h.size
    if k < 1 or np.any(h <= 0):
        raise ArgumentError(f"steps must be a non-empty sequence of positive numbers, got {steps!r}")
    # node offsets tau_i / h_n: 0, -h_{n-1}/h_n, -(h_{n-1}+h_{n-2})/h_n, ...
    tau = -np.concatenate([[0.0], np.cumsum(h[1:])]) / h[0]
    Vm = np.vander(tau, k, increasing=True).T          # row m: tau_i^m
    rhs = 1.0 / np.arange(1, k + 1)
    return np.linalg.solve(Vm, rhs)


class AdamsBashforth:
    r"""Explicit :math:`k`-step Adams–Bashforth method (order :math:`k`), variable step.

    Keeps the last :math:`k` field values; weights come from
    :func:`adams_bashforth_weights`, so the final partial step of a run (or any change
    of ``h``) keeps the order.  The first :math:`k-1` steps (and any step that does not
    continue the previous one, e.g. after :meth:`reset` or a jump in ``t``) are taken
    with :class:`RK4`, whose local error :math:`O(h^5)` does not spoil the order.

    Multistep history belongs to one trajectory: the method cannot be used inside
    operator splitting, where another flow moves the state between its steps.

    Parameters
    ----------
    k : int
        Number of steps, 1 to 5 (``"ab2"`` and ``"ab3"`` select 2 and 3).
    """

    adaptive = False
    multistep = True

    def __init__(self, k: int):
        self.k = integer("k", k, minimum=1, maximum=5)
        self.order = self.k
        self.name = f"ab{self.k}"
        self._start = RK4()
        self.reset()

    def reset(self) -> None:
        """Forget the history (the next steps restart with RK4)."""
        self._fs: list[Any] = []     # newest first
        self._hs: list[float] = []   # sizes of the steps that led to each stored node
        self._t_next: float | None = None

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        """One step of size ``h`` from ``(t, y)``."""
        if self._t_next is None or abs(t - self._t_next) > 1e-9 * h:
            self.reset()
        fy = f(t, y)
        self._fs.insert(0, fy)
        del self._fs[self.k:]
        if len(self._fs) < self.k:
            y_new = self._start.step(f, t, y, h)
        else:
            b = adams_bashforth_weights([h] + self._hs[:self.k - 1])
            incr = b[0] * self._fs[0]
            for bi, fi in zip(b[1:], self._fs[1:], strict=True):
                incr = incr + bi * fi
            y_new = y + h * incr
        self._hs.insert(0, float(h))
        del self._hs[self.k:]
        self._t_next = t + h
        return y_new

    def get_state(self) -> dict[str, Any]:
        """The history for a checkpoint: ``fs`` (field values, newest first, backend
        arrays), ``hs`` (step sizes), ``t_next`` (float or ``None``) and ``"version"``."""
        return {"version": STATE_VERSION, "fs": list(self._fs), "hs": list(self._hs),
                "t_next": self._t_next}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version)."""
        _check_state(self, state, ("fs", "hs", "t_next"))
        if len(state["fs"]) > self.k or len(state["hs"]) > self.k:
            raise ValueError(f"{self!r}: a history of {len(state['fs'])} field values and "
                             f"{len(state['hs'])} steps is longer than k={self.k}")
        self._fs = list(state["fs"])
        self._hs = [float(h) for h in state["hs"]]
        self._t_next = None if state["t_next"] is None else float(state["t_next"])

    def __repr__(self) -> str:
        return f"AdamsBashforth(k={self.k})"


class ImplicitMidpoint:
    r"""Implicit midpoint rule, order 2, solved by fixed-point iteration.

    .. math:: y_{n+1} = y_n + h\,F\big(t_n + \tfrac h2, \tfrac12(y_n + y_{n+1})\big).

    The iteration :math:`z \leftarrow y_n + h F(t_n + h/2, (y_n + z)/2)` starts from the
    explicit Euler predictor and stops when
    :math:`\|z_{new} - z\|_\infty \le \mathrm{tol}\,(1 + \|z_{new}\|_\infty)`.  It contracts
    when :math:`h L / 2 < 1` (:math:`L` the Lipschitz constant of :math:`F`).  The rule
    preserves every quadratic first integral exactly (up to ``tol``), e.g. :math:`|x|^2`
    for a field tangent to the spheres.

    Parameters
    ----------
    tol : float, default 1e-13
        Relative stopping tolerance of the fixed-point iteration.
    max_iter : int, default 100
        Raise :class:`~transformer_pde.errors.SolverNotConverged` when exceeded.
    """

    name = "implicit_midpoint"
    order = 2
    adaptive = False
    multistep = False

    def __init__(self, tol: float = 1e-13, max_iter: int = 100):
        self.tol = positive("tol", tol)
        self.max_iter = integer("max_iter", max_iter, minimum=1)
        self.iterations: list[int] = []

    def reset(self) -> None:
        """Clear the iteration counts."""
        self.iterations = []

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        """One step of size ``h`` from ``(t, y)``."""
        xp = array_namespace(y)
        tm = t + 0.5 * h
        z = y + h * f(t, y)
        err = np.inf
        for it in range(1, self.max_iter + 1):
            z_new = y + h * f(tm, 0.5 * (y + z))
            err = float(xp.max(xp.abs(z_new - z)))
            scale = 1.0 + float(xp.max(xp.abs(z_new)))
            z = z_new
            if not (np.isfinite(err) and np.isfinite(scale)):
                break
            if err <= self.tol * scale:
                self.iterations.append(it)
                return z
        raise SolverNotConverged(
            f"implicit midpoint fixed-point iteration did not converge at t={t:.6g} with "
            f"h={h:.3g}: last update {err:.3g} after {it} iterations (tol={self.tol:g}); "
            "reduce dt (the iteration contracts when h * Lipschitz / 2 < 1)")

    def get_state(self) -> dict[str, Any]:
        """The fixed-point iteration counts so far (and ``"version"``), for a checkpoint."""
        return {"version": STATE_VERSION, "iterations": list(self.iterations)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version)."""
        _check_state(self, state, ("iterations",))
        self.iterations = [int(i) for i in state["iterations"]]

    def __repr__(self) -> str:
        return f"ImplicitMidpoint(tol={self.tol:g}, max_iter={self.max_iter})"


#: solvers selected by name, with default options
SOLVERS: dict[str, Callable[[], Any]] = {
    "euler": Euler,
    "heun": Heun,
    "rk2": Heun,
    "rk4": RK4,
    "ab2": lambda: AdamsBashforth(2),
    "ab3": lambda: AdamsBashforth(3),
    "implicit_midpoint": ImplicitMidpoint,
    "dopri5": Dopri5,
    "dop853": Dop853,
}


def get_solver(solver: Any, name: str = "solver") -> Solver | AdaptiveSolver:
    """A solver from its name (:data:`SOLVERS`, default options) or a copy of a solver object.

    A solver object carries the history of the run it integrates (Adams–Bashforth field
    values, iteration counts), so every run gets its own deep copy: one object may be
    passed to many runs, also concurrently from several threads, and is never changed.

    Raises
    ------
    ArgumentError
        Unknown name.
    ArgumentTypeError
        A solver class instead of an instance (``RK4`` for ``RK4()``), or an object that
        is neither a :class:`Solver` nor an :class:`AdaptiveSolver` (:func:`check_solver`)."""
    if isinstance(solver, str):
        if solver not in SOLVERS:
            raise ArgumentError(f"{name} must be one of {sorted(SOLVERS)} or a solver object "
                                f"(e.g. Dopri5(rtol=1e-8)), got {solver!r}")
        return SOLVERS[solver]()
    if isinstance(solver, type):
        raise ArgumentTypeError(
            f"{name} must be a solver name or a solver object, got the class "
            f"{solver.__qualname__}; pass an instance such as {solver.__qualname__}()")
    check_solver(solver, name)
    try:
        return copy.deepcopy(solver)
    except Exception as exc:  # noqa: BLE001 - any failure of a user object's copy
        raise ArgumentTypeError(
            f"{name}: the solver object {type(solver).__name__} cannot be copied "
            f"({type(exc).__name__}: {exc}); every run works on its own copy") from None
