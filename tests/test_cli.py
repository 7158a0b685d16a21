"""Bad config input exits non-zero with one clear line naming the problem, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "algo.lrr=1"], "unknown config key algo.lrr"),
        (["--set", "algo.lr=fast"], "algo.lr: expected a number"),
        (["--preset", "trpo"], "unknown preset"),
        (["--env", "NoSuchEnv-v9"], "unknown env id 'NoSuchEnv-v9'"),
        (["--config", "/nonexistent.toml"], "config file not found"),
        (["--env", "FrozenLake-v1"], "observation space must be a flat Box"),
        (["--set", "algo.lr=nan"], "algo.lr: expected a number"),
        (["--set", "algo.lr=inf"], "algo.lr must be a finite number"),
        (["--set", "env.max_episode_steps=-3"], "env.max_episode_steps must be >= 0"),
    ],
)
def test_bad_config_input_one_line(args, words, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "run", "--serial", "--run-dir", str(tmp_path / "r"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert words in lines[0] and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "restart, words", [("refuse", "already holds a run"), ("resume", "holds a run without config.json")]
)
def test_run_dir_holding_a_run_is_refused(tmp_path, restart, words):
    """--restart refuse, or a run that cannot be resumed (no config.json): one line, nothing lost."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "run", "--serial", "--run-dir", str(tmp_path), "--restart", restart],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"  # nothing lost


@pytest.mark.parametrize(
    "outcome, head",
    [("finished", "done: "), ("interrupted", "interrupted: "), ("failed", "failed: "), (None, "done: ")],
)
def test_summary_line_names_how_the_run_ended(outcome, head):
    from asyncrl.cli import summary_line

    s = {
        "env_steps": 4096,
        "wall_time_s": 2.0,
        "env_steps_per_s": 2048.0,
        "learner_iterations": 2,
        "final_average_return": None,
        "lag_p50": 1,
        "lag_p95": 2,
    }
    if outcome:
        s["outcome"] = outcome
    line = summary_line(s)
    assert line.startswith(head) and "4,096 env steps" in line and "lag p50/p95 1/2 versions" in line
    # how to resume, where there is something to resume: without --run-dir a command starts a new directory
    s["resume_checkpoint"] = {"file": "checkpoint.pt", "env_steps": 2048, "version": 1, "learner_iterations": 1}
    hint = "to resume, run the same command with --run-dir runs/x"
    assert (hint in summary_line(s, Path("runs/x"))) == (head != "done: ")
    assert "--run-dir" not in summary_line(s)


def test_a_resume_says_which_checkpoint_it_starts_from():
    from asyncrl.cli.rundir import resuming_note

    ck = {"file": "checkpoint.pt", "env_steps": 172032, "version": 84, "learner_iterations": 84}
    assert resuming_note({"resume_checkpoint": ck}) == (
        " (resuming the run there from checkpoint.pt at 172,032 env steps, version 84)"
    )
    assert resuming_note({}) == resuming_note({"resume_checkpoint": None}) == " (resuming the run there)"
