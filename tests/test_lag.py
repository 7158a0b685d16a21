"""Lag accounting, lag controls and the lag report (serial mode: deterministic and fast)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from asyncrl.analysis.lag_report import build_report, format_report
from asyncrl.core import config
from asyncrl.core.lag import weighted_percentiles
from asyncrl.core.lag_control import WeightHistory
from asyncrl.run.serial import run_serial

SMALL = [
    "env.id=asyncrl/Corridor-v0",
    "env.max_episode_steps=10",
    "env.num_envs=2",
    "env.rollout_length=8",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=2",
    "algo.num_epochs=1",
    "run.num_actors=2",
    "run.log_every_s=1000",
]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "lag.jsonl").read_text().splitlines()]


def test_weight_history_rules():
    flat = lambda v: np.full(3, v, np.float32)  # noqa: E731
    newest = WeightHistory()
    delayed = WeightHistory(policy_delay=3)
    for v in range(6):
        newest.add(v, flat(v))
        delayed.add(v, flat(v))
    assert newest.choose()[0] == 5 and delayed.choose()[0] == 2
    early = WeightHistory(policy_delay=3)
    early.add(0, flat(0))
    early.add(1, flat(1))
    assert early.choose()[0] == 0  # fewer than K+1 versions: the oldest
    buf = WeightHistory(policy_age_buffer=4, seed=0)
    for v in range(10):
        buf.add(v, flat(v))
    picks = {buf.choose()[0] for _ in range(200)}
    assert picks == {6, 7, 8, 9}
    buf.add(3, flat(3))  # stale versions are ignored
    assert buf.newest == 9
    with pytest.raises(ValueError, match="not both"):
        WeightHistory(policy_delay=1, policy_age_buffer=2)
    with pytest.raises(LookupError):
        WeightHistory().choose()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16])  # uint16: bfloat16 bit patterns
def test_weight_history_keeps_the_wire_dtype_through_a_checkpoint(tmp_path, dtype):
    import torch

    src = np.arange(5).astype(dtype) + (0x3F80 if dtype == np.uint16 else 0)
    h = WeightHistory(policy_age_buffer=2)
    h.add(4, src)
    kept = h.choose()[1]
    assert kept.dtype == dtype and not kept.flags.writeable  # kept as received: no copy a holder could change
    torch.save(h.state_dict(), tmp_path / "h.pt")
    back = WeightHistory(policy_age_buffer=2)
    back.load_state_dict(torch.load(tmp_path / "h.pt", weights_only=True))
    version, flat = back.choose()
    assert version == 4 and flat.dtype == dtype and np.array_equal(flat, src)


def test_weighted_percentiles():
    assert weighted_percentiles([3, 1, 2], [1, 1, 2], (50, 100)) == [2.0, 3.0]
    assert weighted_percentiles([], [], (50,)) == [None]
    values = np.random.default_rng(0).integers(0, 20, 500)
    assert weighted_percentiles(values.tolist(), [1] * 500, (90,))[0] == np.percentile(
        values, 90, method="inverted_cdf"
    )


def test_policy_delay_gives_exactly_that_lag(tmp_path):
    cfg = config.load(None, SMALL + ["actor.policy_delay=3"])
    run_serial(cfg, tmp_path, max_iterations=12, echo=lambda *_: None)
    rows = _rows(tmp_path)
    late = [r for r in rows if r["iteration"] > 3]  # iteration k consumes at version k - 1
    assert late and all(r["lag_versions"] == 3 for r in late)
    assert all(r["lag_versions"] == r["iteration"] - 1 for r in rows if r["iteration"] <= 3)
    report = build_report(tmp_path)
    assert report["per_actor"]["actor0"]["lag_versions"]["max"] == 3
    assert "actor actor0" in format_report(report)


def test_realign_min_lag_above_the_lag_is_vaco_no_realign_bit_for_bit(tmp_path):
    """With one version of lag and algo.realign_min_lag = 2 no sample is realigned: the run is
    vaco_no_realign's, to the last bit (same losses, same seeds)."""
    finals = {}
    for name, extra in (
        ("min-lag", ["algo.preset=vaco", "algo.realign_min_lag=2"]),
        ("no-realign", ["algo.preset=vaco_no_realign"]),
    ):
        cfg = config.load(None, SMALL + ["actor.policy_delay=1", *extra])
        run_serial(cfg, tmp_path / name, max_iterations=8, echo=lambda *_: None)
        finals[name] = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    keys = ("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance")
    rows = {name: [[r.get(k) for k in keys] for r in recs if "policy_loss" in r] for name, recs in finals.items()}
    assert rows["min-lag"] and rows["min-lag"] == rows["no-realign"]
    # the same lag with min_lag 1 realigns every stale sample: no longer the ablation's run
    cfg = config.load(
        None,
        SMALL + ["actor.policy_delay=1", "algo.preset=vaco", "algo.realign_min_lag=1"],
    )
    run_serial(cfg, tmp_path / "one", max_iterations=8, echo=lambda *_: None)
    one = [
        [r.get(k) for k in keys]
        for r in map(json.loads, (tmp_path / "one" / "metrics.jsonl").read_text().splitlines())
        if "policy_loss" in r
    ]
    assert one != rows["no-realign"]


def test_max_policy_lag_drops_exactly_the_samples_over_it(tmp_path):
    cfg = config.load(None, SMALL + ["actor.policy_age_buffer=8", "learner.max_policy_lag=2", "run.seed=3"])
    summary = run_serial(cfg, tmp_path, max_iterations=25, echo=lambda *_: None)
    rows = _rows(tmp_path)
    dropped = [r for r in rows if r["dropped"]]
    kept = [r for r in rows if not r["dropped"]]
    assert dropped and kept
    assert all(r["lag_versions"] > 2 for r in dropped) and all(r["lag_versions"] <= 2 for r in kept)
    n_dropped = sum(r["samples"] for r in dropped)
    assert summary["dropped_samples"] == n_dropped == build_report(tmp_path)["dropped"]["samples"]
    # every collected sample is either consumed or dropped
    assert sum(r["samples"] for r in rows) == summary["env_steps"]


def test_lag_command_text_json_and_errors(tmp_path):
    cfg = config.load(None, SMALL)
    run_serial(cfg, tmp_path / "run", max_iterations=3, echo=lambda *_: None)
    cmd = [sys.executable, "-m", "asyncrl", "lag"]
    text = subprocess.run(cmd + [str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "backward lag, versions" in text.stdout and "per_actor" not in text.stdout
    js = subprocess.run(cmd + [str(tmp_path / "run"), "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(js.stdout)["overall"]["all"]["lag_versions"]["count"] == 3 * 2 * 8 * 2
    bad = subprocess.run(cmd + [str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no run directory" in bad.stderr


def test_lag_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from asyncrl.analysis.lag_report import plot_report

    run_serial(config.load(None, SMALL), tmp_path, max_iterations=3, echo=lambda *_: None)
    plot_report(tmp_path, tmp_path / "lag.png")
    assert (tmp_path / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_whole_run_lag_in_seconds_stays_bounded_and_survives_a_checkpoint():
    """A long run's whole-run record of lag in seconds is a count per whole millisecond: it does not
    grow with the number of slots (the soak's learner grew by it), its percentiles are the exact
    ones to within 1 ms, and a checkpoint of the old format (one value per slot) still loads."""
    from asyncrl.core.lag import LagTracker

    rng = np.random.default_rng(0)
    t = LagTracker(None)
    t.published(0, 0.0)
    exact, weights = [], []
    for i in range(5000):
        now = float(rng.uniform(0.05, 0.35))
        bv = np.zeros((4, 2), np.int64)
        t.consumed(1, now, [("actor0", "h", bv, None)], iteration=i)
        exact.append(now)
        weights.append(8)
    assert len(t.seconds_ms_counts) <= 301  # 50 ms .. 350 ms in whole ms
    s50, s95 = weighted_percentiles(exact, weights, (50, 95))
    got = t.summary()
    assert abs(got["lag_seconds_p50"] - s50) <= 0.0005 + 1e-12 and abs(got["lag_seconds_p95"] - s95) <= 0.0005 + 1e-12
    again = LagTracker(None)
    again.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert again.summary() == got
    old = t.state_dict()
    del old["seconds_ms_counts"]
    old["seconds_values"], old["seconds_weights"] = exact, weights
    legacy = LagTracker(None)
    legacy.load_state_dict(old)
    assert legacy.summary() == got
