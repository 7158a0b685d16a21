"""Configuration: frozen dataclasses per concern, loaded from TOML plus ``--set a.b=v`` overrides.

Defaults live here (the single source of truth); ``configs/default.toml`` lists them for
reading and is checked against this module by a test. Every unknown section or key, every value
of the wrong type and every unknown preset raises :class:`ConfigError` with one line naming it.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tasks.llm.defaults import DEFAULT_BATCH_SIZE as LLM_WARMUP_BATCH, DEFAULT_STEPS as LLM_WARMUP_STEPS
from .tasks.llm.defaults import DEFAULT_THREADS as LLM_WARMUP_THREADS

PRESETS = ("vaco", "ppo", "ppo_kl", "spo", "impala", "vaco_no_realign", "vaco_no_filter", "vaco_paper")
TASK_KINDS = ("control", "llm")
# grpo: PPO-clip on token ratios with group-normalised advantages (no critic); vaco / vaco_no_filter: the same
# policy losses as the control task, on tokens. The rest need a critic or time steps.
LLM_PRESETS = ("grpo", "vaco", "vaco_no_filter")
LLM_AVERAGING = ("token", "sequence", "constant")
LLM_TRUNCATED_REWARD = ("score", "zero")
LLM_REALIGN = ("none", "is_baseline")   # docs/llm-realignment.md
LLM_SILENT_GROUPS = ("step", "skip", "drop")   # docs/llm-rl.md
LLM_EVAL_MODES = ("sampled", "greedy")   # docs/llm-rl.md
# Settings a preset pins unless the config names them itself: vaco_paper is the first reading of
# arXiv:2603.01365 (β anchor, δ = 0.2, unbounded ratio), kept runnable beside the tuned default.
PRESET_SETTINGS: dict[str, dict[str, Any]] = {
    "vaco_paper": {"ratio_anchor": "behavior", "tv_threshold": 0.2, "surrogate_rho_bar": float("inf"),
                   "tv_filter_trigger": "minibatch", "tv_filter_min_deviation": 0.0, "tv_filter_ratio_cap": float("inf"),
                   "behavior_band": float("inf"), "behavior_band_ratio": "full",
                   "entropy_coef": 0.0, "traces": "vtrace", "realign_from_version": 0},
    "impala": {"traces": "vtrace"},
}
RATIO_ANCHORS = ("behavior", "learning")
FILTER_TRIGGERS = ("minibatch", "iteration")
BAND_RATIOS = ("full", "backward", "forward")
TRACES = ("vtrace", "uncorrected")
VALUE_TARGETS = ("auto", "vtrace", "lambda_returns")
ROLLOUT_TRANSPORTS = ("auto", "shm", "tcp")
PRECISIONS = ("fp32", "bf16")
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")   # learner.device, actor.device
LAUNCHERS = ("local", "ray")


class ConfigError(ValueError):
    """A configuration value, key or file is wrong; the message names it."""


def _f(default: Any, help: str) -> Any:
    """A config field with its one-line meaning (``asyncrl config show`` prints it)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class EnvConfig:
    id: str = _f("HalfCheetah-v5", "gymnasium env id, or module:callable / module:EnvId for a user's own env")
    num_envs: int = _f(8, "E: envs per actor, one rollout each per slot")
    rollout_length: int = _f(64, "T: env steps per rollout")
    max_episode_steps: int = _f(0, "episode step limit (TimeLimit, truncation); 0: the env's own")
    module: str = _f("", "Python module imported before the env is made (it registers the env id); '': none")


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = _f((64, 64), "hidden layer widths of the policy and value MLPs")
    activation: str = _f("tanh", "hidden activation: tanh, relu or elu")
    init_log_std: float = _f(-0.5, "initial log-std of the Gaussian policy (std 0.61: see configs/default.toml for why)")
    normalize_obs: bool = _f(True, "normalise observations by running mean and std (learner-updated, shipped with the weights)")
    obs_clip: float = _f(10.0, "clip normalised observations to +-this")


@dataclass(frozen=True)
class AlgoConfig:
    # Preset: which advantage estimator and policy loss (VACO.md table). arXiv:2603.01365.
    preset: str = _f("vaco", "advantage estimator and policy loss: " + ", ".join(PRESETS) + "; llm tasks: "
                             + ", ".join(LLM_PRESETS))
    gamma: float = _f(0.99, "discount factor")
    gae_lambda: float = _f(0.95, "lambda of GAE / V-trace traces")
    rho_bar: float = _f(1.0, "V-trace clip of the importance weight in the value targets")
    c_bar: float = _f(1.0, "V-trace clip of the trace coefficients")
    traces: str = _f("uncorrected", "trace coefficients of the realigned advantages: vtrace (c_t = lambda min(c_bar, rho_t)) or uncorrected (c_t = lambda; the TD errors keep their rho_bar-clipped weights)")
    value_targets: str = _f("auto", "critic regression target: auto (the preset's: V-trace's vs where the advantages are realigned, GAE's lambda-returns otherwise), vtrace or lambda_returns (any preset but impala)")
    realign_min_lag: int = _f(0, "realigning presets, control task: realign only the samples at least this many versions behind the learner; the others get GAE on beta's data (and lambda-return targets under value_targets auto), as vaco_no_realign; 0: every sample")
    realign_from_version: int = _f(125, "realigning presets but impala, control task: before the learner reaches this policy version, no sample is realigned (GAE on beta's data and lambda-return targets under value_targets auto, as vaco_no_realign); 0: from the first iteration (vaco_paper; the llm task has no such option); 125: about 256k env steps at the default batch (see configs/default.toml)")
    tv_threshold: float = _f(0.2, "delta of the TV filter: samples of a minibatch over this TV budget get no gradient")
    ratio_anchor: str = _f("learning", "policy-ratio anchor of the TV filter: learning (pi_T, the default) or behavior (beta, the paper's reading)")
    surrogate_rho_bar: float = _f(1.0, "bound on the importance weight pi_T/beta in the surrogate (learning anchor); inf: none")
    tv_filter_trigger: str = _f("minibatch", "when the TV filter acts: minibatch (each minibatch over delta) or iteration (from the first one on)")
    tv_filter_min_deviation: float = _f(0.0, "the TV filter's sign rule applies only to samples with |r - 1| above this")
    behavior_band: float = _f(0.2, "vaco: also detach samples whose pi_theta/beta left [1-band, 1+band] in the direction of their advantage (PPO-clip's mask, per sample); inf: off")
    behavior_band_ratio: str = _f("forward", "which ratio behavior_band bounds: forward (pi_theta/anchor: pi_theta/pi_T with the learning anchor, decoupled PPO's clip), full (pi_theta/beta, PPO's clip) or backward (pi_T/beta, fixed per iteration; learning anchor only)")
    tv_filter_ratio_cap: float = _f(float("inf"), "the sign rule also applies, whatever the TV estimate, to samples with |r - 1| above this; inf: never")
    clip_eps: float = _f(0.2, "ppo: ratio clip epsilon")
    kl_coef: float = _f(1.0, "ppo_kl: KL penalty coefficient")
    spo_eps: float = _f(0.2, "spo: ratio epsilon")
    value_coef: float = _f(0.5, "value-loss weight")
    entropy_coef: float = _f(0.0, "entropy-bonus weight")
    normalize_advantages: bool = _f(True, "normalise advantages per minibatch")
    num_epochs: int = _f(10, "epochs over each batch")
    num_minibatches: int = _f(8, "minibatches per epoch (8 of 256: see configs/default.toml for why)")
    lr: float = _f(3e-4, "Adam learning rate")
    anneal_lr: bool = _f(True, "anneal the learning rate linearly to 0 over run.total_env_steps")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    max_grad_norm: float = _f(0.5, "clip the gradient norm to this")


@dataclass(frozen=True)
class ActorConfig:
    # Lag controls for experiments (asyncrl.lag_control); 0 / 1 / 0.0: none.
    policy_delay: int = _f(0, "act with the weights K versions behind the newest received")
    policy_age_buffer: int = _f(1, "each rollout acts with a version drawn uniformly from the last K received")
    slowdown_s: float = _f(0.0, "a straggler: each rollout takes this many seconds longer (actor processes)")
    rollout_transport: str = _f("auto", "auto (shared memory if the learner's segment attaches, else TCP), shm or tcp")
    device: str = _f("cpu", "llm generator actors: where the model samples, cpu, cuda or cuda:N (float32; control "
                            "actors act with numpy: cpu only)")


@dataclass(frozen=True)
class LearnerConfig:
    slots_per_batch: int = _f(4, "B: slots of E rollouts per batch ([T, B*E])")
    num_slots: int = _f(12, "S: slots in the shared-memory ring")
    max_policy_lag: int = _f(-1, "drop samples more versions behind than this; -1: keep all")
    reward_scaling: bool = _f(True, "divide rewards by the running std of the discounted return, per env stream")
    reward_clip: float = _f(10.0, "clip scaled rewards to +-this")
    checkpoint_every: int = _f(50, "learner iterations between checkpoints; 0: only at the end")
    keep_checkpoints: int = _f(3, "checkpoints kept (checkpoint.pt, checkpoint.1.pt, ...); a corrupt newest one falls back to the next")
    max_consecutive_skips: int = _f(20, "optimizer steps skipped in a row (non-finite loss or gradient) before the run fails")
    torch_threads: int = _f(1, "torch threads of the learner")
    device: str = _f("cpu", "where the learner's policy, optimizer and batches live: cpu, cuda or cuda:N")
    precision: str = _f("fp32", "learner forward passes: fp32, or bf16 (autocast of the network forwards; "
                                "log-probs, losses, gradients and weights stay float32; see asyncrl/device.py)")


@dataclass(frozen=True)
class TransportConfig:
    learner_bind: str = _f("tcp://127.0.0.1:5555", "learner ROUTER address: hello, grants, reports, heartbeats")
    broadcaster_bind: str = _f("tcp://127.0.0.1:5556", "broadcaster PUB address; its snapshot ROUTER takes the next port")
    heartbeat_s: float = _f(1.0, "seconds between actor heartbeats")
    actor_timeout_s: float = _f(10.0, "seconds of silence after which learner and actor give each other up")
    rejoin_timeout_s: float = _f(60.0, "seconds an actor whose learner ended its session (restarted, or dropped it) "
                                       "keeps saying hello before it gives up")
    grant_lease_s: float = _f(0.0, "seconds a granted slot may go unreported before the learner takes it back (the "
                                   "slot generation stops its writer); 0: derived, 6 x actor_timeout_s or 4 x the "
                                   "slowest report interval seen, whichever is longer")


@dataclass(frozen=True)
class RunConfig:
    seed: int = _f(1, "run seed (nets, actors' envs and actions)")
    total_env_steps: int = _f(1_000_000, "env-step budget (consumed by the learner)")
    num_actors: int = _f(2, "actor processes (serial mode: actor env groups)")
    straggler_slowdown_s: float = _f(0.0, "asyncrl run: actor0 alone is slowed by this many seconds per rollout")
    run_dir: str = _f("runs", "parent directory of the default run directory")
    log_every_s: float = _f(5.0, "seconds between progress lines and lag-histogram windows")
    eval_every: int = _f(0, "env steps between evaluations (mean action, separate env and seed) in metrics.jsonl; 0: none")
    eval_episodes: int = _f(5, "episodes per periodic evaluation")
    max_restarts: int = _f(3, "asyncrl run: restarts of each role (actor, broadcaster, learner) within "
                              "run.restart_window_s before the next death fails the run")
    restart_backoff_s: float = _f(1.0, "asyncrl run: seconds before a role's first restart, doubled for each next one "
                                       "within run.restart_window_s")
    launcher: str = _f("local", "asyncrl run: who starts and restarts the roles: local (this host's supervisor) or "
                                "ray (a Ray cluster; the extra asyncrl[ray])")
    ray_address: str = _f("", "asyncrl run --launcher ray: the cluster to join, e.g. 10.0.0.1:6379 ('': start a "
                              "local one for the run)")
    restart_window_s: float = _f(60.0, "asyncrl run: only restarts this recent count against run.max_restarts "
                                       "and the backoff (a role that stays up this long is healthy again); 0: all count")


@dataclass(frozen=True)
class TaskConfig:
    kind: str = _f("control", "task kind the roles carry: control (gymnasium envs, [env] and [policy]) or llm "
                              "(a causal language model on GSM8k-format math; the keys below)")
    model: str = _f("", "llm: Hugging Face causal-LM directory to start from (loaded with local_files_only); '': the "
                        "tiny model `asyncrl llm prepare` makes, cached in task.cache_dir")
    cache_dir: str = _f("runs/llm", "llm: where the prepared tiny model and its warm-ups are cached")
    model_seed: int = _f(0, "llm: seed of the tiny model, its warm-up and the train / held-out problems (run.seed "
                            "seeds RL only)")
    warmup_steps: int = _f(LLM_WARMUP_STEPS, "llm: supervised warm-up steps before RL (asyncrl llm warmup; cached); 0: none")
    warmup_batch_size: int = _f(LLM_WARMUP_BATCH, "llm: problems per supervised warm-up step")
    warmup_threads: int = _f(LLM_WARMUP_THREADS, "llm: torch threads of the supervised warm-up, fixed so that the start model does not "
                                "depend on the machine's cores or OMP_NUM_THREADS (float sums change order with the "
                                "thread count and the warm-up amplifies it); 0: torch's default")
    warmup_target: float = _f(0.0, "llm: end the supervised warm-up early at the first check (every 100 steps from half of "
                                   "task.warmup_steps on) where its "
                                   "greedy accuracy on 200 validation problems (generated after the train split: in "
                                   "neither train nor held-out) reaches this; task.warmup_steps stays the budget; 0: off")
    group_size: int = _f(8, "llm: G, completions sampled per prompt (a group)")
    prompts_per_slot: int = _f(4, "llm: prompts per slot: a slot holds whole groups, prompts_per_slot * G rows")
    max_prompt_tokens: int = _f(96, "llm: prompt width in a slot (left-padded); a longer prompt is an error")
    max_new_tokens: int = _f(160, "llm: completion width in a slot and generation budget (sampling and evaluation)")
    temperature: float = _f(1.0, "llm: sampling temperature of the generators (the learner's log-probs use it too)")
    train_problems: int = _f(20000, "llm: generated train problems the generators draw prompts from")
    eval_size: int = _f(500, "llm: held-out problems of the evaluation before and after RL; 0: none")
    eval_batch_size: int = _f(64, "llm: prompts per generation batch of the held-out evaluation (a larger batch "
                                  "amortises each decoding step's fixed cost: 1.34x at 512 on the tiny model, "
                                  "docs/llm-rl.md; its KV cache grows with it)")
    eval_mode: str = _f("sampled", "llm: the held-out evaluation: sampled (one completion per problem at task.temperature, "
                                   "the same draws before and after RL: seeded by task.model_seed) or greedy (argmax)")
    averaging: str = _f("token", "llm: loss average over tokens: token (DAPO), sequence (GRPO) or constant (Dr. GRPO)")
    scale_by_std: bool = _f(True, "llm: divide group-centred rewards by the group's std (GRPO); false: Dr. GRPO")
    truncated_reward: str = _f("score", "llm: a completion cut at max_new_tokens (no EOS): score (its '####' line "
                                        "scored like any other) or zero (reward 0 whatever it wrote)")
    realign: str = _f("none", "llm: advantage realignment without a critic: none (baseline = the group's mean reward, "
                              "an estimate under beta) or is_baseline (the group's mean weighted by min(algo.rho_bar, "
                              "pi_T/beta) per completion: a baseline of pi_T; docs/llm-realignment.md)")
    silent_groups: str = _f("drop", "llm: groups whose G rewards are equal (zero advantage): drop (removed before the "
                                    "minibatches, as DAPO's dynamic sampling; num_minibatches splits the rest), skip "
                                    "(kept, but a minibatch without an advantage or a KL term does not step the "
                                    "optimizer) or step (kept: a minibatch of them alone still steps Adam on its "
                                    "momentum; docs/llm-rl.md)")
    kl_coef: float = _f(0.0, "llm: weight of the per-token k3 KL(pi_theta || start model) penalty (DeepSeekMath GRPO); "
                             "0: off, and the learner holds no reference model")
    negative_weight: float = _f(1.0, "llm: factor on negative advantages after group normalisation: 1 is GRPO, 0 "
                                     "keeps the positive (above-group-mean) completions only (positive-sample "
                                     "reinforcement, arXiv:2506.01347; docs/llm-rl.md)")


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        """Samples per learner iteration: env steps T * B * E (control), completions
        prompts_per_slot * G * B (llm)."""
        if self.task.kind == "llm":
            return self.task.prompts_per_slot * self.task.group_size * self.learner.slots_per_batch
        return self.env.rollout_length * self.learner.slots_per_batch * self.env.num_envs


def _section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return tuple(_coerce(f"{where}[{i}]", v, elem) for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{where}: unsupported annotation {annotation}")  # not used
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported annotation {annotation}")


def preset_settings(preset: str, task_kind: str) -> dict[str, Any]:
    """The [algo] settings a preset (and the task kind) pins unless the config names them itself:
    PRESET_SETTINGS, plus realign_from_version = 0 for task.kind llm (a control-task option, which
    the llm task refuses when set)."""
    out = dict(PRESET_SETTINGS.get(preset, {}))
    if task_kind == "llm":
        out.setdefault("realign_from_version", 0)
    return out


def _build(data: dict[str, Any]) -> Config:
    sections = _section_types()
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"unknown config section [{unknown[0]}]; sections are {sorted(sections)}")
    built = {}
    for name, cls in sections.items():
        raw = data.get(name, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"[{name}] must be a table, got {raw!r}")
        hints = typing.get_type_hints(cls)
        bad = sorted(set(raw) - set(hints))
        if bad:
            raise ConfigError(f"unknown config key {name}.{bad[0]}; keys of [{name}] are {sorted(hints)}")
        kwargs = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in raw.items()}
        if name == "algo":
            task = data.get("task") if isinstance(data.get("task"), dict) else {}
            for k, v in preset_settings(kwargs.get("preset", cls.preset), task.get("kind", "control")).items():
                kwargs.setdefault(k, v)
        built[name] = cls(**kwargs)
    cfg = Config(**built)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the first problem."""
    a, e, l = cfg.algo, cfg.env, cfg.learner
    if a.preset not in PRESETS + ("grpo",):
        raise ConfigError(f"unknown preset algo.preset={a.preset!r}; presets are {', '.join(PRESETS)} "
                          f"(task.kind = llm: {', '.join(LLM_PRESETS)})")
    _validate_task(cfg)
    if a.ratio_anchor not in RATIO_ANCHORS:
        raise ConfigError(f"algo.ratio_anchor must be one of {RATIO_ANCHORS}, got {a.ratio_anchor!r}")
    if a.traces not in TRACES:
        raise ConfigError(f"algo.traces must be one of {TRACES}, got {a.traces!r}")
    if a.value_targets not in VALUE_TARGETS:
        raise ConfigError(f"algo.value_targets must be one of {VALUE_TARGETS}, got {a.value_targets!r}")
    if a.value_targets != "auto" and a.preset == "impala":
        raise ConfigError("algo.value_targets must be auto for impala (it recomputes V-trace targets every step)")
    if a.tv_filter_trigger not in FILTER_TRIGGERS:
        raise ConfigError(f"algo.tv_filter_trigger must be one of {FILTER_TRIGGERS}, got {a.tv_filter_trigger!r}")
    if not 0.0 <= a.tv_filter_min_deviation < float("inf"):
        raise ConfigError(f"algo.tv_filter_min_deviation must be a finite number >= 0, got {a.tv_filter_min_deviation}")
    if not a.tv_filter_ratio_cap > a.tv_filter_min_deviation:
        raise ConfigError(f"algo.tv_filter_ratio_cap must be > algo.tv_filter_min_deviation, got {a.tv_filter_ratio_cap}")
    if not a.behavior_band > 0:
        raise ConfigError(f"algo.behavior_band must be > 0 (inf: off), got {a.behavior_band}")
    if a.behavior_band_ratio not in BAND_RATIOS:
        raise ConfigError(f"algo.behavior_band_ratio must be one of {BAND_RATIOS}, got {a.behavior_band_ratio!r}")
    if a.behavior_band_ratio == "backward" and a.ratio_anchor != "learning":
        raise ConfigError("algo.behavior_band_ratio = backward bounds pi_T/beta and needs algo.ratio_anchor = learning")
    if not a.surrogate_rho_bar > 0:
        raise ConfigError(f"algo.surrogate_rho_bar must be > 0 (inf: no bound), got {a.surrogate_rho_bar}")
    if cfg.policy.activation not in ("tanh", "relu", "elu"):
        raise ConfigError(f"policy.activation must be tanh, relu or elu, got {cfg.policy.activation!r}")
    positive = {"env.num_envs": e.num_envs, "env.rollout_length": e.rollout_length,
                "learner.slots_per_batch": l.slots_per_batch, "learner.num_slots": l.num_slots,
                "algo.num_epochs": a.num_epochs, "algo.num_minibatches": a.num_minibatches,
                "run.num_actors": cfg.run.num_actors, "run.total_env_steps": cfg.run.total_env_steps}
    for k, v in positive.items():
        if v < 1:
            raise ConfigError(f"{k} must be >= 1, got {v}")
    if not 0.0 <= a.gamma <= 1.0 or not 0.0 <= a.gae_lambda <= 1.0:
        raise ConfigError(f"algo.gamma and algo.gae_lambda must lie in [0, 1], got {a.gamma}, {a.gae_lambda}")
    for key, value, low in (("actor.policy_delay", cfg.actor.policy_delay, 0),
                            ("actor.policy_age_buffer", cfg.actor.policy_age_buffer, 1),
                            ("actor.slowdown_s", cfg.actor.slowdown_s, 0), ("env.max_episode_steps", e.max_episode_steps, 0),
                            ("run.straggler_slowdown_s", cfg.run.straggler_slowdown_s, 0),
                            ("run.seed", cfg.run.seed, 0), ("algo.realign_min_lag", a.realign_min_lag, 0),
                            ("algo.realign_from_version", a.realign_from_version, 0),
                            ("learner.max_consecutive_skips", l.max_consecutive_skips, 0),
                            ("learner.keep_checkpoints", l.keep_checkpoints, 1),
                            ("run.max_restarts", cfg.run.max_restarts, 0),
                            ("run.restart_backoff_s", cfg.run.restart_backoff_s, 0),
                            ("run.restart_window_s", cfg.run.restart_window_s, 0)):
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}")
    if cfg.run.launcher not in LAUNCHERS:
        raise ConfigError(f"run.launcher must be one of {', '.join(LAUNCHERS)}, got {cfg.run.launcher!r}")
    if cfg.actor.rollout_transport not in ROLLOUT_TRANSPORTS:
        raise ConfigError(f"actor.rollout_transport must be one of {', '.join(ROLLOUT_TRANSPORTS)}, "
                          f"got {cfg.actor.rollout_transport!r}")
    _validate_device(cfg)
    if cfg.actor.policy_delay > 0 and cfg.actor.policy_age_buffer > 1:
        raise ConfigError("set actor.policy_delay or actor.policy_age_buffer, not both")
    if cfg.run.eval_every < 0 or cfg.run.eval_episodes < 1:
        raise ConfigError(f"run.eval_every must be >= 0 and run.eval_episodes >= 1, got "
                          f"{cfg.run.eval_every}, {cfg.run.eval_episodes}")
    if not 0 < a.lr < float("inf"):
        raise ConfigError(f"algo.lr must be a finite number > 0, got {a.lr}")
    if l.num_slots < l.slots_per_batch:
        raise ConfigError(f"learner.num_slots ({l.num_slots}) must be >= learner.slots_per_batch ({l.slots_per_batch})")
    if cfg.batch_size % a.num_minibatches:
        what = "prompts_per_slot*G*B" if cfg.task.kind == "llm" else "T*B*E"
        raise ConfigError(f"batch size {what} = {cfg.batch_size} is not divisible by algo.num_minibatches={a.num_minibatches}")
    from .transport import MAX_STR_BYTES   # the learner's welcome carries this config to every actor
    n = len(json.dumps(cfg.to_dict()).encode())
    if n > MAX_STR_BYTES:
        raise ConfigError(f"the config is {n:,} bytes as JSON, over the {MAX_STR_BYTES:,} a welcome message carries "
                          f"to actors; shorten its strings (run.run_dir, env.id, env.module)")


def _validate_device(cfg: Config) -> None:
    """The names only: whether this machine has the device is asyncrl.device.check_device's question
    (asked where the learner or a generator starts, so a GPU run's config still loads elsewhere)."""
    for key, value in (("learner.device", cfg.learner.device), ("actor.device", cfg.actor.device)):
        if not DEVICE_RE.fullmatch(value):
            raise ConfigError(f"{key} must be cpu, cuda or cuda:N, got {value!r}")
    if cfg.learner.precision not in PRECISIONS:
        raise ConfigError(f"learner.precision must be one of {', '.join(PRECISIONS)}, got {cfg.learner.precision!r}")
    if cfg.actor.device != "cpu" and cfg.task.kind == "control":
        raise ConfigError(f"actor.device = {cfg.actor.device}: control actors act with numpy on the CPU; "
                          f"actor.device is for task.kind = llm")


def _validate_task(cfg: Config) -> None:
    t, preset = cfg.task, cfg.algo.preset
    if t.kind not in TASK_KINDS:
        raise ConfigError(f"task.kind must be one of {', '.join(TASK_KINDS)}, got {t.kind!r}")
    if t.kind == "control":
        if preset == "grpo":
            raise ConfigError("algo.preset = grpo is for task.kind = llm (control tasks: ppo is PPO-clip)")
        return
    if preset not in LLM_PRESETS:
        raise ConfigError(f"task.kind = llm takes algo.preset {', '.join(LLM_PRESETS)}, got {preset!r}")
    if cfg.algo.value_targets != "auto" or cfg.algo.realign_min_lag != 0 or cfg.algo.realign_from_version != 0:
        raise ConfigError("algo.value_targets, algo.realign_min_lag and algo.realign_from_version are control-task "
                          "options (a critic's target, V-trace per sample); task.kind = llm has no critic: its "
                          "realignment is task.realign")
    if t.averaging not in LLM_AVERAGING:
        raise ConfigError(f"task.averaging must be one of {', '.join(LLM_AVERAGING)}, got {t.averaging!r}")
    if t.truncated_reward not in LLM_TRUNCATED_REWARD:
        raise ConfigError(f"task.truncated_reward must be one of {', '.join(LLM_TRUNCATED_REWARD)}, "
                          f"got {t.truncated_reward!r}")
    if t.silent_groups not in LLM_SILENT_GROUPS:
        raise ConfigError(f"task.silent_groups must be one of {', '.join(LLM_SILENT_GROUPS)}, got {t.silent_groups!r}")
    if t.eval_mode not in LLM_EVAL_MODES:
        raise ConfigError(f"task.eval_mode must be one of {', '.join(LLM_EVAL_MODES)}, got {t.eval_mode!r}")
    if t.realign not in LLM_REALIGN:
        raise ConfigError(f"task.realign must be one of {', '.join(LLM_REALIGN)}, got {t.realign!r}")
    if t.realign != "none" and not cfg.algo.rho_bar > 0:
        raise ConfigError(f"task.realign = {t.realign} truncates the sequence weights at algo.rho_bar, which must be "
                          f"> 0 (inf: none), got {cfg.algo.rho_bar}")
    if not 0 <= t.kl_coef < float("inf"):
        raise ConfigError(f"task.kl_coef must be a finite number >= 0, got {t.kl_coef}")
    if not 0 <= t.negative_weight < float("inf"):
        raise ConfigError(f"task.negative_weight must be a finite number >= 0, got {t.negative_weight}")
    for key in ("group_size", "prompts_per_slot", "max_prompt_tokens", "max_new_tokens", "train_problems",
                "warmup_batch_size", "eval_batch_size"):
        if getattr(t, key) < 1:
            raise ConfigError(f"task.{key} must be >= 1, got {getattr(t, key)}")
    for key in ("warmup_steps", "eval_size", "model_seed", "warmup_threads"):
        if getattr(t, key) < 0:
            raise ConfigError(f"task.{key} must be >= 0, got {getattr(t, key)}")
    if not 0 <= t.warmup_target <= 1:
        raise ConfigError(f"task.warmup_target must be an accuracy in [0, 1], got {t.warmup_target}")
    if not 0 < t.temperature < float("inf"):
        raise ConfigError(f"task.temperature must be a finite number > 0, got {t.temperature}")


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is parsed as a TOML value,
    falling back to a bare string (so ``env.id=Hopper-v5`` works without quotes)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    lhs, rhs = text.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {rhs}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs
    return section, key, value


def load(path: str | Path | None = None, overrides: typing.Iterable[str] = (),
         extra: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load a Config: defaults <- TOML file (or a run directory's config.json) <- ``extra`` (CLI flags) <- ``--set`` overrides.

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown section/key, wrong type, or a
            failed cross-field check.
    """
    data: dict[str, dict[str, Any]] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
            data = json.loads(text) if str(path).endswith(".json") else tomllib.loads(text)
            if str(path).endswith(".json") and isinstance(data, dict):
                data.pop("provenance", None)   # a run directory's config.json records where it ran
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: invalid {'JSON' if str(path).endswith('.json') else 'TOML'}: {exc}") from None
    for section, values in (extra or {}).items():
        data.setdefault(section, {}).update(values)
    for text in overrides:
        section, key, value = parse_override(text)
        if not isinstance(data.setdefault(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table")
        data[section][key] = value
    return _build(data)


def from_dict(data: dict[str, dict[str, Any]]) -> Config:
    """Rebuild a Config from ``Config.to_dict()`` output (e.g. a run directory's config.json)."""
    return _build({s: dict(v) for s, v in data.items() if s != "provenance"})


# ---- describing the config: `asyncrl config show` ----

class KeyInfo(typing.NamedTuple):
    section: str
    key: str
    value: Any      # the resolved value
    default: Any    # the dataclass default
    help: str       # one-line meaning (field metadata)


def describe(cfg: Config | None = None) -> list[KeyInfo]:
    """Every key of ``cfg`` (default: the defaults) with its default and one-line meaning, in
    section order. Raises ConfigError if a field lacks its help text (a test keeps them all)."""
    cfg = cfg or Config()
    out = []
    for sec in dataclasses.fields(Config):
        values = getattr(cfg, sec.name)
        for f in dataclasses.fields(values):
            if not f.metadata.get("help"):
                raise ConfigError(f"config key {sec.name}.{f.name} has no help text in asyncrl/config.py")
            out.append(KeyInfo(sec.name, f.name, getattr(values, f.name), f.default, f.metadata["help"]))
    return out


def toml_value(value: Any) -> str:
    """A config value as TOML text (strings quoted, booleans lower-case, inf as inf, tuples as lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if value == float("inf") else "-inf" if value == float("-inf") else repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def to_toml(cfg: Config, *, with_help: bool = True) -> str:
    """The resolved config as TOML that :func:`load` reads back; with ``with_help``, each key is
    preceded by a comment line with its meaning and its default (marked when the value differs)."""
    lines: list[str] = []
    section = None
    for k in describe(cfg):
        if k.section != section:
            lines += ([""] if lines else []) + [f"[{k.section}]"]
            section = k.section
        if with_help:
            changed = "" if k.value == k.default else "; CHANGED"
            lines.append(f"# {k.help} (default {toml_value(k.default)}{changed})")
        lines.append(f"{k.key} = {toml_value(k.value)}")
    return "\n".join(lines) + "\n"
