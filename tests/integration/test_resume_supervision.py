"""Resume and supervision: a serial run killed at a random iteration and
re-run ends bit-identical to one that was not; `asyncrl run` killed whole and re-run goes on to
its budget; under `asyncrl run` a killed actor or learner is restarted (the learner resumes from
its checkpoint), a role killed past run.max_restarts fails the run naming it, and the roles die
with a killed supervisor.

Every test starts its processes through the ``procs`` fixture (conftest.py), which stops only
those pids at the end and asserts that none survives and that no /dev/shm segment of the test's
run ids is left. Nothing here asserts on timing, on how many log lines appear, or on their order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from mp_helpers import SMALL, alive, read_jsonl, shm_segments, wait_for
from test_faults import role_pid
from test_multiprocess import CORRIDOR, RUN_LINE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_resume import assert_same_run  # noqa: E402

pytestmark = pytest.mark.integration

SERIAL = [
    "--set",
    "env.num_envs=2",
    "--set",
    "env.rollout_length=16",
    "--set",
    "learner.slots_per_batch=2",
    "--set",
    "learner.num_slots=2",
    "--set",
    "algo.num_minibatches=4",
    "--set",
    "algo.num_epochs=2",
    "--set",
    "run.log_every_s=1000",
    "--set",
    "learner.checkpoint_every=3",
    "--seed",
    "4",
]


def iterations(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" not in r]


def kill_tree(procs, name: str, sig: int = signal.SIGKILL) -> None:
    """``sig`` to the process ``name`` and every descendant of it we recorded, by pid."""
    tree = procs.adopt_descendants()
    os.kill(procs.popen[name].pid, sig)
    for pid, start in tree.items():
        if alive(pid, start):
            os.kill(pid, sig)


# ----------------------------------------------------------------------------- (a) serial


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "env_id, total, sig",
    [(CORRIDOR, 1600, signal.SIGKILL), (CORRIDOR, 1600, signal.SIGTERM), ("HalfCheetah-v5", 640, signal.SIGKILL)],
)
def test_serial_run_interrupted_and_resumed_is_bit_identical(procs, tmp_path, env_id, total, sig):
    """`asyncrl run --serial` stopped by ``sig`` at a random iteration, then the same command
    again: the final weights, normalisers and every metrics row (but the clock's) equal those of
    the run that was not stopped, and each iteration is logged once."""
    args = ["run", "--serial", "--env", env_id, "--total-steps", str(total), *SERIAL]
    procs.start("whole", [*args, "--run-dir", str(tmp_path / "a")])
    assert procs.wait("whole", 300) == 0, procs.dump()
    iterations_total = len(iterations(tmp_path / "a"))
    stop_after = random.Random().randint(1, iterations_total // 2)  # room for a slow poll under load
    procs.start("cut", [*args, "--run-dir", str(tmp_path / "b")], expect_failure=True)
    wait_for(lambda: len(iterations(tmp_path / "b")) >= stop_after, 200, f"{stop_after} iterations", procs=procs)
    os.kill(procs.popen["cut"].pid, sig)
    assert procs.wait("cut", 60) != 0, f"the run finished before it was stopped\n{procs.dump()}"
    procs.start("again", [*args, "--run-dir", str(tmp_path / "b")])
    assert procs.wait("again", 300) == 0, procs.dump()
    assert "resuming the run there" in procs.out("again"), procs.dump()
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["resumes"] == 1 and summary["env_steps"] == total, summary
    assert_same_run(tmp_path / "a", tmp_path / "b")


# ----------------------------------------------------------------------------- (b) asyncrl run, whole group

ASYNC = [
    "--env",
    CORRIDOR,
    "--num-actors",
    "2",
    "--set",
    "run.log_every_s=1",
    "--set",
    "learner.checkpoint_every=3",
    "--set",
    "transport.actor_timeout_s=3",
    "--set",
    "run.restart_backoff_s=0.2",
    *SMALL,
]


def start_run(procs, name, run_dir, total, extra=(), expect_failure=False) -> str:
    procs.start(
        name,
        ["run", "--total-steps", str(total), "--run-dir", str(run_dir), *ASYNC, *extra],
        expect_failure=expect_failure,
    )
    run_id = wait_for(lambda: RUN_LINE.search(procs.out(name)), 90, "the run line", procs=procs).group(1)
    procs.run_ids.add(run_id)
    return run_id


def check_resumed_outputs(run_dir: Path, total: int) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["failure"] is None, summary
    assert summary["env_steps"] >= total, summary
    its = [m["iteration"] for m in iterations(run_dir)]
    assert its == list(range(1, len(its) + 1)) and its[-1] == summary["learner_iterations"], its
    return summary


@pytest.mark.timeout(300)
def test_asyncrl_run_killed_whole_resumes_to_its_budget(procs, tmp_path):
    run_dir, total = tmp_path / "run", 3000
    start_run(procs, "first", run_dir, total, expect_failure=True)
    wait_for(lambda: len(iterations(run_dir)) >= 5, 120, "5 learner iterations", procs=procs)
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 60, "a checkpoint", procs=procs)
    kill_tree(procs, "first")
    procs.wait("first", 30)
    start_run(procs, "again", run_dir, total)
    assert procs.wait("again", 240) == 0, procs.dump()
    summary = check_resumed_outputs(run_dir, total)
    assert summary["resumes"] == 1, summary
    events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" in r]
    assert len(events) == 1 and events[0]["from_iteration"] >= 3, events


# ----------------------------------------------------------------------------- (c) restarts


@pytest.mark.timeout(300)
def test_killed_actor_and_learner_are_restarted(procs, tmp_path):
    """actor0 SIGKILLed: restarted; then the learner SIGKILLed: restarted, it resumes from its
    checkpoint (broadcaster and actors start again with it); the run finishes with exit 0."""
    run_dir, total = tmp_path / "run", 4000
    start_run(procs, "run", run_dir, total)
    wait_for(lambda: len(iterations(run_dir)) >= 2, 120, "2 learner iterations", procs=procs)
    first = wait_for(lambda: role_pid(procs, "actor0"), 30, "actor0's pid", procs=procs)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: (role_pid(procs, "actor0") or first) != first, 60, "actor0 restarted", procs=procs)
    done = len(iterations(run_dir))
    wait_for(lambda: len(iterations(run_dir)) >= done + 2, 120, "2 more iterations", procs=procs)
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 60, "a checkpoint", procs=procs)
    learner = wait_for(lambda: learner_pid(procs), 30, "the learner's pid", procs=procs)
    os.kill(learner, signal.SIGKILL)
    assert procs.wait("run", 240) == 0, procs.dump()
    summary = check_resumed_outputs(run_dir, total)
    assert summary["restarts"]["actor0"] == 1 and summary["restarts"]["learner"] == 1, summary
    assert summary["resumes"] == 1, summary


def learner_pid(procs) -> int | None:
    return role_command_pid(procs, b"learner")


def role_command_pid(procs, command: bytes) -> int | None:
    """pid of a live process we started whose command (``asyncrl COMMAND``) is ``command``."""
    for pid in procs.adopt_descendants():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if command in argv[:5] and alive(pid):
            return pid
    return None


@pytest.mark.timeout(200)
def test_role_killed_past_its_budget_fails_the_run(procs, tmp_path):
    """run.max_restarts = 1: actor0 killed twice ends the run, exit 1, naming actor0 and its budget."""
    run_dir = tmp_path / "run"
    start_run(
        procs,
        "run",
        run_dir,
        100_000_000,
        extra=["--set", "run.max_restarts=1", "--set", "run.restart_window_s=600"],
        expect_failure=True,
    )
    wait_for(lambda: len(iterations(run_dir)) >= 2, 120, "2 learner iterations", procs=procs)
    first = wait_for(lambda: role_pid(procs, "actor0"), 30, "actor0's pid", procs=procs)
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: (p := role_pid(procs, "actor0")) != first and p, 60, "actor0 restarted", procs=procs)
    os.kill(second, signal.SIGKILL)
    assert procs.wait("run", 60) == 1, procs.dump()
    assert "actor0 exited with status -9 (restarted 1 time in the last 600 s, run.max_restarts = 1)" in procs.err(
        "run"
    ), procs.dump()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "failed" and summary["failure"]["role"] == "actor0", summary
    assert summary["restarts"]["actor0"] == 1, summary


@pytest.mark.timeout(200)
def test_restarts_older_than_the_window_do_not_count(procs, tmp_path):
    """run.max_restarts = 1, run.restart_window_s = 2: actor0 killed, restarted, and killed again
    more than 2 s after its restart is restarted again (its first restart no longer counts)."""
    run_dir = tmp_path / "run"
    start_run(
        procs,
        "run",
        run_dir,
        100_000_000,
        extra=["--set", "run.max_restarts=1", "--set", "run.restart_window_s=2"],
        expect_failure=True,
    )
    wait_for(lambda: len(iterations(run_dir)) >= 2, 120, "2 learner iterations", procs=procs)
    first = wait_for(lambda: role_pid(procs, "actor0"), 30, "actor0's pid", procs=procs)
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: (p := role_pid(procs, "actor0")) != first and p, 60, "actor0 restarted", procs=procs)
    time.sleep(3.0)  # longer than the window since the restart
    os.kill(second, signal.SIGKILL)
    wait_for(
        lambda: (p := role_pid(procs, "actor0")) not in (first, second) and p, 60, "actor0 restarted again", procs=procs
    )
    assert procs.popen["run"].poll() is None, procs.dump()
    procs.popen["run"].send_signal(signal.SIGINT)
    procs.wait("run", 60)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"]["actor0"] == 2 and summary["outcome"] == "interrupted", summary


# ----------------------------------------------------------------------------- (d) supervisor killed


@pytest.mark.timeout(200)
def test_roles_die_with_a_killed_supervisor(procs, tmp_path):
    run_dir = tmp_path / "run"
    run_id = start_run(procs, "run", run_dir, 100_000_000, expect_failure=True)
    wait_for(lambda: len(iterations(run_dir)) >= 2, 120, "2 learner iterations", procs=procs)
    roles = procs.adopt_descendants()
    assert len(roles) >= 4 and shm_segments(run_id), roles
    os.kill(procs.popen["run"].pid, signal.SIGKILL)
    procs.wait("run", 30)
    wait_for(lambda: not any(alive(pid, start) for pid, start in roles.items()), 60, "the roles to exit")
    wait_for(lambda: not shm_segments(run_id), 30, "the learner to remove its shared memory")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "interrupted", summary  # the learner got SIGTERM and wrote it
