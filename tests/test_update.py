"""Every preset runs a learner iteration end to end on real rollouts and reports its metrics."""

import math

import pytest
import torch

from asyncrl.core import config
from asyncrl.core.config import PRESETS
from asyncrl.core.optim import make_optimizer
from asyncrl.core.state import LearnerState
from asyncrl.tasks import make_task
from asyncrl.tasks.control.envs import VecEnv
from asyncrl.tasks.control.policy import InferencePolicy
from asyncrl.tasks.control.rollout import collect

# a learner iteration small enough for a unit test: 2 slots of 4 envs x 16 steps, 4 minibatches, 2 epochs
TINY = [
    "env.num_envs=4",
    "env.rollout_length=16",
    "learner.slots_per_batch=2",
    "learner.num_slots=2",
    "algo.num_minibatches=4",
    "algo.num_epochs=2",
]


def _batch(state, env, slots=2):
    actor = InferencePolicy(state.policy, activation="tanh", seed=0)
    out = []
    for i in range(slots):
        arrays = state.spec.allocate()
        collect(env, actor.act, arrays, version=state.version)
        out.append((f"a{i}", arrays))
    return state.make_batch(out)


def learner_and_batch(sets: list[str]):
    """(config, a fresh LearnerState, one batch of 2 slots its policy collected) for ``sets``."""
    cfg = config.load(None, sets)
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0)
    env.reset()
    spec = env.spec(cfg.env.rollout_length)
    state = LearnerState(cfg, spec, make_task(cfg, spec=spec))
    batch = _batch(state, env)
    env.close()
    return cfg, state, batch


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("env_id", ["asyncrl/Corridor-v0", "CartPole-v1"])
def test_preset_iteration(preset, env_id):
    cfg = config.load(
        None,
        [
            f"algo.preset={preset}",
            *TINY,
            f"env.id={env_id}",
            "env.max_episode_steps=12",
        ],
    )
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0, max_episode_steps=12)
    env.reset()
    state = LearnerState(cfg, env.spec(cfg.env.rollout_length), make_task(cfg, spec=env.spec(cfg.env.rollout_length)))
    before = [p.detach().clone() for p in state.policy.parameters()]
    stats = state.iterate(_batch(state, env))
    assert state.version == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, state.policy.parameters()))
    for key in (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "tv_estimate",
        "no_grad_fraction",
        "rho_mean",
        "rho_max",
        "grad_norm",
        "lr",
    ):
        assert math.isfinite(stats[key]), (key, stats[key])
    assert ("clip_fraction_two_sided" in stats) == (preset == "ppo")  # PPO's own name, PPO only
    # fresh data from the same weights: the first minibatch is exactly on-policy
    assert abs(stats["rho_mean"] - 1.0) < 1e-4
    steps = 4 * 2 if preset != "impala" else 4  # impala: one epoch
    assert [m[0] for m in stats["minibatches"]] == list(range(steps))
    env.close()


def _reference_iteration(policy, optimizer, batch, cfg, generator):
    """The learner iteration written the plain way (a gather per minibatch, policy(obs), zero_grad,
    clip_grad_norm_, step): asyncrl.tasks.control.update must train exactly as this does, bit for bit."""
    from asyncrl.algo.value_loss import value_loss
    from asyncrl.core.iteration import normalize_advantages, policy_loss
    from asyncrl.tasks.control.update import advantages

    T, N = batch["rewards"].shape
    with torch.no_grad():
        out = policy(batch["obs"].reshape((T + 1) * N, -1))
        values = out.values.view(T + 1, N)
        target = (
            policy(batch["obs"][:-1].reshape(T * N, -1)).dist.log_prob(batch["actions"].reshape(T * N, -1)).view(T, N)
        )
        final = torch.zeros(T, N)
        idx = batch["truncated"].nonzero(as_tuple=True)
        if len(idx[0]):
            final[idx] = policy.value(batch["final_obs"][idx])
    adv, targets = advantages(
        preset=cfg.preset,
        batch=batch,
        target_log_prob=target,
        values=values,
        final_values=final,
        gamma=cfg.gamma,
        lam=cfg.gae_lambda,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        traces=cfg.traces,
    )
    flat = {
        "obs": batch["obs"][:-1].reshape(T * N, -1),
        "actions": batch["actions"].reshape(T * N, -1),
        "beta": batch["behavior_log_prob"].reshape(-1),
        "target": target.reshape(-1),
        "adv": adv.reshape(-1),
        "targets": targets.reshape(-1),
    }
    mb = T * N // cfg.num_minibatches
    losses_seen = []
    for _ in range(cfg.num_epochs):
        perm = torch.randperm(T * N, generator=generator)
        for k in range(cfg.num_minibatches):
            i = perm[k * mb : (k + 1) * mb]
            out = policy(flat["obs"][i])
            pl = policy_loss(
                cfg,
                log_prob=out.dist.log_prob(flat["actions"][i]),
                behavior_log_prob=flat["beta"][i],
                target_log_prob=flat["target"][i],
                adv=normalize_advantages(flat["adv"][i], True),
            )
            loss = (
                pl.loss
                + cfg.value_coef * value_loss(values=out.values, targets=flat["targets"][i])
                - cfg.entropy_coef * out.dist.entropy().mean()
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses_seen.append(pl.loss.item())
    return losses_seen


@pytest.mark.parametrize("preset", ["vaco", "vaco_paper", "ppo", "vaco_no_filter"])
def test_iteration_trains_exactly_as_the_plain_loop(preset):
    """The learner's shortcuts (observations normalised once, one gather per epoch, diagnostics
    converted once per iteration, no entropy term at entropy_coef 0) change no bit of training."""
    import copy

    from asyncrl.tasks.control.update import learner_iteration

    cfg = config.load(
        None,
        [
            f"algo.preset={preset}",
            *TINY,
            "env.id=HalfCheetah-v5",
        ],
    )  # the reference realigns from the first iteration
    env = VecEnv(cfg.env.id, cfg.env.num_envs, seed=0)
    env.reset()
    state = LearnerState(cfg, env.spec(cfg.env.rollout_length), make_task(cfg, spec=env.spec(cfg.env.rollout_length)))
    with torch.no_grad():  # non-trivial observation statistics, as after a few iterations
        state.policy.obs_mean.normal_(0, 0.5)
        state.policy.obs_var.uniform_(0.5, 2.0)
    batch = _batch(state, env)
    batch["behavior_log_prob"] = batch["behavior_log_prob"] + 0.3 * torch.randn_like(batch["behavior_log_prob"])  # lag
    ref_policy = copy.deepcopy(state.policy)
    ref_opt = make_optimizer(ref_policy.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps)
    gen = torch.Generator().manual_seed(3)
    stats = learner_iteration(state.policy, state.optimizer, batch, cfg=cfg.algo, generator=gen, version=1)
    seen = _reference_iteration(ref_policy, ref_opt, batch, cfg.algo, torch.Generator().manual_seed(3))
    for a, b in zip(state.policy.parameters(), ref_policy.parameters()):
        assert torch.equal(a, b)
    assert stats["policy_loss"] == pytest.approx(sum(seen) / len(seen), rel=1e-6)
    env.close()


def test_filter_split_per_minibatch_and_stacked_agree():
    from asyncrl.core.iteration import filter_split

    g = torch.Generator().manual_seed(0)
    keep = torch.rand(5, 64, generator=g) > 0.3
    stale = torch.rand(5, 64, generator=g) > 0.5
    stale[2] = False  # a minibatch without stale samples: NaN, not 0
    fired = torch.tensor([True, False, True, True, False])
    stacked = filter_split(fired, keep, stale)
    for i in range(5):
        row = filter_split(fired[i], keep[i], stale[i])
        for k, v in row.items():
            assert torch.equal(v, stacked[k][i]) or (v.isnan() and stacked[k][i].isnan()), k
        s = stale[i]
        want = (~keep[i][s]).float().mean() if s.any() else torch.tensor(float("nan"))
        assert torch.allclose(row["no_grad_fraction_stale"], want, equal_nan=True)
        assert row["no_grad_fraction_fresh"] == pytest.approx(float((~keep[i][~s]).float().mean()))
    assert math.isnan(stacked["no_grad_fraction_stale"][2])
    assert stacked["filter_fire_rate"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert set(filter_split(fired, keep, None)) == {"filter_fire_rate"}
    assert set(filter_split(None, keep, stale)) == {"no_grad_fraction_stale", "no_grad_fraction_fresh"}  # ppo


def test_optimizer_step_returns_the_norm_before_clipping_and_skips_a_nonfinite_one():
    from asyncrl.core.iteration import optimizer_step
    from asyncrl.core.optim import GuardedAdam

    w = torch.nn.Parameter(torch.zeros(4))
    opt = GuardedAdam([w], lr=0.1)
    norm = optimizer_step(opt, (w * torch.tensor([3.0, 4.0, 0.0, 0.0])).sum(), 0.5)
    assert float(norm) == pytest.approx(5.0) and opt.skipped == 0 and not torch.equal(w.detach(), torch.zeros(4))
    before = w.detach().clone()
    norm = optimizer_step(opt, (w * torch.tensor([float("inf"), 1.0, 0.0, 0.0])).sum(), 0.5)
    assert not math.isfinite(float(norm)) and (opt.skipped, opt.consecutive) == (1, 1)
    assert torch.equal(w.detach(), before)


def _lagged_inputs(T=12, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = {
        "rewards": torch.randn(T, N, generator=g),
        "terminated": torch.rand(T, N, generator=g) < 0.1,
        "truncated": torch.zeros(T, N, dtype=torch.bool),
        "behavior_log_prob": torch.randn(T, N, generator=g) * 0.3,
    }
    target = batch["behavior_log_prob"] + torch.randn(T, N, generator=g) * 0.3  # lag: pi_T != beta
    return batch, target, torch.randn(T + 1, N, generator=g), torch.zeros(T, N)


@pytest.mark.parametrize("preset", ["vaco", "vaco_no_realign", "ppo"])
def test_value_targets_choose_the_critic_target_and_leave_the_advantages(preset):
    from asyncrl.algo.returns import gae, next_state_values, realigned_returns
    from asyncrl.tasks.control.update import advantages

    batch, target, values, final = _lagged_inputs()
    kw = dict(
        preset=preset,
        batch=batch,
        target_log_prob=target,
        values=values,
        final_values=final,
        gamma=0.99,
        lam=0.95,
        rho_bar=1.0,
        c_bar=1.0,
        traces="uncorrected",
    )
    nv = next_state_values(
        values_tp1=values[1:], final_values=final, terminated=batch["terminated"], truncated=batch["truncated"]
    )
    end = batch["terminated"] | batch["truncated"]
    common = dict(
        behavior_log_prob=batch["behavior_log_prob"],
        target_log_prob=target,
        rewards=batch["rewards"],
        values=values[:-1],
        next_values=nv,
        episode_end=end,
        gamma=0.99,
        lam=0.95,
    )
    vt = realigned_returns(**common, traces="uncorrected")
    ga = gae(rewards=batch["rewards"], values=values[:-1], next_values=nv, episode_end=end, gamma=0.99, lam=0.95)
    # the critic's V-trace targets use V-trace's own traces (c_t = λ min(c̄, ρ_t)) whatever the advantages'
    vs = realigned_returns(**common, traces="vtrace").vs
    assert not torch.allclose(vs, vt.vs)  # the lag cuts V-trace's traces
    realigned = preset == "vaco"
    adv_auto, tgt_auto = advantages(**kw)
    assert torch.equal(adv_auto, vt.advantages if realigned else ga.advantages)
    assert torch.equal(tgt_auto, vs if realigned else ga.returns)
    assert not torch.allclose(vs, ga.returns)  # the lag makes the two targets differ
    for name, want in (("vtrace", vs), ("lambda_returns", ga.returns)):
        adv, tgt = advantages(value_targets=name, **kw)
        assert torch.equal(adv, adv_auto) and torch.equal(tgt, want)


def test_value_targets_are_checked():
    with pytest.raises(config.ConfigError, match="algo.value_targets"):
        config.load(None, ["algo.value_targets=retrace"])
    with pytest.raises(config.ConfigError, match="algo.value_targets must be auto for impala"):
        config.load(None, ["algo.preset=impala", "algo.value_targets=vtrace"])
    assert (
        config.load(None, ["algo.preset=vaco", "algo.value_targets=lambda_returns"]).algo.value_targets
        == "lambda_returns"
    )


def test_realign_min_lag_realigns_only_the_samples_that_old():
    """algo.realign_min_lag: samples at least that many versions behind get the realigned advantage
    and V-trace's target, the others GAE's and its λ-returns (vaco_no_realign's), element by element."""
    from asyncrl.tasks.control.update import advantages

    batch, target, values, final = _lagged_inputs()
    kw = dict(
        preset="vaco",
        batch=batch,
        target_log_prob=target,
        values=values,
        final_values=final,
        gamma=0.99,
        lam=0.95,
        rho_bar=1.0,
        c_bar=1.0,
        traces="uncorrected",
    )
    adv_v, tgt_v = advantages(**kw)
    adv_g, tgt_g = advantages(**{**kw, "preset": "vaco_no_realign"})
    lag = torch.tensor([0, 1, 3]).repeat(batch["rewards"].shape[0], 1)  # [T, N]: one lag per column
    for min_lag, want_columns in (
        (0, [True] * 3),
        (1, [False, True, True]),
        (2, [False, False, True]),
        (4, [False] * 3),
    ):
        adv, tgt = advantages(lag=lag, realign_min_lag=min_lag, **kw)
        for n, realigned in enumerate(want_columns):
            assert torch.equal(adv[:, n], (adv_v if realigned else adv_g)[:, n]), (min_lag, n)
            assert torch.equal(tgt[:, n], (tgt_v if realigned else tgt_g)[:, n]), (min_lag, n)
    # an explicit critic target stays the one named; presets that never realign ignore the setting
    adv, tgt = advantages(lag=lag, realign_min_lag=4, value_targets="vtrace", **kw)
    assert torch.equal(adv, adv_g) and torch.equal(tgt, tgt_v)
    adv, tgt = advantages(lag=lag, realign_min_lag=4, **{**kw, "preset": "ppo"})
    assert torch.equal(adv, adv_g) and torch.equal(tgt, tgt_g)
    with pytest.raises(ValueError, match="realign_min_lag > 0 needs"):
        advantages(realign_min_lag=1, **kw)


def test_realign_min_lag_is_checked():
    with pytest.raises(config.ConfigError, match="algo.realign_min_lag must be >= 0"):
        config.load(None, ["algo.realign_min_lag=-1"])
    assert config.load(None, []).algo.realign_min_lag == 0


@pytest.mark.parametrize("anchor", ["learning", "previous"])
def test_no_count_of_versions_iterations_or_steps_selects_a_method(anchor):
    """One fixed batch (its per-sample lag fixed: behaviour version = learner version - lag) through
    the learner iteration at learner versions 1, 125, 10,000 and 1,000,000 and under step budgets of
    100k and 30M env steps trains the same weights to the last bit: no rule of the iteration counts
    versions, iterations or env steps (which estimator, which constraint), with either ratio anchor
    (the previous-version anchor reads each sample's lag, never the version itself). And a sample's advantage and
    critic target do not depend on the batch around it: the same rollouts inside a batch twice as wide
    get the same ones. The default config's [algo] holds no count of versions, iterations or steps."""
    import copy
    import dataclasses

    from asyncrl.tasks.control.update import advantages, learner_iteration

    base = [*TINY, "env.id=HalfCheetah-v5", f"algo.ratio_anchor={anchor}"]
    cfg, state, batch = learner_and_batch(base)
    previous = copy.deepcopy(state.policy)  # π_{T-1} of the previous anchor: another policy than π_T
    with torch.no_grad():
        previous.pi[-1].bias.add_(0.2)
    g = torch.Generator().manual_seed(5)
    batch["behavior_log_prob"] = batch["behavior_log_prob"] + 0.3 * torch.randn(
        batch["behavior_log_prob"].shape, generator=g
    )
    lag = torch.randint(0, 9, batch["behavior_log_prob"].shape, generator=g)
    trained = []
    for version, budget in ((1, 100_000), (125, 100_000), (10_000, 30_000_000), (1_000_000, 30_000_000)):
        algo = config.load(None, [*base, f"run.total_env_steps={budget}"]).algo
        policy, opt = copy.deepcopy(state.policy), None
        opt = make_optimizer(policy.parameters(), lr=algo.lr, eps=algo.adam_eps)
        b = dict(batch, behavior_version=version - lag)
        learner_iteration(
            policy,
            opt,
            b,
            cfg=algo,
            generator=torch.Generator().manual_seed(3),
            version=version,
            previous_policy=previous if anchor == "previous" else None,
        )
        trained.append([p.detach().clone() for p in policy.parameters()])
    for other in trained[1:]:
        assert all(torch.equal(a, b) for a, b in zip(trained[0], other))

    batch2, target, values, final = _lagged_inputs(T=12, N=3, seed=1)
    wide = {k: torch.cat([v, v.flip(1)], dim=1) for k, v in batch2.items()}
    kw = dict(preset="vaco", gamma=0.99, lam=0.95, rho_bar=1.0, c_bar=1.0, traces=cfg.algo.traces)
    adv, tgt = advantages(batch=batch2, target_log_prob=target, values=values, final_values=final, **kw)
    adv_w, tgt_w = advantages(
        batch=wide,
        target_log_prob=torch.cat([target, target.flip(1)], 1),
        values=torch.cat([values, values.flip(1)], 1),
        final_values=torch.cat([final, final.flip(1)], 1),
        **kw,
    )
    assert torch.equal(adv_w[:, :3], adv) and torch.equal(tgt_w[:, :3], tgt)
    counts = [
        f.name
        for f in dataclasses.fields(config.AlgoConfig)
        if f.type in (int, "int") and any(w in f.name for w in ("version", "iteration", "step"))
    ]
    assert counts == []
