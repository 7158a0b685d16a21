"""The one table of rollout fields. Shared memory and the wire both derive from it.

:class:`SlotSpec` is what every task kind shares (offsets, views, layout hash); each task kind
says which fields a slot has (:class:`RolloutSpec` for control here, ``asyncrl.tasks.llm.spec``
for language models).

A control *slot* holds one actor's E parallel rollouts of T steps, time-major. Index convention (docs/vaco-paper.md):
``rewards[t]`` follows ``actions[t]`` taken in ``obs[t]``; ``obs`` has T+1 rows so the learner can
bootstrap from ``obs[T]``. ``final_obs[t]`` is meaningful only where ``truncated[t]`` (the
observation the episode ended in, before the automatic reset wrote the next episode's first
observation into ``obs[t+1]``). ``grant_id[t]`` is written last in row t: the grant the writer of
that row held. It is an audit of slot integrity independent of the generation check in wire/shm/ring.py
(the learner compares every row's tag with the grant whose report it accepted); it is not
training data (``batch_field_names`` leaves it out).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# The largest magnitude of any float a peer sends, in a message header or a slot: finite values past it
# (e.g. +-1e20 observations, whose running variance overflows float32, or +-3e38 rewards) are refused.
# 1e15 keeps squares and sums of such values inside float32 (3.4e38) and far above any env's scale.
MAX_ABS_FLOAT = 1e15

AUDIT_FIELDS = ("grant_id",)


class Field(NamedTuple):
    name: str
    shape: tuple[int, ...]  # full shape inside one slot
    dtype: np.dtype


class SlotSpec:
    """What shared memory, the wire and the learner's checks need of one slot, whatever the task:
    a subclass gives ``fields`` (name, shape, dtype; ``behavior_version`` and ``grant_id`` among
    them), ``to_dict`` (compared at the handshake), ``num_envs`` x ``rollout_length`` (the most
    episodes one slot can end: the wire's limits on a report) and may add value checks
    (:meth:`invalid_values`)."""

    num_envs: int
    rollout_length: int

    @property
    def fields(self) -> tuple[Field, ...]:
        raise NotImplementedError

    @property
    def log_probabilities(self) -> bool:
        """True when ``behavior_log_prob`` holds log-probabilities (<= 0: discrete actions, tokens),
        False for log-densities (continuous actions: any sign)."""
        return False

    def to_dict(self) -> dict:
        raise NotImplementedError

    def invalid_values(self, arrays: dict[str, np.ndarray]) -> tuple[str, str] | None:
        """(reason, detail) if a slot's values are out of range for this task (beyond the finite
        floats and behaviour versions every slot is checked for); None if they are fine."""
        return None

    def episode_mismatch(self, arrays: dict[str, np.ndarray], returns: list[float], lengths: list[int]) -> str | None:
        """One line if a report's episode statistics (``returns``, ``lengths``: one per episode it
        says the slot ended) cannot be those of the slot's ``arrays``; None if they can. Base rule:
        one length (>= 1) per return, at most ``num_envs * rollout_length`` episodes."""
        if len(returns) != len(lengths):
            return f"{len(returns)} episode returns but {len(lengths)} lengths"
        if len(returns) > self.num_envs * self.rollout_length:
            return f"{len(returns)} episodes, a slot ends at most {self.num_envs * self.rollout_length}"
        if any(n < 1 for n in lengths):
            return "an episode of length 0"
        return None

    def episode_statistics(
        self, arrays: dict[str, np.ndarray], returns: list[float], lengths: list[int]
    ) -> tuple[list[float], list[int]]:
        """The episode returns and lengths to record for a report ``episode_mismatch`` accepted
        (base: the report's own)."""
        return list(returns), list(lengths)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def batch_field_names(self) -> tuple[str, ...]:
        """The fields a learner iteration trains on (all but the audit tags)."""
        return tuple(n for n in self.field_names if n not in AUDIT_FIELDS)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no rollout field {name!r}; fields are {self.field_names}")

    def offsets(self) -> dict[str, int]:
        """Byte offset of each field inside one slot (each field 64-byte aligned)."""
        out, off = {}, 0
        for f in self.fields:
            out[f.name] = off
            off += _align(int(np.prod(f.shape)) * f.dtype.itemsize)
        return out

    @property
    def slot_nbytes(self) -> int:
        last = self.fields[-1]
        return self.offsets()[last.name] + _align(int(np.prod(last.shape)) * last.dtype.itemsize)

    def allocate(self) -> dict[str, np.ndarray]:
        """Zeroed arrays for one slot in ordinary (non-shared) memory."""
        return {f.name: np.zeros(f.shape, f.dtype) for f in self.fields}

    def views(self, buf, base: int = 0) -> dict[str, np.ndarray]:
        """Numpy views of one slot that starts at byte ``base`` of ``buf`` (a buffer object)."""
        offs = self.offsets()
        return {f.name: np.ndarray(f.shape, f.dtype, buffer=buf, offset=base + offs[f.name]) for f in self.fields}

    @property
    def layout_hash(self) -> str:
        text = ";".join(f"{f.name}:{f.shape}:{f.dtype.str}" for f in self.fields)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RolloutSpec(SlotSpec):
    """Shapes of one slot.

    Args:
        obs_dim: length of the flat observation vector.
        action_dim: action vector length A (continuous), or the number of actions K (discrete).
        discrete: True for a categorical action space (actions stored as int64 indices [T, E]).
        rollout_length: T, env steps per rollout.
        num_envs: E, parallel envs (one rollout each) per slot.
    """

    obs_dim: int
    action_dim: int
    discrete: bool
    rollout_length: int
    num_envs: int

    def __post_init__(self):
        for name in ("obs_dim", "action_dim", "rollout_length", "num_envs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RolloutSpec.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def fields(self) -> tuple[Field, ...]:
        T, E, D = self.rollout_length, self.num_envs, self.obs_dim
        act = (
            Field("actions", (T, E), np.dtype(np.int64))
            if self.discrete
            else Field("actions", (T, E, self.action_dim), np.dtype(np.float32))
        )
        return (
            Field("obs", (T + 1, E, D), np.dtype(np.float32)),
            act,
            Field("behavior_log_prob", (T, E), np.dtype(np.float32)),
            Field("behavior_version", (T, E), np.dtype(np.int64)),
            Field("rewards", (T, E), np.dtype(np.float32)),
            Field("terminated", (T, E), np.dtype(np.bool_)),
            Field("truncated", (T, E), np.dtype(np.bool_)),
            Field("final_obs", (T, E, D), np.dtype(np.float32)),
            Field("grant_id", (T, E), np.dtype(np.int64)),
        )

    @property
    def log_probabilities(self) -> bool:
        return self.discrete

    def to_dict(self) -> dict:
        return {
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "discrete": self.discrete,
            "rollout_length": self.rollout_length,
            "num_envs": self.num_envs,
        }

    def episode_mismatch(self, arrays: dict[str, np.ndarray], returns: list[float], lengths: list[int]) -> str | None:
        """The base rule, no more episodes than the slot's episode ends (terminated or truncated
        steps), and, when the report lists one episode per end (in the order the actor finds them:
        step-major, env-minor), each episode checked against the slot: one that starts inside it
        (after an earlier end of its env) has exactly the steps between the two ends and their
        reward sum as return (within 1e-6 of the rewards' absolute sum: the slot holds them as
        float32); one that started before the slot (its first end in its env) is at least as long
        as the steps of it in the slot (its earlier rewards are not here to check). The actor leaves
        out episodes whose return is not finite, so fewer episodes are legal: then
        ``episode_statistics`` keeps only what the slot shows."""
        bad = super().episode_mismatch(arrays, returns, lengths)
        if bad is not None:
            return bad
        steps, envs = np.nonzero(arrays["terminated"] | arrays["truncated"])
        if len(returns) > len(steps):
            return f"{len(returns)} episodes, the slot ends {len(steps)}"
        if len(returns) < len(steps):
            return None
        rewards = arrays["rewards"]
        last_end: dict[int, int] = {}
        for k, (t, i) in enumerate(zip(steps.tolist(), envs.tolist())):
            if i in last_end:
                start = last_end[i] + 1
                if lengths[k] != t + 1 - start:
                    return (
                        f"episode {k} (env {i}, ends at step {t}): length {lengths[k]}, the slot holds {t + 1 - start}"
                    )
                span = rewards[start : t + 1, i].astype(np.float64)
                if abs(returns[k] - float(span.sum())) > 1e-6 * float(np.abs(span).sum()) + 1e-6:
                    return (
                        f"episode {k} (env {i}, ends at step {t}): return {returns[k]!r:.20}, its rewards in the "
                        f"slot sum to {float(span.sum())!r:.20}"
                    )
            elif lengths[k] < t + 1:
                return f"episode {k} (env {i}, ends at step {t}): length {lengths[k]} < its {t + 1} steps in the slot"
            last_end[i] = t
        return None

    def episode_statistics(
        self, arrays: dict[str, np.ndarray], returns: list[float], lengths: list[int]
    ) -> tuple[list[float], list[int]]:
        """The episode returns and lengths to record for a report ``episode_mismatch`` accepted: the
        report's when it lists one episode per end (checked there), else (the actor left some out)
        only the episodes that start and end inside the slot, recomputed from its rewards."""
        steps, envs = np.nonzero(arrays["terminated"] | arrays["truncated"])
        if len(returns) == len(steps):
            return list(returns), list(lengths)
        out_r, out_l, last_end = [], [], {}
        for t, i in zip(steps.tolist(), envs.tolist()):
            if i in last_end:
                out_r.append(float(arrays["rewards"][last_end[i] + 1 : t + 1, i].astype(np.float64).sum()))
                out_l.append(t - last_end[i])
            last_end[i] = t
        return out_r, out_l

    def invalid_values(self, arrays: dict[str, np.ndarray]) -> tuple[str, str] | None:
        if self.discrete:
            a = arrays["actions"]
            if a.min() < 0 or a.max() >= self.action_dim:
                return "action", f"action indices {a.min()}..{a.max()} outside 0..{self.action_dim - 1}"
        return None


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to
