"""The distributed runtime: one worker process per plan node on ``torch.distributed``.

One concern per module:

- ``config.py``      the ``skippipe train`` TOML config (dataclasses, validated, embedded defaults)
- ``transport.py``   point-to-point messages: a fixed int64 header + one tensor, never pickled
- ``emulation.py``   optional WAN emulation (delayed delivery, compute padding) on one machine
- ``schedule.py``    which operation a node runs next (memory cap M, backward first, plan order)
- ``worker.py``      the worker loop of one node: forward/loss/backward, stage-group averaging, step
- ``launch.py``      local multi-process launch and supervision; torchrun uses the same entry
- ``checkpoint.py``  per-stage safetensors + optimizer state + plan + step, written atomically
- ``metrics.py``     JSONL and TensorBoard metrics
- ``timeline.py``    per-node timeline of the real run, Gantt PNG beside the simulator's prediction

Importing this package does not import torch; the modules that need it do.
"""
