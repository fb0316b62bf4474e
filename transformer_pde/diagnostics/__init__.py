r"""Diagnostics of attention flows: distances, stability, rank collapse, blow-up, clusters.

What users measure on a run of :func:`transformer_pde.simulate` (a
:class:`~transformer_pde.ParticleTrajectory`) or of :func:`transformer_pde.gaussian.solve`
(a Gaussian trajectory with ``times``, ``means``, ``covs``):

* **Distances** -- :func:`wasserstein` between empirical measures (exact optimal transport
  or sliced, through POT; or a debiased Sinkhorn divergence, log-domain and blocked, solved
  here), :func:`bures_wasserstein`
  between Gaussians (finite and correct for singular covariances) and
  :func:`conditional_wasserstein` between masked states (plans that keep token positions).
* **Stability** -- :func:`stability_profile` runs the flows of two initial measures and
  returns :math:`W_2(\mu_t, \nu_t)/W_2(\mu_0, \nu_0)` with an a-priori bound of the form of
  the paper's Theorem 3.1 (softmax, compact support; constants derived in
  :func:`stability_bound`); :func:`gaussian_stability_profile` does the same for two
  Gaussians with the Bures--Wasserstein distance.
* **Rank** -- :func:`numerical_rank`, :func:`effective_rank`, :func:`stable_rank` of a
  covariance, :func:`rank_profile` along a trajectory and :func:`rank_collapse`.
* **Blow-up** -- :func:`classify` a run as converged / finite-time blow-up (with
  :math:`T^*`) / diverging / undecided (``Status.OK``), with the fitted evidence; particle
  flows of normalised kinds are never a finite-time blow-up (exponential a-priori bound).
* **Clusters** -- :func:`clusters` (single linkage at a scale relative to the cloud) and
  :func:`cluster_counts` along a trajectory.
* **Kinetic energy** -- :func:`kinetic_energy`:
  :math:`\int_0^T\!\int |\Gamma_{\mu_t}|^2 d\mu_t\,dt \ge W_2^2(\mu_0,\mu_T)/T` (Benamou--Brenier).
* **Tokens on the sphere** -- :func:`pair_fraction` (pairs with
  :math:`\langle x_i, x_j\rangle \ge 1 - \varepsilon`), :func:`component_clusters` (connected
  components of that graph), :func:`interaction_energy`
  :math:`E_\beta = \tfrac1{2\beta}\sum_{ij} w_i w_j e^{\beta\langle x_i, x_j\rangle - \text{shift}}`
  and :func:`merge_events` along a run.
* **Depth statistics** -- :func:`depth_statistics`: clusters, covariance ranks, cosine
  similarities (:func:`cosine_similarity`) and size of a token cloud at every saved depth;
  :func:`distance_to_first`: every token's cosine and distance to the first token and the
  token norms (the radius of the residual stream), the quantities of causal attention.
* **Synchronisation on the circle** -- :func:`synchronization_runs` classifies runs as
  synchronised (certified: tokens in an open half-circle), stopped at an equilibrium, or
  undecided; :func:`polygon_spectrum` and :func:`equilibrium_spectrum` decide the stability
  of non-synchronised equilibria.

Modules, by concern: :mod:`.distances`, :mod:`.stability`, :mod:`.ranks`, :mod:`.growth`,
:mod:`.clustering`, :mod:`.energy`, :mod:`.depth`, :mod:`.decoder`, :mod:`.pairs`,
:mod:`.metastability`, :mod:`.synchronization`;
every public name is re-exported here.
"""

from .clustering import Clusters, cluster_counts, clusters
from .decoder import FirstTokenDistances, distance_to_first
from .depth import cosine_similarity, depth_statistics
from .distances import (EXACT_MAX_PAIRS, WassersteinResult, bures_wasserstein, conditional_wasserstein,
                        wasserstein, wasserstein_result)
from .energy import KineticEnergy, kinetic_energy
from .growth import Classification, classify, exponential_growth_bound
from .metastability import MergeEvents, interaction_energy, merge_events
from .pairs import component_clusters, pair_fraction
from .ranks import (RankCollapse, RankProfile, effective_rank, numerical_rank, rank_collapse,
                    rank_profile, stable_rank)
from .stability import (StabilityProfile, gaussian_stability_profile, stability_bound,
                        stability_profile)
from .synchronization import (SyncRuns, circle_clusters, circle_initial_states,
                              equilibrium_spectrum, largest_gap, order_parameter,
                              polygon_spectrum, synchronization_runs)

__all__ = ["Classification", "Clusters", "FirstTokenDistances", "KineticEnergy", "MergeEvents",
           "RankCollapse", "RankProfile", "StabilityProfile", "EXACT_MAX_PAIRS",
           "bures_wasserstein", "classify", "cluster_counts", "clusters", "distance_to_first",
           "component_clusters", "conditional_wasserstein", "cosine_similarity",
           "depth_statistics", "effective_rank", "exponential_growth_bound",
           "gaussian_stability_profile", "interaction_energy", "kinetic_energy", "merge_events",
           "numerical_rank", "pair_fraction", "rank_collapse", "rank_profile", "stability_bound",
           "stability_profile", "stable_rank", "wasserstein", "wasserstein_result",
           "WassersteinResult", "SyncRuns", "circle_clusters", "circle_initial_states",
           "equilibrium_spectrum", "largest_gap", "order_parameter", "polygon_spectrum",
           "synchronization_runs"]
