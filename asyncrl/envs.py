"""Gymnasium env construction: the one place that turns terminated / truncated / final
observation into rollout fields. Only this module imports gymnasium."""
from __future__ import annotations

import hashlib
import logging
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from . import toy_envs
from .spec import RolloutSpec

toy_envs.register()

log = logging.getLogger(__name__)


class EnvError(ValueError):
    """An env id that does not exist, or a space asyncrl cannot handle."""


class StepResult(NamedTuple):
    obs: np.ndarray          # [E, D] float32: the next observation (a reset one after an episode end)
    rewards: np.ndarray      # [E] float32
    terminated: np.ndarray   # [E] bool: the MDP ended; bootstrap 0
    truncated: np.ndarray    # [E] bool (False where terminated): time limit; bootstrap V(final_obs)
    final_obs: np.ndarray    # [E, D] float32: the last observation of an ended episode, else 0


def check_env_id(env_id: str) -> None:
    """Raise EnvError with one line if gymnasium has no env registered under ``env_id``."""
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise EnvError(f"unknown env id {env_id!r}: {exc}") from None


def check_env(env_id: str, max_episode_steps: int = 0) -> None:
    """Raise EnvError with one line unless ``env_id`` is registered AND can be made here with
    spaces asyncrl handles (a missing extra such as Box2D, or a Discrete observation, is caught
    before any process starts)."""
    check_env_id(env_id)
    try:
        VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps).close()
    except EnvError:
        raise
    except Exception as exc:  # whatever gymnasium or the env raises: report it in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EnvError(f"{env_id} cannot be made here: {type(exc).__name__}: {first}") from None


class VecEnv:
    """E copies of one gymnasium env stepped in turn in this process, with the action clipping
    and end-of-episode bookkeeping asyncrl needs: an env whose episode ended is reset at once,
    its last observation kept as ``final_obs`` (same-step autoreset).

    A plain loop rather than gymnasium's SyncVectorEnv: that one merges every env's info dict on
    every step, which doubled the cost of a HalfCheetah-v5 step here (about 125 vs 65 us).

    Raises:
        EnvError: unknown env id, non-flat Box observations, or an action space other than
            Box or Discrete.
    """

    def __init__(self, env_id: str, num_envs: int, *, seed: int, max_episode_steps: int = 0,
                 env_kwargs: dict | None = None):
        check_env_id(env_id)
        kwargs = dict(env_kwargs or {})
        if max_episode_steps > 0:
            kwargs["max_episode_steps"] = max_episode_steps
        self.envs = [gym.make(env_id, **kwargs) for _ in range(num_envs)]
        obs_space, act_space = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            self.close()
            raise EnvError(f"{env_id}: observation space must be a flat Box, got {obs_space}")
        if isinstance(act_space, gym.spaces.Discrete):
            self.discrete, self.action_dim = True, int(act_space.n)
            self._low = self._high = None
        elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            self.discrete, self.action_dim = False, int(act_space.shape[0])
            self._low, self._high = act_space.low, act_space.high
        else:
            self.close()
            raise EnvError(f"{env_id}: action space must be Box (1-D) or Discrete, got {act_space}")
        self.env_id, self.num_envs, self.obs_dim = env_id, num_envs, int(obs_space.shape[0])
        self.spaces = {"observation": describe_space(obs_space), "action": describe_space(act_space)}
        self._seed = seed
        self.obs = np.zeros((num_envs, self.obs_dim), np.float32)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)

    def spec(self, rollout_length: int) -> RolloutSpec:
        return RolloutSpec(obs_dim=self.obs_dim, action_dim=self.action_dim, discrete=self.discrete,
                           rollout_length=rollout_length, num_envs=self.num_envs)

    def reset(self, seeds=None) -> np.ndarray:
        """Reset every env; env i is seeded with ``seeds[i]`` (an int >= 0; actors and serial mode
        pass :func:`asyncrl.seeding.actor_seeds`), or with ``seed + i`` when ``seeds`` is None.
        Later resets continue each env's RNG. Returns obs [E, D] float32.

        Raises ValueError unless ``seeds`` has one seed per env."""
        if seeds is None:
            seeds = [self._seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        for i, env in enumerate(self.envs):
            self.obs[i] = env.reset(seed=int(seeds[i]))[0]
        return self.obs

    def step(self, actions: np.ndarray) -> tuple[StepResult, list[tuple[float, int]]]:
        """Step every env with ``actions`` ([E, A] unclipped float, or [E] int).

        Only a clipped copy reaches the env; the caller stores the unclipped action.
        Returns the step result and a list of (return, length) for episodes that ended.
        """
        E = self.num_envs
        env_actions = actions if self.discrete else np.clip(actions, self._low, self._high)
        obs = np.empty((E, self.obs_dim), np.float32)
        final_obs = np.zeros((E, self.obs_dim), np.float32)
        rewards = np.empty(E, np.float32)
        terminated = np.zeros(E, bool)
        truncated = np.zeros(E, bool)
        finished = []
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(env_actions[i])
            rewards[i] = r
            self.episode_return[i] += r
            self.episode_length[i] += 1
            if term or trunc:
                terminated[i], truncated[i] = term, trunc and not term
                final_obs[i] = o
                finished.append((float(self.episode_return[i]), int(self.episode_length[i])))
                self.episode_return[i], self.episode_length[i] = 0.0, 0
                o = env.reset()[0]
            obs[i] = o
        self.obs = obs
        return StepResult(obs, rewards, terminated, truncated, final_obs), finished

    def close(self) -> None:
        for env in self.envs:
            env.close()


def describe_space(space: gym.Space) -> str:
    """A canonical one-line description of a Box or Discrete space (shape, dtype, bounds), the
    same on every host with the same env; the handshake compares them."""
    if isinstance(space, gym.spaces.Discrete):
        return f"Discrete(n={int(space.n)}, start={int(space.start)})"
    if isinstance(space, gym.spaces.Box):
        return (f"Box(shape={tuple(space.shape)}, dtype={np.dtype(space.dtype).name}, "
                f"low={_bounds(space.low)}, high={_bounds(space.high)})")
    return type(space).__name__


def _bounds(a: np.ndarray) -> str:
    a = np.asarray(a, np.float64).ravel()
    if a.size and (a == a[0]).all():
        return repr(float(a[0]))
    if a.size <= 8:
        return "[" + ", ".join(repr(float(x)) for x in a) + "]"
    return "sha256:" + hashlib.sha256(a.tobytes()).hexdigest()[:16]


def env_spaces(env_id: str, max_episode_steps: int = 0) -> dict[str, str]:
    """{"observation": ..., "action": ...} descriptions of ``env_id``'s spaces (builds one env)."""
    probe = VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps)
    try:
        return dict(probe.spaces)
    finally:
        probe.close()


def rollout_spec(env_id: str, *, num_envs: int, rollout_length: int, max_episode_steps: int = 0) -> RolloutSpec:
    """The RolloutSpec of ``num_envs`` copies of ``env_id`` (builds one env to read its spaces)."""
    probe = VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps)
    try:
        return RolloutSpec(obs_dim=probe.obs_dim, action_dim=probe.action_dim, discrete=probe.discrete,
                           rollout_length=rollout_length, num_envs=num_envs)
    finally:
        probe.close()


def random_policy_return(env_id: str, *, episodes: int = 10, seed: int = 0, max_episode_steps: int = 0) -> float:
    """Mean undiscounted return of ``episodes`` episodes of the uniform random policy (actions
    drawn from the action space, seeded): the "random" end of a normalised score (STUDY.md).

    Raises:
        EnvError: as :class:`VecEnv`; ValueError: episodes < 1.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    check_env_id(env_id)
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps > 0 else {}
    env = gym.make(env_id, **kwargs)
    env.action_space.seed(seed)
    total = 0.0
    try:
        for k in range(episodes):
            env.reset(seed=seed + k)
            while True:
                _, r, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(r)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return total / episodes
