"""asyncrl study end to end: serial cells are exactly `asyncrl run --serial`; a study killed
mid-way continues without redoing finished cells; a cell whose config changed runs again."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from mp_helpers import REPO, alive, assert_strict_json_files, descendants, wait_for

from asyncrl.analysis.study import Runner, load_study

pytestmark = pytest.mark.integration

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=4",
    "algo.num_minibatches=2",
    "algo.num_epochs=2",
    "env.max_episode_steps=20",
    "run.log_every_s=1000",
]


def study_text(steps=1024, seeds=(1,), tv=0.2, conditions=("none", "age-3")):
    return f"""
name = "itest"
total_env_steps = {steps}
seeds = {list(seeds)}
envs = ["asyncrl/Corridor-v0"]
set = {json.dumps(SMALL)}
[reference]
"asyncrl/Corridor-v0" = 20.0
[[arm]]
presets = ["vaco"]
conditions = {json.dumps(list(conditions))}
set = ["algo.tv_threshold={tv}"]
[[arm]]
presets = ["ppo"]
conditions = ["none"]
"""


def _kill(proc, children: dict) -> None:
    """Teardown of a study started by a test: it and the cells it started (by pid) are gone."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for pid, start in children.items():
        if alive(pid, start):
            os.kill(pid, signal.SIGKILL)


def _params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["policy"]


def _metric_rows(run_dir):
    keep = ("env_steps", "average_return", "policy_loss", "value_loss", "tv_estimate", "no_grad_fraction", "entropy")
    return [{k: r.get(k) for k in keep} for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.timeout(300)
def test_serial_cells_equal_separate_serial_runs_bit_for_bit(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(study_text())
    st = load_study(path)
    runner = Runner(st, tmp_path / "out", jobs=2, echo=lambda *_: None)
    assert runner.run() == 3
    for cell in st.cells:
        if cell.label != "vaco":
            continue
        rec = json.loads(runner.record_path(cell).read_text())
        assert rec["status"] == "ok", rec
        by_hand = tmp_path / f"by-hand-{cell.condition}"
        cmd = [
            sys.executable,
            "-m",
            "asyncrl",
            "run",
            "--serial",
            "--env",
            "asyncrl/Corridor-v0",
            "--preset",
            "vaco",
            "--seed",
            "1",
            "--total-steps",
            "1024",
            "--run-dir",
            str(by_hand),
            *sum((["--set", s] for s in SMALL + ["algo.tv_threshold=0.2"]), []),
        ]
        if cell.condition == "age-3":
            cmd += ["--set", "actor.policy_age_buffer=3"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=REPO)
        cell_run = runner.record_path(cell).parent / "run"
        a, b = _params(cell_run), _params(by_hand)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert _metric_rows(cell_run) == _metric_rows(by_hand)
    assert json.loads((tmp_path / "out" / "cells" / runner.keys[st.cells[0]] / "cell.json").read_text())["curve"]


@pytest.mark.timeout(300)
def test_killed_study_continues_and_changed_cells_rerun(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(study_text(steps=3072, seeds=(1, 2)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "asyncrl", "study", str(path), "--jobs", "1", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    children: dict = {}
    try:
        first = wait_for(lambda: list(out.glob("cells/*/cell.json")), 150, "a first finished cell")
        # let the next cell start, then kill the study outright
        wait_for(lambda: len(list(out.glob("cells/*/log.txt"))) > len(first), 60, "the next cell to start")
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # its cells die with it (SIGTERM from the kernel on the study's death)
        wait_for(lambda: not any(alive(p, s) for p, s in children.items()), 30, "the cells of the killed study to exit")
    finally:
        _kill(proc, children)
    st = load_study(path)
    done_before = list(out.glob("cells/*/cell.json"))
    assert 1 <= len(done_before) < len(st.cells)
    # pack the finished cells of the study in progress: the resumed study reads them from cells.tar.xz
    packed = subprocess.run([*cmd, "--archive"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert packed.returncode == 0 and f"packed {len(done_before)} cell record" in packed.stdout, packed.stdout
    assert not any(p.exists() for p in done_before) and (out / "cells.tar.xz").exists()
    runner = Runner(st, out, jobs=2, echo=lambda *_: None)
    assert runner.run() == len(st.cells) - len(done_before)  # only the unfinished cells ran
    assert not any(p.exists() for p in done_before)  # the packed ones did not run again
    assert len(runner.finished_records()) == len(st.cells)
    # change the vaco arm's config: its cells (and only they) run again
    path.write_text(study_text(steps=3072, seeds=(1, 2), tv=0.1))
    changed = Runner(load_study(path), out, jobs=2, echo=lambda *_: None)
    pending = changed.pending()
    assert {c.label for c in pending} == {"vaco"} and len(pending) == 4
    assert changed.run() == 4 and not changed.pending()
    # the command's report of the finished study
    res = subprocess.run([*cmd, "--report-only"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    results = json.loads((out / "results.json").read_text())
    assert len(results["cells"]) == 6 and (out / "report.md").exists() and (out / "results.csv").exists()
    assert {g["label"] for g in results["groups"]} == {"vaco", "ppo"}
    # where each cell ran: the CPU model is recorded (serial cells repeat bit for bit only on one model)
    from asyncrl.core.provenance import cpu_model

    assert all(c["machine"]["cpu_model"] == cpu_model() for c in results["cells"])
    assert "CPU models (cells): " in (out / "report.md").read_text()


@pytest.mark.timeout(600)
def test_full_profile_smoke_at_a_tiny_budget(tmp_path):
    """configs/studies/full.toml: every preset, serial and multi-process conditions, one toy env,
    one seed, one learner iteration per cell; every cell finishes and the report is written."""
    out = tmp_path / "full"
    cmd = [
        sys.executable,
        "-m",
        "asyncrl",
        "study",
        str(REPO / "configs/studies/full.toml"),
        "--jobs",
        "2",
        "--out",
        str(out),
        "--envs",
        "asyncrl/Corridor-v0",
        "--seeds",
        "1",
        "--total-steps",
        "512",
        "--conditions",
        "none,delay-1,async-2",
    ]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=580)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert len(results["cells"]) == results["cells_total"] == 8 * 3
    assert {c["status"] for c in results["cells"]} == {"ok"}, [c.get("error") for c in results["cells"]]
    assert {c["mode"] for c in results["cells"]} == {"serial", "multiprocess"}
    assert len({c["preset"] for c in results["cells"]}) == 8
    # every file of every cell (serial and multi-process runs of each preset) and of the report is strict JSON,
    # and every preset reports the one no_grad_fraction (always 0 for the presets without a clip, band or filter)
    files = assert_strict_json_files(out)
    assert sum(p.name == "summary.json" for p in files) == 24 and sum(p.name == "cell.json" for p in files) == 24
    for c in results["cells"]:
        no_grad = c["diagnostics"]["no_grad_fraction"]["mean"]
        assert no_grad is not None and (no_grad == 0 or c["preset"] not in ("ppo_kl", "spo", "impala")), c["preset"]


@pytest.mark.timeout(300)
def test_cells_run_the_study_code_not_a_checkout_in_the_cwd_and_failed_cells_retry(tmp_path, monkeypatch):
    shadow = tmp_path / "cwd"
    (shadow / "asyncrl").mkdir(parents=True)
    (shadow / "asyncrl" / "__init__.py").write_text("raise ImportError('the shadowing checkout was imported')\n")
    monkeypatch.chdir(shadow)
    path = tmp_path / "s.toml"
    path.write_text(
        study_text(conditions=("none",)).replace('presets = ["ppo"]', 'presets = ["ppo"]\nenvs = ["os:getcwd"]')
    )
    st = load_study(path)
    runner = Runner(st, tmp_path / "out", jobs=2, echo=lambda *_: None)
    runner.run()
    recs = {r["label"]: r for r in runner.finished_records()}
    assert recs["vaco"]["status"] == "ok", recs["vaco"].get("error")
    assert recs["ppo"]["status"] == "failed" and "os:getcwd" in recs["ppo"]["error"]
    assert Runner(st, tmp_path / "out", echo=lambda *_: None).pending() == []
    again = Runner(st, tmp_path / "out", echo=lambda *_: None, retry_failed=True)
    assert [c.label for c in again.pending()] == ["ppo"]


@pytest.mark.timeout(300)
def test_sigterm_stops_the_running_cells_and_records_none(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(study_text(steps=200_000, conditions=("none",)))  # cells far longer than the test
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "study", str(path), "--jobs", "2", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    children: dict = {}
    try:
        wait_for(lambda: len(list(out.glob("cells/*/run/metrics.jsonl"))) == 2, 150, "both cells to be training")
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) != 0
        wait_for(lambda: not any(alive(p, s) for p, s in children.items()), 30, "the cells to exit")
    finally:
        _kill(proc, children)
    assert list(out.glob("cells/*/cell.json")) == []
    assert len(Runner(load_study(path), out, echo=lambda *_: None).pending()) == 2


@pytest.mark.timeout(400)
def test_a_study_through_ray_gives_the_local_studys_serial_cells_bit_for_bit(tmp_path):
    """`asyncrl study --launcher ray`: the same tiny grid as Ray tasks on a local one-node
    cluster; every serial cell equals the local study's cell bit for bit (weights and metrics)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    path = tmp_path / "s.toml"
    path.write_text(study_text())
    st = load_study(path)
    local = Runner(st, tmp_path / "local", jobs=2, echo=lambda *_: None)
    assert local.run() == 3
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl",
            "study",
            str(path),
            "--launcher",
            "ray",
            "--jobs",
            "3",
            "--out",
            str(tmp_path / "ray"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=360,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "study on Ray: 1 node(s)" in res.stdout, res.stdout
    ray_runner = Runner(st, tmp_path / "ray", echo=lambda *_: None)
    assert ray_runner.pending() == []  # same keys: the Ray study's cells are the local study's cells
    for cell in st.cells:
        rec = json.loads(ray_runner.record_path(cell).read_text())
        assert rec["status"] == "ok" and rec["launcher"] == "ray" and rec["machine"]["node_ip"], rec
        a_dir, b_dir = local.record_path(cell).parent / "run", ray_runner.record_path(cell).parent / "run"
        a, b = _params(a_dir), _params(b_dir)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert _metric_rows(a_dir) == _metric_rows(b_dir)
        assert rec["final_return"] == json.loads(local.record_path(cell).read_text())["final_return"]
    assert (tmp_path / "ray" / "report.md").exists()
