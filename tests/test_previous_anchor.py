"""algo.ratio_anchor = previous: the band centred on the newer of β and π_{T-1}. At lag 0-1 it is
PPO-clip's update, at older lag decoupled PPO's with π_{T-1} as its proximal policy; the learner
keeps π_{T-1} as published, through checkpoints."""

import copy

import pytest
import torch

from asyncrl.algo.vaco_loss import previous_anchor_log_prob
from asyncrl.core import config
from asyncrl.core.optim import make_optimizer
from asyncrl.core.state import LearnerState
from asyncrl.tasks import make_task
from asyncrl.tasks.control.envs import VecEnv
from asyncrl.tasks.control.update import learner_iteration
from tests.test_update import TINY, _batch, learner_and_batch

BASE = [*TINY, "env.id=HalfCheetah-v5"]


def test_anchor_is_the_newer_of_behaviour_and_previous():
    beta = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    prev = torch.tensor([-1.5, -2.5, -3.5, -4.5])
    lag = torch.tensor([0, 1, 2, 40])
    assert torch.equal(
        previous_anchor_log_prob(behavior_log_prob=beta, previous_log_prob=prev, lag=lag),
        torch.tensor([-1.0, -2.0, -3.5, -4.5]),
    )
    with pytest.raises(ValueError, match="lag must be an integer"):
        previous_anchor_log_prob(behavior_log_prob=beta, previous_log_prob=prev, lag=lag.float())
    with pytest.raises(ValueError, match="lag must be an integer"):
        previous_anchor_log_prob(behavior_log_prob=beta, previous_log_prob=prev, lag=lag[:3])
    with pytest.raises(ValueError):
        previous_anchor_log_prob(behavior_log_prob=beta, previous_log_prob=prev[:3], lag=lag)


def _fixture():
    _, state, batch = learner_and_batch(BASE)
    return state, batch


def _train(policy, batch, sets, *, version, previous=None):
    algo = config.load(None, [*BASE, *sets]).algo
    policy = copy.deepcopy(policy)
    opt = make_optimizer(policy.parameters(), lr=algo.lr, eps=algo.adam_eps)
    stats = learner_iteration(
        policy, opt, batch, cfg=algo, generator=torch.Generator().manual_seed(3), version=version,
        previous_policy=previous,
    )  # fmt: skip
    return [p.detach().clone() for p in policy.parameters()], stats


def test_at_lag_0_and_1_it_takes_ppo_clips_steps():
    """A batch whose samples are 0 or 1 version old: the same weights as ppo to the last bit, whatever
    π_{T-1} is (it is not read); the default (band on π_θ/π_T, weight min(1, π_T/β)) differs."""
    state, batch = _fixture()
    g = torch.Generator().manual_seed(7)
    batch["behavior_log_prob"] = batch["behavior_log_prob"] + 0.2 * torch.randn(
        batch["behavior_log_prob"].shape, generator=g
    )  # β away from π_T, as after an update
    lag = torch.randint(0, 2, batch["rewards"].shape, generator=g)
    b = dict(batch, behavior_version=10 - lag)
    unrelated = copy.deepcopy(state.policy)
    with torch.no_grad():
        for p in unrelated.parameters():
            p.add_(0.5)
    ppo, ppo_stats = _train(state.policy, b, ["algo.preset=ppo"], version=10)
    prev, prev_stats = _train(state.policy, b, ["algo.ratio_anchor=previous"], version=10, previous=unrelated)
    default, _ = _train(state.policy, b, [], version=10)
    assert all(torch.equal(x, y) for x, y in zip(ppo, prev))
    assert prev_stats["no_grad_fraction"] == ppo_stats["no_grad_fraction"]
    assert not all(torch.equal(x, y) for x, y in zip(ppo, default))


def test_at_older_lag_it_is_decoupled_ppo_centred_on_the_previous_policy():
    """Every sample 2+ versions old: with π_{T-1} = π_T the default's steps to the bit; with another
    π_{T-1}, other steps (the anchor is read); with no π_{T-1} (first iteration), π_T stands in."""
    state, batch = _fixture()
    g = torch.Generator().manual_seed(8)
    batch["behavior_log_prob"] = batch["behavior_log_prob"] + 0.3 * torch.randn(
        batch["behavior_log_prob"].shape, generator=g
    )
    lag = torch.randint(2, 30, batch["rewards"].shape, generator=g)
    b = dict(batch, behavior_version=40 - lag)
    default, _ = _train(state.policy, b, [], version=40)
    same, _ = _train(state.policy, b, ["algo.ratio_anchor=previous"], version=40, previous=copy.deepcopy(state.policy))
    none, _ = _train(state.policy, b, ["algo.ratio_anchor=previous"], version=40, previous=None)
    assert all(torch.equal(x, y) for x, y in zip(default, same))
    assert all(torch.equal(x, y) for x, y in zip(default, none))
    other = copy.deepcopy(state.policy)
    with torch.no_grad():
        other.pi[-1].bias.add_(0.3)
    moved, _ = _train(state.policy, b, ["algo.ratio_anchor=previous"], version=40, previous=other)
    assert not all(torch.equal(x, y) for x, y in zip(default, moved))


def test_the_learner_keeps_the_policy_it_published_one_version_before():
    """After iteration T the learner's π_{T-1} is its policy as published at version T-1 (its
    observation statistics included), so a lag-1 sample's β equals π_{T-1} to float rounding; the
    checkpoint carries it to a resumed learner bit for bit; no copy is kept for another anchor."""
    cfg = config.load(None, [*BASE, "algo.ratio_anchor=previous"])
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0)
    env.reset()
    spec = env.spec(cfg.env.rollout_length)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    assert state.previous.module is None
    published = []
    for _ in range(3):
        published.append(copy.deepcopy(state.policy.state_dict()))
        batch = _batch(state, env)  # acted with the current version: lag 0 at this iteration
        state.iterate(batch)
        prev = state.previous.module.state_dict()
        assert prev.keys() == published[-1].keys()
        assert all(torch.equal(prev[k], published[-1][k]) for k in prev)
    env.close()
    # a batch acted with the version before the learner's (π_{T-1} now) has β = π_{T-1} on every sample
    from asyncrl.tasks.control.update import _evaluate

    old_policy = copy.deepcopy(state.policy)
    old_policy.load_state_dict(published[-1])
    actor_batch = _batch_with(old_policy, state, cfg)
    log_prob = _evaluate(state.previous.module, actor_batch, torch.no_grad)[0]
    assert torch.allclose(log_prob, actor_batch["behavior_log_prob"], atol=2e-4)

    resumed = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    resumed.load_state_dict(copy.deepcopy(state.state_dict()))
    got, want = resumed.previous.module.state_dict(), state.previous.module.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    plain = LearnerState(config.load(None, BASE), spec, make_task(cfg, spec=spec))
    assert plain.previous is None and "previous_policy" not in plain.state_dict()


def _batch_with(policy, state, cfg):
    """A batch collected by ``policy`` (numpy actor) from fresh envs."""
    from asyncrl.tasks.control.policy import InferencePolicy
    from asyncrl.tasks.control.rollout import collect

    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=1)
    env.reset()
    actor = InferencePolicy(policy, activation="tanh", seed=0)
    arrays = state.spec.allocate()
    collect(env, actor.act, arrays, version=state.version - 1)
    env.close()
    return state.make_batch([("a0", arrays)])


def test_previous_anchor_is_control_only():
    with pytest.raises(config.ConfigError, match="ratio_anchor = previous"):
        config.load(None, ["task.kind=llm", "algo.preset=decoupled_ppo", "algo.ratio_anchor=previous"])
    cfg = config.load(None, ["algo.ratio_anchor=previous", "algo.surrogate_rho_bar=2.0"])
    assert cfg.algo.ratio_anchor == "previous" and cfg.algo.surrogate_rho_bar == 2.0


def test_the_band_and_ppo_clip_agree_at_the_float_edge():
    """A ratio exactly 1 + ε (float32): torch.clamp passes PPO-clip's gradient there, so the band keeps
    it too, and both report it kept (r - 1 > ε would call it outside: one such sample in 160
    optimizer steps of a Hopper run made the two presets' runs part)."""
    from asyncrl.algo.ppo_losses import ppo_clip_loss
    from asyncrl.algo.vaco_loss import vaco_policy_loss

    edge = torch.tensor(1.2, dtype=torch.float32)
    x = torch.log(edge)
    for _ in range(64):  # the float32 log-ratio whose exp is exactly 1.2f
        if torch.exp(x) == edge:
            break
        x = torch.nextafter(x, torch.tensor(9.0) if torch.exp(x) < edge else torch.tensor(-9.0))
    assert torch.exp(x) == edge
    beta = torch.tensor([-1.0, -2.0, -0.5])
    adv = torch.tensor([1.0, 0.5, 2.0])
    grads = []
    for loss_fn in (
        lambda lp: ppo_clip_loss(log_prob=lp, behavior_log_prob=beta, advantages=adv, clip_eps=0.2),
        lambda lp: vaco_policy_loss(
            log_prob=lp,
            behavior_log_prob=beta,
            advantages=adv,
            tv_threshold=float("inf"),
            anchor_log_prob=beta,
            surrogate_rho_bar=1.0,
            behavior_band=0.2,
        ),  # fmt: skip
    ):
        lp = (beta + torch.stack([x, torch.tensor(0.3), torch.tensor(-0.01)])).detach().requires_grad_(True)
        assert torch.exp(lp[0] - beta[0]) == edge
        pl = loss_fn(lp)
        pl.loss.backward()
        assert bool(pl.keep_mask[0]) and not bool(pl.keep_mask[1])  # at the edge: kept; past it, outward: not
        grads.append(lp.grad.clone())
    assert grads[0][0] != 0 and torch.equal(grads[0], grads[1])
