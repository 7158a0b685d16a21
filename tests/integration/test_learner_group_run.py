"""`asyncrl run --learners 2`: a learner group (the learner and one learner-member process) trains
the run to its budget; a member SIGKILLed mid-run takes the group down and the supervisor restarts
it, the learner from its checkpoint; configs a group cannot honour are refused before any process
starts. Processes through the ``procs`` fixture (killed by pid, no /dev/shm segment left); nothing
here asserts on timing or on log-line counts."""

from __future__ import annotations

import os
import signal

import pytest
from mp_helpers import REPO, SMALL, wait_for
from test_resume_supervision import check_resumed_outputs, iterations, role_command_pid, start_run

pytestmark = pytest.mark.integration

GROUP = ["--learners", "2", "--set", "learner.group_timeout_s=20"]


def member_pid(procs) -> int | None:
    return role_command_pid(procs, b"learner-member")


@pytest.mark.timeout(300)
def test_learner_group_trains_to_its_budget(procs, tmp_path):
    run_dir, total = tmp_path / "run", 2000
    start_run(procs, "run", run_dir, total, GROUP)
    assert procs.wait("run", 240) == 0, procs.dump()
    summary = check_resumed_outputs(run_dir, total)
    assert summary["resumes"] == 0 and summary["restarts"]["learner-member1"] == 0, summary
    member_log = (run_dir / "logs" / "learner-member1.log").read_text()
    assert f"finished, {summary['learner_iterations']} iterations" in member_log, member_log[-2000:]


def signal_member_mid_run(procs, tmp_path, sig: int) -> dict:
    """A group run to 6,000 env steps whose member gets ``sig`` after 4 iterations and a checkpoint;
    the run must end with exit 0: its summary."""
    run_dir, total = tmp_path / "run", 6000
    start_run(procs, "run", run_dir, total, GROUP)
    wait_for(lambda: len(iterations(run_dir)) >= 4, 120, "4 learner iterations", procs=procs)
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 60, "a checkpoint", procs=procs)
    member = wait_for(lambda: member_pid(procs), 30, "the member's pid", procs=procs)
    os.kill(member, sig)
    assert procs.wait("run", 320) == 0, procs.dump()
    return check_resumed_outputs(run_dir, total)


@pytest.mark.timeout(400)
def test_killed_member_restarts_the_group_from_its_checkpoint(procs, tmp_path):
    summary = signal_member_mid_run(procs, tmp_path, signal.SIGKILL)
    assert summary["restarts"]["learner-member1"] == 1 and summary["resumes"] == 1, summary


@pytest.mark.timeout(400)
def test_frozen_member_fails_the_group_within_its_timeout_and_the_group_restarts(procs, tmp_path):
    """A member SIGSTOPped mid-run: the learner's next collective fails within learner.group_timeout_s,
    the supervisor restarts the group (the frozen process is killed), and the run finishes."""
    summary = signal_member_mid_run(procs, tmp_path, signal.SIGSTOP)
    assert summary["restarts"]["learner"] + summary["restarts"]["learner-member1"] >= 1, summary
    assert summary["resumes"] >= 1, summary


@pytest.mark.parametrize(
    "args, words",
    [
        (["--learners", "3"], "must divide the batch's env streams"),  # 2 slots x 2 envs: 4 streams
        (["--learners", "2", "--serial"], "serial mode is the single-process reference"),
        (["--learners", "0"], "learner.num_learners must be >= 1"),
        (["--config", str(REPO / "configs/gsm-tiny.toml"), "--learners", "2"], "trains the control task only"),
    ],
)
def test_a_group_it_cannot_run_is_refused(procs, tmp_path, args, words):
    procs.start(
        "run",
        ["run", "--env", "asyncrl/Corridor-v0", "--run-dir", str(tmp_path / "r"), *SMALL, *args],
        expect_failure=True,
    )
    assert procs.wait("run", 60) == 2
    assert words in procs.err("run"), procs.dump()
