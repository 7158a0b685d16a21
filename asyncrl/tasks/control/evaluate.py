"""Evaluate a policy: ``asyncrl eval RUN_DIR|CHECKPOINT`` and the periodic evaluation of
``run.eval_every`` during training.

An evaluation runs whole episodes of one env, sequentially: episode k starts from
``env.reset(seed=seed + k)``, and actions are the policy's mean (Gaussian) or most likely action
(categorical), or, with ``stochastic``, samples drawn from a torch Generator seeded with
``seed``. Continuous actions are clipped to the action space before they reach the env, as in
training. The same checkpoint, env and seed give the same returns.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from asyncrl.core.config import Config, ConfigError, from_dict
from asyncrl.tasks.control.envs import make_env
from asyncrl.tasks.control.policy import ActorCritic, build_policy


class EvalError(ValueError):
    """A checkpoint that cannot be read, or an env that does not fit it; the message names it."""


class EvalResult(NamedTuple):
    returns: list[float]  # one undiscounted return per episode (env reward units)
    lengths: list[int]  # env steps per episode

    def summary(self) -> dict:
        """mean and std (over episodes, ddof 0) of return and length, and the episode count."""
        r, n = np.asarray(self.returns, np.float64), np.asarray(self.lengths, np.float64)
        return {
            "episodes": len(self.returns),
            "return_mean": float(r.mean()),
            "return_std": float(r.std()),
            "length_mean": float(n.mean()),
            "length_std": float(n.std()),
        }


class Checkpoint(NamedTuple):
    policy: ActorCritic  # weights and observation statistics of the checkpoint, eval mode
    cfg: Config  # the run's config
    spec: dict  # the rollout spec (obs_dim, action_dim, discrete, ...)
    version: int  # policy version
    env_steps: int  # env steps consumed when it was written
    path: Path


def checkpoint_path(run_dir_or_file: str | Path) -> Path:
    """RUN_DIR -> RUN_DIR/checkpoint.pt; a file path is returned as is. Raises EvalError if missing."""
    p = Path(run_dir_or_file)
    if p.is_dir():
        p = p / "checkpoint.pt"
    if not p.is_file():
        raise EvalError(f"no checkpoint at {p} (give a run directory holding checkpoint.pt, or the file)")
    return p


def load_checkpoint(run_dir_or_file: str | Path) -> Checkpoint:
    """Read a learner checkpoint (``torch.load(weights_only=True)``: nothing is unpickled).
    Raises EvalError for a missing, unreadable or foreign file."""
    path = checkpoint_path(run_dir_or_file)
    try:
        d = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many kinds for a corrupt or foreign file
        raise EvalError(f"{path}: not a readable asyncrl checkpoint ({type(exc).__name__})") from None
    if not isinstance(d, dict) or not {"policy", "config", "spec"} <= set(d):
        raise EvalError(f"{path}: not an asyncrl checkpoint (no policy, config and spec)")
    try:
        cfg = from_dict(d["config"])
    except ConfigError as exc:
        raise EvalError(f"{path}: its config does not load here: {exc}") from None
    spec = d["spec"]
    policy = build_policy(cfg.policy, spec["obs_dim"], spec["action_dim"], discrete=spec["discrete"])
    try:
        policy.load_state_dict(d["policy"])
    except RuntimeError as exc:
        raise EvalError(f"{path}: weights do not fit the policy of its config: {str(exc).splitlines()[0]}") from None
    policy.eval()
    return Checkpoint(policy, cfg, spec, int(d.get("version", 0)), int(d.get("env_steps", 0)), path)


def check_spaces(env, spec: dict, env_id: str) -> None:
    """Raise EvalError unless ``env``'s spaces fit a policy of ``spec`` (flat Box observations of
    obs_dim; Discrete(action_dim) or a 1-D Box of action_dim)."""
    obs, act = env.observation_space, env.action_space
    obs_shape = getattr(obs, "shape", None)
    if obs_shape != (spec["obs_dim"],):
        raise EvalError(f"env {env_id}: observation shape {obs_shape} does not fit the policy's ({spec['obs_dim']},)")
    if spec["discrete"]:
        ok, theirs = hasattr(act, "n") and int(act.n) == spec["action_dim"], str(act)
        want = f"Discrete({spec['action_dim']})"
    else:
        ok, theirs = getattr(act, "shape", None) == (spec["action_dim"],) and hasattr(act, "low"), str(act)
        want = f"a Box of shape ({spec['action_dim']},)"
    if not ok:
        raise EvalError(f"env {env_id}: action space {theirs} does not fit the policy's {want}")


def act(policy: ActorCritic, obs: np.ndarray, *, stochastic: bool, generator: torch.Generator | None):
    """One observation [D] -> one action: [A] float32 (unclipped) or an int."""
    with torch.no_grad():
        dist = policy(torch.as_tensor(np.asarray(obs, np.float32)[None])).dist
        a = dist.sample(generator) if stochastic else dist.mode()
    return int(a[0]) if policy.discrete else a[0].numpy()


def run_episodes(
    policy: ActorCritic,
    env,
    *,
    episodes: int,
    seed: int,
    stochastic: bool = False,
    on_frame: Callable[[int, np.ndarray], None] | None = None,
    record_episodes: int = 0,
    max_steps: int = 1_000_000,
) -> EvalResult:
    """Run ``episodes`` whole episodes of ``env`` with ``policy`` (see the module docstring for
    seeding and actions). With ``on_frame``, the first ``record_episodes`` episodes call
    ``on_frame(episode, env.render())`` after the reset and after every step (``env`` must have
    been made with ``render_mode="rgb_array"``). An episode is cut after ``max_steps`` steps.
    Raises ValueError for episodes < 1."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    generator = torch.Generator().manual_seed(seed) if stochastic else None
    low = None if policy.discrete else np.asarray(env.action_space.low, np.float32)
    high = None if policy.discrete else np.asarray(env.action_space.high, np.float32)
    returns, lengths = [], []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        record = on_frame is not None and k < record_episodes
        if record:
            on_frame(k, env.render())
        total, steps, done = 0.0, 0, False
        while not done and steps < max_steps:
            a = act(policy, obs, stochastic=stochastic, generator=generator)
            obs, reward, terminated, truncated, _ = env.step(a if policy.discrete else np.clip(a, low, high))
            total += float(reward)
            steps += 1
            done = bool(terminated or truncated)
            if record:
                on_frame(k, env.render())
        returns.append(total)
        lengths.append(steps)
    return EvalResult(returns, lengths)


class PeriodicEval:
    """``run.eval_every``: every that many env steps, ``run.eval_episodes`` episodes with the
    mean action on an env of its own, seeded ``run.seed + EVAL_SEED_OFFSET`` (the same start
    states each time, so evaluations differ only by the policy). Training draws nothing from it."""

    EVAL_SEED_OFFSET = 1_000_003

    def __init__(self, cfg: Config):
        self.every, self.episodes = cfg.run.eval_every, cfg.run.eval_episodes
        self.seed = cfg.run.seed + self.EVAL_SEED_OFFSET
        self.next_at = self.every
        self.env = None
        self.cfg = cfg

    def due(self, env_steps: int, iteration: int = 0) -> bool:
        return self.every > 0 and env_steps >= self.next_at

    def __call__(self, policy: ActorCritic, *, env_steps: int, iteration: int = 0, tick=None) -> dict:
        """Evaluate now (a few short episodes: ``tick`` is not called); returns {eval_return_mean,
        eval_return_std, eval_length_mean, eval_episodes}."""
        if self.env is None:
            e = self.cfg.env
            self.env = make_env(e.id, module=e.module, max_episode_steps=e.max_episode_steps)
        while self.next_at <= env_steps:
            self.next_at += self.every
        if policy.obs_mean.device.type != "cpu":  # a learner on a GPU: evaluate a CPU copy (envs give numpy)
            policy = copy.deepcopy(policy).cpu()
        was_training = policy.training
        policy.eval()
        try:
            s = run_episodes(policy, self.env, episodes=self.episodes, seed=self.seed).summary()
        finally:
            policy.train(was_training)
        return {
            "eval_return_mean": s["return_mean"],
            "eval_return_std": s["return_std"],
            "eval_length_mean": s["length_mean"],
            "eval_episodes": s["episodes"],
        }

    def describe(self, result: dict) -> str:
        return (
            f"evaluation: return {result['eval_return_mean']:.1f} +- {result['eval_return_std']:.1f} over "
            f"{result['eval_episodes']} episodes (mean action)"
        )

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
