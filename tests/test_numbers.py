"""Non-finite numbers: skipped optimizer steps, refused checkpoints, rejected
slots, and the reward scaler's per-stream gaps."""

import json

import numpy as np
import pytest
import torch

from asyncrl.core import config
from asyncrl.core.consume import Consumer, SlotData
from asyncrl.core.optim import GuardedAdam
from asyncrl.core.slot_checks import SlotError, check_slot
from asyncrl.core.spec import RolloutSpec
from asyncrl.core.state import LearnerState, NonFiniteError, RewardScaler
from asyncrl.run.serial import run_serial
from asyncrl.tasks import make_task

SPEC = RolloutSpec(obs_dim=2, action_dim=1, discrete=False, rollout_length=8, num_envs=2)
SMALL = [
    "env.id=asyncrl/Corridor-v0",
    "env.num_envs=2",
    "env.rollout_length=8",
    "learner.slots_per_batch=1",
    "learner.num_slots=1",
    "algo.num_minibatches=2",
    "algo.num_epochs=2",
    "run.num_actors=1",
    "run.log_every_s=1000",
]


def _batch(state: LearnerState, **fields) -> dict:
    arrays = SPEC.allocate()
    arrays["rewards"][:] = 1.0
    arrays.update(fields)
    return state.make_batch([("a", arrays)])


def test_guarded_adam_skips_nonfinite_steps_and_counts_them():
    w = torch.nn.Parameter(torch.ones(3))
    opt = GuardedAdam([w], lr=0.1)
    for bad in (float("nan"), float("inf")):
        w.grad = torch.tensor([1.0, bad, 1.0])
        opt.step()
        assert torch.equal(w.detach(), torch.ones(3)) and not opt.state[w]  # untouched, no moments
    assert (opt.skipped, opt.consecutive) == (2, 2)
    w.grad = torch.ones(3)
    opt.step()
    assert (opt.skipped, opt.consecutive) == (2, 0) and not torch.equal(w.detach(), torch.ones(3))


def test_nonfinite_loss_skips_every_step_then_fails_the_run():
    cfg = config.load(None, SMALL + ["learner.reward_scaling=false", "learner.max_consecutive_skips=100"])
    state = LearnerState(cfg, SPEC, make_task(cfg, spec=SPEC))
    before = {k: v.clone() for k, v in state.policy.state_dict().items()}
    rewards = np.ones((8, 2), np.float32)
    rewards[3, 1] = np.nan
    stats = state.iterate(_batch(state, rewards=rewards))
    assert stats["skipped_steps"] == 4 and state.optimizer.consecutive == 4  # 2 epochs x 2 minibatches
    for k, v in state.policy.state_dict().items():
        if not k.startswith("obs_"):  # the normaliser statistics do move; the weights must not
            assert torch.equal(v, before[k]), k
    strict_cfg = config.load(None, SMALL + ["learner.reward_scaling=false", "learner.max_consecutive_skips=3"])
    strict = LearnerState(strict_cfg, SPEC, make_task(strict_cfg, spec=SPEC))
    with pytest.raises(NonFiniteError, match="4 optimizer steps in a row skipped"):
        strict.iterate(_batch(strict, rewards=rewards))


def test_checkpoint_never_written_with_nonfinite_values(tmp_path):
    cfg = config.load(None, SMALL)
    state = LearnerState(cfg, SPEC, make_task(cfg, spec=SPEC))
    path = tmp_path / "checkpoint.pt"
    state.save(path)
    good = path.read_bytes()
    with torch.no_grad():
        state.policy.pi[0].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"policy\.pi\.0\.weight \(1\)"):
        state.save(path)
    assert path.read_bytes() == good and not path.with_suffix(".pt.tmp").exists()
    cfg = config.load(None, SMALL)
    state = LearnerState(cfg, SPEC, make_task(cfg, spec=SPEC))
    state.reward_scaler.rms.var = np.array(np.inf)
    with pytest.raises(NonFiniteError, match="reward_scaler"):
        state.save(path)


def test_check_slot_reasons():
    arrays = SPEC.allocate()
    check_slot(arrays, SPEC, version=0)
    for name, reason in (("obs", "nonfinite"), ("rewards", "nonfinite"), ("final_obs", "nonfinite")):
        bad = SPEC.allocate()
        bad[name].reshape(-1)[0] = np.inf
        with pytest.raises(SlotError) as info:
            check_slot(bad, SPEC, version=0)
        assert info.value.reason == reason and name in str(info.value)
    mixed = SPEC.allocate()
    mixed["behavior_version"][0] = 1
    with pytest.raises(SlotError, match="mixes"):
        check_slot(mixed, SPEC, version=1)
    tagged = SPEC.allocate()
    tagged["grant_id"][...] = 7
    check_slot(tagged, SPEC, version=0, grant_id=7)
    tagged["grant_id"][2, 1] = 8  # one entry written under another grant
    check_slot(tagged, SPEC, version=0)  # no grant given: the tags are not read
    with pytest.raises(SlotError) as info:
        check_slot(tagged, SPEC, version=0, grant_id=7)
    assert info.value.reason == "foreign_rows" and "1 entries" in str(info.value)


def test_behaviour_log_probabilities_above_zero_are_refused():
    """A log-probability above 0 (a probability above 1) is impossible, yet was trained on: refused
    ("log_prob") for discrete actions and tokens, with float32 rounding's room; a continuous
    action's log-density may be positive (a narrow Gaussian)."""
    from asyncrl.tasks.llm.spec import TokenSpec

    discrete = RolloutSpec(obs_dim=2, action_dim=3, discrete=True, rollout_length=8, num_envs=2)
    tokens = TokenSpec(prompts=1, group_size=2, prompt_tokens=2, completion_tokens=2, vocab_size=9)
    for spec in (discrete, tokens, SPEC):
        a = spec.allocate()
        if spec is tokens:
            a["completion_mask"][:, 0] = a["policy_mask"][:, 0] = True
        a["behavior_log_prob"][0] = 1e-5  # float32 rounding of an honest log-softmax
        check_slot(a, spec, version=0)
        a["behavior_log_prob"][0] = 0.5
        if spec is SPEC:
            check_slot(a, spec, version=0)
            continue
        with pytest.raises(SlotError, match="log-probabilities up to 0.5") as info:
            check_slot(a, spec, version=0)
        assert info.value.reason == "log_prob"


def test_reward_scaler_gap_restarts_the_stream():
    s = RewardScaler(gamma=0.9, clip=10.0)
    r, no_end = np.ones((4, 2), np.float32), np.zeros((4, 2), bool)
    s("a", r, no_end)
    assert s.returns["a"][0] > 3
    s.reset("a")
    s("a", r, no_end)
    fresh = RewardScaler(gamma=0.9, clip=10.0)
    fresh("a", r, no_end)
    assert np.allclose(s.returns["a"], fresh.returns["a"])  # as if the stream had just started


def test_slot_dropped_for_lag_leaves_a_gap(tmp_path):
    """A slot dropped by max_policy_lag: the next slot of its stream starts a new running return,
    whether the dropped one came in an earlier batch or earlier in the same batch."""
    cfg = config.load(
        None,
        SMALL
        + ["learner.max_policy_lag=0", "learner.slots_per_batch=2", "learner.num_slots=2", "algo.num_minibatches=4"],
    )
    c = Consumer(cfg, SPEC, tmp_path, task=make_task(cfg, spec=SPEC))
    try:

        def slot(version):
            a = SPEC.allocate()
            a["rewards"][:] = 1.0
            a["behavior_version"][:] = version
            return SlotData("a", "h", a, 16, [])

        c.consume([slot(0), slot(0)])  # version 0 -> 1; the running return grows
        assert c.state.reward_scaler.returns["a"][0] > 10
        c.consume([slot(0), slot(1)])  # the stale one is dropped, then a fresh one
        assert np.allclose(c.state.reward_scaler.returns["a"], sum(0.99**k for k in range(8)))
    finally:
        c.close()


def test_serial_run_with_nan_rewards_finishes_finite(tmp_path):
    """An env whose reward is NaN now and then: its slots are refused and counted, the rest
    trains; weights, statistics and the checkpoint stay finite."""
    cfg = config.load(None, SMALL + ["env.id=asyncrl/NaNCorridor-v0", "run.total_env_steps=4000"])
    summary = run_serial(cfg, tmp_path, echo=lambda *_: None)
    assert summary["outcome"] == "finished" and summary["env_steps"] >= 4000
    assert summary["rejected_slots"]["nonfinite"] >= 3, summary  # NaN at steps 500, 1000, 1500, 2000 of each env
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["policy"].values())
    assert np.isfinite(ckpt["reward_scaler"]["rms"]["var"])
    assert all(
        np.isfinite(r)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        for r in json.loads(line)["episode_returns"]
    )
