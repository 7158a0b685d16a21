"""The llm task's held-out evaluation: exact-match accuracy of one completion per held-out problem
(sampled or greedy), of the start model before RL (once per run directory, cached per start model in
``llm.cache_dir``), of the learner's policy during RL (``llm.eval_every``: asyncrl.tasks.llm.periodic_eval)
and of the final policy after RL, and the accuracy difference with its independent and paired 95 %
intervals (summary.json ``initial_accuracy``, ``final_accuracy``, ``evaluations``). A mixin of
:class:`asyncrl.tasks.llm.task.LLMTask` (reads ``self.cfg``, ``self.start_dir``, ``self.prepare_model``)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncrl.core.metrics import strict_json
from asyncrl.tasks.llm import gsm_problems
from asyncrl.tasks.llm.eval_draws import DRAWS, problem_uniforms
from asyncrl.tasks.llm.periodic_eval import evaluation_curve

START_FILE = "llm-start.json"  # in the run directory: the start model and its accuracy before RL
START_EVAL_FIELDS = ("initial_accuracy", "eval_problems", "initial_eval_s", "initial_correct")


class LLMHeldoutEvaluation:
    """Accuracy on held-out problems before and after RL, and the start record of a run directory."""

    def evaluate(self, model, tick: Callable[[], None] | None = None) -> tuple[float, int, list[int]]:
        """(exact-match accuracy, problems, per-problem 0/1 rewards in problem order) on the held-out
        problems (the first llm.eval_size of llm.test_file or generated ones), one completion each in
        the run's prompt format, stopped by any stop token and scored by llm.answer_format (calculator
        on, as :func:`sampling.evaluate`), in batches of llm.eval_batch_size on the model's device.

        llm.eval_mode "sampled": at llm.temperature, llm.top_k and llm.top_p (the policy RL trains, and
        DeepSeek-R1's pass@1 with one sample, arXiv:2501.12948) with problem i's own uniforms, drawn on the CPU from a
        stream seeded by (llm.model_seed, i) (:mod:`asyncrl.tasks.llm.eval_draws`), so every
        evaluation of a run (before, during and after RL, on any device, in any batch) makes the same
        draws for a problem (common random numbers: the paired interval then measures the policy's
        change, not the draws'); "greedy": argmax decoding. ``tick`` is called after each batch (the
        learner serves its peers there). Runs with learner.torch_threads torch threads: torch's
        default of one per core took 280-310 s instead of about 11 s for 500 problems when other
        processes held the cores (lab/llm-gsm-tiny/README.md). The model's train / eval mode is
        restored afterwards."""
        return self.accuracy_on(model, self.tokenizer(), self.heldout_problems(), tick)

    def accuracy_on(self, model, tokenizer, problems, tick: Callable[[], None] | None = None):
        """:meth:`evaluate` on other ``problems`` (the warm-up's validation problems): the same
        metric, draws (problem i's own, seeded by llm.model_seed), prompt format and scoring."""
        from asyncrl.tasks.llm.sampling import eval_completions

        llm = self.cfg.llm
        heldout = problems
        greedy = llm.eval_mode == "greedy"
        uniforms = None if greedy else problem_uniforms(llm.model_seed, len(heldout), llm.max_new_tokens)
        fmt, stops, size = self.prompt_format(tokenizer), self.stop_ids(tokenizer), llm.eval_batch_size
        threads, training = torch.get_num_threads(), model.training
        torch.set_num_threads(self.cfg.learner.torch_threads)
        texts: list[str] = []
        try:
            for i in range(0, len(heldout), size):
                texts += eval_completions(
                    model,
                    tokenizer,
                    heldout[i : i + size],
                    greedy=greedy,
                    temperature=llm.temperature,
                    top_k=llm.top_k,
                    top_p=llm.top_p,
                    max_new_tokens=llm.max_new_tokens,
                    batch_size=size,
                    prompt_format=fmt,
                    stop_ids=stops,
                    uniforms=None if uniforms is None else uniforms[i : i + size],
                )
                if tick is not None:
                    tick()
        finally:
            torch.set_num_threads(threads)
            model.train(training)
        correct = [int(self.score(text, p.target)) for text, p in zip(texts, heldout)]
        return (sum(correct) / len(correct) if correct else 0.0), len(heldout), correct

    def eval_label(self) -> str:
        """ "greedy" or "sampled T=<llm.temperature>" (with " top_k=<k>" / " top_p=<p>" when they
        truncate): what initial and final accuracy measure."""
        llm = self.cfg.llm
        if llm.eval_mode == "greedy":
            return "greedy"
        return (
            f"sampled T={llm.temperature:g}"
            + (f" top_k={llm.top_k}" if llm.top_k else "")
            + (f" top_p={llm.top_p:g}" if llm.top_p < 1 else "")
        )

    def prepare_run(self, run_dir: Path, echo: Callable[[str], None] = print) -> dict:
        """Make the start model, read the data and measure the prompt width (so that bad data or a
        too narrow llm.max_prompt_tokens is one line now, not a crash in a generator), then (once per run
        directory) the held-out accuracy before RL. Raises ValueError (a model directory that does not
        load, bad data: ConfigError, a model that fails asyncrl.tasks.llm.model_checks), FileExistsError."""
        from asyncrl.tasks.llm import model as m
        from asyncrl.tasks.llm.model_checks import check_start_model

        try:  # a model directory that does not load, or that the roles would crash on or mistrain: one line
            start = self.prepare_model(echo)
            width, fmt = self.prompt_width(check=True), self.prompt_format()
            source = self.cfg.llm.train_file or "generated"
            echo(
                f"llm: {'chat-template' if fmt.chat else 'plain'} prompts of at most {self.longest_prompt()[0]} "
                f"tokens (slot width {width}), {len(self.rl_problems())} train problems ({source}), "
                f"stop tokens {list(self.stop_ids())}"
            )
            check_start_model(self, start)
        except m.ModelLoadError as exc:
            raise ValueError(str(exc)) from None
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        path = Path(run_dir) / START_FILE
        if path.exists():
            return json.loads(path.read_text())
        record = {
            "model": str(start),
            "initial_accuracy": None,
            "eval_problems": 0,
            "eval_mode": self.eval_label(),
            "eval_batch_size": self.cfg.llm.eval_batch_size,
            "eval_draws": DRAWS,
            "prompt_tokens": width,
            "prompt_format": fmt.describe(),
            "stop_ids": list(self.stop_ids()),
        }
        if self.cfg.llm.eval_size:
            record.update(self._start_evaluation(start, echo))
            how = "reused from " + record["initial_eval_cached"] if "initial_eval_cached" in record else "measured"
            echo(
                f"llm: held-out accuracy before RL {record['initial_accuracy']:.3f} on {record['eval_problems']} "
                f"problems ({self.eval_label()}; {how})"
            )
        path.write_text(strict_json(record, indent=1) + "\n")
        return record

    def _start_evaluation(self, start: Path, echo: Callable[[str], None]) -> dict:
        """initial_accuracy, eval_problems, initial_eval_s and initial_correct of the start model; for a
        start model asyncrl made in llm.cache_dir (never for a user's own directory) reused from, or
        saved to, llm.cache_dir/start-evals/KEY.json (:meth:`start_eval_key`; adds initial_eval_cached
        when reused). A cache that cannot be written costs the next run an evaluation, nothing else."""
        from asyncrl.tasks.llm import model as m

        llm = self.cfg.llm
        cache = None
        if Path(start).resolve().is_relative_to(Path(llm.cache_dir).resolve()):
            cache = Path(llm.cache_dir) / "start-evals" / f"{self.start_eval_key(start)}.json"
            try:
                cached = json.loads(cache.read_text())
                return {k: cached[k] for k in START_EVAL_FIELDS} | {"initial_eval_cached": str(cache)}
            except (OSError, ValueError, KeyError, TypeError):
                pass
        t0 = time.perf_counter()
        acc, n, correct = self.evaluate(m.load(start).model)
        out = {
            "initial_accuracy": acc,
            "eval_problems": n,
            "initial_eval_s": round(time.perf_counter() - t0, 2),
            "initial_correct": "".join(map(str, correct)),
        }
        if cache is not None:
            try:  # one atomic file: concurrent runs write the same content
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
                tmp.write_text(strict_json(out, indent=1) + "\n")
                os.replace(tmp, cache)
            except OSError as exc:
                echo(f"llm: could not cache the start evaluation in {cache}: {exc}")
        return out

    def start_eval_key(self, start: Path) -> str:
        """Cache key (16 hex digits) of the evaluation before RL: the start model directory's files
        (name, size, modification time), the llm task's code (sampler, problems, this evaluation) and
        every setting the evaluation reads (prompt format, stop tokens, answer format, the held-out
        problems' text). The same key means the same computation on this machine
        (one torch thread, seeded draws), so :meth:`prepare_run` reuses its result across runs."""
        llm = self.cfg.llm
        h = hashlib.sha256()
        for f in sorted(p for p in Path(start).iterdir() if p.is_file()):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        for f in sorted(Path(__file__).parent.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        h.update(
            json.dumps(
                {
                    "eval_size": llm.eval_size,
                    "eval_mode": llm.eval_mode,
                    "temperature": llm.temperature,
                    **({"top_k": llm.top_k} if llm.top_k else {}),
                    **({"top_p": llm.top_p} if llm.top_p < 1 else {}),
                    "model_seed": llm.model_seed,
                    "eval_batch_size": llm.eval_batch_size,
                    "max_new_tokens": llm.max_new_tokens,
                    "threads": self.cfg.learner.torch_threads,
                    "generator_version": gsm_problems.GENERATOR_VERSION,
                    "torch": torch.__version__,
                    "answer_format": [llm.answer_format, llm.answer_strict],
                    "prompt_format": self.prompt_format().describe(),
                    "stop_ids": list(self.stop_ids()),
                    "problems": hashlib.sha256(
                        json.dumps([[p.question, p.answer] for p in self.heldout_problems()]).encode()
                    ).hexdigest(),
                },
                sort_keys=True,
            ).encode()
        )
        return h.hexdigest()[:16]

    def start_record(self, run_dir: Path) -> dict[str, Any]:
        """The run directory's start record (llm-start.json: model, initial_accuracy, eval_problems,
        initial_correct, ...), with initial_accuracy and initial_correct None when it was made by
        another evaluation than this config's (a run directory resumed under other settings, or an
        older asyncrl whose draws were not per problem), so nothing is paired with it."""
        try:
            start = json.loads((Path(run_dir) / START_FILE).read_text())
        except (OSError, ValueError):
            start = {"model": str(self.start_dir()), "initial_accuracy": None, "eval_problems": 0}
        sampled = self.cfg.llm.eval_mode == "sampled"
        prompted = {"prompt_format": self.prompt_format().describe(), "stop_ids": list(self.stop_ids())}
        if (
            start.get("eval_mode", "greedy") != self.eval_label()
            or (sampled and start.get("eval_draws") != DRAWS)  # other random draws
            or any(k in start and start[k] != v for k, v in prompted.items())  # other prompts (absent: older records)
        ):
            start["initial_accuracy"] = start["initial_correct"] = None
        return start

    def compare_with_start(self, start: dict, acc: float, n: int, correct: list[int]) -> dict[str, Any]:
        """The difference of accuracy ``acc`` (per-problem ``correct`` on ``n`` problems) from the start
        record's (:meth:`start_record`): accuracy_difference with its independent 95 % interval
        (two binomial proportions) and, when the start's per-problem results are there, the paired
        one (:func:`paired_difference`); {} without a comparable start."""
        p0 = start.get("initial_accuracy")
        if p0 is None or not n:
            return {}
        half = 1.96 * math.sqrt((p0 * (1 - p0) + acc * (1 - acc)) / n)
        out: dict[str, Any] = {
            "accuracy_difference": acc - p0,
            "accuracy_difference_ci95": [acc - p0 - half, acc - p0 + half],
        }
        before = start.get("initial_correct")
        if isinstance(before, str) and len(before) == n:
            out.update(paired_difference(list(map(int, before)), correct))
        return out

    def final_summary(self, policy, run_dir: Path) -> dict[str, Any]:
        """initial_accuracy (from prepare_run), final_accuracy (now, the same evaluation with the same
        draws), final_eval_s, their difference with independent and paired 95 % intervals
        (:meth:`compare_with_start`), and ``evaluations``: every held-out evaluation of the run in
        order, before, during (llm.eval_every) and after RL (:func:`evaluation_curve`)."""
        start = self.start_record(run_dir)
        out = {
            "task": "llm",
            "model": start["model"],
            "initial_accuracy": start["initial_accuracy"],
            "final_accuracy": None,
            "eval_problems": start["eval_problems"],
            "eval_mode": self.eval_label(),
        }
        if not self.cfg.llm.eval_size:
            return out
        t0 = time.perf_counter()
        acc, n, correct = self.evaluate(policy)
        out.update(final_accuracy=acc, eval_problems=n, final_eval_s=round(time.perf_counter() - t0, 2))
        out.update(self.compare_with_start(start, acc, n, correct))
        out["evaluations"] = evaluation_curve(run_dir, start, final=out)
        return out


def paired_difference(before: list[int], after: list[int], z: float = 1.96) -> dict[str, Any]:
    """The accuracy difference of two evaluations on the same problems, with its paired 95 % interval.

    Wald interval of a difference of paired proportions (Agresti, Categorical Data Analysis, sec.
    10.1): with b problems solved only before and c only after, d = (c - b) / n and
    var(d) = ((b + c) - (c - b)^2 / n) / n^2. Tighter than treating the two accuracies as independent
    when the same problems stay solved.

    Args:
        before, after: 0/1 per problem, the same problems in the same order.

    Returns:
        {"solved_only_before": b, "solved_only_after": c, "accuracy_difference_ci95_paired": [lo, hi]}.

    Raises:
        ValueError: lengths differ or are 0.
    """
    if len(before) != len(after) or not before:
        raise ValueError(f"paired evaluations need the same non-zero length, got {len(before)} and {len(after)}")
    n = len(before)
    b = sum(1 for x, y in zip(before, after) if x and not y)
    c = sum(1 for x, y in zip(before, after) if y and not x)
    d = (c - b) / n
    half = z * math.sqrt(max(0.0, (b + c) - (c - b) ** 2 / n)) / n
    return {"solved_only_before": b, "solved_only_after": c, "accuracy_difference_ci95_paired": [d - half, d + half]}
