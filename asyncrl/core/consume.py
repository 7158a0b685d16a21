"""What the learner does with a batch of full slots, shared by the learner role and serial mode:
drop samples over ``max_policy_lag``, account lag, assemble the batch, run the learner iteration,
and write metrics, checkpoints, progress and the summary."""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from asyncrl.core.config import Config
from asyncrl.core.consume_eval import ConsumerEvaluation
from asyncrl.core.lag import LagTracker
from asyncrl.core.lag_parts import SlotTiming, forward_lag
from asyncrl.core.lag_trace import TRACE_FILE
from asyncrl.core.lag_warnings import LagWarnings
from asyncrl.core.metrics import (
    Clock,
    EpisodeTracker,
    JsonlWriter,
    RunDirError,
    is_event,
    progress_line,
    rewrite_jsonl,
    tensorboard_writer,
    write_json_atomic,
)
from asyncrl.core.provenance import provenance
from asyncrl.core.spec import SlotSpec
from asyncrl.core.state import (
    CHECKPOINT,
    LearnerState,
    NonFiniteError,
    checkpoint_record,
    copied_tree,
    read_checkpoint,
    write_checkpoint,
)

log = logging.getLogger("asyncrl.core.consume")


OUTCOMES = ("finished", "interrupted", "failed")  # how a run ended (summary.json "outcome")


class SlotData(NamedTuple):
    actor: str  # actor id: also the reward-scaling stream key
    host: str
    arrays: dict  # field -> array of one slot (already copied out of shared memory)
    env_steps: int
    episode_returns: list
    timing: SlotTiming | None = None  # when its rollout ran (the parts of its lag); None: unknown


class Consumer(ConsumerEvaluation):
    def __init__(
        self, cfg: Config, spec: SlotSpec, run_dir: str | Path, *, task, resume: bool = False, lag_ramp: int = 0
    ):
        """``lag_ramp``: iterations the run's lag controls take to reach their lag (a replayed trace's
        largest lag; asyncrl.core.lag_warnings).

        ``resume``: go on with the run of ``run_dir`` from its newest readable checkpoint (an older
        one when the newest is damaged; iteration 0 when there is none): the learner's and this
        object's state come back, the metrics, lag and lag-trace rows logged after that checkpoint are
        removed (each iteration appears once), and metrics.jsonl, lag.jsonl and lag_trace.jsonl get a resume record
        (``{"event": "resume", ...}``). ``resumed_extra`` then holds what the caller stored with
        the checkpoint (serial mode: its envs), or None. ``task``: the task interface
        (:func:`asyncrl.tasks.make_task`)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state = LearnerState(cfg, spec, task)
        self.resumed_extra: dict | None = None
        self.boundary: dict | None = None  # the last snapshot() taken between iterations
        self.resume_checkpoint: dict | None = None  # the newest checkpoint on disk: where a resume starts
        own = None
        if resume:
            own, event = self._resume()
        # TensorBoard (when installed): every metrics scalar and the lag histograms, in tb/
        self.tb = tensorboard_writer(self.run_dir / "tb")
        self.lag = LagTracker(
            self.run_dir / "lag.jsonl",
            window_s=cfg.run.log_every_s,
            histogram_path=self.run_dir / "lag_histograms.jsonl",
            tb=self.tb,
        )
        self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl")
        self.lag_trace = JsonlWriter(self.run_dir / TRACE_FILE)  # asyncrl.core.lag_trace
        self.lag_warnings = LagWarnings(cfg, ramp=lag_ramp)
        self.episodes = EpisodeTracker()
        self.clock = Clock(cfg.run.log_every_s, elapsed_s=own["elapsed_s"] if own else 0.0)
        self.last_stats: dict = {}
        self.update_s = 0.0
        self.rejected_slots: Counter[str] = Counter()  # reason -> slots never trained on (reject_slot)
        # the row-tag audit of slot integrity (Learner.collect_full), kept apart from rejected_slots
        self.slot_audit: Counter[str] = Counter()
        self.provenance = provenance()  # at the start: the load the run began under
        # the evaluation during training (run.eval_every / llm.eval_every), its results in metrics.jsonl
        self.evaluate = self.state.task.periodic_eval(self.run_dir)
        self.last_eval: dict = {}
        self.eval_s = float(own.get("eval_s", 0.0)) if own else 0.0  # seconds the learner spent evaluating
        # the epoch of the learner role that writes the checkpoints (0: none, serial mode); a resumed
        # learner starts at a higher one (roles/learner.learner_epoch) whatever the clock says
        self.learner_epoch = int(own.get("learner_epoch", 0)) if own else 0
        if own:
            self.lag.load_state_dict(own["lag"])
            self.episodes.load_state_dict(own["episodes"])
            self.update_s = float(own["update_s"])
            self.rejected_slots.update(own["rejected_slots"])
            self.slot_audit.update(own.get("slot_audit", {}))
            self.evaluate.next_at = int(own["eval_next_at"])
            self.last_eval = dict(own["last_eval"])
            self.lag_warnings.load_state_dict(own.get("lag_warnings", {}))
        if resume:
            self.metrics.write(event)
            self.lag.rows.write(event)
            self.lag_trace.write(event)
        self.lag.published(self.state.version, time.time())

    def _resume(self) -> tuple[dict | None, dict]:
        """Load the newest good checkpoint and cut the logs back to it; returns (this object's
        saved state or None, the resume record)."""
        st, found = self.state, read_checkpoint(self.run_dir)
        own, name, since = None, None, 0.0
        if found is not None:
            d, path, skipped = found
            for line in skipped:
                log.warning("resume: %s; using an older checkpoint", line)
            st.load_state_dict(d, str(path))
            own, name = d.get("consumer"), path.name
            self.resume_checkpoint = checkpoint_record(path.name, d)
            self.resumed_extra = d.get("extra")
            since = float(own["time"]) if own else 0.0
        st.resumes += 1
        n = st.iteration
        superseded = rewrite_jsonl(
            self.run_dir / "metrics.jsonl",
            lambda r: is_event(r) or (isinstance(r, dict) and r.get("iteration", 0) <= n),
        )
        for rows_file in ("lag.jsonl", TRACE_FILE):
            rewrite_jsonl(
                self.run_dir / rows_file, lambda r: is_event(r) or (isinstance(r, dict) and r.get("iteration", 0) <= n)
            )
        rewrite_jsonl(
            self.run_dir / "lag_histograms.jsonl",
            lambda r: is_event(r) or (isinstance(r, dict) and r.get("end", 0) <= since),
        )
        event = {
            "event": "resume",
            "resume": st.resumes,
            "checkpoint": name,
            "from_iteration": n,
            "from_env_steps": st.env_steps,
            "superseded_iterations": superseded,
            "time": time.time(),
        }
        log.info(
            "resume %d of this run: from %s, iteration %d, %d env steps (%d later iterations logged before "
            "are superseded)",
            st.resumes,
            name or "the start (no checkpoint)",
            n,
            st.env_steps,
            superseded,
        )
        return own, event

    def consume(self, slots: list[SlotData], extra: dict | None = None) -> dict | None:
        """One learner iteration on ``slots`` (those over max_policy_lag are dropped first); lag
        rows carry the number of the iteration that consumed them, as metrics.jsonl does (1-based).
        ``extra``: more values for the iteration's metrics.jsonl record (the learner's lag target).
        Returns the iteration's metrics, or None if every slot was dropped. Raises RunDirError when
        an output cannot be written (the files keep whole lines, the last good checkpoint stays)."""
        try:
            return self._consume(slots, extra)
        except RunDirError:
            raise
        except OSError as exc:  # TensorBoard's writer raises a bare OSError
            raise RunDirError(exc.filename or self.run_dir / "tb", exc) from None

    def _consume(self, slots: list[SlotData], extra: dict | None = None) -> dict | None:
        st, now, limit = self.state, time.time(), self.cfg.learner.max_policy_lag
        version, iteration = st.version, st.iteration + 1
        kept, gaps, ended, lags = [], [], [], []
        dropped_streams: set[str] = set()  # a dropped slot leaves a gap in its stream
        for sd in slots:
            st.env_steps += sd.env_steps
            self.episodes.add(sd.episode_returns)
            ended += sd.episode_returns
            lag_versions = version - int(np.min(sd.arrays["behavior_version"]))
            lags.append(lag_versions)
            if 0 <= limit < lag_versions:
                self.lag.dropped(
                    version,
                    now,
                    sd.actor,
                    sd.host,
                    sd.arrays["behavior_version"],
                    iteration=iteration,
                    timing=sd.timing,
                )
                dropped_streams.add(sd.actor)
            else:
                kept.append(sd)
                gaps.append(sd.actor in dropped_streams)
                dropped_streams.discard(sd.actor)
        self.lag_trace.write({"iteration": iteration, "version": version, "lags": lags})
        for stream in dropped_streams:  # no later slot of it in this batch: restart it now
            st.reward_scaler.reset(stream)
        if not kept:
            return None
        batch = st.make_batch([(s.actor, s.arrays) for s in kept], gaps)
        t0 = time.perf_counter()
        stats = st.iterate(batch)
        update_s = time.perf_counter() - t0
        self.update_s += update_s
        batch_lag = self.lag.consumed(
            version,
            now,
            [(s.actor, s.host, s.arrays["behavior_version"], s.timing) for s in kept],
            iteration=iteration,
            forward=forward_lag(stats.get("minibatches", []), update_s),
        )
        self.lag_warnings.check(iteration, batch_lag["lag_versions_p50"], self.lag.run_versions_p95())
        self.lag.published(st.version, time.time())
        self.last_stats = stats
        record = {
            "iteration": st.iteration,
            "env_steps": st.env_steps,
            "wall_time_s": self.clock.elapsed,
            "average_return": self.episodes.average_return,
            "episode_returns": ended,
            "dropped_samples": self.lag.dropped_samples,
            **batch_lag,
            **stats,
            **(extra or {}),
        }
        self._row(record)  # held while its evaluation is due (asyncrl.core.consume_eval)
        return stats

    # ---- checkpoints ----
    def snapshot(self, extra: dict | None = None) -> dict:
        """A checkpoint of now, copied (later iterations do not change it): the learner's state,
        this object's counters, and ``extra`` (the caller's own state, e.g. serial mode's envs;
        plain values and tensors only)."""
        own = {
            "lag": self.lag.state_dict(),
            "episodes": self.episodes.state_dict(),
            "update_s": self.update_s,
            "rejected_slots": dict(self.rejected_slots),
            "slot_audit": dict(self.slot_audit),
            "eval_next_at": self.evaluate.next_at,
            "eval_s": self.eval_s,
            "learner_epoch": self.learner_epoch,
            "last_eval": dict(self.last_eval),
            "lag_warnings": self.lag_warnings.state_dict(),
            "elapsed_s": self.clock.elapsed,
            "time": time.time(),
        }
        return {**copied_tree(self.state.state_dict()), "consumer": own, "extra": copied_tree(extra)}

    def end_iteration(self, extra: dict | None = None) -> None:
        """Call between iterations (the learner role calls it before it publishes the new weights):
        keeps a snapshot, the state an interrupted run is checkpointed with, and writes it every
        learner.checkpoint_every iterations; first, the evaluation of :meth:`evaluate_pending` if it is
        due and has not run. Raises NonFiniteError (nothing written) for non-finite values."""
        self.evaluate_pending()
        self.boundary = self.snapshot(extra)
        every = self.cfg.learner.checkpoint_every
        due = every and (self.state.iteration % every == 0 or self._checkpoint_put_off)
        if due and self.state.iteration != self._saved_iteration:
            try:
                self.write(self.boundary)
                self._checkpoint_put_off = False
            except RunDirError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                # no file descriptor free (peers' connections can take them all): transient, not the
                # run directory's fault; the last good checkpoint stays and the next iteration retries
                if not self._checkpoint_put_off:
                    log.warning("learner: checkpoint put off to the next iteration: %s", exc)
                self._checkpoint_put_off = True

    _saved_iteration = -1
    _checkpoint_put_off = False  # a checkpoint failed for want of file descriptors: retried each iteration

    def write(self, snapshot: dict) -> None:
        write_checkpoint(self.run_dir / CHECKPOINT, snapshot, keep=self.cfg.learner.keep_checkpoints)
        self._saved_iteration = snapshot["iteration"]
        self.resume_checkpoint = checkpoint_record(CHECKPOINT, snapshot)

    def reject_slot(self, stream: str, reason: str, *, env_steps: int = 0) -> None:
        """A slot of ``stream`` that will not be trained on (``check_slot`` refused it, or its
        writer's grant was revoked): counted by reason, and the stream's running return restarts
        (the gap). ``env_steps``: steps it took, counted toward the budget (serial mode, where the
        steps were taken on this budget's behalf)."""
        self.rejected_slots[reason] += 1
        self.state.reward_scaler.reset(stream)
        self.state.env_steps += env_steps

    @property
    def done(self) -> bool:
        return self.state.env_steps >= self.cfg.run.total_env_steps

    def progress(self, echo) -> None:
        line = self.take_eval_line()  # an evaluation since the last call: said at once
        if line:
            echo(line)
        if self.clock.due():
            echo(
                progress_line(
                    env_steps=self.state.env_steps,
                    total=self.cfg.run.total_env_steps,
                    steps_per_s=self.state.env_steps / max(self.clock.elapsed, 1e-9),
                    avg_return=self.episodes.average_return,
                    lag=self.lag.recent_percentiles(),
                    tv=self.last_stats.get("tv_estimate"),
                    no_grad=self.last_stats.get("no_grad_fraction"),
                )
            )

    def finish(
        self, *, outcome: str = "finished", failed_role: str | None = None, reason: str | None = None, **extra
    ) -> dict:
        """Final checkpoint and summary.json; returns the summary.

        ``outcome``: "finished" (the step budget was reached), "interrupted" (Ctrl-C, SIGTERM) or
        "failed" (then ``failed_role`` and ``reason`` say which role and why); the summary records
        it under ``outcome`` and ``failure`` ({"role", "reason"} or None), with ``resumes`` (times
        this run was resumed from a checkpoint) and ``actor_rejoins`` (actor id -> joins after its
        first).

        ``resume_checkpoint`` names the checkpoint a resume (``asyncrl run --run-dir`` on this
        directory) starts from: {"file", "env_steps", "version", "learner_iterations"} of the newest
        checkpoint written, or None (a resume starts from scratch). Its env_steps can be below
        ``env_steps``: an interrupted run is checkpointed at its last iteration boundary (the steps
        of the iteration under way are counted but not learned from, and are taken again), and a
        checkpoint that could not be written leaves the previous one. Raises ValueError for another
        outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        st = self.state
        self.drop_pending_evaluation()  # an iteration whose evaluation never ran: its row, without one
        snap = self.boundary  # a run stopped mid-iteration keeps the state between its last two iterations
        if snap is None or (
            outcome == "finished" and (snap["iteration"], snap["env_steps"]) != (st.iteration, st.env_steps)
        ):
            snap = self.snapshot()
        try:
            self.write(snap)
        except NonFiniteError as exc:  # the last good checkpoint stays; the run failed
            outcome, failed_role, reason = "failed", "learner", reason or str(exc)
        except RunDirError as exc:  # disk full: the last good checkpoint stays; still try the summary
            if outcome != "failed":
                outcome, failed_role, reason = "failed", "learner", str(exc)
        failure = {"role": failed_role, "reason": reason} if outcome == "failed" else None
        summary = {
            "outcome": outcome,
            "failure": failure,
            "resumes": st.resumes,
            "actor_rejoins": {a: n - 1 for a, n in sorted(st.actor_joins.items()) if n > 1},
            "env_id": self.state.task.id,
            "preset": self.cfg.algo.preset,
            "seed": self.cfg.run.seed,
            "env_steps": st.env_steps,
            "wall_time_s": self.clock.elapsed,
            "env_steps_per_s": st.env_steps / max(self.clock.elapsed, 1e-9),
            "learner_iterations": st.iteration,
            "resume_checkpoint": self.resume_checkpoint,
            "final_average_return": self.episodes.average_return,
            "dropped_samples": self.lag.dropped_samples,
            "rejected_slots": dict(self.rejected_slots),
            "slot_audit": dict(self.slot_audit),
            "skipped_optimizer_steps": st.optimizer.skipped,
            "last_eval": self.last_eval or None,
            "periodic_eval_s": self.eval_s,  # the learner paused for these evaluations
            **self.lag.summary(),
            "warnings": [dict(w) for w in self.lag_warnings.said],  # asyncrl.core.lag_warnings
            **extra,
            # the task's own (llm: held-out accuracy before and after RL); control adds none
            **(self.state.task.final_summary(st.policy, self.run_dir) if outcome == "finished" else {}),
            "provenance": self.provenance,
        }
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        """Close every writer. One that cannot write its last rows (disk full) does not stop the
        others; the first such error is raised after all are closed (RunDirError)."""
        first = None
        for close in (
            self.evaluate.close,
            self.metrics.close,
            self.lag_trace.close,
            self.lag.close,
            self.tb.close if self.tb is not None else None,
        ):
            try:
                if close is not None:
                    close()
            except OSError as exc:
                first = first or (
                    exc if isinstance(exc, RunDirError) else RunDirError(exc.filename or self.run_dir, exc)
                )
        if first is not None:
            raise first
