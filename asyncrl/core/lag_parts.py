"""Where a sample's backward lag comes from: its lag in seconds and in versions split into weight
propagation, collection and queueing, and the learner's forward lag of the iteration that trains on it.

One slot (one rollout, one behaviour version v) at consumption time c on the learner's clock, with v
published at p, the slot's report arriving at the learner at r (learner's clock) and the rollout's
first action at a = r - collect_s (``collect_s`` measured on the actor's own monotonic clock; a
report's network transit counts in propagation). The learner reads no message while it trains, so a
report can wait in its inbox: r is the time it was handled minus that wait (:func:`inbox_wait`, from
durations on each side's own clock: no clock synchronisation is needed):

- propagation = a - p: publish -> broadcaster -> actor -> the first action of a rollout with v (the
  actor waits for its grant, finishes the rollout under way, or is told to act with an older version
  by the lag controls); ``grant_wait`` is the part of it the actor spent waiting for this slot's grant;
- collection = r - a: the rollout itself, first action to report;
- queueing = c - r: the full slot waiting in the ring (and in the learner's copies) to be consumed.

propagation + collection + queueing = c - p: the sample's lag in seconds, exactly. In versions, each
part is the number of versions the learner published during it, so the parts add up to the lag in
versions (learner version at consumption minus v). Times are clamped into [p, c] first (an actor
clock running fast, or a lying actor, moves time between parts but never changes the total).

Forward lag (the learner's own, within one iteration; VACO, arXiv:2603.01365, section 3): minibatches
are drawn at random, so each sample's expected position is the iteration's mean optimizer step; its
mean tv_estimate is what the policy moved from the learning policy while the batch was trained on.
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

PARTS = ("propagation", "collection", "queueing")  # backward lag = their sum (seconds and versions)
FORWARD = ("forward_steps", "forward_tv", "forward_s")


class SlotTiming(NamedTuple):
    """When a slot's rollout ran. ``reported_at``: the learner's clock (``time.time()``, seconds) when
    its report arrived (handled, less its wait in the inbox: :func:`inbox_wait`); ``collect_s``:
    seconds from the rollout's first action to its report, on the actor's clock (None: an actor that
    does not say); ``grant_wait_s``: seconds the actor waited for this slot's grant before the first
    action (None: not said)."""

    reported_at: float
    collect_s: float | None = None
    grant_wait_s: float | None = None


def inbox_wait(handled_s: float, sent_s: float | None, least: float) -> tuple[float, float]:
    """How long a report waited in the learner's inbox, and the new least delay of its actor.

    Args:
        handled_s: seconds from the actor's welcome to the report's handling, learner's clock.
        sent_s: seconds from the actor's receipt of its welcome to sending the report, actor's clock
            (None: an actor that does not say; the wait is then 0).
        least: the least ``handled_s - sent_s`` of this actor's reports so far (inf before the first).

    Returns:
        (wait >= 0 in seconds, updated least). A report handled at once shows the least delay (the
        welcome's and a report's transit, and the clocks' offset at the welcome); what a report shows
        beyond it is the time it waited unread. The first report of a session counts as unread for 0 s.
    """
    if sent_s is None:
        return 0.0, least
    delay = handled_s - sent_s
    least = min(least, delay)
    return delay - least, least


class VersionClock:
    """The learner's versions by publish time: which version was the newest at a given time."""

    def __init__(self):
        self.versions: list[int] = []
        self.times: list[float] = []

    def published(self, version: int, t: float) -> None:
        """Version ``version`` was published at ``t`` (seconds). Versions come in increasing order; a
        repeated or older one (a resume's re-publish) is ignored, and a time earlier than the last is
        taken as the last (the wall clock stepped back)."""
        if self.versions and version <= self.versions[-1]:
            return
        self.versions.append(int(version))
        self.times.append(max(t, self.times[-1]) if self.times else t)

    def at(self, t: float, default: int) -> int:
        """The newest version published at or before ``t``; ``default`` when none is known that early."""
        i = bisect.bisect_right(self.times, t)
        return self.versions[i - 1] if i else default


def backward_parts(
    *,
    behavior_version: int,
    version: int,
    published_at: float | None,
    consumed_at: float,
    timing: SlotTiming | None,
    clock: VersionClock,
) -> dict[str, float | int | None]:
    """One slot's backward lag split into its parts (module docstring).

    Args:
        behavior_version: v, the version the rollout acted with.
        version: the learner's version at consumption (>= v).
        published_at: when v was published (learner clock, s); None when not known (a resumed run's
            oldest versions): every part is then None.
        consumed_at: c, the consumption time (learner clock, s).
        timing: when the rollout ran; None (e.g. a slot of an older actor): every part is None.
        clock: the learner's publish times, for the parts in versions.

    Returns:
        {"propagation_s", "collection_s", "queueing_s", "grant_wait_s", "propagation_versions",
        "collection_versions", "queueing_versions"}: seconds >= 0 summing to c - p (when c >= p), and
        versions >= 0 summing to ``version - behavior_version``; None where unknown.
    """
    keys = [f"{p}_s" for p in PARTS] + ["grant_wait_s"] + [f"{p}_versions" for p in PARTS]
    if timing is None or published_at is None:
        return dict.fromkeys(keys)
    p, c = published_at, max(consumed_at, published_at)
    r = min(max(timing.reported_at, p), c)
    collect = timing.collect_s
    a = r if collect is None else min(max(r - collect, p), r)
    out: dict[str, float | int | None] = {
        "propagation_s": a - p,
        "collection_s": r - a,
        "queueing_s": c - r,
        "grant_wait_s": None if timing.grant_wait_s is None else min(timing.grant_wait_s, a - p),
    }
    if collect is None:  # first action unknown: no split between propagation and collection
        out["propagation_s"] = out["collection_s"] = None
    v_first = min(max(clock.at(a, behavior_version), behavior_version), version)
    v_report = min(max(clock.at(r, behavior_version), v_first), version)
    out["propagation_versions"] = None if collect is None else v_first - behavior_version
    out["collection_versions"] = None if collect is None else v_report - v_first
    out["queueing_versions"] = version - v_report
    return out


def forward_lag(minibatches: list, update_s: float) -> dict[str, float | None]:
    """The forward lag of an iteration's samples, from its per-optimizer-step rows.

    Args:
        minibatches: [[step, tv_estimate, no_grad_fraction], ...] one row per optimizer step (a
            metrics record's "minibatches"; step counts from 0 or 1 as the task numbers them).
        update_s: the iteration's update time in seconds.

    Returns:
        {"forward_steps": optimizer steps taken in this iteration before a sample's minibatch, its mean
        over the iteration's uses of each sample; "forward_tv": the mean tv_estimate over those uses
        (None when no step has a finite one); "forward_s": the estimated seconds from the iteration's
        start to a use, update_s * (forward_steps + 1/2) / steps (steps of equal minibatches take equal
        time)}; all None for an iteration without optimizer steps.
    """
    if not minibatches:
        return dict.fromkeys(FORWARD)
    n = len(minibatches)
    first = min(row[0] for row in minibatches)
    steps = sum(row[0] - first for row in minibatches) / n
    tvs = [row[1] for row in minibatches if isinstance(row[1], (int, float)) and math.isfinite(row[1])]
    return {
        "forward_steps": steps,
        "forward_tv": sum(tvs) / len(tvs) if tvs else None,
        "forward_s": update_s * (steps + 0.5) / n,
    }
