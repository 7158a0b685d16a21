"""The evaluation during training in the learner role: after an iteration whose evaluation is due, the
learner publishes the new version first (the actors generate with it while the learner evaluates),
serves its peers between pieces of the evaluation, then writes the iteration's metrics row with the
results and takes its snapshot (control task's run.eval_every here; the llm task's llm.eval_every runs
the same path)."""

from __future__ import annotations

import json

import pytest
from slot_examples import example_slot
from test_lag_target import _report_one
from test_remote_rollout import SMALL, _joined_learner

from asyncrl.core import config
from asyncrl.tasks.control.evaluate import PeriodicEval


@pytest.mark.timeout(60)
def test_the_learner_publishes_then_evaluates_and_serves_meanwhile(tmp_path, monkeypatch):
    events: list[tuple] = []
    real = PeriodicEval.__call__

    def spy(self, policy, *, env_steps, iteration, tick=None):
        events.append(("evaluate", iteration))
        tick()  # what a long evaluation calls between its pieces
        return real(self, policy, env_steps=env_steps, iteration=iteration, tick=tick)

    monkeypatch.setattr(PeriodicEval, "__call__", spy)
    cfg = config.load(None, [*SMALL, "run.eval_every=64", "run.eval_episodes=1"])  # a batch: 2 slots of 32 steps
    with _joined_learner(cfg, tmp_path, "utest-evalpub") as (learner, c, ring):
        publish, serve = learner.publish, learner.serve
        monkeypatch.setattr(learner, "publish", lambda: events.append(("publish", learner.state.version)) or publish())
        monkeypatch.setattr(learner, "serve", lambda ms: events.append(("serve",)) or serve(ms))
        arrays = example_slot(seed=3)
        for _ in range(2):
            _report_one(c, learner, ring, arrays)
        events.clear()
        assert learner.consume() and learner.state.iteration == 1
        assert events[:3] == [("publish", 1), ("evaluate", 1), ("serve",)]
        assert events.count(("publish", 1)) == 1  # not again after the evaluation
        row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
        assert row["iteration"] == row["eval_version"] == 1 and row["eval_episodes"] == 1 and row["eval_s"] > 0
        assert learner.consumer.boundary["consumer"]["eval_next_at"] == 128  # the snapshot follows the evaluation
        summary = learner.finish()
    assert summary["last_eval"]["eval_version"] == 1 and summary["periodic_eval_s"] == row["eval_s"]
