"""Collect one rollout of T steps from E envs into a slot (numpy views; shared memory or not).

No sockets here, so it is testable alone and shared by the actor role and serial mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from asyncrl.tasks.base import RolloutStats
from asyncrl.tasks.control.envs import VecEnv

ActFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def collect(
    env: VecEnv, act: ActFn, slot: dict[str, np.ndarray], *, version: int, guard=None, grant_id: int = 0
) -> RolloutStats:
    """Fill ``slot`` (fields of :class:`asyncrl.core.spec.RolloutSpec`) with T steps.

    Args:
        env: the actor's envs; ``env.obs`` ([E, D]) must hold the current observation
            (call ``env.reset()`` once before the first rollout). Rollouts continue each other:
            ``obs[T]`` of one rollout is ``obs[0]`` of the next, and may span episodes.
        act: obs [E, D] float32 -> (unclipped actions [E, A] or [E], log-probs [E]).
        slot: views of one slot; T is taken from ``slot["rewards"].shape[0]``.
        version: behaviour policy version recorded for every step.
        guard: a :class:`asyncrl.wire.shm.ring.WriteGuard` for a shared-memory slot, or None. It is asked
            before and after each row is written; once it says the slot is no longer this
            writer's, collection stops at once and the stats say ``revoked`` (the partial slot
            must not be reported; the envs have moved on by the steps taken).
        grant_id: the grant this rollout is written under (the guard's, when there is one),
            written into ``slot["grant_id"][t]`` as the last write of each row t (the learner's
            independent audit of slot integrity).
    """
    if guard is not None:
        grant_id = guard.grant_id
    T = slot["rewards"].shape[0]
    obs = slot["obs"]
    returns, lengths = [], []
    env_s = inference_s = 0.0
    clock = time.perf_counter
    if guard is not None and not guard.may_write():
        return RolloutStats(0, returns, lengths, env_s, inference_s, revoked=True)
    obs[0] = env.obs
    for t in range(T):
        if guard is not None and not (guard.wrote() and guard.may_write()):
            return RolloutStats(t * env.num_envs, returns, lengths, env_s, inference_s, revoked=True)
        t0 = clock()
        actions, log_prob = act(obs[t])
        t1 = clock()
        slot["actions"][t] = actions
        slot["behavior_log_prob"][t] = log_prob
        slot["behavior_version"][t] = version
        step, finished = env.step(actions)
        t2 = clock()
        inference_s += t1 - t0
        env_s += t2 - t1
        slot["rewards"][t] = step.rewards
        slot["terminated"][t] = step.terminated
        slot["truncated"][t] = step.truncated
        slot["final_obs"][t] = step.final_obs
        obs[t + 1] = step.obs
        slot["grant_id"][t] = grant_id
        for ret, length in finished:
            returns.append(ret)
            lengths.append(length)
    if guard is not None and not guard.wrote():
        return RolloutStats(T * env.num_envs, returns, lengths, env_s, inference_s, revoked=True)
    return RolloutStats(T * env.num_envs, returns, lengths, env_s, inference_s)
