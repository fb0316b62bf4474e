r"""How the attention field of a particle run is evaluated: :class:`FieldOptions`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..attention import Attention
from ..backends import DEFAULT_BACKEND
from ..blocks import Sphere
from ..errors import ArgumentError, ArgumentTypeError
from ..fields.harmonic import DEFAULT_HARMONIC_TOL, METHODS, isotropic_sign
from ..sinkhorn.options import DEFAULT_MAX_ITER, DEFAULT_TOL
from ..validation import choice, positive

__all__ = ["FieldOptions"]


@dataclass(frozen=True, eq=False)
class FieldOptions:
    r"""How the attention field is evaluated.

    Parameters
    ----------
    backend : {"auto", "numpy", "numba", "cupy"} or backend object, default "auto"
        Where fields are computed; the state stays on that backend between steps and only
        saved states are copied to the host.  ``"auto"`` picks the fastest installed
        backend for the number of tokens (NumPy below 64 tokens).
    dtype : {float32, float64}, optional
        Working precision; default that of ``X0`` (float32 stays float32, anything else
        runs in float64).
    sinkhorn_tol, sinkhorn_max_iter : float, int, optional
        Inner Sinkhorn solve controls (defaults
        :data:`~transformer_pde.sinkhorn.options.DEFAULT_TOL` and
        :data:`~transformer_pde.sinkhorn.options.DEFAULT_MAX_ITER`; warm-started from the
        previous evaluation).  Only for ``kind="sinkhorn"``: an error otherwise.
    method : {"direct", "harmonic"}, default "direct"
        ``"direct"``: the sum over all token pairs.  ``"harmonic"``: the exact
        :math:`O(NK)` expansion of isotropic attention on the circle or :math:`S^2`
        (:mod:`~transformer_pde.fields.harmonic`: kinds ``softmax`` / ``exp``, d = 2 or 3,
        :math:`Q = K = I`, :math:`V = \pm I`, one head, no mask, bias, rotary or ``W_O``;
        float64); :func:`~transformer_pde.simulate` then needs
        ``block=Block(constraint="sphere")`` without a pre-LayerNorm.  The field is
        evaluated at the radial projections of the tokens: exact on the sphere, the
        natural extension at Runge–Kutta stage points off it.
    harmonic_tol : float, optional
        Bound on the error of every harmonic field value (default
        :data:`~transformer_pde.fields.harmonic.DEFAULT_HARMONIC_TOL`, 1e-13; queries the
        expansion cannot serve to it are evaluated by the direct sum and counted in
        ``info["harmonic_direct_queries"]``).  Only with ``method="harmonic"``.
    """

    backend: Any = DEFAULT_BACKEND
    dtype: Any = None
    sinkhorn_tol: float | None = None
    sinkhorn_max_iter: int | None = None
    method: str = "direct"
    harmonic_tol: float | None = None

    def __post_init__(self) -> None:
        choice("method", self.method, METHODS)
        if self.harmonic_tol is not None:
            if self.method != "harmonic":
                raise ArgumentError("FieldOptions(harmonic_tol=...) applies only with "
                                    "method='harmonic'")
            positive("harmonic_tol", self.harmonic_tol)
        if self.backend is None:
            raise ArgumentTypeError("backend must be a backend name or object, got None")
        if self.dtype is not None:
            try:
                dt = np.dtype(self.dtype)
            except TypeError:
                raise ArgumentTypeError(f"dtype must be float32 or float64, got {self.dtype!r}") from None
            if dt not in (np.float32, np.float64):
                raise ArgumentError(f"dtype must be float32 or float64, got {dt}")
            object.__setattr__(self, "dtype", dt)
        if self.sinkhorn_tol is not None:
            v = self.sinkhorn_tol
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ArgumentTypeError(f"sinkhorn_tol must be a real number, got {v!r}")
            if not (math.isfinite(v) and v > 0):
                raise ArgumentError(f"sinkhorn_tol must be finite and > 0, got {v!r}")
        if self.sinkhorn_max_iter is not None:
            v = self.sinkhorn_max_iter
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentTypeError(f"sinkhorn_max_iter must be an integer, got {v!r}")
            if v < 1:
                raise ArgumentError(f"sinkhorn_max_iter must be >= 1, got {v!r}")

    def check(self, att: Attention, block: Any = None) -> None:
        """Refuse options that do not apply to ``att`` (and, for the harmonic method, to
        ``block``: the tokens must stay on the unit sphere)."""
        if self.method == "harmonic":
            isotropic_sign(att)
            if not isinstance(getattr(block, "constraint", None), Sphere) or \
                    block.pre_norms[0] is not None:
                raise ArgumentError(
                    "block: FieldOptions(method='harmonic') evaluates the field of tokens on "
                    "the unit sphere and needs block=Block(constraint='sphere') (without a "
                    "pre-LayerNorm of the attention input)")
        if att.kind != "sinkhorn":
            for name in ("sinkhorn_tol", "sinkhorn_max_iter"):
                if getattr(self, name) is not None:
                    raise ArgumentError(f"FieldOptions({name}=...) applies only to "
                                        f"kind='sinkhorn', not to kind={att.kind!r}")

    def sinkhorn_kwargs(self) -> dict[str, Any]:
        """``sinkhorn_tol`` and ``sinkhorn_max_iter`` of
        :class:`~transformer_pde.fields.FieldEvaluator`, the defaults filled in (the
        backend is resolved once per run by
        :class:`~transformer_pde.particles.simulation.RunSpec`)."""
        return {"sinkhorn_tol": DEFAULT_TOL if self.sinkhorn_tol is None
                else float(self.sinkhorn_tol),
                "sinkhorn_max_iter": DEFAULT_MAX_ITER if self.sinkhorn_max_iter is None
                else int(self.sinkhorn_max_iter)}


    def evaluator_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~transformer_pde.fields.FieldEvaluator`:
        :meth:`sinkhorn_kwargs` and, with ``method="harmonic"``, ``method`` and
        ``harmonic_tol`` (absent for the direct method, so that its run identity is
        unchanged)."""
        out: dict[str, Any] = self.sinkhorn_kwargs()
        if self.method == "harmonic":
            out.update(method="harmonic", harmonic_tol=DEFAULT_HARMONIC_TOL
                       if self.harmonic_tol is None else float(self.harmonic_tol))
        return out
