r"""Gaussian token measures: closed-form mean/covariance ODEs, blow-up detection, batched solves.

For :math:`\mu = \mathcal N(\alpha, \Sigma)` the softmax, linear, L2 and Sinkhorn attention
fields are affine, :math:`\Gamma_\mu(x) = Mx + b`, so the continuity equation keeps Gaussians
Gaussian and reduces to

.. math::

    \alpha' = M\alpha + b, \qquad \Sigma' = M\Sigma + \Sigma M^\top

(Castin, Ablin, Carrillo, Peyré, *A Unified Perspective on the Dynamics of Deep
Transformers*, 2025, arXiv:2501.18322, Section 4; conventions: ``docs/conventions.md``).

Integration
-----------
The covariance is carried as a factor, :math:`\Sigma = FF^\top` with :math:`F' = MF`, which solves
the Lyapunov-type equation exactly, so :math:`\Sigma` is symmetric positive semi-definite by
construction and :math:`\operatorname{rank}\Sigma` is constant along the flow (no clipping).
To make finite-time blow-up cheap and accurate, the state is integrated in a reparametrised
time :math:`s` with

.. math::

    \frac{ds}{dt} = w = 1 + \kappa\,\nu, \qquad \nu = \operatorname{tr}\Sigma
    \; (+\,|\alpha|^2 \text{ for the linear kind}),

:math:`\kappa = \sum_h \|W_O E_h V_h\|_2\,\|A_h\|_2` (a rate scale taken at ``t = 0``; for
``l2`` :math:`A_h` is multiplied by :math:`2\beta'`), and in log-polar variables
:math:`F = e^{\rho} G` with :math:`\|G\|_F = 1`, :math:`\alpha = \varphi\,\tilde\alpha`,
:math:`\varphi = (1 + \kappa\operatorname{tr}\Sigma)^{1/2}`:

.. math::

    \frac{d\rho}{ds} = \frac{\langle G, MG\rangle}{w},\quad
    \frac{dG}{ds} = \frac{MG - \langle G, MG\rangle G}{w},\quad
    \frac{dt}{ds} = \frac1w,\quad
    \frac{d\tilde\alpha}{ds} = \frac{\alpha' - \alpha\,\varphi'/\varphi}{\varphi w}.

Near a Riccati-type singularity (:math:`\operatorname{tr}\Sigma \sim c/(T^*-t)`) :math:`\rho`
is asymptotically linear in :math:`s` and :math:`G` converges, so an adaptive Runge--Kutta
method crosses the blow-up region in a few steps, and :math:`t(s)\to T^*`.

Statuses
--------
One vocabulary, :class:`transformer_pde.results.Status`.  A path stops where
:math:`\nu` reaches ``blowup_threshold`` (the last state lies on it, to :math:`10^{-12}`
relative); the run is then continued without output to
:math:`\nu = \max(\text{blowup\_threshold}, 10^{10})`, where the blow-up test, :math:`T^*`
and ``limit`` are measured, so they do not depend on the threshold used to cut the path
(only kinds whose growth law allows a blow-up are continued).

``"blowup"``
    :math:`\nu` reached ``blowup_threshold``, the kind's growth law admits a finite-time
    singularity (:func:`blowup_law`), and the growth looks like one: with
    :math:`\tau = \nu/\nu'` (time-to-blow-up of the local power law) and
    :math:`q = -d\tau/dt` (:math:`= 1/p` for :math:`\nu \propto (T^*-t)^{-p}`),
    :math:`q > q_{\max}/2`, where :math:`q_{\max}` is the largest :math:`q` the law allows
    (:math:`q = 0` for exponential growth), and :math:`q \le 1.5\,q_{\max}` (a singularity
    of the law has :math:`q \to 1/p \le q_{\max}`; a larger :math:`q` is a transient of
    oscillating growth); :math:`q` is a central difference of :math:`\tau` along the flow.
    The blow-up time is :math:`T^* = t + \tau/q` (exact for a pure power law; the error for a
    Riccati singularity is :math:`O(\tau^2)`).  ``limit`` is :math:`\Sigma/\operatorname{tr}\Sigma` extrapolated
    linearly to :math:`T^*`.
``"diverging"``
    :math:`\nu` reached ``blowup_threshold`` and either the law excludes a finite-time
    singularity (Sinkhorn; L2 whose key matrices all have rank ``d``: their :math:`M` stays
    bounded as :math:`\Sigma` grows, so the growth is at most exponential) or
    :math:`q` is outside :math:`(q_{\max}/2, 1.5\,q_{\max}]` (growth without a finite-time
    singularity, e.g. :math:`\nu \propto e^{\lambda t}`).  ``limit`` is the current
    :math:`\Sigma/\operatorname{tr}\Sigma` (where it was measured).
``"converged"``
    By the solvers' ``convergence`` criterion (:func:`solve`): by default a relative rate
    below ``converge_tol``, or an algebraic approach to a stationary state
    (:math:`\Sigma \to 0` or to a line like :math:`1/t`); optionally the paper's absolute
    criteria :math:`\|\Sigma'\|_F <` ``converge_tol`` or :math:`\operatorname{tr}\Sigma <`
    ``converge_tol``.
``"ok"``
    ``t_max`` reached with none of the above (undecided).
``"max_steps"``
    The step budget ran out before ``t_max`` (an :class:`~transformer_pde.errors.EarlyStopWarning`
    says so), or the member is stiff: after the explicit budget it is continued with LSODA,
    and stopped early when the steps projected to its next stop exceed what is left of the
    budget; its message then starts with ``stiff:``, gives the eigenvalue spread of
    :math:`M` and what to do (the states up to ``t_final`` are accurate).

Output times
------------
``t_eval`` times after a convergence are still reported: the path is integrated on
without the convergence test (output only), and an exactly stationary state (zero
rates) is held; status, message, ``t_final`` and the final state are those of the
convergence.

A blow-up, a divergence or a convergence is an answer, reported in ``status`` only.  Runs
that end without an answer (``max_steps``, ``nonfinite``, ``failed``) also issue an
:class:`~transformer_pde.errors.EarlyStopWarning` (once per :func:`solve_batch` call);
``warn=False`` on :func:`solve` / :func:`solve_batch` turns it off for one call.
"""

from .affine import affine_field, moment_ode, sinkhorn_cross_covariance
from .batch import GaussianBatch, load, solve_batch
from . import exact
from .exact import *  # noqa: F403 (the closed forms: exact.__all__)
from .laws import blowup_law
from .trajectory import GaussianTrajectory, solve

__all__ = [
    "GaussianBatch",
    "GaussianTrajectory",
    "affine_field",
    "blowup_law",
    "load",
    "moment_ode",
    "sinkhorn_cross_covariance",
    "solve",
    "solve_batch",
]
__all__ += exact.__all__
