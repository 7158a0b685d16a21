"""Hostile peers, third round: a peer past the handshake (an allowed CURVE key, a same-user ipc
peer) with well-formed messages cannot end the learner with finite but huge slot values, cannot
push the grant lease up without bound, and cannot grow the learner's records (and checkpoints) by
cycling through actor ids. Each test failed on 676f3df. Run alone with ``pytest -m hostile``.

The learner runs in the test's own process, driven by hand (hostile_helpers.live_learner), so
each attack is deterministic and nothing needs killing."""

from __future__ import annotations

import time

import pytest
from hostile_helpers import STEPS, Peer, live_learner, report, valid_slot

from asyncrl.core.spec import MAX_ABS_FLOAT
from asyncrl.roles import learner_peers

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]


def _deliver(learner, peer: Peer, actor_id: str, arrays_of=valid_slot) -> None:
    """``actor_id`` asks for a slot and reports ``arrays_of(grant_id)`` over TCP; the learner serves."""
    peer.say("request", actor_id)
    g = peer.wait(learner, "grant")
    peer.send(report(peer, actor_id, g["grant_id"], arrays_of(g["grant_id"])))
    peer.pump(learner, 0.2)


@pytest.mark.parametrize(
    "field, value",
    [("obs", 1e20), ("obs", -3e38), ("rewards", 1e30), ("rewards", -2 * MAX_ABS_FLOAT), ("behavior_log_prob", -1e16)],
)
def test_a_slot_of_huge_finite_values_is_refused_and_the_learner_trains_on(tmp_path, ctx, field, value):
    """Observations of +-1e20 (finite) passed the slot checks: their running variance overflowed
    float32 and the learner ended with NonFiniteError at its next iteration (asyncrl run restarted
    it, the actor sent such a slot again, the run failed). Every float of a slot is now held to the
    headers' bound, so the slot is refused ("magnitude"), nothing of it is trained on, and an honest
    slot after it is."""
    with live_learner(tmp_path, "learner.slots_per_batch=1", "learner.compile=false") as learner:
        peer = Peer(ctx, learner.endpoint, "big")
        peer.join(learner, "big")

        def huge(grant_id):
            a = valid_slot(grant_id)
            a[field][...] = value
            return a

        _deliver(learner, peer, "big", huge)
        assert learner.rejects.by_reason() == {"magnitude": 1}, learner.rejects.counts
        assert learner.ledger.num_full == 0
        _deliver(learner, peer, "big")  # an honest slot: trained on
        deadline = time.monotonic() + 10
        while learner.ledger.num_full < 1 and time.monotonic() < deadline:
            peer.pump(learner, 0.05)
        assert learner.consume()
        assert learner.state.env_steps == STEPS and learner.state.version == 1


def test_a_peer_reporting_at_each_lease_end_cannot_grow_the_lease_without_bound(tmp_path, ctx):
    """The derived lease was 4 x the longest time any actor had held grants before an accepted
    report, so a peer that reported just before each lease ended multiplied it by 4 each time (60 s,
    240 s, 960 s, ...: a few such peers holding every slot stalled the run for ever longer). Only
    reports within the base lease (6 actor timeouts) raise it now: it stays at most 4 x the base.
    The late reports are simulated by moving the peer's lease start back, not by waiting."""
    with live_learner(tmp_path, "transport.actor_timeout_s=2") as learner:
        base = learner_peers.LEASE_TIMEOUTS * 2.0
        peer = Peer(ctx, learner.endpoint, "slow")
        peer.join(learner, "slow")
        leases = [learner.lease_s()]
        peer.say("request", "slow")
        for _ in range(4):
            g = peer.wait(learner, "grant")
            learner.actors["slow"].lease_from = time.monotonic() - 0.9 * learner.lease_s()  # near its end
            peer.send(report(peer, "slow", g["grant_id"]))
            peer.pump(learner, 0.2)
            leases.append(learner.lease_s())
        assert learner.rejects.total == 0, learner.rejects.counts  # every report was accepted
        assert leases[0] == base
        assert max(leases) <= learner_peers.LEASE_SLOT_TIMES * base, leases
        # an honest slow actor still lengthens it (a slot of 0.9 x the base lease: 3.6 x the base)
        assert leases[1] == pytest.approx(learner_peers.LEASE_SLOT_TIMES * 0.9 * base, rel=0.05)


def test_records_of_ids_that_delivered_and_left_are_bounded(tmp_path, ctx, monkeypatch):
    """An id that delivered a trained slot kept its join record and its streams' running returns
    for good (both in every checkpoint): a peer cycling through new ids (join, deliver one slot,
    bye) grew the learner's memory and checkpoints without bound. Now at most MAX_DEPARTED_IDS ids
    that left keep them; a live id's records are never dropped."""
    monkeypatch.setattr(learner_peers, "MAX_DEPARTED_IDS", 3)
    # "stay" sends no heartbeat: a long actor timeout keeps it live however slowly a loaded machine runs this
    sets = ("learner.slots_per_batch=1", "learner.compile=false", "transport.actor_timeout_s=3600")
    with live_learner(tmp_path, *sets) as learner:
        stay = Peer(ctx, learner.endpoint, "stay")
        stay.join(learner, "stay")
        _deliver(learner, stay, "stay")
        assert learner.consume()
        cycler = Peer(ctx, learner.endpoint, "cycler")
        for k in range(12):
            aid = f"id-{k}-" + "x" * 200
            cycler.join(learner, aid)
            _deliver(learner, cycler, aid)
            deadline = time.monotonic() + 10
            while learner.ledger.num_full < 1 and time.monotonic() < deadline:
                cycler.pump(learner, 0.05)
            assert learner.consume(), (k, learner.rejects.counts)
            cycler.say("bye", aid)
            cycler.pump(learner, 0.05)
            cycler.inbox.clear()  # the grant that came with the report went with the id
        state = learner.state
        assert state.version == 13
        assert len(state.actor_joins) <= 1 + 3, sorted(state.actor_joins)
        assert len(state.reward_scaler.returns) <= 1 + 3, sorted(state.reward_scaler.returns)
        assert state.actor_joins["stay"] == 1 and "stay" in state.reward_scaler.returns  # live: kept
        assert learner.rejects.total == 0, learner.rejects.counts


def _lie_each_report(learner, peer: Peer, joined: float, reports: int, timing_of) -> int:
    """``reports`` TCP reports of valid slots from ``peer`` (actor "liar"), each with the timing
    ``timing_of(seconds since joined)``; consumes as slots fill; returns how many were sent."""
    sent, deadline = 0, time.monotonic() + 60
    while sent < reports and time.monotonic() < deadline:
        for g in peer.grants():
            if sent < reports:
                peer.send(report(peer, "liar", g["grant_id"], timing=timing_of(time.monotonic() - joined)))
                sent += 1
        peer.pump(learner, 0.1)
        learner.consume()
    return sent


def test_report_timing_is_bounded_by_the_time_since_the_previous_report(tmp_path, ctx):
    """Each timing value was bounded by the time since the actor's welcome alone, so a peer that
    reported env_s = inference_s = wait_s = (seconds since its welcome) with every slot (timing.py of
    the attack review) made summary.json's time_breakdown_s and lag_target block grow with the
    square of the run's length (one actor: ~3 x 20 x 6 s after 20 reports in 6 s). Now what a report
    spent must fit in the time since its previous accepted report: such reports are refused
    ("timing"), and a liar that claims each whole window adds up to no more than its session."""
    with live_learner(tmp_path, "learner.compile=false", "learner.target_lag_p95=1") as learner:
        peer = Peer(ctx, learner.endpoint, "liar")
        peer.join(learner, "liar")
        joined = time.monotonic()
        peer.say("request", "liar")
        peer.say("request", "liar")
        while time.monotonic() - joined < 2.0:
            peer.pump(learner, 0.2)
        n = _lie_each_report(learner, peer, joined, 6, lambda e: {"env_s": e, "inference_s": e, "wait_s": e})
        assert n == 6 and learner.rejects.by_reason() == {"timing": 6}, learner.rejects.counts
        assert learner.timing["actors_env_s"] == learner.timing["actors_wait_s"] == 0.0
        # the most a liar can claim: each report's sent_s its time since the welcome, and every second
        # since the previous one spent waiting, collecting, stepping envs and running inference
        last = [0.0]

        def whole_window(e):
            window, last[0] = e - last[0], e
            return {"sent_s": e, "wait_s": window / 3, "env_s": window / 3, "inference_s": window / 3}

        n = _lie_each_report(learner, peer, joined, 10, whole_window)
        wall = time.monotonic() - joined
        assert n == 10 and learner.rejects.by_reason() == {"timing": 6}, learner.rejects.counts
        t = learner.timing
        assert t["actors_env_s"] + t["actors_inference_s"] + t["actors_wait_s"] <= wall + 0.05, t
        block = learner.lag_target_summary()["lag_target"]
        assert block["actors_wait_s"] <= wall / 3 + 0.05, block
        # nor can the slack add up: reports that say sent_s = 0 and claim the slack each time
        n = _lie_each_report(learner, peer, joined, 6, lambda e: {"sent_s": 0.0, "env_s": 0.04})
        assert n == 6 and learner.rejects.by_reason() == {"timing": 12}, learner.rejects.counts


def test_honest_timing_fits_whatever_the_reports_waited_in_the_learners_inbox():
    """timing_excess on an honest actor's reports: each spends at most the time between its reports
    on its own clock (sent_s), however long the learner left the previous one unread (its clock
    would refuse them); and a report whose sent_s is not past the previous one's gets only the slack."""
    from asyncrl.roles.learner_slots import TIMING_SLACK_S, timing_claim, timing_excess

    prev = 0.0
    for sent in (0.8, 20.8, 21.0, 45.0):  # reports 20 s apart, and one 0.2 s after the last
        window = sent - prev
        timing = {"wait_s": 0.3 * window, "collect_s": 0.7 * window, "env_s": 0.3 * window, "sent_s": sent}
        timing["inference_s"] = 0.4 * window
        assert timing_excess(timing, since_welcome=sent + 15.0, claimed_until=prev) is None  # handled 15 s late
        assert max(sent, prev + timing_claim(timing)) == sent  # what the learner moves claimed_until to
        prev = sent
    assert timing_excess({"env_s": TIMING_SLACK_S, "sent_s": prev}, since_welcome=prev, claimed_until=prev) is None
    bad = timing_excess({"env_s": 1.0, "sent_s": prev - 5}, since_welcome=prev, claimed_until=prev)
    assert bad is not None and "0.000 s from what this actor's accepted reports" in bad
    # the slack counts once: past claimed_until, a report that claims it again is refused
    assert timing_excess({"env_s": 0.04, "sent_s": prev}, since_welcome=prev, claimed_until=prev + 0.04) is not None
    # without sent_s, the learner's own clock: the time since the previous report's sent_s
    assert timing_excess({"wait_s": 2.0}, since_welcome=prev + 2.0, claimed_until=prev) is None
    assert timing_excess({"wait_s": 2.5}, since_welcome=prev + 2.0, claimed_until=prev) is not None


def test_a_slot_refused_for_its_version_is_told_to_its_actor(tmp_path, ctx):
    """The learner refused slots of a version above its own without a word, so an actor holding a
    forged far-future version was refused for good. Now it answers ``slot_refused`` with its own
    version (the actor drops the versions above it: test_actor_wire.py)."""
    with live_learner(tmp_path) as learner:
        peer = Peer(ctx, learner.endpoint, "ahead")
        peer.join(learner, "ahead")
        peer.say("request", "ahead")
        g = peer.wait(learner, "grant")
        arrays = valid_slot(g["grant_id"])
        arrays["behavior_version"][...] = 2**62
        peer.send(report(peer, "ahead", g["grant_id"], arrays))
        told = peer.wait(learner, "slot_refused")
        assert told["version"] == learner.state.version == 0 and told["grant_id"] == g["grant_id"], told
        assert told["behavior_version"] == 2**62, told
        assert told["reason"].startswith("version: behaviour versions"), told
        assert learner.rejects.by_reason() == {"version": 1}, learner.rejects.counts
