"""What the learner does with a batch of full slots, shared by the learner role and serial mode:
drop samples over ``max_policy_lag``, account lag, assemble the batch, run the learner iteration,
and write metrics, checkpoints, progress and the summary."""
from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .config import Config
from .lag import LagTracker
from .metrics import Clock, EpisodeTracker, JsonlWriter, progress_line, write_json_atomic
from .spec import RolloutSpec
from .state import LearnerState


OUTCOMES = ("finished", "interrupted", "failed")   # how a run ended (summary.json "outcome")


class SlotData(NamedTuple):
    actor: str                    # actor id: also the reward-scaling stream key
    host: str
    arrays: dict                  # field -> array of one slot (already copied out of shared memory)
    env_steps: int
    episode_returns: list


class Consumer:
    def __init__(self, cfg: Config, spec: RolloutSpec, run_dir: str | Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state = LearnerState(cfg, spec)
        self.lag = LagTracker(self.run_dir / "lag.jsonl", window_s=cfg.run.log_every_s,
                              histogram_path=self.run_dir / "lag_histograms.jsonl")
        self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl")
        self.episodes = EpisodeTracker()
        self.clock = Clock(cfg.run.log_every_s)
        self.last_stats: dict = {}
        self.update_s = 0.0
        self.lag.published(0, time.time())

    def consume(self, slots: list[SlotData]) -> dict | None:
        """One learner iteration on ``slots`` (those over max_policy_lag are dropped first); lag
        rows carry the number of the iteration that consumed them, as metrics.jsonl does (1-based).
        Returns the iteration's metrics, or None if every slot was dropped."""
        st, now, limit = self.state, time.time(), self.cfg.learner.max_policy_lag
        kept, ended = [], []
        for sd in slots:
            st.env_steps += sd.env_steps
            self.episodes.add(sd.episode_returns)
            ended += sd.episode_returns
            lag_versions = st.version - int(np.min(sd.arrays["behavior_version"]))
            if 0 <= limit < lag_versions:
                self.lag.dropped(st.version, now, sd.actor, sd.host, sd.arrays["behavior_version"],
                                 iteration=st.iteration + 1)
            else:
                kept.append(sd)
        if not kept:
            return None
        batch_lag = self.lag.consumed(st.version, now, [(s.actor, s.host, s.arrays["behavior_version"]) for s in kept],
                                      iteration=st.iteration + 1)
        batch = st.make_batch([(s.actor, s.arrays) for s in kept])
        t0 = time.perf_counter()
        stats = st.iterate(batch)
        self.update_s += time.perf_counter() - t0
        self.lag.published(st.version, time.time())
        self.last_stats = stats
        self.metrics.write({"iteration": st.iteration, "env_steps": st.env_steps, "wall_time_s": self.clock.elapsed,
                            "average_return": self.episodes.average_return, "episode_returns": ended,
                            "dropped_samples": self.lag.dropped_samples, **batch_lag, **stats})
        every = self.cfg.learner.checkpoint_every
        if every and st.iteration % every == 0:
            st.save(self.run_dir / "checkpoint.pt")
        return stats

    @property
    def done(self) -> bool:
        return self.state.env_steps >= self.cfg.run.total_env_steps

    def progress(self, echo) -> None:
        if self.clock.due():
            echo(progress_line(env_steps=self.state.env_steps, total=self.cfg.run.total_env_steps,
                               steps_per_s=self.state.env_steps / max(self.clock.elapsed, 1e-9),
                               avg_return=self.episodes.average_return, lag=self.lag.recent_percentiles(),
                               tv=self.last_stats.get("tv_estimate"),
                               filtered=self.last_stats.get("filtered_fraction")))

    def finish(self, *, outcome: str = "finished", failed_role: str | None = None, reason: str | None = None,
               **extra) -> dict:
        """Final checkpoint and summary.json; returns the summary.

        ``outcome``: "finished" (the step budget was reached), "interrupted" (Ctrl-C, SIGTERM) or
        "failed" (then ``failed_role`` and ``reason`` say which role and why); the summary records
        it under ``outcome`` and ``failure`` ({"role", "reason"} or None), with ``resumes`` (times
        this run was resumed from a checkpoint) and ``actor_rejoins`` (actor id -> joins after its
        first). Raises ValueError for another outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        st = self.state
        st.save(self.run_dir / "checkpoint.pt")
        failure = {"role": failed_role, "reason": reason} if outcome == "failed" else None
        summary = {"outcome": outcome, "failure": failure, "resumes": st.resumes,
                   "actor_rejoins": {a: n - 1 for a, n in sorted(st.actor_joins.items()) if n > 1},
                   "env_id": self.cfg.env.id, "preset": self.cfg.algo.preset, "seed": self.cfg.run.seed,
                   "env_steps": st.env_steps, "wall_time_s": self.clock.elapsed,
                   "env_steps_per_s": st.env_steps / max(self.clock.elapsed, 1e-9),
                   "learner_iterations": st.iteration, "final_average_return": self.episodes.average_return,
                   "dropped_samples": self.lag.dropped_samples, **self.lag.summary(), **extra}
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        self.metrics.close()
        self.lag.close()
