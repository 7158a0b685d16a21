"""Gymnasium env construction: the one place that turns terminated / truncated / final
observation into rollout fields. Only this module imports gymnasium."""

from __future__ import annotations

import hashlib
import importlib
import logging
import re
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from asyncrl.core.spec import RolloutSpec
from asyncrl.tasks.control import toy_envs

toy_envs.register()

log = logging.getLogger(__name__)


class EnvError(ValueError):
    """An env id that does not exist, or a space asyncrl cannot handle."""


class StepResult(NamedTuple):
    obs: np.ndarray  # [E, D] float32: the next observation (a reset one after an episode end)
    rewards: np.ndarray  # [E] float32
    terminated: np.ndarray  # [E] bool: the MDP ended; bootstrap 0
    truncated: np.ndarray  # [E] bool (False where terminated): time limit; bootstrap V(final_obs)
    final_obs: np.ndarray  # [E, D] float32: the last observation of an ended episode, else 0


def _import(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EnvError(f"{what}: cannot import module {module!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing: one line, not a traceback
        raise EnvError(f"{what}: importing module {module!r} failed: {type(exc).__name__}: {exc}") from None


def resolve_env_id(env_id: str, module: str = "") -> str:
    """The gymnasium id to make for a config's ``env.id`` (and ``env.module``).

    - ``module`` (optional) is imported first: a module of the user's that registers env ids.
    - ``"pkg.mod:Name-v0"``: import ``pkg.mod``; ``Name-v0`` must then be a registered id.
    - ``"pkg.mod:make_env"``: import ``pkg.mod``; ``make_env`` (a gymnasium.Env class or any
      callable returning an env) is registered under an id of its own, which is returned.
    Every process (learner, actors, eval) resolves the same string the same way; the module must
    be importable in each (on its PYTHONPATH or the working directory).

    Raises EnvError: the module cannot be imported, or names neither a registered id nor a callable."""
    if module:
        _import(module, "env.module")
    if ":" not in env_id:
        return env_id
    mod_name, name = env_id.split(":", 1)
    mod = _import(mod_name, f"env {env_id!r}")
    if name in gym.registry:
        return name
    obj = getattr(mod, name, None)
    if not callable(obj):
        raise EnvError(
            f"env {env_id!r}: module {mod_name!r} has neither a registered env id {name!r} nor a callable {name!r}"
        )
    gym_id = "asyncrl-user/" + re.sub(r"[^\w]", "_", env_id) + "-v0"
    if gym_id not in gym.registry:
        gym.register(id=gym_id, entry_point=obj)
    return gym_id


def check_env_id(env_id: str, module: str = "") -> None:
    """Raise EnvError with one line if gymnasium has no env registered under ``env_id``
    (resolved as :func:`resolve_env_id` does)."""
    gym_id = resolve_env_id(env_id, module)
    try:
        gym.spec(gym_id)
    except gym.error.Error as exc:
        raise EnvError(f"unknown env id {env_id!r}: {exc}") from None


def make_env(
    env_id: str,
    *,
    module: str = "",
    max_episode_steps: int = 0,
    render_mode: str | None = None,
    env_kwargs: dict | None = None,
) -> gym.Env:
    """One gymnasium env (for evaluation and video; training uses :class:`VecEnv`).
    ``render_mode="rgb_array"`` makes ``render()`` return [H, W, 3] uint8 frames.
    Raises EnvError for an unknown id or an import failure."""
    check_env_id(env_id, module)
    kwargs = dict(env_kwargs or {})
    if max_episode_steps > 0:
        kwargs["max_episode_steps"] = max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return gym.make(resolve_env_id(env_id, module), **kwargs)


def is_mujoco(env: gym.Env) -> bool:
    """True for a gymnasium MuJoCo env (its rgb_array rendering needs offscreen OpenGL)."""
    return type(env.unwrapped).__module__.startswith("gymnasium.envs.mujoco")


def follow_with_camera(env: gym.Env, name: str = "track") -> bool:
    """Render a MuJoCo env through its model's camera ``name`` when it has one (gymnasium's
    HalfCheetah, Hopper, Walker2d... define a "track" camera that follows the body; the default
    free camera stays put and the runner leaves the picture). Returns whether it was set."""
    if not is_mujoco(env):
        return False
    import mujoco

    u = env.unwrapped
    cam = mujoco.mj_name2id(u.model, mujoco.mjtObj.mjOBJ_CAMERA, name)
    renderer = getattr(u, "mujoco_renderer", None)
    if cam < 0 or renderer is None:
        return False
    renderer.camera_id, renderer.camera_name = cam, None
    return True


def check_env(env_id: str, max_episode_steps: int = 0, module: str = "") -> None:
    """Raise EnvError with one line unless ``env_id`` is registered AND can be made here with
    spaces asyncrl handles (a missing extra such as Box2D, or a Discrete observation, is caught
    before any process starts)."""
    check_env_id(env_id, module)
    try:
        VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps, module=module).close()
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

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        seed: int,
        max_episode_steps: int = 0,
        env_kwargs: dict | None = None,
        module: str = "",
    ):
        gym_id = resolve_env_id(env_id, module)
        check_env_id(gym_id)
        kwargs = dict(env_kwargs or {})
        if max_episode_steps > 0:
            kwargs["max_episode_steps"] = max_episode_steps
        self.envs = [gym.make(gym_id, **kwargs) for _ in range(num_envs)]
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
        return RolloutSpec(
            obs_dim=self.obs_dim,
            action_dim=self.action_dim,
            discrete=self.discrete,
            rollout_length=rollout_length,
            num_envs=self.num_envs,
        )

    def reset(self, seeds=None) -> np.ndarray:
        """Reset every env; env i is seeded with ``seeds[i]`` (an int >= 0; actors and serial mode
        pass :func:`asyncrl.core.seeding.actor_seeds`), or with ``seed + i`` when ``seeds`` is None.
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

    def get_state(self) -> dict:
        """This VecEnv's state between steps, as plain values and tensors: the current
        observations, the running episode returns and lengths, and each env's own state
        (:func:`env_state`; None for an env whose state cannot be saved)."""
        return {
            "obs": torch_tensor(self.obs),
            "episode_return": torch_tensor(self.episode_return),
            "episode_length": torch_tensor(self.episode_length),
            "envs": [env_state(e) for e in self.envs],
        }

    def set_state(self, d: dict) -> bool:
        """Put back a :meth:`get_state`. Returns False, changing nothing, when an env's state was
        not saved (then the caller resets the envs: fresh episodes)."""
        if len(d["envs"]) != self.num_envs or any(e is None for e in d["envs"]):
            return False
        for env, state in zip(self.envs, d["envs"]):
            set_env_state(env, state)
        self.obs = d["obs"].numpy().astype(np.float32)
        self.episode_return = d["episode_return"].numpy().astype(np.float64)
        self.episode_length = d["episode_length"].numpy().astype(np.int64)
        return True

    def close(self) -> None:
        for env in self.envs:
            env.close()


def torch_tensor(a: np.ndarray):
    """A copy of ``a`` as a torch tensor (what a checkpoint read with weights_only=True holds)."""
    import torch

    return torch.from_numpy(np.array(a, copy=True))


# Wrappers gym.make puts around an env, and the attributes that are their whole state.
_WRAPPER_STATE = {
    "TimeLimit": ("_elapsed_steps",),
    "OrderEnforcing": ("_has_reset",),
    "PassiveEnvChecker": ("checked_reset", "checked_step", "checked_render"),
}


def env_state(env: gym.Env) -> dict | None:
    """One env's state between steps, as plain values and tensors, or None when asyncrl cannot
    save it. Saved: the wrappers of ``gym.make`` (the time limit's step count), the env's
    ``np_random`` generator, and either a MuJoCo env's whole integration state
    (``mj_getState(mjSTATE_INTEGRATION)``: positions, velocities, time, controls, warm start) or
    what an env's own ``asyncrl_state()`` method returns (paired with ``asyncrl_set_state(d)``;
    the toy envs have them). Any other env, or another wrapper, gives None."""
    wrappers, layer = [], env
    while isinstance(layer, gym.Wrapper):
        attrs = _WRAPPER_STATE.get(type(layer).__name__)
        if attrs is None:
            return None
        wrappers.append({a: getattr(layer, a) for a in attrs})
        layer = layer.env
    u = env.unwrapped
    rng = u._np_random.bit_generator.state if getattr(u, "_np_random", None) is not None else None
    out = {"wrappers": wrappers, "np_random": rng}
    if is_mujoco(env):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        sim = np.empty(mujoco.mj_stateSize(u.model, spec), np.float64)
        mujoco.mj_getState(u.model, u.data, sim, spec)
        out["mujoco"] = torch_tensor(sim)
    elif callable(getattr(u, "asyncrl_state", None)):
        out["own"] = u.asyncrl_state()
    else:
        return None
    return out


def set_env_state(env: gym.Env, d: dict) -> None:
    """Inverse of :func:`env_state` on an env made the same way."""
    layer = env
    for attrs in d["wrappers"]:
        for k, v in attrs.items():
            setattr(layer, k, v)
        if hasattr(layer, "checked_data_reuse"):  # the env checker's data-reuse check needs the last step's data
            layer.checked_data_reuse = True
        layer = layer.env
    u = env.unwrapped
    if d["np_random"] is not None:
        rng = np.random.default_rng()
        rng.bit_generator.state = d["np_random"]
        u._np_random = rng
    if "mujoco" in d:
        import mujoco

        mujoco.mj_setState(u.model, u.data, d["mujoco"].numpy().astype(np.float64), mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(u.model, u.data)
    else:
        u.asyncrl_set_state(d["own"])


def describe_space(space: gym.Space) -> str:
    """A canonical one-line description of a Box or Discrete space (shape, dtype, bounds), the
    same on every host with the same env; the handshake compares them."""
    if isinstance(space, gym.spaces.Discrete):
        return f"Discrete(n={int(space.n)}, start={int(space.start)})"
    if isinstance(space, gym.spaces.Box):
        return (
            f"Box(shape={tuple(space.shape)}, dtype={np.dtype(space.dtype).name}, "
            f"low={_bounds(space.low)}, high={_bounds(space.high)})"
        )
    return type(space).__name__


def _bounds(a: np.ndarray) -> str:
    a = np.asarray(a, np.float64).ravel()
    if a.size and (a == a[0]).all():
        return repr(float(a[0]))
    if a.size <= 8:
        return "[" + ", ".join(repr(float(x)) for x in a) + "]"
    return "sha256:" + hashlib.sha256(a.tobytes()).hexdigest()[:16]


def env_spaces(env_id: str, max_episode_steps: int = 0, module: str = "") -> dict[str, str]:
    """{"observation": ..., "action": ...} descriptions of ``env_id``'s spaces (builds one env)."""
    probe = VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps, module=module)
    try:
        return dict(probe.spaces)
    finally:
        probe.close()


def rollout_spec(
    env_id: str, *, num_envs: int, rollout_length: int, max_episode_steps: int = 0, module: str = ""
) -> RolloutSpec:
    """The RolloutSpec of ``num_envs`` copies of ``env_id`` (builds one env to read its spaces)."""
    probe = VecEnv(env_id, 1, seed=0, max_episode_steps=max_episode_steps, module=module)
    try:
        return RolloutSpec(
            obs_dim=probe.obs_dim,
            action_dim=probe.action_dim,
            discrete=probe.discrete,
            rollout_length=rollout_length,
            num_envs=num_envs,
        )
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
