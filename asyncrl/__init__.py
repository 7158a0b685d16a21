"""asyncrl: asynchronous on-policy RL with VACO (arXiv:2603.01365)."""

__version__ = "0.1.0"
