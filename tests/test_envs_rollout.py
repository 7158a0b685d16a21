"""The rollout writer on a tiny deterministic env with forced termination and truncation."""

import numpy as np
import pytest

from asyncrl.tasks.control.envs import EnvError, VecEnv, check_env_id
from asyncrl.tasks.control.rollout import collect


def fixed_act(value):
    def act(obs):
        E = obs.shape[0]
        return np.full((E, 1), value, np.float32), np.full(E, -0.5, np.float32)

    return act


def test_unknown_env_id_is_one_clear_error():
    with pytest.raises(EnvError, match="unknown env id 'Nope-v0'"):
        check_env_id("Nope-v0")


def test_termination_and_truncation_fields():
    # env 0 terminates every 3 steps; the TimeLimit truncates after 5 steps (never reached by env 0).
    env = VecEnv("asyncrl/Corridor-v0", 1, seed=0, max_episode_steps=5, env_kwargs={"terminate_at": 3})
    spec = env.spec(rollout_length=7)
    slot = spec.allocate()
    env.reset()
    stats = collect(env, fixed_act(2.0), slot, version=4)
    # unclipped action stored, clipped reward (the env saw the clipped copy)
    assert np.all(slot["actions"] == 2.0) and np.all(slot["rewards"] == 1.0)
    assert slot["terminated"][:, 0].tolist() == [0, 0, 1, 0, 0, 1, 0]
    assert not slot["truncated"].any()
    # obs[t+1] after an episode end is the new episode's first observation
    assert slot["obs"][:, 0, 1].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert np.all(slot["behavior_version"] == 4) and np.all(slot["behavior_log_prob"] == -0.5)
    assert stats.env_steps == 7 and stats.episode_returns == [3.0, 3.0] and stats.episode_lengths == [3, 3]
    env.close()


def test_truncation_keeps_final_obs_and_rollouts_continue():
    env = VecEnv("asyncrl/Corridor-v0", 2, seed=0, max_episode_steps=4)
    spec = env.spec(rollout_length=3)
    a, b = spec.allocate(), spec.allocate()
    env.reset()
    collect(env, fixed_act(0.5), a, version=0)
    collect(env, fixed_act(0.5), b, version=1)
    assert np.array_equal(a["obs"][3], b["obs"][0])  # rollouts continue each other
    trunc = np.concatenate([a["truncated"], b["truncated"]])[:, 0].tolist()
    assert trunc == [0, 0, 0, 1, 0, 0]
    assert not a["terminated"].any() and not b["terminated"].any()
    assert np.allclose(b["final_obs"][0, 0], [0.4, 4.0])  # the obs the episode ended in
    assert b["obs"][1, 0].tolist() == [0.0, 0.0]  # ... not the reset obs
    assert np.all(b["final_obs"][1:] == 0)
    env.close()


def test_discrete_env_spec():
    env = VecEnv("CartPole-v1", 2, seed=0)
    spec = env.spec(rollout_length=4)
    assert spec.discrete and spec.action_dim == 2 and spec.field("actions").shape == (4, 2)
    env.close()
