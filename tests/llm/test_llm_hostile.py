"""Hostile llm generators: no slot the learner's checks accept can end it (a generator slot whose rows
hold no policy token ended the learner with ``ValueError: completion_mask has no completion token`` in
grpo.token_weights once the honest silent groups were dropped). The slot check refuses such rows (no
honest generator writes one: the sampler draws each row's first token itself), and the learner's
iteration skips and counts a minibatch without a policy token, whatever the checks let in."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from learner_in_process import learner_in_process  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.core.slot_checks import SlotError, check_slot  # noqa: E402
from asyncrl.roles.learner import Learner  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm.learn import llm_iteration  # noqa: E402
from asyncrl.tasks.llm.spec import TokenSpec  # noqa: E402
from asyncrl.wire import codec, protocol, sockets  # noqa: E402

SETTINGS = [
    [],  # llm.silent_groups = drop, the default
    ["llm.silent_groups=skip"],
    ["llm.averaging=sequence"],
    ["llm.realign=is_baseline"],
]


def _cfg(micro_dir, *sets):
    return micro_cfg(
        micro_dir,
        "algo.num_epochs=2",
        "algo.num_minibatches=2",
        "learner.slots_per_batch=2",
        "learner.num_slots=4",
        "llm.eval_every=0",
        "run.log_every_s=1000",
        *sets,
    )


def _generated(cfg, task, rewards, *, grant_id=1, seed=0):
    """A slot the generator wrote (version 0) with these rewards."""
    prod = task.producer()
    prod.bind(cfg, actor_seeds(cfg.run.seed + seed, "actor0", 0, cfg.env.num_envs))
    prod.reset()
    slot = task.spec.allocate()
    prod.collect(slot, version=0, grant_id=grant_id)
    slot["rewards"][:] = rewards
    return slot


def _without_policy_tokens(slot):
    """The hostile slot: every row's policy_mask False (so its log β are 0), all else as written."""
    slot["policy_mask"][:] = False
    slot["behavior_log_prob"][:] = 0.0
    return slot


# ---- the slot check ---------------------------------------------------------------------------------


def test_a_row_without_a_policy_token_is_refused_by_the_slot_check():
    spec = TokenSpec(prompts=2, group_size=2, prompt_tokens=4, completion_tokens=3, vocab_size=50)
    a = spec.allocate()
    a["prompt_mask"][:, -1] = True
    a["completion_mask"][:, 0] = True  # every row one token long (EOS first): the shortest honest row
    a["policy_mask"][:] = a["completion_mask"]
    a["grant_id"][:] = 1
    check_slot(a, spec, version=0, grant_id=1)
    a["policy_mask"][2, 0] = False  # its only token written by someone else than the policy
    with pytest.raises(SlotError, match=r"^token: 1 rows without a policy token") as e:
        check_slot(a, spec, version=0, grant_id=1)
    assert e.value.reason == "token"


# ---- the learner's iteration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets", [*SETTINGS, ["llm.silent_groups=step"], ["llm.kl_coef=0.1"], ["llm.micro_batch_rows=1"]]
)
def test_llm_iteration_skips_and_counts_minibatches_without_a_policy_token(micro_dir, sets):
    """A batch whose rows hold no policy token (past any slot check) takes no step and raises nothing;
    every minibatch is counted in no_token_minibatches."""
    cfg = _cfg(micro_dir, *sets)
    task = make_task(cfg)
    batch = {k: torch.from_numpy(v) for k, v in _without_policy_tokens(_generated(cfg, task, [1, 0, 1, 0])).items()}
    model = task.build_policy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stats = llm_iteration(
        model,
        opt,
        batch,
        algo=cfg.algo,
        llm=cfg.llm,
        generator=torch.Generator().manual_seed(0),
        version=0,
        reference=task.build_policy() if cfg.llm.kl_coef > 0 else None,
    )
    assert stats["optimizer_steps"] == 0 and stats["no_token_minibatches"] == 4, stats
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- through the learner's consume path ----------------------------------------------------------------


class _Generator:
    """A DEALER that speaks the actor protocol to an llm learner and sends the slots it is given."""

    def __init__(self, ctx, learner: Learner):
        self.learner, self.spec = learner, learner.spec
        self.sock = sockets.dealer(ctx, learner.endpoint, sockets.route_identity("gen"))
        self.limits = protocol.report_limits(self.spec.num_envs, self.spec.rollout_length)
        self.grants: list[dict] = []
        hello = {
            "type": "hello",
            "run_id": "",
            "actor_id": "gen",
            "host": "h",
            "pid": os.getpid(),
            "env_id": learner.task.id,
            "spec": self.spec.to_dict(),
            "shm_token": None,
            "token": None,
            "spaces": learner.task.spaces,
        }
        sockets.send(self.sock, codec.encode(hello), block=True)
        welcome = self.wait("welcome")
        self.base = {"run_id": welcome["run_id"], "actor_id": "gen", "token": welcome["actor_token"]}
        for _ in range(protocol.GRANT_CREDITS):
            sockets.send(self.sock, codec.encode({"type": "request", **self.base}), block=True)

    def pump(self, seconds: float = 0.3) -> list[dict]:
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.learner.serve(10)
            frames = sockets.recv_multipart_timeout(self.sock, 10)
            while frames is not None:
                got.append(codec.decode(frames)[0])
                frames = sockets.recv_multipart_timeout(self.sock, 0)
        self.grants += [h for h in got if h["type"] == "grant"]
        return got

    def wait(self, kind: str, timeout_s: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for h in self.pump(0.05):
                if h["type"] == kind:
                    return h
        raise AssertionError(f"no {kind} from the learner within {timeout_s:.0f} s")

    def grant(self) -> int:
        deadline = time.monotonic() + 15.0
        while not self.grants and time.monotonic() < deadline:
            self.pump(0.05)
        return self.grants.pop(0)["grant_id"]

    def report(self, slot: dict) -> None:
        lengths = [max(1, int(n)) for n in slot["completion_mask"].sum(1)]
        header = {
            "type": "rollout",
            **self.base,
            "grant_id": int(slot["grant_id"][0]),
            "env_steps": self.spec.rows,
            "episode_returns": [float(x) for x in slot["rewards"]],
            "episode_lengths": lengths,
            "timing": {},
        }
        frames = [codec.encode(header, limits=self.limits)[0], *(slot[f.name] for f in self.spec.fields)]
        sockets.send(self.sock, frames, block=True)
        self.pump(0.5)

    def close(self) -> None:
        sockets.close(self.sock)


@pytest.mark.hostile
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sets", SETTINGS)
def test_a_slot_without_policy_tokens_cannot_end_the_learner(tmp_path, micro_dir, sets):
    """The reproduction (an honest slot whose groups are all wrong, silent, and a hostile one with
    one right answer per group and no policy token; dropping the silent groups left a batch
    without a token and the learner ended) through the learner's consume path: the hostile slot is
    refused ("token"), and the learner trains on the honest slots."""
    ctx = sockets.context()
    with learner_in_process(_cfg(micro_dir, *sets), tmp_path / "run", "llm-hostile") as learner:
        gen = _Generator(ctx, learner)
        try:
            cfg, task = learner.cfg, learner.task
            gen.report(_generated(cfg, task, [0, 0, 0, 0], grant_id=gen.grant()))  # honest, silent
            gen.report(_without_policy_tokens(_generated(cfg, task, [1, 0, 1, 0], grant_id=gen.grant(), seed=1)))
            assert learner.rejects.by_reason().get("token") == 1, learner.rejects.by_reason()
            gen.report(_generated(cfg, task, [1, 0, 0, 1], grant_id=gen.grant(), seed=2))  # honest, informative
            before = [p.detach().clone() for p in learner.state.policy.parameters()]
            assert learner.consume()
            stats = learner.consumer.last_stats
            assert stats["optimizer_steps"] > 0 and stats["no_token_minibatches"] == 0, stats
            assert any(not torch.equal(a, p) for a, p in zip(before, learner.state.policy.parameters()))
        finally:
            gen.close()
    ctx.destroy(linger=0)


@pytest.mark.hostile
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sets", SETTINGS)
def test_the_learner_alone_survives_a_batch_without_policy_tokens(tmp_path, micro_dir, monkeypatch, sets):
    """The same reproduction with the slot check's value ranges switched off, as if a check let such
    a slot in: consume ends without an exception, its minibatches without a token counted."""
    monkeypatch.setattr(TokenSpec, "invalid_values", lambda self, arrays: None)
    ctx = sockets.context()
    with learner_in_process(_cfg(micro_dir, *sets), tmp_path / "run", "llm-hostile") as learner:
        gen = _Generator(ctx, learner)
        try:
            cfg, task = learner.cfg, learner.task
            gen.report(_generated(cfg, task, [0, 0, 0, 0], grant_id=gen.grant()))
            gen.report(_without_policy_tokens(_generated(cfg, task, [1, 0, 1, 0], grant_id=gen.grant(), seed=1)))
            assert not learner.rejects.by_reason(), learner.rejects.by_reason()
            assert learner.consume()  # main: ValueError: completion_mask has no completion token
            stats = learner.consumer.last_stats
            assert np.isfinite(stats["reward_mean"]), stats
            if "llm.silent_groups=skip" not in sets:  # drop: the honest silent rows are gone, a minibatch of
                assert stats["no_token_minibatches"] > 0, stats  # hostile rows only is left (skip mixes them)
        finally:
            gen.close()
    ctx.destroy(linger=0)
