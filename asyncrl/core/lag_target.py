"""A lag target (``learner.target_lag_p95``): the learner holds the 95th percentile of the consumed
samples' lag, in versions, near a target by changing how many of the ring's slots may be in use.

What it controls. The shared-memory ring of S = ``learner.num_slots`` slots is the one queue between
actors and learner (``LearnerSlots.consume``): a slot granted while the learner is at version v is
filled with (about) the weights of v and waits behind the slots in use before it is consumed, B =
``learner.slots_per_batch`` per iteration. With actors faster than the learner every slot is in use
and a sample waits about S / B iterations: its lag. The learner grants a slot only while fewer than
``slots`` (the effective ring size, in [B, S]) are in use (granted, full or being copied out), so
the lag of a saturated ring is about ``slots`` / B versions. A smaller ring throttles the actors:
they wait for a grant (the run's ``actors_wait_s``) and the run takes fewer env steps a second.

What it measures. Each consumed batch's slots: lag = learner version at consumption minus the
slot's behaviour version (one per slot: ``check_slot``), one value per slot (every slot holds the
same E x T samples, so counting slots is counting samples). Slots that ``max_policy_lag`` drops
count too: they waited in the ring like the others. And the most slots in use since the last
batch (``peak_in_use``): whether the limit held any grant back.

How it settles (no count below is tuned on an env; each follows from S, B or the percentile):

- Start at B x target slots (within [B, S]): what a saturated ring needs for that lag, so a run
  whose actors outpace the learner holds the target from its first turns.
- Dead time: after a change to ``slots`` the batches consumed over the next
  ceil(max(old, new) / B) + 1 iterations hold slots granted before it (they wait behind up to
  that many slots, B a batch, plus the iteration under way); their lag is not counted.
- Window: then lags are gathered over ceil(max(slots, 20) / B) iterations: at least one turn of
  the ring (each slot in use is consumed once in it, the longest-waiting ones too), and at least
  20 = 1 / (1 - 0.95) slots, fewest in which one late slot is not the p95 by itself.
- Decision, at the end of each window, on the window's p95 (inverted CDF, as metrics.jsonl's):
  above the target: one slot fewer (from the most in use in the window, when fewer than
  ``slots`` were: a limit that did not bind is brought down to where it does); below it: one slot
  more, but only if the limit held grants back in the window (``peak_in_use`` reached it: more
  room for actors that do not use it would not change the lag, and would have to be taken back
  one window at a time once they do); at it: hold. Every change restarts dead time and window.
- A size found too large is not tried again for one dead time and window at first, twice that
  after it fails again, and so on: where one slot more moves the p95 from below the target to
  above it (the lag is a whole number of versions) the controller would otherwise swing between
  the two sizes, half of the time above the target. A try that holds the target clears it.

Limits. The lowest lag it can reach is what B slots give: actors fill the next batch while the
learner trains on this one, with the weights of the iteration under way, so about 1 version (0
needs a synchronous system; weights that reach an actor after its grant add one); a target below
that holds ``slots`` at B. It only binds where the ring fills: not with actors slower than the
learner, nor where the actors' grants bound the queue already (the learner serves no message while
it trains, so an actor fills about its protocol.GRANT_CREDITS = 2 grants an iteration, and with
2 x actors <= B the ring never fills: the default run's 2 actors and B = 4). It acts with a
delay of a dead time and a window (tens of iterations), so it follows slow changes of the actors'
speed, not sudden ones. A window of 20 slots shows a p95 above the target now and then where a
few per cent of the slots come in late, and a size is left upward only on a window below the
target: it settles at or under the target, on the side of less lag (and of fewer slots than a
longer look would allow). A straggler's lag comes from its rollout time, which no ring size
shortens. Its state is not checkpointed: a resumed learner starts it again from B x target.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from asyncrl.core.lag import weighted_percentiles

P95 = 95.0
# Fewest equal-weight slots in which the 95th percentile is not decided by one slot: 1 / (1 - 0.95).
MIN_WINDOW_SLOTS = math.ceil(1.0 / (1.0 - P95 / 100.0) - 1e-9)


def initial_slots(target_p95: int, num_slots: int, slots_per_batch: int) -> int:
    """B x target clamped to [B, S]: the ring size whose saturated lag is the target (about
    slots / B versions)."""
    return min(num_slots, max(slots_per_batch, slots_per_batch * target_p95))


def dead_time(slots_before: int, slots_after: int, slots_per_batch: int) -> int:
    """Iterations after a change of the ring size whose batches still hold slots granted before it:
    ceil(max(before, after) / B) + 1."""
    return -(-max(slots_before, slots_after) // slots_per_batch) + 1


def window_iterations(slots: int, slots_per_batch: int) -> int:
    """Iterations a decision looks at: ceil(max(slots, MIN_WINDOW_SLOTS) / B), one turn of the ring
    and at least MIN_WINDOW_SLOTS slots."""
    return -(-max(slots, MIN_WINDOW_SLOTS) // slots_per_batch)


class LagTarget:
    """The effective ring size ``slots`` (slots that may be in use), moved one slot at a time to
    hold the lag p95 of consumed samples at ``target_p95`` versions. Pure: no clock, no I/O.

    Raises:
        ValueError: a target below 0, B below 1, or S below B.
    """

    def __init__(self, target_p95: int, *, num_slots: int, slots_per_batch: int, iteration: int = 0):
        """``iteration``: the learner iteration it starts after (a resumed learner's), so that
        :meth:`summary` names iterations as metrics.jsonl does."""
        if target_p95 < 0 or slots_per_batch < 1 or num_slots < slots_per_batch:
            raise ValueError(
                f"need target_p95 >= 0 and num_slots >= slots_per_batch >= 1, got {target_p95}, "
                f"{num_slots}, {slots_per_batch}"
            )
        self.target, self.num_slots, self.per_batch = target_p95, num_slots, slots_per_batch
        self.slots = self.initial = initial_slots(target_p95, num_slots, slots_per_batch)
        self.iteration = iteration  # the last learner iteration observed
        self.skip = dead_time(0, self.slots, slots_per_batch)  # start-up: the ring's first turn
        self.controlled_from = iteration + self.skip + 1  # first iteration counted in `controlled`
        self.window: Counter[int] = Counter()  # lag (versions) -> slots, of the current window
        self.window_batches = 0
        self.window_peak = 0  # most slots in use during the window
        self.barred, self.barred_until, self.bar_length = None, 0, 0  # a size found too large
        self.slots_per_iteration: Counter[int] = Counter()  # effective slots -> iterations under it
        self.controlled: Counter[int] = Counter()  # lag -> slots consumed from controlled_from on
        self.steps: Counter[str] = Counter()  # "up", "down"

    def observe(self, slot_lags: Iterable[int], *, peak_in_use: int) -> int:
        """One consumed batch: the lag in versions of each of its slots, and the most slots in use
        since the previous batch. Returns ``slots``, the effective ring size from now on."""
        lags = [int(v) for v in slot_lags]
        self.iteration += 1
        self.slots_per_iteration[self.slots] += 1
        if self.iteration >= self.controlled_from:
            self.controlled.update(lags)
        if self.skip > 0:
            self.skip -= 1
            return self.slots
        self.window.update(lags)
        self.window_batches += 1
        self.window_peak = max(self.window_peak, peak_in_use)
        if self.window_batches >= window_iterations(self.slots, self.per_batch):
            self._decide()
        return self.slots

    def _decide(self) -> None:
        p95 = self.window_p95()
        bound = self.window_peak >= self.slots
        before = self.slots
        if p95 is not None and p95 > self.target and self.slots > self.per_batch:
            self.slots = max(self.per_batch, min(self.slots, self.window_peak) - 1)
            if before == self.barred:  # a retried size failed again: wait twice as long
                self.bar_length *= 2
            else:
                self.barred, self.bar_length = before, self._period(before)
            self.barred_until = self.iteration + self.bar_length
            self.steps["down"] += 1
        else:
            if before == self.barred and p95 is not None and p95 <= self.target:
                self.barred = None  # the retried size holds the target
            up = p95 is not None and p95 < self.target and bound and self.slots < self.num_slots
            if up and (self.slots + 1 != self.barred or self.iteration >= self.barred_until):
                self.slots += 1
                self.steps["up"] += 1
        self.window, self.window_batches, self.window_peak = Counter(), 0, 0
        if self.slots != before:
            self.skip = dead_time(before, self.slots, self.per_batch)

    def _period(self, slots: int) -> int:
        """Iterations one try of ``slots`` takes: its dead time and window."""
        return dead_time(slots, slots, self.per_batch) + window_iterations(slots, self.per_batch)

    def window_p95(self) -> float | None:
        """p95 of the current window's lags (versions), or None if it is empty."""
        values = sorted(self.window)
        return weighted_percentiles(values, [self.window[v] for v in values], (P95,))[0]

    def summary(self) -> dict:
        """What summary.json's ``lag_target`` block says of the controller: the target, the ring,
        the effective slots over iterations (initial, min, median, max, final), the steps taken,
        and the lag p95 of the samples consumed from ``controlled_from_iteration`` on (after the
        ring's first turn: the start-up, when versions are few and lags short, is left out;
        iterations are counted as batches taken from the ring: a batch whose every slot
        max_policy_lag dropped trains nothing and puts this count one ahead of metrics.jsonl's)."""
        sizes = sorted(self.slots_per_iteration)
        weights = [self.slots_per_iteration[s] for s in sizes]
        median = weighted_percentiles(sizes, weights, (50,))[0]
        lags = sorted(self.controlled)
        return {
            "target_p95": self.target,
            "num_slots": self.num_slots,
            "slots_per_batch": self.per_batch,
            "effective_slots": {
                "initial": self.initial,
                "min": sizes[0] if sizes else None,
                "median": None if median is None else int(median),
                "max": sizes[-1] if sizes else None,
                "final": self.slots,
            },
            "steps": {"up": self.steps["up"], "down": self.steps["down"]},
            "controlled_from_iteration": self.controlled_from,
            "lag_p95_controlled": weighted_percentiles(lags, [self.controlled[v] for v in lags], (P95,))[0],
        }
