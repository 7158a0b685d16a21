"""What a learner group's leader (rank 0, the learner role) and its other members exchange, over the
group's own collectives (asyncrl.core.learner_group): the leader's state once at the start, then per
iteration a header (iterate or stop, the learning rate, the policy version), each member's equal
share of the batch (whole env streams), and after the iteration the leader's buffers (the
observation statistics it updated from the whole batch) and a check that every member holds the
same weights. Everything travels as tensors of a fixed layout; the state snapshot is read with
``torch.load(weights_only=True)``, as a checkpoint is: nothing is unpickled.
"""

from __future__ import annotations

import io
import logging
import time
from typing import Any

import torch

from asyncrl.core.background import Warmup
from asyncrl.core.learner_group import GroupError, LearnerGroup, shard_columns

log = logging.getLogger("asyncrl.learner")

STOP, ITERATE, IDLE = 0.0, 1.0, 2.0
_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.int8, torch.int16]
_MAX_DIMS = 6
_MAX_NAMES = 4096  # bytes of the batch's field names


def _broadcast_bytes(group: LearnerGroup, data: bytes | None, limit: int) -> bytes:
    """``data`` from rank 0 to every member (None on the others); GroupError past ``limit`` bytes."""
    n = torch.tensor([0 if data is None else len(data)], dtype=torch.int64)
    group.broadcast([n])
    size = int(n)
    if not 0 <= size <= limit:
        raise GroupError(f"learner group: a message of {size} bytes (at most {limit})")
    if size == 0:
        return b""
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data is not None
        else torch.empty(size, dtype=torch.uint8)
    )
    group.broadcast([buf])
    return bytes(buf.numpy())


# ---- the state, once per group start ----
def send_state(group: LearnerGroup, state) -> None:
    """Rank 0: the policy, optimizer and shuffling generator of ``state`` (a LearnerState, fresh or
    resumed from a checkpoint) to every member, so they start identical."""
    buf = io.BytesIO()
    snapshot = {
        "policy": state.policy.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "generator": state.generator.get_state(),
        "version": state.version,
        "previous_policy": None if state.previous is None else state.previous.state_dict(),
    }
    torch.save(snapshot, buf)
    _broadcast_bytes(group, buf.getvalue(), limit=1 << 40)


def receive_state(group: LearnerGroup, state) -> None:
    """A member: load the leader's snapshot (:func:`send_state`) into ``state``."""
    data = _broadcast_bytes(group, None, limit=1 << 40)
    snap = torch.load(io.BytesIO(data), weights_only=True)
    state.policy.load_state_dict(snap["policy"])
    state.optimizer.load_state_dict(snap["optimizer"])
    state.generator.set_state(snap["generator"])
    state.version = int(snap["version"])
    if state.previous is not None:
        state.previous.load_state_dict(snap.get("previous_policy"))


# ---- each iteration ----
def send_iteration(group: LearnerGroup, batch: dict[str, torch.Tensor], *, lr: float, version: int) -> dict:
    """Rank 0: the header and every member's share of ``batch`` ([T(+1), N, ...] CPU tensors split
    into equal blocks of columns); returns rank 0's own share."""
    group.broadcast([torch.tensor([ITERATE, lr, float(version)], dtype=torch.float64)])
    names = sorted(batch)
    _broadcast_bytes(group, "\n".join(names).encode(), _MAX_NAMES)
    n = shard_columns(batch[names[0]].shape[1], group.world)
    own = {}
    for name in names:
        v = batch[name]
        shares = [v[:, r * n : (r + 1) * n].contiguous() for r in range(group.world)]
        meta = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
        meta[0], meta[1] = _DTYPES.index(v.dtype), v.dim()
        meta[2 : 2 + v.dim()] = torch.tensor(shares[0].shape)
        group.broadcast([meta])
        wire = [s.view(torch.uint8) if s.dtype == torch.bool else s for s in shares]
        out = torch.empty_like(wire[0])
        group.scatter(out, wire)
        own[name] = shares[0]
    return own


def send_stop(group: LearnerGroup) -> None:
    """Rank 0: tell every member the run is over (they exit 0)."""
    group.broadcast([torch.tensor([STOP, 0.0, 0.0], dtype=torch.float64)])


def send_idle(group: LearnerGroup) -> None:
    """Rank 0, while it waits for rollouts: a header that says "no iteration yet", so a member waiting
    for the next one does not take the wait for a dead leader (learner.group_timeout_s)."""
    group.broadcast([torch.tensor([IDLE, 0.0, 0.0], dtype=torch.float64)])


def receive_iteration(group: LearnerGroup) -> tuple[dict[str, torch.Tensor], float, int] | None:
    """A member: (its share of the batch, the learning rate, the policy version), or None when the
    leader said stop. GroupError for a malformed header or field."""
    header = torch.full((3,), IDLE, dtype=torch.float64)
    while header[0] == IDLE:
        group.broadcast([header])
    if header[0] == STOP:
        return None
    if header[0] != ITERATE:
        raise GroupError(f"learner group: unknown command {float(header[0])}")
    names = _broadcast_bytes(group, None, _MAX_NAMES).decode().split("\n")
    share = {}
    for name in names:
        meta = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
        group.broadcast([meta])
        code, ndim = int(meta[0]), int(meta[1])
        if not (0 <= code < len(_DTYPES) and 1 <= ndim <= _MAX_DIMS):
            raise GroupError(f"learner group: field {name!r} of dtype code {code} and {ndim} dims")
        dtype = _DTYPES[code]
        shape = [int(d) for d in meta[2 : 2 + ndim]]
        out = torch.empty(shape, dtype=torch.uint8 if dtype == torch.bool else dtype)
        group.scatter(out, None)
        share[name] = out.view(torch.bool) if dtype == torch.bool else out
    return share, float(header[1]), int(header[2])


def after_iteration(group: LearnerGroup, policy: torch.nn.Module) -> None:
    """Every member, after the iteration: rank 0's buffers (observation statistics) to all, then a
    check that the weights agree to the bit (their float64 sums; GroupError otherwise)."""
    group.broadcast(list(policy.buffers()))
    with torch.no_grad():
        s = torch.stack([p.detach().double().sum() for p in policy.parameters()]).sum()
    spread = group.max(torch.stack([s, -s]))
    if float(spread[0]) != -float(spread[1]):
        raise GroupError(
            f"learner group: the members' weights differ (their sums span {float(spread[1])} to {float(spread[0])})"
        )


def follow(group: LearnerGroup, state, iterate: Any, warm_up: Any = None) -> int:
    """A member's loop: take the leader's state, then for each iteration its share, the learning rate
    and version, run ``iterate(state, share)`` (the task's learner iteration with the group), and
    :func:`after_iteration`; returns the number of iterations when the leader says stop. ``warm_up()``:
    started in a thread once the state is in, while this member waits for the first share (the leader
    does the same while it serves), and waited for before the first iteration."""
    receive_state(group, state)
    warming = None if warm_up is None else Warmup(warm_up, name="member-warm-up", log=log)
    done = 0
    while (msg := receive_iteration(group)) is not None:
        if warming is not None:
            warming.wait()
            warming = None
        share, lr, version = msg
        for g in state.optimizer.param_groups:
            g["lr"] = lr
        state.version = version
        iterate(state, share)
        after_iteration(group, state.policy)
        done += 1
    return done


# ---- the leader's side of a run (the learner role) ----
def lead(cfg, state, init_method: str, echo) -> LearnerGroup:
    """Open the group as rank 0 (waits up to learner.group_timeout_s for the other members; RuntimeError
    past it) and give them ``state``, fresh or resumed; returns the group."""
    lrn = cfg.learner
    echo(f"learner: waiting for the {lrn.num_learners - 1} other members of the learner group")
    group = LearnerGroup.join(0, lrn.num_learners, init_method=init_method, timeout_s=lrn.group_timeout_s)
    send_state(group, state)
    return group


def keep_alive(group: LearnerGroup | None, timeout_s: float) -> None:
    """Rank 0 while it waits for rollouts: an idle header once a quarter of the members' timeout passed
    since the last collective (none without a group)."""
    if group is not None and time.monotonic() - group.last_collective > timeout_s / 4:
        send_idle(group)


def stop(group: LearnerGroup | None) -> None:
    """Rank 0 at the end: tell the members to exit, and leave the group. A member that is gone
    already is logged (the others fail on their timeout)."""
    if group is None:
        return
    try:
        send_stop(group)
    except GroupError as exc:
        log.warning("learner: could not stop the learner group: %s", exc)
    group.close()
