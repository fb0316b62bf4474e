r"""The solver wrapper that advances a :class:`~transformer_pde.blocks.Block` flow by
operator splitting (``"lie"``, ``"strang"`` or ``"none"``; the schemes are described in
:mod:`transformer_pde.blocks`), or by a normalisation scheme
(:class:`~transformer_pde.blocks.Normalization`)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.solvers import Solver, check_solver, restore_solver_state, solver_state
from .block import Block, Sphere
from .norms import LayerNorm
from .normalization import sphere_retract, tangent_project, unit_rows

__all__ = ["BlockStepper"]


# --------------------------------------------------------------------------- stepper
def _check_noise(solver: Any, block: Block, splitting: str) -> None:
    """Refuse the blocks on which the noise of a stochastic solver is not defined: only
    no constraint (tokens in R^d) or the sphere, no normalisation scheme, no operator
    splitting (the noise enters the one combined field), and the solver's noise built
    for the same geometry."""
    c = block.constraint
    if block.normalization is not None or (c is not None and not isinstance(c, Sphere)):
        what = "normalization" if block.normalization is not None else type(c).__name__
        raise ArgumentError(
            f"noise: the stochastic dynamics are defined in R^d or on the sphere "
            f"(Block(constraint=Sphere())), not with {what}")
    if splitting != "none":
        raise ArgumentError(
            f"noise: a block with an MLP and splitting={splitting!r} is not supported with "
            "noise; pass Block(..., splitting='none') (the noise then drives the combined "
            "field)")
    if bool(getattr(solver, "on_sphere", False)) != isinstance(c, Sphere):
        raise ArgumentError("noise: the stochastic solver was built for another geometry "
                            "than the block's constraint")
def _sphere_only(block: Block) -> bool:
    """Whether ``block`` is ``Block(constraint=Sphere())`` and nothing else (what an
    adaptive solver can integrate: see :meth:`BlockStepper.attempt`)."""
    return (isinstance(block.constraint, Sphere) and block.mlp is None
            and block.normalization is None
            and all(n is None for n in block.pre_norms))


class BlockStepper:
    r"""Solver wrapper that advances a Transformer block flow by operator splitting.

    A :class:`~transformer_pde.integrate.solvers.Solver` itself (``step``, ``reset``,
    ``name``, ``order``, ``multistep``) and is built by
    :func:`~transformer_pde.simulate` from its ``block=`` (see the module docstring for
    the schemes).  ``f(t, X)`` passed to :meth:`step` is the attention field.

    Parameters
    ----------
    solver : Solver
        Integrates every sub-flow.  Multistep solvers are refused with a splitting (their
        history would mix states moved by the other sub-flow).  A stochastic one
        (``stochastic = True``, :class:`~transformer_pde.noise.SDEStepper`) is accepted
        without a constraint or with the sphere, and without splitting: its tangent
        increments are projected and retracted like the field's.
    block : Block
    d : int
        Token dimension.
    """

    adaptive = False

    def __init__(self, solver: Solver, block: Block, d: int):
        if not isinstance(block, Block):
            raise ArgumentTypeError(
                f"block must be a transformer_pde.Block, got {type(block).__name__}")
        self.adaptive = bool(check_solver(solver).adaptive)
        if self.adaptive and not _sphere_only(block):
            raise ArgumentError(
                f"solver={solver.name!r}: block options (mlp, layernorm, normalization, "
                "a constraint other than Sphere) need a fixed-step solver (e.g. 'euler', "
                "'heun', 'rk4', 'implicit_midpoint'); an adaptive solver takes "
                "Block(constraint=Sphere()) alone")
        mlp = block.mlp
        splitting = (block.splitting or "strang") if mlp is not None else "none"
        if mlp is not None:
            if mlp.d != d:
                raise ArgumentError(f"mlp acts on d={mlp.d} features but the tokens have d={d}")
            if splitting != "none" and solver.multistep:
                raise ArgumentError(
                    f"solver={solver.name!r} is multistep and cannot integrate the sub-flows "
                    "of an operator splitting; use Block(splitting='none') or a one-step "
                    "solver")
        norms = block.layernorm if isinstance(block.layernorm, tuple) else (block.layernorm,)
        if d < 2 and any(isinstance(x, LayerNorm) for x in norms):
            raise ArgumentError("layernorm: a LayerNorm needs d >= 2 features (an RMSNorm "
                                "works for any d)")
        self.normalization = block.normalization
        if self.normalization is not None and self.normalization.scheme == "mix" and \
                solver.multistep:
            raise ArgumentError(
                f"solver={solver.name!r} is multistep and its history would reach across "
                "the switch of normalization='mix'; use a one-step solver (e.g. 'rk4')")
        if getattr(solver, "stochastic", False):
            _check_noise(solver, block, splitting)
        self.block = block
        self.inner = solver
        self.d = d
        self.mlp = mlp
        self.ln_att, self.ln_mlp = block.pre_norms
        self.constraint = block.constraint
        self.splitting = splitting
        self.name = f"{solver.name}+{self.splitting}" if mlp is not None else solver.name
        cap = {"lie": 1, "strang": 2, "none": solver.order}[self.splitting]
        self.order = min(solver.order, cap)
        self.multistep = bool(solver.multistep)
        # per-layer tables of the MLP / LayerNorms: simulate restarts a multistep history
        # where they (or the attention's tables) jump
        self.tables = block.tables
        self._end = 0.0

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for ``ParticleTrajectory.info``."""
        return {**self.block.describe(), "inner_method": self.inner.name}

    def initial(self, X0: np.ndarray) -> np.ndarray:
        """Check (and for the sphere, exactly renormalise) the initial tokens."""
        if self.normalization is not None:
            return self.normalization.initial(X0)
        if self.constraint is not None:
            return self.constraint.initial(X0)
        return X0

    def reset(self) -> None:
        self.inner.reset()

    def controller(self) -> Any:
        """The step-size controller of the wrapped adaptive solver."""
        return self.inner.controller()

    def attempt(self, f: Callable, t: float, y: Any, h: float, fy: Any
                ) -> tuple[Any, float, Any]:
        r"""One trial step of an adaptive solver on the sphere (``Block(constraint=Sphere())``
        alone): the standard projection method.  The embedded pair integrates the
        tangential field :math:`P_x f(x)`, of which every :math:`|x_i|` is an exact first
        integral, so the error estimate is that of a smooth ODE; an accepted proposal is
        retracted onto the sphere (it moved off it only by the local error) and the field
        is evaluated afresh there for the next step (the first-same-as-last value of the
        pair belongs to the unretracted point).  ``fy`` is the field at ``y``."""
        fa = self._attention(f)
        y_new, err, _ = self.inner.attempt(fa, t, y, h, self.constraint.tangent(y, fy))
        if not err <= 1.0:
            return y_new, err, None
        y_new = sphere_retract(y_new)
        return y_new, err, f(t + h, y_new)

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """Plain, versioned data for a checkpoint: the wrapped solver's state
        (:func:`~transformer_pde.integrate.solvers.solver_state`) under ``"inner"`` (the
        stepper itself keeps nothing between steps)."""
        return {"version": self.STATE_VERSION, "inner": solver_state(self.inner)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version)."""
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION \
                or set(state) != {"version", "inner"}:
            raise ValueError(f"block stepper state {state!r:.80} is not of version "
                             f"{self.STATE_VERSION}")
        restore_solver_state(self.inner, state["inner"])

    # ------------------------------------------------------------------ pieces
    def _left(self, tau: float) -> bool:
        return tau >= self._end - 1e-12 * max(1.0, abs(self._end))

    def _attention(self, f: Callable) -> Callable:
        def fa(tau, z):
            u = z if self.ln_att is None else self.ln_att(z, tau, left=self._left(tau))
            v = f(tau, u)
            return self.constraint.tangent(z, v) if self.constraint is not None else v
        return fa

    def _mlp(self, frozen: float | None) -> Callable:
        def fm(tau, z):
            s = tau if frozen is None else frozen
            left = self._left(s)
            u = z if self.ln_mlp is None else self.ln_mlp(z, s, left=left)
            v = self.mlp(s, u, left=left)
            return self.constraint.tangent(z, v) if self.constraint is not None else v
        return fm

    def _project(self, y: Any, tau: float, *, after_mlp: bool = False) -> Any:
        c = self.constraint
        if c is None:
            return y
        if after_mlp and hasattr(c, "retract_mlp"):  # a post-norm pair: LN2 after the MLP
            return c.retract_mlp(y, tau, left=self._left(tau))
        return c.retract(y, tau, left=self._left(tau))

    def step(self, f: Callable, t: float, y: Any, h: float) -> Any:
        """Advance the block flow from ``t`` to ``t + h`` (``f``: attention field)."""
        self._end = t + h
        if self.normalization is not None:
            return self._normalized(f, t, y, h)
        step = self.inner.step
        fa = self._attention(f)
        if self.mlp is None:
            return self._project(step(fa, t, y, h), t + h)
        if self.splitting == "none":
            fm = self._mlp(None)
            return self._project(step(lambda tau, z: fa(tau, z) + fm(tau, z), t, y, h), t + h,
                                 after_mlp=True)
        if self.splitting == "lie":
            y = self._project(step(fa, t, y, h), t + h)
            return self._project(step(self._mlp(t), t, y, h), t + h, after_mlp=True)
        half = 0.5 * h
        y = self._project(step(fa, t, y, half), t + half)
        y = self._project(step(self._mlp(t + half), t, y, h), t + half, after_mlp=True)
        return self._project(step(fa, t + half, y, half), t + h)

    def _normalized(self, f: Callable, t: float, y: Any, h: float) -> Any:
        r"""One step of a normalisation scheme.  The step uses the scheme in force at its
        start; a step over the switch of ``"mix"`` is cut there into a post and a pre
        step.  ``"post"`` evaluates the field at the stage tokens themselves (the
        operations of ``constraint="sphere"``, so the two agree bit for bit); the other
        schemes evaluate it at the normalised stage tokens :math:`z/|z|`."""
        nz = self.normalization
        if nz.crosses_switch(t, h):
            y = self._normalized(f, t, y, nz.switch - t)
            return self._normalized(f, nz.switch, y, t + h - nz.switch)
        active = nz.at(t)
        if active.scheme == "post":
            return sphere_retract(self.inner.step(lambda tau, z: tangent_project(z, f(tau, z)),
                                                  t, y, h))
        y = self.inner.step(lambda tau, z: active.field(tau, z, f(tau, unit_rows(z))), t, y, h)
        return sphere_retract(y) if active.retracts(t) else y
