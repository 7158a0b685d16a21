"""The task interface (asyncrl.tasks): the kind is picked from the config, the control task's producer
writes exactly what rollout.collect wrote before the interface, and the handshake compares whatever
spec the learner's task has."""

import numpy as np
import pytest

from asyncrl.core import config
from asyncrl.core.config import ConfigError
from asyncrl.core.seeding import actor_seeds
from asyncrl.core.spec import RolloutSpec
from asyncrl.core.state import LearnerState
from asyncrl.roles.learner_messages import handshake_mismatch
from asyncrl.tasks import make_task
from asyncrl.tasks.control import ControlTask
from asyncrl.tasks.control.envs import VecEnv
from asyncrl.tasks.control.policy import InferencePolicy, build_policy
from asyncrl.tasks.control.rollout import collect

SPEC = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=8, num_envs=2)
SMALL = ["env.id=asyncrl/Corridor-v0", "env.max_episode_steps=5", "env.num_envs=2", "env.rollout_length=8"]


def test_make_task_picks_control_by_default_and_takes_a_given_spec():
    cfg = config.load(None, [])
    task = make_task(cfg, spec=SPEC)
    assert isinstance(task, ControlTask) and task.kind == "control" and cfg.task.kind == "control"
    assert task.spec is SPEC and task.id == cfg.env.id and task.obs_shape == (2,)
    with pytest.raises(ConfigError, match="task.kind"):
        config.load(None, ["task.kind=vision"])


def test_control_producer_writes_what_collect_wrote():
    cfg = config.load(None, SMALL)
    seeds = actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs)
    state = LearnerState(cfg, make_task(cfg).spec, make_task(cfg, spec=make_task(cfg).spec))
    flat = state.flat_weights()
    # the interface
    prod = make_task(cfg).producer()
    prod.bind(cfg, seeds)
    prod.load(flat)
    prod.reset()
    ticks = []
    got = prod.spec.allocate()
    stats = prod.collect(got, version=0, grant_id=3, tick=lambda: ticks.append(1))
    # the calls the actor made before it
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=cfg.env.max_episode_steps)
    template = build_policy(cfg.policy, 2, 1, discrete=False)
    policy = InferencePolicy(template, activation=cfg.policy.activation, seed=seeds.action)
    policy.load(flat)
    env.reset(seeds=seeds.env)
    want = prod.spec.allocate()
    collect(env, policy.act, want, version=0, grant_id=3)
    assert stats.env_steps == 16 and len(ticks) == 8  # one tick per step of the E envs
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    prod.close()
    env.close()


def test_handshake_compares_the_learners_spec_fields():
    spaces = {"observation": "o", "action": "a"}
    hello = {"run_id": "", "env_id": "E", "spec": {"kind": "llm", "prompts": 4}, "spaces": spaces}
    why = handshake_mismatch(hello, run_id="r", env_id="E", spec=SPEC.to_dict(), spaces=spaces)
    assert why.startswith("obs_dim:"), why
    hello["spec"] = SPEC.to_dict()
    assert handshake_mismatch(hello, run_id="r", env_id="E", spec=SPEC.to_dict(), spaces=spaces) == ""
