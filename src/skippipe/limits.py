"""The largest values any config file or flag may give, in one place.

Each limit keeps a run within a second of being refused and far from exhausting memory: beyond
them a value is a typo, not a plan (a 100,000-node preset would need 75 GiB of link matrices;
100,000,000 microbatches per data node would plan for days). ``skippipe.config_fields`` applies
the generic ones to every field; config dataclasses name the specific ones in their fields'
``metadata={"max": ...}``.
"""

from __future__ import annotations

# generic: every field of every config
INT_LIMIT = 2**31  # no config integer is larger in size than this
FLOAT_LIMIT = 1e12  # no config float is larger in size than this (1e308 is a typo, not a value)
FLOAT_INT_BITS = 1000  # an integer given for a float must convert to a finite float
MAX_ITEMS = 100_000  # entries of one list
MAX_CHARS = 10_000  # characters of one string

# the pipeline and its cluster
MAX_NODES = 1024  # nodes of a cluster (presets, matrices, locations)
MAX_STAGES = MAX_NODES  # stages of a pipeline (each needs a node)
# stage orders (after stage 0) that the path rules of a planned workload may allow: planning time
# grows with them (40 nodes, measured on the 2-core machine on 2026-12-01: 1,511 orders (S = 12,
# L = 8) 5.4 s, 5,664 (S = 14, L = 8) 5.0 s, 13,362 (S = 16, L = 8) 7.2 s; the day before 13.9,
# 30.0 and 82.8 s); ``planner.stage_orders.check_stage_orders``
MAX_STAGE_ORDERS = 6_000
MAX_MICROBATCHES = 10_000  # microbatches per data node in one iteration
MAX_LAYERS = 10_000  # model layers
MAX_WIDTH = 1 << 20  # d_model, ffn_dim, heads
MAX_CTX = 1 << 20  # tokens of context
MAX_SAMPLES = 1 << 16  # samples per microbatch
MAX_VOCAB = 1 << 24  # vocabulary entries
MAX_PARAMS = 10**12  # parameters of a model


def at_most(limit: int, **bounds: float) -> dict[str, float]:
    """Field metadata: ``bounds`` (``min``, ``gt``, ...) and at most ``limit``."""
    return {**bounds, "max": limit}
