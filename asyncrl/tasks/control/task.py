"""The control task: gymnasium envs, the MLP actor-critic with observation normalisation, time-major
rollouts of T steps from E envs, and the actor-critic learner iteration (V-trace / GAE, every preset).

The pieces keep their modules (``asyncrl.tasks.control.envs``, ``policy``, ``rollout``, ``update``: the names
users and the tests import); this module binds them to the task interface (asyncrl.tasks.base)
without changing a number: the calls are the ones the roles made before the interface existed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.core.spec import RolloutSpec
from asyncrl.tasks.base import WeightsInfo
from asyncrl.tasks.control.envs import VecEnv, env_spaces, rollout_spec
from asyncrl.tasks.control.evaluate import PeriodicEval
from asyncrl.tasks.control.policy import InferencePolicy, build_policy, flatten_weights, layout_hash
from asyncrl.tasks.control.rollout import RolloutStats, collect
from asyncrl.tasks.control.update import learner_iteration, warm_up_compiled_step


class ControlProducer:
    """An actor's envs (E copies of cfg.env.id, made at once: the handshake describes them) and its
    numpy copy of the policy (made by :meth:`bind`)."""

    def __init__(self, cfg):
        self.cfg = cfg
        # seeded at the first reset, once the welcome gave the run seed and this id's restart count
        self.env = VecEnv(
            cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=cfg.env.max_episode_steps, module=cfg.env.module
        )
        self.spec: RolloutSpec = self.env.spec(cfg.env.rollout_length)
        self.spaces = self.env.spaces
        self.policy: InferencePolicy | None = None
        self.seeds = None
        self.layout_hash, self.num_params = "", 0
        self.weights_dtype = "float32"  # control policies travel as float32 (numpy inference)

    def bind(self, cfg, seeds, template=None) -> None:
        if template is None:
            template = build_policy(cfg.policy, self.spec.obs_dim, self.spec.action_dim, discrete=self.spec.discrete)
        self.layout_hash = layout_hash(template)
        self.num_params = sum(p.numel() for p in template.state_dict().values())
        self.seeds = seeds
        self.policy = InferencePolicy(template, activation=cfg.policy.activation, seed=seeds.action)

    def load(self, flat: np.ndarray) -> None:
        self.policy.load(flat)

    def reset(self) -> None:
        self.env.reset(seeds=self.seeds.env)

    def collect(
        self,
        slot,
        *,
        version: int,
        guard=None,
        grant_id: int = 0,
        tick: Callable[[], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> RolloutStats:
        act = self.policy.act  # (heartbeat: unused, tick heartbeats before every env step)
        if tick is not None:

            def act(obs, _act=act):  # once per env step of all E envs
                tick()
                return _act(obs)

        return collect(self.env, act, slot, version=version, guard=guard, grant_id=grant_id)

    def state_dict(self) -> dict:
        return {"source": self.env.get_state(), "rng": self.policy.rng.bit_generator.state}

    def load_source_state(self, source: Any) -> bool:
        return self.env.set_state(source)

    def load_rng_state(self, rng: Any) -> None:
        self.policy.rng.bit_generator.state = rng

    def close(self) -> None:
        self.env.close()


class ControlTask:
    kind = "control"

    def __init__(self, cfg, *, spec: RolloutSpec | None = None):
        self.cfg = cfg
        self._spec, self._spaces = spec, None

    @property
    def id(self) -> str:
        return self.cfg.env.id

    @property
    def spec(self) -> RolloutSpec:
        if self._spec is None:  # builds one env to read its spaces
            e = self.cfg.env
            self._spec = rollout_spec(
                e.id,
                num_envs=e.num_envs,
                rollout_length=e.rollout_length,
                max_episode_steps=e.max_episode_steps,
                module=e.module,
            )
        return self._spec

    @property
    def spaces(self) -> dict[str, str]:
        if self._spaces is None:
            self._spaces = env_spaces(self.cfg.env.id, self.cfg.env.max_episode_steps, self.cfg.env.module)
        return self._spaces

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return (self.spec.obs_dim,)

    def producer(self) -> ControlProducer:
        return ControlProducer(self.cfg)

    def build_policy(self):
        s = self.spec
        return build_policy(self.cfg.policy, s.obs_dim, s.action_dim, discrete=s.discrete)

    def flat_weights(self, policy) -> np.ndarray:
        return flatten_weights(policy)

    def layout_hash(self, policy) -> str:
        return layout_hash(policy)

    def weights_info(self, policy=None) -> WeightsInfo:
        """Every parameter and buffer (observation statistics included), float32."""
        module = self.build_policy() if policy is None else policy
        count = sum(v.numel() for v in module.state_dict().values())
        return WeightsInfo(count, "float32", "every parameter and buffer")

    def make_batch(
        self, state, slots: Sequence[tuple[str, dict[str, np.ndarray]]], gaps: Sequence[bool] | None = None
    ) -> dict[str, torch.Tensor]:
        """Concatenate B slots along the env axis into [T(+1), B*E, ...] tensors; rewards are scaled
        per stream (state.reward_scaler) here, a stream with a gap restarting its running return."""
        out: dict[str, list[np.ndarray]] = {name: [] for name in self.spec.batch_field_names}
        for i, (stream, arrays) in enumerate(slots):
            if gaps is not None and gaps[i]:
                state.reward_scaler.reset(stream)
            for name in self.spec.batch_field_names:
                a = arrays[name]
                if name == "rewards" and self.cfg.learner.reward_scaling:
                    a = state.reward_scaler(stream, a, arrays["terminated"] | arrays["truncated"])
                out[name].append(a)
        return {k: torch.from_numpy(np.concatenate(v, axis=1)) for k, v in out.items()}

    def learner_iteration(self, state, batch) -> dict[str, Any]:
        previous = None if state.previous is None else state.previous.start(state.policy)  # π_{T-1}
        stats = learner_iteration(
            state.policy,
            state.optimizer,
            batch,
            cfg=self.cfg.algo,
            generator=state.generator,
            version=state.version,
            forward_context=state.forward_context,
            group=state.group,
            compile_loss=self.cfg.learner.compile,
            previous_policy=previous,
        )
        if state.previous is not None:
            state.previous.finish()
        return stats

    def warm_up(self, state) -> bool:
        if not self.cfg.learner.compile:
            return False
        lrn, spec = self.cfg.learner, self.spec
        columns = spec.num_envs * lrn.slots_per_batch // lrn.num_learners  # this member's share
        return warm_up_compiled_step(
            state.policy,
            state.optimizer,
            self.cfg.algo,
            rows=spec.rollout_length * columns // self.cfg.algo.num_minibatches,
            spec=spec,
            forward_context=state.forward_context,
            group=state.group,
        )

    def after_iteration(self, state, batch) -> None:
        if self.cfg.policy.normalize_obs:
            state.obs_rms.update(batch["obs"][:-1].reshape(-1, self.spec.obs_dim).numpy())
            state.policy.set_obs_stats(state.obs_rms)

    def periodic_eval(self, run_dir: Path | None = None) -> PeriodicEval:
        return PeriodicEval(self.cfg)

    def prepare_run(self, run_dir: Path, echo) -> None:
        return None

    def final_summary(self, policy, run_dir: Path) -> dict[str, Any]:
        return {}
