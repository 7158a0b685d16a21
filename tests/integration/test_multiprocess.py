"""Multi-process runs: `asyncrl run`, the roles started by hand, an actor SIGKILLed while it writes
a slot, Ctrl-C, and actors whose config does not match the learner's.

Every test starts its processes through the ``procs`` fixture (conftest.py), which stops only
those pids at the end and asserts that none survives and that no /dev/shm segment of the test's
run id is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from mp_helpers import (
    CORRIDOR,
    SMALL,
    alive,
    assert_strict_json_files,
    descendants,
    free_port,
    free_port_pair,
    learner_cmd,
    new_run_id,
    outcome_lines,
    proc_stat,
    read_jsonl,
    shm_segments,
    wait_for,
)

pytestmark = pytest.mark.integration

RUN_LINE = re.compile(r"^run (\S+): learner ", re.MULTILINE)


def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port_pair()}"


def start_roles(procs, *, run_id, run_dir, env_id, total_steps, extra=()):
    """Broadcaster and learner by hand; returns (learner endpoint, broadcaster endpoint)."""
    learner_ep, broadcaster_ep = endpoints()
    procs.run_ids.add(run_id)
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    start_learner(
        procs,
        learner_ep,
        broadcaster_ep,
        run_id=run_id,
        run_dir=run_dir,
        env_id=env_id,
        total_steps=total_steps,
        extra=extra,
    )
    return learner_ep, broadcaster_ep


def start_learner(procs, learner_ep, broadcaster_ep, *, run_id, run_dir, env_id, total_steps, extra=()):
    procs.start(
        "learner",
        learner_cmd(
            learner_ep, broadcaster_ep, *SMALL, *extra, run_id=run_id, run_dir=run_dir, total=total_steps, env=env_id
        ),
    )


def start_actor(procs, name, learner_ep, broadcaster_ep, *, env_id, extra=(), expect_failure=False, prefix=()):
    """``asyncrl actor`` ``name`` of the run at ``learner_ep`` (``prefix``: e.g. ``ip netns exec NS``)."""
    return procs.start(
        name,
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            broadcaster_ep,
            "--actor-id",
            name,
            "--env",
            env_id,
            *SMALL,
            *extra,
        ],
        expect_failure=expect_failure,
        prefix=prefix,
    )


def check_run_outputs(run_dir: Path, total_steps: int, *, actors: set[str] | None = None) -> dict:
    """summary.json, metrics.jsonl, lag.jsonl and checkpoint.pt of a finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["failure"] is None, summary
    assert summary["env_steps"] >= total_steps, summary
    assert summary["learner_iterations"] > 0, summary
    for key in ("lag_p50", "lag_p95", "lag_seconds_p50", "lag_seconds_p95"):
        assert summary[key] is not None and summary[key] >= 0, (key, summary)
    assert summary["rejected_messages"] == {}, summary
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == summary["learner_iterations"]
    assert [m["iteration"] for m in metrics] == list(range(1, len(metrics) + 1))
    assert metrics[-1]["env_steps"] == summary["env_steps"]
    lag = read_jsonl(run_dir / "lag.jsonl")
    assert lag, "lag.jsonl is empty"
    for row in (r for r in lag if "event" not in r):
        assert 0 <= row["behavior_version"] <= row["version"], row
        assert row["lag_versions"] == row["version"] - row["behavior_version"], row
        if actors is not None:
            assert row["actor"] in actors, row
        check_lag_parts(row)
    assert (run_dir / "checkpoint.pt").stat().st_size > 0
    return summary


def check_lag_parts(row: dict) -> None:
    """A lag.jsonl row's parts add up to its lag (asyncrl.core.lag_parts): seconds to 6 decimals each."""
    seconds = [row[f"{p}_s"] for p in ("propagation", "collection", "queueing")]
    versions = [row[f"{p}_versions"] for p in ("propagation", "collection", "queueing")]
    assert None not in seconds and None not in versions, row  # actors of this version report collect_s
    assert all(x >= 0 for x in seconds + versions) and row["grant_wait_s"] <= row["propagation_s"] + 1e-6, row
    assert abs(sum(seconds) - row["lag_seconds"]) <= 4e-6, row
    assert sum(versions) == row["lag_versions"], row


def wait_adopting(procs, name: str, timeout: float) -> int:
    """Wait for ``name`` to exit, recording its descendants meanwhile; returns its exit status."""
    p = procs.popen[name]
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        procs.adopt_descendants()
        if time.monotonic() > deadline:
            pytest.fail(f"{name} did not finish within {timeout:.0f} s\n{procs.dump()}")
        time.sleep(0.2)
    return p.returncode


def wait_all_dead(pids: dict[int, int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, start in pids.items() if alive(pid, start)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# ----------------------------------------------------------------------------- 1. asyncrl run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.compiles)], ids=["eager", "compiled"])
def test_run_command_halfcheetah(procs, tmp_path, compiled):
    """`asyncrl run`: 2 actors, ~8k HalfCheetah steps, exit 0, complete outputs, nothing left; with
    learner.compile the learner compiles in a thread before its first iteration (learner_warm_up_s)."""
    run_dir, total = tmp_path / "run", 8000
    procs.start(
        "run",
        [
            "run",
            "--env",
            "HalfCheetah-v5",
            "--num-actors",
            "2",
            "--total-steps",
            str(total),
            "--run-dir",
            str(run_dir),
            "--set",
            "run.log_every_s=2",
            "--set",
            f"learner.compile={str(compiled).lower()}",
            *SMALL,
        ],
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 60, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    wait_for(
        lambda: len(procs.adopt_descendants()) >= 4 or procs.popen["run"].poll() is not None,
        30,
        "learner, broadcaster and 2 actors",
        procs=procs,
    )
    rc = wait_adopting(procs, "run", 120)
    assert rc == 0, procs.dump()
    lines = outcome_lines(procs.out("run") + procs.err("run"))  # the learner's goes to its log
    assert len(lines) == 1 and lines[0].startswith("done:"), procs.dump()
    left = wait_all_dead(procs.others, 5)
    assert not left, f"processes of the run outlived it: {left}"
    assert not shm_segments(run_id)
    check_run_outputs(run_dir, total, actors={"actor0", "actor1"})
    files = {p.name for p in assert_strict_json_files(run_dir)}
    assert {"config.json", "summary.json", "metrics.jsonl", "lag.jsonl", "broadcaster-summary.json"} <= files, files
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    assert set(logs) >= {"learner.log", "broadcaster.log", "actor0.log", "actor1.log"}
    for name, text in logs.items():
        assert "Traceback" not in text and "Aborted!" not in text, f"{name}:\n{text}"
    assert "compile of the fused minibatch step failed" not in logs["learner.log"]
    breakdown = json.loads((run_dir / "summary.json").read_text())["time_breakdown_s"]
    assert (breakdown.get("learner_warm_up_s", 0.0) > 0.0) == compiled, breakdown
    procs.shutdown()


# ----------------------------------------------------------------------------- 2. by hand


@pytest.mark.timeout(150)
def test_roles_by_hand_actors_before_learner(procs, tmp_path):
    """broadcaster, learner and 2 actors as separate commands; the actors start first and wait."""
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 6000
    procs.run_ids.add(run_id)
    learner_ep, broadcaster_ep = endpoints()
    for name in ("a0", "a1"):
        start_actor(procs, name, learner_ep, broadcaster_ep, env_id="HalfCheetah-v5")

    # the actors are saying hello into the void once they have loaded ZeroMQ and their envs
    def actors_waiting():
        for name in ("a0", "a1"):
            pid = procs.popen[name].pid
            try:
                if "zmq" not in Path(f"/proc/{pid}/maps").read_text():
                    return False
            except FileNotFoundError:
                return False
        return True

    wait_for(actors_waiting, 60, "the actors to load ZeroMQ", procs=procs)
    time.sleep(1.5)
    assert all(procs.popen[n].poll() is None for n in ("a0", "a1")), procs.dump()

    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    start_learner(
        procs, learner_ep, broadcaster_ep, run_id=run_id, run_dir=run_dir, env_id="HalfCheetah-v5", total_steps=total
    )
    assert procs.wait("learner", 120) == 0, procs.dump()
    for name in ("a0", "a1"):
        assert procs.wait(name, 20) == 0, procs.dump()
        lines = outcome_lines(procs.out(name) + procs.err(name))
        assert (
            len(lines) == 1
            and lines[0].startswith(f"done: actor {name}, ")
            and lines[0].endswith("sent; step budget reached")
        ), procs.dump()
    lines = outcome_lines(procs.out("learner") + procs.err("learner"))
    assert len(lines) == 1 and lines[0].startswith("done:"), procs.dump()
    assert not shm_segments(run_id), "the learner left its segment behind"
    # a broadcaster runs until stopped; Ctrl-C stops it cleanly, as an interrupted command (130)
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    assert procs.wait("broadcaster", 10) == 130
    lines = outcome_lines(procs.out("broadcaster") + procs.err("broadcaster"))
    assert len(lines) == 1 and lines[0].startswith("interrupted: broadcaster, ") and "published" in lines[0], lines
    log = procs.err("learner")
    assert "actor a0 joined" in log and "actor a1 joined" in log
    for name in ("learner", "broadcaster", "a0", "a1"):
        assert "Traceback" not in procs.err(name), procs.err(name)
    check_run_outputs(run_dir, total, actors={"a0", "a1"})
    procs.shutdown()


# ----------------------------------------------------------------------------- 3. killed mid-write

T_LONG, E = 997, 2


def corridor_ring(name: str):
    from asyncrl.core.spec import RolloutSpec
    from asyncrl.wire.shm.ring import SlotRing

    spec = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=T_LONG, num_envs=E)
    return SlotRing.attach(name=name, spec=spec, num_slots=6)


def torn_rows(views: dict) -> int | None:
    """First row t where a Corridor slot stops being one rollout, or None (also for a slot never
    written).

    One rollout writes one behaviour version into every row, and Corridor's obs[.., 1] counts steps
    since the last reset: obs[t+1] = obs[t] + 1, or 0 right after an episode end. A slot whose
    writer was killed holds the new rollout up to some row and an older one (or zeros) after it.
    T_LONG is not a divisor of Corridor's 1000-step episodes, so consecutive rollouts start at
    different counters and the seam shows."""
    c = views["obs"][:, :, 1]
    if not c.any():
        return None
    ended = views["terminated"] | views["truncated"]
    ok = np.where(ended, c[1:] == 0, c[1:] == c[:-1] + 1).all(axis=1)
    bv = views["behavior_version"]
    ok &= (bv == bv[0, 0]).all(axis=1)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else None


@pytest.mark.timeout(300)
def test_actor_killed_while_writing(procs, tmp_path):
    """Actors SIGKILLed in the middle of writing a slot: the learner reclaims their grants after
    transport.actor_timeout_s, never consumes the half-written slot, and training finishes.

    To make a consumed half-written slot visible, the test (attached to the learner's segment)
    marks the last row of the dead actor's torn slot with another behaviour version. Every slot a
    rollout fills carries one behaviour version, so each lag.jsonl row (one per slot and version)
    must hold all T*E samples of its slot; the marked slot, if consumed, would split into two rows.
    """
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 60_000
    long = ["--set", f"env.rollout_length={T_LONG}", "--set", "transport.actor_timeout_s=2"]
    learner_ep, broadcaster_ep = start_roles(
        procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=total, extra=long
    )
    segment = wait_for(lambda: shm_segments(run_id), 60, "the learner's segment", procs=procs)[0]
    lag_path = run_dir / "lag.jsonl"

    torn_seen, killed = [], []
    for k in range(3):
        name = f"doomed{k}"
        p = start_actor(procs, name, learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=long, expect_failure=True)
        # it works alone, with a policy version >= 1, before it is killed
        wait_for(
            lambda name=name: any(r["actor"] == name and r["behavior_version"] >= 1 for r in read_jsonl(lag_path)),
            60,
            f"{name}'s slots to be consumed",
            interval=0.05,
            procs=procs,
        )
        # SIGKILL while it runs (not while it waits): it is then inside collect(), writing a slot
        deadline = time.monotonic() + 10
        while (st := proc_stat(p.pid)) is not None and st[0] != "R" and time.monotonic() < deadline:
            time.sleep(0.002)
        p.kill()
        p.wait(10)
        killed.append(name)
        # no actor is alive now, so a torn slot is the dead actor's; mark it before it is reclaimed
        ring = corridor_ring(segment)
        try:
            for i in range(ring.num_slots):
                views = ring.views(i)
                t = torn_rows(views)
                if t is not None:
                    bv = views["behavior_version"]
                    bv[T_LONG - 1] = 0 if bv[0, 0] != 0 else 1
                    torn_seen.append((name, i, t))
                del views
        finally:
            ring.close()
        if torn_seen and k >= 1:
            break
    assert torn_seen, "no kill landed while an actor was writing a slot"
    # every killed actor is given up (its granted slots freed) while no actor is alive, so the run cannot
    # end first: on a loaded machine the good actor alone once finished the run within the last one's 2 s
    wait_for(
        lambda: all(
            re.search(rf"actor {name} left \(silent for 2 s\); \d+ granted slots freed", procs.err("learner"))
            for name in killed
        ),
        120,
        "the learner to give up every killed actor",
        procs=procs,
    )

    start_actor(procs, "good", learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=long)
    assert procs.wait("learner", 120) == 0, procs.dump()
    assert procs.wait("good", 20) == 0, procs.dump()

    log = procs.err("learner")
    for name, _, _ in torn_seen:  # the torn slot was granted to it, so at least that one came back
        freed = int(re.search(rf"actor {name} left \(silent for 2 s\); (\d+) granted", log).group(1))
        assert freed >= 1, log

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= total and summary["rejected_messages"] == {}, summary
    rows = read_jsonl(lag_path)
    assert any(r["actor"] == "good" for r in rows)
    last_version: dict[str, int] = {}
    for r in rows:
        assert r["actor"] in {*killed, "good"}, r
        assert 0 <= r["behavior_version"] <= r["version"], r
        assert r["samples"] == T_LONG * E, f"a consumed slot mixes behaviour versions: {r}"
        # an actor's slots are consumed in the order it filled them, its version never goes back
        assert r["behavior_version"] >= last_version.get(r["actor"], 0), r
        last_version[r["actor"]] = r["behavior_version"]
    procs.shutdown()


@pytest.mark.timeout(120)
def test_actor_with_long_rollouts_is_not_reaped(procs, tmp_path):
    """A live actor whose rollout takes longer than transport.actor_timeout_s keeps heartbeating
    while it collects: the learner must not reap it (it would regrant the slot being written and
    then refuse everything the actor sends, so the run would never finish)."""
    # actor.slowdown_s makes every rollout last at least 4 s whatever the machine's speed: twice
    # the timeout, by construction rather than by a guess at how fast the envs step
    run_id, run_dir, T = new_run_id(), tmp_path / "run", 2_000
    cfg = [
        "--set",
        "env.num_envs=1",
        "--set",
        f"env.rollout_length={T}",
        "--set",
        "learner.slots_per_batch=1",
        "--set",
        "learner.num_slots=3",
        "--set",
        "algo.num_epochs=1",
        "--set",
        "transport.actor_timeout_s=2",
        "--set",
        "transport.heartbeat_s=0.2",
        "--set",
        "actor.slowdown_s=4",
    ]
    learner_ep, broadcaster_ep = endpoints()
    procs.run_ids.add(run_id)
    procs.start("broadcaster", ["broadcaster", "--bind", broadcaster_ep])
    procs.start(
        "learner",
        learner_cmd(learner_ep, broadcaster_ep, *cfg, run_id=run_id, run_dir=run_dir, total=2 * T),
    )
    procs.start(
        "slow",
        [
            "actor",
            "--learner",
            learner_ep,
            "--broadcaster",
            broadcaster_ep,
            "--actor-id",
            "slow",
            "--env",
            CORRIDOR,
            *cfg,
        ],
    )
    learner = procs.popen["learner"]
    wait_for(
        lambda: learner.poll() is not None or "left (silent" in procs.err("learner"),
        90,
        "the learner to finish",
        procs=procs,
    )
    assert "left (silent" not in procs.err("learner"), procs.err("learner")
    assert procs.wait("learner", 10) == 0, procs.dump()
    assert procs.wait("slow", 20) == 0, procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 2 * T and summary["rejected_messages"] == {}, summary
    # the case under test: the rollouts really outlasted the timeout (the slowdown sleeps are
    # part of the actor's inference time)
    timing, slots = summary["time_breakdown_s"], summary["slot_counters"]
    per_rollout = (timing["actors_env_s"] + timing["actors_inference_s"]) / slots["completed"]
    assert per_rollout >= 2.0, (per_rollout, timing, slots)
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()


# ----------------------------------------------------------------------------- 4. Ctrl-C


@pytest.mark.timeout(120)
def test_sigint_stops_every_process(procs, tmp_path):
    """Ctrl-C (SIGINT to the run's process group) mid-training: the launcher and every process it
    started exit within 5 s, and the run's shared memory is gone.

    Exiting is not free (a role that imported torch spends about 0.6 CPU-s in interpreter
    shutdown), so on a machine loaded well beyond its cores by other jobs the 5 s stretch in
    proportion to the load (at most 15 s); the other checks then still tell a clean exit from a
    killed one (the learner's summary and checkpoint, no traceback)."""
    run_dir = tmp_path / "run"
    p = procs.start(
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
            *SMALL,
        ],
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out("run")), 60, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 3, 60, "3 learner iterations", procs=procs)
    assert shm_segments(run_id)
    tree = {p.pid: proc_stat(p.pid)[2], **procs.adopt_descendants()}
    assert len(tree) >= 5, f"expected launcher, learner, broadcaster and 2 actors: {tree}"
    assert all(os.getpgid(pid) == p.pid for pid in tree), "a role left the run's process group"

    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    limit = 5.0 if load < 1.5 else min(15.0, 5.0 * load)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    left = wait_all_dead(tree, limit)
    elapsed = time.monotonic() - t0
    if left:
        states = {
            pid: (proc_stat(pid), Path(f"/proc/{pid}/cmdline").read_bytes()[:120]) for pid in left if proc_stat(pid)
        }
        pytest.fail(
            f"still alive {elapsed:.1f} s after Ctrl-C (limit {limit:.1f} s, load per core {load:.1f}): "
            f"{states}\n{procs.dump()}"
        )
    assert p.wait(1) == 130, procs.dump()
    lines = outcome_lines(procs.out("run") + procs.err("run"))  # one, though every role was interrupted
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), procs.dump()
    assert "a resume starts from checkpoint.pt at " in lines[0], lines
    assert not shm_segments(run_id), "the run's shared memory outlived Ctrl-C"
    assert not descendants(p.pid)
    # every role unwound cleanly, even though Ctrl-C reached it twice (the terminal's, then the
    # launcher's): no traceback, and the interrupted learner still wrote its summary and checkpoint
    for log in (run_dir / "logs").iterdir():
        text = log.read_text(errors="replace")
        assert "Traceback" not in text and "Aborted!" not in text, f"{log.name}:\n{text}"
    assert outcome_lines((run_dir / "logs" / "learner.log").read_text())[0].startswith("interrupted: ")
    assert_strict_json_files(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    ck = summary["resume_checkpoint"]
    assert ck["file"] == "checkpoint.pt" and 0 < ck["env_steps"] <= summary["env_steps"], summary
    assert summary["learner_iterations"] >= 3, summary
    assert summary["outcome"] == "interrupted" and summary["failure"] is None, summary
    assert summary["restarts"] == {"broadcaster": 0, "learner": 0, "actor0": 0, "actor1": 0}, summary
    assert (run_dir / "checkpoint.pt").stat().st_size > 0
    procs.shutdown()


# ----------------------------------------------------------------------------- 5. exit status by hand


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_learner_by_hand_exit_status_and_one_outcome_line(procs, tmp_path, sig):
    """A learner started by hand and stopped by SIGINT / SIGTERM exits 130 / 143 (as `asyncrl run`
    does) with one outcome line, writes its summary naming the resume checkpoint, and removes its
    shared memory."""
    run_id, run_dir = new_run_id(), tmp_path / "run"
    procs.run_ids.add(run_id)
    learner_ep, broadcaster_ep = endpoints()
    procs.start(
        "learner",
        learner_cmd(learner_ep, broadcaster_ep, *SMALL, run_id=run_id, run_dir=run_dir, total="1000000"),
        expect_failure=True,
    )
    wait_for(lambda: "listening on" in procs.err("learner"), 60, "the learner to listen", procs=procs)
    procs.popen["learner"].send_signal(sig)
    assert procs.wait("learner", 60) == 128 + sig, procs.dump()
    lines = outcome_lines(procs.out("learner") + procs.err("learner"))
    assert len(lines) == 1 and lines[0].startswith("interrupted: 0 env steps"), procs.dump()
    assert "a resume starts from checkpoint.pt at 0 env steps (version 0)" in lines[0], lines
    assert "Traceback" not in procs.err("learner"), procs.dump()
    assert not shm_segments(run_id)
    assert_strict_json_files(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "interrupted" and summary["resume_checkpoint"] == {
        "file": "checkpoint.pt",
        "env_steps": 0,
        "version": 0,
        "learner_iterations": 0,
    }, summary
    procs.shutdown()


@pytest.mark.timeout(120)
def test_actor_by_hand_interrupted_while_waiting_for_its_learner(procs, tmp_path):
    """An actor stopped by SIGTERM before any learner answered: exit 143, one outcome line."""
    learner_ep, broadcaster_ep = endpoints()
    p = start_actor(procs, "a0", learner_ep, broadcaster_ep, env_id=CORRIDOR, expect_failure=True)
    wait_for(lambda: "zmq" in Path(f"/proc/{p.pid}/maps").read_text(), 60, "the actor to load ZeroMQ", procs=procs)
    time.sleep(1.0)  # saying hello into the void
    p.send_signal(signal.SIGTERM)
    assert procs.wait("a0", 60) == 143, procs.dump()
    lines = outcome_lines(procs.out("a0") + procs.err("a0"))
    assert lines == ["interrupted: actor a0, 0 rollouts sent"], procs.dump()
    procs.shutdown()


# ----------------------------------------------------------------------------- 6. mismatched actors


@pytest.mark.timeout(150)
def test_mismatched_actor_refused(procs, tmp_path):
    """An actor with another env id or rollout length is refused with one line naming the field and
    both values (exit status 2); a good actor then trains to the end of the run.

    Robust to load and to extra log lines: the bad actors are refused before any good actor exists
    (so the learner cannot reach its budget first, however slowly they start), and of their stderr
    only the error line counts (an INFO line such as "waiting for the learner" may precede it)."""
    run_id, run_dir, total = new_run_id(), tmp_path / "run", 16_000
    learner_ep, broadcaster_ep = start_roles(procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=total)
    bad = {
        "bad_env": (
            ["--set", "run.seed=3"],
            "asyncrl/Constant-v0",
            "env_id: actor has 'asyncrl/Constant-v0', learner has 'asyncrl/Corridor-v0'",
        ),
        "bad_len": (["--set", "env.rollout_length=32"], CORRIDOR, "rollout_length: actor has 32, learner has 16"),
    }
    for name, (extra, env_id, _) in bad.items():
        start_actor(procs, name, learner_ep, broadcaster_ep, env_id=env_id, extra=extra, expect_failure=True)
    for name, (_, _, words) in bad.items():
        assert procs.wait(name, 90) == 2, procs.dump()
        err = procs.err(name)
        assert "Traceback" not in err, err
        errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1, err
        assert words in errors[0] and "refused" in errors[0], errors[0]
    assert procs.popen["learner"].poll() is None, procs.dump()
    start_actor(procs, "good", learner_ep, broadcaster_ep, env_id=CORRIDOR)
    assert procs.wait("learner", 120) == 0, procs.dump()
    assert procs.wait("good", 20) == 0, procs.dump()
    log = procs.err("learner")
    assert "refused actor bad_env" in log and "refused actor bad_len" in log
    check_run_outputs(run_dir, total, actors={"good"})
    procs.popen["broadcaster"].send_signal(signal.SIGINT)
    procs.shutdown()
