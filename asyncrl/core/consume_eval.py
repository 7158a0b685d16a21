"""The evaluation during training as the learner's consumer runs it (a mixin of
:class:`asyncrl.core.consume.Consumer`): after a learner iteration whose evaluation is due
(``PeriodicEvaluation.due``), its metrics.jsonl row waits; the caller publishes the new version, then
:meth:`ConsumerEvaluation.evaluate_pending` evaluates it and writes the row with the results.

Why after the publish: the learner pauses while it evaluates (it trains on nothing meanwhile), and the
actors should spend that pause generating with the version under evaluation, not the one before it,
so the evaluation adds no version of lag to the slots consumed next. The pause does show in their
lag in seconds (they wait in the ring until the learner consumes again): ``eval_s`` in the row and
``periodic_eval_s`` in summary.json say how long it was (docs/llm.md, "Evaluation during RL")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from asyncrl.core.metrics import RunDirError, tensorboard_kept, write_scalars

log = logging.getLogger("asyncrl.core.consume")


class ConsumerEvaluation:
    """State it uses (made by Consumer): ``evaluate`` (the task's PeriodicEvaluation), ``state``,
    ``metrics``, ``tb``, ``lag``, ``run_dir``, ``last_eval``, ``eval_s``."""

    _pending: dict | None = None  # the metrics row of an iteration whose evaluation is due
    _eval_line = ""  # what the last evaluation said, for the next progress line

    def _row(self, record: dict) -> None:
        """Write one metrics.jsonl row (and its TensorBoard scalars), or hold it while its evaluation
        is due. Raises RunDirError (a bare OSError of TensorBoard's writer too)."""
        st = self.state
        if self.evaluate.due(st.env_steps, st.iteration):
            self._pending = record
            return
        self._write_row(record)

    def _write_row(self, record: dict) -> None:
        try:
            self.metrics.write(record)
            tb = self.tb
            if tb is not None and not tensorboard_kept(lambda: write_scalars(tb, record)):
                self.tb = self.lag.tb = None
        except RunDirError:
            raise
        except OSError as exc:  # TensorBoard's writer raises a bare OSError
            raise RunDirError(exc.filename or self.run_dir / "tb", exc) from None

    @property
    def eval_pending(self) -> bool:
        """True when the last iteration's evaluation is due and has not run."""
        return self._pending is not None

    def evaluate_pending(self, tick: Callable[[], None] | None = None) -> dict | None:
        """Run the evaluation due after the last iteration, if one is, on the policy now (the version
        that iteration made), and write that iteration's metrics.jsonl row with its ``eval_*`` values,
        ``eval_version`` and ``eval_s`` (wall seconds). The learner calls it once it has published
        that version; ``end_iteration`` calls it when the caller did not (serial mode). ``tick``:
        called between pieces of the evaluation (the learner serves its peers there). Returns the
        eval values, or None when none was due. Raises RunDirError; an evaluation that raises still
        writes the row, without its values."""
        record, self._pending = self._pending, None
        if record is None:
            return None
        st = self.state
        t0 = time.perf_counter()
        try:
            result = self.evaluate(st.policy, env_steps=st.env_steps, iteration=st.iteration, tick=tick)
        except BaseException:
            self._write_row(record)
            raise
        seconds = time.perf_counter() - t0
        self.eval_s += seconds
        self.last_eval = {**result, "eval_version": st.version, "eval_s": seconds}
        self._eval_line = f"{self.evaluate.describe(result)} (version {st.version}, {seconds:.1f} s)"
        self._write_row({**record, **self.last_eval})
        return self.last_eval

    def drop_pending_evaluation(self) -> None:
        """Write the held row without its evaluation (a run that ends before it ran); a row that
        cannot be written is logged (the run is ending on another error then)."""
        record, self._pending = self._pending, None
        if record is not None:
            try:
                self._write_row(record)
            except RunDirError as exc:
                log.warning("learner: the last metrics row was not written: %s", exc)

    def take_eval_line(self) -> str:
        """The line of the last evaluation, once ("" when there was none since)."""
        line, self._eval_line = self._eval_line, ""
        return line
