"""The learner's slots from report to batch: an actor's report of a full slot checked (the grant
is its own and current, env steps, timing, episode statistics, the slot's values; a TCP rollout
written into the slot), full slots copied out of the ring and checked again (generation, row tags,
values) with the row-tag audit, and ``consume``: one learner iteration once B good copies are there.

Methods of :class:`asyncrl.roles.learner.Learner` (mixed in); the state they use is made in its
``__init__``.
"""

from __future__ import annotations

import logging
import time

from asyncrl.core.consume import SlotData
from asyncrl.core.lag_parts import SlotTiming, inbox_wait
from asyncrl.core.slot_checks import SlotError, check_slot, own_rows
from asyncrl.roles.learner_peers import ActorInfo
from asyncrl.wire import codec, protocol, rejects

log = logging.getLogger("asyncrl.learner")


class LearnerSlots:
    """The learner's slot intake and batches (a mixin of Learner)."""

    warmup = None  # the task's warm-up in its thread (Learner.run); no batch is trained before it ends

    def on_report(self, actor_id: str, h: dict, arrays) -> None:
        """A slot is full: checked, then queued for the next batch. A rejected report frees
        its slot again, so nothing of it is ever consumed."""
        if h["type"] == "ready":
            slot = h["slot"]
            held = any(g == (slot, h["grant_id"]) for g in self.ledger.granted_to(actor_id))
        else:
            slot = next((g.slot for g in self.ledger.granted_to(actor_id) if g.grant_id == h["grant_id"]), None)
            held = slot is not None
        if not held:
            raise protocol.ProtocolError(
                "stale_grant", f"{h['type']} for slot {slot} grant {h['grant_id']} not held by {actor_id}"
            )
        info = self.actors[actor_id]
        try:
            env_steps = self.check_report(info, h)
            if h["type"] == "rollout":
                received = codec.decode_rollout_frames(arrays, self.spec)
                self.validate_slot(received, h["grant_id"])
                episode_returns = self.check_episodes(received, h)
                views = self.ring.views(slot)
                for name, a in received.items():
                    views[name][...] = a
                del views
                info.mode = "tcp"
                self.rollouts_by_transport["tcp"] += 1
            else:
                views = self.ring.views(slot)
                self.validate_slot(views, h["grant_id"])
                episode_returns = self.check_episodes(views, h)
                del views
                self.rollouts_by_transport["shm"] += 1
        except protocol.ProtocolError as exc:
            if self.ledger.void(actor_id, slot, h["grant_id"]):
                self.ring.disarm(slot)
            info.pending += 1  # the grant it held is void: it may ask again
            self.state.reward_scaler.reset(actor_id)  # the stream has a gap now
            if exc.ahead is not None:  # it acted with a version above this learner's: a forged one (actor_weights)
                self.reply(
                    info.route,
                    {
                        "type": "slot_refused",
                        "grant_id": h["grant_id"],
                        "reason": rejects.printable(str(exc), 1000),
                        "version": self.state.version,
                        "behavior_version": exc.ahead,
                    },
                )
            raise
        self.ledger.complete(actor_id, slot, h["grant_id"])
        now = time.monotonic()
        info.timed_until = max(
            report_clock(h["timing"], now - info.joined), info.timed_until + timing_claim(h["timing"])
        )
        self.note_report_interval(now - info.lease_from)
        info.lease_from = now
        timing = h["timing"]  # numbers of seconds (check_report); an actor may leave keys out
        waited, info.least_delay = inbox_wait(now - info.joined, _seconds(timing.get("sent_s")), info.least_delay)
        self.full_meta[slot] = (
            actor_id,
            {
                "host": info.host,
                "env_steps": env_steps,
                "episode_returns": episode_returns,
                "grant_id": h["grant_id"],
                "timing": SlotTiming(
                    time.time() - waited, _seconds(timing.get("collect_s")), _seconds(timing.get("wait_s"))
                ),
            },
        )
        for key in ("env_s", "inference_s", "wait_s"):
            self.timing["actors_" + key] += float(h["timing"].get(key, 0.0))

    def check_report(self, info: ActorInfo, h: dict) -> int:
        """The env steps a report's slot holds, E * T of the slot's shape (what the learner knows;
        llm: completions). Raises ProtocolError "env_steps" if the report says another number,
        "timing" unless each of its timing values is a number of seconds in 0..(seconds since the
        actor's welcome + 1) and the seconds it spent since its previous accepted report fit in the
        time between the two (:func:`timing_excess`)."""
        steps = self.spec.num_envs * self.spec.rollout_length
        if h["env_steps"] != steps:
            raise protocol.ProtocolError("env_steps", f"report of {h['env_steps']} env steps, a slot holds {steps}")
        since_welcome = time.monotonic() - info.joined
        limit = since_welcome + 1.0
        for key, value in h["timing"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= limit:
                raise protocol.ProtocolError(
                    "timing",
                    f"timing {rejects.printable(key, 40)} = {rejects.printable(repr(value), 40)}: not seconds in "
                    f"0..{limit:.0f}",
                )
        bad = timing_excess(h["timing"], since_welcome, info.timed_until)
        if bad is not None:
            raise protocol.ProtocolError("timing", bad)
        return steps

    def check_episodes(self, views: dict, h: dict) -> list[float]:
        """The episode returns to record for a report: raise ProtocolError "episodes" unless the
        report's returns and lengths can be those of the slot (``spec.episode_mismatch``: control:
        counts against the slot's episode ends, episodes inside the slot recomputed from its rewards;
        llm: the returns are the slot's rewards); then ``spec.episode_statistics`` (what the slot
        shows, when the report left episodes out)."""
        bad = self.spec.episode_mismatch(views, h["episode_returns"], h["episode_lengths"])
        if bad is not None:
            raise protocol.ProtocolError("episodes", bad)
        return self.spec.episode_statistics(views, h["episode_returns"], h["episode_lengths"])[0]

    def validate_slot(self, views: dict, grant_id: int) -> None:
        """Raise ProtocolError (reason of ``slot_checks.check_slot``) unless the slot, written under
        ``grant_id``, can be trained on."""
        try:
            check_slot(views, self.spec, version=self.state.version, grant_id=grant_id)
        except SlotError as exc:
            # exc.ahead: a behaviour version above this learner's, told to the actor (slot_refused)
            raise protocol.ProtocolError(exc.reason, str(exc).split(": ", 1)[1], ahead=exc.ahead) from None

    # ---- learning ----
    def collect_full(self, limit: int) -> None:
        """Copy up to ``limit`` of the oldest full slots out and free them. A copy is kept only if
        the grant whose report was accepted still held the slot during the copy and no revoked
        writer touched it (slot integrity, shm.py), and if it passes the report's checks again (the
        memory could change after the report); else it is dropped and counted, and its stream
        restarts."""
        for s in self.ledger.pop_full(min(limit, self.ledger.num_full)):
            actor_id, meta = self.full_meta.pop(s)
            views = self.ring.views(s)
            arrays = {k: v.copy() for k, v in views.items()}
            del views
            intact = self.ring.intact(s, meta["grant_id"])
            self.ledger.release(s)
            self.ring.disarm(s)
            own = own_rows(arrays, meta["grant_id"])
            self.audit(intact, own)
            try:
                if not intact:
                    raise SlotError(
                        "revoked_writer",
                        f"slot {s} of grant {meta['grant_id']} was written into by a "
                        f"writer whose grant had been revoked",
                    )
                # the tags were read once above: check_slot's own tag check only where they are foreign
                check_slot(arrays, self.spec, version=self.state.version, grant_id=None if own else meta["grant_id"])
            except SlotError as exc:
                self.consumer.reject_slot(actor_id, exc.reason)
                n = self.consumer.rejected_slots[exc.reason]
                if n & (n - 1) == 0:
                    log.warning("learner: dropped a slot of actor %s: %s (%d so far)", actor_id, exc, n)
                continue
            self.copied.append(
                SlotData(actor_id, meta["host"], arrays, meta["env_steps"], meta["episode_returns"], meta["timing"])
            )

    def audit(self, intact: bool, own: bool) -> None:
        """Count one copied slot in the row-tag audit (summary.json ``slot_audit``), independent of
        the generation check: ``passed_generation_foreign_rows`` counts slots that check passed
        although a row is tagged with another grant (they are dropped too, as ``foreign_rows``)."""
        self.consumer.slot_audit["copied"] += 1
        key = ("passed_generation" if intact else "revoked_writer") + ("_own_rows" if own else "_foreign_rows")
        self.consumer.slot_audit[key] += 1

    def warmed_up(self) -> bool:
        """The task's warm-up (learner.compile's compile) has ended; the seconds of one that did its
        work go to the summary's time_breakdown_s as learner_warm_up_s."""
        w = self.warmup
        if w is None or not w.ready:
            return w is None
        if w.result:
            self.timing["learner_warm_up_s"] = w.seconds or 0.0
        return True

    def consume(self) -> bool:
        """Copy full slots out (no more than the next batch needs) and free them; once B good
        copies are there, run one learner iteration on them and publish.

        Only what the next batch needs leaves the ring: the ring of learner.num_slots is the one
        queue between actors and learner, so actors faster than the learner wait for a free slot
        and the lag stays bounded (at most num_slots / B iterations of queueing). Copying every
        full slot out, as this did until 2026-12-01, freed slots as fast as actors filled them:
        with actors faster than the learner (actor hosts over TCP, toy envs) the copies piled up,
        memory grew and the lag grew without bound (42 versions after 125 iterations, measured)."""
        B = self.cfg.learner.slots_per_batch
        if self.ledger.num_full and len(self.copied) < B:
            self.collect_full(B - len(self.copied))
            self.grant_pending()  # actors go on while the learner learns
        if len(self.copied) < B or not self.warmed_up():
            return False
        batch, self.copied = self.copied[:B], self.copied[B:]
        version, target = self.state.version, self.lag_target
        extra = None if target is None else {"effective_slots": target.slots}  # the ring size in force now
        trained = self.consumer.consume(batch, extra=extra) is not None
        if target is not None:  # the batch's lag, dropped slots too: they waited in the ring as well
            target.observe(
                [version - int(sd.arrays["behavior_version"].min()) for sd in batch], peak_in_use=self.peak_in_use
            )
            self.peak_in_use = self.ledger.num_in_use
        for sd in batch:  # these ids' join records are now kept for good (seeding)
            self.undelivered.pop(sd.actor, None)
        # The snapshot (and every learner.checkpoint_every iterations the checkpoint) is taken before
        # the weights go out, not after: after the publish, its 0.5-1 ms delayed the next grants just
        # long enough for the new weights (one hop longer, through the broadcaster) to reach the actors
        # first. That made the main job more synchronous than designed: lag-2 samples fell from 7-9 % to
        # 0.3-1 % (lag p95 2 -> 1 version), measured 2026-12-03 (docs/results/throughput.md).
        if self.consumer.eval_pending:  # its evaluation is due: publish first, so the actors generate with
            self.publish()  # the version under evaluation while the learner evaluates and serves them
            self.consumer.evaluate_pending(tick=lambda: self.serve(0))
            self.consumer.end_iteration()
            return True
        self.consumer.end_iteration()
        if trained:
            self.publish()
        return True

    def lag_target_summary(self) -> dict:
        """summary.json's ``lag_target`` block ({} when there is none): the controller's
        (asyncrl.core.lag_target.LagTarget.summary) and what it cost: env steps a second and the
        actors' seconds waiting for a grant, also as a share of their env, inference and wait time."""
        if self.lag_target is None:
            return {}
        t = self.timing
        wait = t["actors_wait_s"]
        busy = t["actors_env_s"] + t["actors_inference_s"] + wait
        return {
            "lag_target": {
                **self.lag_target.summary(),
                "env_steps_per_s": self.state.env_steps / max(self.consumer.clock.elapsed, 1e-9),
                "actors_wait_s": wait,
                "actors_wait_share": wait / busy if busy > 0 else None,
            }
        }


TIMING_SLACK_S = 0.05  # float rounding, and the actor's perf_counter against its monotonic clock


def report_clock(timing: dict, since_welcome: float) -> float:
    """When a report was sent, in seconds since its actor's welcome: its ``sent_s`` (the actor's
    clock; already held to 0..since_welcome + 1), else the learner's ``since_welcome``."""
    sent = timing.get("sent_s")
    return since_welcome if sent is None else float(sent)


def timing_claim(timing: dict) -> float:
    """The seconds a report says its actor spent since its previous report: ``wait_s`` for the grant,
    then the rollout (``collect_s``, of which ``env_s`` and ``inference_s`` are parts)."""
    part = {k: float(timing.get(k, 0.0)) for k in ("env_s", "inference_s", "wait_s", "collect_s")}
    return part["wait_s"] + max(part["env_s"] + part["inference_s"], part["collect_s"])


def timing_excess(timing: dict, since_welcome: float, claimed_until: float) -> str | None:
    """Why a report's timing cannot be honest, or None. Its actor spends the seconds it claims
    (:func:`timing_claim`) after its previous report, so they must fit between ``claimed_until`` (the
    actor's clock up to which its accepted reports have accounted for its time: the later of the
    last one's ``sent_s`` and the sum of their claims; 0 at the welcome) and this report's
    :func:`report_clock`, plus TIMING_SLACK_S once. Accepted, the report moves ``claimed_until`` to
    max(its clock, claimed_until + its claim), so the claims of one session add up to at most its
    length plus one slack, however many reports and whatever ``sent_s`` they say (0 every time
    included). The sums of env_s, inference_s and wait_s go to summary.json (time_breakdown_s,
    lag_target). The window is on the actor's clock: the learner's own, between handling two
    reports, is shorter by the first one's wait in its inbox (an iteration of training), which would
    refuse honest actors."""
    spent = timing_claim(timing)
    window = report_clock(timing, since_welcome) - claimed_until
    if spent <= window + TIMING_SLACK_S:
        return None
    return (
        f"wait_s + max(env_s + inference_s, collect_s) = {spent:.3f} s, more than the {max(window, 0.0):.3f} s "
        f"from what this actor's accepted reports (or its welcome) account for to this report"
    )


def _seconds(value) -> float | None:
    """A report's timing value as seconds, or None when the actor left it out."""
    return None if value is None else float(value)
