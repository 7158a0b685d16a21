"""A generator actor whose generation of a slot takes longer than transport.actor_timeout_s (a real
model on a CPU takes minutes) keeps answering heartbeats while it generates: the learner never reaps
it, its rollouts are never revoked, and the run finishes. The generation is slowed artificially
(slow_generation.py) so the case holds by construction, whatever the machine's speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mp_helpers import new_run_id, wait_for
from test_multiprocess import endpoints
from test_task_kinds import MICRO

pytestmark = pytest.mark.integration

TIMEOUT_S = 4.0  # transport.actor_timeout_s
SLOW_S = 3 * TIMEOUT_S  # every generation waits this long before it starts


@pytest.mark.timeout(900)
def test_a_generation_longer_than_the_actor_timeout_is_not_reaped(procs, tmp_path):
    pytest.importorskip("transformers")
    from asyncrl.tasks.llm import model

    (tmp_path / "micro.json").write_text(json.dumps(MICRO))
    micro, _ = model.prepare(
        tmp_path / "micro", seed=0, config_path=tmp_path / "micro.json", vocab_size=400, n_texts=300
    )
    sets = [
        "task.kind=llm",
        f"llm.model_dir={micro}",
        "llm.warmup_steps=0",
        "llm.group_size=2",
        "llm.prompts_per_slot=2",
        "llm.max_prompt_tokens=160",
        "llm.max_new_tokens=8",
        "llm.eval_size=0",
        "algo.preset=grpo",
        "algo.num_epochs=1",
        "algo.num_minibatches=1",
        "learner.slots_per_batch=1",
        "learner.num_slots=2",
        f"transport.actor_timeout_s={TIMEOUT_S}",
        "transport.heartbeat_s=0.2",
    ]
    flags = [x for s in sets for x in ("--set", s)]
    run_id, run_dir = new_run_id(), tmp_path / "run"
    learner_ep, broadcaster_ep = endpoints()
    procs.run_ids.add(run_id)
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    procs.start(
        "learner",
        [
            "learner",
            "--bind",
            learner_ep,
            "--broadcaster",
            broadcaster_ep,
            "--run-id",
            run_id,
            "--run-dir",
            str(run_dir),
            "--total-steps",
            "8",
            *flags,
        ],
    )
    # the actor says hello for 60 s: start it once the learner listens (on a loaded machine its start
    # alone, imports and the start model, took longer)
    wait_for(lambda: "listening on" in procs.err("learner"), 240, "the learner to listen", procs=procs)
    slow = [sys.executable, str(Path(__file__).resolve().parent / "slow_generation.py"), str(SLOW_S)]
    procs.start(
        "gen",
        ["actor", "--learner", learner_ep, "--broadcaster", broadcaster_ep, "--actor-id", "gen", *flags],
        prefix=slow,
    )
    learner = procs.popen["learner"]
    wait_for(
        lambda: learner.poll() is not None or "left (silent" in procs.err("learner"),
        420,
        "the learner to finish",
        procs=procs,
    )
    assert "left (silent" not in procs.err("learner"), procs.dump()
    assert procs.wait("learner", 10) == 0, procs.dump()
    assert procs.wait("gen", 60) == 0, procs.dump()
    assert "revoked" not in procs.err("gen"), procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["env_steps"] >= 8, summary
    assert summary["rejected_messages"] == {}, summary
    # the case under test: each slot's generation outlasted the timeout (inference time per slot)
    timing, slots = summary["time_breakdown_s"], summary["slot_counters"]
    assert timing["actors_inference_s"] / slots["completed"] >= SLOW_S, (timing, slots)
    procs.shutdown()
