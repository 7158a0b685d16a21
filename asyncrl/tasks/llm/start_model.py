"""The model every role of an llm run starts from (:meth:`LLMStartModel.start_dir`): ``llm.model_dir`` or
the tiny model of ``asyncrl llm prepare`` (cached in ``llm.cache_dir``), after ``llm.warmup_steps``
supervised warm-up steps (cached beside it, keyed by the settings; with ``llm.warmup_target``, stopped
early once the greedy accuracy on validation problems reaches it). A mixin of
:class:`asyncrl.tasks.llm.task.LLMTask` (reads ``self.cfg``)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from asyncrl.core.metrics import strict_json
from asyncrl.core.wording import count_of
from asyncrl.tasks.llm import gsm_problems
from asyncrl.tasks.llm.defaults import DEFAULT_BATCH_SIZE
from asyncrl.tasks.llm.defaults import DEFAULT_THREADS as WARMUP_THREADS

WARMUP_STAMP = "asyncrl-rl-warmup.json"
WARMUP_VALIDATION = 200  # llm.warmup_target: problems after the train split, their accuracy checked
WARMUP_CHECK_EVERY = 100  # steps between those checks, from the first 100 on


class LLMStartModel:
    """The start model's directories and its preparation (tiny model, cached warm-up)."""

    def base_dir(self) -> Path:
        llm = self.cfg.llm
        return Path(llm.model_dir) if llm.model_dir else Path(llm.cache_dir) / f"tiny-qwen2-s{llm.model_seed}"

    def start_dir(self) -> Path:
        """The model directory every role loads at its start: the base model, warmed up when
        llm.warmup_steps > 0 (made by :meth:`prepare_model`)."""
        llm = self.cfg.llm
        base = self.base_dir()
        if llm.warmup_steps == 0:
            return base
        target = f"-t{llm.warmup_target:g}" if llm.warmup_target else ""
        batch = f"-b{llm.warmup_batch_size}" if llm.warmup_batch_size != DEFAULT_BATCH_SIZE else ""
        threads = f"-th{llm.warmup_threads}" if llm.warmup_threads != WARMUP_THREADS else ""
        return Path(llm.cache_dir) / f"{base.name}-warm-s{llm.model_seed}-n{llm.warmup_steps}{batch}{threads}{target}"

    def prepare_model(self, echo: Callable[[str], None] = print) -> Path:
        """Make (or reuse) the start model: ``asyncrl llm prepare``'s tiny model when llm.model_dir is
        '', then llm.warmup_steps of :func:`asyncrl.tasks.llm.warmup.warmup` with its defaults
        (cached, keyed by the settings). Raises model.ModelLoadError for a missing llm.model_dir.
        Processes that prepare the same start model at once (a study's parallel cells) wait for the
        first (``model.build_lock``) and reuse what it made."""
        from asyncrl.tasks.llm import model as m

        llm = self.cfg.llm
        if llm.warmup_steps and llm.model_dir and self.prompt_format(m.load_tokenizer(self.base_dir())).chat:
            raise m.ModelLoadError(  # before the lock: a refused run writes nothing in llm.cache_dir
                f"llm.warmup_steps = {llm.warmup_steps} for {llm.model_dir}, whose prompts are chat-templated: the "
                "supervised warm-up trains the tiny model's plain prompt on generated worked solutions at lr 3e-3, "
                "which RL on this model would not see and which would overwrite a pretrained model's "
                'behaviour; set llm.warmup_steps = 0 (or llm.prompt_format = "plain" for a model of your own)'
            )
        if llm.warmup_steps:
            with m.build_lock(self.start_dir()):  # parallel cells or roles: one warms up, the others reuse
                return self._prepare_model(echo)
        return self._prepare_model(echo)

    def _prepare_model(self, echo: Callable[[str], None]) -> Path:
        from asyncrl.tasks.llm import model as m
        from asyncrl.tasks.llm import warmup as w

        llm = self.cfg.llm
        if not llm.model_dir:
            path, reused = m.prepare(self.base_dir(), seed=llm.model_seed)
            echo(f"llm: {'reused' if reused else 'prepared'} the tiny model {path}")
        start = self.start_dir()
        if llm.warmup_steps == 0:
            m.require_model_dir(start)  # one line if it is not a model directory; the start checks load it
            return start
        settings = {
            "base": str(self.base_dir().resolve()),
            "seed": llm.model_seed,
            "steps": llm.warmup_steps,
            "train_problems": llm.train_problems,
            "generator_version": gsm_problems.GENERATOR_VERSION,
            "calculator_mask": True,
        }
        if llm.warmup_batch_size != DEFAULT_BATCH_SIZE:
            settings["batch_size"] = llm.warmup_batch_size
        if llm.warmup_threads != WARMUP_THREADS:
            settings["threads"] = llm.warmup_threads
        if llm.warmup_target:  # the held-out metric (eval_mode, temperature), checked from the first check on
            settings.update(
                target=llm.warmup_target,
                validation_problems=WARMUP_VALIDATION,
                check_every=WARMUP_CHECK_EVERY,
                metric=self.eval_label(),
                first_check=WARMUP_CHECK_EVERY,
            )
        try:
            stamp = json.loads((start / WARMUP_STAMP).read_text())
            # a cache made before llm.warmup_threads existed ran at whatever torch had: it counts only if that matched
            if stamp["settings"] == settings and (
                not llm.warmup_threads or stamp["torch_threads"] == llm.warmup_threads
            ):
                echo(f"llm: reused the warmed-up model {start}")
                return start
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if start.exists():
            raise FileExistsError(f"{start} exists and was not warmed up with these settings; remove it")
        loaded = m.load(self.base_dir())
        n_val = WARMUP_VALIDATION if llm.warmup_target else 0
        problems = gsm_problems.make_splits(seed=llm.model_seed, n_train=llm.train_problems + n_val, n_heldout=0).train
        train, validation = problems[: llm.train_problems], problems[llm.train_problems :]
        checks: list[tuple[int, float]] = []

        def reached(steps: int) -> bool:
            """The warm-up's early stop: the start metric (the held-out evaluation's: llm.eval_mode at
            llm.temperature, the same draws) on the validation problems, at every check: the model
            starts RL near llm.warmup_target whatever the seed or the CPU's kernels make of the steps."""
            loaded.model.eval()
            accuracy = self.accuracy_on(loaded.model, loaded.tokenizer, validation)[0]
            loaded.model.train()
            checks.append((steps, accuracy))
            echo(
                f"llm: warm-up step {steps}: validation accuracy {accuracy:.3f} ({self.eval_label()}; "
                f"target {llm.warmup_target:g})"
            )
            return accuracy >= llm.warmup_target

        echo(
            f"llm: warming up {self.base_dir()} for {count_of(llm.warmup_steps, 'step')}"
            f"{f' or until validation accuracy {llm.warmup_target:g}' if llm.warmup_target else ''} (supervised, "
            f"cached in {start})"
        )
        threads = torch.get_num_threads()
        if llm.warmup_threads:
            torch.set_num_threads(llm.warmup_threads)
        try:
            result = w.warmup(
                loaded.model,
                loaded.tokenizer,
                train,
                steps=llm.warmup_steps,
                seed=llm.model_seed,
                calculator_mask=True,
                batch_size=llm.warmup_batch_size,
                stop=reached if llm.warmup_target else None,
                check_every=WARMUP_CHECK_EVERY,
            )
            warm_threads = torch.get_num_threads()
        finally:
            torch.set_num_threads(threads)
        tmp = start.with_name(f".{start.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        m.save(loaded.model, loaded.tokenizer, tmp)
        (tmp / WARMUP_STAMP).write_text(
            strict_json(
                {
                    "settings": settings,
                    "final_loss": result.final_loss,
                    "steps_taken": result.steps,
                    "validation_checks": checks,
                    "torch_threads": warm_threads,
                    "seconds": round(result.seconds, 2),
                },
                indent=1,
            )
            + "\n"
        )
        os.replace(tmp, start)
        echo(
            f"llm: warm-up done in {result.seconds:.0f} s, {count_of(result.steps, 'step')} (loss "
            f"{result.final_loss:.3f})"
        )
        return start

    def _model_config(self) -> dict:
        path = self.start_dir() / "config.json"
        try:
            return json.loads(path.read_text())
        except OSError:
            raise FileNotFoundError(
                f"no model at {self.start_dir()}: run `asyncrl run --config ...` (it prepares "
                f"and warms up the model first) or set llm.model_dir"
            ) from None
