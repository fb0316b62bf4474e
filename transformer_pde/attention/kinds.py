"""The registry of attention kinds: :class:`Kind` entries in :data:`KINDS`, :func:`register_kind`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import type_name as _what

__all__ = ["BIAS_RULES", "KINDS", "Kind", "register_kind"]

#: values of :attr:`Kind.bias_rule`
BIAS_RULES = ("keep", "drop_key", "drop_both", "difference")


@dataclass(frozen=True)
class Kind:
    r"""Registry entry describing one attention variant.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"softmax"``.
    normalized : bool
        Whether each query's attention weights sum to one (a single token with
        ``V = I`` is then a fixed point).
    affine_on_gaussians : bool
        Whether the field of a Gaussian measure is affine in ``x`` (so the
        Gaussian module has closed-form moment ODEs for it).
    maskable : bool
        Whether a causal (masked) version is defined.
    description : str
        One line with the formula.
    bias_rule : {"keep", "drop_key", "drop_both", "difference"}, default "keep"
        Which parts of the query and key biases the kind's weights cannot see; they are
        removed exactly before the scores are formed (:func:`score_head`), so that a huge
        bias that cancels mathematically cannot spoil the field by rounding.  With the
        biased score :math:`\langle Qx + b_Q, Ky + b_K\rangle = \langle Qx + b_Q, Ky\rangle
        + \langle Qx + b_Q, b_K\rangle`:

        * ``"keep"``: both biases are used as given (no cancellation assumed).
        * ``"drop_key"``: the weights are invariant under adding to the score any function
          of the query alone (a kernel :math:`e^{\beta s}` normalised per query row:
          softmax); :math:`\langle Qx + b_Q, b_K\rangle` is such a term, so ``b_K`` is dropped.
        * ``"drop_both"``: invariant under adding a function of the query alone *and* one of
          the key alone (the Sinkhorn coupling: they are absorbed by the two potentials);
          :math:`\langle b_Q, Ky + b_K\rangle` is a function of the key, so ``b_Q`` and
          ``b_K`` are both dropped.
        * ``"difference"``: the kernel depends on :math:`(Qx + b_Q) - (Ky + b_K)` only
          (``l2``); ``b_Q - b_K`` replaces ``b_Q`` and ``b_K`` is dropped.
    """

    name: str
    normalized: bool
    affine_on_gaussians: bool
    maskable: bool
    description: str
    bias_rule: str = "keep"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ArgumentTypeError(f"Kind: name must be a string, got {self.name!r:.60}")
        if not self.name:
            raise ArgumentError("Kind: name must be a non-empty string")
        for flag in ("normalized", "affine_on_gaussians", "maskable"):
            value = getattr(self, flag)
            if not isinstance(value, (bool, np.bool_)):
                raise ArgumentTypeError(f"Kind {self.name!r}: {flag} must be a bool, got "
                                        f"{value!r:.60}")
            object.__setattr__(self, flag, bool(value))
        if not isinstance(self.description, str):
            raise ArgumentTypeError(f"Kind {self.name!r}: description must be a string, got "
                                    f"{type(self.description).__name__}")
        if not isinstance(self.bias_rule, str) or self.bias_rule not in BIAS_RULES:
            raise ArgumentError(f"Kind {self.name!r}: bias_rule must be one of "
                                f"{list(BIAS_RULES)}, got {self.bias_rule!r:.60}")


#: The registry of attention kinds, name -> :class:`Kind` (:func:`register_kind` adds one).
KINDS: dict[str, Kind] = {}
#: Names of the kinds shipped with the package (:func:`register_kind` never replaces them).
_BUILTIN: set[str] = set()


def register_kind(kind: Kind | str, spec: Kind | None = None, *,
                  replace: bool = False) -> Kind:
    """Add an attention variant to the registry.

    Its head field goes in :data:`transformer_pde.fields.HEAD_FIELDS` under the same name
    (:func:`transformer_pde.fields.register_head_field`).

    Parameters
    ----------
    kind : Kind or str
        The entry (``register_kind(Kind("mine", ...))``), or its name followed by the entry
        (``register_kind("mine", Kind("mine", ...))``; the names must agree).
    spec : Kind, optional
        The entry, when ``kind`` is its name.
    replace : bool, default False
        Allow replacing a kind registered earlier by the user.  Registering an entry equal
        to the one already registered is always a no-op.

    Returns
    -------
    Kind
        The registered entry.

    Raises
    ------
    ArgumentTypeError
        The entry is not a :class:`Kind` (or the name not a string).
    ArgumentError
        The name is a kind shipped with the package (these are never replaced), the name
        is taken and ``replace`` is False, or the name and ``Kind.name`` differ.
    """
    if not isinstance(replace, (bool, np.bool_)):
        raise ArgumentTypeError(f"register_kind: replace must be a bool, got {replace!r:.60}")
    if isinstance(kind, str):
        if not isinstance(spec, Kind):
            raise ArgumentTypeError(
                f"register_kind({kind!r}, spec): spec must be a transformer_pde.Kind, got "
                f"{_what(spec)}")
        if spec.name != kind:
            raise ArgumentError(f"register_kind: the name {kind!r} differs from the Kind's "
                                f"name {spec.name!r}")
        kind = spec
    elif spec is not None:
        raise ArgumentTypeError("register_kind: pass a Kind, or a name and a Kind "
                                f"(the first argument is a {type(kind).__name__})")
    if not isinstance(kind, Kind):
        raise ArgumentTypeError(f"register_kind: kind must be a transformer_pde.Kind, got "
                                f"{_what(kind)}")
    old = KINDS.get(kind.name)
    if old is not None and old != kind:
        if kind.name in _BUILTIN:
            raise ArgumentError(f"register_kind: {kind.name!r} is a built-in attention kind "
                                "and cannot be replaced; register yours under another name")
        if not replace:
            raise ArgumentError(f"register_kind: kind {kind.name!r} is already registered; "
                                "pass replace=True to replace it")
    KINDS[kind.name] = kind
    return kind


for _k in (
    Kind("softmax", True, True, True,
         "sum_j w_j e^{b s(x,x_j)} V x_j / sum_j w_j e^{b s(x,x_j)}", "drop_key"),
    Kind("linear", False, True, True, "sum_j w_j b s(x,x_j) V x_j"),
    Kind("l2", True, True, True,
         "kernel exp(-l2_beta |Qx - Ky|^2), normalised like softmax", "difference"),
    Kind("sinkhorn", True, True, False,
         "doubly stochastic entropic-OT self-coupling density, cost -b s, regularisation eps",
         "drop_both"),
    Kind("sigmoid", False, False, True, "sum_j w_j sigmoid(b s(x,x_j)) V x_j"),
    Kind("relu", False, False, True, "sum_j w_j relu(b s(x,x_j)) V x_j"),
    Kind("exp", False, False, True, "sum_j w_j exp(b s(x,x_j)) V x_j (unnormalised)"),
):
    register_kind(_k)

# softmax-free kinds of Cao 2021, "Choose a Transformer: Fourier or Galerkin";
# head fields in fields.py, per-token layer norm LN with eps = blocks.SOFTMAX_FREE_LN_EPS
register_kind(Kind("galerkin", False, False, True,
                   "sum_j w_j b <Qx, LN(K x_j)> LN(V x_j)  (LN per token over k features)"))
register_kind(Kind("fourier", False, False, True,
                   "sum_j w_j b <LN(Qx), LN(K x_j)> V x_j  (LN per token over k features)"))
_BUILTIN.update(KINDS)

