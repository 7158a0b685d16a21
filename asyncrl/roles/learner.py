"""Learner role: owns the policy, the optimizer and the shared-memory slot ring; grants slots to
actors (credits = backpressure), gathers B full slots into a batch, runs one learner iteration of
the task (asyncrl.tasks: control or llm), publishes the new weights through the broadcaster, and
accounts for policy lag.

Top to bottom: serve messages -> consume a batch when B slots are full -> publish -> repeat
until the env-step budget; then stop the actors, checkpoint, summarise, remove the segment.

This module: the learner's epoch, its construction (task, sockets, segment, consumer), publishing
the weights, the main loop (serve, consume, progress) and the end of a run (stop the actors,
summary, close). The rest of its methods are mixed in: ``learner_peers`` (peer bookkeeping,
grants, leases), ``learner_messages`` (message handlers, the hello handshake, replies),
``learner_slots`` (reports to full slots, full slots to a batch and an iteration).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from asyncrl.core import group_sync
from asyncrl.core.background import Warmup
from asyncrl.core.config import Config, EnvConfig
from asyncrl.core.consume import Consumer, SlotData
from asyncrl.core.lag_target import LagTarget
from asyncrl.core.learner_group import GroupError
from asyncrl.roles.learner_messages import LearnerMessages
from asyncrl.roles.learner_peers import MAX_MESSAGES_PER_SERVE, ROUTER_HWM, ActorInfo, LearnerPeers
from asyncrl.roles.learner_slots import LearnerSlots
from asyncrl.tasks import make_task
from asyncrl.wire import codec, protocol, rejects, sockets
from asyncrl.wire.addresses import advertised_with_source, endpoint_host, is_loopback, snapshot_endpoint
from asyncrl.wire.security import Security
from asyncrl.wire.shm.dev_shm import check_space, cleanup_stale
from asyncrl.wire.shm.layout import segment_nbytes
from asyncrl.wire.shm.ledger import SlotLedger
from asyncrl.wire.shm.ring import SlotRing
from asyncrl.wire.weights_secret import read_weights_secret

log = logging.getLogger("asyncrl.learner")

# Seconds without a publish after which the learner pings the broadcaster with its current version (a
# header, not the weights): a broadcaster that lost them (restarted) answers that it wants them, and must
# not wait for an iteration that waits for it.
REPUBLISH_S = 2.0
WEIGHTS_OUT_HWM = 2  # weights messages queued for the broadcaster: a slow one drops versions, not memory


class LearnerError(RuntimeError):
    """The learner cannot go on (e.g. the broadcaster refuses its connection)."""


def learner_epoch(previous: int = 0) -> int:
    """The epoch of a learner starting now: wall-clock nanoseconds (``time.time_ns``), or
    ``previous + 1`` if the clock reads no later than ``previous`` (e.g. the epoch saved in the
    checkpoint a resumed learner continues). So every start is newer than the last one, without
    a checkpoint, as long as the clock does not go back by more than the time between starts.
    Weights carry it; a broadcaster takes only a higher (epoch, version) than it holds."""
    return max(time.time_ns(), int(previous) + 1)


class Learner(LearnerPeers, LearnerMessages, LearnerSlots):
    write_error: OSError | None = None  # the run-directory failure that ended the run, if one did

    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path,
        *,
        run_id: str,
        bind: str,
        broadcaster: str,
        echo=print,
        security: Security | None = None,
        advertise: str | None = None,
        resume: bool = False,
        epoch: int | None = None,
        group_init: str | None = None,
    ):
        """``security``: the keys and CURVE rule for its sockets (default: loopback only, no keys);
        ``advertise``: the address actors on other hosts use, when not the bound one; ``resume``:
        go on from the run directory's newest checkpoint (asyncrl.core.consume.Consumer); ``epoch``:
        this learner's epoch (default: ``learner_epoch(epoch of the checkpoint resumed)``, newer at
        every start, resumed or not; saved in every checkpoint); ``group_init``: where its learner
        group meets when learner.num_learners > 1 (``file://PATH`` or ``tcp://HOST:PORT``; this
        learner is rank 0; :meth:`run` joins it).

        Raises SecurityError (keys missing for a non-loopback address), transport.AddressError
        (address in use, not of this host), ShmError, EnvError."""
        self.cfg, self.run_dir, self.run_id, self.echo = cfg, Path(run_dir), run_id, echo
        if cfg.learner.num_learners > 1 and not group_init:
            raise ValueError(
                f"learner.num_learners = {cfg.learner.num_learners}: give the group's meeting point (--group)"
            )
        self.group_init = group_init if cfg.learner.num_learners > 1 else None
        self.security, self.advertise, self.broadcaster = security or Security("learner"), advertise, broadcaster
        # The task first (no file, no segment): the router's frame limit comes from its slot layout.
        torch.set_num_threads(cfg.learner.torch_threads)
        self.task = make_task(cfg)
        self.spec = self.task.spec
        self.spaces = self.task.spaces
        self.wire_limits = protocol.report_limits(
            self.spec.num_envs, self.spec.rollout_length
        )  # reports of E*T episodes
        # no frame larger than a report's header or one field of a slot is ever buffered
        max_frame = max(
            self.wire_limits.max_bytes, *(int(np.prod(f.shape)) * f.dtype.itemsize for f in self.spec.fields)
        )
        # Sockets next: a refused key or a busy port must not leave a shared-memory segment behind.
        self.ctx = sockets.context()
        try:
            weights_ep = snapshot_endpoint(broadcaster)
            # a small queue per actor connection: an honest actor has a few messages in flight
            self.router = sockets.router(
                self.ctx,
                bind,
                hwm=ROUTER_HWM,
                max_message_bytes=max_frame,
                security=self.security.server(self.ctx, bind),
            )
            self.weights_curve = self.security.client(weights_ep)
            # immediate: nothing queued for a broadcaster not there (signed with a secret it may not
            # hold any more); it gets the weights when it (re)connects, see check_connections
            # it receives the answers to its version pings only (weights_status): any frame is small
            self.weights_out = sockets.dealer(
                self.ctx,
                weights_ep,
                sockets.route_identity(f"learner-{run_id}"),
                security=self.weights_curve,
                immediate=True,
                hwm=WEIGHTS_OUT_HWM,
                max_message_bytes=protocol.MAX_HEADER_BYTES,
            )
        except BaseException:
            self.security.close()
            self.ctx.destroy(linger=0)
            raise
        self.endpoint = sockets.endpoint_of(self.router)
        self.actor_watch, self.broadcaster_watch = sockets.handshakes(self.router), sockets.handshakes(self.weights_out)
        self.next_check = self.next_reap = 0.0
        self.by_route: dict[bytes, set[str]] = {}  # connection -> the actor ids it speaks for
        self.broadcaster_handshakes = 0  # seen so far: a new one means a (re)connected broadcaster
        self.last_publish = 0.0  # monotonic time of the last weights or version ping sent
        self.last_full = -float("inf")  # ... of the last weights sent
        self.broadcaster_limit: int | None = None  # its largest payload (its weights_status); None: not heard yet
        self.weights_traffic: Counter[str] = Counter()  # versions_sent, pings_sent, bytes_sent, send_dropped
        self.warned_unsigned = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # /dev/shm too small: one line before any file of the run exists (it can be rerun in the same directory)
        check_space(segment_nbytes(self.spec, cfg.learner.num_slots), self.spec, cfg.learner.num_slots)
        self.consumer = Consumer(cfg, self.spec, self.run_dir, resume=resume, task=self.task)
        self.state = self.consumer.state
        # newer than the epoch the checkpoint it resumes was written under, even after a clock step back
        self.epoch = learner_epoch(self.consumer.learner_epoch) if epoch is None else int(epoch)
        self.consumer.learner_epoch = self.epoch
        for name in cleanup_stale():
            log.warning("learner: removed shared-memory segment %s left by a dead run", name)
        self.ring = SlotRing.create(run_id=run_id, spec=self.spec, num_slots=cfg.learner.num_slots)
        self.ledger = SlotLedger(cfg.learner.num_slots)
        lrn = cfg.learner  # a lag target: grants keep to its effective ring size (None: off, the whole ring)
        self.lag_target = (
            LagTarget(
                lrn.target_lag_p95,
                num_slots=lrn.num_slots,
                slots_per_batch=lrn.slots_per_batch,
                iteration=self.state.iteration,
            )
            if lrn.target_lag_p95 >= 0
            else None
        )
        self.peak_in_use = 0  # most slots in use since the last batch (the lag target's input)
        self.actors: dict[str, ActorInfo] = {}
        self.full_meta: dict[int, tuple[str, dict]] = {}
        self.copied: list[SlotData] = []  # slots copied out of the ring, not yet trained on
        self.rejects = rejects.RejectCounter("learner")
        self.session_log = rejects.LogBudget(per_window=50, window_s=10.0)  # joins, leaves, refusals (peer_log)
        self.undelivered: dict[str, None] = {}  # ids joined in this life, no trained slot yet, oldest first
        self.departed: dict[str, None] = {}  # ids that left and keep their records, oldest first
        self.slowest_report_s = 0.0  # longest time an actor held grants before an accepted report
        self.timing: Counter[str] = Counter()  # seconds: where the time goes
        self.rollouts_by_transport: Counter[str] = Counter()  # "shm" / "tcp"
        self.weights = self.task.weights_info(self.state.policy)  # one version's payload: parameters, dtype, bytes
        self.publish()

    # ---- weights ----
    def publish(self) -> None:
        """A new version (or the start): its weights to the broadcaster once its answer to a version
        ping said how large a payload it takes; until then (the start, a broadcaster that reconnected)
        the version ping, whose answer brings the weights if it wants them (:meth:`read_broadcaster`)."""
        if self.broadcaster_limit is None:
            self.ping()
        else:
            self.send_weights()

    def _secret(self) -> tuple[bool, bytes | None]:
        """(whether the broadcaster would take what this learner signs, the secret): the secret the
        broadcaster wrote on this host (security.read_weights_secret; read at each send, so a restarted
        broadcaster's new secret is used at once), or CURVE's learner key."""
        secret = read_weights_secret(self.broadcaster)
        if secret is None and self.weights_curve is None:  # it would refuse them
            if not self.warned_unsigned:
                self.warned_unsigned = True
                log.warning(
                    "learner: no weights secret of the broadcaster at %s on this host (not started yet, or "
                    "run by another user); weights are held back until there is one",
                    self.broadcaster,
                )
            return False, None
        return True, secret

    def send_weights(self) -> None:
        """Send the current weights (publish time: the Consumer's record), signed; a full queue
        (a slow broadcaster) drops them, and the next version ping asks again."""
        now = self.consumer.lag.publish_time[self.state.version]
        self.last_publish = self.last_full = time.monotonic()
        ok, secret = self._secret()
        if not ok:
            return
        frames = codec.encode_weights(
            run_id=self.run_id,
            epoch=self.epoch,
            version=self.state.version,
            publish_time=now,
            layout_hash=self.state.layout_hash,
            payload=self.state.flat_weights(),
        )
        if sockets.send(self.weights_out, codec.sign_weights(frames, secret), block=False):
            self.weights_traffic["versions_sent"] += 1
            self.weights_traffic["bytes_sent"] += self.weights.nbytes
        else:
            self.weights_traffic["send_dropped"] += 1

    def ping(self) -> None:
        """Send the current (epoch, version) to the broadcaster, signed, without the weights."""
        self.last_publish = time.monotonic()
        ok, secret = self._secret()
        if ok:
            version = {"epoch": self.epoch, "version": self.state.version, "nbytes": self.weights.nbytes}
            frames = codec.encode_version(run_id=self.run_id, **version)
            if sockets.send(self.weights_out, codec.sign_version(frames, secret), block=False):
                self.weights_traffic["pings_sent"] += 1

    def read_broadcaster(self) -> None:
        """Take the broadcaster's answers to version pings: its largest payload (LearnerError if
        this run's weights are larger: it would drop every version; the broadcaster is the address
        this learner was given, which could starve it as well), and the weights if it wants them (at
        most once per REPUBLISH_S / 2: an answer to a ping sent before the last weights arrived may
        still say wanted). A malformed answer is counted and logged."""
        for frames in sockets.drain_all(self.weights_out, max_messages=16):
            try:
                status, _ = codec.decode(frames, run_id=self.run_id)
                if status["type"] != "weights_status":
                    raise protocol.ProtocolError("unexpected_type", status["type"])
            except protocol.ProtocolError as exc:
                self.rejects.reject(exc, "broadcaster")
                continue
            self.broadcaster_limit = status["max_bytes"]
            if self.weights.nbytes > self.broadcaster_limit:
                raise LearnerError(
                    f"learner: the broadcaster at {snapshot_endpoint(self.broadcaster)} takes weights of at most "
                    f"{self.broadcaster_limit / (1 << 20):.2f} MiB, and this run's are "
                    f"{self.weights.nbytes / (1 << 20):.2f} MiB ({self.weights.describe()}); "
                    f"start it with --max-weights-mb {self.weights.mib:.2f} or more"
                )
            if status["wanted"] and time.monotonic() - self.last_full >= REPUBLISH_S / 2:
                self.send_weights()

    def weights_summary(self) -> dict:
        """summary.json's ``weights``: the payload of one published version (``bytes_per_version``,
        ``parameters``, ``dtype``, what it ``holds``) and what this learner sent (versions, their
        bytes, version pings, versions a full queue dropped)."""
        return {
            **self.weights.to_dict(),
            **{k: self.weights_traffic[k] for k in ("versions_sent", "bytes_sent", "pings_sent", "send_dropped")},
        }

    # ---- messages (their handlers: learner_messages) ----
    def serve(self, timeout_ms: int) -> None:
        """Handle the messages that come within ``timeout_ms`` (at most MAX_MESSAGES_PER_SERVE, so a
        flood cannot keep the learner from training), then reap silent actors and expired leases,
        grant, and check connections."""
        frames = sockets.recv_multipart_timeout(self.router, timeout_ms, copy=False)
        handled = 0
        while frames is not None:
            self.handle(frames)
            handled += 1
            if handled >= MAX_MESSAGES_PER_SERVE:
                break
            frames = sockets.recv_multipart_timeout(self.router, 0, copy=False)
        self.read_broadcaster()
        now = time.monotonic()
        if now >= self.next_reap:  # each scans every actor: at most 10 times a second
            self.next_reap = now + 0.1
            self.reap_silent_actors()
            self.reclaim_expired_leases()
        self.grant_pending()
        self.check_connections()

    def check_connections(self) -> None:
        """Log refused actor connections; raise LearnerError if the broadcaster refuses ours
        (weights would never reach anyone). At most every 0.25 s."""
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + 0.25
        self.security.note_refusals(self.actor_watch)
        bad = self.broadcaster_watch.fatal()
        if bad is not None:
            raise LearnerError(
                f"learner: the broadcaster at {snapshot_endpoint(self.broadcaster)} refused the "
                f"connection: {bad.detail}"
            )
        if self.broadcaster_watch.succeeded != self.broadcaster_handshakes:
            # a broadcaster (re)connected: it may be a new one, with another limit and no weights
            self.broadcaster_handshakes = self.broadcaster_watch.succeeded
            self.broadcaster_limit = None
            self.ping()
        elif now - self.last_publish > REPUBLISH_S:
            # no publish for a while: the broadcaster may hold no weights (restarted), and actors waiting
            # for their first weights would wait for ever, since the next publish needs their rollouts.
            # A version ping costs a header; the broadcaster answers whether it wants the weights.
            self.ping()

    def announce(self) -> None:
        """Where actors connect; for a non-loopback address, the exact actor command to use."""
        security = self.security.describe(self.endpoint)
        if is_loopback(self.endpoint):
            return
        adv, source = advertised_with_source(self.endpoint, self.advertise)
        b = self.broadcaster
        if is_loopback(b):  # same host as the learner: other hosts use the learner's name
            b = f"tcp://{endpoint_host(adv)}:{b.rsplit(':', 1)[1]}"
        env, default = self.cfg.env, EnvConfig()
        flags = [f"--env {env.id}"] + ([f"--env-module {env.module}"] if env.module else [])
        if env.num_envs != default.num_envs:
            flags.append(f"--num-envs {env.num_envs}")
        for key in ("rollout_length", "max_episode_steps"):
            if getattr(env, key) != getattr(default, key):
                flags.append(f"--set env.{key}={getattr(env, key)}")
        flags.append("--insecure" if self.security.insecure else "--keys KEYS/client-K")
        self.echo(
            f"learner: run {self.run_id}, actors connect to {adv} ({security}), address from {source}; "
            f"on each actor host run:\n"
            f"  asyncrl actor --learner {adv} --broadcaster {b} {' '.join(flags)} "
            f"--run-id {self.run_id} --actor-id NAME"
        )

    def run(self) -> dict:
        self.announce()
        log.info(
            "learner: run %s listening on %s, shared memory %s, weights payload %d bytes, %s (a broadcaster "
            "started by hand takes them with --max-weights-mb %.2f or more)",
            self.run_id,
            self.endpoint,
            self.ring.name,
            self.weights.nbytes,
            self.weights.describe(),
            self.weights.mib,
        )
        if self.group_init is not None:  # rank 0 of a learner group: the members start from this state
            self.state.group = group_sync.lead(self.cfg, self.state, self.group_init, self.echo)
        # what the first iteration would pay inside it (learner.compile's compile), in a thread while it serves
        self.warmup = Warmup(lambda: self.task.warm_up(self.state), name="learner-warm-up", log=log)
        while not self.consumer.done:
            t0 = time.perf_counter()
            self.serve(5)
            t1 = time.perf_counter()
            if not self.consume():
                self.timing["learner_wait_s"] += t1 - t0
                group_sync.keep_alive(self.state.group, self.cfg.learner.group_timeout_s)
            self.consumer.progress(self.echo)
        return self.finish()

    def finish(self, *, outcome: str = "finished", reason: str | None = None, stop_actors: bool = True) -> dict:
        """Stop the actors (unless ``stop_actors`` is false: a failure a restart mends, whose actors
        wait for the restarted learner), write the final checkpoint and summary.json (``outcome`` as
        in ``Consumer.finish``; a failure is the learner's, for ``reason``); returns the summary."""
        why = {
            "finished": "step budget reached",
            "interrupted": "the learner was interrupted",
            "failed": "the learner failed",
        }.get(outcome, outcome)
        for info in list(self.actors.values()) if stop_actors else []:
            self.reply(info.route, {"type": "stop", "reason": why})
        self.timing["learner_update_s"] = self.consumer.update_s
        return self.consumer.finish(
            outcome=outcome,
            failed_role="learner" if outcome == "failed" else None,
            reason=reason,
            mode="async",
            run_id=self.run_id,
            rejected_messages=self.rejects.by_reason(),
            time_breakdown_s=dict(self.timing),
            slot_counters=dict(self.ledger.counters),
            refused_connections=self.security.refused.by_reason(),
            learner_epoch=self.epoch,
            rollouts_by_transport=dict(self.rollouts_by_transport),
            weights=self.weights_summary(),
            **self.lag_target_summary(),
        )

    def record_failure(self, exc: BaseException) -> None:
        """summary.json of a run this learner cannot go on with: outcome "failed", role learner,
        reason ``exc``. Never raises: a failure to write it (e.g. the run directory is the cause)
        is logged, and the caller reports ``exc`` itself."""
        reason = str(exc) if isinstance(exc, LearnerError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError):
            self.write_error = exc
        try:  # a learner group that lost a member is restarted: its actors wait for it, not stop
            self.finish(outcome="failed", reason=reason, stop_actors=not isinstance(exc, GroupError))
        except Exception as inner:  # noqa: BLE001 - logged; the original error goes on
            same = isinstance(exc, OSError) and isinstance(inner, OSError) and inner.errno == exc.errno
            # the run directory's own failure (disk full): the caller's one line says it all
            log.log(
                logging.DEBUG if same else logging.ERROR,
                "learner: could not write the summary of the failed run: %s",
                inner,
            )

    def close(self) -> None:
        """Idempotent; always removes the shared-memory segment. A learner group's members are told
        the run is over (one that cannot hear it fails on its timeout)."""
        group, self.state.group = self.state.group, None
        group_sync.stop(group)
        try:
            try:
                self.consumer.close()
            except OSError as exc:  # disk full at its last rows: what was written stays readable
                if self.write_error is None:
                    log.warning("learner: %s", exc)
            sockets.close(self.router, self.weights_out)
            self.security.close()
            self.ctx.term()
        finally:
            self.ring.close()
            self.ring.unlink()
