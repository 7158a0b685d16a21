"""Actor role: envs + a copy of the policy. Connects to the learner (slot grants, reports) and
the broadcaster (weights), fills granted slots in the learner's shared memory when it can attach
to it, and ships rollouts over TCP when it cannot.

Top to bottom: handshake -> first weights -> loop(newest weights, wait for a grant, collect,
report). Every step records the policy version that chose its action.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

import torch

from .. import transport as tp
from ..transport import snapshot_endpoint
from ..config import Config, from_dict
from ..envs import VecEnv
from ..lag_control import WeightHistory
from ..policy import InferencePolicy, build_policy, layout_hash
from ..rollout import collect
from ..seeding import ActorSeeds, actor_seeds, fingerprint
from ..security import Security
from ..shm import ShmError, SlotRing
from ..spec import RolloutSpec

log = logging.getLogger("asyncrl.actor")


class ActorError(RuntimeError):
    """The actor cannot go on (refused by the learner, no learner, mismatched config)."""


@dataclass
class ActorOptions:
    learner: str                # tcp://host:port of the learner's ROUTER
    broadcaster: str            # tcp://host:port of the broadcaster's PUB; its ROUTER is port + 1
    actor_id: str
    seed: int | None = None     # run seed the actor's streams derive from (None: the learner's run.seed)
    connect_timeout_s: float = 60.0
    max_rollouts: int = 0       # 0: until the learner says stop
    run_id: str = ""            # refuse to join any other run ("": any)
    host_label: str = ""        # the host this actor reports (lag report per host); "": hostname
    security: Security | None = None   # keys for non-loopback addresses (default: none)


class Actor:
    def __init__(self, cfg: Config, opts: ActorOptions):
        self.cfg, self.opts = cfg, opts
        torch.set_num_threads(1)
        # seeded at the first reset, once the welcome gave the run seed and this id's restart count
        self.env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=cfg.env.max_episode_steps,
                           module=cfg.env.module)
        self.spec: RolloutSpec = self.env.spec(cfg.env.rollout_length)
        self.security = opts.security or Security(f"actor {opts.actor_id}")
        sec = self.security.client
        snapshot_ep = snapshot_endpoint(opts.broadcaster)
        keys = sec(opts.learner), sec(opts.broadcaster), sec(snapshot_ep)   # SecurityError before any socket
        self.ctx = tp.context()
        self.learner = tp.dealer(self.ctx, opts.learner, opts.actor_id, security=keys[0])
        self.weights_sub = tp.sub(self.ctx, opts.broadcaster, security=keys[1])
        self.snapshot = tp.dealer(self.ctx, snapshot_ep, opts.actor_id, security=keys[2])
        self.watches = [("learner", opts.learner, tp.handshakes(self.learner)),
                        ("broadcaster", opts.broadcaster, tp.handshakes(self.weights_sub)),
                        ("broadcaster", snapshot_ep, tp.handshakes(self.snapshot))]
        self.run_id = ""
        self.ring: SlotRing | None = None
        self.local_slot = None            # TCP mode: one slot in ordinary memory
        self.grants: list[tuple[int, int]] = []
        self.policy = None
        self.version = -1                 # the version the policy copy holds now
        self.history: WeightHistory | None = None   # made at the welcome (its seed is one of the streams)
        self.seeds: ActorSeeds | None = None
        self.last_heartbeat = 0.0
        self.last_learner_message = time.monotonic()   # the learner answers every heartbeat
        self.rejects = tp.RejectCounter("actor")
        self.revoked = 0                  # rollouts dropped because their grant was revoked mid-write
        # NaN/inf from this actor's own envs: counted and logged, never fatal
        self.bad_numbers = tp.RejectCounter(f"actor {opts.actor_id}", log, what="non-finite numbers")
        self.step_sleep_s = cfg.actor.slowdown_s / cfg.env.rollout_length
        self.stopped = ""

    # ---- handshake ----
    def hello(self) -> None:
        """Say hello until the learner answers (it may start later). Raises ActorError when the
        learner refuses (another run id, env, rollout shape, spaces or protocol version), refuses
        the connection (keys), or does not answer within connect_timeout_s."""
        deadline = time.monotonic() + self.opts.connect_timeout_s
        header = {"type": "hello", "proto": tp.PROTOCOL_VERSION, "run_id": self.opts.run_id,
                  "actor_id": self.opts.actor_id, "host": self.opts.host_label or socket.gethostname(),
                  "pid": os.getpid(), "env_id": self.cfg.env.id, "spec": self.spec.to_dict(),
                  "shm_token": None, "spaces": self.env.spaces}
        next_hello, said_waiting = 0.0, False
        while time.monotonic() < deadline:
            if not said_waiting and deadline - time.monotonic() < self.opts.connect_timeout_s - 3:
                said_waiting = True    # only once the learner is clearly not there yet
                log.info("actor %s: waiting for the learner at %s (up to %.0f s)", self.opts.actor_id,
                         self.opts.learner, self.opts.connect_timeout_s)
            if time.monotonic() >= next_hello:
                tp.send(self.learner, tp.encode(header), block=False)
                next_hello = time.monotonic() + 1.0
            self.check_connections()
            frames = tp.recv_multipart_timeout(self.learner, 200)
            if frames is None:
                continue
            try:
                reply, _ = tp.decode(frames)
            except tp.ProtocolError as exc:    # counted and logged; a real answer may still come
                self.rejects.reject(exc, "learner")
                continue
            if reply["type"] == "refuse":
                raise ActorError(f"actor {self.opts.actor_id}: refused by the learner: {tp.printable(reply['reason'], 1000)}")
            if reply["type"] == "welcome":
                return self._welcome(reply)
        raise ActorError(f"actor {self.opts.actor_id}: no learner answered at {self.opts.learner} "
                         f"within {self.opts.connect_timeout_s:.0f} s")

    def _welcome(self, reply: dict) -> None:
        self.run_id = reply["run_id"]
        self.last_learner_message = time.monotonic()
        learner_cfg = from_dict(json.loads(reply["config"]))
        template = build_policy(learner_cfg.policy, self.spec.obs_dim, self.spec.action_dim,
                                discrete=self.spec.discrete)
        self.layout_hash = layout_hash(template)
        run_seed = self.opts.seed if self.opts.seed is not None else learner_cfg.run.seed
        self.seeds = actor_seeds(run_seed, self.opts.actor_id, reply["restart"], self.cfg.env.num_envs)
        self.policy = InferencePolicy(template, activation=learner_cfg.policy.activation, seed=self.seeds.action)
        a = self.cfg.actor
        self.history = WeightHistory(policy_delay=a.policy_delay, policy_age_buffer=a.policy_age_buffer,
                                     seed=self.seeds.lag)
        log.info("actor %s: joined run %s (restart %d); env and action streams %s from run seed %d",
                 self.opts.actor_id, tp.printable(self.run_id), reply["restart"], fingerprint(self.seeds), run_seed)
        mode = self.cfg.actor.rollout_transport
        if mode == "tcp":
            log.info("actor %s: shipping rollouts over TCP (actor.rollout_transport = tcp)", self.opts.actor_id)
            self.local_slot = self.spec.allocate()
            return
        try:
            self.ring = SlotRing.attach(name=reply["shm_name"], spec=self.spec, num_slots=reply["num_slots"],
                                        token=reply["token"])
            log.info("actor %s: attached to shared memory %s", self.opts.actor_id, reply["shm_name"])
        except ShmError as exc:
            if mode == "shm":
                raise ActorError(f"actor {self.opts.actor_id}: actor.rollout_transport is shm, but the learner's "
                                 f"shared memory is not reachable from here: {exc}") from None
            log.info("actor %s: learner's shared memory not reachable (%s); shipping rollouts over TCP",
                     self.opts.actor_id, exc)
            self.local_slot = self.spec.allocate()

    def check_connections(self) -> None:
        """Raise ActorError once the learner or the broadcaster refuses this actor's handshake
        (a key it does not accept, another server key, CURVE on one end only)."""
        for what, endpoint, watch in self.watches:
            bad = watch.fatal()
            if bad is not None:
                raise ActorError(f"actor {self.opts.actor_id}: the {what} at {endpoint} refused the connection: "
                                 f"{bad.detail}")

    def _send(self, kind: str, **fields) -> None:
        tp.send(self.learner, tp.encode({"type": kind, "proto": tp.PROTOCOL_VERSION, "run_id": self.run_id,
                                         "actor_id": self.opts.actor_id, **fields},
                                        limits=tp.report_limits(self.spec.num_envs, self.spec.rollout_length)))

    # ---- weights ----
    def first_weights(self) -> None:
        deadline = time.monotonic() + self.opts.connect_timeout_s
        while self.history.newest < 0:
            if time.monotonic() > deadline:
                raise ActorError(f"actor {self.opts.actor_id}: no weights from the broadcaster "
                                 f"at {self.opts.broadcaster}")
            tp.send(self.snapshot, tp.encode({"type": "snapshot", "proto": tp.PROTOCOL_VERSION,
                                              "run_id": self.run_id, "actor_id": self.opts.actor_id}), block=False)
            self.check_connections()
            frames = tp.recv_multipart_timeout(self.snapshot, 1000)
            if frames is not None and len(frames) == 3:   # [topic, header, payload]; else "no weights yet"
                self._receive(frames)
            self.receive_weights()

    def receive_weights(self) -> None:
        """Take every weights message pending (older versions matter to the lag controls)."""
        for frames in tp.drain_all(self.weights_sub):
            self._receive(frames)

    def _receive(self, frames) -> None:
        """Keep a weights message; one that does not decode is counted and logged, never fatal."""
        try:
            header, flat = tp.decode_weights(frames, run_id=self.run_id, layout_hash=self.layout_hash)
        except tp.ProtocolError as exc:
            self.rejects.reject(exc, "broadcaster")
            return
        self.history.add(header["version"], flat)

    def select_weights(self) -> None:
        """Load the version the lag controls pick (the newest, by default) into the policy copy."""
        version, flat = self.history.choose()
        if version != self.version:
            self.policy.load(flat)
            self.version = version

    # ---- grants and reports ----
    def poll_learner(self, timeout_ms: int) -> None:
        frames = tp.recv_multipart_timeout(self.learner, timeout_ms)
        while frames is not None:
            try:
                header, _ = tp.decode(frames, run_id=self.run_id)
            except tp.ProtocolError as exc:
                self.rejects.reject(exc, "learner")
            else:
                self.last_learner_message = time.monotonic()
                if header["type"] == "grant":
                    self.grants.append((header["slot"], header["grant_id"]))
                elif header["type"] == "stop":
                    self.stopped = header["reason"]
            frames = tp.recv_multipart_timeout(self.learner, 0)

    def heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_heartbeat >= self.cfg.transport.heartbeat_s:
            self._send("heartbeat")
            self.last_heartbeat = now
            self.check_connections()

    def wait_for_grant(self) -> tuple[int, int] | None:
        while not self.grants and not self.stopped:
            self.heartbeat()
            self.poll_learner(100)
            silent = time.monotonic() - self.last_learner_message
            if silent > self.cfg.transport.actor_timeout_s:
                raise ActorError(f"actor {self.opts.actor_id}: no word from the learner at {self.opts.learner} "
                                 f"for {silent:.0f} s (it stopped, or dropped this actor)")
        return self.grants.pop(0) if self.grants else None

    def act(self, obs):
        """The policy copy's actions; a straggler (actor.slowdown_s > 0) also sleeps slowdown_s / T
        per step, so its rollouts take that much longer and come back staler."""
        if self.step_sleep_s > 0:
            time.sleep(self.step_sleep_s)
        # Heartbeat while collecting: a rollout longer than transport.actor_timeout_s must not make
        # the learner reap a live actor (it would regrant the slot being written, then lock it out).
        self.heartbeat()
        return self.policy.act(obs)

    def finite_episodes(self, stats) -> tuple[list[float], list[int]]:
        """The rollout's (episode returns, lengths) without episodes whose return is NaN or inf
        (counted and logged): the wire takes finite numbers only, and the learner must not
        average them into its return."""
        returns, lengths = [], []
        for r, n in zip(stats.episode_returns, stats.episode_lengths):
            if math.isfinite(r):
                returns.append(float(r))
                lengths.append(int(n))
            else:
                self.bad_numbers.reject("nonfinite_episode_return", "its envs")
        return returns, lengths

    def run(self) -> int:
        """Handshake, then collect until the learner says stop. Returns rollouts sent."""
        self.hello()
        self.first_weights()
        self.env.reset(seeds=self.seeds.env)
        for _ in range(2):                      # two credits: fill one slot while the next is granted
            self._send("request")
        sent = 0
        while not self.stopped and (self.opts.max_rollouts == 0 or sent < self.opts.max_rollouts):
            self.poll_learner(0)
            t_wait = time.perf_counter()
            grant = self.wait_for_grant()
            wait_s = time.perf_counter() - t_wait
            if grant is None:
                break
            slot_index, grant_id = grant
            self.receive_weights()
            self.select_weights()
            slot = self.ring.views(slot_index) if self.ring is not None else self.local_slot
            guard = self.ring.guard(slot_index, grant_id) if self.ring is not None else None
            stats = collect(self.env, self.act, slot, version=self.version, guard=guard)
            if stats.revoked:          # the learner reclaimed this grant (we were silent too long)
                del slot
                self.revoked += 1
                log.warning("actor %s: grant %d of slot %d was revoked while this actor held it (it was silent "
                            "longer than the learner's actor timeout); its rollout is dropped (%d so far)",
                            self.opts.actor_id, grant_id, slot_index, self.revoked)
                continue
            returns, lengths = self.finite_episodes(stats)
            try:   # a slot with NaN/inf is still reported: the learner refuses it and frees the grant
                tp.check_finite(slot)
            except tp.ProtocolError as exc:
                self.bad_numbers.reject(exc, "its envs")
            report = dict(grant_id=grant_id, env_steps=stats.env_steps,
                          episode_returns=returns, episode_lengths=lengths,
                          timing={"env_s": stats.env_s, "inference_s": stats.inference_s, "wait_s": wait_s})
            if self.ring is not None:
                del slot
                self._send("ready", slot=slot_index, **report)
            else:
                header = {"type": "rollout", "proto": tp.PROTOCOL_VERSION, "run_id": self.run_id,
                          "actor_id": self.opts.actor_id, **report}
                tp.send(self.learner, tp.encode_rollout(header, slot, self.spec))
            sent += 1
            self.heartbeat()
        return sent

    def close(self) -> None:
        try:
            if self.run_id and not self.stopped:
                tp.send(self.learner, tp.encode({"type": "bye", "proto": tp.PROTOCOL_VERSION, "run_id": self.run_id,
                                                 "actor_id": self.opts.actor_id}), block=False)
        finally:
            tp.close(self.learner, self.weights_sub, self.snapshot)
            self.security.close()
            self.ctx.term()
            if self.ring is not None:
                self.ring.close()
            self.env.close()
