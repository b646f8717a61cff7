"""``skippipe profile``: measure a launch's workers and write a cluster file the planner reads.

- ``spec.py``      what to measure (model, stage, message sizes, emulation), to and from CLI flags
- ``emulated.py``  size-dependent WAN emulation of each link (latency + bytes / bandwidth)
- ``fit.py``       latency + bandwidth fits, the cluster file, errors against an emulated cluster
- ``measure.py``   ping-pong between pairs, a stage's forward/backward time and usable memory
- ``worker.py``    one worker's profile: join, measure, gather on rank 0, write the file
- ``launch.py``    local launch of the workers (torchrun starts the same worker on real machines)

Torch-free except ``measure.py`` and ``worker.py``.
"""
