"""Cross-field checks of a resolved config: each raises ConfigError with one line naming the key."""

from __future__ import annotations

import json

from asyncrl.core.config.field_meta import (
    BAND_RATIOS,
    DEVICE_RE,
    FILTER_TRIGGERS,
    LAUNCHERS,
    LLM_ANSWER_FORMATS,
    LLM_AVERAGING,
    LLM_EVAL_MODES,
    LLM_PRESETS,
    LLM_PROMPT_FORMATS,
    LLM_REALIGN,
    LLM_SILENT_GROUPS,
    LLM_TRUNCATED_REWARD,
    PRECISIONS,
    PRESETS,
    RATIO_ANCHORS,
    ROLLOUT_TRANSPORTS,
    TASK_KINDS,
    TRACES,
    TV_FILTERED,
    TV_RULES,
    VALUE_TARGETS,
    WEIGHTS_DTYPES,
    ConfigError,
)
from asyncrl.core.config.ranges import check_ranges
from asyncrl.core.config.root import Config
from asyncrl.core.limits import MAX_STR_BYTES


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the first problem."""
    a, lrn = cfg.algo, cfg.learner
    if a.preset not in PRESETS + ("grpo",):
        raise ConfigError(
            f"unknown preset algo.preset={a.preset!r}; presets are {', '.join(PRESETS)} "
            f"(task.kind = llm: {', '.join(LLM_PRESETS)})"
        )
    check_ranges(cfg)
    _validate_task(cfg)
    if a.ratio_anchor not in RATIO_ANCHORS:
        raise ConfigError(f"algo.ratio_anchor must be one of {RATIO_ANCHORS}, got {a.ratio_anchor!r}")
    if a.ratio_anchor == "previous" and cfg.task.kind != "control":
        raise ConfigError(
            "algo.ratio_anchor = previous keeps the policy of one version before in the learner: control task only "
            "(a language model's second copy); use learning"
        )
    if a.traces not in TRACES:
        raise ConfigError(f"algo.traces must be one of {TRACES}, got {a.traces!r}")
    if a.value_targets not in VALUE_TARGETS:
        raise ConfigError(f"algo.value_targets must be one of {VALUE_TARGETS}, got {a.value_targets!r}")
    if a.value_targets != "auto" and a.preset == "impala":
        raise ConfigError("algo.value_targets must be auto for impala (it recomputes V-trace targets every step)")
    if a.tv_filter_trigger not in FILTER_TRIGGERS:
        raise ConfigError(f"algo.tv_filter_trigger must be one of {FILTER_TRIGGERS}, got {a.tv_filter_trigger!r}")
    if not a.tv_filter_ratio_cap > a.tv_filter_min_deviation:
        raise ConfigError(
            f"algo.tv_filter_ratio_cap must be > algo.tv_filter_min_deviation, got {a.tv_filter_ratio_cap}"
        )
    if a.tv_rule not in TV_RULES:
        raise ConfigError(f"algo.tv_rule must be one of {TV_RULES}, got {a.tv_rule!r}")
    if a.tv_rule == "shrink" and a.preset in TV_FILTERED:
        if not a.behavior_band < float("inf"):
            raise ConfigError(
                "algo.tv_rule = shrink narrows the band: it needs a finite algo.behavior_band (or tv_rule = filter)"
            )
    if a.behavior_band_ratio not in BAND_RATIOS:
        raise ConfigError(f"algo.behavior_band_ratio must be one of {BAND_RATIOS}, got {a.behavior_band_ratio!r}")
    if a.behavior_band_ratio == "backward" and a.ratio_anchor != "learning":
        raise ConfigError("algo.behavior_band_ratio = backward bounds pi_T/beta and needs algo.ratio_anchor = learning")
    if cfg.policy.activation not in ("tanh", "relu", "elu"):
        raise ConfigError(f"policy.activation must be tanh, relu or elu, got {cfg.policy.activation!r}")
    if cfg.run.launcher not in LAUNCHERS:
        raise ConfigError(f"run.launcher must be one of {', '.join(LAUNCHERS)}, got {cfg.run.launcher!r}")
    if cfg.actor.rollout_transport not in ROLLOUT_TRANSPORTS:
        raise ConfigError(
            f"actor.rollout_transport must be one of {', '.join(ROLLOUT_TRANSPORTS)}, "
            f"got {cfg.actor.rollout_transport!r}"
        )
    _validate_device(cfg)
    _validate_weights(cfg)
    if cfg.actor.policy_delay > 0 and cfg.actor.policy_age_buffer > 1:
        raise ConfigError("set actor.policy_delay or actor.policy_age_buffer, not both")
    if cfg.actor.lag_trace and (cfg.actor.policy_delay > 0 or cfg.actor.policy_age_buffer > 1):
        raise ConfigError("actor.lag_trace replays a run's lag: set it without actor.policy_delay or policy_age_buffer")
    if not cfg.transport.actor_timeout_s >= 2 * cfg.transport.heartbeat_s:
        raise ConfigError(
            f"transport.actor_timeout_s ({cfg.transport.actor_timeout_s}) must be at least twice "
            f"transport.heartbeat_s ({cfg.transport.heartbeat_s}): a peer silent for one heartbeat would be given up"
        )
    if lrn.num_slots < lrn.slots_per_batch:
        raise ConfigError(
            f"learner.num_slots ({lrn.num_slots}) must be >= learner.slots_per_batch ({lrn.slots_per_batch})"
        )
    _validate_group(cfg)
    if cfg.batch_size % a.num_minibatches:
        what = "prompts_per_slot*G*B" if cfg.task.kind == "llm" else "T*B*E"
        raise ConfigError(
            f"batch size {what} = {cfg.batch_size} is not divisible by algo.num_minibatches={a.num_minibatches}"
        )
    n = len(json.dumps(cfg.to_dict()).encode())  # the learner's welcome carries this config to every actor
    if n > MAX_STR_BYTES:
        raise ConfigError(
            f"the config is {n:,} bytes as JSON, over the {MAX_STR_BYTES:,} a welcome message carries "
            f"to actors; shorten its strings (run.run_dir, env.id, env.module, llm.model_dir, llm.cache_dir)"
        )


def _validate_device(cfg: Config) -> None:
    """The names only: whether this machine has the device is asyncrl.core.device.check_device's question
    (asked where the learner or a generator starts, so a GPU run's config still loads elsewhere)."""
    for key, value in (("learner.device", cfg.learner.device), ("actor.device", cfg.actor.device)):
        if not DEVICE_RE.fullmatch(value):
            raise ConfigError(f"{key} must be cpu, cuda or cuda:N, got {value!r}")
    if cfg.learner.precision not in PRECISIONS:
        raise ConfigError(f"learner.precision must be one of {', '.join(PRECISIONS)}, got {cfg.learner.precision!r}")
    if cfg.actor.device != "cpu" and cfg.task.kind == "control":
        raise ConfigError(
            f"actor.device = {cfg.actor.device}: control actors act with numpy on the CPU; "
            f"actor.device is for task.kind = llm"
        )


def _validate_weights(cfg: Config) -> None:
    """learner.weights_dtype and the LoRA keys of [llm]."""
    dtype, llm = cfg.learner.weights_dtype, cfg.llm
    if dtype not in WEIGHTS_DTYPES:
        raise ConfigError(f"learner.weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, got {dtype!r}")
    if cfg.task.kind == "control" and dtype not in ("auto", "float32"):
        raise ConfigError(
            f"learner.weights_dtype = {dtype}: control policies travel as float32 (their actors act with "
            f"numpy); the key is for task.kind = llm"
        )
    targets = llm.lora_target_modules
    if not targets or any(not t or t != t.strip() for t in targets):
        raise ConfigError(f"llm.lora_target_modules must be a list of module names, got {list(targets)}")
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError("llm.lora_target_modules: all-linear names every linear layer; give it alone")


def _validate_task(cfg: Config) -> None:
    llm, preset = cfg.llm, cfg.algo.preset
    if cfg.task.kind not in TASK_KINDS:
        raise ConfigError(f"task.kind must be one of {', '.join(TASK_KINDS)}, got {cfg.task.kind!r}")
    if cfg.task.kind == "control":
        if preset == "grpo":
            raise ConfigError("algo.preset = grpo is for task.kind = llm (control tasks: ppo is PPO-clip)")
        return
    if preset not in LLM_PRESETS:
        raise ConfigError(f"task.kind = llm takes algo.preset {', '.join(LLM_PRESETS)}, got {preset!r}")
    if cfg.algo.value_targets != "auto" or cfg.algo.realign_min_lag != 0:
        raise ConfigError(
            "algo.value_targets and algo.realign_min_lag are control-task "
            "options (a critic's target, V-trace per sample); task.kind = llm has no critic: its "
            "realignment is llm.realign"
        )
    if cfg.algo.normalize_advantages:
        raise ConfigError(
            "algo.normalize_advantages = true: the llm task's advantages are normalised per group "
            "already; a per-minibatch normalisation of token advantages moves silent groups off zero "
            "and can flip a completion's sign (llm.scale_by_std is the llm task's normalisation)"
        )
    if llm.averaging not in LLM_AVERAGING:
        raise ConfigError(f"llm.averaging must be one of {', '.join(LLM_AVERAGING)}, got {llm.averaging!r}")
    if llm.truncated_reward not in LLM_TRUNCATED_REWARD:
        raise ConfigError(
            f"llm.truncated_reward must be one of {', '.join(LLM_TRUNCATED_REWARD)}, got {llm.truncated_reward!r}"
        )
    if llm.silent_groups not in LLM_SILENT_GROUPS:
        raise ConfigError(f"llm.silent_groups must be one of {', '.join(LLM_SILENT_GROUPS)}, got {llm.silent_groups!r}")
    if llm.eval_mode not in LLM_EVAL_MODES:
        raise ConfigError(f"llm.eval_mode must be one of {', '.join(LLM_EVAL_MODES)}, got {llm.eval_mode!r}")
    if llm.prompt_format not in LLM_PROMPT_FORMATS:
        raise ConfigError(
            f"llm.prompt_format must be one of {', '.join(LLM_PROMPT_FORMATS)}, got {llm.prompt_format!r}"
        )
    if llm.answer_format not in LLM_ANSWER_FORMATS:
        raise ConfigError(
            f"llm.answer_format must be one of {', '.join(LLM_ANSWER_FORMATS)}, got {llm.answer_format!r}"
        )
    if llm.realign not in LLM_REALIGN:
        raise ConfigError(f"llm.realign must be one of {', '.join(LLM_REALIGN)}, got {llm.realign!r}")
    if not 1 <= llm.problem_steps_min <= llm.problem_steps_max <= 8:
        raise ConfigError(
            "llm.problem_steps_min / llm.problem_steps_max must satisfy 1 <= min <= max <= 8, got "
            f"{llm.problem_steps_min} / {llm.problem_steps_max}"
        )


def _validate_group(cfg: Config) -> None:
    """A learner group (learner.num_learners > 1) splits each batch's B*E env streams into equal
    shares, and each share into the same algo.num_minibatches minibatches."""
    lrn, e = cfg.learner, cfg.env
    w = lrn.num_learners
    if w == 1:
        return
    if cfg.task.kind != "control":
        raise ConfigError(
            f"learner.num_learners = {w}: a learner group trains the control task only (a language-model "
            f"batch's completions differ in length, so equal shares are not equal work); set 1"
        )
    streams = lrn.slots_per_batch * e.num_envs
    if streams % w:
        raise ConfigError(
            f"learner.num_learners = {w} must divide the batch's env streams, learner.slots_per_batch x "
            f"env.num_envs = {streams}: each member trains on an equal share"
        )
    if (cfg.batch_size // w) % cfg.algo.num_minibatches:
        raise ConfigError(
            f"each of the {w} learners' share of the batch, {cfg.batch_size // w} samples, is not divisible by "
            f"algo.num_minibatches = {cfg.algo.num_minibatches}"
        )


def validate_serial(cfg: Config) -> None:
    """What serial mode (``asyncrl run --serial``) cannot honour; raises ConfigError with one line.
    learner.target_lag_p95: serial mode has no ring and no queue, its lag is what the actor lag
    controls make it (0 without them), so there is nothing to hold."""
    if cfg.learner.num_learners > 1:
        raise ConfigError(
            f"learner.num_learners = {cfg.learner.num_learners}: serial mode is the single-process reference; "
            f"a learner group runs with asyncrl run's processes (without --serial)"
        )
    run, actor = cfg.run, cfg.actor
    for key, value, off, why in (
        ("run.launcher", run.launcher, "local", "serial mode runs in this process, not on a cluster"),
        ("run.ray_address", run.ray_address, "", "serial mode runs in this process, not on a cluster"),
        ("actor.slowdown_s", actor.slowdown_s, 0.0, "a straggler is an actor process: drop --serial"),
        ("run.straggler_slowdown_s", run.straggler_slowdown_s, 0.0, "a straggler is an actor process: drop --serial"),
        ("actor.rollout_transport", actor.rollout_transport, "auto", "serial mode sends no rollout"),
    ):
        if value != off:
            raise ConfigError(f"{key} = {value!r} has no effect in serial mode ({why}); leave it out")
    if cfg.learner.target_lag_p95 >= 0:
        raise ConfigError(
            f"learner.target_lag_p95 = {cfg.learner.target_lag_p95}: serial mode has no slot ring and no "
            f"queueing lag to hold (its lag is 0, or what actor.policy_delay / actor.policy_age_buffer "
            f"make it); the lag target is for asyncrl run without --serial (set -1, or leave it out)"
        )
