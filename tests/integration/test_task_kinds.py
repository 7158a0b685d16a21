"""One system, two kinds of task: `asyncrl run` starts the same learner, broadcaster and actor
modules (python -m asyncrl.cli learner / broadcaster / actor) for a control task (a toy gymnasium env)
and for the llm task (a micro Qwen2 made in the test's directory), over the same shared-memory slot
ring, grants and lag accounting; every process is stopped by pid and no segment is left."""

from __future__ import annotations

import json
import re

import pytest
from mp_helpers import read_jsonl, shm_segments, wait_for
from test_multiprocess import RUN_LINE, wait_adopting, wait_all_dead

pytestmark = pytest.mark.integration

MICRO = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
}

CONTROL = [
    "--env",
    "asyncrl/Corridor-v0",
    "--set",
    "env.max_episode_steps=20",
    "--set",
    "env.num_envs=2",
    "--set",
    "env.rollout_length=16",
    "--set",
    "algo.num_minibatches=4",
    "--set",
    "algo.num_epochs=2",
    "--total-steps",
    "1024",
]


def _llm_args(tmp_path) -> list[str]:
    pytest.importorskip("transformers")
    from asyncrl.tasks.llm import model

    cfg = tmp_path / "micro.json"
    cfg.write_text(json.dumps(MICRO))
    micro, _ = model.prepare(tmp_path / "micro", seed=0, config_path=cfg, vocab_size=400, n_texts=300)
    return [
        "--set",
        "task.kind=llm",
        "--set",
        f"llm.model_dir={micro}",
        "--set",
        "llm.warmup_steps=0",
        "--set",
        "llm.group_size=2",
        "--set",
        "llm.prompts_per_slot=2",
        "--set",
        "llm.max_prompt_tokens=160",
        "--set",
        "llm.max_new_tokens=12",
        "--set",
        "llm.eval_size=8",
        "--set",
        "algo.preset=grpo",
        "--set",
        "algo.num_epochs=1",
        "--set",
        "algo.num_minibatches=2",
        "--set",
        "learner.reward_scaling=false",
        # as configs/gsm-tiny.toml: heartbeats wait for a generation or an iteration (tens of seconds under load)
        "--set",
        "transport.actor_timeout_s=120",
        "--total-steps",
        "48",
    ]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["control", "llm", "llm-lora-bf16"])
def test_same_roles_run_control_and_llm(procs, tmp_path, kind):
    run_dir = tmp_path / "run"
    args = CONTROL if kind == "control" else _llm_args(tmp_path)
    if kind == "llm-lora-bf16":  # a LoRA adapter in bfloat16: only the adapter travels, as 2 bytes per parameter
        args = [*args, "--set", "llm.lora_rank=4", "--set", "learner.weights_dtype=bfloat16"]
    procs.start(
        "run",
        [
            "run",
            "--num-actors",
            "2",
            "--run-dir",
            str(run_dir),
            "--set",
            "learner.slots_per_batch=2",
            "--set",
            "learner.num_slots=6",
            "--set",
            "run.log_every_s=2",
            *args,
        ],
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 120, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    rc = wait_adopting(procs, "run", 360)
    assert rc == 0, procs.dump()
    assert not wait_all_dead(procs.others, 5), "processes of the run outlived it"
    assert not shm_segments(run_id)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["mode"] == "async", summary
    assert summary["learner_iterations"] > 0 and summary["rejected_messages"] == {}, summary
    assert summary["rollouts_by_transport"].get("shm", 0) > 0, summary  # through the slot ring
    lag = read_jsonl(run_dir / "lag.jsonl")
    assert lag and {row["actor"] for row in lag} <= {"actor0", "actor1"}  # a tiny budget may end before both deliver
    assert all(row["lag_versions"] == row["version"] - row["behavior_version"] >= 0 for row in lag)
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    delivered = {row["actor"] for row in lag}
    for name in ("actor0", "actor1"):
        log = logs[f"{name}.log"]
        assert f"actor {name} joined" in logs["learner.log"], logs["learner.log"]
        # under load one actor may join after the learner met its budget and unlinked the ring:
        # then it must say so and have sent nothing; an actor that delivered went through the ring
        if name in delivered:
            assert "attached to shared memory" in log, log
            # an actor that delivered acted with weights it received: its last line before the outcome says so
            got = re.search(rf"actor {name}: weights: (\d+) versions? received, (\d+) acted with", log)
            assert got and int(got.group(1)) >= int(got.group(2)) >= 1, log
        else:
            assert "attached to shared memory" in log or "0 rollouts sent; step budget reached" in log, log
    weights = summary["weights"]  # every version the learner made went to the broadcaster once
    assert (
        weights["versions_sent"] >= 1
        and weights["bytes_sent"] == weights["versions_sent"] * weights["bytes_per_version"]
    )
    broadcaster = summary["broadcaster"]
    assert broadcaster["published"] >= 1 and not set(broadcaster["rejected_messages"]) - {"snapshot_rate"}, broadcaster
    if kind == "llm-lora-bf16":
        assert weights["dtype"] == "bfloat16" and weights["holds"].startswith("the LoRA adapter (rank 4"), weights
        assert weights["bytes_per_version"] == 2 * weights["parameters"]
    if kind.startswith("llm"):
        assert summary["env_id"].startswith("llm:") and summary["task"] == "llm"
        assert 0 <= summary["initial_accuracy"] <= 1 and 0 <= summary["final_accuracy"] <= 1
        assert summary["eval_problems"] == 8
        assert summary["env_steps"] >= 48  # completions
    else:
        assert summary["env_id"] == "asyncrl/Corridor-v0" and "initial_accuracy" not in summary
