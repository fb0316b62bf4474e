"""Butcher tableaux (transformer_pde.integrate.tableaux) and layer jump times (breakpoints).

The order conditions are checked with rooted trees: a method has order p iff
sum_i b_i Phi_i(t) = 1 / gamma(t) for every rooted tree t with at most p vertices
(Butcher; Hairer-Norsett-Wanner I, Thm II.2.13).  There are 200 trees up to order 8.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from transformer_pde import Attention, Layers
from transformer_pde.integrate import breakpoints as bp
from transformer_pde.integrate.tableaux import (
    CLASSICAL_RK4,
    DOP853,
    DOPRI5,
    EULER,
    HEUN,
    TABLEAUX,
    ButcherTableau,
)


@functools.cache
def trees(n: int) -> tuple:
    """Rooted trees with n vertices, each a sorted tuple of child trees."""
    if n == 1:
        return ((),)
    out = set()
    # children multiset with total size n - 1, built by partitions into tree sizes
    def forests(total, max_tree):
        if total == 0:
            yield ()
            return
        for size in range(1, total + 1):
            for t in trees(size):
                key = (size, t)
                if max_tree is not None and key > max_tree:
                    continue
                for rest in forests(total - size, key):
                    yield (t,) + rest
    for f in forests(n - 1, None):
        out.add(tuple(sorted(f)))
    return tuple(sorted(out))


def size(t) -> int:
    return 1 + sum(size(c) for c in t)


def gamma(t) -> int:
    g = size(t)
    for c in t:
        g *= gamma(c)
    return g


def phi(A, t) -> np.ndarray:
    v = np.ones(A.shape[0])
    for c in t:
        v = v * (A @ phi(A, c))
    return v


def residuals(A, b, p):
    """max |b . Phi(t) - 1/gamma(t)| over trees of each order 1..p."""
    return [max(abs(b @ phi(A, t) - 1.0 / gamma(t)) for t in trees(n)) for n in range(1, p + 1)]


def test_tree_counts():
    assert [len(trees(n)) for n in range(1, 9)] == [1, 1, 2, 4, 9, 20, 48, 115]


def extended(tab: ButcherTableau):
    """A, c with the FSAL evaluation appended as an extra stage (row b, node 1)."""
    s = tab.n_stages
    A = np.zeros((s + 1, s + 1))
    A[:s, :s] = tab.A
    A[s, :s] = tab.b
    return A, np.append(tab.b, 0.0)


@pytest.mark.parametrize("tab", list(TABLEAUX.values()), ids=list(TABLEAUX))
def test_order_conditions(tab):
    # row-sum condition c = A 1 (to rounding of the decimal coefficients)
    np.testing.assert_allclose(tab.A.sum(axis=1), tab.c, atol=1e-15)
    res = residuals(tab.A, tab.b, tab.order + 1)
    assert max(res[:tab.order]) < 1e-13, res
    # the order is exactly p: some condition of order p + 1 fails
    assert res[tab.order] > 1e-6


@pytest.mark.parametrize("tab,orders", [(DOPRI5, {"e": 4}), (DOP853, {"e": 5, "e_aux": 3})])
def test_embedded_orders(tab, orders):
    A, b = extended(tab)
    for name, p in orders.items():
        bhat = b - getattr(tab, name)
        res = residuals(A, bhat, p + 1)
        assert max(res[:p]) < 1e-13, (name, res)
        assert res[p] > 1e-6, (name, res)
    assert tab.fsal and tab.adaptive


def test_equal_to_scipy():
    # test-only import of scipy's private coefficient tables: the project keeps its own
    from scipy.integrate._ivp import dop853_coefficients as c
    from scipy.integrate._ivp.rk import RK45
    s = c.N_STAGES
    assert DOP853.n_stages == s
    np.testing.assert_array_equal(DOP853.c, c.C[:s])
    np.testing.assert_array_equal(DOP853.A, c.A[:s, :s])
    np.testing.assert_array_equal(DOP853.b, c.B)
    np.testing.assert_array_equal(DOP853.e, c.E5)
    np.testing.assert_array_equal(DOP853.e_aux, c.E3)
    np.testing.assert_array_equal(DOPRI5.c, RK45.C)
    np.testing.assert_array_equal(DOPRI5.A[:, :RK45.A.shape[1]], RK45.A)
    assert not DOPRI5.A[:, RK45.A.shape[1]:].any()
    np.testing.assert_array_equal(DOPRI5.b, RK45.B)
    np.testing.assert_array_equal(DOPRI5.e, -RK45.E)  # scipy stores b_hat - b
    assert (DOPRI5.order, DOPRI5.error_order) == (RK45.order, RK45.error_estimator_order)


def test_tableaux_are_readonly_arrays():
    for tab in TABLEAUX.values():
        for name in ("c", "A", "b"):
            arr = getattr(tab, name)
            assert isinstance(arr, np.ndarray) and arr.dtype == np.float64
            assert not arr.flags.writeable
    assert CLASSICAL_RK4.b_num.tolist() == [1, 2, 2, 1]
    assert HEUN.b_num.tolist() == [1, 1] and EULER.b_num.tolist() == [1]
    with pytest.raises(ValueError, match="no common denominator"):
        _ = DOPRI5.b_num


def test_tableau_validation():
    with pytest.raises(ValueError, match="strictly lower"):
        ButcherTableau("bad", c=[0.0], A=[[1.0]], b=[1.0], order=1)
    with pytest.raises(ValueError, match="e and error_order"):
        ButcherTableau("bad", c=[0.0], A=[[0.0]], b=[1.0], order=1, e=[0.0, 0.0])


# ------------------------------------------------------------------ breakpoints
def test_breakpoints():
    Qs = Layers(np.stack([np.eye(2) * (i + 1) for i in range(4)]), layer_time=0.5, t0=0.25)
    att = Attention("softmax", Qs, np.eye(2), np.eye(2))
    tabs = bp.layer_tables(att)
    assert tabs == [Qs]
    assert bp.layer_tables(None, [att, att]) == [Qs, Qs]
    np.testing.assert_array_equal(bp.jump_times(tabs, 0.0, 10.0), [0.75, 1.25, 1.75])
    np.testing.assert_array_equal(bp.jump_times(tabs, 0.75, 1.75), [1.25])
    assert bp.next_jump(tabs, 0.0) == 0.75
    assert bp.next_jump(tabs, 0.75) == 1.25          # at a jump: the one after it
    assert bp.next_jump(tabs, 0.75 - 1e-12) == 1.25  # rounds to the boundary
    assert bp.next_jump(tabs, 1.8) == np.inf
    assert bp.next_jump([], 0.0) == np.inf
    assert bp.is_jump(tabs, 1.25) and not bp.is_jump(tabs, 1.0)
    assert not bp.is_jump(tabs, 0.25)                 # start of layer 0 is not a jump
