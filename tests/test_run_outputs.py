"""Strict, consistent outputs: every JSON / JSONL file of a run parses with a strict
parser, config.json's infinities load back, summary.json names the checkpoint a resume starts from,
and an interrupted `asyncrl run` ends with one outcome line and exit status 130."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.core.metrics import loads_strict, read_jsonl, strict_json
from asyncrl.run.pdeathsig import sigint_as_in_a_terminal
from asyncrl.run.serial import run_serial

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=2",
    "algo.num_epochs=1",
    "env.max_episode_steps=12",
    "run.eval_every=256",
    "run.log_every_s=0",
]
OUTCOME_HEADS = ("done:", "interrupted:", "failed:", "Error:")


def strict_files(run_dir: Path) -> dict[str, list]:
    """Every .json / .jsonl file under ``run_dir`` parsed strictly: {relative path: [values]}."""
    out = {}
    for p in sorted(run_dir.rglob("*")):
        if p.is_file() and p.suffix in (".json", ".jsonl"):
            text = p.read_text()
            lines = [ln for ln in text.splitlines() if ln.strip()] if p.suffix == ".jsonl" else [text]
            out[str(p.relative_to(run_dir))] = [loads_strict(ln) for ln in lines]  # raises on NaN / Infinity
    return out


def test_strict_json_writes_non_finite_as_null_and_config_infinity_as_text():
    value = {
        "a": math.nan,
        "b": [math.inf, -math.inf, np.float32("nan"), np.float64(1.5)],
        "c": (1, np.int64(2)),
        "d": np.array([0.5, np.inf]),
    }
    assert json.loads(strict_json(value)) == {"a": None, "b": [None, None, None, 1.5], "c": [1, 2], "d": [0.5, None]}
    assert json.loads(strict_json(value, inf_as_text=True))["b"] == ["inf", "-inf", None, 1.5]
    with pytest.raises(ValueError):
        loads_strict('{"a": NaN}')
    with pytest.raises(ValueError):
        loads_strict("[Infinity]")
    assert loads_strict(strict_json(value)) == json.loads(strict_json(value))


def test_every_file_of_a_serial_run_is_strict_json_and_config_json_loads_back(tmp_path):
    """vaco_paper pins infinities (behavior_band, surrogate_rho_bar, tv_filter_ratio_cap) and a serial
    run has NaN statistics (no stale sample: no_grad_fraction_stale); none of it reaches a file as
    a literal a strict parser refuses."""
    run_dir = tmp_path / "run"
    args = [
        "run",
        "--serial",
        "--env",
        "asyncrl/Corridor-v0",
        "--preset",
        "vaco_paper",
        "--total-steps",
        "512",
        "--run-dir",
        str(run_dir),
    ]
    res = CliRunner().invoke(main, [*args, *(x for kv in SMALL for x in ("--set", kv))])
    assert res.exit_code == 0, res.output
    files = strict_files(run_dir)
    assert {"config.json", "summary.json", "metrics.jsonl", "lag.jsonl", "lag_histograms.jsonl"} <= set(files)
    rows = files["metrics.jsonl"]
    assert all(r["no_grad_fraction_stale"] is None for r in rows)  # NaN written as null
    assert any(r.get("eval_return_mean") is not None for r in rows)  # eval outputs are in it too
    saved = files["config.json"][0]
    assert saved["algo"]["behavior_band"] == "inf" and saved["algo"]["surrogate_rho_bar"] == "inf"
    ck = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    back = config.load(run_dir / "config.json")  # the run's resolved config, exactly (the checkpoint's copy)
    assert back.algo.behavior_band == math.inf and back.to_dict() == ck["config"]
    summary = files["summary.json"][0]
    assert summary["outcome"] == "finished" and summary["resume_checkpoint"] == {
        "file": "checkpoint.pt",
        "env_steps": ck["env_steps"],
        "version": ck["version"],
        "learner_iterations": ck["iteration"],
    }
    outcome = [ln for ln in res.output.splitlines() if ln.startswith(OUTCOME_HEADS)]
    assert len(outcome) == 1 and outcome[0].startswith("done: 512 env steps"), res.output


@pytest.mark.timeout(180)
def test_interrupted_serial_run_one_outcome_line_130_and_resume_checkpoint(tmp_path):
    """`asyncrl run --serial` stopped by SIGINT: exit status 130, one outcome line naming the resume
    checkpoint; summary.json names it too, and a resume starts exactly there."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "asyncrl",
        "run",
        "--serial",
        "--env",
        "asyncrl/Corridor-v0",
        "--total-steps",
        "100000000",
        "--run-dir",
        str(run_dir),
        *(x for kv in SMALL for x in ("--set", kv)),
    ]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(
            cmd,
            stdout=fo,
            stderr=fe,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,
        )
    try:
        deadline = time.monotonic() + 120
        while len(read_jsonl(run_dir / "metrics.jsonl")) < 3:
            assert p.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        assert p.wait(60) == 130, out.read_text() + err.read_text()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    text = out.read_text() + err.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(OUTCOME_HEADS)]
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), text
    assert "Traceback" not in text, text
    summary = strict_files(run_dir)["summary.json"][0]
    ck = summary["resume_checkpoint"]
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert summary["outcome"] == "interrupted" and ck["file"] == "checkpoint.pt"
    assert (ck["env_steps"], ck["version"], ck["learner_iterations"]) == (
        saved["env_steps"],
        saved["version"],
        saved["iteration"],
    )
    assert 0 < ck["env_steps"] <= summary["env_steps"]
    assert f"a resume starts from checkpoint.pt at {ck['env_steps']:,} env steps (version {ck['version']})" in lines[0]
    assert lines[0].endswith(f"to resume, run the same command with --run-dir {run_dir}"), lines[0]
    # the resume (with the run's own config.json) starts from that checkpoint
    cfg = config.load(run_dir / "config.json")
    run_serial(cfg, run_dir, max_iterations=1, echo=lambda *_: None, resume=True)
    event = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("event") == "resume"][-1]
    assert (event["checkpoint"], event["from_env_steps"], event["from_iteration"]) == (
        "checkpoint.pt",
        ck["env_steps"],
        ck["learner_iterations"],
    )


@pytest.mark.parametrize("delay_s", [0.2, 0.5, 1.0])
def test_a_signal_during_start_up_is_an_interruption_too(tmp_path, delay_s):
    """SIGINT at any moment of an actor's start-up (importing torch, loading its config, waiting for a
    learner that is not there) ends it like any interrupted command: exit 130, one ``interrupted:``
    line, no "Aborted!" and no traceback (the moment does not matter, so load cannot change the outcome).
    Only a signal before the interpreter has run any Python kills it the OS's way (-SIGINT, silent)."""
    cmd = [
        sys.executable,
        "-m",
        "asyncrl",
        "actor",
        "--learner",
        "tcp://127.0.0.1:9",
        "--broadcaster",
        "tcp://127.0.0.1:11",
        "--env",
        "asyncrl/Corridor-v0",
    ]
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        time.sleep(delay_s)
        p.send_signal(signal.SIGINT)
        text, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    if p.returncode == -signal.SIGINT:  # a loaded machine: the interpreter had not started yet
        assert text == "", text
        return
    lines = [ln for ln in text.splitlines() if ln.startswith(OUTCOME_HEADS)]
    assert p.returncode == 130, text
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), text
    assert "Aborted!" not in text and "Traceback" not in text, text
