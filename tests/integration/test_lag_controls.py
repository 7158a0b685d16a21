"""Lag controls across real processes: an actor with --policy-delay, and a straggler (--slowdown)
among normal actors; the lag report's per-actor rows must show each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mp_helpers import new_run_id, read_jsonl
from test_multiprocess import CORRIDOR, start_actor, start_roles

pytestmark = pytest.mark.integration


def _report(run_dir):
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "lag", str(run_dir), "--json"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _run(procs, tmp_path, actors: dict[str, list[str]], total: int):
    run_id, run_dir = new_run_id(), tmp_path / "run"
    learner_ep, broadcaster_ep = start_roles(procs, run_id=run_id, run_dir=run_dir, env_id=CORRIDOR, total_steps=total)
    for name, extra in actors.items():
        start_actor(procs, name, learner_ep, broadcaster_ep, env_id=CORRIDOR, extra=extra)
    assert procs.wait("learner", 120) == 0, procs.dump()
    for name in actors:
        assert procs.wait(name, 20) == 0, procs.dump()
    return run_dir


@pytest.mark.timeout(150)
def test_policy_delay_adds_that_many_versions(procs, tmp_path):
    """Across processes only load-proof bounds: every delayed sample lags at least K = 3 versions,
    and the delayed actor's median lag exceeds the normal actor's by about K. How many versions are
    in flight on top of K depends on scheduling (on a loaded CI machine the delayed actor, which keeps
    every weights message, can trail the normal one by several more), so no upper bound is asserted
    here; the exact lag of K is checked bit for bit in serial mode
    (tests/test_lag.py::test_policy_delay_gives_exactly_that_lag)."""
    run_dir = _run(procs, tmp_path, {"delayed": ["--policy-delay", "3"], "normal": []}, total=64 * 40)
    rows = [r for r in read_jsonl(run_dir / "lag.jsonl") if r["iteration"] >= 8]
    delayed = [r["lag_versions"] for r in rows if r["actor"] == "delayed"]
    normal = [r["lag_versions"] for r in rows if r["actor"] == "normal"]
    assert delayed and normal
    assert all(lag >= 3 for lag in delayed), delayed
    per_actor = _report(run_dir)["per_actor"]
    d, n = per_actor["delayed"]["lag_versions"], per_actor["normal"]["lag_versions"]
    assert d["p50"] - n["p50"] >= 2, per_actor
    procs.shutdown()


@pytest.mark.timeout(150)
def test_straggler_lags_more_than_the_others(procs, tmp_path):
    """A straggler that sleeps SLOW seconds per rollout among two normal actors. Load-proof by
    construction: its rollouts take at least SLOW (its sleeps), so every one of its samples lags at
    least that long, a lower bound no load can lower; the comparisons with the normal actors use
    medians and a sleep several times what a 16-step rollout of theirs takes on a loaded 2-core
    machine (about 0.5 s in CI on 2026-12-06, when a sleep of 0.5 s and means were not enough)."""
    slow_s = 3.0
    run_dir = _run(
        procs, tmp_path, {"fast0": [], "fast1": [], "straggler": ["--slowdown", str(slow_s)]}, total=64 * 400
    )
    per_actor = _report(run_dir)["per_actor"]
    slow, fast = per_actor["straggler"], [per_actor["fast0"], per_actor["fast1"]]
    assert slow["lag_seconds"]["count"] > 0, per_actor
    # every sample of a straggler's rollout was consumed after the whole rollout: its sleeps included
    assert slow["lag_seconds"]["p50"] >= 0.9 * slow_s, per_actor
    assert slow["parts"]["collection_s"] >= 0.9 * slow_s, per_actor
    for f in fast:
        assert slow["lag_seconds"]["p50"] > f["lag_seconds"]["p50"], per_actor
        assert slow["lag_versions"]["p50"] > f["lag_versions"]["p50"], per_actor
        assert slow["lag_versions"]["count"] < f["lag_versions"]["count"], per_actor
        # where its lag comes from: its own rollouts, measured on its own clock
        assert slow["parts"]["collection_s"] > f["parts"]["collection_s"], per_actor
    procs.shutdown()
