"""Configuration: frozen dataclasses per concern, loaded from TOML plus ``--set a.b=v`` overrides.

Defaults live here (the single source of truth); ``configs/default.toml`` lists those that no
preset or task kind sets, and is checked against this module by a test. Precedence, lowest first:
built-in defaults < task-kind settings < preset pins < what the user set (:func:`resolve`); a user
value that replaces a pin, or that the chosen preset or task kind does not use, is reported.
Every unknown section or key, every value of the wrong type and every unknown preset raises
:class:`ConfigError` with one line naming it.
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
from typing import Any, Callable

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
LLM_SILENT_GROUPS = ("step", "skip", "drop")   # docs/llm.md
LLM_EVAL_MODES = ("sampled", "greedy")   # docs/llm.md
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


def _f(default: Any, help: str, *, presets: tuple[str, ...] | None = None, kinds: tuple[str, ...] = TASK_KINDS,
       when: tuple[str, Callable[["Config"], bool]] | None = None) -> Any:
    """A config field with its one-line meaning (``asyncrl config show`` prints it) and who uses it:
    ``presets`` (None: every preset of its task kinds), ``kinds`` (task kinds) and, where a field
    matters only next to another value, ``when`` = (that condition in words, predicate on the Config).
    A value set for a preset or task kind that does not use it is reported (:func:`unused_keys`)."""
    return field(default=default, metadata={"help": help, "presets": presets, "kinds": kinds, "when": when})


CONTROL, LLM = ("control",), ("llm",)
VACO_FAMILY = ("vaco", "vaco_paper", "vaco_no_realign", "vaco_no_filter")   # vaco's surrogate
TV_FILTERED = ("vaco", "vaco_paper", "vaco_no_realign")                     # ... with the TV filter
REALIGNING = ("vaco", "vaco_paper", "vaco_no_filter")                       # realigned advantages (not impala)
VTRACE_PRESETS = REALIGNING + ("impala",)                                   # compute V-trace every iteration
NOT_IMPALA = tuple(p for p in PRESETS + ("grpo",) if p != "impala")


def _computes_vtrace(c: "Config") -> bool:
    return c.task.kind == "control" and (c.algo.preset in VTRACE_PRESETS or c.algo.value_targets == "vtrace")


def _uses_rho_bar(c: "Config") -> bool:
    return _computes_vtrace(c) or (c.task.kind == "llm" and c.task.realign != "none")


@dataclass(frozen=True)
class EnvConfig:
    id: str = _f("HalfCheetah-v5", "gymnasium env id, or module:callable / module:EnvId for a user's own env", kinds=CONTROL)
    num_envs: int = _f(8, "E: envs per actor, one rollout each per slot", kinds=CONTROL)
    rollout_length: int = _f(64, "T: env steps per rollout", kinds=CONTROL)
    max_episode_steps: int = _f(0, "episode step limit (TimeLimit, truncation); 0: the env's own", kinds=CONTROL)
    module: str = _f("", "Python module imported before the env is made (it registers the env id); '': none", kinds=CONTROL)


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = _f((64, 64), "hidden layer widths of the policy and value MLPs", kinds=CONTROL)
    activation: str = _f("tanh", "hidden activation: tanh, relu or elu", kinds=CONTROL)
    init_log_std: float = _f(-0.5, "initial log-std of the Gaussian policy (std 0.61: docs/decisions/init-log-std.md)", kinds=CONTROL)
    normalize_obs: bool = _f(True, "normalise observations by running mean and std (learner-updated, shipped with the weights)", kinds=CONTROL)
    obs_clip: float = _f(10.0, "clip normalised observations to +-this", kinds=CONTROL)


@dataclass(frozen=True)
class AlgoConfig:
    # Preset: which advantage estimator and policy loss (VACO.md table). arXiv:2603.01365.
    preset: str = _f("vaco", "advantage estimator and policy loss: " + ", ".join(PRESETS) + "; llm tasks: "
                             + ", ".join(LLM_PRESETS))
    gamma: float = _f(0.99, "discount factor", kinds=CONTROL)
    gae_lambda: float = _f(0.95, "lambda of GAE / V-trace traces", kinds=CONTROL)
    rho_bar: float = _f(1.0, "V-trace clip of the importance weight in the value targets", when=("V-trace is computed (vtrace presets or value_targets = vtrace), or the llm task.realign = is_baseline", _uses_rho_bar))
    c_bar: float = _f(1.0, "V-trace clip of the trace coefficients", kinds=CONTROL, when=("V-trace is computed with traces = vtrace", lambda c: _computes_vtrace(c) and c.algo.traces == "vtrace"))
    traces: str = _f("uncorrected", "trace coefficients of the realigned advantages: vtrace (c_t = lambda min(c_bar, rho_t)) or uncorrected (c_t = lambda; the TD errors keep their rho_bar-clipped weights)", kinds=CONTROL, when=("V-trace is computed (vtrace presets or value_targets = vtrace)", _computes_vtrace))
    value_targets: str = _f("auto", "critic regression target: auto (the preset's: V-trace's vs where the advantages are realigned, GAE's lambda-returns otherwise), vtrace or lambda_returns (any preset but impala)", kinds=CONTROL, presets=NOT_IMPALA)
    realign_min_lag: int = _f(0, "realigning presets, control task: realign only the samples at least this many versions behind the learner; the others get GAE on beta's data (and lambda-return targets under value_targets auto), as vaco_no_realign; 0: every sample", kinds=CONTROL, presets=REALIGNING)
    realign_from_version: int = _f(125, "realigning presets but impala, control task: before the learner reaches this policy version, no sample is realigned (GAE on beta's data and lambda-return targets under value_targets auto, as vaco_no_realign); 0: from the first iteration (vaco_paper; the llm task has no such option); 125: about 256k env steps at the default batch (docs/decisions/realign-from-version.md)", kinds=CONTROL, presets=REALIGNING)
    tv_threshold: float = _f(0.2, "delta of the TV filter: samples of a minibatch over this TV budget get no gradient", presets=TV_FILTERED)
    ratio_anchor: str = _f("learning", "policy-ratio anchor of the TV filter: learning (pi_T, the default) or behavior (beta, the paper's reading)", presets=VACO_FAMILY)
    surrogate_rho_bar: float = _f(1.0, "bound on the importance weight pi_T/beta in the surrogate (learning anchor); inf: none", presets=VACO_FAMILY, when=("ratio_anchor = learning", lambda c: c.algo.ratio_anchor == "learning"))
    tv_filter_trigger: str = _f("minibatch", "when the TV filter acts: minibatch (each minibatch over delta) or iteration (from the first one on)", presets=TV_FILTERED)
    tv_filter_min_deviation: float = _f(0.0, "the TV filter's sign rule applies only to samples with |r - 1| above this", presets=TV_FILTERED)
    behavior_band: float = _f(0.2, "vaco: also detach samples whose pi_theta/beta left [1-band, 1+band] in the direction of their advantage (PPO-clip's mask, per sample); inf: off", presets=VACO_FAMILY)
    behavior_band_ratio: str = _f("forward", "which ratio behavior_band bounds: forward (pi_theta/anchor: pi_theta/pi_T with the learning anchor, decoupled PPO's clip), full (pi_theta/beta, PPO's clip) or backward (pi_T/beta, fixed per iteration; learning anchor only)", presets=VACO_FAMILY, when=("behavior_band < inf", lambda c: c.algo.behavior_band < float("inf")))
    tv_filter_ratio_cap: float = _f(float("inf"), "the sign rule also applies, whatever the TV estimate, to samples with |r - 1| above this; inf: never", presets=TV_FILTERED)
    clip_eps: float = _f(0.2, "ppo: ratio clip epsilon", presets=("ppo", "grpo"))
    kl_coef: float = _f(1.0, "ppo_kl: KL penalty coefficient", presets=("ppo_kl",))
    spo_eps: float = _f(0.2, "spo: ratio epsilon", presets=("spo",))
    value_coef: float = _f(0.5, "value-loss weight", kinds=CONTROL)
    entropy_coef: float = _f(0.0, "entropy-bonus weight", kinds=CONTROL)
    normalize_advantages: bool = _f(True, "normalise advantages per minibatch", kinds=CONTROL, presets=NOT_IMPALA)
    num_epochs: int = _f(10, "epochs over each batch", presets=NOT_IMPALA)
    num_minibatches: int = _f(8, "minibatches per epoch (8 of 256: docs/decisions/minibatches.md)")
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
                            "actors act with numpy: cpu only)", kinds=LLM)


@dataclass(frozen=True)
class LearnerConfig:
    slots_per_batch: int = _f(4, "B: slots of E rollouts per batch ([T, B*E])")
    num_slots: int = _f(12, "S: slots in the shared-memory ring")
    max_policy_lag: int = _f(-1, "drop samples more versions behind than this; -1: keep all")
    reward_scaling: bool = _f(True, "divide rewards by the running std of the discounted return, per env stream", kinds=CONTROL)
    reward_clip: float = _f(10.0, "clip scaled rewards to +-this", kinds=CONTROL)
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
    eval_every: int = _f(0, "env steps between evaluations (mean action, separate env and seed) in metrics.jsonl; 0: none", kinds=CONTROL)
    eval_episodes: int = _f(5, "episodes per periodic evaluation", kinds=CONTROL)
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
                        "tiny model `asyncrl llm prepare` makes, cached in task.cache_dir", kinds=LLM)
    cache_dir: str = _f("runs/llm", "llm: where the prepared tiny model and its warm-ups are cached", kinds=LLM)
    model_seed: int = _f(0, "llm: seed of the tiny model, its warm-up and the train / held-out problems (run.seed "
                            "seeds RL only)", kinds=LLM)
    warmup_steps: int = _f(LLM_WARMUP_STEPS, "llm: supervised warm-up steps before RL (asyncrl llm warmup; cached); 0: none", kinds=LLM)
    warmup_batch_size: int = _f(LLM_WARMUP_BATCH, "llm: problems per supervised warm-up step", kinds=LLM)
    warmup_threads: int = _f(LLM_WARMUP_THREADS, "llm: torch threads of the supervised warm-up, fixed so that the start model does not "
                                "depend on the machine's cores or OMP_NUM_THREADS (float sums change order with the "
                                "thread count and the warm-up amplifies it); 0: torch's default", kinds=LLM)
    warmup_target: float = _f(0.0, "llm: end the supervised warm-up early at the first check (every 100 steps from half of "
                                   "task.warmup_steps on) where its "
                                   "greedy accuracy on 200 validation problems (generated after the train split: in "
                                   "neither train nor held-out) reaches this; task.warmup_steps stays the budget; 0: off", kinds=LLM)
    group_size: int = _f(8, "llm: G, completions sampled per prompt (a group)", kinds=LLM)
    prompts_per_slot: int = _f(4, "llm: prompts per slot: a slot holds whole groups, prompts_per_slot * G rows", kinds=LLM)
    max_prompt_tokens: int = _f(96, "llm: prompt width in a slot (left-padded); a longer prompt is an error", kinds=LLM)
    max_new_tokens: int = _f(160, "llm: completion width in a slot and generation budget (sampling and evaluation)", kinds=LLM)
    temperature: float = _f(1.0, "llm: sampling temperature of the generators (the learner's log-probs use it too)", kinds=LLM)
    train_problems: int = _f(20000, "llm: generated train problems the generators draw prompts from", kinds=LLM)
    eval_size: int = _f(500, "llm: held-out problems of the evaluation before and after RL; 0: none", kinds=LLM)
    eval_batch_size: int = _f(64, "llm: prompts per generation batch of the held-out evaluation (a larger batch "
                                  "amortises each decoding step's fixed cost: 1.34x at 512 on the tiny model, "
                                  "docs/llm.md; its KV cache grows with it)", kinds=LLM)
    eval_mode: str = _f("sampled", "llm: the held-out evaluation: sampled (one completion per problem at task.temperature, "
                                   "the same draws before and after RL: seeded by task.model_seed) or greedy (argmax)", kinds=LLM)
    averaging: str = _f("token", "llm: loss average over tokens: token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", kinds=LLM)
    scale_by_std: bool = _f(True, "llm: divide group-centred rewards by the group's std (GRPO); false: Dr. GRPO", kinds=LLM)
    truncated_reward: str = _f("score", "llm: a completion cut at max_new_tokens (no EOS): score (its '####' line "
                                        "scored like any other) or zero (reward 0 whatever it wrote)", kinds=LLM)
    realign: str = _f("none", "llm: advantage realignment without a critic: none (baseline = the group's mean reward, "
                              "an estimate under beta) or is_baseline (the group's mean weighted by min(algo.rho_bar, "
                              "pi_T/beta) per completion: a baseline of pi_T; docs/llm-realignment.md)", kinds=LLM)
    silent_groups: str = _f("drop", "llm: groups whose G rewards are equal (zero advantage): drop (removed before the "
                                    "minibatches, as DAPO's dynamic sampling; num_minibatches splits the rest), skip "
                                    "(kept, but a minibatch without an advantage or a KL term does not step the "
                                    "optimizer) or step (kept: a minibatch of them alone still steps Adam on its "
                                    "momentum; docs/llm.md)", kinds=LLM)
    kl_coef: float = _f(0.0, "llm: weight of the per-token k3 KL(pi_theta || start model) penalty (DeepSeekMath GRPO); "
                             "0: off, and the learner holds no reference model", kinds=LLM)
    negative_weight: float = _f(1.0, "llm: factor on negative advantages after group normalisation: 1 is GRPO, 0 "
                                     "keeps the positive (above-group-mean) completions only (positive-sample "
                                     "reinforcement, arXiv:2506.01347; docs/llm.md)", kinds=LLM)


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
        if isinstance(value, str) and value in ("inf", "-inf"):   # config.json's spelling (asyncrl.metrics.strict_json)
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported annotation {annotation}")


# ---- resolving a config: the layers, and what the user set ----

# Precedence, lowest first (docs/configuration.md): the built-in defaults of the dataclasses above <
# TASK_KIND_SETTINGS[task.kind] < PRESET_SETTINGS[algo.preset] < what the user set (config file, CLI
# flags, --set). A user value that differs from a task-kind or preset value wins and is reported
# (Resolved.overridden); a user value that the preset or task kind does not use is reported too
# (Resolved.unused). A resolved config (a run's config.json) is taken as it is: no layer re-applied.
TASK_KIND_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    # no critic and no time steps: no realignment warm-up; advantages are group-normalised already, and a
    # per-minibatch normalisation of token advantages breaks the group's zero mean and averaging weights
    "llm": {"algo": {"realign_from_version": 0, "normalize_advantages": False}},
}


class Resolved(typing.NamedTuple):
    """A resolved config and how it was resolved.

    config: the Config. user: {section: {key: value}} as the user set them (file, flags, --set).
    source: {"section.key": the layer that set it, "task kind K", "preset P", "user", or "resolved config"
    (taken from a config.json); keys at their built-in default are absent}.
    overridden: lines, one per user value that replaced a task-kind or preset value.
    unused: lines, one per user value (other than the default it would have) that the chosen preset or
    task kind does not use: it has no effect.
    """
    config: "Config"
    user: dict[str, dict[str, Any]]
    source: dict[str, str]
    overridden: list[str]
    unused: list[str]
    recorded: dict[str, Any] | None = None   # the "resolution" a resolved base (config.json) carried

    def notes(self) -> list[str]:
        """The lines to show once at start (overrides first)."""
        return self.overridden + self.unused

    def record(self) -> dict[str, Any]:
        """For config.json's "resolution": what the user set, and the lines above (for a config
        resolved from a config.json: that file's record, with what the user set on top of it)."""
        if self.recorded is not None:
            user = {s: {**self.recorded.get("user", {}).get(s, {}), **kv} for s, kv in self.user.items()}
            return {**self.recorded, "user": {s: kv for s, kv in user.items() if kv}}
        return {"precedence": "built-in < task kind < preset < user",
                "user": {s: kv for s, kv in self.user.items() if kv},
                "overridden": self.overridden, "unused": self.unused}


def _layers(preset: str, kind: str) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    return [(f"task kind {kind}", TASK_KIND_SETTINGS.get(kind, {})),
            (f"preset {preset}", {"algo": PRESET_SETTINGS.get(preset, {})})]


def _check_sections(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``data`` with every section a table of known, type-checked keys; raises ConfigError."""
    sections = _section_types()
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"unknown config section [{unknown[0]}]; sections are {sorted(sections)}")
    out = {}
    for name, cls in sections.items():
        raw = data.get(name, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"[{name}] must be a table, got {raw!r}")
        hints = typing.get_type_hints(cls)
        bad = sorted(set(raw) - set(hints))
        if bad:
            raise ConfigError(f"unknown config key {name}.{bad[0]}; keys of [{name}] are {sorted(hints)}")
        out[name] = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in raw.items()}
    return out


def resolve(user: dict[str, Any], base: dict[str, Any] | None = None, *, check: bool = True,
            recorded: dict[str, Any] | None = None) -> Resolved:
    """Resolve a config from what the user set, by the precedence above.

    Args:
        user: {section: {key: value}}: what a config file, CLI flags and --set name.
        base: a resolved config ({section: {key: value}}, e.g. a run's config.json) taken as it is
            under ``user``, instead of the layers; keys it lacks (older files) come from the layers.
        check: run :func:`validate` (it imports the transport for the welcome's size limit).
        recorded: the "resolution" record that came with ``base`` (kept in :meth:`Resolved.record`).

    Raises:
        ConfigError: unknown section or key, wrong type, a failed cross-field check, or ``user``
            changing algo.preset or task.kind of a resolved ``base`` (its other keys were resolved for
            the old ones).
    """
    user = _check_sections(user)
    base = _check_sections(base) if base is not None else None
    merged = {s: {**(base or {}).get(s, {}), **user[s]} for s in user}
    preset = merged["algo"].get("preset", AlgoConfig.preset)
    kind = merged["task"].get("kind", TaskConfig.kind)
    if base is not None:
        for s, k in (("algo", "preset"), ("task", "kind")):
            if k in user[s] and k in base[s] and user[s][k] != base[s][k]:
                raise ConfigError(f"{s}.{k} cannot change on a resolved config (a run's config.json: its other keys "
                                  f"were resolved for {s}.{k} = {base[s][k]!r}); start from a TOML config file")
    values: dict[str, dict[str, Any]] = {s: {} for s in user}
    source: dict[str, str] = {}
    if base is None:
        for layer, settings in _layers(preset, kind):
            for s, kv in settings.items():
                for k, v in kv.items():
                    values[s][k], source[f"{s}.{k}"] = v, layer
    layered = {s: dict(kv) for s, kv in values.items()}   # what a key is without the user
    overridden = []
    for s, kv in merged.items():
        for k, v in kv.items():
            where = f"{s}.{k}"
            from_user = k in user[s]
            if from_user and where in source and values[s][k] != v:
                overridden.append(f"{where} = {toml_value(v)} overrides {source[where]}'s {toml_value(values[s][k])}")
            if where not in source:
                values[s][k], source[where] = v, "user" if from_user else "resolved config"
            elif from_user and values[s][k] != v:   # a user value equal to the layer's leaves it the source
                values[s][k], source[where] = v, "user"
    cfg = Config(**{s: cls(**values[s]) for s, cls in _section_types().items()})
    if check:
        validate(cfg)
    defaults = Config().to_dict()
    unused = [f"{s}.{k} = {toml_value(v)} has no effect: {why}" for s, kv in user.items() for k, v in kv.items()
              if base is None and v != layered[s].get(k, defaults[s][k])
              for why in [unused_reason(cfg, s, k)] if why]
    if base is not None and recorded is None:
        recorded = {}
    return Resolved(cfg, user, source, overridden, unused, recorded)


def unused_reason(cfg: "Config", section: str, key: str) -> str:
    """'' if ``cfg``'s preset and task kind use ``section.key`` (its field metadata), else why not."""
    f = {f.name: f for f in dataclasses.fields(getattr(cfg, section))}[key]
    kinds, presets, when = f.metadata["kinds"], f.metadata["presets"], f.metadata["when"]
    if cfg.task.kind not in kinds:
        return f"task.kind = {cfg.task.kind} does not use it (used by task kinds: {', '.join(kinds)})"
    if presets is not None and cfg.algo.preset not in presets:
        users = ", ".join(p for p in presets if p in (PRESETS if cfg.task.kind == "control" else LLM_PRESETS))
        return f"preset {cfg.algo.preset} does not use it (used by: {users or 'the other task kind'})"
    if when is not None and not when[1](cfg):
        return f"used only when {when[0]}"
    return ""


def _section_data(path: str | Path) -> tuple[dict[str, Any], bool, dict[str, Any] | None]:
    """(the sections of a TOML config file or a run's config.json, whether it is a resolved config,
    the config.json's "resolution" record or None)."""
    resolved = str(path).endswith(".json")
    try:
        text = Path(path).read_text()
        data = json.loads(text) if resolved else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: invalid {'JSON' if resolved else 'TOML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of config sections")
    record = data.get("resolution") if isinstance(data.get("resolution"), dict) else None
    for k in RUN_RECORD_KEYS:   # a run directory's config.json records where it ran and how it was resolved
        data.pop(k, None)
    return data, resolved, record


RUN_RECORD_KEYS = ("provenance", "resolution")


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
    if cfg.algo.normalize_advantages:
        raise ConfigError("algo.normalize_advantages = true: the llm task's advantages are normalised per group "
                          "already; a per-minibatch normalisation of token advantages moves silent groups off zero "
                          "and can flip a completion's sign (task.scale_by_std is the llm task's normalisation)")
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


def load_resolved(path: str | Path | None = None, overrides: typing.Iterable[str] = (),
                  extra: dict[str, dict[str, Any]] | None = None) -> Resolved:
    """Resolve a config from a TOML file (what it names is the user's), or a run directory's
    config.json (a resolved config, taken as it is), then ``extra`` (CLI flags), then ``--set``
    overrides; see :func:`resolve` for the precedence and what is reported.

    Raises:
        ConfigError: unreadable file, TOML or JSON syntax error, unknown section/key, wrong type, a
            failed cross-field check, or a preset or task kind changed on a config.json.
    """
    user: dict[str, Any] = {}
    base = record = None
    if path is not None:
        data, resolved, record = _section_data(path)
        base, user = (data, {}) if resolved else (None, data)
    for section, values in (extra or {}).items():
        if not isinstance(user.setdefault(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table")
        user[section].update(values)
    for text in overrides:
        section, key, value = parse_override(text)
        if not isinstance(user.setdefault(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table")
        user[section][key] = value
    return resolve(user, base, recorded=record)


def load(path: str | Path | None = None, overrides: typing.Iterable[str] = (),
         extra: dict[str, dict[str, Any]] | None = None) -> Config:
    """The Config of :func:`load_resolved` (same arguments and errors)."""
    return load_resolved(path, overrides, extra).config


def from_dict(data: dict[str, dict[str, Any]]) -> Config:
    """Rebuild a Config from ``Config.to_dict()`` output (e.g. a run directory's config.json): a
    resolved config, taken as it is (no preset or task-kind value re-applied). Raises ConfigError."""
    return resolve({}, {s: dict(v) for s, v in data.items() if s not in RUN_RECORD_KEYS}).config


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


def to_toml(cfg: Config, *, with_help: bool = True, source: dict[str, str] | None = None) -> str:
    """The resolved config as TOML that :func:`load` reads back; with ``with_help``, each key is
    preceded by a comment line with its meaning, its default (marked when the value differs) and,
    given ``source`` (:attr:`Resolved.source`), the layer its value came from when not the built-in."""
    lines: list[str] = []
    section = None
    for k in describe(cfg):
        if k.section != section:
            lines += ([""] if lines else []) + [f"[{k.section}]"]
            section = k.section
        if with_help:
            changed = "" if k.value == k.default else "; CHANGED"
            origin = (source or {}).get(f"{k.section}.{k.key}")
            origin = f"; set by {origin}" if origin and origin != "user" else ""
            lines.append(f"# {k.help} (default {toml_value(k.default)}{changed}{origin})")
        lines.append(f"{k.key} = {toml_value(k.value)}")
    return "\n".join(lines) + "\n"
