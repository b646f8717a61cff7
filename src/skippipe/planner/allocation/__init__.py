"""Node -> stage allocation (GCMA-style genetic search over bottleneck matchings and stage tours)."""

from skippipe.planner.allocation.fitness import Groups, allocation_fitness, data_node_candidates, data_node_scores
from skippipe.planner.allocation.genetic import allocate, random_allocation
from skippipe.planner.allocation.matching import bottleneck_matching
from skippipe.planner.allocation.tours import best_tour

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
