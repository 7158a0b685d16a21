"""Tiny deterministic gymnasium envs for tests and smoke runs (registered on import of
:mod:`asyncrl.tasks.control.envs` as ``asyncrl/Constant-v0``, ``asyncrl/Corridor-v0`` and
``asyncrl/NaNCorridor-v0``, a Corridor whose reward is NaN at steps 500 and 1000 of each episode,
and ``asyncrl/OneStep-v0``, a Corridor whose episodes end after one step: every env ends an episode
every step, the most episodes a rollout can report)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class ConstantEnv(gym.Env):
    """Reward 1 every step, one constant observation, never terminates: an infinite-horizon
    task cut only by a TimeLimit. True value V(s) = 1 / (1 - γ); a learner that treats
    truncation as termination learns less."""

    def __init__(self, obs_dim: int = 2, action_dim: int = 1):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 1.0, False, False, {}

    def asyncrl_state(self) -> dict:
        """Its state between steps (none): what asyncrl checkpoints to resume a serial run."""
        return {}

    def asyncrl_set_state(self, d: dict) -> None:
        pass


class CorridorEnv(gym.Env):
    """Observation [position / length, step]; reward = the action's first component clipped
    to [-1, 1]; terminates once ``terminate_at`` steps are taken (0: never). Deterministic, so
    rollouts can be checked step by step. ``render_mode="rgb_array"``: [64, 128, 3] uint8 frames
    (a marker moving along the corridor), so video writing is testable without OpenGL.
    ``nan_reward_every`` k > 0: the reward of every k-th step of an episode is NaN (a broken
    simulator, for the fault tests)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        length: int = 10,
        terminate_at: int = 0,
        discrete: bool = False,
        render_mode=None,
        nan_reward_every: int = 0,
    ):
        self.length, self.terminate_at, self.render_mode = length, terminate_at, render_mode
        self.nan_reward_every = nan_reward_every
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0

    def _obs(self):
        return np.array([self.t / self.length, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(action) if np.isscalar(action) or np.ndim(action) == 0 else float(np.clip(action[0], -1, 1))
        terminated = self.terminate_at > 0 and self.t >= self.terminate_at
        if self.nan_reward_every and self.t % self.nan_reward_every == 0:
            reward = float("nan")
        return self._obs(), reward, terminated, False, {}

    def asyncrl_state(self) -> dict:
        """Its state between steps (the step count): what asyncrl checkpoints to resume a serial run."""
        return {"t": self.t}

    def asyncrl_set_state(self, d: dict) -> None:
        self.t = int(d["t"])

    def render(self):
        frame = np.full((64, 128, 3), 230, np.uint8)
        x = int(8 + (self.t % self.length) * (112 / max(self.length - 1, 1)))
        frame[24:40, max(x - 8, 0) : x + 8] = (200, 30, 30)
        return frame


def register() -> None:
    for env_id, cls, kwargs in (
        ("asyncrl/Constant-v0", ConstantEnv, {}),
        ("asyncrl/Corridor-v0", CorridorEnv, {}),
        ("asyncrl/NaNCorridor-v0", CorridorEnv, {"nan_reward_every": 500}),
        ("asyncrl/OneStep-v0", CorridorEnv, {"terminate_at": 1}),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=cls, max_episode_steps=1000, kwargs=kwargs)
