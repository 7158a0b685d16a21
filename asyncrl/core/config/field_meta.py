"""What the config's field metadata refers to: :class:`ConfigError`, the field helper :func:`_f` (a
default with its one-line meaning, the presets and task kinds that use it, the condition it needs, whether
it is a study-only option), the names values are checked against (presets, task kinds, modes), the
preset groups the metadata names, and the preset pins (vaco_paper: arXiv:2603.01365).

The sections that use them: :mod:`.control_sections`, :mod:`.algo_section`, :mod:`.role_sections`,
:mod:`.llm_sections`; the whole config: :mod:`.root`. Imports no other asyncrl module: the config never
imports the wire or a task.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.core.config.root import Config

PRESETS = ("decoupled_ppo", "vaco", "ppo", "ppo_kl", "spo", "impala", "vaco_no_realign", "vaco_no_filter", "vaco_paper")
TASK_KINDS = ("control", "llm")
# grpo: PPO-clip on token ratios with group-normalised advantages (no critic); decoupled_ppo / vaco /
# vaco_no_filter: the same policy losses as the control task, on tokens. The rest need a critic or time steps.
LLM_PRESETS = ("grpo", "decoupled_ppo", "vaco", "vaco_no_filter")
LLM_AVERAGING = ("token", "sequence", "constant")
LLM_TRUNCATED_REWARD = ("score", "zero")
LLM_REALIGN = ("none", "is_baseline")  # docs/llm-realignment.md
LLM_SILENT_GROUPS = ("step", "skip", "drop")  # docs/llm.md
LLM_EVAL_MODES = ("sampled", "greedy")  # docs/llm.md
LLM_PROMPT_FORMATS = ("auto", "plain", "chat")  # asyncrl.tasks.llm.prompts
LLM_ANSWER_FORMATS = ("gsm8k", "boxed", "last_number")  # asyncrl.tasks.llm.answer_formats
# Settings a preset pins unless the config names them itself: vaco_paper is the first reading of
# arXiv:2603.01365 (β anchor, δ = 0.2, unbounded ratio), kept runnable beside the tuned default.
PRESET_SETTINGS: dict[str, dict[str, Any]] = {
    # The default: decoupled PPO (Hilton et al. 2021, arXiv:2110.00641), VACO's surrogate with the band of
    # ε 0.2 on π_θ/π_T as its trust region, neither TV filter nor realignment: both lost the reporting run's
    # rule (docs/decisions/default-preset.md).
    "decoupled_ppo": {"behavior_band": 0.2},
    "vaco_paper": {
        "ratio_anchor": "behavior",
        "tv_threshold": 0.2,
        "surrogate_rho_bar": float("inf"),
        "tv_filter_trigger": "minibatch",
        "tv_filter_min_deviation": 0.0,
        "tv_filter_ratio_cap": float("inf"),
        "behavior_band": float("inf"),
        "behavior_band_ratio": "full",
        "entropy_coef": 0.0,
        "traces": "vtrace",
        "tv_rule": "filter",
    },
    # vaco without the TV budget: its fallback is the fixed band of decoupled PPO (ε 0.2), not an
    # unconstrained surrogate (docs/decisions/tv-budget.md); = decoupled_ppo with realigned advantages.
    "vaco_no_filter": {"behavior_band": 0.2},
    "impala": {"traces": "vtrace"},
}
# Keys that no longer exist, with why (a config or config.json naming one is refused with this line).
REMOVED_KEYS = {
    "algo.realign_from_version": "the realignment no longer waits for a learner version: every sample is "
    "realigned from the first iteration (docs/decisions/traces.md); a run started with this key resumes only "
    "with the asyncrl version that started it",
}
RATIO_ANCHORS = ("behavior", "learning", "previous")  # docs/decisions/learning-anchor.md
FILTER_TRIGGERS = ("minibatch", "iteration")
BAND_RATIOS = ("full", "backward", "forward")
TV_RULES = ("shrink", "filter")
TRACES = ("vtrace", "uncorrected")
VALUE_TARGETS = ("auto", "vtrace", "lambda_returns")
ROLLOUT_TRANSPORTS = ("auto", "shm", "tcp")
PRECISIONS = ("fp32", "bf16")
WEIGHTS_DTYPES = ("auto", "float32", "bfloat16", "float16")  # learner.weights_dtype (docs/decisions/llm-weights.md)
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")  # learner.device, actor.device
LAUNCHERS = ("local", "ray")


class ConfigError(ValueError):
    """A configuration value, key or file is wrong; the message names it."""


def _f(
    default: Any,
    help: str,
    *,
    presets: tuple[str, ...] | None = None,
    kinds: tuple[str, ...] = TASK_KINDS,
    when: tuple[str, Callable[[Config], bool]] | None = None,
    study_only: bool = False,
) -> Any:
    """A config field with its one-line meaning (``asyncrl config show`` prints it) and who uses it:
    ``presets`` (None: every preset of its task kinds), ``kinds`` (task kinds) and, where a field
    matters only next to another value, ``when`` = (that condition in words, predicate on the Config).
    A value set for a preset or task kind that does not use it is reported
    (:func:`asyncrl.core.config.unused_reason`). ``study_only``: an experimental option kept for studies
    (lag conditions, ablations), not for training; ``config show`` and the reference page mark it."""
    return field(
        default=default,
        metadata={"help": help, "presets": presets, "kinds": kinds, "when": when, "study_only": study_only},
    )


CONTROL, LLM = ("control",), ("llm",)
VACO_FAMILY = ("decoupled_ppo", "vaco", "vaco_paper", "vaco_no_realign", "vaco_no_filter")  # vaco's surrogate
TV_FILTERED = ("vaco", "vaco_paper", "vaco_no_realign")  # ... with the TV filter
REALIGNING = ("vaco", "vaco_paper", "vaco_no_filter")  # realigned advantages (not impala)
VTRACE_PRESETS = REALIGNING + ("impala",)  # compute V-trace every iteration
NOT_IMPALA = tuple(p for p in PRESETS + ("grpo",) if p != "impala")


def corrects_backward_lag(cfg: Config) -> bool:
    """Whether the run's learner corrects backward lag: a preset that realigns its advantages (or
    recomputes V-trace, impala) on the control task; llm.realign other than none on the llm task."""
    if cfg.task.kind == "llm":
        return cfg.llm.realign != "none"
    return cfg.algo.preset in VTRACE_PRESETS
