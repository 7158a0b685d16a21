"""TensorBoard: every scalar of metrics.jsonl (lists as mean and max) under RUN_DIR/tb, read back
with tensorboard's own event reader."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from asyncrl.core import config
from asyncrl.core.metrics import scalars
from asyncrl.run.serial import run_serial

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    "run.num_actors=1",
    "run.log_every_s=1000",
    "env.id=asyncrl/Corridor-v0",
    "env.max_episode_steps=12",
    "run.eval_every=64",
]


def test_scalars_flatten_lists_and_skip_non_numbers():
    rec = {
        "iteration": 3,
        "env_steps": 64,
        "average_return": None,
        "flag": True,
        "tv_estimate": 0.25,
        "episode_returns": [1.0, 3.0],
        "empty": [],
        "bad": float("nan"),
        "name": "x",
        "minibatches": [[0, 0.1, 0.0], [1, 0.3, 0.2]],
    }
    s = scalars(rec)
    assert s == pytest.approx(
        {
            "iteration": 3,
            "env_steps": 64,
            "tv_estimate": 0.25,
            "episode_returns/mean": 2.0,
            "episode_returns/max": 3.0,
            "minibatches/tv_estimate/mean": 0.2,
            "minibatches/tv_estimate/max": 0.3,
            "minibatches/no_grad_fraction/mean": 0.1,
            "minibatches/no_grad_fraction/max": 0.2,
        }
    )


def test_run_writes_every_metrics_scalar_to_tensorboard(tmp_path):
    run_serial(config.load(None, SMALL), tmp_path, max_iterations=3, echo=lambda *_: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = set().union(*(scalars(r) for r in rows))
    assert (
        expected <= tags
        and {
            "policy_loss",
            "tv_estimate",
            "eval_return_mean",
            "minibatches/tv_estimate/max",
            "episode_returns/mean",
            "lag_seconds_p50",
        }
        <= tags
    )
    events = acc.Scalars("policy_loss")
    assert [e.step for e in events] == [r["env_steps"] for r in rows]
    np.testing.assert_allclose([e.value for e in events], [r["policy_loss"] for r in rows], rtol=1e-6)
    mb = acc.Scalars("minibatches/tv_estimate/max")
    np.testing.assert_allclose([e.value for e in mb], [max(m[1] for m in r["minibatches"]) for r in rows], rtol=1e-6)
    assert "lag/versions" in acc.Tags()["histograms"]  # the lag histograms share the writer
