"""Training: configs, optimiser and schedule, the per-microbatch operations, gradient averaging, the reference executor."""
