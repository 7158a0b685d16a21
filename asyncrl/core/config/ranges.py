"""The range of every numeric config key, in one table, and the check that holds each value to it.

A value outside its range is refused at load with one line naming the key, the range and the value
(e.g. ``algo.max_grad_norm must be > 0 or inf, got -1.0``), before any process starts: a negative
gradient clip turns the gradient around, a reward clip of 0 zeroes every reward, a group of one
completion has no group advantage, and each of them otherwise trains to the end without a word. Every
int or float field of :class:`asyncrl.core.config.root.Config` has an entry (a test checks it), so a new
key cannot be added without one. Cross-field checks (e.g. learner.num_slots >= learner.slots_per_batch)
stay in :mod:`.validate`. NaN never reaches this check (the type check refuses it); +inf passes only
where the range says so (its meaning is in the key's help: "inf: off").
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, NamedTuple

from asyncrl.core.config.field_meta import ConfigError

if TYPE_CHECKING:
    from asyncrl.core.config.root import Config

INF = math.inf


class Range(NamedTuple):
    """[low, high] with either end open; ``inf_ok``: +inf is allowed (a key's "off")."""

    low: float = -INF
    high: float = INF
    low_open: bool = False
    high_open: bool = False
    inf_ok: bool = False

    def holds(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if math.isinf(value):
            return value > 0 and self.inf_ok
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def text(self) -> str:
        """The range in words: "> 0", ">= 1", "in [0, 1)", with " or inf" where +inf is allowed."""
        if self.high == INF:
            words = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        else:
            words = (
                f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            )
        return words + (" or inf" if self.inf_ok else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


AT_LEAST_0, AT_LEAST_1, AT_LEAST_MINUS_1 = Range(0), Range(1), Range(-1)
POSITIVE = Range(0, low_open=True)
POSITIVE_OR_INF = Range(0, low_open=True, inf_ok=True)
AT_LEAST_0_OR_INF = Range(0, inf_ok=True)
UNIT = Range(0, 1)

RANGES: dict[str, Range] = {
    "env.num_envs": AT_LEAST_1,
    "env.rollout_length": AT_LEAST_1,
    "env.max_episode_steps": AT_LEAST_0,
    # log std from 2e-9 to 5e8: wider than any action scale, and exp() of it stays finite in float32
    "policy.init_log_std": Range(-20, 20),
    "policy.obs_clip": POSITIVE_OR_INF,
    "algo.gamma": UNIT,
    "algo.gae_lambda": UNIT,
    "algo.rho_bar": POSITIVE_OR_INF,
    "algo.c_bar": AT_LEAST_0_OR_INF,
    "algo.realign_min_lag": AT_LEAST_0,
    "algo.tv_threshold": POSITIVE_OR_INF,
    "algo.surrogate_rho_bar": POSITIVE_OR_INF,
    "algo.tv_filter_min_deviation": AT_LEAST_0,
    "algo.behavior_band": POSITIVE_OR_INF,
    "algo.tv_filter_ratio_cap": POSITIVE_OR_INF,
    "algo.clip_eps": POSITIVE,
    "algo.kl_coef": AT_LEAST_0,
    "algo.spo_eps": POSITIVE,
    "algo.value_coef": AT_LEAST_0,
    "algo.entropy_coef": AT_LEAST_0,
    "algo.num_epochs": AT_LEAST_1,
    "algo.num_minibatches": AT_LEAST_1,
    "algo.lr": POSITIVE,
    "algo.adam_eps": POSITIVE,
    "algo.max_grad_norm": POSITIVE_OR_INF,
    "actor.policy_delay": AT_LEAST_0,
    "actor.policy_age_buffer": AT_LEAST_1,
    "actor.slowdown_s": AT_LEAST_0,
    "learner.slots_per_batch": AT_LEAST_1,
    "learner.num_slots": AT_LEAST_1,
    "learner.max_policy_lag": AT_LEAST_MINUS_1,
    "learner.target_lag_p95": AT_LEAST_MINUS_1,
    "learner.reward_clip": POSITIVE_OR_INF,
    "learner.checkpoint_every": AT_LEAST_0,
    "learner.keep_checkpoints": AT_LEAST_1,
    "learner.max_consecutive_skips": AT_LEAST_0,
    "learner.torch_threads": AT_LEAST_1,
    "learner.num_learners": AT_LEAST_1,
    "learner.group_timeout_s": POSITIVE,
    "transport.heartbeat_s": POSITIVE,
    "transport.actor_timeout_s": POSITIVE,
    "transport.rejoin_timeout_s": POSITIVE,
    "transport.grant_lease_s": AT_LEAST_0,
    "run.seed": AT_LEAST_0,
    "run.total_env_steps": AT_LEAST_1,
    "run.num_actors": AT_LEAST_1,
    "run.straggler_slowdown_s": AT_LEAST_0,
    "run.lag_warning_p95": AT_LEAST_MINUS_1,
    "run.log_every_s": AT_LEAST_0,  # 0: a progress line and a lag window every iteration
    "run.eval_every": AT_LEAST_0,
    "run.eval_episodes": AT_LEAST_1,
    "run.max_restarts": AT_LEAST_0,
    "run.restart_backoff_s": AT_LEAST_0,
    "run.restart_window_s": AT_LEAST_0,
    "llm.model_seed": AT_LEAST_0,
    "llm.warmup_steps": AT_LEAST_0,
    "llm.warmup_batch_size": AT_LEAST_1,
    "llm.warmup_threads": AT_LEAST_0,
    "llm.warmup_target": UNIT,
    # a group advantage compares completions of one prompt: one completion alone has none
    "llm.group_size": Range(2),
    "llm.prompts_per_slot": AT_LEAST_1,
    "llm.max_prompt_tokens": AT_LEAST_0,
    "llm.max_new_tokens": AT_LEAST_1,
    "llm.temperature": POSITIVE,
    "llm.top_k": AT_LEAST_0,
    "llm.top_p": Range(0, 1, low_open=True),
    "llm.problem_steps_min": Range(1, 8),
    "llm.problem_steps_max": Range(1, 8),
    "llm.train_problems": AT_LEAST_1,
    "llm.few_shot": AT_LEAST_0,
    "llm.eval_size": AT_LEAST_0,
    "llm.eval_every": AT_LEAST_0,
    "llm.eval_batch_size": AT_LEAST_1,
    "llm.kl_coef": AT_LEAST_0,
    "llm.negative_weight": AT_LEAST_0,
    "llm.logprob_chunk_tokens": AT_LEAST_1,
    "llm.micro_batch_rows": AT_LEAST_0,
    "llm.lora_rank": AT_LEAST_0,
    "llm.lora_alpha": POSITIVE,
    "llm.lora_dropout": Range(0, 1, high_open=True),
}


def numeric_keys(cfg: Config) -> dict[str, float]:
    """{"section.key": value} of every int or float field of ``cfg`` (bools excluded)."""
    out = {}
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{section.name}.{f.name}"] = value
    return out


def check_ranges(cfg: Config) -> None:
    """Raises ConfigError naming the first numeric key of ``cfg`` outside its :data:`RANGES` entry
    (or without one: a key added without its range)."""
    for key, value in numeric_keys(cfg).items():
        if key not in RANGES:
            raise ConfigError(f"{key} has no range in asyncrl/core/config/ranges.py (a key added without one)")
        r = RANGES[key]
        if not r.holds(value):
            finite = "a finite number " if math.isinf(value) else ""
            raise ConfigError(f"{key} must be {finite}{r.text()}, got {value}")
