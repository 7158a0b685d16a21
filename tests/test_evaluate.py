"""asyncrl eval: numbers agree with a direct rollout of the same checkpoint and seed; video
through offscreen GL (or the one-line install message); periodic evaluation during training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from asyncrl.cli import main
from asyncrl.core import config
from asyncrl.core.state import LearnerState
from asyncrl.run.serial import run_serial
from asyncrl.tasks import make_task
from asyncrl.tasks.control import render
from asyncrl.tasks.control.envs import resolve_env_id, rollout_spec
from asyncrl.tasks.control.evaluate import load_checkpoint

SMALL = [
    "env.num_envs=2",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
    "run.num_actors=1",
    "run.log_every_s=1000",
]
CORRIDOR = SMALL + ["env.id=asyncrl/Corridor-v0", "env.max_episode_steps=12"]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("toy-run")
    run_serial(config.load(None, CORRIDOR + ["run.seed=3"]), run_dir, max_iterations=4, echo=lambda *_: None)
    return run_dir


def _direct_rollout(run_dir, *, episodes, seed, stochastic=False):
    """What eval must reproduce, written out by hand: the checkpoint's policy on a fresh env."""
    d = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    cfg = config.from_dict(d["config"])
    spec = rollout_spec(cfg.env.id, num_envs=1, rollout_length=1)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    state.policy.load_state_dict(d["policy"])
    env = gym.make(cfg.env.id, max_episode_steps=cfg.env.max_episode_steps)
    gen = torch.Generator().manual_seed(seed)
    returns, lengths = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        total, n, done = 0.0, 0, False
        while not done:
            with torch.no_grad():
                dist = state.policy(torch.as_tensor(obs[None], dtype=torch.float32)).dist
                a = (dist.sample(gen) if stochastic else dist.mean)[0].numpy()
            obs, r, term, trunc, _ = env.step(np.clip(a, -1, 1))
            total, n, done = total + r, n + 1, term or trunc
        returns.append(total)
        lengths.append(n)
    return returns, lengths


@pytest.mark.parametrize("stochastic", [False, True])
def test_eval_matches_a_direct_rollout(toy_run, stochastic):
    args = ["eval", str(toy_run), "--episodes", "3", "--seed", "5", "--json"] + (["--stochastic"] if stochastic else [])
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    returns, lengths = _direct_rollout(toy_run, episodes=3, seed=5, stochastic=stochastic)
    assert out["lengths"] == lengths == [12, 12, 12]
    np.testing.assert_allclose(out["returns"], returns, rtol=1e-6)
    assert out["return_mean"] == pytest.approx(np.mean(returns)) and out["return_std"] == pytest.approx(np.std(returns))
    assert out["episodes"] == 3 and out["env_steps"] == 4 * 16 * 2 * 2


def test_eval_text_line_and_checkpoint_path(toy_run):
    res = CliRunner().invoke(main, ["eval", str(toy_run / "checkpoint.pt"), "--episodes", "2"])
    assert res.exit_code == 0, res.output
    assert "2 episodes of asyncrl/Corridor-v0, mean actions, seeds 0..1" in res.stdout and "(mean ± std)" in res.stdout
    one = CliRunner().invoke(main, ["eval", str(toy_run / "checkpoint.pt"), "--episodes", "1"])
    assert one.exit_code == 0, one.output
    assert "1 episode of asyncrl/Corridor-v0, mean actions, seed 0 " in one.stdout  # not "1 episodes", "seeds 0..0"


def test_count_of_says_one_in_the_singular():
    from asyncrl.core.wording import count_of

    assert [count_of(n, "episode") for n in (0, 1, 2, 2048)] == [
        "0 episodes",
        "1 episode",
        "2 episodes",
        "2,048 episodes",
    ]
    assert count_of(1, "actor") == "1 actor" and count_of(3, "process", "processes") == "3 processes"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--env", "CartPole-v1"], "env CartPole-v1: observation shape (4,) does not fit the policy's (2,)"),
        (["--env", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
        (["--episodes", "0"], "--episodes and --video-episodes must be >= 1"),
        (["--video", "out.gif"], "must end in .mp4"),
    ],
)
def test_eval_bad_input_one_line(toy_run, args, words):
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "eval", str(toy_run), *args], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_eval_missing_or_foreign_checkpoint(tmp_path):
    res = CliRunner().invoke(main, ["eval", str(tmp_path)])
    assert res.exit_code == 2 and "no checkpoint at" in res.output
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    res = CliRunner().invoke(main, ["eval", str(tmp_path)])
    assert res.exit_code == 2 and "not a readable asyncrl checkpoint" in res.output


def _read_video(path):
    import imageio.v2 as imageio

    reader = imageio.get_reader(str(path), format="FFMPEG")
    frames = [f for f in reader]
    meta = reader.get_meta_data()
    reader.close()
    return frames, meta


def test_video_of_a_toy_env_is_a_playable_mp4(toy_run, tmp_path):
    """The toy env renders with numpy, so this checks the MP4 writer itself on any machine."""
    out = tmp_path / "toy.mp4"
    res = CliRunner().invoke(
        main, ["eval", str(toy_run), "--episodes", "2", "--video", str(out), "--video-episodes", "2"]
    )
    assert res.exit_code == 0, res.output
    frames, meta = _read_video(out)
    assert len(frames) == 2 * (12 + 1)  # a frame after each reset and each step
    assert frames[0].shape == (64, 128, 3) and meta["codec"] == "h264"
    assert out.read_bytes()[4:8] == b"ftyp"  # an MP4 (ISO base media) container


def _mujoco_checkpoint(tmp_path):
    """An untrained HalfCheetah policy with 5-step episodes, saved as the learner saves it."""
    cfg = config.load(None, SMALL + ["env.id=HalfCheetah-v5", "env.max_episode_steps=5"])
    spec = rollout_spec(cfg.env.id, num_envs=2, rollout_length=16, max_episode_steps=5)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    state.save(tmp_path / "checkpoint.pt")
    return tmp_path


def test_mujoco_video_when_offscreen_gl_exists_else_one_line(tmp_path):
    """In a child process, as a user runs it: an MP4 where EGL or OSMesa works (CI installs
    libosmesa6), else exit 2 with the install line."""
    run_dir = _mujoco_checkpoint(tmp_path)
    out = tmp_path / "cheetah.mp4"
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "eval", str(run_dir), "--episodes", "1", "--video", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if any(render.gl_backend_works(b) for b in render.gl_candidates()):
        assert p.returncode == 0, p.stderr
        frames, _ = _read_video(out)
        assert len(frames) == 6 and frames[0].ndim == 3 and frames[0].std() > 1  # an image, not a blank frame
    else:
        assert p.returncode == 2 and p.stderr.strip() == f"Error: {render.INSTALL_GL}"


def test_no_offscreen_gl_gives_the_install_line(tmp_path):
    """No backend to try renders (ASYNCRL_GL_BACKENDS names one that does not exist)."""
    run_dir = _mujoco_checkpoint(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    p = subprocess.run(
        [sys.executable, "-m", "asyncrl", "eval", str(run_dir), "--video", str(tmp_path / "v.mp4")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "ASYNCRL_GL_BACKENDS": "none-such"},
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == [f"Error: {render.INSTALL_GL}"]
    assert not (tmp_path / "v.mp4").exists()


def test_choose_gl_backend_takes_the_first_that_works(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("PYOPENGL_PLATFORM", "")
    monkeypatch.delenv("ASYNCRL_GL_BACKENDS", raising=False)
    tried = []
    assert render.choose_gl_backend(lambda b: tried.append(b) or b == "osmesa") == "osmesa"
    assert tried == ["egl", "osmesa"]
    assert os.environ["MUJOCO_GL"] == "osmesa" and os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    monkeypatch.delenv("MUJOCO_GL")
    assert render.choose_gl_backend(lambda b: False) is None


def test_periodic_eval_in_metrics_and_training_unchanged(tmp_path):
    on = config.load(None, CORRIDOR + ["run.eval_every=128", "run.eval_episodes=2"])
    off = config.load(None, CORRIDOR)
    run_serial(on, tmp_path / "on", max_iterations=4, echo=lambda *_: None)
    run_serial(off, tmp_path / "off", max_iterations=4, echo=lambda *_: None)
    rows_on = [json.loads(x) for x in (tmp_path / "on/metrics.jsonl").read_text().splitlines()]
    rows_off = [json.loads(x) for x in (tmp_path / "off/metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows_on if "eval_return_mean" in r]
    assert [r["env_steps"] for r in evals] == [128, 256]  # each crossing of 128 env steps, 64 per iteration
    assert all(r["eval_episodes"] == 2 and r["eval_length_mean"] == 12 for r in evals)
    assert not any("eval_return_mean" in r for r in rows_off)
    # evaluation draws nothing from training: the same losses with and without it
    assert [r["policy_loss"] for r in rows_on] == [r["policy_loss"] for r in rows_off]
    # and it is the checkpoint's policy evaluated as `asyncrl eval` would (mean action, its own seed)
    last = json.loads((tmp_path / "on/summary.json").read_text())["last_eval"]
    assert last["eval_version"] == 4


def test_load_checkpoint_gives_policy_and_config(toy_run):
    ck = load_checkpoint(toy_run)
    assert ck.cfg.env.id == "asyncrl/Corridor-v0" and ck.version == 4 and ck.spec["obs_dim"] == 2
    assert resolve_env_id(ck.cfg.env.id) == "asyncrl/Corridor-v0"


def test_mujoco_video_follows_the_body():
    from asyncrl.tasks.control.envs import follow_with_camera, make_env

    cheetah, corridor = make_env("HalfCheetah-v5", render_mode="rgb_array"), make_env("asyncrl/Corridor-v0")
    try:
        assert follow_with_camera(cheetah) and cheetah.unwrapped.mujoco_renderer.camera_id == 0
        assert not follow_with_camera(corridor)
    finally:
        cheetah.close()
        corridor.close()


def test_the_docs_recipe_for_using_a_policy_in_own_code_runs(toy_run, capsys):
    """docs/usage.md's snippet ("Use a trained policy in your own code"), run as written on a
    checkpoint: it must keep working when the API under it changes."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    section = text.split("### Use a trained policy in your own code", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"runs/RUN"' in code
    exec(compile(code.replace('"runs/RUN"', repr(str(toy_run))), "usage.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("return ") and "with policy version 4" in out, out
