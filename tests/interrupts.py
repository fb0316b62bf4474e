"""A parameter of time that interrupts a run once: the Ctrl-C of the resume tests."""

from __future__ import annotations


class StopOnce:
    """A constant matrix ``M`` of time that raises KeyboardInterrupt once, at its first
    evaluation after ``t_stop`` (never for ``None``)."""

    def __init__(self, M, t_stop=None):
        self.M, self.t_stop = M, t_stop

    def __call__(self, t):
        if self.t_stop is not None and t > self.t_stop:
            self.t_stop = None
            raise KeyboardInterrupt
        return self.M
