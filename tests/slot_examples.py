"""Hand-made rollout slots for tests that play an actor by hand (tests/ and tests/integration/)."""

from __future__ import annotations

import numpy as np

from asyncrl.core.spec import RolloutSpec

CORRIDOR = "asyncrl/Corridor-v0"
SMALL = [  # a small control run of the Corridor env: what the hand-played actors' slots fit
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=6",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    f"env.id={CORRIDOR}",
]
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
