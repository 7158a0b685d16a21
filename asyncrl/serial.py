"""Serial mode: actors and learner in one process with the same modules and an in-process
transport (plain arrays instead of shared-memory slots). The way to debug, and bit-reproducible
for a given seed: the actors act with the newest weights, so the policy lag is 0."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from .config import Config
from .envs import VecEnv
from .metrics import Clock, EpisodeTracker, JsonlWriter, progress_line, write_json_atomic
from .policy import InferencePolicy
from .rollout import collect
from .state import LearnerState

log = logging.getLogger(__name__)


def actor_seed(seed: int, actor_index: int) -> int:
    """Env seed of one actor: distinct streams for distinct actors, same for the same run seed."""
    return seed * 10_007 + actor_index * 101


def run_serial(cfg: Config, run_dir: str | Path, *, max_iterations: int | None = None,
               echo=print) -> dict:
    """Train until ``cfg.run.total_env_steps`` (or ``max_iterations``); returns the summary."""
    torch.set_num_threads(cfg.learner.torch_threads)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    envs = [VecEnv(cfg.env.id, cfg.env.num_envs, seed=actor_seed(cfg.run.seed, i),
                   max_episode_steps=cfg.env.max_episode_steps) for i in range(cfg.run.num_actors)]
    spec = envs[0].spec(cfg.env.rollout_length)
    state = LearnerState(cfg, spec)
    actor_policy = InferencePolicy(state.policy, activation=cfg.policy.activation, seed=cfg.run.seed + 1)
    for env in envs:
        env.reset()
    slots = [spec.allocate() for _ in range(cfg.learner.slots_per_batch)]
    metrics = JsonlWriter(run_dir / "metrics.jsonl")
    episodes = EpisodeTracker()
    clock, next_actor = Clock(cfg.run.log_every_s), 0
    try:
        while state.env_steps < cfg.run.total_env_steps:
            if max_iterations is not None and state.iteration >= max_iterations:
                break
            batch_slots, ended = [], []
            for slot in slots:
                stats = collect(envs[next_actor], actor_policy.act, slot, version=state.version)
                batch_slots.append((f"actor{next_actor}", slot))
                state.env_steps += stats.env_steps
                episodes.add(stats.episode_returns)
                ended.extend(stats.episode_returns)
                next_actor = (next_actor + 1) % len(envs)
            stats = state.iterate(state.make_batch(batch_slots))
            actor_policy.load(state.flat_weights())     # what the broadcaster does between processes
            record = {"iteration": state.iteration, "env_steps": state.env_steps,
                      "wall_time_s": clock.elapsed, "average_return": episodes.average_return,
                      "episode_returns": ended, **stats}
            metrics.write(record)
            if clock.due():
                echo(progress_line(env_steps=state.env_steps, total=cfg.run.total_env_steps,
                                   steps_per_s=state.env_steps / clock.elapsed,
                                   avg_return=episodes.average_return, lag=(0, 0),
                                   tv=stats["tv_estimate"], filtered=stats["filtered_fraction"]))
        state.save(run_dir / "checkpoint.pt")
    finally:
        metrics.close()
        for env in envs:
            env.close()
    summary = {"mode": "serial", "env_id": cfg.env.id, "preset": cfg.algo.preset, "seed": cfg.run.seed,
               "env_steps": state.env_steps, "wall_time_s": clock.elapsed,
               "env_steps_per_s": state.env_steps / max(clock.elapsed, 1e-9),
               "learner_iterations": state.iteration, "final_average_return": episodes.average_return,
               "lag_p50": 0.0, "lag_p95": 0.0}
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
