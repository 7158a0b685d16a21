"""Hand-made rollout slots for tests that play an actor by hand (tests/ and tests/integration/)."""

from __future__ import annotations

import numpy as np

from asyncrl.core.spec import RolloutSpec

SPEC = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=16, num_envs=2)  # Corridor at SMALL


def example_slot(seed: int = 0, grant_id: int | None = None) -> dict[str, np.ndarray]:
    """A slot of SPEC the learner trains on: finite numbers, behaviour version 0, two episode ends
    (env 1 truncated at t=5, env 0 terminated at t=9) and, given ``grant_id``, every row tagged with it."""
    rng = np.random.default_rng(seed)
    a = SPEC.allocate()
    a["obs"][...] = rng.normal(size=a["obs"].shape)
    a["actions"][...] = rng.normal(size=a["actions"].shape)
    a["behavior_log_prob"][...] = -rng.random(a["behavior_log_prob"].shape)
    a["rewards"][...] = rng.normal(size=a["rewards"].shape)
    a["truncated"][5, 1] = True
    a["final_obs"][5, 1] = rng.normal(size=2)
    a["terminated"][9, 0] = True
    if grant_id is not None:
        a["grant_id"][...] = grant_id
    return a
