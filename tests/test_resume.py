"""Resume: checkpoints kept and read back, env states, the run-directory choices,
and serial runs resumed in process that end bit-identical to runs that were not stopped."""

import json
import math

import numpy as np
import pytest
import torch

from asyncrl.cli import UserError, prepare_run_dir, write_config_json
from asyncrl.core import config
from asyncrl.core.state import LearnerState, checkpoint_files, read_checkpoint, write_checkpoint
from asyncrl.run.serial import run_serial
from asyncrl.tasks import make_task
from asyncrl.tasks.control.envs import VecEnv, env_state, rollout_spec

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    "run.num_actors=2",
    "run.log_every_s=1000",
]
# keys whose values depend on the clock (or are NaN, which equals nothing)
CLOCK_KEYS = {
    "wall_time_s",
    "lag_seconds_p50",
    "lag_seconds_p95",
    *(f"lag_{part}_s_mean" for part in ("propagation", "collection", "queueing")),
}


def same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def iterations(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "event" not in r]


def assert_same_run(a, b) -> None:
    """Final weights, optimizer and normaliser equal bit for bit; every metrics row equal but the clock's."""
    ca, cb = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
    for k in ca["policy"]:
        assert torch.equal(ca["policy"][k], cb["policy"][k]), k
    assert ca["obs_rms"] == cb["obs_rms"] and ca["reward_scaler"] == cb["reward_scaler"]
    assert (ca["iteration"], ca["env_steps"], ca["version"]) == (cb["iteration"], cb["env_steps"], cb["version"])
    ra, rb = iterations(a), iterations(b)
    assert [r["iteration"] for r in rb] == list(range(1, len(ra) + 1)) == [r["iteration"] for r in ra]
    for x, y in zip(ra, rb):
        diff = [k for k in x if k not in CLOCK_KEYS and not same_value(x[k], y.get(k))]
        assert not diff, (x["iteration"], diff)


@pytest.mark.parametrize(
    "env_id, stop_at, extra",
    [
        ("asyncrl/Corridor-v0", 5, []),
        ("HalfCheetah-v5", 3, []),
        # the previous-version anchor at lag 2: π_{T-1} comes back from the checkpoint
        ("HalfCheetah-v5", 5, ["algo.ratio_anchor=previous", "actor.policy_delay=2"]),
    ],
)
def test_serial_resume_bit_identical(tmp_path, env_id, stop_at, extra):
    """Stopped after ``stop_at`` iterations (checkpoint every 2: the resume goes back to an older
    checkpoint and redoes iterations, which are logged once), resumed: the same run."""
    cfg = config.load(
        None,
        SMALL
        + extra
        + [
            f"env.id={env_id}",
            "run.seed=3",
            "run.total_env_steps=640",
            "learner.checkpoint_every=2",
            "env.max_episode_steps=50",
        ],
    )
    quiet = dict(echo=lambda *_: None)
    run_serial(cfg, tmp_path / "a", **quiet)
    run_serial(cfg, tmp_path / "b", max_iterations=stop_at, **quiet)
    # a SIGKILL after `stop_at` leaves the checkpoint of iteration 4 (or 2): drop the final one
    (tmp_path / "b" / "checkpoint.pt").unlink()
    older = read_checkpoint(tmp_path / "b")
    assert older is not None and older[0]["iteration"] < stop_at
    summary = run_serial(cfg, tmp_path / "b", resume=True, **quiet)
    assert summary["resumes"] == 1 and summary["env_steps"] == 640
    assert_same_run(tmp_path / "a", tmp_path / "b")
    events = [
        json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines() if "event" in line
    ]
    assert len(events) == 1 and events[0]["from_iteration"] == older[0]["iteration"], events
    assert events[0]["superseded_iterations"] == stop_at - older[0]["iteration"]


def test_checkpoints_kept_and_corrupt_newest_falls_back(tmp_path):
    cfg = config.load(None, SMALL + ["env.id=asyncrl/Corridor-v0", "learner.keep_checkpoints=2"])
    spec = rollout_spec(cfg.env.id, num_envs=2, rollout_length=16)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    for it in (1, 2, 3):
        state.iteration = it
        write_checkpoint(tmp_path / "checkpoint.pt", state.state_dict(), keep=2)
    assert [p.name for p in checkpoint_files(tmp_path)] == ["checkpoint.pt", "checkpoint.1.pt"]
    assert read_checkpoint(tmp_path)[0]["iteration"] == 3
    (tmp_path / "checkpoint.pt").write_bytes(b"cut short")
    d, path, skipped = read_checkpoint(tmp_path)
    assert d["iteration"] == 2 and path.name == "checkpoint.1.pt" and "unreadable" in skipped[0]


@pytest.mark.parametrize("env_id", ["asyncrl/Corridor-v0", "HalfCheetah-v5"])
def test_env_state_round_trip(env_id):
    """An env put back in a saved state steps exactly as the original goes on."""
    a, b = (VecEnv(env_id, 2, seed=0, max_episode_steps=30) for _ in range(2))
    a.reset(seeds=[1, 2])
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (80, 2, a.action_dim)).astype(np.float32)
    for t in range(20):
        a.step(actions[t])
    assert b.set_state(a.get_state())
    for t in range(20, 80):  # across time-limit resets, which draw from the env's np_random
        sa, fa = a.step(actions[t])
        sb, fb = b.step(actions[t])
        assert all(np.array_equal(x, y) for x, y in zip(sa, sb)) and fa == fb, t


def test_unsaveable_env_has_no_state():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    assert env_state(env) is None


def test_run_dir_choices(tmp_path):
    res = config.load_resolved(None, SMALL + ["env.id=asyncrl/Corridor-v0", "run.total_env_steps=128"])
    cfg = res.config
    out, resume = prepare_run_dir(tmp_path / "r", cfg)
    assert not resume
    write_config_json(out, res)
    run_serial(cfg, out, max_iterations=1, echo=lambda *_: None)
    (out / "summary.json").write_text(json.dumps({"outcome": "interrupted"}))
    assert prepare_run_dir(out, cfg) == (out, True)
    with pytest.raises(UserError, match="already holds a run"):
        prepare_run_dir(out, cfg, "refuse")
    other = config.load(None, SMALL + ["env.id=asyncrl/Corridor-v0", "run.total_env_steps=256"])
    with pytest.raises(UserError, match=r"another config.*run.total_env_steps \(128 there, 256 now\)"):
        prepare_run_dir(out, other)
    run_serial(cfg, out, resume=True, echo=lambda *_: None)  # to its end
    with pytest.raises(UserError, match="finished"):
        prepare_run_dir(out, cfg)
    assert prepare_run_dir(out, other, "overwrite") == (out, False)
    assert not list(out.iterdir())
