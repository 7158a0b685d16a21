"""The llm task's data as the config names it: the problems RL draws prompts from (``llm.train_file`` or
generated ones), the held-out problems (``llm.test_file`` or generated), the few-shot examples, the
prompt format and stop tokens of the start model (:mod:`asyncrl.tasks.llm.prompts`), the reward's
answer format (:mod:`asyncrl.tasks.llm.answer_formats`) and the slot's prompt width. A mixin of
:class:`asyncrl.tasks.llm.task.LLMTask` (reads ``self.cfg`` and ``self.start_dir()``); every role
computes the same values from the same config and files.

Bad data is one line naming the key and the file (and line): a missing file, a malformed line, an
empty file, a prompt longer than an explicit ``llm.max_prompt_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.core.config import ConfigError
from asyncrl.tasks.llm import answer_formats, gsm_problems, prompts
from asyncrl.tasks.llm.gsm_problems import Problem


def read_problems(path: str, key: str) -> list[Problem]:
    """The problems of a GSM8k JSONL file named by config key ``key``.

    Raises:
        ConfigError: a missing file, a malformed line (the message names file and line) or no problems.
    """
    try:
        problems = gsm_problems.load_jsonl(path)
    except (OSError, gsm_problems.GSMFormatError) as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if not problems:
        raise ConfigError(f"{key}: no problems in {path}")
    return problems


def generation_eos(model_dir: Path) -> int | list[int] | None:
    """``eos_token_id`` of a model directory's generation_config.json (else config.json's), or None.

    Raises:
        ConfigError: a file that is not JSON.
    """
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            try:
                value = json.loads(path.read_text()).get("eos_token_id")
            except (OSError, ValueError, AttributeError) as exc:
                raise ConfigError(f"{path} does not read as a JSON object: {exc}") from None
            if value is not None:
                return value
    return None


class LLMData:
    """Problems, prompts, stops, rewards and the prompt width of an llm run (see the module docstring)."""

    _data_cache: dict

    def _cached(self, key, make):
        cache = self.__dict__.setdefault("_data_cache", {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def all_train_problems(self) -> list[Problem]:
        """llm.train_file's problems, or llm.train_problems generated ones (seed llm.model_seed)."""
        llm = self.cfg.llm
        if llm.train_file:
            return self._cached("train", lambda: read_problems(llm.train_file, "llm.train_file"))
        seed, n, steps = llm.model_seed, llm.train_problems, (llm.problem_steps_min, llm.problem_steps_max)
        return self._cached(
            "train", lambda: gsm_problems.make_splits(seed=seed, n_train=n, n_heldout=0, steps=steps).train
        )

    def few_shot_problems(self) -> list[Problem]:
        """The first llm.few_shot problems of llm.few_shot_file, or of the train problems.

        Raises:
            ConfigError: fewer problems than llm.few_shot, or as :func:`read_problems`.
        """
        llm = self.cfg.llm
        if not llm.few_shot:
            return []
        if llm.few_shot_file:
            source, key = read_problems(llm.few_shot_file, "llm.few_shot_file"), "llm.few_shot_file"
        else:
            source, key = self.all_train_problems(), "llm.train_file" if llm.train_file else "llm.train_problems"
        if len(source) < llm.few_shot + (0 if llm.few_shot_file else 1):
            raise ConfigError(f"llm.few_shot = {llm.few_shot}: {key} has only {len(source)} problems")
        return source[: llm.few_shot]

    def rl_problems(self) -> list[Problem]:
        """The prompt source of the generators: the train problems without the few-shot examples
        taken from them (a prompt is never its own worked example)."""
        llm = self.cfg.llm
        train = self.all_train_problems()
        return train if llm.few_shot_file or not llm.few_shot else train[llm.few_shot :]

    def heldout_problems(self) -> list[Problem]:
        """The held-out evaluation's problems: the first llm.eval_size of llm.test_file (all of them
        when it has fewer), or llm.eval_size generated held-out problems (none in any train split)."""
        llm = self.cfg.llm
        if llm.test_file:
            return self._cached("test", lambda: read_problems(llm.test_file, "llm.test_file"))[: llm.eval_size]
        steps = (llm.problem_steps_min, llm.problem_steps_max)
        return self._cached(
            "heldout",
            lambda: (
                gsm_problems.make_splits(seed=llm.model_seed, n_train=0, n_heldout=llm.eval_size, steps=steps).heldout
            ),
        )

    def tokenizer(self):
        """The start model's tokenizer (:func:`asyncrl.tasks.llm.model.load_tokenizer`), loaded once."""
        from asyncrl.tasks.llm import model as m

        return self._cached("tokenizer", lambda: m.load_tokenizer(self.start_dir()))

    def prompt_format(self, tokenizer=None) -> prompts.PromptFormat:
        """llm.prompt_format, llm.system_prompt and the few-shot examples for ``tokenizer`` (default: the
        start model's). Raises ConfigError (prompt_format chat without a chat template)."""
        llm = self.cfg.llm
        tokenizer = self.tokenizer() if tokenizer is None else tokenizer
        try:
            return prompts.make_format(
                tokenizer,
                llm.prompt_format,
                system_prompt=llm.system_prompt,
                few_shot=[(p.question, p.answer) for p in self.few_shot_problems()],
            )
        except prompts.PromptError as exc:
            raise ConfigError(f"{self.start_dir()}: {exc}") from None

    def stop_ids(self, tokenizer=None) -> tuple[int, ...]:
        """Every token id that ends a completion (:func:`asyncrl.tasks.llm.prompts.stop_ids` with the start
        model's generation_config.json)."""
        tokenizer = self.tokenizer() if tokenizer is None else tokenizer
        return prompts.stop_ids(tokenizer, generation_eos(self.start_dir()))

    def score(self, completion: str, target) -> float:
        """The verifiable reward of a completion under llm.answer_format and llm.answer_strict."""
        llm = self.cfg.llm
        return answer_formats.reward(completion, target, answer_format=llm.answer_format, strict=llm.answer_strict)

    def encode_questions(self, tokenizer, fmt: prompts.PromptFormat, problems: list[Problem]) -> list[list[int]]:
        """Prompt token ids of ``problems``; a chat template's refusal is a ConfigError naming the model."""
        try:
            return fmt.encode(tokenizer, [p.question for p in problems])
        except prompts.PromptError as exc:
            raise ConfigError(f"{self.start_dir()}: {exc}") from None

    def longest_prompt(self) -> tuple[int, str]:
        """(tokens, where): the longest encoded prompt of the prompt source and the held-out problems,
        and which problem it is (for messages). Computed once per task object."""

        def measure():
            tok, fmt = self.tokenizer(), self.prompt_format()
            best, where = 0, ""
            rl = self.rl_problems()
            skipped = len(self.all_train_problems()) - len(rl)  # few-shot examples taken from the train problems
            for label, problems, first in (("train", rl, skipped + 1), ("held-out", self.heldout_problems(), 1)):
                for i, ids in enumerate(self.encode_questions(tok, fmt, problems)):
                    if len(ids) > best:
                        best, where = len(ids), f"{label} problem {first + i} ({_source(self.cfg.llm, label)})"
            return best, where

        return self._cached("longest", measure)

    def prompt_width(self, *, check: bool = False) -> int:
        """The slot's prompt width S_p: llm.max_prompt_tokens, or the longest prompt when it is 0.

        Args:
            check: also measure the prompts when the width is explicit (what a run's preparation
                does, so that every role need not: 2.6 s for 20,000 generated prompts on a loaded
                2-core machine).

        Raises:
            ConfigError: with ``check``, a prompt longer than an explicit llm.max_prompt_tokens (at the
                run's start, not in a generator); bad data (:meth:`all_train_problems`,
                :meth:`heldout_problems`) when the prompts are measured.
        """
        width = self.cfg.llm.max_prompt_tokens
        if width and not check:
            return width
        longest, where = self.longest_prompt()
        if width == 0:
            return max(longest, 1)
        if longest > width:
            raise ConfigError(
                f"llm.max_prompt_tokens = {width}, but {where} is {longest} tokens in its prompt format: set "
                f"llm.max_prompt_tokens >= {longest}, or 0 for the longest prompt of the data"
            )
        return width


def _source(llm, label: str) -> str:
    if label == "train":
        return llm.train_file or "generated"
    return llm.test_file or "generated"
