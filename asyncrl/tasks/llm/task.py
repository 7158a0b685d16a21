"""The llm task behind the roles' interface (asyncrl.tasks.base): generator actors hold a (stale) copy
of a causal LM, sample G completions per prompt, score them with the verifiable reward and write
whole prompt groups into a slot (asyncrl.tasks.llm.spec); the learner runs GRPO advantages and the
preset's loss on tokens (asyncrl.tasks.llm.learn). Weights travel as one flat buffer of the model's
parameters (tied embeddings once), as the control policy's do, in the wire dtype of
``learner.weights_dtype`` (bfloat16 when the learner trains in bf16); with ``llm.lora_rank`` > 0 the
learner trains a LoRA adapter and only the adapter's tensors travel (asyncrl.tasks.llm.weights, .lora).

The model every role starts from (:meth:`LLMTask.start_dir`): ``llm.model_dir`` or the tiny model of
``asyncrl llm prepare`` (cached in ``llm.cache_dir``), after ``llm.warmup_steps`` supervised
warm-up steps (cached beside it). :meth:`LLMTask.prepare_run` makes it before the roles start and
records the held-out accuracy before RL (``llm.eval_mode``: sampled at ``llm.temperature`` by
default, or greedy); ``llm.eval_every`` adds evaluations during RL (metrics.jsonl ``eval_accuracy``) and
a finished run the accuracy after RL (summary.json ``initial_accuracy``, ``final_accuracy``,
``evaluations``: the same evaluation with the same random draws each time).

The pieces: :mod:`asyncrl.tasks.llm.producer` (the generator actor), :mod:`asyncrl.tasks.llm.start_model`
(the start model and its warm-up), :mod:`asyncrl.tasks.llm.heldout_eval` (accuracy before and after RL),
:mod:`asyncrl.tasks.llm.datasets` (problems, prompt format, stop tokens, reward format, prompt width),
:mod:`asyncrl.tasks.llm.weights` (the flat weight buffer).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.tasks.base import WeightsInfo
from asyncrl.tasks.llm import lora
from asyncrl.tasks.llm.datasets import LLMData
from asyncrl.tasks.llm.heldout_eval import LLMHeldoutEvaluation
from asyncrl.tasks.llm.periodic_eval import LLMPeriodicEval
from asyncrl.tasks.llm.producer import LLMProducer
from asyncrl.tasks.llm.spec import TokenSpec
from asyncrl.tasks.llm.start_model import LLMStartModel
from asyncrl.tasks.llm.weights import flat_weights, layout_hash, weights_info, wire_dtype

# nothing is fetched from a hub at run time (the roles are child processes: they inherit these)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class LLMTask(LLMStartModel, LLMHeldoutEvaluation, LLMData):
    kind = "llm"
    obs_shape: tuple[int, ...] = ()

    def __init__(self, cfg):
        self.cfg = cfg
        self._spec: TokenSpec | None = None
        self._start: Path | None = None
        self._reference = None
        self._weights: WeightsInfo | None = None  # weights_info() from the config, computed once

    # ---- the interface ----
    @property
    def id(self) -> str:
        return f"llm:{self.start_dir()}"

    @property
    def spec(self) -> TokenSpec:
        if self._spec is None:
            llm = self.cfg.llm
            self._spec = TokenSpec(
                prompts=llm.prompts_per_slot,
                group_size=llm.group_size,
                prompt_tokens=self.prompt_width(),
                completion_tokens=llm.max_new_tokens,
                vocab_size=int(self._model_config()["vocab_size"]),
            )
        return self._spec

    @property
    def spaces(self) -> dict[str, str]:
        s, llm = self.spec, self.cfg.llm
        action = f"completion tokens [{s.completion_tokens}] at temperature {llm.temperature}"
        # the sampling transform the learner's log-probs replay: an actor that samples otherwise is refused
        action += f", top_k {llm.top_k}" if llm.top_k else ""
        action += f", top_p {llm.top_p}" if llm.top_p < 1 else ""
        return {"observation": f"prompt tokens [{s.prompt_tokens}] of a vocabulary of {s.vocab_size}", "action": action}

    def producer(self) -> LLMProducer:
        return LLMProducer(self)

    def build_policy(self):
        """The learner's model: the start model, with activation checkpointing when
        llm.gradient_checkpointing (raises ValueError, one line, for a model it does not suit), wrapped in a
        fresh LoRA adapter (the base frozen) when llm.lora_rank > 0."""
        from asyncrl.tasks.llm import model as m
        from asyncrl.tasks.llm.token_log_probs import enable_checkpointing

        model = m.load(self.start_dir()).model
        if self.cfg.llm.gradient_checkpointing:
            enable_checkpointing(model)
        return lora.with_adapter(model, self.cfg.llm)

    def reference(self):
        """The KL penalty's reference π_ref (llm.kl_coef > 0): the start model, frozen (no gradient, eval
        mode), loaded on first use, so only the learner holds it; None when llm.kl_coef = 0."""
        if self.cfg.llm.kl_coef == 0:
            return None
        if self._reference is None:
            from asyncrl.tasks.llm import model as m

            self._reference = m.load(self.start_dir()).model.requires_grad_(False).eval()
        return self._reference

    def flat_weights(self, policy) -> np.ndarray:
        return flat_weights(policy, wire_dtype(self.cfg))

    def layout_hash(self, policy) -> str:
        return layout_hash(policy, wire_dtype(self.cfg))

    def weights_info(self, policy=None) -> WeightsInfo:
        """Without ``policy``: from the start model's config.json on the meta device (no weights read)."""
        if policy is not None:
            return weights_info(policy, self.cfg)
        if self._weights is None:
            self._weights = weights_info(lora.meta_model(self.start_dir(), self.cfg.llm), self.cfg)
        return self._weights

    def make_batch(self, state, slots, gaps=None) -> dict[str, torch.Tensor]:
        """Rows of B slots stacked: [B * rows, ...] tensors (groups stay whole: a slot holds whole groups)."""
        names = self.spec.batch_field_names
        return {n: torch.from_numpy(np.concatenate([arrays[n] for _, arrays in slots], axis=0)) for n in names}

    def learner_iteration(self, state, batch) -> dict[str, Any]:
        from asyncrl.tasks.llm.learn import llm_iteration

        reference = self.reference()
        if reference is not None:
            reference.to(state.device)  # in place; a no-op after the first iteration and on the CPU
        llm, context = self.cfg.llm, state.forward_context
        dropout = lora.enabled(llm) and llm.lora_dropout > 0
        if dropout:  # the adapter's dropout in the gradient forwards only (log π_T stays the policy's own)
            context = lora.dropout_forwards(state.policy, context)
        stats = llm_iteration(
            state.policy,
            state.optimizer,
            batch,
            algo=self.cfg.algo,
            llm=llm,
            generator=state.generator,
            version=state.version,
            reference=reference,
            forward_context=context,
            target_from_first_step=not dropout,
        )
        stats["weights_bytes"] = self.weights_info(state.policy).nbytes  # what the version it makes carries
        return stats

    def warm_up(self, state) -> bool:
        return False  # nothing compiled

    def after_iteration(self, state, batch) -> None:
        return None

    def periodic_eval(self, run_dir: Path) -> LLMPeriodicEval:
        """``llm.eval_every``: the held-out evaluation of the learner's policy every that many learner
        iterations (never when 0), paired with the start's (asyncrl.tasks.llm.periodic_eval)."""
        return LLMPeriodicEval(self, run_dir)
