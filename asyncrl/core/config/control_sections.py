"""The control task's config sections: ``[env]`` (gymnasium env, envs per actor, rollout length) and
``[policy]`` (the MLP actor-critic), each field with its default and metadata (:mod:`.field_meta`)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.config.field_meta import CONTROL, _f


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
