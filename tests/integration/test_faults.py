"""Faults and hostile peers: seeds per actor incarnation, how a run ended, bad numbers,
slot integrity.

Every test starts its processes through the ``procs`` fixture (conftest.py), which stops only
those pids at the end and asserts that none survives and that no /dev/shm segment of the test's
run ids is left. Nothing here asserts on timing, on how many log lines appear, or on their order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from mp_helpers import SMALL, new_run_id, proc_stat, read_jsonl, wait_for
from test_multiprocess import CORRIDOR, RUN_LINE, start_actor, start_roles

pytestmark = pytest.mark.integration

JOINED = re.compile(
    r"actor (\S+): joined run \S+ \(restart (\d+)\); env and action streams ([0-9a-f]{12}) "
    r"from run seed (\d+)"
)


def joined(procs, name: str):
    """(actor id, restart, streams fingerprint, run seed) from the actor's join line, or None."""
    m = JOINED.search(procs.err(name))
    return None if m is None else (m.group(1), int(m.group(2)), m.group(3), int(m.group(4)))


# ----------------------------------------------------------------------------- point 8: seeds


@pytest.mark.timeout(150)
def test_actor_streams_distinct_and_new_after_restart(procs, tmp_path):
    """The README's two by-hand actors (same run, ids a0 and a1, no --seed) draw from different
    streams; a0 killed and started again under its own id joins as restart 1 with streams of its
    own, and both derive from the learner's run seed."""
    run_id, run_dir = new_run_id(), tmp_path / "run"
    fast = ["--set", "transport.actor_timeout_s=2", "--set", "run.seed=5"]
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=100_000_000, extra=fast
    )
    start_actor(procs, "a0", learner_ep, broadcaster_ep, env_id=CORRIDOR, expect_failure=True)
    start_actor(procs, "a1", learner_ep, broadcaster_ep, env_id=CORRIDOR)
    first = {n: wait_for(lambda n=n: joined(procs, n), 90, f"{n} to join", procs=procs) for n in ("a0", "a1")}
    assert first["a0"][:2] == ("a0", 0) and first["a1"][:2] == ("a1", 0), first
    assert first["a0"][2] != first["a1"][2], first
    assert first["a0"][3] == first["a1"][3] == 5, first

    procs.popen["a0"].kill()
    procs.popen["a0"].wait(10)
    wait_for(lambda: "actor a0 left (silent" in procs.err("learner"), 60, "the learner to reap a0", procs=procs)
    procs.start(
        "a0-again",
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            broadcaster_ep,
            "--actor-id",
            "a0",
            "--env",
            CORRIDOR,
            *SMALL,
            *fast[:2],
        ],
    )
    again = wait_for(lambda: joined(procs, "a0-again"), 90, "a0 to join again", procs=procs)
    assert again[:2] == ("a0", 1), again
    assert again[2] not in (first["a0"][2], first["a1"][2]), (again, first)

    procs.popen["learner"].send_signal(signal.SIGINT)
    assert procs.wait("learner", 90) == 130, procs.dump()  # interrupted (asyncrl.core.exit_status)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner_iterations"] >= 1, summary
    procs.shutdown()


# ----------------------------------------------------------------------------- point 9: how a run ended


def role_pid(procs, actor_id: str) -> int | None:
    """pid of the role started with ``--actor-id actor_id`` among the adopted descendants."""
    for pid in procs.adopt_descendants():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"--actor-id" in argv and argv[argv.index(b"--actor-id") + 1] == actor_id.encode():
            return pid
    return None


@pytest.mark.timeout(150)
def test_summary_names_the_failed_role(procs, tmp_path):
    """`asyncrl run` whose actor0 is SIGKILLed mid-run, with no restarts allowed, exits non-zero,
    and its summary.json says the run failed, in which role and why, with each role's restart count."""
    run_dir = tmp_path / "run"
    procs.start(
        "run",
        [
            "run",
            "--env",
            CORRIDOR,
            "--num-actors",
            "2",
            "--total-steps",
            "100000000",
            "--run-dir",
            str(run_dir),
            "--set",
            "run.log_every_s=1",
            "--set",
            "run.max_restarts=0",
            *SMALL,
        ],
        expect_failure=True,
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 60, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 2, 60, "2 learner iterations", procs=procs)
    pid = wait_for(lambda: role_pid(procs, "actor0"), 30, "actor0's pid", procs=procs)
    os.kill(pid, signal.SIGKILL)
    assert procs.wait("run", 60) == 1, procs.dump()
    assert "actor0 exited with status -9" in procs.err("run"), procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "failed", summary
    assert summary["failure"]["role"] == "actor0", summary
    assert summary["failure"]["reason"].startswith("exited with status -9"), summary
    assert set(summary["restarts"]) == {"learner", "broadcaster", "actor0", "actor1"}, summary
    assert summary["learner_iterations"] >= 2, summary
    procs.shutdown()


# ----------------------------------------------------------------------------- point 6: numbers


@pytest.mark.timeout(150)
def test_nan_rewards_from_an_actor_are_refused_and_counted(procs, tmp_path):
    """An actor whose env yields NaN rewards (and so NaN episode returns) keeps running; the
    learner refuses those slots (counted as "nonfinite"), trains on the rest and finishes with
    finite weights and checkpoint."""
    import torch

    nan_env = "asyncrl/NaNCorridor-v0"
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 16_000
    learner_ep, broadcaster_ep = start_roles(procs, run_id=run_id, run_dir=run_dir, env_id=nan_env, total_steps=total)
    start_actor(procs, "flaky", learner_ep, broadcaster_ep, env_id=nan_env)
    assert procs.wait("learner", 120) == 0, procs.dump()
    assert procs.wait("flaky", 20) == 0, procs.dump()
    assert "non-finite numbers from its envs" in procs.out("flaky"), procs.out("flaky")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["env_steps"] >= total, summary
    assert summary["rejected_messages"].get("nonfinite", 0) >= 1, summary
    assert set(summary["rejected_messages"]) == {"nonfinite"}, summary
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["policy"].values())
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        assert all(r == r for r in row["episode_returns"]), row
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()


# ----------------------------------------------------------------------------- point 4: slot integrity


@pytest.mark.timeout(180)
def test_actor_frozen_mid_write_is_revoked_and_never_trained_on(procs, tmp_path):
    """An actor SIGSTOPped while it writes a slot, for longer than transport.actor_timeout_s: the
    learner reclaims its grants; once SIGCONTinued, the actor finds its grant revoked, stops writing
    and drops that rollout; every slot trained on holds one rollout of one behaviour version."""
    from test_multiprocess import T_LONG, E

    run_id, run_dir, total = new_run_id(), tmp_path / "run", 80_000
    long = ["--set", f"env.rollout_length={T_LONG}", "--set", "transport.actor_timeout_s=2"]
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=total, extra=long
    )
    lag_path = run_dir / "lag.jsonl"
    frozen = start_actor(procs, "frozen", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=long, expect_failure=True)
    wait_for(
        lambda: any(r["actor"] == "frozen" for r in read_jsonl(lag_path)),
        90,
        "frozen's slots to be consumed",
        interval=0.05,
        procs=procs,
    )
    start_actor(procs, "good", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=long)
    # SIGSTOP while it runs (not while it waits for a grant): it is then inside collect()
    deadline = time.monotonic() + 10
    while (st := proc_stat(frozen.pid)) is not None and st[0] != "R" and time.monotonic() < deadline:
        time.sleep(0.002)
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "actor frozen left (silent" in procs.err("learner"), 60, "the learner to reap it", procs=procs)
        wait_for(lambda: any(r["actor"] == "good" for r in read_jsonl(lag_path)), 90, "good's slots", procs=procs)
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "was revoked while this actor held it" in procs.err("frozen"),
        60,
        "the frozen actor to find its grant revoked",
        procs=procs,
    )
    assert procs.wait("learner", 150) == 0, procs.dump()
    assert procs.wait("good", 20) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished", summary
    for r in read_jsonl(lag_path):
        assert r["actor"] in ("frozen", "good"), r
        assert r["samples"] == T_LONG * E, f"a consumed slot mixes behaviour versions: {r}"
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()
