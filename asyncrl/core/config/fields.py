"""The config's sections: frozen dataclasses, one per concern, each field with its default and
metadata (one-line meaning, who uses it, whether it is a study-only option); the preset pins and the
names the other modules check values against.

Imports no other asyncrl module: the config never imports the wire or a task.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PRESETS = ("vaco", "ppo", "ppo_kl", "spo", "impala", "vaco_no_realign", "vaco_no_filter", "vaco_paper")
TASK_KINDS = ("control", "llm")
# grpo: PPO-clip on token ratios with group-normalised advantages (no critic); vaco / vaco_no_filter: the same
# policy losses as the control task, on tokens. The rest need a critic or time steps.
LLM_PRESETS = ("grpo", "vaco", "vaco_no_filter")
LLM_AVERAGING = ("token", "sequence", "constant")
LLM_TRUNCATED_REWARD = ("score", "zero")
LLM_REALIGN = ("none", "is_baseline")  # docs/llm-realignment.md
LLM_SILENT_GROUPS = ("step", "skip", "drop")  # docs/llm.md
LLM_EVAL_MODES = ("sampled", "greedy")  # docs/llm.md
# Settings a preset pins unless the config names them itself: vaco_paper is the first reading of
# arXiv:2603.01365 (β anchor, δ = 0.2, unbounded ratio), kept runnable beside the tuned default.
PRESET_SETTINGS: dict[str, dict[str, Any]] = {
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
        "realign_from_version": 0,
    },
    "impala": {"traces": "vtrace"},
}
RATIO_ANCHORS = ("behavior", "learning")
FILTER_TRIGGERS = ("minibatch", "iteration")
BAND_RATIOS = ("full", "backward", "forward")
TRACES = ("vtrace", "uncorrected")
VALUE_TARGETS = ("auto", "vtrace", "lambda_returns")
ROLLOUT_TRANSPORTS = ("auto", "shm", "tcp")
PRECISIONS = ("fp32", "bf16")
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
VACO_FAMILY = ("vaco", "vaco_paper", "vaco_no_realign", "vaco_no_filter")  # vaco's surrogate
TV_FILTERED = ("vaco", "vaco_paper", "vaco_no_realign")  # ... with the TV filter
REALIGNING = ("vaco", "vaco_paper", "vaco_no_filter")  # realigned advantages (not impala)
VTRACE_PRESETS = REALIGNING + ("impala",)  # compute V-trace every iteration
NOT_IMPALA = tuple(p for p in PRESETS + ("grpo",) if p != "impala")


def _computes_vtrace(c: Config) -> bool:
    return c.task.kind == "control" and (c.algo.preset in VTRACE_PRESETS or c.algo.value_targets == "vtrace")


def _uses_rho_bar(c: Config) -> bool:
    return _computes_vtrace(c) or (c.task.kind == "llm" and c.llm.realign != "none")


@dataclass(frozen=True)
class EnvConfig:
    id: str = _f(
        "HalfCheetah-v5", "gymnasium env id, or module:callable / module:EnvId for a user's own env", kinds=CONTROL
    )
    num_envs: int = _f(8, "E: envs per actor, one rollout each per slot", kinds=CONTROL)
    rollout_length: int = _f(64, "T: env steps per rollout", kinds=CONTROL)
    max_episode_steps: int = _f(0, "episode step limit (TimeLimit, truncation); 0: the env's own", kinds=CONTROL)
    module: str = _f(
        "", "Python module imported before the env is made (it registers the env id); '': none", kinds=CONTROL
    )


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = _f((64, 64), "hidden layer widths of the policy and value MLPs", kinds=CONTROL)
    activation: str = _f("tanh", "hidden activation: tanh, relu or elu", kinds=CONTROL)
    init_log_std: float = _f(
        -0.5, "initial log-std of the Gaussian policy (std 0.61: docs/decisions/init-log-std.md)", kinds=CONTROL
    )
    normalize_obs: bool = _f(
        True,
        "normalise observations by running mean and std (learner-updated, shipped with the weights)",
        kinds=CONTROL,
    )
    obs_clip: float = _f(10.0, "clip normalised observations to +-this", kinds=CONTROL)


@dataclass(frozen=True)
class AlgoConfig:
    # Preset: which advantage estimator and policy loss (VACO.md table). arXiv:2603.01365.
    preset: str = _f(
        "vaco", "advantage estimator and policy loss: " + ", ".join(PRESETS) + "; llm tasks: " + ", ".join(LLM_PRESETS)
    )
    gamma: float = _f(0.99, "discount factor", kinds=CONTROL)
    gae_lambda: float = _f(0.95, "lambda of GAE / V-trace traces", kinds=CONTROL)
    rho_bar: float = _f(
        1.0,
        "V-trace clip of the importance weight in the value targets",
        when=(
            "V-trace is computed (vtrace presets or value_targets = vtrace), or llm.realign = is_baseline",
            _uses_rho_bar,
        ),
    )
    c_bar: float = _f(
        1.0,
        "V-trace clip of the trace coefficients",
        kinds=CONTROL,
        when=("V-trace is computed with traces = vtrace", lambda c: _computes_vtrace(c) and c.algo.traces == "vtrace"),
    )
    traces: str = _f(
        "uncorrected",
        "trace coefficients of the realigned advantages: vtrace (c_t = lambda min(c_bar, rho_t)) or uncorrected (c_t "
        "= lambda; the TD errors keep their rho_bar-clipped weights; docs/decisions/traces.md)",
        kinds=CONTROL,
        when=("V-trace is computed (vtrace presets or value_targets = vtrace)", _computes_vtrace),
    )
    value_targets: str = _f(
        "auto",
        "critic regression target: auto (the preset's: V-trace's vs where the advantages are realigned, GAE's "
        "lambda-returns otherwise), vtrace or lambda_returns (any preset but impala); docs/decisions/value-targets.md",
        kinds=CONTROL,
        presets=NOT_IMPALA,
    )
    realign_min_lag: int = _f(
        0,
        "realigning presets, control task: realign only the samples at least this many versions behind the learner; "
        "the others get GAE on beta's data (and lambda-return targets under value_targets auto), as vaco_no_realign; "
        "0: every sample (docs/decisions/realign-min-lag.md)",
        kinds=CONTROL,
        presets=REALIGNING,
        study_only=True,
    )
    realign_from_version: int = _f(
        125,
        "realigning presets but impala, control task: before the learner reaches this policy version, no sample is "
        "realigned (GAE on beta's data and lambda-return targets under value_targets auto, as vaco_no_realign); 0: "
        "from the first iteration (vaco_paper; the llm task has no such option); 125: about 256k env steps at the "
        "default batch (docs/decisions/realign-from-version.md)",
        kinds=CONTROL,
        presets=REALIGNING,
    )
    tv_threshold: float = _f(
        0.2,
        "delta of the TV filter: samples of a minibatch over this TV budget get no gradient "
        "(docs/decisions/tv-threshold.md)",
        presets=TV_FILTERED,
    )
    ratio_anchor: str = _f(
        "learning",
        "policy-ratio anchor of the TV filter: learning (pi_T, the default) or behavior (beta, the paper's reading); "
        "docs/decisions/learning-anchor.md",
        presets=VACO_FAMILY,
    )
    surrogate_rho_bar: float = _f(
        1.0,
        "bound on the importance weight pi_T/beta in the surrogate (learning anchor); inf: none",
        presets=VACO_FAMILY,
        when=("ratio_anchor = learning", lambda c: c.algo.ratio_anchor == "learning"),
    )
    tv_filter_trigger: str = _f(
        "minibatch",
        "when the TV filter acts: minibatch (each minibatch over delta) or iteration (from the first one on)",
        presets=TV_FILTERED,
        study_only=True,
    )
    tv_filter_min_deviation: float = _f(
        0.0,
        "the TV filter's sign rule applies only to samples with |r - 1| above this",
        presets=TV_FILTERED,
        study_only=True,
    )
    behavior_band: float = _f(
        0.2,
        "vaco: also detach samples whose pi_theta/beta left [1-band, 1+band] in the direction of their advantage "
        "(PPO-clip's mask, per sample); inf: off (docs/decisions/behavior-band.md)",
        presets=VACO_FAMILY,
    )
    behavior_band_ratio: str = _f(
        "forward",
        "which ratio behavior_band bounds: forward (pi_theta/anchor: pi_theta/pi_T with the learning anchor, "
        "decoupled PPO's clip), full (pi_theta/beta, PPO's clip) or backward (pi_T/beta, fixed per iteration; "
        "learning anchor only)",
        presets=VACO_FAMILY,
        when=("behavior_band < inf", lambda c: c.algo.behavior_band < float("inf")),
    )
    tv_filter_ratio_cap: float = _f(
        float("inf"),
        "the sign rule also applies, whatever the TV estimate, to samples with |r - 1| above this; inf: never",
        presets=TV_FILTERED,
        study_only=True,
    )
    clip_eps: float = _f(0.2, "ppo: ratio clip epsilon", presets=("ppo", "grpo"))
    kl_coef: float = _f(1.0, "ppo_kl: KL penalty coefficient", presets=("ppo_kl",))
    spo_eps: float = _f(0.2, "spo: ratio epsilon", presets=("spo",))
    value_coef: float = _f(0.5, "value-loss weight", kinds=CONTROL)
    entropy_coef: float = _f(0.0, "entropy-bonus weight (docs/decisions/entropy-coef.md)", kinds=CONTROL)
    normalize_advantages: bool = _f(True, "normalise advantages per minibatch", kinds=CONTROL, presets=NOT_IMPALA)
    num_epochs: int = _f(10, "epochs over each batch", presets=NOT_IMPALA)
    num_minibatches: int = _f(8, "minibatches per epoch (8 of 256: docs/decisions/minibatches.md)")
    lr: float = _f(3e-4, "Adam learning rate")
    anneal_lr: bool = _f(True, "anneal the learning rate linearly to 0 over run.total_env_steps")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    max_grad_norm: float = _f(0.5, "clip the gradient norm to this")


@dataclass(frozen=True)
class ActorConfig:
    # Lag controls of the studies' lag conditions (asyncrl.core.lag_control); 0 / 1 / 0.0: none.
    policy_delay: int = _f(
        0, "act with the weights K versions behind the newest received; 0: the newest", study_only=True
    )
    policy_age_buffer: int = _f(
        1, "each rollout acts with a version drawn uniformly from the last K received; 1: the newest", study_only=True
    )
    slowdown_s: float = _f(
        0.0, "a straggler: each rollout takes this many seconds longer (actor processes)", study_only=True
    )
    rollout_transport: str = _f("auto", "auto (shared memory if the learner's segment attaches, else TCP), shm or tcp")
    device: str = _f(
        "cpu",
        "llm generator actors: where the model samples, cpu, cuda or cuda:N (float32; control "
        "actors act with numpy: cpu only)",
        kinds=LLM,
    )


@dataclass(frozen=True)
class LearnerConfig:
    slots_per_batch: int = _f(4, "B: slots of E rollouts per batch ([T, B*E])")
    num_slots: int = _f(12, "S: slots in the shared-memory ring")
    max_policy_lag: int = _f(-1, "drop samples more versions behind than this; -1: keep all")
    reward_scaling: bool = _f(
        True, "divide rewards by the running std of the discounted return, per env stream", kinds=CONTROL
    )
    reward_clip: float = _f(10.0, "clip scaled rewards to +-this", kinds=CONTROL)
    checkpoint_every: int = _f(50, "learner iterations between checkpoints; 0: only at the end")
    keep_checkpoints: int = _f(
        3, "checkpoints kept (checkpoint.pt, checkpoint.1.pt, ...); a corrupt newest one falls back to the next"
    )
    max_consecutive_skips: int = _f(
        20, "optimizer steps skipped in a row (non-finite loss or gradient) before the run fails"
    )
    torch_threads: int = _f(1, "torch threads of the learner")
    device: str = _f("cpu", "where the learner's policy, optimizer and batches live: cpu, cuda or cuda:N")
    precision: str = _f(
        "fp32",
        "learner forward passes: fp32, or bf16 (autocast of the network forwards; "
        "log-probs, losses, gradients and weights stay float32; see asyncrl/core/device.py)",
    )


@dataclass(frozen=True)
class TransportConfig:
    learner_bind: str = _f("tcp://127.0.0.1:5555", "learner ROUTER address: hello, grants, reports, heartbeats")
    broadcaster_bind: str = _f(
        "tcp://127.0.0.1:5556", "broadcaster PUB address; its snapshot ROUTER takes the next port"
    )
    heartbeat_s: float = _f(1.0, "seconds between actor heartbeats")
    actor_timeout_s: float = _f(10.0, "seconds of silence after which learner and actor give each other up")
    rejoin_timeout_s: float = _f(
        60.0,
        "seconds an actor whose learner ended its session (restarted, or dropped it) "
        "keeps saying hello before it gives up",
    )
    grant_lease_s: float = _f(
        0.0,
        "seconds a granted slot may go unreported before the learner takes it back (the "
        "slot generation stops its writer); 0: derived, 6 x actor_timeout_s or 4 x the "
        "slowest report interval seen, whichever is longer",
    )


@dataclass(frozen=True)
class RunConfig:
    seed: int = _f(1, "run seed (nets, actors' envs and actions)")
    total_env_steps: int = _f(1_000_000, "env-step budget (consumed by the learner)")
    num_actors: int = _f(2, "actor processes (serial mode: actor env groups)")
    straggler_slowdown_s: float = _f(
        0.0, "asyncrl run: actor0 alone is slowed by this many seconds per rollout", study_only=True
    )
    run_dir: str = _f("runs", "parent directory of the default run directory")
    log_every_s: float = _f(5.0, "seconds between progress lines and lag-histogram windows")
    eval_every: int = _f(
        0, "env steps between evaluations (mean action, separate env and seed) in metrics.jsonl; 0: none", kinds=CONTROL
    )
    eval_episodes: int = _f(5, "episodes per periodic evaluation", kinds=CONTROL)
    max_restarts: int = _f(
        3,
        "asyncrl run: restarts of each role (actor, broadcaster, learner) within "
        "run.restart_window_s before the next death fails the run",
    )
    restart_backoff_s: float = _f(
        1.0, "asyncrl run: seconds before a role's first restart, doubled for each next one within run.restart_window_s"
    )
    launcher: str = _f(
        "local",
        "asyncrl run: who starts and restarts the roles: local (this host's supervisor) or "
        "ray (a Ray cluster; the extra asyncrl[ray])",
    )
    ray_address: str = _f(
        "", "asyncrl run --launcher ray: the cluster to join, e.g. 10.0.0.1:6379 ('': start a local one for the run)"
    )
    restart_window_s: float = _f(
        60.0,
        "asyncrl run: only restarts this recent count against run.max_restarts "
        "and the backoff (a role that stays up this long is healthy again); 0: all count",
    )


@dataclass(frozen=True)
class TaskConfig:
    kind: str = _f(
        "control",
        "task kind the roles carry: control (gymnasium envs: [env] and [policy]) or llm "
        "(a causal language model on GSM8k-format math: [llm])",
    )


@dataclass(frozen=True)
class LLMConfig:
    """The language-model task's keys (task.kind = llm; docs/decisions/llm-defaults.md)."""

    model_dir: str = _f(
        "",
        "Hugging Face causal-LM directory to start from (loaded with local_files_only); '': the "
        "tiny model `asyncrl llm prepare` makes, cached in llm.cache_dir",
        kinds=LLM,
    )
    cache_dir: str = _f(
        "runs/llm", "where the prepared tiny model, its warm-ups and start evaluations are cached", kinds=LLM
    )
    model_seed: int = _f(
        0, "seed of the tiny model, its warm-up and the train / held-out problems (run.seed seeds RL only)", kinds=LLM
    )
    warmup_steps: int = _f(1000, "supervised warm-up steps before RL (asyncrl llm warmup; cached); 0: none", kinds=LLM)
    warmup_batch_size: int = _f(32, "problems per supervised warm-up step", kinds=LLM)
    warmup_threads: int = _f(
        2,
        "torch threads of the supervised warm-up, fixed so that the start model does not "
        "depend on the machine's cores or OMP_NUM_THREADS (float sums change order with the "
        "thread count); 0: torch's default",
        kinds=LLM,
    )
    warmup_target: float = _f(
        0.0,
        "end the supervised warm-up early at the first check (every 100 steps from half "
        "of llm.warmup_steps on) whose greedy accuracy on 200 validation problems (in "
        "neither train nor held-out) reaches this; llm.warmup_steps stays the budget; "
        "0: off",
        kinds=LLM,
    )
    group_size: int = _f(8, "G: completions sampled per prompt (a group)", kinds=LLM)
    prompts_per_slot: int = _f(4, "prompts per slot: a slot holds whole groups, prompts_per_slot * G rows", kinds=LLM)
    max_prompt_tokens: int = _f(96, "prompt width in a slot (left-padded); a longer prompt is an error", kinds=LLM)
    max_new_tokens: int = _f(
        160, "completion width in a slot and generation budget (sampling and evaluation)", kinds=LLM
    )
    temperature: float = _f(
        1.0, "sampling temperature of the generators (the learner's log-probs use it too)", kinds=LLM
    )
    train_problems: int = _f(20000, "generated train problems the generators draw prompts from", kinds=LLM)
    eval_size: int = _f(500, "held-out problems of the evaluation before and after RL; 0: none", kinds=LLM)
    eval_batch_size: int = _f(
        64,
        "prompts per generation batch of the held-out evaluation (a larger batch "
        "amortises each decoding step's fixed cost; its KV cache grows with it)",
        kinds=LLM,
    )
    eval_mode: str = _f(
        "sampled",
        "the held-out evaluation: sampled (one completion per problem at llm.temperature, "
        "the same draws before and after RL: seeded by llm.model_seed) or greedy (argmax)",
        kinds=LLM,
    )
    averaging: str = _f(
        "token", "loss average over tokens: token (DAPO), sequence (GRPO) or constant (Dr. GRPO)", kinds=LLM
    )
    scale_by_std: bool = _f(True, "divide group-centred rewards by the group's std (GRPO); false: Dr. GRPO", kinds=LLM)
    truncated_reward: str = _f(
        "score",
        "a completion cut at max_new_tokens (no EOS): score (its '####' line "
        "scored like any other) or zero (reward 0 whatever it wrote)",
        kinds=LLM,
    )
    realign: str = _f(
        "none",
        "advantage realignment without a critic: none (baseline = the group's mean reward, "
        "an estimate under beta) or is_baseline (the group's mean weighted by min(algo.rho_bar, "
        "pi_T/beta) per completion: a baseline of pi_T; docs/llm-realignment.md)",
        kinds=LLM,
    )
    silent_groups: str = _f(
        "drop",
        "groups whose G rewards are equal (zero advantage): drop (removed before the "
        "minibatches, as DAPO's dynamic sampling; num_minibatches splits the rest), skip "
        "(kept, but a minibatch without an advantage or a KL term does not step the "
        "optimizer) or step (kept: a minibatch of them alone still steps Adam on its "
        "momentum)",
        kinds=LLM,
    )
    kl_coef: float = _f(
        0.0,
        "weight of the per-token k3 KL(pi_theta || start model) penalty (DeepSeekMath GRPO); "
        "0: off, and the learner holds no reference model",
        kinds=LLM,
    )
    negative_weight: float = _f(
        1.0,
        "factor on negative advantages after group normalisation: 1 is GRPO, 0 keeps "
        "the positive (above-group-mean) completions only (positive-sample "
        "reinforcement, arXiv:2506.01347)",
        kinds=LLM,
    )


# Keys that left [task] for [llm] (old name -> new name). A config file, flag or --set naming the old
# one is refused with a line naming the new one; a run's config.json written before the move is read
# with them translated (asyncrl.core.config.io.translate_moved_keys), and says so.
MOVED_KEYS: dict[str, str] = {
    f"task.{f.name if f.name != 'model_dir' else 'model'}": f"llm.{f.name}" for f in dataclasses.fields(LLMConfig)
}


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
    llm: LLMConfig = field(default_factory=LLMConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        """Samples per learner iteration: env steps T * B * E (control), completions
        prompts_per_slot * G * B (llm)."""
        if self.task.kind == "llm":
            return self.llm.prompts_per_slot * self.llm.group_size * self.learner.slots_per_batch
        return self.env.rollout_length * self.learner.slots_per_batch * self.env.num_envs


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
