"""Path scheduling: stage sequences allowed by CC1-CC3, static routing without collision awareness
(``skippipe-no-tc2``), and the collision-aware search with per-node processing orders (``skippipe``)."""
