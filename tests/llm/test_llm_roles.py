"""The llm task through the shared roles' code: group advantages broadcast over tokens into the same
loss functions as the control task (hand-computed values and gradients, padding masked), the slot a
generator writes, the LM's weights through the broadcaster's flat buffer, and a bit-reproducible
serial run (asyncrl.run.serial, the same Consumer and LearnerState as MuJoCo)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.algo import grpo
from asyncrl.core import config
from asyncrl.core.config import AlgoConfig, ConfigError  # noqa: E402
from asyncrl.core.iteration import policy_loss  # noqa: E402
from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.core.slot_checks import check_slot  # noqa: E402
from asyncrl.roles.broadcaster import Broadcaster  # noqa: E402
from asyncrl.run.launch import free_port_pair  # noqa: E402
from asyncrl.run.serial import run_serial  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402
from asyncrl.tasks.llm import answer_formats, gsm_problems, heldout_eval, producer, start_model  # noqa: E402
from asyncrl.tasks.llm import model as m  # noqa: E402
from asyncrl.tasks.llm import task as llm_task
from asyncrl.tasks.llm import weights as llm_weights  # noqa: E402
from asyncrl.tasks.llm.learn import _token_log_probs  # noqa: E402
from asyncrl.wire import addresses, codec, protocol, sockets  # noqa: E402
from asyncrl.wire.weights_secret import read_weights_secret  # noqa: E402

EPS = grpo.DEFAULT_EPS


def _tiny_cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.eval_size=8",
        "algo.num_epochs=2",
        "algo.num_minibatches=2",
        "algo.lr=1e-3",
        "learner.slots_per_batch=2",
        "learner.num_slots=2",
        "run.num_actors=2",
        "run.total_env_steps=24",
        "run.log_every_s=1000",
        *extra,
    )


# ---- advantages into the losses ------------------------------------------------------------------

# 2 prompts x G = 2: rewards [1, 0] (advantages +a, -a) and [1, 1] (0, 0); L = 3 with padding
REWARDS = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
MASK = torch.tensor([[True, True, True], [True, False, False], [True, True, False], [True, True, False]])
A = 0.5 / (0.5 + EPS)  # (1 - 0.5) / (population std 0.5 + eps)


def _flat(log_prob, behavior, averaging="token"):
    adv = grpo.group_advantages(REWARDS)
    return grpo.flatten_tokens(MASK, log_prob=log_prob, behavior_log_prob=behavior, advantages=adv, averaging=averaging)


def test_group_advantages_hand_values_and_padding():
    adv = grpo.group_advantages(REWARDS)
    assert torch.allclose(adv, torch.tensor([[A, -A], [0.0, 0.0]]))
    tok = grpo.token_advantages(adv, MASK)
    expect = torch.tensor([[A, A, A], [-A, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(tok, expect)
    assert bool((tok[~MASK] == 0).all())  # padding gets no advantage


def test_grpo_preset_is_ppo_clip_on_tokens_hand_computed():
    behavior = torch.zeros(4, 3)
    log_prob = torch.zeros(4, 3)
    log_prob[0, 1] = math.log(1.5)  # a positive-advantage token past 1 + 0.2: clipped
    log_prob[1, 1] = math.log(5.0)  # a padding position: whatever its value, no effect
    log_prob.requires_grad_(True)
    tb = _flat(log_prob, behavior)
    assert tb.log_prob.shape == (8,)  # 3 + 1 + 2 + 2 completion tokens
    pl = policy_loss(
        AlgoConfig(preset="grpo"),
        log_prob=tb.log_prob,
        behavior_log_prob=tb.behavior_log_prob,
        target_log_prob=tb.log_prob.detach(),
        adv=tb.advantages,
    )
    # tokens: row 0: A, 1.2 A (clipped), A; row 1: -A; rows 2-3: 0
    assert math.isclose(pl.loss.item(), -(A + 1.2 * A + A - A) / 8, rel_tol=1e-6)
    assert math.isclose(float(pl.clip_fraction_two_sided), 1 / 8)
    assert math.isclose(float(pl.no_grad_fraction), 1 / 8)  # the clipped token: A > 0, r > 1.2
    pl.loss.backward()
    g = log_prob.grad
    expect = torch.tensor([[-A / 8, 0.0, -A / 8], [A / 8, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(g, expect, atol=1e-7), g
    assert bool((g[~MASK] == 0).all())


@pytest.mark.parametrize("preset", ["decoupled_ppo", "vaco"])
def test_vaco_surrogate_on_tokens_weights_by_truncated_pi_T_over_beta(preset):
    """The default (decoupled_ppo) and vaco as the control task configures them: learning anchor π_T,
    weight min(1, π_T/β), the band (default) or the TV filter (vaco) on π_θ/π_T. At π_θ = π_T neither
    acts and the loss is -mean(min(1, π_T/β) A) over tokens."""
    cfg = config.load(None, [f"algo.preset={preset}"]).algo
    assert cfg.ratio_anchor == "learning" and cfg.surrogate_rho_bar == 1.0
    target = torch.zeros(4, 3)
    behavior = torch.zeros(4, 3)
    behavior[0, 0] = math.log(2.0)  # π_T/β = 0.5: weight 0.5
    behavior[1, 0] = math.log(0.25)  # π_T/β = 4: weight truncated to 1
    log_prob = target.clone().requires_grad_(True)
    tb = _flat(log_prob, behavior)
    pl = policy_loss(
        cfg,
        log_prob=tb.log_prob,
        behavior_log_prob=tb.behavior_log_prob,
        target_log_prob=target[MASK],
        adv=tb.advantages,
    )
    assert math.isclose(pl.loss.item(), -(0.5 * A + A + A - A) / 8, rel_tol=1e-6)
    pl.loss.backward()
    expect = torch.tensor([[-0.5 * A / 8, -A / 8, -A / 8], [A / 8, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.allclose(log_prob.grad, expect, atol=1e-7), log_prob.grad
    assert float(pl.tv_estimate) == 0.0 and float(pl.no_grad_fraction) == 0.0


def test_sequence_averaging_weights_each_row_equally():
    log_prob = torch.zeros(4, 3, requires_grad=True)
    tb = _flat(log_prob, torch.zeros(4, 3), averaging="sequence")
    pl = policy_loss(
        AlgoConfig(preset="grpo"),
        log_prob=tb.log_prob,
        behavior_log_prob=tb.behavior_log_prob,
        target_log_prob=tb.log_prob.detach(),
        adv=tb.advantages,
    )
    # mean over each row's tokens, then over the 4 rows: (A - A + 0 + 0) / 4
    assert abs(pl.loss.item()) < 1e-7
    pl.loss.backward()
    assert torch.allclose(log_prob.grad[0], torch.full((3,), -A / (4 * 3)), atol=1e-7)
    assert torch.allclose(log_prob.grad[1, 0], torch.tensor(A / 4), atol=1e-7)


def test_config_keeps_presets_to_their_task():
    with pytest.raises(ConfigError, match="task.kind = llm takes"):
        config.load(None, ["task.kind=llm", "algo.preset=ppo"])
    with pytest.raises(ConfigError, match="grpo is for task.kind = llm"):
        config.load(None, ["algo.preset=grpo"])
    assert config.load(None, ["task.kind=llm", "algo.preset=grpo", "algo.num_minibatches=4"]).batch_size == 4 * 8 * 4
    for key in (
        "algo.value_targets=vtrace",
        "algo.realign_min_lag=2",
    ):  # control-only: an error, not ignored
        with pytest.raises(ConfigError, match="control-task options .* llm.realign"):
            config.load(None, ["task.kind=llm", "algo.num_minibatches=4", key])


def test_config_checks_realign_and_kl_coef():
    llm = ["task.kind=llm", "algo.num_minibatches=4"]
    cfg = config.load(None, llm)
    assert cfg.llm.realign == "none" and cfg.llm.kl_coef == 0.0
    assert config.load(None, [*llm, "llm.realign=is_baseline", "llm.kl_coef=0.04"]).llm.realign == "is_baseline"
    with pytest.raises(ConfigError, match=r"^llm.realign must be one of none, is_baseline, got 'vtrace'$"):
        config.load(None, [*llm, "llm.realign=vtrace"])
    with pytest.raises(ConfigError, match=r"^llm.kl_coef must be >= 0, got -0.1$"):
        config.load(None, [*llm, "llm.kl_coef=-0.1"])
    with pytest.raises(ConfigError, match=r"^llm.kl_coef must be a finite number >= 0, got inf$"):
        config.load(None, [*llm, "llm.kl_coef=inf"])
    assert (
        cfg.llm.negative_weight == 1.0 and config.load(None, [*llm, "llm.negative_weight=0"]).llm.negative_weight == 0
    )
    with pytest.raises(ConfigError, match=r"^llm.negative_weight must be >= 0, got -1.0$"):
        config.load(None, [*llm, "llm.negative_weight=-1"])
    with pytest.raises(ConfigError, match=r"^algo.rho_bar must be > 0 or inf, got 0.0$"):
        config.load(None, [*llm, "llm.realign=is_baseline", "algo.rho_bar=0"])
    assert (
        cfg.llm.eval_mode == "sampled" and config.load(None, [*llm, "llm.eval_mode=greedy"]).llm.eval_mode == "greedy"
    )
    with pytest.raises(ConfigError, match=r"^llm.eval_mode must be one of sampled, greedy, got 'beam'$"):
        config.load(None, [*llm, "llm.eval_mode=beam"])


# ---- the generator's slot --------------------------------------------------------------------------


def test_generator_writes_whole_groups_and_learner_log_probs_match_at_zero_lag(micro_dir):
    cfg = _tiny_cfg(micro_dir)
    task = make_task(cfg)
    spec = task.spec
    prod = task.producer()
    prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
    prod.reset()
    slot = spec.allocate()
    stats = prod.collect(slot, version=3, grant_id=17)
    assert stats.env_steps == spec.rows == 4 and len(stats.episode_returns) == 4
    check_slot(slot, spec, version=3, grant_id=17)
    assert (slot["behavior_version"] == 3).all() and (slot["grant_id"] == 17).all()
    assert set(np.unique(slot["rewards"])) <= {0.0, 1.0}
    # prompts left-padded, identical within a group; completions right-padded, masks contiguous
    for r in range(spec.rows):
        pm, cm = slot["prompt_mask"][r], slot["completion_mask"][r]
        assert not pm[: np.argmax(pm)].any() and pm[np.argmax(pm) :].all()
        n = int(cm.sum())
        assert cm[:n].all() and not cm[n:].any() and (slot["behavior_log_prob"][r, n:] == 0).all()
        pol = slot["policy_mask"][r]  # the policy's own tokens: inside the completion, log β 0 elsewhere
        assert not (pol & ~cm).any() and (slot["behavior_log_prob"][r][~pol] == 0).all()
    assert (slot["prompt_ids"][0] == slot["prompt_ids"][1]).all()
    # a token id out of the vocabulary is refused by the learner's checks
    bad = {k: v.copy() for k, v in slot.items()}
    bad["completion_ids"][0, 0] = spec.vocab_size
    with pytest.raises(Exception, match="token"):
        check_slot(bad, spec, version=3)
    bad = {k: v.copy() for k, v in slot.items()}
    bad["policy_mask"][0, -1], bad["completion_mask"][0, -1] = True, False
    with pytest.raises(Exception, match="policy_mask"):
        check_slot(bad, spec, version=3)
    # the learner's log-probs of the same weights (zero lag) equal the sampler's
    state_model = task.build_policy()
    batch = {k: torch.from_numpy(v) for k, v in slot.items()}
    with torch.no_grad():
        lp = _token_log_probs(state_model, batch, torch.arange(4), llm=cfg.llm)
    mask = batch["policy_mask"]
    assert (lp[mask] - batch["behavior_log_prob"][mask]).abs().max() < 1e-4


def _slot_batch(cfg, task, rewards):
    """One slot of the generator (version 0, the start model) as a learner batch, with these rewards."""
    prod = task.producer()
    prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
    prod.reset()
    slot = task.spec.allocate()
    prod.collect(slot, version=0)
    batch = {k: torch.from_numpy(v.copy()) for k, v in slot.items()}
    batch["rewards"] = torch.tensor(rewards)
    return batch


def _update(task, cfg, batch, **kw):
    """(weights, statistics) after one llm_iteration from the start model (fixed minibatch generator)."""
    from asyncrl.tasks.llm.learn import llm_iteration

    model = task.build_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stats = llm_iteration(
        model, opt, batch, algo=cfg.algo, llm=cfg.llm, generator=torch.Generator().manual_seed(0), version=0, **kw
    )
    return model.state_dict(), stats


def test_learner_ignores_tokens_outside_policy_mask(micro_dir):
    """Calculator-written tokens (completion_mask True, policy_mask False) are attended to but are no
    action: their behaviour log-prob does not reach the update, a policy token's does."""
    cfg = _tiny_cfg(micro_dir)
    task = make_task(cfg)
    batch = _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0])
    cm = batch["completion_mask"]
    assert int(cm.sum(1).min()) >= 2
    batch["policy_mask"] = cm.clone()
    batch["policy_mask"][:, 1] = False  # as if a calculator wrote every row's second token
    batch["behavior_log_prob"][:, 1] = 0.0

    def update(b):
        return _update(task, cfg, b)[0]

    base = update(batch)
    off = dict(batch, behavior_log_prob=batch["behavior_log_prob"].clone())
    off["behavior_log_prob"][:, 1] = -3.0  # outside policy_mask: no effect
    same = update(off)
    assert all(torch.equal(base[k], same[k]) for k in base)
    on = dict(batch, behavior_log_prob=batch["behavior_log_prob"].clone())
    on["behavior_log_prob"][:, 0] += 3.0  # a policy token's ratio (and its weight min(1, π_T/β)) changes
    moved = update(on)
    assert any(not torch.equal(base[k], moved[k]) for k in base)


def test_realigned_baseline_in_the_iteration(micro_dir):
    """A batch made by the learner's own weights (zero lag, up to float rounding), then one completion made
    stale by hand: log β of its first policy token + ln 2, so its weight is min(1, π_T/β) = 1/2. Group
    [1, 0] with weights [1/2, 1]: b_T = 1/2 / 3/2 = 1/3 against b_β = 1/2; group [0, 1]: no move."""
    cfg = _tiny_cfg(micro_dir, "llm.realign=is_baseline")
    task = make_task(cfg)
    batch = _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0])
    _, fresh = _update(task, cfg, batch)
    assert fresh["realign_baseline_shift"] < 1e-3 and fresh["realign_weight_min"] > 1 - 1e-3
    first = int(batch["policy_mask"][0].nonzero()[0])
    stale = dict(batch, behavior_log_prob=batch["behavior_log_prob"].clone())
    stale["behavior_log_prob"][0, first] += math.log(2.0)
    _, st = _update(task, cfg, stale)
    assert math.isclose(st["realign_baseline_shift"], (1 / 2 - 1 / 3) / 2, abs_tol=1e-3)
    assert math.isclose(st["realign_weight_min"], 0.5, abs_tol=1e-3)
    assert math.isclose(st["realign_weight_mean"], (0.5 + 3) / 4, abs_tol=1e-3)
    assert "realign_weight_min" not in _update(task, _tiny_cfg(micro_dir), stale)[1]  # realign = none: no stats


def test_kl_coef_zero_leaves_the_update_unchanged_and_holds_no_reference(micro_dir):
    cfg = _tiny_cfg(micro_dir)
    task = make_task(cfg)
    assert task.reference() is None
    batch = _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0])
    other = task.build_policy()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1)
    base, stats = _update(task, cfg, batch)
    same, _ = _update(task, cfg, batch, reference=other)  # a reference passed with kl_coef = 0 is not read
    assert all(torch.equal(base[k], same[k]) for k in base) and "kl_ref" not in stats


def test_kl_penalty_to_the_frozen_start_model(micro_dir):
    cfg = _tiny_cfg(micro_dir, "llm.kl_coef=0.5")
    task = make_task(cfg)
    ref = task.reference()
    assert ref is task.reference() and not any(p.requires_grad for p in ref.parameters()) and not ref.training
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    batch = _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="kl_coef = 0.5 needs the reference"):
        _update(task, cfg, batch)
    with_kl, stats = _update(task, cfg, batch, reference=ref)
    without, _ = _update(task, _tiny_cfg(micro_dir), batch)
    # the first step starts at π_θ = π_ref (k3 = 0, zero gradient); later steps have moved away
    assert stats["kl_ref"] > 0 and math.isfinite(stats["kl_ref"])
    assert any(not torch.equal(with_kl[k], without[k]) for k in with_kl)
    assert all(torch.equal(start[k], v) for k, v in ref.state_dict().items())  # the reference stays frozen
    # the learner's path (LLMTask.learner_iteration) passes that reference
    policy = task.build_policy()
    state = SimpleNamespace(
        policy=policy,
        optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
        generator=torch.Generator().manual_seed(0),
        version=0,
        device=torch.device("cpu"),
        forward_context=contextlib.nullcontext,
    )  # what LearnerState holds on learner.device = cpu
    assert task.learner_iteration(state, batch)["kl_ref"] == stats["kl_ref"]
    assert all(torch.equal(v, with_kl[k]) for k, v in policy.state_dict().items())


# ---- weights through the broadcaster -----------------------------------------------------------------


def test_lm_weights_round_trip_through_the_broadcaster(micro_dir, tmp_path):
    src = m.load(micro_dir).model
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.01)
    flat = llm_weights.flat_weights(src)
    assert flat.dtype == np.float32 and flat.size == sum(p.numel() for p in src.parameters())  # tied weights once
    port = free_port_pair()
    b = Broadcaster(f"tcp://127.0.0.1:{port}", summary=tmp_path / "b.json", echo=lambda *_: None)
    ctx = sockets.context()
    learner = actor = None
    try:
        ep = addresses.snapshot_endpoint(b.endpoint)
        learner = sockets.dealer(ctx, ep, sockets.route_identity("learner"))
        actor = sockets.dealer(ctx, ep, sockets.route_identity("actor0"))
        frames = codec.encode_weights(
            run_id="r", epoch=1, version=5, publish_time=1.0, layout_hash=llm_weights.layout_hash(src), payload=flat
        )
        sockets.send(learner, codec.sign_weights(frames, read_weights_secret(b.endpoint)))
        deadline = time.monotonic() + 20
        while b.newest != (1, 5) and time.monotonic() < deadline:
            b.serve(20)
        assert b.newest == (1, 5)
        sockets.send(
            actor,
            codec.encode({"type": "snapshot", "proto": protocol.PROTOCOL_VERSION, "run_id": "r", "actor_id": "actor0"}),
        )
        reply = None
        while reply is None and time.monotonic() < deadline:
            b.serve(20)
            reply = sockets.recv_multipart_timeout(actor, 20)
        assert reply is not None and len(reply) == 3
        header, got = codec.decode_weights(reply, run_id="r", layout_hash=llm_weights.layout_hash(src))
    finally:
        sockets.close(*(s for s in (learner, actor) if s is not None))
        ctx.term()
        b.close()
    assert header["version"] == 5 and np.array_equal(got, flat)
    dst = m.load(micro_dir).model
    llm_weights.load_flat(dst, got)
    for (k, a), (_, c) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(a, c), k
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(src(input_ids=ids).logits, dst(input_ids=ids).logits)


# ---- serial mode -------------------------------------------------------------------------------------

_TIMES = (
    "wall_time_s",
    "lag_seconds_p50",
    "lag_seconds_p95",
    "time",
    *(f"lag_{part}_s_mean" for part in ("propagation", "collection", "queueing")),
)


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in r.items() if k not in _TIMES}, sort_keys=True) for r in rows]


def test_serial_llm_run_is_bit_reproducible(micro_dir, tmp_path, monkeypatch):
    cfg = _tiny_cfg(micro_dir, "run.seed=3")
    # the untrained micro model solves nothing: a reward on the completion's length parity gives the
    # groups unequal rewards, so the learner really moves the weights (the verifiable reward is gsm's)
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: float(len(text) % 2))
    summaries = []
    for name in ("a", "b"):
        make_task(cfg).prepare_run(tmp_path / name, echo=lambda *_: None)
        summaries.append(run_serial(cfg, tmp_path / name, echo=lambda *_: None))
    a, b = summaries
    assert a["learner_iterations"] == 3 and a["env_steps"] == 24 and a["outcome"] == "finished"
    assert a["task"] == "llm" and 0 <= a["initial_accuracy"] <= 1 and 0 <= a["final_accuracy"] <= 1
    assert a["eval_problems"] == 8 and "accuracy_difference_ci95_paired" in a and a["eval_mode"] == "sampled T=1"
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    rows = [json.loads(x) for x in _metrics(tmp_path / "a")]
    assert all(r["lag_versions_max"] == 0 for r in rows)  # serial, no lag controls
    fresh = [r["logprob_mismatch_fresh"] for r in rows if r["optimizer_steps"]]  # null: no row trained
    assert fresh and all(x < 1e-4 for x in fresh)  # generator vs learner at zero lag
    pa = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["policy"]
    pb = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["policy"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(r["zero_advantage_groups"] < 1 for r in rows) and any(r["grad_norm"] > 0 for r in rows)
    start = m.load(micro_dir).model.state_dict()
    assert any(not torch.equal(pa[k], start[k]) for k in pa)  # it learned something
    # another RL seed samples other completions
    run_serial(_tiny_cfg(micro_dir, "run.seed=4"), tmp_path / "c", echo=lambda *_: None)
    assert _metrics(tmp_path / "c") != _metrics(tmp_path / "a")


def test_paired_accuracy_difference_hand_computed():
    # b = 1 solved only before, c = 2 only after, n = 5: d = 0.2, var = ((1 + 2) - 1 / 5) / 25
    out = heldout_eval.paired_difference([1, 1, 0, 0, 1], [1, 0, 1, 1, 1])
    assert out["solved_only_before"] == 1 and out["solved_only_after"] == 2
    half = 1.96 * math.sqrt(2.8) / 5
    assert out["accuracy_difference_ci95_paired"] == pytest.approx([0.2 - half, 0.2 + half])
    assert heldout_eval.paired_difference([1, 0], [1, 0])["accuracy_difference_ci95_paired"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="same non-zero length"):
        heldout_eval.paired_difference([1], [1, 0])


def test_warmup_target_ends_the_start_models_warmup_early_and_keys_its_cache(micro_dir, tmp_path, monkeypatch):
    scores = iter([0.1, 0.35, 0.9])
    seen = []

    def fake_accuracy_on(self, model, tokenizer, problems, tick=None):  # the validation check, scripted
        seen.append((len(problems), model.training))
        return next(scores), len(problems), []

    monkeypatch.setattr(heldout_eval.LLMHeldoutEvaluation, "accuracy_on", fake_accuracy_on)
    monkeypatch.setattr(start_model, "WARMUP_CHECK_EVERY", 2)
    cfg = _tiny_cfg(
        micro_dir,
        f"llm.cache_dir={tmp_path}",
        "llm.warmup_steps=9",
        "llm.warmup_target=0.3",
        "llm.train_problems=50",
        "llm.warmup_batch_size=4",
    )
    task = make_task(cfg)
    start = task.prepare_model(echo=lambda *_: None)
    assert start == task.start_dir() and start.name.endswith("-n9-b4-t0.3")
    stamp = json.loads((start / start_model.WARMUP_STAMP).read_text())
    # checked from the first check on (steps 2, 4, ...): stopped at the first check at or above 0.3
    assert stamp["steps_taken"] == 4 and stamp["validation_checks"] == [[2, 0.1], [4, 0.35]]
    assert stamp["settings"]["target"] == 0.3 and stamp["settings"]["batch_size"] == 4
    assert stamp["settings"]["metric"] == task.eval_label() and stamp["settings"]["first_check"] == 2
    assert seen == [(start_model.WARMUP_VALIDATION, False)] * 2  # in eval mode, on the validation problems
    assert make_task(cfg).prepare_model(echo=lambda *_: None) == start and len(seen) == 2  # cached
    with pytest.raises(ConfigError, match=r"^llm.warmup_target must be in \[0, 1\], got 1.5$"):
        config.load(None, ["task.kind=llm", "llm.warmup_target=1.5"])


def test_the_warmup_check_is_the_heldout_metric(micro_dir, tmp_path):
    """The warm-up's check measures what the start band is judged on: on the held-out problems it
    gives the held-out evaluation's accuracy and per-problem rewards exactly (same draws, format, scoring)."""
    from asyncrl.tasks.llm import model as m

    for mode in ("sampled", "greedy"):
        task = make_task(_tiny_cfg(micro_dir, f"llm.cache_dir={tmp_path}", "llm.eval_size=16", f"llm.eval_mode={mode}"))
        loaded = m.load(micro_dir)
        assert task.accuracy_on(loaded.model, task.tokenizer(), task.heldout_problems()) == task.evaluate(loaded.model)


def test_the_warmup_runs_at_task_warmup_threads_whatever_torch_had(micro_dir, tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as under OMP_NUM_THREADS=1, or a launcher that set a learner's threads
    try:
        base = [f"llm.cache_dir={tmp_path}", "llm.warmup_steps=2", "llm.train_problems=20", "llm.warmup_batch_size=4"]
        task = make_task(_tiny_cfg(micro_dir, *base))
        start = task.prepare_model(echo=lambda *_: None)
        stamp = json.loads((start / start_model.WARMUP_STAMP).read_text())
        assert stamp["torch_threads"] == 2 and "threads" not in stamp["settings"] and torch.get_num_threads() == 1
        # another thread count is another start model: its own directory and cache key
        other = make_task(_tiny_cfg(micro_dir, *base, "llm.warmup_threads=3"))
        assert other.start_dir().name == start.name.replace("-b4", "-b4-th3")
        assert (
            json.loads((other.prepare_model(echo=lambda *_: None) / start_model.WARMUP_STAMP).read_text())[
                "torch_threads"
            ]
            == 3
        )
        # a cache made (before llm.warmup_threads) at another thread count is not taken for this one
        stamp["torch_threads"] = 1
        (start / start_model.WARMUP_STAMP).write_text(json.dumps(stamp))
        with pytest.raises(FileExistsError, match="was not warmed up with these settings"):
            make_task(_tiny_cfg(micro_dir, *base)).prepare_model(echo=lambda *_: None)
        assert make_task(_tiny_cfg(micro_dir, *base, "llm.warmup_threads=0")).start_dir().name.endswith("-th0")
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match=r"^llm.warmup_threads must be >= 0, got -1$"):
        config.load(None, ["task.kind=llm", "llm.warmup_threads=-1"])


def test_sampled_evaluation_repeats_its_draws_and_greedy_is_argmax(micro_dir, monkeypatch, tmp_path):
    from asyncrl.tasks.llm.sampling import eval_completions

    texts = []
    # the untrained micro model solves nothing: score the completions' length parity to see them
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: texts.append(text) or float(len(text) % 2))
    model = m.load(micro_dir).model
    sampled = make_task(_tiny_cfg(micro_dir, "llm.temperature=1.5"))
    assert sampled.eval_label() == "sampled T=1.5"
    first = sampled.evaluate(model)
    first_texts, texts[:] = list(texts), []
    assert sampled.evaluate(model) == first and texts == first_texts  # the same draws before and after RL
    acc, n, correct = first
    assert n == 8 and len(correct) == 8 and acc == sum(correct) / 8
    texts[:] = []
    greedy = make_task(_tiny_cfg(micro_dir, "llm.eval_mode=greedy", "llm.temperature=1.5"))
    assert greedy.eval_label() == "greedy"
    greedy.evaluate(model)
    heldout = gsm_problems.make_splits(seed=0, n_train=0, n_heldout=8).heldout
    tok = m.load(micro_dir).tokenizer
    assert texts == eval_completions(model, tok, heldout, greedy=True, max_new_tokens=12)
    assert texts != first_texts  # 8 completions of 12 tokens at T 1.5 from an untrained model: not all argmax
    # a run directory whose start record has the other evaluation compares nothing with it
    greedy.prepare_run(tmp_path, echo=lambda *_: None)
    out = sampled.final_summary(model, tmp_path)
    assert out["eval_mode"] == "sampled T=1.5" and out["final_accuracy"] == acc
    assert out["initial_accuracy"] is None and "accuracy_difference_ci95_paired" not in out
    # a sampled start record made with another evaluation batch drew the same numbers (one stream per
    # problem): paired; one made by an older asyncrl (draws of a batch-wide stream, no eval_draws) is not
    (tmp_path / "b").mkdir()
    make_task(_tiny_cfg(micro_dir, "llm.temperature=1.5", "llm.eval_batch_size=3")).prepare_run(
        tmp_path / "b", echo=lambda *_: None
    )
    out = sampled.final_summary(model, tmp_path / "b")
    assert out["initial_accuracy"] is not None and "accuracy_difference_ci95_paired" in out
    record = json.loads((tmp_path / "b" / heldout_eval.START_FILE).read_text())
    del record["eval_draws"]
    (tmp_path / "b" / heldout_eval.START_FILE).write_text(json.dumps(record))
    old = sampled.final_summary(model, tmp_path / "b")
    assert old["initial_accuracy"] is None and "accuracy_difference_ci95_paired" not in old


def test_the_start_evaluation_is_reused_across_runs_of_one_start_model(micro_dir, tmp_path, monkeypatch):
    calls = []
    real = llm_task.LLMTask.evaluate
    monkeypatch.setattr(llm_task.LLMTask, "evaluate", lambda self, model: calls.append(1) or real(self, model))
    base = [
        f"llm.cache_dir={tmp_path / 'cache'}",
        "llm.warmup_steps=2",
        "llm.train_problems=20",
        "llm.warmup_batch_size=4",
    ]
    made = lambda *extra: make_task(_tiny_cfg(micro_dir, *base, *extra))  # noqa: E731 - a start model made in the cache
    quiet = dict(echo=lambda *_: None)
    a = made().prepare_run(tmp_path / "a", **quiet)
    b = made().prepare_run(tmp_path / "b", **quiet)
    assert len(calls) == 1 and "initial_eval_cached" not in a and b.pop("initial_eval_cached").endswith(".json")
    assert a == b and len(a["initial_correct"]) == 8
    made("llm.eval_batch_size=3").prepare_run(tmp_path / "c", **quiet)  # another evaluation: measured again
    assert len(calls) == 2
    weights = next(p for p in made().start_dir().iterdir() if p.suffix == ".safetensors")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # a rewritten model
    made().prepare_run(tmp_path / "d", **quiet)
    assert len(calls) == 3
    # a user's own model directory: evaluated every time, nothing cached beside it or in the cache
    user = lambda: make_task(_tiny_cfg(micro_dir, f"llm.cache_dir={tmp_path / 'cache2'}"))  # noqa: E731
    user().prepare_run(tmp_path / "e", **quiet)
    user().prepare_run(tmp_path / "f", **quiet)
    assert len(calls) == 5 and not (tmp_path / "cache2").exists()


def test_truncated_completions_get_zero_when_asked(micro_dir, monkeypatch):
    from asyncrl.tasks.llm.sampling import Samples

    ids = torch.tensor([[5, 6, 2, 0], [5, 7, 7, 7]])  # prompt width 1; row 0 emits EOS (2), row 1 is cut
    cm = torch.tensor([[True, True, False], [True, True, True]])
    s = Samples(ids, torch.ones(2, 4, dtype=torch.long), cm, torch.zeros(2, 3), 1, cm)
    assert producer.truncated(s, eos_id=2) == [False, True]
    monkeypatch.setattr(answer_formats, "reward", lambda text, target, **_: 1.0)
    got = {}
    for mode in ("score", "zero"):
        cfg = _tiny_cfg(micro_dir, f"llm.truncated_reward={mode}")
        task = make_task(cfg)
        prod = task.producer()
        prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
        prod.reset()
        slot = task.spec.allocate()
        prod.collect(slot, version=0)
        got[mode] = slot["rewards"].copy()
        eos = m.load(micro_dir).tokenizer.eos_token_id
        cut = [not ((slot["completion_ids"][r] == eos) & slot["completion_mask"][r]).any() for r in range(4)]
    assert (got["score"] == 1).all()
    assert list(got["zero"]) == [0.0 if c else 1.0 for c in cut]
    with pytest.raises(ConfigError, match="truncated_reward"):
        _tiny_cfg(micro_dir, "llm.truncated_reward=drop")


def test_silent_groups_skip_stops_momentum_steps(micro_dir):
    """A batch whose groups all have equal rewards carries no gradient, yet Adam moves on its momentum
    (silent_groups = step, the default); with skip, the weights stay where the last real step left them."""
    from asyncrl.tasks.llm.learn import llm_iteration

    def two_iterations(mode):
        cfg = _tiny_cfg(micro_dir, f"llm.silent_groups={mode}")
        task = make_task(cfg)
        model = task.build_policy()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(0)
        kw = dict(algo=cfg.algo, llm=cfg.llm, generator=gen, version=0)
        llm_iteration(model, opt, _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0]), **kw)
        after_first = {k: v.clone() for k, v in model.state_dict().items()}
        stats = llm_iteration(model, opt, _slot_batch(cfg, task, [1.0, 1.0, 0.0, 0.0]), **kw)
        return after_first, model.state_dict(), stats

    first, second, stats = two_iterations("step")
    assert any(not torch.equal(first[k], second[k]) for k in first)  # moved with a zero gradient
    assert stats["optimizer_steps"] == 4 and stats["skipped_minibatches"] == 0
    first, second, stats = two_iterations("skip")
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert stats["optimizer_steps"] == 0 and stats["skipped_minibatches"] == 4
    assert math.isnan(stats["policy_loss"]) and stats["zero_advantage_groups"] == 1.0


def test_silent_groups_drop_is_the_batch_without_them(micro_dir):
    """drop (DAPO's dynamic-sampling filter): the update from groups [1, 0] + [1, 1] equals the update
    from group [1, 0] alone, and num_minibatches splits the rows that are left."""
    cfg = _tiny_cfg(micro_dir, "llm.silent_groups=drop")
    task = make_task(cfg)
    both = _slot_batch(cfg, task, [1.0, 0.0, 1.0, 1.0])
    alone = {k: v[:2] for k, v in both.items()}
    w_both, s_both = _update(task, cfg, both)
    w_alone, s_alone = _update(task, cfg, alone)
    assert all(torch.equal(w_both[k], w_alone[k]) for k in w_both)
    assert s_both["zero_advantage_groups"] == 0.5 and s_both["optimizer_steps"] == 4  # 2 epochs x 2 rows of 1
    assert s_both["policy_loss"] == s_alone["policy_loss"]
    kept, _ = _update(task, _tiny_cfg(micro_dir, "llm.silent_groups=step"), both)  # silent rows stay in
    assert any(not torch.equal(w_both[k], kept[k]) for k in w_both)
    with pytest.raises(ConfigError, match="silent_groups"):
        _tiny_cfg(micro_dir, "llm.silent_groups=ignore")


@pytest.mark.parametrize(
    "sets, forwards",
    [
        (("algo.num_epochs=1", "algo.num_minibatches=1"), [(True, 4, 0)]),  # one forward, no separate π_T pass
        (
            ("algo.num_epochs=2", "algo.num_minibatches=2"),
            [(False, 2, 0), (True, 2, 0), (True, 2, 1), (True, 2, 2), (True, 2, 3)],
        ),
        (("algo.num_epochs=1", "algo.num_minibatches=1", "llm.silent_groups=drop"), [(True, 2, 0)]),
    ],
)
def test_pi_t_log_probs_come_from_forwards_before_the_first_step(micro_dir, sets, forwards):
    """log π_T is taken at the iteration's start weights: a no-gradient forward of the rows outside
    the first minibatch before any optimizer step, and the first minibatch's own forward (also
    before any step); rows of silent groups that drop removes get none. Records (grad enabled, rows,
    optimizer steps taken so far) of every forward of the model's backbone (the learner applies the
    output head itself, in chunks)."""
    from asyncrl.tasks.llm.learn import llm_iteration
    from asyncrl.tasks.llm.token_log_probs import output_head

    cfg = _tiny_cfg(micro_dir, "llm.silent_groups=step", *sets)
    task = make_task(cfg)
    batch = _slot_batch(cfg, task, [1.0, 0.0, 1.0, 1.0])
    model = task.build_policy()
    assert output_head(model, batch["prompt_ids"], batch["prompt_mask"].long()) is not None  # its one-time check
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    taken, log = [0], []
    step = opt.step
    opt.step = lambda *a, **k: (taken.__setitem__(0, taken[0] + 1), step(*a, **k))[1]
    model.model.register_forward_pre_hook(
        lambda mod, args, kw: log.append((torch.is_grad_enabled(), kw["input_ids"].shape[0], taken[0])),
        with_kwargs=True,
    )
    stats = llm_iteration(
        model, opt, batch, algo=cfg.algo, llm=cfg.llm, generator=torch.Generator().manual_seed(0), version=0
    )
    assert log == forwards
    assert stats["minibatches"][0][1] == 0.0  # the first step's TV estimate: π_θ is π_T there, exactly
    assert math.isfinite(stats["rho_mean"]) and abs(stats["logprob_mismatch_fresh"]) < 1e-4


@pytest.mark.parametrize("preset", config.LLM_PRESETS)
def test_llm_values_marked_unused_leave_the_iteration_bit_identical(micro_dir, preset):
    """Every [algo] value the llm task or its preset does not use (field metadata) changes nothing in one
    llm_iteration, bit for bit; a used one (the clip or the TV budget) does, so the test can fail."""
    import dataclasses

    cfg = _tiny_cfg(micro_dir, f"algo.preset={preset}")
    task = make_task(cfg)
    batch = _slot_batch(cfg, task, [1.0, 0.0, 0.0, 1.0])
    batch["behavior_log_prob"] = batch["behavior_log_prob"] + 0.1 * batch["policy_mask"]  # ratios away from 1
    reference = _update(task, cfg, batch)[0]

    def weights(key, value):
        return _update(task, dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **{key: value})), batch)[0]

    alternatives = {
        "gamma": 0.5,
        "gae_lambda": 0.5,
        "c_bar": 0.5,
        "traces": "vtrace",
        "value_coef": 3.0,
        "entropy_coef": 0.5,
        "rho_bar": 0.5,
        "clip_eps": 0.01,
        "tv_threshold": 1e-4,
        "kl_coef": 5.0,
        "spo_eps": 0.01,
        "tv_filter_min_deviation": 0.05,
        "tv_filter_ratio_cap": 0.01,
        "tv_filter_trigger": "iteration",
        "value_targets": "vtrace",
        "realign_min_lag": 2,
    }
    unused = [k for k in alternatives if config.unused_reason(cfg, "algo", k)]
    assert {"gamma", "entropy_coef", "value_coef"} <= set(unused)
    for key in unused:
        moved = weights(key, alternatives[key])
        assert all(torch.equal(reference[k], moved[k]) for k in reference), key
    used = "clip_eps" if preset == "grpo" else "tv_threshold" if preset == "vaco" else "behavior_band"
    assert not config.unused_reason(cfg, "algo", used)
    moved = weights(used, 1e-3)
    assert any(not torch.equal(reference[k], moved[k]) for k in reference)
