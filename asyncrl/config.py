"""Configuration: frozen dataclasses per concern, loaded from TOML plus ``--set a.b=v`` overrides.

Defaults live here (the single source of truth); ``configs/default.toml`` lists them for
reading and is checked against this module by a test. Every unknown section or key, every value
of the wrong type and every unknown preset raises :class:`ConfigError` with one line naming it.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRESETS = ("vaco", "ppo", "ppo_kl", "spo", "impala", "vaco_no_realign", "vaco_no_filter", "vaco_paper")
# Settings a preset pins unless the config names them itself: vaco_paper is the first reading of
# arXiv:2603.01365 (β anchor, δ = 0.2, unbounded ratio), kept runnable beside the tuned default.
PRESET_SETTINGS: dict[str, dict[str, Any]] = {
    "vaco_paper": {"ratio_anchor": "behavior", "tv_threshold": 0.2, "surrogate_rho_bar": float("inf"),
                   "tv_filter_trigger": "minibatch", "tv_filter_min_deviation": 0.0, "entropy_coef": 0.0},
}
RATIO_ANCHORS = ("behavior", "learning")
FILTER_TRIGGERS = ("minibatch", "iteration")
ROLLOUT_TRANSPORTS = ("auto", "shm", "tcp")


class ConfigError(ValueError):
    """A configuration value, key or file is wrong; the message names it."""


@dataclass(frozen=True)
class EnvConfig:
    id: str = "HalfCheetah-v5"
    num_envs: int = 8            # E: envs per actor, one rollout each per slot
    rollout_length: int = 64     # T: env steps per rollout
    max_episode_steps: int = 0   # 0: the env's own TimeLimit


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = -0.5   # std 0.61: see configs/default.toml for why
    normalize_obs: bool = True
    obs_clip: float = 10.0


@dataclass(frozen=True)
class AlgoConfig:
    # Preset: which advantage estimator and policy loss (VACO.md table). arXiv:2603.01365.
    preset: str = "vaco"
    gamma: float = 0.99
    gae_lambda: float = 0.95
    rho_bar: float = 1.0
    c_bar: float = 1.0
    tv_threshold: float = 0.2        # δ of the TV filter (the paper's value, unablated there)
    ratio_anchor: str = "behavior"   # "behavior" (β) or "learning" (π_T)
    surrogate_rho_bar: float = float("inf")  # bound on π_T/β in the surrogate (learning anchor); inf: none
    tv_filter_trigger: str = "minibatch"     # "minibatch": each minibatch over δ; "iteration": from the first one on
    tv_filter_min_deviation: float = 0.0     # the sign rule only for samples with |r - 1| above this
    clip_eps: float = 0.2            # ppo
    kl_coef: float = 1.0             # ppo_kl
    spo_eps: float = 0.2             # spo
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    normalize_advantages: bool = True
    num_epochs: int = 10
    num_minibatches: int = 8         # minibatches of 256: see configs/default.toml for why
    lr: float = 3e-4
    anneal_lr: bool = True
    adam_eps: float = 1e-5
    max_grad_norm: float = 0.5


@dataclass(frozen=True)
class ActorConfig:
    # Lag controls for experiments (asyncrl.lag_control); 0 / 1 / 0.0: none.
    policy_delay: int = 0         # act with the weights K versions behind the newest
    policy_age_buffer: int = 1    # each rollout acts with a version drawn from the last K received
    slowdown_s: float = 0.0       # a straggler: each rollout takes this many seconds longer (actor processes)
    # How rollouts reach the learner: "auto" (shared memory if the learner's segment can be
    # attached, i.e. same host; else TCP), "shm" (fail if it cannot attach), "tcp" (always TCP).
    rollout_transport: str = "auto"


@dataclass(frozen=True)
class LearnerConfig:
    slots_per_batch: int = 4         # B slots of E rollouts make one batch: [T, B*E]
    num_slots: int = 12              # S slots in the shared-memory ring
    max_policy_lag: int = -1         # drop samples more versions behind than this; -1: keep all
    reward_scaling: bool = True      # divide rewards by running std of discounted return
    reward_clip: float = 10.0
    checkpoint_every: int = 50       # learner iterations; 0: only at the end
    max_consecutive_skips: int = 20  # optimizer steps skipped in a row (non-finite loss/gradient) before the run fails
    torch_threads: int = 1


@dataclass(frozen=True)
class TransportConfig:
    learner_bind: str = "tcp://127.0.0.1:5555"      # ROUTER: hello, grants, reports, heartbeats
    broadcaster_bind: str = "tcp://127.0.0.1:5556"  # PUB; its request ROUTER takes the next port
    heartbeat_s: float = 1.0
    actor_timeout_s: float = 10.0


@dataclass(frozen=True)
class RunConfig:
    seed: int = 1
    total_env_steps: int = 1_000_000
    num_actors: int = 2
    straggler_slowdown_s: float = 0.0   # asyncrl run: actor0 alone is slowed by this many seconds per rollout
    run_dir: str = "runs"
    log_every_s: float = 5.0


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def batch_size(self) -> int:
        """Env steps per learner iteration: T * B * E."""
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
            for k, v in PRESET_SETTINGS.get(kwargs.get("preset", cls.preset), {}).items():
                kwargs.setdefault(k, v)
        built[name] = cls(**kwargs)
    cfg = Config(**built)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks; raises ConfigError naming the first problem."""
    a, e, l = cfg.algo, cfg.env, cfg.learner
    if a.preset not in PRESETS:
        raise ConfigError(f"unknown preset algo.preset={a.preset!r}; presets are {', '.join(PRESETS)}")
    if a.ratio_anchor not in RATIO_ANCHORS:
        raise ConfigError(f"algo.ratio_anchor must be one of {RATIO_ANCHORS}, got {a.ratio_anchor!r}")
    if a.tv_filter_trigger not in FILTER_TRIGGERS:
        raise ConfigError(f"algo.tv_filter_trigger must be one of {FILTER_TRIGGERS}, got {a.tv_filter_trigger!r}")
    if not 0.0 <= a.tv_filter_min_deviation < float("inf"):
        raise ConfigError(f"algo.tv_filter_min_deviation must be a finite number >= 0, got {a.tv_filter_min_deviation}")
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
                            ("run.seed", cfg.run.seed, 0),
                            ("learner.max_consecutive_skips", l.max_consecutive_skips, 0)):
        if value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}")
    if cfg.actor.rollout_transport not in ROLLOUT_TRANSPORTS:
        raise ConfigError(f"actor.rollout_transport must be one of {', '.join(ROLLOUT_TRANSPORTS)}, "
                          f"got {cfg.actor.rollout_transport!r}")
    if cfg.actor.policy_delay > 0 and cfg.actor.policy_age_buffer > 1:
        raise ConfigError("set actor.policy_delay or actor.policy_age_buffer, not both")
    if not 0 < a.lr < float("inf"):
        raise ConfigError(f"algo.lr must be a finite number > 0, got {a.lr}")
    if l.num_slots < l.slots_per_batch:
        raise ConfigError(f"learner.num_slots ({l.num_slots}) must be >= learner.slots_per_batch ({l.slots_per_batch})")
    if cfg.batch_size % a.num_minibatches:
        raise ConfigError(f"batch size T*B*E = {cfg.batch_size} is not divisible by algo.num_minibatches={a.num_minibatches}")


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
    return _build({s: dict(v) for s, v in data.items()})
