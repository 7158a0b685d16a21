"""Lag traces and their replay (asyncrl.core.lag_trace), and the lag warnings
(asyncrl.core.lag_warnings): serial mode, deterministic."""

import json
import subprocess
import sys

import numpy as np
import pytest

from asyncrl.core import config
from asyncrl.core.lag_trace import LagReplay, LagTraceError, read_lag_trace, trace_digest
from asyncrl.core.lag_warnings import LagWarnings, lag_correction
from asyncrl.run.serial import run_serial
from tests.test_lag import SMALL

CLOCK = ("wall_time_s", "lag_seconds_p50", "lag_seconds_p95", "lag_propagation_s_mean")
CLOCK += ("lag_collection_s_mean", "lag_queueing_s_mean")


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trace_lags(run_dir):
    return [lag for row in _jsonl(run_dir / "lag_trace.jsonl") if "lags" in row for lag in row["lags"]]


def _learning(run_dir):
    """metrics.jsonl without what the clock decides."""
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in _jsonl(run_dir / "metrics.jsonl")]


def test_every_run_writes_its_lag_trace_in_the_order_the_learner_took_the_slots(tmp_path):
    cfg = config.load(None, SMALL + ["actor.policy_age_buffer=4", "learner.max_policy_lag=2", "run.seed=5"])
    run_serial(cfg, tmp_path, max_iterations=10, echo=lambda *_: None)
    trace = [r for r in _jsonl(tmp_path / "lag_trace.jsonl")]
    rows = _jsonl(tmp_path / "lag.jsonl")
    assert [r["iteration"] for r in trace] == list(range(1, len(trace) + 1))
    for t in trace:  # every slot handed to the learner, dropped ones included
        assert len(t["lags"]) == 2
        assert sorted(t["lags"]) == sorted(r["lag_versions"] for r in rows if r["iteration"] == t["iteration"])
    assert any(r["dropped"] for r in rows)  # the trace keeps the lags of dropped slots too
    assert read_lag_trace(tmp_path).tolist() == _trace_lags(tmp_path)


def test_a_replay_has_the_lag_of_its_trace_and_repeats_bit_for_bit(tmp_path):
    source = tmp_path / "source"
    run_serial(
        config.load(None, SMALL + ["actor.policy_age_buffer=6", "run.seed=2"]),
        source,
        max_iterations=12,
        echo=lambda *_: None,
    )
    lags = _trace_lags(source)
    assert len(set(lags)) > 2  # a trace worth replaying
    spec = f"{source}#sha256={trace_digest(source)}"
    for name in ("a", "b"):  # another seed and preset than the source's: the lag is the trace's
        cfg = config.load(None, SMALL + [f"actor.lag_trace={spec}", "run.seed=9", "algo.preset=ppo"])
        run_serial(cfg, tmp_path / name, max_iterations=12, echo=lambda *_: None)
        assert _trace_lags(tmp_path / name) == lags
    assert _learning(tmp_path / "a") == _learning(tmp_path / "b")
    # past its end, the trace starts again
    run_serial(
        config.load(None, SMALL + [f"actor.lag_trace={source}", "run.seed=9"]),
        tmp_path / "long",
        max_iterations=15,
        echo=lambda *_: None,
    )
    n = len(lags)
    longer = _trace_lags(tmp_path / "long")
    assert longer[:n] == lags and longer[n:] == [min(lag, 12 + i // 2) for i, lag in enumerate(lags[: len(longer) - n])]


def test_a_replay_resumed_from_its_checkpoint_ends_bit_identical(tmp_path):
    source = tmp_path / "source"
    quiet = lambda *_: None  # noqa: E731
    run_serial(config.load(None, SMALL + ["actor.policy_age_buffer=5"]), source, max_iterations=10, echo=quiet)
    replay = SMALL + [f"actor.lag_trace={source}", "learner.checkpoint_every=1", "run.total_env_steps=320"]
    run_serial(config.load(None, replay), tmp_path / "whole", echo=lambda *_: None)
    cfg = config.load(None, replay)
    run_serial(cfg, tmp_path / "cut", max_iterations=4, echo=lambda *_: None)
    run_serial(cfg, tmp_path / "cut", resume=True, echo=lambda *_: None)
    assert _trace_lags(tmp_path / "cut") == _trace_lags(tmp_path / "whole")
    assert [r for r in _learning(tmp_path / "cut") if "event" not in r] == _learning(tmp_path / "whole")


def test_bad_traces_are_refused_with_the_file_named(tmp_path):
    with pytest.raises(LagTraceError, match="No such file"):
        read_lag_trace(tmp_path / "missing.jsonl")
    for text, what in (
        ("", "no lags"),
        ("{not json\n", "not JSON"),
        ('{"iteration": 1, "lags": [1, -2]}\n', "not a trace line"),
        ('{"iteration": 1, "lags": [1, true]}\n', "not a trace line"),
        ("[1, 2]\n", "not a trace line"),
    ):
        (tmp_path / "t.jsonl").write_text(text)
        with pytest.raises(LagTraceError, match=what):
            read_lag_trace(tmp_path / "t.jsonl")
    (tmp_path / "t.jsonl").write_text('{"event": "resume"}\n{"iteration": 1, "version": 0, "lags": [0, 3]}\n')
    assert read_lag_trace(tmp_path / "t.jsonl").tolist() == [0, 3]
    with pytest.raises(LagTraceError, match="changed"):
        read_lag_trace(f"{tmp_path / 't.jsonl'}#sha256=0123456789abcdef")
    with pytest.raises(LagTraceError):
        LagReplay(np.array([], np.int64))


def test_the_command_refuses_a_trace_outside_serial_mode_and_a_missing_one(tmp_path):
    cmd = [sys.executable, "-m", "asyncrl", "run", "--env", "asyncrl/Corridor-v0", "--run-dir", str(tmp_path / "r")]
    for extra, message in (
        (["--lag-trace", str(tmp_path)], "serial mode only"),
        (["--serial", "--lag-trace", str(tmp_path / "none")], "lag trace"),
        (["--serial", "--lag-trace", str(tmp_path), "--set", "actor.policy_delay=2"], "without actor.policy_delay"),
    ):
        out = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


# ---- warnings ----


def _warnings(*overrides):
    return LagWarnings(config.load(None, list(overrides)))


def test_growing_lag_is_said_once_and_bounded_lag_never():
    growing = _warnings("algo.preset=vaco")
    for i in range(1, 300):
        growing.check(i, i / 10, None)
    assert [w["kind"] for w in growing.said] == ["growing_lag"]
    rng = np.random.default_rng(0)
    for name, lag in (
        ("large, bounded", lambda i: 20 + rng.integers(-5, 6)),
        ("ramps to 3, then stays", lambda i: min(i, 3)),
        ("policy-age buffer 32 filling up", lambda i: min(i, 32) // 2),
    ):
        w = _warnings("algo.preset=vaco", "actor.policy_age_buffer=32")
        for i in range(1, 600):
            w.check(i, float(lag(i)), None)
        assert w.said == [], name


def test_uncorrected_lag_is_said_for_presets_that_do_not_realign(tmp_path):
    assert lag_correction(config.load(None, ["algo.preset=vaco"])) == ""
    assert lag_correction(config.load(None, ["algo.preset=impala"])) == ""
    assert lag_correction(config.load(None, ["algo.preset=vaco_no_filter"])) == ""
    assert "ppo" in lag_correction(config.load(None, ["algo.preset=ppo"]))
    assert "decoupled_ppo" in lag_correction(config.load(None))  # the default does not realign
    for preset, extra, warned in (
        ("ppo", ["actor.policy_delay=2"], True),
        ("ppo", ["actor.policy_delay=2", "run.lag_warning_p95=-1"], False),
        ("ppo", [], False),  # no lag, nothing to correct
        ("vaco", ["actor.policy_delay=2"], False),
        ("decoupled_ppo", ["actor.policy_delay=2"], True),
    ):
        cfg = config.load(None, SMALL + [f"algo.preset={preset}", *extra])
        summary = run_serial(cfg, tmp_path / f"{preset}{len(extra)}", max_iterations=6, echo=lambda *_: None)
        kinds = [w["kind"] for w in summary["warnings"]]
        assert kinds == (["uncorrected_lag"] if warned else []), (preset, extra, summary["warnings"])
        assert all("(presets that realign them: vaco_no_filter" in w["message"] for w in summary["warnings"])


def test_the_uncorrected_lag_warning_of_the_llm_task_names_its_own_remedy():
    from asyncrl.core.lag_warnings import LagWarnings

    for realign, said in (("none", True), ("is_baseline", False)):
        w = LagWarnings(config.load(None, ["task.kind=llm", f"llm.realign={realign}"]))
        w.check(3, 2.0, 2.0)
        assert [x["kind"] for x in w.said] == (["uncorrected_lag"] if said else [])
        assert all("llm.realign = none (preset decoupled_ppo)" in x["message"] for x in w.said)
        assert all(x["message"].endswith("(llm.realign = is_baseline corrects it)") for x in w.said)
