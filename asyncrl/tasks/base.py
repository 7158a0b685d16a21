"""The task interface: what differs between task kinds. The roles (actor, learner, broadcaster),
the transport, the shared-memory slot ring and the lag accounting are one copy each and reach a
task only through these two objects.

``Task`` is the learner's side (and the handshake's description); ``Producer`` is an actor's side:
the source of rollouts (gymnasium envs, a stream of prompts) and its copy of the policy. Both are
made from a :class:`asyncrl.core.config.Config` by :func:`asyncrl.tasks.make_task`.

Implementations: :mod:`asyncrl.tasks.control` (gymnasium / MuJoCo, the MLP actor-critic) and
:mod:`asyncrl.tasks.llm.task` (a causal language model, verifiable math rewards, GRPO advantages).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:  # annotations only: importing these here would pull gymnasium into every task
    import torch

    from asyncrl.core.seeding import ActorSeeds
    from asyncrl.core.spec import SlotSpec
    from asyncrl.core.state import LearnerState


class RolloutStats(NamedTuple):
    """What filling one slot gave (:meth:`Producer.collect`)."""

    env_steps: int  # T * E
    episode_returns: list[float]  # undiscounted, raw rewards, episodes that ended in this rollout
    episode_lengths: list[int]
    env_s: float  # seconds spent in env.step (simulation, clipping, bookkeeping)
    inference_s: float  # seconds spent choosing actions
    revoked: bool = False  # the guard stopped it: the slot was no longer this writer's


WEIGHTS_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}  # bytes per element of each wire dtype


class WeightsInfo(NamedTuple):
    """One published version's payload: the flat buffer the broadcaster carries (:meth:`Task.weights_info`)."""

    parameters: int  # elements of the flat buffer [P]
    dtype: str  # its element type on the wire: float32, float16 or bfloat16
    holds: str  # what the elements are, e.g. "every parameter" or "the LoRA adapter of rank 16"

    @property
    def nbytes(self) -> int:
        """Bytes of the payload (the weights message's largest frame)."""
        return self.parameters * WEIGHTS_ITEMSIZE[self.dtype]

    @property
    def mib(self) -> float:
        """The payload in MiB, rounded up to 1/100 (a value of ``--max-weights-mb`` that takes it)."""
        return math.ceil(self.nbytes * 100 / (1 << 20)) / 100

    def describe(self) -> str:
        return f"{self.parameters:,} parameters as {self.dtype}, {self.holds}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes_per_version": self.nbytes,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "holds": self.holds,
        }


class RowGuard(Protocol):
    """The writer's check of a slot's ownership around each row (the slot ring's write guard):
    ``may_write()`` before a row, ``wrote()`` after it; both False once the grant is no longer the
    slot's, and the producer then stops writing."""

    grant_id: int

    def may_write(self) -> bool: ...

    def wrote(self) -> bool: ...


class Producer(Protocol):
    """An actor's side of a task (actor processes and serial mode's actor groups alike)."""

    spec: SlotSpec  # the fields of the slots it writes
    spaces: dict[str, str]  # what the learner compares at the handshake
    layout_hash: str  # of its flat weight buffer (after bind)
    num_params: int  # elements in that buffer (after bind)
    weights_dtype: str  # their wire dtype (after bind): float32, float16 or bfloat16

    def bind(self, cfg, seeds: ActorSeeds, template=None) -> None:
        """Make the policy copy for a session with a learner of config ``cfg`` and seed its
        streams (``template``: a learner-side policy to copy the layout from; None: build one)."""

    def load(self, flat: np.ndarray) -> None:
        """Take the weights of one policy version from the broadcaster's flat buffer (float32; the llm
        task's also float16, or bfloat16 as uint16 bit patterns: :meth:`Task.weights_info`'s dtype)."""

    def reset(self) -> None:
        """Start the session's streams (envs reset / prompt stream started) from the bound seeds."""

    def collect(
        self,
        slot: dict[str, np.ndarray],
        *,
        version: int,
        guard: RowGuard | None = None,
        grant_id: int = 0,
        tick: Callable[[], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> RolloutStats:
        """Fill one slot (row by row, ``grant_id`` written last in each row, ``guard`` asked around
        every row) with data of policy ``version``; ``tick`` is called while it works (the
        actor's heartbeat and straggler sleep), ``heartbeat`` (the actor's heartbeat alone, cheap and
        never sleeping) at least every few tenths of a second from the calling thread while a long
        step runs elsewhere (the llm task's generation in a worker thread)."""

    def state_dict(self) -> dict:
        """What serial mode checkpoints to go on bit-identically: {"source": ..., "rng": ...}."""

    def load_source_state(self, source: Any) -> bool:
        """Restore the source of ``state_dict()["source"]``; False if it cannot be restored."""

    def load_rng_state(self, rng: Any) -> None: ...

    def close(self) -> None: ...


class PeriodicEvaluation(Protocol):
    """The evaluation during training (control: ``run.eval_every``; llm: ``llm.eval_every``), owned by
    the learner's consumer: checked after each learner iteration, run once the caller has published
    the new version (asyncrl.core.consume.Consumer.evaluate_pending)."""

    next_at: int  # when the next evaluation is due (control: env steps; llm: learner iterations; checkpointed)

    def due(self, env_steps: int, iteration: int) -> bool: ...

    def __call__(
        self, policy, *, env_steps: int, iteration: int, tick: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """Evaluate ``policy`` now: the ``eval_*`` scalars written to metrics.jsonl. ``tick`` is called
        between pieces of a long evaluation (the learner answers its peers there)."""

    def describe(self, result: dict[str, Any]) -> str:
        """One line for the console of what ``result`` (of ``__call__``) says."""

    def close(self) -> None: ...


class NoPeriodicEvaluation:
    """A task without evaluation during training: never due."""

    next_at = 0

    def due(self, env_steps: int, iteration: int) -> bool:
        return False

    def __call__(self, policy, *, env_steps: int, iteration: int, tick=None) -> dict[str, float]:
        raise RuntimeError("this task has no evaluation during training")

    def describe(self, result: dict[str, Any]) -> str:
        return ""

    def close(self) -> None:
        pass


class Task(Protocol):
    """The learner's side of a task."""

    kind: str  # "control" or "llm" (config task.kind)
    id: str  # compared at the handshake: the env id, or the task's model and problems
    spec: SlotSpec
    spaces: dict[str, str]
    obs_shape: tuple[int, ...]  # of the observation statistics the policy carries (() when none)

    def producer(self) -> Producer: ...

    def build_policy(self) -> torch.nn.Module:
        """The learner's policy (the caller has seeded torch's global generator)."""

    def flat_weights(self, policy) -> np.ndarray:
        """The broadcaster's payload: the weights of ``policy`` that travel, as one contiguous [P]
        array of the wire dtype (control: every weight, float32)."""

    def weights_info(self, policy=None) -> WeightsInfo:
        """What one published version carries (parameters, wire dtype, bytes) for ``policy``, or,
        without one, computed from the config alone (the llm task builds its model on torch's meta
        device: no memory, no weights read), e.g. to size the broadcaster's limits before a run."""

    def layout_hash(self, policy) -> str:
        """16 hex digits naming the flat buffer's names, shapes and order."""

    def make_batch(
        self, state: LearnerState, slots: Sequence[tuple[str, dict[str, np.ndarray]]], gaps: Sequence[bool] | None
    ) -> dict[str, torch.Tensor]:
        """One batch (copied tensors) from B slots (stream key, field arrays); ``gaps[i]``: slot i
        does not follow its stream's previous slot."""

    def learner_iteration(self, state: LearnerState, batch: dict) -> dict[str, Any]:
        """Epochs x minibatches of the configured preset on ``batch``, in place on state.policy
        and state.optimizer; returns the iteration's scalars (and ``minibatches`` rows)."""

    def warm_up(self, state: LearnerState) -> bool:
        """Before the first iteration, what it would otherwise pay inside it (control, with
        learner.compile: the compile of its optimizer step, on placeholder minibatches of the run's
        shapes), touching no state; safe in a thread while the learner serves. True when done, False
        when there is nothing to do or it failed (logged; the iteration then takes its eager path)."""

    def after_iteration(self, state: LearnerState, batch: dict) -> None:
        """What the learner updates besides the weights (control: observation statistics)."""

    def periodic_eval(self, run_dir: Path) -> PeriodicEvaluation:
        """The evaluation during training of the run in ``run_dir`` (control: ``run.eval_every``,
        episodes with the mean action on an env of its own; llm: ``llm.eval_every``, the held-out
        evaluation; :class:`NoPeriodicEvaluation` when there is none)."""

    def prepare_run(self, run_dir: Path, echo: Callable[[str], None]) -> None:
        """Before the roles start (``asyncrl run``, serial or not): e.g. make and warm up a model."""

    def final_summary(self, policy, run_dir: Path) -> dict[str, Any]:
        """Keys added to summary.json of a finished run (control: none)."""
