"""Node -> stage allocation (GCMA-style genetic search over bottleneck matchings and stage tours)."""

from skippipe.planner.allocation.genetic import (
    Groups,
    allocate,
    allocation_fitness,
    best_tour,
    bottleneck_matching,
    data_node_candidates,
    data_node_scores,
    random_allocation,
)

__all__ = [
    "Groups",
    "allocate",
    "allocation_fitness",
    "best_tour",
    "bottleneck_matching",
    "data_node_candidates",
    "data_node_scores",
    "random_allocation",
]
