"""A data-parallel learner group: W learner processes train one policy, each on an equal share of
every batch, so that the group takes the optimizer steps one learner would take on the union.

Each member holds the same weights, optimizer state and shuffling generator. For every optimizer
step a member forms its minibatch from its own share with the shared permutation; the union of the
members' minibatches is the minibatch one learner would draw on the whole batch with
:func:`epoch_permutation` and ``shards = W``. What the update takes over a minibatch is reduced across
the group: the gradients are averaged (equal shares, so the average is the union's mean gradient,
as in PyTorch's DistributedDataParallel, Li et al. 2020, arXiv:2006.15704), the advantage
normalisation's mean and standard deviation and VACO's TV estimate (and with it the filter's
decision) are computed over the union, and the diagnostics are averaged. Gradient clipping and
Adam's step then see identical gradients on every member, so the weights stay identical.

The transport is ``torch.distributed`` (gloo on the CPU): its store does not authenticate, so a
local group meets through a file store under the run directory and gloo's sockets on the loopback
interface (docs/learner-group.md has the trust model across hosts).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _import_before_the_group() -> None:
    """Import torch.distributed.nn.functional while no default process group exists. Its collectives
    take ``group=group.WORLD`` as a default argument, evaluated at import; imported after
    ``init_process_group`` (torch imports it with torch._dynamo, which the first optimizer or compile
    pulls in), they keep the group alive past ``destroy_process_group``, and with it gloo's worker
    threads. A worker that then releases a finished collective's tensors during the interpreter's
    exit needs the GIL and aborts the process ("terminate called without an active exception",
    SIGABRT), in about one exit in ten on a loaded 2-core machine."""
    import torch.distributed.nn.functional  # noqa: F401


class GroupError(RuntimeError):
    """The learner group cannot go on: a member did not join or answer within the group's timeout
    (dead, frozen or unreachable), its weights differ from the leader's, or a message is malformed."""


class LearnerGroup:
    """One member's handle on the group: its ``rank`` (0 publishes weights), the group's size
    ``world`` and the collectives the iteration needs. Every collective waits at most the group's
    timeout for the other members, then raises ``RuntimeError`` (a dead or frozen member fails the
    group fast; the supervisor restarts it from its checkpoint)."""

    def __init__(self, rank: int, world: int, process_group=None):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"a learner group needs 0 <= rank < world and world >= 1, got rank {rank}, world {world}")
        self.rank, self.world, self.pg = rank, world, process_group
        self.last_collective = time.monotonic()  # when this member last took part in one

    @classmethod
    def join(cls, rank: int, world: int, *, init_method: str, timeout_s: float, backend: str = "gloo") -> LearnerGroup:
        """Join (or, for rank 0, open) the group at ``init_method`` (``file://PATH`` for a local group,
        ``tcp://HOST:PORT`` across hosts); blocks until all ``world`` members joined or ``timeout_s``
        passed (``RuntimeError``). A local group's gloo sockets use the loopback interface unless
        GLOO_SOCKET_IFNAME names another."""
        if init_method.startswith("file://"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        elif init_method.startswith("tcp://") and "GLOO_SOCKET_IFNAME" not in os.environ:
            iface = interface_towards(init_method[len("tcp://") :].rsplit(":", 1)[0].strip("[]"))
            if iface:  # the interface this host reaches the store's host on: the one its peers reach it on
                os.environ["GLOO_SOCKET_IFNAME"] = iface
        _import_before_the_group()
        timeout = timedelta(seconds=timeout_s)
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            raise GroupError(
                f"learner group: member {rank} of {world} could not join at {init_method} within {timeout_s:g} s: "
                f"{_first_line(exc)}"
            ) from None
        return cls(rank, world, dist.group.WORLD)

    def _call(self, fn, *args, **kw):
        """A collective; GroupError when a member does not take part within the timeout or is gone."""
        try:
            fn(*args, group=self.pg, **kw)
        except RuntimeError as exc:
            raise GroupError(f"learner group: member {self.rank} of {self.world}: {_first_line(exc)}") from None
        self.last_collective = time.monotonic()

    def close(self) -> None:
        if self.pg is not None and dist.is_initialized():
            dist.destroy_process_group()
        self.pg = None

    # ---- collectives (no gradient flows through them) ----
    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``t`` over the members (a new tensor; ``t`` untouched)."""
        out = t.detach().clone()
        self._call(dist.all_reduce, out, op=dist.ReduceOp.SUM)
        return out

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise mean of ``t`` over the members: over equal shares, the union's mean of
        a per-member mean."""
        return self.sum(t) / self.world

    def max(self, t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        self._call(dist.all_reduce, out, op=dist.ReduceOp.MAX)
        return out

    def average_gradients(self, params: list[torch.Tensor], flat: torch.Tensor | None = None) -> None:
        """Replace every parameter's gradient by its mean over the members, in one all-reduce, in
        place: ``flat`` when the gradients are views of that one buffer (asyncrl.core.optim.FlatAdam),
        else their concatenation, copied back (a parameter without a gradient gets a zero one)."""
        if flat is None:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            buf = torch.cat([p.grad.reshape(-1) for p in params])
        else:
            buf = flat
        self._call(dist.all_reduce, buf, op=dist.ReduceOp.SUM)
        buf /= self.world
        if flat is None:
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(buf[offset : offset + n].view_as(p))
                offset += n

    def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with member ``src``'s (same shapes and dtypes on every member)."""
        for t in tensors:
            self._call(dist.broadcast, t, src=src)

    def scatter(self, out: torch.Tensor, shares: list[torch.Tensor] | None) -> None:
        """``out`` in place: rank 0's ``shares[rank]`` (``shares`` None on the other members)."""
        self._call(dist.scatter, out, scatter_list=shares, src=0)


def interface_towards(host: str) -> str | None:
    """The name of this host's network interface whose IPv4 address is the source of its route to
    ``host`` (``lo`` for this host itself), or None when that cannot be told (no route, no such
    interface, not Linux): gloo then picks by the host name."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))  # UDP: no packet is sent
            local = s.getsockname()[0]
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                except OSError:
                    continue
                if socket.inet_ntoa(packed[20:24]) == local:
                    return name
    except OSError:
        return None
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def shard_columns(n: int, world: int) -> int:
    """Columns (env streams) per member when ``n`` are split over ``world`` members.
    Raises ValueError unless ``world`` divides ``n``: the members' shares must be equal for their
    averaged gradient to be the union's."""
    if world < 1 or n % world:
        raise ValueError(f"a batch of {n} env streams cannot be split into {world} equal shares")
    return n // world


def epoch_permutation(
    T: int, N: int, num_minibatches: int, generator: torch.Generator, shards: int = 1
) -> torch.Tensor:
    """One epoch's order of the flat time-major samples (index t * N + n of a [T, N] batch): its
    consecutive chunks of ``len // num_minibatches`` are the minibatches.

    ``shards = 1``: ``torch.randperm(T * N)`` (one learner). ``shards = W``: the order a group of W
    members takes, each holding the columns [i N/W, (i+1) N/W): one permutation p of a share's
    T N/W samples, drawn once (every member draws the same from its copy of the generator), and
    minibatch k the union over members of each one's slice k of p. A member of a group calls it with
    its own share and ``shards = 1``; a single learner with ``shards = W`` takes the group's steps
    (the reference the group is tested against). Samples left over by the division are dropped.

    Returns:
        int64 [num_minibatches * m] (m = samples per minibatch), on the CPU.
    Raises:
        ValueError: ``shards`` does not divide N.
    """
    if shards == 1:
        return torch.randperm(T * N, generator=generator)
    n_local = shard_columns(N, shards)
    size = T * n_local
    per = size // num_minibatches
    p = torch.randperm(size, generator=generator)[: per * num_minibatches].view(num_minibatches, 1, per)
    member = torch.arange(shards).view(1, shards, 1)
    union = (p // n_local) * N + member * n_local + p % n_local  # [minibatches, members, per]
    return union.reshape(-1)


def column_groups(N: int, groups: int, generator: torch.Generator, shards: int = 1) -> list[torch.Tensor]:
    """IMPALA's minibatches, groups of whole columns of a [T, N] batch: ``torch.randperm(N)`` in
    ``groups`` chunks (``shards = 1``), or with ``shards = W`` the union over the W members of each
    one's chunk of the shared permutation of its N/W columns (as :func:`epoch_permutation`)."""
    if shards == 1:
        return list(torch.randperm(N, generator=generator).chunk(groups))
    n_local = shard_columns(N, shards)
    chunks = torch.randperm(n_local, generator=generator).chunk(groups)
    return [torch.cat([c + i * n_local for i in range(shards)]) for c in chunks]
