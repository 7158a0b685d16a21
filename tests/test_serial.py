"""Serial mode end to end: determinism, and truncation bootstrapping on an infinite-horizon task."""

import json

import torch

from asyncrl.core import config
from asyncrl.core.state import LearnerState
from asyncrl.run.serial import run_serial
from asyncrl.tasks import make_task
from asyncrl.tasks.control.envs import VecEnv

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    "run.num_actors=2",
    "run.log_every_s=1000",
]


def _params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["policy"]


def test_same_seed_bit_identical_after_three_iterations(tmp_path):
    cfg = config.load(None, SMALL + ["env.id=HalfCheetah-v5", "run.seed=7"])
    for name in ("a", "b"):
        run_serial(cfg, tmp_path / name, max_iterations=3, echo=lambda *_: None)
    pa, pb = _params(tmp_path / "a"), _params(tmp_path / "b")
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    # and a different seed gives different parameters
    run_serial(
        config.load(None, SMALL + ["env.id=HalfCheetah-v5", "run.seed=8"]),
        tmp_path / "c",
        max_iterations=3,
        echo=lambda *_: None,
    )
    assert not torch.equal(pa["pi.0.weight"], _params(tmp_path / "c")["pi.0.weight"])


def test_summary_and_metrics_written(tmp_path):
    cfg = config.load(None, SMALL + ["env.id=asyncrl/Corridor-v0", "env.max_episode_steps=10"])
    summary = run_serial(cfg, tmp_path, max_iterations=2, echo=lambda *_: None)
    assert summary["learner_iterations"] == 2 and summary["env_steps"] == 2 * 16 * 2 * 2
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == summary["env_steps"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "tv_estimate" in json.loads(lines[0])


def _value_of_start(preset_overrides, tmp_path, name):
    gamma = 0.9
    cfg = config.load(
        None,
        [
            "env.id=asyncrl/Constant-v0",
            "env.max_episode_steps=20",
            "env.num_envs=4",
            "env.rollout_length=32",
            "learner.slots_per_batch=1",
            "learner.num_slots=1",
            "algo.num_minibatches=4",
            "algo.num_epochs=4",
            "algo.lr=3e-3",
            "algo.anneal_lr=false",
            f"algo.gamma={gamma}",
            "learner.reward_scaling=false",
            "run.num_actors=1",
            "run.log_every_s=1000",
            *preset_overrides,
        ],
    )
    run_serial(cfg, tmp_path / name, max_iterations=60, echo=lambda *_: None)
    env = VecEnv(cfg.env.id, 1, seed=0)
    state = LearnerState(cfg, env.spec(cfg.env.rollout_length), make_task(cfg, spec=env.spec(cfg.env.rollout_length)))
    state.load(tmp_path / name / "checkpoint.pt")
    with torch.no_grad():
        return float(state.policy.value(torch.zeros(1, 2))[0]), 1 / (1 - gamma)


def test_infinite_horizon_value_needs_truncation_bootstrap(tmp_path):
    """Reward 1 forever, cut by a 20-step TimeLimit: V(s0) -> 1/(1-γ) = 10 only because truncated
    steps bootstrap from V(final_obs). Treating truncation as termination would give about 5.6."""
    for preset in ("vaco", "ppo"):
        v, target = _value_of_start([f"algo.preset={preset}"], tmp_path, preset)
        assert abs(v - target) < 0.8, (preset, v)


def _corridor(tmp_path):
    return config.load(None, SMALL + ["env.id=asyncrl/Corridor-v0", "env.max_episode_steps=10"])


def test_summary_records_how_the_run_ended(tmp_path, monkeypatch):
    """summary.json says finished, interrupted (Ctrl-C) or failed (with the role and the reason)."""
    import pytest

    from asyncrl.core import consume

    finished = run_serial(_corridor(tmp_path), tmp_path / "f", max_iterations=1, echo=lambda *_: None)
    assert finished["outcome"] == "finished" and finished["failure"] is None
    assert finished["resumes"] == 0 and finished["actor_rejoins"] == {}

    real = consume.Consumer.consume
    calls = {"n": 0}

    def second_call(raise_what):
        def fake(self, slots):
            calls["n"] += 1
            if calls["n"] == 2:
                raise raise_what
            return real(self, slots)

        return fake

    monkeypatch.setattr(consume.Consumer, "consume", second_call(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_serial(_corridor(tmp_path), tmp_path / "i", echo=lambda *_: None)
    interrupted = json.loads((tmp_path / "i" / "summary.json").read_text())
    assert interrupted["outcome"] == "interrupted" and interrupted["learner_iterations"] == 1

    calls["n"] = 0
    monkeypatch.setattr(consume.Consumer, "consume", second_call(RuntimeError("disk on fire")))
    with pytest.raises(RuntimeError):
        run_serial(_corridor(tmp_path), tmp_path / "x", echo=lambda *_: None)
    failed = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert failed["outcome"] == "failed"
    assert failed["failure"] == {"role": "learner", "reason": "RuntimeError: disk on fire"}
