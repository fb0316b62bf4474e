r"""The exact harmonic field: isotropic attention on the circle or on :math:`S^2` in
:math:`O(NK)` (circle) or :math:`O(NL^2)` (sphere) instead of :math:`O(N^2)`.

For :math:`Q = K = I`, :math:`V = \pm I` and tokens on the unit sphere the kernel
depends on the angle only, and its expansion in Fourier modes (circle) or spherical
harmonics (sphere) separates the query from the keys:

.. math::
    e^{\beta\cos(\theta - \varphi)} = \sum_{k\in\mathbb Z} I_k(\beta)\, e^{ik(\theta-\varphi)},
    \qquad
    e^{\beta\, x\cdot y} = \sum_{l\ge 0} (2l+1)\, i_l(\beta)\, P_l(x\cdot y)
    = \sum_{l\ge0} 4\pi\, i_l(\beta) \sum_{m=-l}^{l} Y_{lm}(x) Y_{lm}(y)

(:math:`I_k` the modified Bessel function, :math:`i_l` the modified spherical Bessel
function, :math:`Y_{lm}` real orthonormal spherical harmonics; any real :math:`\beta`,
with :math:`I_k(-b) = (-1)^k I_k(b)` and :math:`i_l(-b) = (-1)^l i_l(b)`).  So for any
weights :math:`c_j` the sum :math:`F_c(x) = \sum_j c_j e^{\beta\langle x, x_j\rangle}` needs
only the moments :math:`\hat c_k = \sum_j c_j e^{-ik\varphi_j}` (circle) or
:math:`\hat c_{lm} = \sum_j c_j Y_{lm}(x_j)` (sphere).  The softmax field is
:math:`\Gamma(x) = V F_{wy}(x)/F_w(x)` (the numerator has one measure per coordinate;
on the circle one complex set of moments serves both, since :math:`x_j = e^{i\varphi_j}`
shifts the mode index by one) and the ``exp`` field is
:math:`e^{-c}\,V F_{wy}(x)` (``shift`` :math:`= c`).

**Scaling.**  Every coefficient carries :math:`e^{-|\beta|}` (``scipy.special.ive``):
the scaled coefficients :math:`\omega_k = e^{-|\beta|}|I_k(\beta)|` (circle, :math:`k \in
\mathbb Z`) or :math:`\omega_l = (2l+1)e^{-|\beta|}|i_l(\beta)|` (sphere) are positive and
sum to exactly one (the expansion at :math:`x\cdot y = \pm 1`), so :math:`\beta = 1000`
works in float64 and a truncation tail is a fraction of the kernel's scale
:math:`e^{|\beta|}`.

**Mode count.**  :math:`K` (or :math:`L`) is the smallest order whose tail
:math:`E_K = \sum_{|k| > K}\omega_k` is at most :math:`\min(\mathrm{tol}/64, u)`
(:math:`u = 2^{-53}`: a few modes more make truncation negligible next to round-off,
whatever the tolerance).  Tail bound (proved):
the power series :math:`I_\nu(x) = \sum_m (x/2)^{2m+\nu}/(m!\,\Gamma(m+\nu+1))` gives,
term by term, :math:`I_{\nu+1}(x) \le \frac{x}{2(\nu+1)} I_\nu(x)` for :math:`x \ge 0`;
hence beyond :math:`k^* \ge |\beta|` the terms fall at least by half and
:math:`\sum_{k > k^*} I_k \le 2 I_{k^*+1}`.  On the sphere
:math:`i_l(x) = \sqrt{\pi/2x}\,I_{l+1/2}(x)` gives
:math:`\omega_{l+1} \le \frac{|\beta|}{2l+1}\omega_l`, so beyond :math:`2l^*+1 \ge 2|\beta|`
:math:`\sum_{l > l^*}\omega_l \le 2\omega_{l^*+1}`.  :math:`E_K` is the exact sum of the
terms up to :math:`k^*` (summed smallest first) plus that bound.

**Error bound.**  With the segment's weights summing to :math:`W = 1`, every moment
satisfies :math:`|\hat c_k| \le W` (circle; on the sphere
:math:`\sum_m |Y_{lm}(x)\hat c_{lm}| \le \frac{2l+1}{4\pi}W` by Cauchy–Schwarz and the
addition theorem), so truncation changes :math:`e^{-|\beta|}F_c` by at most
:math:`E_K W`.  Round-off of the moments and of the mode sums (absolute, against the
same scale) is bounded by the probabilistic model of Higham & Mary (SIAM J. Sci. Comput.
41(5), 2019): :math:`R = \lambda u \sqrt{D}\,W` with :math:`\lambda = 6`,
:math:`u = 2^{-53}` and :math:`D` the summation depth (moments and mode sum, see
:func:`roundoff`) plus :math:`2\sum_k \omega_k |k|` (the recurrences for
:math:`e^{ik\theta}` and the Legendre functions lose :math:`O(k u)` at order :math:`k`).
Writing :math:`\hat F, \hat N` for the computed scaled denominator and numerator,
:math:`|\hat N - N| \le E_K + R` and :math:`|\hat F - F| \le E_K + R`, and since
:math:`|\Gamma| \le 1`,

.. math::
    |\hat\Gamma(x) - \Gamma(x)| = \frac{|(\hat N - N) - \Gamma(\hat F - F)|}{\hat F}
    \le \frac{2(E_K + R)}{\hat F(x)} \quad\text{(softmax)},\qquad
    \frac{|\hat\Gamma - \Gamma|}{e^{|\beta| - c}\hat F(x)} \le \frac{E_K + R}{\hat F(x)}
    \quad\text{(exp)}.

This per-query bound is computed for every query; queries where it exceeds ``tol``
(little mass near the query: :math:`\hat F \ll 1`) are evaluated by the direct sum over
their segment's keys (exact, :math:`O(N)` each) and counted in
``info["harmonic_direct_queries"]``.  Where even :math:`\hat F = W` cannot meet ``tol``
(float64 round-off, e.g. ``tol = 1e-15`` at :math:`\beta = 1000`) the evaluator refuses
up front with the smallest achievable tolerance.

Tokens and queries are used through their radial projections :math:`x/|x|`: exact on
the sphere, and the natural extension of the field at Runge–Kutta stage points off it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import ive

from ..attention import Attention, AttentionParams
from ..backends import to_host
from ..backends.ranges import KeyRanges
from ..errors import ArgumentError
from . import harmonic_sphere
from .kinds import HEAD_FIELDS, FieldContext

__all__ = ["DEFAULT_HARMONIC_TOL", "HARMONIC_KINDS", "LAMBDA", "METHODS", "HarmonicField", "Modes", "harmonic_modes",
           "isotropic_sign", "roundoff"]

#: the field evaluation methods: the direct sum over token pairs, or the harmonic expansion
METHODS = ("direct", "harmonic")
#: default ``harmonic_tol``: the per-query error bound of the harmonic field
DEFAULT_HARMONIC_TOL = 1e-13
#: attention kinds the harmonic field evaluates
HARMONIC_KINDS = ("softmax", "exp")
#: the probabilistic round-off constant :math:`\lambda` of the error bound
LAMBDA = 6.0
_U = 2.0 ** -53
#: tokens per chunk of the NumPy moments (memory O(chunk * modes))
_CHUNK_ELEMENTS = 1 << 20


class Modes:
    r"""The truncated expansion of :math:`e^{-|\beta|}e^{\beta t}` for one :math:`\beta`.

    Attributes
    ----------
    d : int
        2 (circle: Fourier modes :math:`|k| \le K`) or 3 (sphere: degrees :math:`l \le L`).
    order : int
        :math:`K` or :math:`L`.
    coef : ndarray (order + 1,)
        Signed scaled coefficients: :math:`e^{-|\beta|}I_k(\beta)` (circle) or
        :math:`(2l+1)e^{-|\beta|}i_l(\beta)` (sphere).
    tail : float
        :math:`E_K`, the bound on the dropped part (see the module docstring).
    kbar : float
        :math:`\sum \omega_k |k|`, the mean order of the expansion.
    """

    def __init__(self, d: int, order: int, coef: np.ndarray, tail: float, kbar: float):
        self.d, self.order, self.coef, self.tail, self.kbar = d, order, coef, tail, kbar


def _omega(beta: float, d: int, n: int) -> np.ndarray:
    """Unsigned scaled coefficients of orders 0..n-1."""
    x = abs(beta)
    k = np.arange(n, dtype=float)
    if d == 2:
        return ive(k, x)
    if x == 0.0:
        out = np.zeros(n)
        out[0] = 1.0
        return out
    return (2.0 * k + 1.0) * math.sqrt(math.pi / (2.0 * x)) * ive(k + 0.5, x)


def harmonic_modes(beta: float, d: int, tol: float) -> Modes:
    r"""The modes of the kernel :math:`e^{\beta\langle x, y\rangle}` on :math:`S^{d-1}`
    (``d`` = 2 or 3) whose dropped tail :math:`E_K` is at most :math:`\min(\mathrm{tol}/64,
    2^{-53})`.

    Examples
    --------
    >>> m = harmonic_modes(5.0, 2, 1e-13)
    >>> m.order, m.tail <= 2.0 ** -53
    (23, True)
    """
    x = abs(float(beta))
    kstar = int(math.ceil(x)) + int(math.ceil(10.0 * math.sqrt(x))) + 48
    om = _omega(beta, d, kstar + 2)
    # tails[k] = sum_{m >= k} omega_m (m <= k*), summed smallest first, + the bound
    far = 2.0 * om[kstar + 1]
    tails = np.cumsum(om[kstar::-1])[::-1] + far
    mult = 2.0 if d == 2 else 1.0         # the circle's modes come in pairs +-k
    # E_K = mult * tails[K + 1]
    ok = np.nonzero(mult * tails[1:] <= min(tol / 64.0, _U))[0]
    if ok.size == 0:
        raise ArgumentError(f"harmonic_tol={tol:g}: no mode count up to {kstar} reaches it "
                            f"at beta={beta:g}")
    order = int(ok[0])
    tail = float(mult * tails[order + 1])
    sign = -1.0 if beta < 0 else 1.0
    coef = om[:order + 1] * sign ** np.arange(order + 1)
    kk = np.arange(kstar + 2)
    kbar = float(mult * np.sum(om * kk))
    return Modes(d, order, coef, tail, kbar)


def roundoff(modes: Modes, depth: float) -> float:
    r""":math:`R = \lambda u\sqrt{D + 2\bar k + 10}`: the round-off bound (per unit mass)
    of sums of summation depth ``depth`` :math:`= D` (moments and mode sum), with
    :math:`2\bar k + 10` for the recurrences of the powers and Legendre functions."""
    return LAMBDA * _U * math.sqrt(depth + 2.0 * modes.kbar + 10.0)


def isotropic_sign(att: Attention, name: str = "field") -> float:
    r"""The sign :math:`s` of :math:`V = sI` when ``att`` is isotropic attention the
    harmonic field evaluates; :class:`~transformer_pde.errors.ArgumentError` naming
    ``name`` and what is not isotropic otherwise."""
    def refuse(what: str) -> ArgumentError:
        return ArgumentError(f"{name}: method='harmonic' evaluates isotropic attention only "
                             f"(kind softmax or exp, d = 2 or 3, Q = K = I, V = +-I, one "
                             f"head, no mask, biases, rotary or output map); {what}")
    if att.kind not in HARMONIC_KINDS:
        raise refuse(f"kind={att.kind!r}")
    if att.d not in (2, 3):
        raise refuse(f"d={att.d}")
    if att.heads != 1:
        raise refuse(f"heads={att.heads}")
    if att.masked:
        raise refuse("masked=True")
    if att.rotary is not None:
        raise refuse("rotary positions are set")
    if att.alibi is not None:
        raise refuse("alibi slopes are set")
    if att.has_bias:
        raise refuse("a bias is set")
    if att.W_O is not None:
        raise refuse("W_O is set")
    eye = np.eye(att.d)
    for m in ("Q", "K", "V"):
        if not isinstance(getattr(att, m), np.ndarray):
            raise refuse(f"{m} depends on time")
    for m in ("Q", "K"):
        if not np.array_equal(getattr(att, m), eye):
            raise refuse(f"{m} is not the identity")
    if np.array_equal(att.V, eye):
        return 1.0
    if np.array_equal(att.V, -eye):
        return -1.0
    raise refuse("V is neither I nor -I")


def _zero_row(name: str, i: int) -> ArgumentError:
    return ArgumentError(f"{name}: row {i} is zero (or not finite); method='harmonic' "
                         "evaluates the field at the radial projections x/|x|")


def unit_rows(X: np.ndarray, name: str) -> np.ndarray:
    """``X / |X|`` row by row; a zero row raises ArgumentError naming ``name``."""
    r = np.sqrt((X * X).sum(axis=1))
    if not np.all(r > 0):
        raise _zero_row(name, int(np.nonzero(~(r > 0))[0][0]))
    return X / r[:, None]


class HarmonicField:
    r"""The harmonic evaluation of one isotropic attention over a fixed token set.

    Parameters
    ----------
    att : Attention
        Accepted by :func:`isotropic_sign`.
    n : int
        Number of tokens (keys).
    weights : ndarray (N,)
        Token weights, normalised to one in each segment.
    bounds : list of (start, end) or None
        The segments (``None``: one).
    backend : backend object
    tol : float
        ``harmonic_tol``: the per-query bound (module docstring) every answer meets.

    Attributes
    ----------
    modes : Modes
    info : dict
        ``harmonic_modes`` (:math:`K` or :math:`L`), ``harmonic_evaluations``,
        ``harmonic_direct_queries`` (queries evaluated by the direct sum, total).
    """

    def __init__(self, att: Attention, n: int, weights: np.ndarray, bounds: Any,
                 backend: Any, tol: float):
        self.sign = isotropic_sign(att)
        self.kind, self.d, self.beta, self.shift = att.kind, att.d, att.beta, att.shift
        self.tol = float(tol)
        self.be = backend
        self.w = np.asarray(weights, dtype=np.float64)
        self.bounds = [(0, n)] if bounds is None else [(int(s), int(e)) for s, e in bounds]
        self.n = n
        self.seg = np.zeros(n, dtype=np.int64)
        for b, (s, e) in enumerate(self.bounds):
            self.seg[s:e] = b
        self.modes = harmonic_modes(self.beta, self.d, self.tol)
        nmax = max(e - s for s, e in self.bounds)
        K = self.modes.order
        self._numba = getattr(backend, "name", "") == "numba"
        self.R = roundoff(self.modes, self._depth(nmax))
        self.c = 2.0 if self.kind == "softmax" else 1.0
        best = self.c * (self.modes.tail + self.R)
        if best > self.tol:
            raise ArgumentError(
                f"harmonic_tol={self.tol:g} is below what float64 harmonic sums reach at "
                f"beta={self.beta:g} with {nmax} tokens ({K} modes): the smallest achievable "
                f"tolerance is about {best:.1e}; raise harmonic_tol or use method='direct'")
        self.info = {"harmonic_modes": K, "harmonic_evaluations": 0,
                     "harmonic_direct_queries": 0}

    def _depth(self, nmax: int) -> int:
        """Summation depth of the moments of ``nmax`` tokens and of the mode sums, as the
        backend's code sums them (see :func:`roundoff`)."""
        K, lg = self.modes.order, math.ceil(math.log2(max(nmax, 2)))
        if self._numba:
            from ..backends.numba import harmonic as nb  # noqa: PLC0415 (Numba is optional)
            blk = nb.BLOCK if self.d == 2 else nb.sphere_block(self.n, (K + 1) ** 2)
            lgb = math.ceil(math.log2(max(-(-nmax // blk), 2)))    # pairwise over blocks
            modes = nb.MODE_RUN + K // nb.MODE_RUN + 2 if self.d == 2 else 3 * K + 3
            return nb.SUB + blk // nb.SUB + lgb + 16 + modes
        # NumPy: pairwise sums of chunks and of the chunks' sums; pairwise mode sums
        return lg + 32 + math.ceil(math.log2((K + 1) ** (self.d - 1) + 1)) + 16

    # ------------------------------------------------------------------ evaluation
    def __call__(self, P: AttentionParams, X: Any, queries: Any = None) -> Any:
        """The field of the tokens ``X`` (backend array) at ``X`` or at ``queries``
        (``P``: the attention's parameters, for the queries answered by the direct sum)."""
        be = self.be
        dtype = X.dtype
        Xh = self._unit(X, "X")
        if queries is None:
            Qh, qseg = Xh, self.seg
        else:
            Qh = self._unit(queries, "queries")
            qseg = np.zeros(Qh.shape[0], dtype=np.int64)
        thr = self.c * (self.modes.tail + self.R)
        if self.kind == "softmax":
            post, scale, e = 1, self.sign, 0
        else:                       # e^{|beta| - shift} N, the power of two apart (exact)
            e = max(0, math.floor((abs(self.beta) - self.shift) / math.log(2.0)) - 1000)
            r = abs(self.beta) - self.shift - e * math.log(2.0)
            post, scale = 2, self.sign * math.exp(r)
        if self._numba and self.d == 2:      # one fused pass: sums, field, bound
            from ..backends.numba import harmonic as nb  # noqa: PLC0415 (Numba is optional)
            _, out, flag = nb.circle_field(be, Xh, self.w, self.bounds, Qh, qseg,
                                           self.modes.coef, post, thr, self.tol, scale)
            bad = np.flatnonzero(flag)
        else:
            F, Nn = self._sums(Xh, Qh, qseg)
            with np.errstate(divide="ignore", invalid="ignore"):
                bound = np.where(F > 0, thr / F, np.inf)
                out = Nn * (scale / F)[:, None] if post == 1 else Nn * scale
            bad = np.nonzero(~(bound <= self.tol))[0]
        if e:
            out = np.ldexp(out, e)
        if bad.size:
            out[bad] = self._direct(P, Xh, Qh[bad], qseg[bad])
        self.info["harmonic_evaluations"] += 1
        self.info["harmonic_direct_queries"] += int(bad.size)
        return be.asarray(np.ascontiguousarray(out), dtype)

    def _unit(self, X: Any, name: str) -> np.ndarray:
        """The host rows ``X / |X|`` (:func:`unit_rows`; in one compiled pass with Numba)."""
        Xh = np.asarray(to_host(X), dtype=np.float64)
        if not self._numba:
            return unit_rows(Xh, name)
        from ..backends.numba import harmonic as nb  # noqa: PLC0415 (Numba is optional)
        out, first = nb.unit_rows(Xh)
        if first >= 0:
            raise _zero_row(name, first)
        return out

    def _sums(self, Xh: np.ndarray, Qh: np.ndarray, qseg: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """Scaled :math:`\\hat F_w` (M,) and numerator :math:`\\hat N` (M, d) at ``Qh``."""
        if self._numba:
            from ..backends.numba import harmonic as nb  # noqa: PLC0415 (Numba is optional)
            return nb.harmonic_sums(self.be, self.d, Xh, self.w, self.bounds, Qh, qseg,
                                    self.modes.coef)
        if self.d == 2:
            return _circle_sums(Xh, self.w, self.bounds, Qh, qseg, self.modes.coef)
        return harmonic_sphere.sphere_sums(Xh, self.w, self.bounds, Qh, qseg, self.modes.coef)

    def _direct(self, P: AttentionParams, Xh: np.ndarray, Qb: np.ndarray, qseg: np.ndarray
                ) -> np.ndarray:
        """The direct field (the kind's registered head field) at the queries ``Qb``, each
        over its segment's keys."""
        be = self.be
        lo = np.array([self.bounds[s][0] for s in qseg], dtype=np.int64)
        hi = np.array([self.bounds[s][1] for s in qseg], dtype=np.int64)
        with np.errstate(divide="ignore"):
            logw = np.log(self.w)
        ctx = FieldContext(be, be.asarray(self.w, np.float64), be.asarray(logw, np.float64),
                           KeyRanges(lo, hi, self.n))
        with np.errstate(over="ignore", invalid="ignore"):
            out = HEAD_FIELDS[self.kind](ctx, P, 0, P.score_heads[0],
                                         be.asarray(Qb, np.float64), be.asarray(Xh, np.float64))
        return np.asarray(to_host(out))

    def get_info(self) -> dict[str, int]:
        return dict(self.info)

    def set_info(self, info: dict[str, Any]) -> None:
        for key in ("harmonic_evaluations", "harmonic_direct_queries"):
            self.info[key] = int(info[key])


# ------------------------------------------------------------------ circle, NumPy
def circle_moments(z: np.ndarray, w: np.ndarray, count: int) -> np.ndarray:
    r"""``M[k] = sum_j w_j conj(z_j)^k`` for ``k < count``: chunks of tokens summed
    pairwise (NumPy's pairwise sum along the contiguous axis), then the chunks' sums
    summed pairwise."""
    n = z.shape[0]
    chunk = max(256, _CHUNK_ELEMENTS // max(count, 1))
    zc = np.conj(z)
    parts = []
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        P = np.empty((count, b - a), dtype=np.complex128)
        P[0] = w[a:b]
        for k in range(1, count):
            np.multiply(P[k - 1], zc[a:b], out=P[k])
        parts.append(P.sum(axis=1))
    if not parts:
        return np.zeros(count, dtype=np.complex128)
    return np.ascontiguousarray(np.array(parts).T).sum(axis=1)


def _circle_sums(X: np.ndarray, w: np.ndarray, bounds: list, Q: np.ndarray,
                 qseg: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Scaled :math:`F_w` and numerator (M, 2) on the circle.

    :math:`F = \mathrm{Re}\sum_{k=0}^{K}\tilde a_k q^k M_k` (:math:`\tilde a_0 = a_0`,
    :math:`\tilde a_k = 2a_k`) and the complex numerator
    :math:`N = a_0\overline{M_1} + \sum_{k=1}^K a_k\big(q^k M_{k-1} + \overline{q^k M_{k+1}}\big)`
    with :math:`q = e^{i\theta}`."""
    K = coef.shape[0] - 1
    z = X[:, 0] + 1j * X[:, 1]
    M = np.stack([circle_moments(z[s:e], w[s:e], K + 2) for s, e in bounds])
    q = Q[:, 0] + 1j * Q[:, 1]
    m = q.shape[0]
    F = np.empty(m)
    N = np.empty((m, 2))
    at = coef.astype(np.complex128)
    at[1:] *= 2.0
    a = coef[1:]
    chunk = max(64, _CHUNK_ELEMENTS // (K + 2))
    for s0 in range(0, m, chunk):
        s1 = min(m, s0 + chunk)
        Ms = M[qseg[s0:s1]]
        P = np.empty((K + 1, s1 - s0), dtype=np.complex128)
        P[0] = 1.0
        for k in range(1, K + 1):
            np.multiply(P[k - 1], q[s0:s1], out=P[k])
        P = np.ascontiguousarray(P.T)
        F[s0:s1] = (P * (at * Ms[:, :K + 1])).sum(axis=1).real
        Pk = P[:, 1:]
        num = coef[0] * np.conj(Ms[:, 1])
        if K:
            num = num + (a * (Pk * Ms[:, :K] + np.conj(Pk * Ms[:, 2:K + 2]))).sum(axis=1)
        N[s0:s1, 0], N[s0:s1, 1] = num.real, num.imag
    return F, N
