"""The learner's bookkeeping of its peers: who is joined (``ActorInfo``: connection, token, grants
asked for, lease), the per-peer bounds (ids per connection, queue depths, messages per serve, join
records kept), the grants of free slots to the actors that asked (longest-unserved first), and the
end of a peer's hold: leases that expire without a report, actors silent for ``actor_timeout_s``,
actors that leave.

Methods of :class:`asyncrl.roles.learner.Learner` (mixed in); the state they use is made in its
``__init__``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from asyncrl.wire import rejects

log = logging.getLogger("asyncrl.learner")

# Per-peer bounds: an actor asks for protocol.GRANT_CREDITS slots and one more per report, so
# an honest actor never holds more; a peer asking for more (to hoard the ring) is held to it, per
# actor id and per connection (one connection may speak for several ids).
MAX_IDS_PER_CONNECTION = 4
ROUTER_HWM = 64  # messages queued per actor connection, each way
MAX_MESSAGES_PER_SERVE = 256  # serve() returns after this many: a flood cannot keep it from training
LEASE_TIMEOUTS = 6  # derived lease: this many actor timeouts ...
LEASE_SLOT_TIMES = 4  # ... or this many of the slowest report interval seen, whichever is longer
MAX_UNDELIVERED_IDS = 1024  # join records kept for ids that never delivered a trained slot
MAX_DEPARTED_IDS = 1024  # records (join count, running returns) kept for ids that left


@dataclass
class ActorInfo:
    host: str
    pid: int
    last_seen: float
    route: bytes = b""  # its DEALER identity: where replies go
    token: bytes = b""  # its per-actor token: every message must carry it
    pending: int = 0  # grants asked for and not yet given
    mode: str = "shm"
    meta: dict = field(default_factory=dict)
    joined: float = 0.0  # monotonic time of its welcome
    lease_from: float = 0.0  # monotonic: its welcome, last accepted report, or first grant since
    # the least (handled - sent) of its reports, both in seconds since the welcome, each on its own
    # clock: what a report that waited in no inbox shows (asyncrl.core.lag_parts.inbox_wait)
    least_delay: float = float("inf")
    # the actor's clock (seconds since the welcome) up to which its accepted reports account for its
    # time: the later of the last one's sent_s and the sum of their claims (learner_slots.timing_excess)
    timed_until: float = 0.0


class LearnerPeers:
    """The learner's peer bookkeeping and grants (a mixin of Learner)."""

    def peer_log(self, level: int, msg: str, *args) -> None:
        """A log line caused by a peer (joins, leaves, refusals): at most ``session_log``'s budget a
        window, with a count of the lines held back, so that peers cannot fill the disk."""
        allowed, held = self.session_log.allow()
        if allowed:
            log.log(level, msg + (f" ({held} similar lines suppressed)" if held else ""), *args)

    def note_undelivered(self, actor_id: str, restart: int) -> None:
        """Keep the join records (``state.actor_joins``, checkpointed) of at most MAX_UNDELIVERED_IDS
        ids that joined in this learner's life and never delivered a trained slot: the oldest such
        record not in use goes. Its restart count may then start again at 0, which is harmless: no
        sample of its streams was ever trained on. Ids that delivered, or come from the checkpoint,
        keep their monotonic count (seeding needs it)."""
        if restart == 0:  # a new id (ids of the checkpoint or that delivered have joined before)
            self.undelivered[actor_id] = None
        while len(self.undelivered) > MAX_UNDELIVERED_IDS:
            victim = next((a for a in self.undelivered if a not in self.actors and a != actor_id), None)
            if victim is None:
                return
            del self.undelivered[victim]
            self.state.actor_joins.pop(victim, None)

    def note_departed(self, actor_id: str) -> None:
        """Keep the records of at most MAX_DEPARTED_IDS ids that left (their join count, checkpointed,
        and their streams' running returns): the oldest record of an id that is not back goes, so a
        peer cycling through new ids (join, deliver, bye) cannot grow the learner's memory and
        checkpoints without bound. An evicted id that comes back starts its restart count at 0 again
        (its streams may then repeat an earlier session's seeds); no honest run has that many ids."""
        self.departed.pop(actor_id, None)
        self.departed[actor_id] = None
        while len(self.departed) > MAX_DEPARTED_IDS:
            victim = next(iter(self.departed))
            del self.departed[victim]
            if victim not in self.actors:
                self.state.actor_joins.pop(victim, None)
                self.state.reward_scaler.reset(victim)
                self.undelivered.pop(victim, None)

    def outstanding(self, *, actor_id: str | None = None, route: bytes | None = None) -> int:
        """Grants held plus asked for, by ``actor_id``, or by every actor on connection ``route``."""
        ids = [actor_id] if actor_id is not None else self.by_route.get(route, ())
        return sum(len(self.ledger.granted_to(a)) + self.actors[a].pending for a in ids if a in self.actors)

    def forget(self, actor_id: str, why: str) -> None:
        freed = self.ledger.reclaim(actor_id)
        for s in freed:
            self.ring.disarm(s)  # the old writer must stop writing these
        info = self.actors.pop(actor_id, None)
        if info is not None:
            ids = self.by_route.get(info.route, set())
            ids.discard(actor_id)
            if not ids:
                self.by_route.pop(info.route, None)
            self.note_departed(actor_id)
        self.peer_log(
            logging.INFO,
            "learner: actor %s left (%s); %d granted slots freed",
            rejects.printable(actor_id),
            why,
            len(freed),
        )

    def lease_s(self) -> float:
        """Seconds an actor may hold grants without an accepted report: transport.grant_lease_s, or
        (0) the longer of LEASE_TIMEOUTS actor timeouts (the base lease) and LEASE_SLOT_TIMES x the
        longest time an actor held grants before an accepted report so far (an llm slot can take
        minutes). Only reports within the base lease count (:meth:`note_report_interval`), so a peer
        that reports just before each lease ends cannot grow the lease without bound: it is at most
        LEASE_SLOT_TIMES x the base lease."""
        if self.cfg.transport.grant_lease_s > 0:
            return self.cfg.transport.grant_lease_s
        return max(self.base_lease_s(), LEASE_SLOT_TIMES * self.slowest_report_s)

    def base_lease_s(self) -> float:
        """LEASE_TIMEOUTS actor timeouts: the derived lease before any report, and its unit."""
        return LEASE_TIMEOUTS * self.cfg.transport.actor_timeout_s

    def note_report_interval(self, held_s: float) -> None:
        """An accepted report after ``held_s`` seconds of holding grants: the derived lease's input
        when it is within the base lease (a longer hold is a slow actor the lease already let through,
        or one pushing the lease up by reporting at its end)."""
        if held_s <= self.base_lease_s():
            self.slowest_report_s = max(self.slowest_report_s, held_s)

    def reclaim_expired_leases(self) -> None:
        """Take back the grants of actors that hold some and delivered no accepted report for
        ``lease_s`` (a peer that only heartbeats): the slots' generations change, so a late writer
        can never land in them once they are granted again; the actor gets its credits back."""
        now, lease = time.monotonic(), self.lease_s()
        for actor_id, info in self.actors.items():
            if now - info.lease_from <= lease:
                continue
            info.lease_from = now  # the next lease starts now
            freed = self.ledger.reclaim(actor_id)
            if not freed:
                continue
            for s in freed:
                self.ring.disarm(s)
            self.ledger.counters["lease_expired"] += len(freed)
            info.pending += len(freed)
            self.state.reward_scaler.reset(actor_id)  # its stream has a gap now
            if self.rejects.budget.allow()[0]:
                log.warning(
                    "learner: actor %s held %d granted slots for %.0f s without a report (lease); taken back",
                    rejects.printable(actor_id),
                    len(freed),
                    lease,
                )

    def reap_silent_actors(self) -> None:
        now = time.monotonic()
        for actor_id in [a for a, i in self.actors.items() if now - i.last_seen > self.cfg.transport.actor_timeout_s]:
            self.forget(actor_id, f"silent for {self.cfg.transport.actor_timeout_s:.0f} s")

    def grant_pending(self) -> None:
        """Grant free slots to the actors that asked, one at a time, longest-unserved first: an
        actor just served goes to the back of ``self.actors``. With fewer slots than requests
        (many actors, e.g. across hosts), the first actors to join would otherwise take every
        freed slot and starve the rest. With a lag target (``learner.target_lag_p95``), only while
        fewer slots than its effective ring size are in use (asyncrl.core.lag_target)."""
        while True:
            actor_id = next((a for a, info in self.actors.items() if info.pending > 0), None)
            if actor_id is None:
                return
            if self.lag_target is not None and self.ledger.num_in_use >= self.lag_target.slots:
                return
            g = self.ledger.grant(actor_id)
            if g is None:
                return
            self.peak_in_use = max(self.peak_in_use, self.ledger.num_in_use)
            info = self.actors.pop(actor_id)
            info.pending -= 1
            if len(self.ledger.granted_to(actor_id)) == 1:  # it held none: its lease starts now
                info.lease_from = time.monotonic()
            self.actors[actor_id] = info
            self.ring.arm(g.slot, g.grant_id)  # before the actor can know of the grant
            self.reply(info.route, {"type": "grant", "slot": g.slot, "grant_id": g.grant_id})
