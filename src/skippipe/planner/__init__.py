"""Planning: node -> stage allocation, baselines, path scheduling, and the method registry.

Reads clusters, costs and workloads, writes plan files (``skippipe.planfile``); uses the simulator
and the bounds to score candidates. Never imports torch.
"""
