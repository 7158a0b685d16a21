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
    with live_learner(tmp_path, "learner.slots_per_batch=1", "learner.compile=false") as learner:
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
