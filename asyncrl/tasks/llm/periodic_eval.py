"""``llm.eval_every``: the held-out evaluation during RL, every that many learner iterations, on the
learner's policy, with the draws of the evaluations before and after RL (asyncrl.tasks.llm.eval_draws),
so each point pairs with the start; and :func:`evaluation_curve`, every evaluation of a run in order
(summary.json ``evaluations``).

The learner runs it after it published the version it evaluates and pauses its training meanwhile,
answering its peers between evaluation batches (asyncrl.core.consume_eval): the version lag of what it
trains on next is unchanged, their lag in seconds includes the pause (docs/llm.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.core.metrics import is_event


class LLMPeriodicEval:
    """The task's :class:`asyncrl.tasks.base.PeriodicEvaluation`: due every llm.eval_every learner
    iterations (0: never), but not at the run's last iteration (the evaluation after RL measures that
    version), nor when llm.eval_size is 0."""

    def __init__(self, task, run_dir: Path):
        self.task, self.run_dir = task, Path(run_dir)
        cfg = task.cfg
        self.every = cfg.llm.eval_every if cfg.llm.eval_size else 0
        self.total_env_steps = cfg.run.total_env_steps
        self.next_at = self.every  # a learner iteration (checkpointed by the consumer)
        self._start: dict | None = None

    def due(self, env_steps: int, iteration: int) -> bool:
        return self.every > 0 and iteration >= self.next_at and env_steps < self.total_env_steps

    def __call__(
        self, policy, *, env_steps: int, iteration: int, tick: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Evaluate ``policy`` on the held-out problems (LLMHeldoutEvaluation.evaluate, ``tick``
        after each batch). Returns eval_accuracy, eval_problems and, against a comparable start
        record: eval_accuracy_difference, eval_accuracy_difference_ci95_paired_low / _high (the
        paired 95 % interval), eval_solved_only_before / _after."""
        while self.next_at <= iteration:
            self.next_at += self.every
        if self._start is None:
            self._start = self.task.start_record(self.run_dir)
        acc, n, correct = self.task.evaluate(policy, tick=tick)
        out: dict[str, Any] = {"eval_accuracy": acc, "eval_problems": n}
        diff = self.task.compare_with_start(self._start, acc, n, correct)
        if diff:
            out["eval_accuracy_difference"] = diff["accuracy_difference"]
        if "accuracy_difference_ci95_paired" in diff:
            lo, hi = diff["accuracy_difference_ci95_paired"]
            out.update(
                eval_accuracy_difference_ci95_paired_low=lo,
                eval_accuracy_difference_ci95_paired_high=hi,
                eval_solved_only_before=diff["solved_only_before"],
                eval_solved_only_after=diff["solved_only_after"],
            )
        return out

    def describe(self, result: dict[str, Any]) -> str:
        line = f"llm: held-out accuracy {result['eval_accuracy']:.3f} on {result['eval_problems']} problems"
        if "eval_accuracy_difference_ci95_paired_low" in result:
            line += (
                f", {100 * result['eval_accuracy_difference']:+.1f} points from the start (paired 95 % CI "
                f"[{100 * result['eval_accuracy_difference_ci95_paired_low']:+.1f}, "
                f"{100 * result['eval_accuracy_difference_ci95_paired_high']:+.1f}])"
            )
        return line

    def close(self) -> None:
        pass


def evaluation_curve(run_dir: Path, start: dict, final: dict) -> list[dict[str, Any]]:
    """Every held-out evaluation of the run in ``run_dir``, in order: ``when`` "before" (the start
    record), "during" (metrics.jsonl rows with eval_accuracy) and "after" (``final``: the keys of
    final_summary), each with version, env_steps, accuracy, accuracy_difference and
    accuracy_difference_ci95_paired (None without a comparable start) and eval_s (wall seconds; the
    start's may be that of a cached evaluation). The learner's version equals its iteration count, so
    the final version is the last metrics row's iteration. Unreadable rows are skipped."""
    curve: list[dict[str, Any]] = [
        {
            "when": "before",
            "version": 0,
            "env_steps": 0,
            "accuracy": start.get("initial_accuracy"),
            "accuracy_difference": 0.0 if start.get("initial_accuracy") is not None else None,
            "accuracy_difference_ci95_paired": None,
            "eval_s": start.get("initial_eval_s"),
        }
    ]
    last: dict = {}
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or is_event(row) or "iteration" not in row:
            continue
        last = row
        if row.get("eval_accuracy") is None:
            continue
        lo, hi = (
            row.get("eval_accuracy_difference_ci95_paired_low"),
            row.get("eval_accuracy_difference_ci95_paired_high"),
        )
        curve.append(
            {
                "when": "during",
                "version": row.get("eval_version", row["iteration"]),
                "env_steps": row.get("env_steps"),
                "accuracy": row["eval_accuracy"],
                "accuracy_difference": row.get("eval_accuracy_difference"),
                "accuracy_difference_ci95_paired": None if lo is None else [lo, hi],
                "eval_s": row.get("eval_s"),
            }
        )
    curve.append(
        {
            "when": "after",
            "version": last.get("iteration"),
            "env_steps": last.get("env_steps"),
            "accuracy": final.get("final_accuracy"),
            "accuracy_difference": final.get("accuracy_difference"),
            "accuracy_difference_ci95_paired": final.get("accuracy_difference_ci95_paired"),
            "eval_s": final.get("final_eval_s"),
        }
    )
    return curve
