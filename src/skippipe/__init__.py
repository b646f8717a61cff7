"""skippipe: partial and reordered pipeline training over slow, uneven networks.

Planning and simulation (``skippipe.cluster``, ``skippipe.costs``, ``skippipe.planfile``, ``skippipe.planner``,
``skippipe.sim``) are pure Python + numpy and never import torch.
"""

__version__ = "0.1.0"
