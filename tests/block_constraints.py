"""Constraints for tests of the block machinery."""

from __future__ import annotations


class Centre:
    """A constraint that is not token-wise: it recentres the whole token set, so applied to
    packed segments or ensemble members it would mix them (runs with several segments must
    refuse it)."""

    name = "centre"

    def tangent(self, X, F):
        return F - F.mean(axis=0)

    def retract(self, X, t, *, left=False):
        return X - X.mean(axis=0)

    def initial(self, X0):
        return X0
