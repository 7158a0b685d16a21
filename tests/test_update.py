"""Every preset runs a learner iteration end to end on real rollouts and reports its metrics."""
import math

import pytest
import torch

from asyncrl import config
from asyncrl.config import PRESETS
from asyncrl.envs import VecEnv
from asyncrl.policy import InferencePolicy
from asyncrl.rollout import collect
from asyncrl.state import LearnerState


def _batch(state, env, slots=2):
    actor = InferencePolicy(state.policy, activation="tanh", seed=0)
    out = []
    for i in range(slots):
        arrays = state.spec.allocate()
        collect(env, actor.act, arrays, version=state.version)
        out.append((f"a{i}", arrays))
    return state.make_batch(out)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("env_id", ["asyncrl/Corridor-v0", "CartPole-v1"])
def test_preset_iteration(preset, env_id):
    cfg = config.load(None, [f"algo.preset={preset}", "env.num_envs=4", "env.rollout_length=16",
                             "learner.slots_per_batch=2", "learner.num_slots=2", "algo.num_minibatches=4",
                             "algo.num_epochs=2", f"env.id={env_id}", "env.max_episode_steps=12"])
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=12)
    env.reset()
    state = LearnerState(cfg, env.spec(cfg.env.rollout_length))
    before = [p.detach().clone() for p in state.policy.parameters()]
    stats = state.iterate(_batch(state, env))
    assert state.version == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, state.policy.parameters()))
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "tv_estimate", "filtered_fraction",
                "clip_fraction", "rho_mean", "rho_max", "grad_norm", "lr"):
        assert math.isfinite(stats[key]), (key, stats[key])
    # fresh data from the same weights: the first minibatch is exactly on-policy
    assert abs(stats["rho_mean"] - 1.0) < 1e-4
    steps = 4 * 2 if preset != "impala" else 4          # impala: one epoch
    assert [m[0] for m in stats["minibatches"]] == list(range(steps))
    env.close()
