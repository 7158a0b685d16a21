"""``SlotLedger``: pure bookkeeping of which slot is free, granted to an actor, full, or being
consumed (monobeast's free/full queues, with grant ids so late or foreign reports are refused).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import NamedTuple


class Grant(NamedTuple):
    slot: int
    grant_id: int


class SlotLedger:
    """The learner's record of every slot's state. Pure Python, no shared memory.

    free --grant--> granted --complete--> full --pop_full--> consuming --release--> free,
    and granted --reclaim--> free when the actor died. Every transition checks the current state,
    so a slot is never consumed twice nor while an actor may still be writing it. grant_ids are
    never reused, so a completion for a reclaimed grant is refused even once the slot is granted
    again. Slots an actor completed before dying stay full: their data is valid.
    ``counters`` counts grants, backpressure (grant found no free slot), completed, refused,
    reclaimed, consumed and released.
    """

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._granted: dict[int, tuple[str, int]] = {}  # slot -> (actor_id, grant_id)
        self._full: deque[int] = deque()  # completion order
        self._consuming: set[int] = set()
        self._next_grant_id = 1
        self.counters: Counter[str] = Counter()

    def grant(self, actor_id: str) -> Grant | None:
        """Grant the longest-free slot to ``actor_id``; None when no slot is free (backpressure)."""
        if not self._free:
            self.counters["backpressure"] += 1
            return None
        slot, grant_id = self._free.popleft(), self._next_grant_id
        self._next_grant_id += 1
        self._granted[slot] = (actor_id, grant_id)
        self.counters["grants"] += 1
        return Grant(slot, grant_id)

    def complete(self, actor_id: str, slot: int, grant_id: int) -> bool:
        """Mark ``slot`` full. True only if it is currently granted to ``actor_id`` under
        ``grant_id``; a duplicate, stale or foreign completion returns False and changes nothing."""
        if self._granted.get(slot) != (actor_id, grant_id):
            self.counters["refused"] += 1
            return False
        del self._granted[slot]
        self._full.append(slot)
        self.counters["completed"] += 1
        return True

    def void(self, actor_id: str, slot: int, grant_id: int) -> bool:
        """Return a granted slot to the free queue without consuming it (its report was rejected).
        True only if it is currently granted to ``actor_id`` under ``grant_id``."""
        if self._granted.get(slot) != (actor_id, grant_id):
            return False
        del self._granted[slot]
        self._free.append(slot)
        self.counters["voided"] += 1
        return True

    def full(self) -> tuple[int, ...]:
        """Completed slots not yet taken, oldest completion first."""
        return tuple(self._full)

    def pop_full(self, n: int) -> list[int]:
        """Take the ``n`` oldest full slots for consumption; ``release`` each after copying it out.

        Raises ValueError if fewer than ``n`` are full (a batch is never silently short).
        """
        if not 0 <= n <= len(self._full):
            raise ValueError(f"asked for {n} full slots, {len(self._full)} are full")
        slots = [self._full.popleft() for _ in range(n)]
        self._consuming.update(slots)
        self.counters["consumed"] += n
        return slots

    def release(self, slot: int) -> None:
        """Return a consumed slot to the free queue; ValueError if it is not being consumed."""
        if slot not in self._consuming:
            raise ValueError(f"slot {slot} is not being consumed; cannot release it")
        self._consuming.remove(slot)
        self._free.append(slot)
        self.counters["released"] += 1

    def reclaim(self, actor_id: str) -> list[int]:
        """Free every slot granted to ``actor_id`` (it died); returns them. Its grants are void."""
        slots = [s for s, (a, _) in self._granted.items() if a == actor_id]
        for s in slots:
            del self._granted[s]
            self._free.append(s)
        self.counters["reclaimed"] += len(slots)
        return slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_granted(self) -> int:
        return len(self._granted)

    @property
    def num_full(self) -> int:
        return len(self._full)

    @property
    def num_consuming(self) -> int:
        return len(self._consuming)

    @property
    def num_in_use(self) -> int:
        """Slots not free: granted, full or being consumed."""
        return self.num_slots - len(self._free)

    def granted_to(self, actor_id: str) -> list[Grant]:
        """The grants ``actor_id`` currently holds."""
        return [Grant(s, g) for s, (a, g) in self._granted.items() if a == actor_id]
