"""A learner group's other members (ranks 1 .. W-1): each holds a copy of the policy and optimizer,
trains on its share of every batch with the gradients and minibatch statistics reduced over the
group (asyncrl.core.learner_group), and talks to nobody but the group: the learner role (rank 0)
receives the rollouts, accounts for lag, publishes the weights and writes the checkpoints. A member
exits 0 when the learner says the run is over; a dead or frozen peer fails it after
``learner.group_timeout_s`` (the supervisor then restarts the whole group from the checkpoint).
"""

from __future__ import annotations

import logging
import os

import torch

from asyncrl.core import group_sync
from asyncrl.core.config import Config
from asyncrl.core.device import to_device
from asyncrl.core.learner_group import LearnerGroup
from asyncrl.core.state import LearnerState
from asyncrl.tasks import make_task

log = logging.getLogger("asyncrl.learner")


class LearnerMember:
    """Member ``rank`` (1 <= rank < learner.num_learners) of the group that meets at ``init_method``
    (``file://PATH`` on one host, ``tcp://HOST:PORT`` across hosts). Raises ValueError for a rank
    outside the group, RuntimeError when the group does not gather within learner.group_timeout_s."""

    def __init__(self, cfg: Config, *, rank: int, init_method: str):
        world = cfg.learner.num_learners
        if not 1 <= rank < world:
            raise ValueError(
                f"learner member: rank {rank} is not one of 1 .. {world - 1} (learner.num_learners = {world})"
            )
        self.cfg, self.rank = cfg, rank
        torch.set_num_threads(cfg.learner.torch_threads)
        task = make_task(cfg)
        self.state = LearnerState(cfg, task.spec, task)
        self.group = LearnerGroup.join(rank, world, init_method=init_method, timeout_s=cfg.learner.group_timeout_s)
        self.iterations = 0

    def _iterate(self, state: LearnerState, share: dict[str, torch.Tensor]) -> None:
        state.task.learner_iteration(state, to_device(share, state.device))

    def run(self) -> int:
        """Follow the leader until it says stop; returns the iterations trained."""
        self.state.group = self.group  # the task's iteration reduces over it
        iface = os.environ.get("GLOO_SOCKET_IFNAME") or "chosen by gloo"
        log.info("learner member %d of %d: joined (gloo sockets on %s)", self.rank, self.group.world, iface)
        self.iterations = group_sync.follow(
            self.group, self.state, self._iterate, warm_up=lambda: self.state.task.warm_up(self.state)
        )
        return self.iterations

    def close(self) -> None:
        self.group.close()
