r"""Where the layer normalisation sits: Post-LN, Pre-LN, Mix-LN, Peri-LN, nGPT, LN-Scaling.

A token is :math:`x_i = r_i\,\theta_i` with :math:`r_i = |x_i|` and
:math:`\theta_i = x_i/|x_i| \in S^{d-1}`, and :math:`A_i = A_i(\Theta)` is the attention
field evaluated on the normalised tokens :math:`\Theta = (\theta_1, \dots, \theta_n)`.  The
schemes differ in what the residual stream :math:`x` integrates
(:math:`P_x y = y - \langle x, y\rangle x / |x|^2`):

.. math::
   \text{post:}\ \dot x_i = P_{x_i} A_i \ \text{(retracted to } S^{d-1}\text{)},\qquad
   \text{pre:}\ \dot x_i = A_i,\qquad
   \text{peri:}\ \dot x_i = \frac{A_i}{|A_i|},

.. math::
   \text{ngpt:}\ \dot x_i = \alpha\,P_{x_i}\frac{A_i}{|A_i|}\ \text{(retracted)},\qquad
   \text{cod:}\ \dot x_i = \frac{A_i}{\sqrt{1 + t}},\qquad
   \text{mix:}\ \text{post for } t < t_s,\ \text{pre for } t \ge t_s .

Since :math:`\dot r_i = \langle\theta_i, \dot x_i\rangle` and
:math:`\dot\theta_i = P_{\theta_i}\dot x_i / r_i`, every scheme moves the directions by the
Post-LN field times a per-token *speed factor* :math:`s_i`, and the radii by a radial
factor :math:`g_i`:

.. math:: \dot\theta_i = s_i\,P_{\theta_i} A_i, \qquad \dot r_i = g_i\,\langle\theta_i, A_i\rangle,

with :math:`s = 1,\ 1/r,\ 1/(r|A|),\ \alpha/|A|,\ 1/(r\sqrt{1+t})` and
:math:`g = 0,\ 1,\ 1/|A|,\ 0,\ 1/\sqrt{1+t}` for post, pre, peri, ngpt, cod.

:class:`Normalization` holds a scheme and its options and gives the stream field, the
retraction and the two factors; ``Block(normalization=...)`` runs it
(:class:`~transformer_pde.blocks.BlockStepper`), and :func:`speed_factors` reports
:math:`s_i` along a saved run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import array_namespace as _xp
from ..errors import ArgumentError, ArgumentTypeError
from ..validation import choice, positive

__all__ = ["NORMALIZATIONS", "Normalization", "as_normalization", "speed_factors",
           "sphere_retract", "tangent_project", "unit_rows"]

#: the normalisation schemes of :class:`Normalization`
NORMALIZATIONS = ("post", "pre", "mix", "peri", "ngpt", "cod")
#: relative tolerance of the Mix-LN switch time (as for a layer boundary of ``Layers``)
_SWITCH_TOL = 1e-9


def tangent_project(X: Any, F: Any) -> Any:
    r"""Tangential part :math:`F_i - \frac{\langle x_i, F_i\rangle}{|x_i|^2} x_i` of each row.

    Uses :math:`|x_i|^2` (not 1) so that :math:`|x|` is an exact first integral of the
    projected field also off the sphere (needed by the projection method)."""
    r2 = (X * X).sum(axis=1, keepdims=True)
    return F - ((X * F).sum(axis=1, keepdims=True) / r2) * X


def sphere_retract(X: Any) -> Any:
    r"""Radial retraction :math:`x \mapsto x/|x|` of each row onto the unit sphere."""
    xp = _xp(X)
    return X / xp.sqrt((X * X).sum(axis=1, keepdims=True))


def _positive_or_nan(v: Any) -> Any:
    """``v`` where ``v > 0``, NaN elsewhere: dividing by it gives NaN, not a warning."""
    xp = _xp(v)
    return xp.where(v > 0, v, xp.nan)


def _inverse(v: Any) -> Any:
    """``1/v`` where ``v > 0`` and NaN elsewhere (no floating-point warning)."""
    return 1.0 / _positive_or_nan(v)


def _norms(X: Any) -> Any:
    xp = _xp(X)
    return xp.sqrt((X * X).sum(axis=1))


def unit_rows(X: Any) -> Any:
    r"""The directions :math:`\theta_i = x_i/|x_i|` of the rows of ``X`` (a zero row gives a
    row of NaN, so that a run through the origin stops as non-finite)."""
    return X / _positive_or_nan(_norms(X))[:, None]


@dataclass(frozen=True)
class Normalization:
    r"""A normalisation scheme of the attention flow (see the module docstring).

    Parameters
    ----------
    scheme : {"post", "pre", "mix", "peri", "ngpt", "cod"}, default "post"
        ``"post"`` is ``Block(constraint="sphere")``; ``"pre"`` normalises inside the
        sub-layer; ``"peri"`` also normalises its output; ``"ngpt"`` moves on the sphere
        along the normalised field; ``"cod"`` scales the sub-layer output by
        :math:`1/\sqrt{1+t}`; ``"mix"`` is post before ``switch`` and pre after it.
    alpha : float, optional
        Step size :math:`\alpha > 0` of ``"ngpt"`` (default 1); an error for other schemes.
    switch : float, optional
        Depth :math:`t_s > 0` where ``"mix"`` goes from post to pre (required there); an
        error for other schemes.

    Examples
    --------
    >>> import numpy as np
    >>> nz = Normalization("pre")
    >>> X = np.array([[2.0, 0.0]]); A = np.array([[0.6, 0.8]])
    >>> nz.speed_factor(0.0, X, A).tolist(), nz.field(0.0, X, A).tolist()
    ([0.5], [[0.6, 0.8]])
    """

    scheme: str = "post"
    alpha: float | None = None
    switch: float | None = None

    def __post_init__(self) -> None:
        choice("normalization: scheme", self.scheme, NORMALIZATIONS)
        set_ = object.__setattr__
        if self.scheme == "ngpt":
            set_(self, "alpha", 1.0 if self.alpha is None
                 else positive("normalization: alpha", self.alpha))
        elif self.alpha is not None:
            raise ArgumentError(f"normalization: alpha applies only to scheme 'ngpt' (its step "
                                f"size), got alpha={self.alpha!r} with scheme {self.scheme!r}")
        if self.scheme == "mix":
            if self.switch is None:
                raise ArgumentError("normalization: scheme 'mix' needs switch=, the depth "
                                    "t > 0 where Post-LN hands over to Pre-LN")
            set_(self, "switch", positive("normalization: switch", self.switch))
        elif self.switch is not None:
            raise ArgumentError(f"normalization: switch applies only to scheme 'mix', got "
                                f"switch={self.switch!r} with scheme {self.scheme!r}")

    # ------------------------------------------------------------------ regimes
    def at(self, t: float) -> "Normalization":
        """The scheme in force at depth ``t``: for ``"mix"`` ``Normalization("post")``
        before the switch and ``Normalization("pre")`` from it on (a time within
        :math:`10^{-9}` of the switch, relative, counts as the switch); else ``self``."""
        if self.scheme != "mix":
            return self
        return Normalization("post" if self.before_switch(t) else "pre")

    def before_switch(self, t: float) -> bool:
        """Whether ``t`` lies before the ``"mix"`` switch (``False`` for other schemes)."""
        return self.switch is not None and t < self.switch * (1.0 - _SWITCH_TOL)

    def crosses_switch(self, t: float, h: float) -> bool:
        """Whether a step from ``t`` to ``t + h`` passes over the ``"mix"`` switch."""
        return self.before_switch(t) and t + h > self.switch * (1.0 + _SWITCH_TOL)

    @property
    def on_sphere(self) -> bool:
        """Whether the tokens start on (and, while retracted, stay on) the unit sphere."""
        return self.scheme in ("post", "ngpt", "mix")

    def retracts(self, t: float) -> bool:
        """Whether a step starting at depth ``t`` ends with the retraction
        :math:`x \\mapsto x/|x|` (post, ngpt, and mix before its switch)."""
        return self.at(t).scheme in ("post", "ngpt")

    # ------------------------------------------------------------------ fields
    def field(self, t: float, X: Any, A: Any) -> Any:
        r"""The stream velocity :math:`\dot x_i` at depth ``t``.

        Parameters
        ----------
        t : float
        X : array (n, d)
            The tokens (the residual stream).
        A : array (n, d)
            The attention field at the normalised tokens, :math:`A_i(\Theta)`.

        Returns
        -------
        array (n, d)
            Non-finite rows where :math:`|A_i| = 0` for ``"peri"`` and ``"ngpt"`` (the
            normalised field is undefined there; a run then stops as ``nonfinite``).
        """
        sch = self.at(t).scheme
        if sch == "post":
            return tangent_project(X, A)
        if sch == "pre":
            return A
        if sch == "cod":
            return A * (1.0 / np.sqrt(1.0 + t))
        unit = A / _positive_or_nan(_norms(A))[:, None]
        if sch == "peri":
            return unit
        return tangent_project(X, unit) * self.alpha

    def speed_factor(self, t: float, X: Any, A: Any) -> Any:
        r"""The speed factor :math:`s_i` of :math:`\dot\theta_i = s_i P_{\theta_i} A_i`
        at depth ``t`` (array (n,)): 1 (post), :math:`1/r_i` (pre),
        :math:`1/(r_i|A_i|)` (peri), :math:`\alpha/|A_i|` (ngpt),
        :math:`1/(r_i\sqrt{1+t})` (cod); mix as post before the switch, as pre after."""
        sch = self.at(t).scheme
        xp = _xp(X)
        if sch == "post":
            return xp.ones(X.shape[0], dtype=X.dtype)
        if sch == "ngpt":
            return self.alpha * _inverse(_norms(A))
        inv_r = _inverse(_norms(X))
        if sch == "pre":
            return inv_r
        if sch == "peri":
            return inv_r * _inverse(_norms(A))
        return inv_r * (1.0 / np.sqrt(1.0 + t))

    def radial_factor(self, t: float, X: Any, A: Any) -> Any:
        r"""The radial factor :math:`g_i` of :math:`\dot r_i = g_i\langle\theta_i, A_i\rangle`
        at depth ``t`` (array (n,)): 0 (post, ngpt), 1 (pre), :math:`1/|A_i|` (peri),
        :math:`1/\sqrt{1+t}` (cod)."""
        sch = self.at(t).scheme
        xp = _xp(X)
        if sch in ("post", "ngpt"):
            return xp.zeros(X.shape[0], dtype=X.dtype)
        if sch == "pre":
            return xp.ones(X.shape[0], dtype=X.dtype)
        if sch == "peri":
            return _inverse(_norms(A))
        return xp.full(X.shape[0], 1.0 / np.sqrt(1.0 + t), dtype=X.dtype)

    def initial(self, X0: np.ndarray) -> np.ndarray:
        """Check the initial tokens: on the unit sphere to 1e-6 for post, ngpt and mix
        (renormalised exactly), non-zero rows for the others."""
        r = np.sqrt((np.asarray(X0, dtype=float) ** 2).sum(axis=1))
        if self.on_sphere:
            bad = float(np.max(np.abs(r - 1.0)))
            if bad > 1e-6:
                raise ArgumentError(
                    f"X0 must lie on the unit sphere for normalization={self.scheme!r} "
                    f"(max | |x_i| - 1 | = {bad:.3g} > 1e-6); normalise the rows first")
            return X0 / r[:, None].astype(X0.dtype)
        if not np.all(r > 0):
            raise ArgumentError(f"X0 has a zero row (token {int(np.argmin(r))}): "
                                f"normalization={self.scheme!r} needs its direction x/|x|")
        return X0

    def retract(self, X: Any) -> Any:
        """The retraction onto the unit sphere (:func:`~transformer_pde.blocks.sphere_retract`)."""
        return sphere_retract(X)

    # ------------------------------------------------------------------ records
    def parameters(self) -> dict[str, Any]:
        """``{"scheme": ..., "alpha": ..., "switch": ...}`` (``None`` where not used)."""
        return {"scheme": self.scheme, "alpha": self.alpha, "switch": self.switch}


def as_normalization(value: Any, name: str = "normalization") -> Normalization | None:
    """A :class:`Normalization` from a scheme name or an instance (``None`` stays ``None``)."""
    if value is None or isinstance(value, Normalization):
        return value
    if isinstance(value, str):
        return Normalization(value)
    raise ArgumentTypeError(f"{name} must be one of {list(NORMALIZATIONS)} or a "
                            f"transformer_pde.blocks.Normalization, got {type(value).__name__}")


def speed_factors(traj: Any, field: Any, normalization: Any = None) -> np.ndarray:
    r"""The speed factor :math:`s_i(t)` at every saved state of a run.

    Evaluates :meth:`Normalization.speed_factor` at each saved time :math:`t_k` with
    :math:`A = A(\Theta(t_k))`, the attention field of the saved normalised tokens.

    Parameters
    ----------
    traj : ParticleTrajectory
        A run of :func:`~transformer_pde.simulate` with its states saved.
    field : callable ``field(t, X) -> array (n, d)``
        The run's attention field of the tokens ``X`` at depth ``t``, with the run's
        weights and positions: ``tp.fields.FieldEvaluator(att, n, weights=traj.weights,
        positions=traj.positions)`` or
        ``lambda t, X: tp.velocity(att, X, weights=traj.weights, t=t)``.
    normalization : str or Normalization, optional
        Default: the run's, read from ``traj.info``; if given, it must be the run's.

    Returns
    -------
    ndarray (T, n)
        NaN where :math:`|A_i| = 0` (peri, ngpt) and, for a saved state with a token at
        the origin, in that state's whole row.

    Raises
    ------
    ArgumentError
        A run without saved states, without a normalisation when none is given, with
        another normalisation than ``normalization``, or a field of the wrong shape.
    ArgumentTypeError
        ``field`` is not callable (an :class:`~transformer_pde.Attention` is not a field:
        wrap it as above).
    """
    states = getattr(traj, "states", None)
    if states is None or len(states) == 0:
        raise ArgumentError("traj: speed_factors needs the saved states (run without "
                            "SaveAt(fn=...))")
    if not callable(field):
        raise ArgumentTypeError(
            f"field must be a callable field(t, X) -> (n, d) array, got "
            f"{type(field).__name__}; for an Attention att pass "
            "tp.fields.FieldEvaluator(att, n, weights=traj.weights, positions=traj.positions)")
    nz = _run_normalization(traj, normalization)
    out = np.empty(states.shape[:2], dtype=float)
    for k, (t, X) in enumerate(zip(traj.times, states, strict=True)):
        X = np.asarray(X, dtype=float)
        theta = unit_rows(X)
        if not np.all(np.isfinite(theta)):
            out[k] = np.nan
            continue
        A = np.asarray(field(float(t), theta), dtype=float)
        if A.shape != X.shape:
            raise ArgumentError(f"field returned shape {A.shape} for tokens of shape "
                                f"{X.shape} (t={float(t):.6g})")
        out[k] = nz.speed_factor(float(t), X, A)
    return out


def _run_normalization(traj: Any, normalization: Any) -> Normalization:
    """``normalization``, checked against the one ``traj.info`` records (or that one)."""
    info = getattr(traj, "info", None) or {}
    recorded = None
    if info.get("normalization") is not None:
        recorded = Normalization(info["normalization"], alpha=info.get("normalization_alpha"),
                                 switch=info.get("normalization_switch"))
    nz = as_normalization(normalization)
    if nz is None:
        if recorded is None:
            raise ArgumentError("normalization: the run has none recorded; pass "
                                "normalization=")
        return recorded
    if recorded is not None and recorded != nz:
        raise ArgumentError(f"normalization={nz!r} is not the run's ({recorded!r})")
    return nz
