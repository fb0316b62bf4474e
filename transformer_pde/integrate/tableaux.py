r"""Butcher tableaux of the explicit Runge–Kutta methods used in the package, as data.

An explicit :math:`s`-stage Runge–Kutta method for :math:`\dot y = F(t, y)` advances one
step of size :math:`h` by

.. math:: k_i = F\Big(t_n + c_i h,\; y_n + h \sum_{j<i} a_{ij} k_j\Big), \quad i = 1..s,
          \qquad y_{n+1} = y_n + h \sum_i b_i k_i .

An *embedded* pair also gives error weights :math:`e` (the difference of the propagated
weights :math:`b` and a lower-order set :math:`\hat b`); the local error estimate is
:math:`h \sum_i e_i k_i` where the sum runs over the :math:`s` stages **and** the field
:math:`k_{s+1} = F(t_{n+1}, y_{n+1})` at the new point (first-same-as-last, FSAL: that
evaluation is also the next step's :math:`k_1`).

Every table is a frozen :class:`ButcherTableau` whose arrays are plain, read-only NumPy
float64 arrays (attributes ``c``, ``A``, ``b``, ``e``, ``e_aux``), so compiled kernels
(numba) can take them as arguments.

The DOP853 coefficients are those of Hairer's ``DOP853`` code (Hairer, Nørsett, Wanner,
*Solving Ordinary Differential Equations I*, 2nd ed., §II.10): eight-order propagation,
with a fifth-order (``e``) and a third-order (``e_aux``) error estimate combined as
:math:`\mathrm{err} = \mathrm{err}_5^2 / \sqrt{\mathrm{err}_5^2 + 0.01\,\mathrm{err}_3^2}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CLASSICAL_RK4", "DOP853", "DOPRI5", "EULER", "HEUN", "TABLEAUX", "ButcherTableau"]


def _readonly(a: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    arr = np.array(a, dtype=np.float64)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class ButcherTableau:
    r"""Coefficients of an explicit Runge–Kutta method (optionally an embedded pair).

    Parameters
    ----------
    name : str
    c : array (s,)
        Nodes :math:`c_i` (``c[0] = 0``).
    A : array (s, s)
        Strictly lower-triangular stage weights :math:`a_{ij}`.
    b : array (s,)
        Propagated weights :math:`b_i` (:math:`\sum_i b_i = 1`).
    order : int
        Order of the propagated solution.
    e : array (s + 1,) or None
        Error weights :math:`b - \hat b` over the stages and the FSAL evaluation (last
        entry); ``None`` for a fixed-step method.
    error_order : int or None
        Order :math:`\hat p` of the error estimator; step-size control uses exponents
        built from :math:`\hat p + 1` (the local error is :math:`O(h^{\hat p + 1})`).
    fsal : bool
        Whether :math:`F(t_{n+1}, y_{n+1})` is evaluated in every step (for the error
        estimate) and reused as the next step's first stage.
    e_aux : array (s + 1,) or None
        Second error estimate (DOP853's third-order one), see the module docstring.
    b_den : int
        ``0``, or a common denominator :math:`D` such that :math:`D\,b_i` are small integers:
        then steppers form :math:`y + (h/D)\sum_i (D b_i) k_i`, one rounding less per stage
        than :math:`\sum_i (h b_i) k_i` (the classical way of writing RK4 as
        :math:`y + \tfrac h6 (k_1 + 2k_2 + 2k_3 + k_4)`).
    """

    name: str
    c: np.ndarray
    A: np.ndarray
    b: np.ndarray
    order: int
    e: np.ndarray | None = None
    error_order: int | None = None
    fsal: bool = False
    e_aux: np.ndarray | None = None
    b_den: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("c", "A", "b", "e", "e_aux"):
            set_(self, name, _readonly(getattr(self, name)))
        s = self.c.shape[0]
        if self.A.shape != (s, s) or self.b.shape != (s,):
            raise ValueError(f"{self.name}: c, A, b must have shapes (s,), (s, s), (s,)")
        if np.any(np.triu(self.A) != 0.0):
            raise ValueError(f"{self.name}: A must be strictly lower triangular (explicit)")
        for name in ("e", "e_aux"):
            v = getattr(self, name)
            if v is not None and v.shape != (s + 1,):
                raise ValueError(f"{self.name}: {name} must have shape (s + 1,) = ({s + 1},)")
        if (self.e is None) != (self.error_order is None):
            raise ValueError(f"{self.name}: e and error_order go together")
        if self.b_den:
            num = self.b * self.b_den
            if np.any(num != np.rint(num)):
                raise ValueError(f"{self.name}: b * b_den must be integers")

    @property
    def n_stages(self) -> int:
        """Number of stages :math:`s` (the FSAL evaluation not counted)."""
        return int(self.c.shape[0])

    @property
    def adaptive(self) -> bool:
        """Whether the table is an embedded pair (has error weights)."""
        return self.e is not None

    @property
    def b_num(self) -> np.ndarray:
        """The integers :math:`D b_i` when ``b_den = D > 0``."""
        if not self.b_den:
            raise ValueError(f"{self.name}: no common denominator (b_den = 0)")
        return np.rint(self.b * self.b_den)

    def __repr__(self) -> str:
        kind = f"embedded {self.order}({self.error_order})" if self.adaptive else \
            f"order {self.order}"
        return f"ButcherTableau({self.name!r}, s={self.n_stages}, {kind})"


def _lower(s: int, rows: Mapping[int, Mapping[int, float]]) -> np.ndarray:
    A = np.zeros((s, s))
    for i, row in rows.items():
        for j, v in row.items():
            A[i, j] = v
    return A


def _vec(n: int, entries: Mapping[int, float]) -> np.ndarray:
    v = np.zeros(n)
    for j, x in entries.items():
        v[j] = x
    return v


#: explicit Euler, order 1
EULER = ButcherTableau("euler", c=[0.0], A=[[0.0]], b=[1.0], order=1, b_den=1)

#: Heun's method (explicit trapezoidal rule), order 2
HEUN = ButcherTableau("heun", c=[0.0, 1.0], A=[[0.0, 0.0], [1.0, 0.0]], b=[0.5, 0.5],
                      order=2, b_den=2)

#: classical fourth-order Runge–Kutta
CLASSICAL_RK4 = ButcherTableau(
    "rk4", c=[0.0, 0.5, 0.5, 1.0],
    A=_lower(4, {1: {0: 0.5}, 2: {1: 0.5}, 3: {2: 1.0}}),
    b=[1 / 6, 1 / 3, 1 / 3, 1 / 6], order=4, b_den=6)

#: Dormand–Prince 5(4) (``ode45``/``RK45``): 6 stages + FSAL, local extrapolation
DOPRI5 = ButcherTableau(
    "dopri5", c=[0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0],
    A=_lower(6, {
        1: {0: 1 / 5},
        2: {0: 3 / 40, 1: 9 / 40},
        3: {0: 44 / 45, 1: -56 / 15, 2: 32 / 9},
        4: {0: 19372 / 6561, 1: -25360 / 2187, 2: 64448 / 6561, 3: -212 / 729},
        5: {0: 9017 / 3168, 1: -355 / 33, 2: 46732 / 5247, 3: 49 / 176, 4: -5103 / 18656},
    }),
    b=[35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84],
    e=[71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40],
    order=5, error_order=4, fsal=True)


def _dop853() -> ButcherTableau:
    s = 12
    c = [0.0,
         0.526001519587677318785587544488e-01,
         0.789002279381515978178381316732e-01,
         0.118350341907227396726757197510,
         0.281649658092772603273242802490,
         0.333333333333333333333333333333,
         0.25,
         0.307692307692307692307692307692,
         0.651282051282051282051282051282,
         0.6,
         0.857142857142857142857142857142,
         1.0]
    rows = {
        1: {0: 5.26001519587677318785587544488e-2},
        2: {0: 1.97250569845378994544595329183e-2, 1: 5.91751709536136983633785987549e-2},
        3: {0: 2.95875854768068491816892993775e-2, 2: 8.87627564304205475450678981324e-2},
        4: {0: 2.41365134159266685502369798665e-1, 2: -8.84549479328286085344864962717e-1,
            3: 9.24834003261792003115737966543e-1},
        5: {0: 3.7037037037037037037037037037e-2, 3: 1.70828608729473871279604482173e-1,
            4: 1.25467687566822425016691814123e-1},
        6: {0: 3.7109375e-2, 3: 1.70252211019544039314978060272e-1,
            4: 6.02165389804559606850219397283e-2, 5: -1.7578125e-2},
        7: {0: 3.70920001185047927108779319836e-2, 3: 1.70383925712239993810214054705e-1,
            4: 1.07262030446373284651809199168e-1, 5: -1.53194377486244017527936158236e-2,
            6: 8.27378916381402288758473766002e-3},
        8: {0: 6.24110958716075717114429577812e-1, 3: -3.36089262944694129406857109825,
            4: -8.68219346841726006818189891453e-1, 5: 2.75920996994467083049415600797e1,
            6: 2.01540675504778934086186788979e1, 7: -4.34898841810699588477366255144e1},
        9: {0: 4.77662536438264365890433908527e-1, 3: -2.48811461997166764192642586468,
            4: -5.90290826836842996371446475743e-1, 5: 2.12300514481811942347288949897e1,
            6: 1.52792336328824235832596922938e1, 7: -3.32882109689848629194453265587e1,
            8: -2.03312017085086261358222928593e-2},
        10: {0: -9.3714243008598732571704021658e-1, 3: 5.18637242884406370830023853209,
             4: 1.09143734899672957818500254654, 5: -8.14978701074692612513997267357,
             6: -1.85200656599969598641566180701e1, 7: 2.27394870993505042818970056734e1,
             8: 2.49360555267965238987089396762, 9: -3.0467644718982195003823669022},
        11: {0: 2.27331014751653820792359768449, 3: -1.05344954667372501984066689879e1,
             4: -2.00087205822486249909675718444, 5: -1.79589318631187989172765950534e1,
             6: 2.79488845294199600508499808837e1, 7: -2.85899827713502369474065508674,
             8: -8.87285693353062954433549289258, 9: 1.23605671757943030647266201528e1,
             10: 6.43392746015763530355970484046e-1},
    }
    b = _vec(s, {0: 5.42937341165687622380535766363e-2, 5: 4.45031289275240888144113950566,
                 6: 1.89151789931450038304281599044, 7: -5.8012039600105847814672114227,
                 8: 3.1116436695781989440891606237e-1, 9: -1.52160949662516078556178806805e-1,
                 10: 2.01365400804030348374776537501e-1,
                 11: 4.47106157277725905176885569043e-2})
    # fifth-order error weights b - b5 (the FSAL entry is 0)
    e5 = _vec(s + 1, {0: 0.1312004499419488073250102996e-1,
                      5: -0.1225156446376204440720569753e+1,
                      6: -0.4957589496572501915214079952,
                      7: 0.1664377182454986536961530415e+1,
                      8: -0.3503288487499736816886487290,
                      9: 0.3341791187130174790297318841,
                      10: 0.8192320648511571246570742613e-1,
                      11: -0.2235530786388629525884427845e-1})
    # third-order error weights b - b3, where b3 has three non-zero weights
    e3 = np.zeros(s + 1)
    e3[:s] = b
    e3[0] -= 0.244094488188976377952755905512
    e3[8] -= 0.733846688281611857341361741547
    e3[11] -= 0.220588235294117647058823529412e-1
    return ButcherTableau("dop853", c=c, A=_lower(s, rows), b=b, e=e5, e_aux=e3,
                          order=8, error_order=7, fsal=True)


#: Dormand–Prince 8(5,3) of Hairer's DOP853: 12 stages + FSAL
DOP853 = _dop853()

#: every tableau by name
TABLEAUX: dict[str, ButcherTableau] = {
    t.name: t for t in (EULER, HEUN, CLASSICAL_RK4, DOPRI5, DOP853)}
