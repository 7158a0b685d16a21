"""The generator actor's side of the llm task (:class:`LLMProducer`, asyncrl.tasks.base's ``Producer``):
a stale copy of the causal LM samples G completions per prompt (in the run's prompt format, stopping on
any of the model's stop tokens: asyncrl.tasks.llm.datasets), the verifiable reward scores them, and
whole prompt groups are written into a slot (asyncrl.tasks.llm.spec) row by row under the slot guard.

Heartbeats: a slot of a real model on a CPU takes minutes, longer than ``transport.actor_timeout_s``.
In an actor process the generation therefore runs in a worker thread while the actor's own thread goes
on answering the learner's liveness check (:func:`asyncrl.core.background.run_with_heartbeats`); the
actor's sockets are used by its own thread only. Serial mode (no heartbeat) generates in the calling
thread.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from asyncrl.core.background import run_with_heartbeats
from asyncrl.tasks.base import RolloutStats
from asyncrl.tasks.llm import gsm_problems, lora
from asyncrl.tasks.llm.spec import TokenSpec
from asyncrl.tasks.llm.weights import layout_hash, load_flat, param_layout, wire_dtype

if TYPE_CHECKING:
    from asyncrl.tasks.llm.task import LLMTask


class LLMProducer:
    """A generator actor's side: the train problems, a seeded prompt stream, the sampler's torch
    generator, and a copy of the model (loaded from the start directory at :meth:`bind`, then
    overwritten by every version it is sent), float32 on ``actor.device`` (the actor's own config;
    cuda samples other tokens than cpu for the same seed). With the learner's llm.lora_rank > 0 the copy
    is the frozen start model with a LoRA adapter, and the versions it is sent are the adapter's. Raises
    ConfigError at :meth:`bind` when this machine lacks that device."""

    def __init__(self, task: LLMTask):
        self.task, self.cfg = task, task.cfg
        self.spec: TokenSpec = task.spec
        self.spaces = task.spaces
        self.model = self.tokenizer = None
        self.problems: list[gsm_problems.Problem] = []
        self.prompt_format = None
        self.stop_ids: tuple[int, ...] = ()
        self.layout_hash, self.num_params = "", 0
        self.weights_dtype = wire_dtype(self.cfg)  # of the versions it takes (the learner's, after bind)
        self.rng = random.Random(0)
        self.device = torch.device("cpu")
        self.gen = torch.Generator()

    def bind(self, cfg, seeds, template=None) -> None:
        from asyncrl.core.device import check_device
        from asyncrl.tasks.llm import model as m

        self.device = check_device(self.cfg.actor.device, key="actor.device")
        loaded = m.load(self.task.start_dir())
        # the learner's layout: its adapter (if any) and wire dtype; the adapter's initial values come from
        # a forked generator (the first version sent overwrites them)
        model = lora.with_adapter(loaded.model, cfg.llm, own_rng=True)
        self.model, self.tokenizer = model.to(self.device), loaded.tokenizer
        self.gen = torch.Generator(device=self.device)
        self.weights_dtype = wire_dtype(cfg)
        self.layout_hash = layout_hash(self.model, self.weights_dtype)
        self.num_params = sum(p.numel() for _, p in param_layout(self.model))
        if not self.problems:
            self.problems = self.task.rl_problems()
        self.prompt_format = self.task.prompt_format(self.tokenizer)
        self.stop_ids = self.task.stop_ids(self.tokenizer)
        self.seeds = seeds

    def load(self, flat: np.ndarray) -> None:
        load_flat(self.model, flat)

    def reset(self) -> None:
        self.rng = random.Random(int(self.seeds.env[0]))
        self.gen = torch.Generator(device=self.device).manual_seed(int(self.seeds.action))

    def collect(
        self,
        slot,
        *,
        version: int,
        guard=None,
        grant_id: int = 0,
        tick: Callable[[], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> RolloutStats:
        """Sample G completions for each of P prompts drawn from the train problems, score them, and
        write the slot row by row (``grant_id`` last in each row, ``guard`` asked around each).
        ``tick`` is called once before the generation (the actor's straggler sleep and heartbeat);
        with ``heartbeat``, the generation runs in a worker thread while this thread calls it
        (asyncrl.core.background): the same tokens, bit for bit."""
        from asyncrl.tasks.llm.sampling import decode_completions, generate_group

        if guard is not None:
            grant_id = guard.grant_id
        if tick is not None:
            tick()
        if guard is not None and not guard.may_write():
            return RolloutStats(0, [], [], 0.0, 0.0, revoked=True)
        s, llm = self.spec, self.cfg.llm
        chosen = [self.problems[self.rng.randrange(len(self.problems))] for _ in range(s.prompts)]
        t0 = time.perf_counter()

        def generate(on_step: Callable[[], None] | None):
            return generate_group(
                self.model,
                self.tokenizer,
                self.task.encode_questions(self.tokenizer, self.prompt_format, chosen),
                s.group_size,
                temperature=llm.temperature,
                max_new_tokens=s.completion_tokens,
                generator=self.gen,
                top_k=llm.top_k,
                top_p=llm.top_p,
                on_step=on_step,
                stop_ids=self.stop_ids,
            )

        out = generate(None) if heartbeat is None else run_with_heartbeats(generate, heartbeat, name="llm-generation")
        out = out._replace(
            **{
                k: getattr(out, k).cpu()
                for k in ("input_ids", "attention_mask", "completion_mask", "behavior_log_prob", "policy_mask")
            }
        )
        t1 = time.perf_counter()
        texts = decode_completions(self.tokenizer, out)
        rewards = [self.task.score(text, chosen[r // s.group_size].target) for r, text in enumerate(texts)]
        if llm.truncated_reward == "zero":
            rewards = [0.0 if cut else x for x, cut in zip(rewards, truncated(out, self.stop_ids))]
        if heartbeat is not None:
            heartbeat()
        sp, width = out.prompt_len, out.completion_mask.shape[1]
        if sp > s.prompt_tokens:  # the task's prompt width (datasets.LLMData.prompt_width) covers every prompt
            raise ValueError(f"a prompt of {sp} tokens is longer than the slot's prompt width {s.prompt_tokens}")
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = out.input_ids[:, :sp].numpy(), out.attention_mask[:, :sp].numpy().astype(bool)
        comp_ids, comp_mask = out.input_ids[:, sp:].numpy(), out.completion_mask.numpy()
        blp, chosen = out.behavior_log_prob.numpy(), out.policy_mask.numpy()
        lengths = []
        for r in range(s.rows):
            if guard is not None and not (guard.wrote() and guard.may_write()):
                return RolloutStats(r, rewards[:r], lengths, time.perf_counter() - t1, t1 - t0, revoked=True)
            slot["prompt_ids"][r, :] = pad
            slot["prompt_ids"][r, s.prompt_tokens - sp :] = prompt_ids[r]
            slot["prompt_mask"][r, :] = False
            slot["prompt_mask"][r, s.prompt_tokens - sp :] = prompt_mask[r]
            slot["completion_ids"][r, :] = pad
            slot["completion_ids"][r, :width] = comp_ids[r]
            slot["completion_mask"][r, :] = False
            slot["completion_mask"][r, :width] = comp_mask[r]
            slot["policy_mask"][r, :] = False
            slot["policy_mask"][r, :width] = chosen[r]
            slot["behavior_log_prob"][r, :] = 0.0
            slot["behavior_log_prob"][r, :width] = blp[r]
            slot["behavior_version"][r] = version
            slot["rewards"][r] = rewards[r]
            slot["grant_id"][r] = grant_id
            lengths.append(int(comp_mask[r].sum()))
        if guard is not None and not guard.wrote():
            return RolloutStats(s.rows, rewards, lengths, time.perf_counter() - t1, t1 - t0, revoked=True)
        return RolloutStats(s.rows, rewards, lengths, time.perf_counter() - t1, t1 - t0)

    def state_dict(self) -> dict:
        return {"source": {"prompt_rng": _rng_state(self.rng)}, "rng": self.gen.get_state()}

    def load_source_state(self, source: Any) -> bool:
        self.rng.setstate(_rng_from(source["prompt_rng"]))
        return True

    def load_rng_state(self, rng: Any) -> None:
        self.gen.set_state(rng)

    def close(self) -> None:
        self.model = None


def truncated(samples, eos_id: int | Sequence[int]) -> list[bool]:
    """Per row of ``samples`` (sampling.Samples): True when the completion never emitted ``eos_id`` (a stop
    token id, or any of several: it was cut at the generation budget)."""
    ids = samples.input_ids[:, samples.prompt_len :]
    stop = torch.isin(ids, torch.as_tensor(eos_id, dtype=ids.dtype, device=ids.device).reshape(-1))
    return [not bool((stop[r] & samples.completion_mask[r]).any()) for r in range(ids.shape[0])]


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(d: list) -> tuple:
    return (d[0], tuple(d[1]), d[2])
