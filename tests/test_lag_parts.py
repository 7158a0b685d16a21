"""Where lag comes from: the parts of a slot's backward lag add up to its lag, in seconds and in
versions, whatever the actor reports (asyncrl.core.lag_parts)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.core.lag_parts import PARTS, SlotTiming, VersionClock, backward_parts, forward_lag, inbox_wait


def _clock(times):
    clock = VersionClock()
    for v, t in enumerate(times):
        clock.published(v, t)
    return clock


def test_a_slot_with_known_times_splits_exactly():
    clock = _clock([0.0, 10.0, 20.0, 30.0, 40.0])  # version v published at 10 v
    # acted with version 1 (published at 10), first action at 15, report at 32, consumed at 45 by version 4
    parts = backward_parts(
        behavior_version=1,
        version=4,
        published_at=10.0,
        consumed_at=45.0,
        timing=SlotTiming(reported_at=32.0, collect_s=17.0, grant_wait_s=3.0),
        clock=clock,
    )
    assert parts == {
        "propagation_s": 5.0,
        "collection_s": 17.0,
        "queueing_s": 13.0,
        "grant_wait_s": 3.0,
        "propagation_versions": 0,  # version 1 was still the newest at 15
        "collection_versions": 2,  # 2 and 3 were published during the rollout
        "queueing_versions": 1,  # 4 while it waited in the ring
    }


@given(
    publish=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=12),
    bv=st.integers(0, 11),
    extra=st.integers(0, 5),
    consumed=st.floats(0, 200, allow_nan=False),
    reported=st.floats(-1e6, 1e6, allow_nan=False),
    collect=st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),
    wait=st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),
)
def test_the_parts_add_up_to_the_lag_whatever_the_actor_says(publish, bv, extra, consumed, reported, collect, wait):
    publish = sorted(publish)
    bv = min(bv, len(publish) - 1)
    version = bv + extra
    clock = _clock(publish)
    p = publish[bv]
    parts = backward_parts(
        behavior_version=bv,
        version=version,
        published_at=p,
        consumed_at=consumed,
        timing=SlotTiming(reported, collect, wait),
        clock=clock,
    )
    total_s = max(consumed, p) - p
    if collect is None:
        assert parts["propagation_s"] is None and parts["propagation_versions"] is None
        assert parts["queueing_versions"] <= version - bv
    else:
        seconds = [parts[f"{k}_s"] for k in PARTS]
        versions = [parts[f"{k}_versions"] for k in PARTS]
        assert all(s >= 0 for s in seconds) and math.isclose(sum(seconds), total_s, rel_tol=1e-9, abs_tol=1e-9)
        assert all(v >= 0 for v in versions) and sum(versions) == version - bv
    if wait is not None and collect is not None:
        assert 0 <= parts["grant_wait_s"] <= parts["propagation_s"]


def test_unknown_publish_time_or_timing_leaves_every_part_unknown():
    clock = _clock([0.0])
    for kw in ({"published_at": None, "timing": SlotTiming(1.0, 0.5)}, {"published_at": 0.0, "timing": None}):
        parts = backward_parts(behavior_version=0, version=0, consumed_at=2.0, clock=clock, **kw)
        assert set(parts.values()) == {None}


def test_version_clock_ignores_old_versions_and_a_clock_that_steps_back():
    clock = _clock([5.0, 6.0])
    clock.published(1, 99.0)  # a re-publish of a version it knows
    clock.published(2, 4.0)  # the wall clock stepped back
    assert clock.versions == [0, 1, 2] and clock.times == [5.0, 6.0, 6.0]
    assert clock.at(4.9, default=-1) == -1 and clock.at(5.5, default=-1) == 0 and clock.at(6.0, default=-1) == 2


def test_forward_lag_of_an_iteration():
    rows = [[s, 0.01 * s, 0.0] for s in range(8)]  # 8 optimizer steps numbered from 0
    f = forward_lag(rows, update_s=0.8)
    assert f["forward_steps"] == pytest.approx(3.5) and f["forward_tv"] == pytest.approx(0.035)
    assert f["forward_s"] == pytest.approx(0.8 * 4.0 / 8)
    assert forward_lag([[1, float("nan"), 0.0], [2, None, 0.0]], 1.0)["forward_tv"] is None
    assert set(forward_lag([], 1.0).values()) == {None}


def test_a_report_that_waited_unread_shows_the_wait_beyond_its_actors_least_delay():
    least = float("inf")
    # (handled, sent): seconds since the welcome on the learner's and the actor's clock; the actor's
    # clock started 0.003 s later (the welcome's transit); the second report waited 0.25 s unread
    waits = []
    for handled, sent in ((1.004, 1.0), (2.253, 2.0), (3.0035, 3.0), (4.1035, 4.0)):
        wait, least = inbox_wait(handled, sent, least)
        waits.append(round(wait, 6))
    assert waits == [0.0, 0.249, 0.0, 0.1] and least == pytest.approx(0.0035)
    assert inbox_wait(5.0, None, least) == (0.0, least)  # an actor that does not say
