"""asyncrl: asynchronous on-policy RL under real policy lag (decoupled PPO; VACO, arXiv:2603.01365)."""

__version__ = "0.1.0"
