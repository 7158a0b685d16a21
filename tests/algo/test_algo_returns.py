"""Tests of asyncrl.algo.returns: V-trace (arXiv:1802.01561) with VACO's realigned advantages
(arXiv:2603.01365) and GAE (arXiv:1506.02438), against naive references written from the
definitions in plain Python floats."""

import math

import pytest
import torch

from asyncrl.algo.returns import GAEReturns, RealignedReturns, gae, next_state_values, realigned_returns

F64 = torch.float64


# ---------------------------------------------------------------- random rollouts and references


def random_rollout(seed, T=13, B=5, *, p_term=0.12, p_trunc=0.12, log_rho_scale=0.7, dtype=F64):
    """Random [T, B] rollout with random terminations and truncations (some steps both)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    v_all = rand(T + 1, B)  # V(obs[0..T])
    terminated = torch.rand(T, B, generator=g) < p_term
    truncated = torch.rand(T, B, generator=g) < p_trunc
    behavior = -torch.rand(T, B, generator=g, dtype=dtype) * 2.0
    target = behavior + log_rho_scale * rand(T, B)
    return dict(
        values_all=v_all,
        final_values=rand(T, B),
        rewards=rand(T, B),
        terminated=terminated,
        truncated=truncated,
        behavior_log_prob=behavior,
        target_log_prob=target,
    )


def next_values_of(ro):
    return next_state_values(
        values_tp1=ro["values_all"][1:],
        final_values=ro["final_values"],
        terminated=ro["terminated"],
        truncated=ro["truncated"],
    )


def run_vtrace(ro, *, gamma, lam, rho_bar=1.0, c_bar=1.0, traces="vtrace"):
    return realigned_returns(
        behavior_log_prob=ro["behavior_log_prob"],
        target_log_prob=ro["target_log_prob"],
        rewards=ro["rewards"],
        values=ro["values_all"][:-1],
        next_values=next_values_of(ro),
        episode_end=ro["terminated"] | ro["truncated"],
        gamma=gamma,
        lam=lam,
        rho_bar=rho_bar,
        c_bar=c_bar,
        traces=traces,
    )


def run_gae(ro, *, gamma, lam):
    return gae(
        rewards=ro["rewards"],
        values=ro["values_all"][:-1],
        next_values=next_values_of(ro),
        episode_end=ro["terminated"] | ro["truncated"],
        gamma=gamma,
        lam=lam,
    )


def naive_column(ro, b):
    """Plain-float lists of one env column, with V'_t decided from the flags by hand."""
    T = ro["rewards"].shape[0]
    v = [float(x) for x in ro["values_all"][:, b]]
    r = [float(x) for x in ro["rewards"][:, b]]
    term = [bool(x) for x in ro["terminated"][:, b]]
    trunc = [bool(x) for x in ro["truncated"][:, b]]
    fin = [float(x) for x in ro["final_values"][:, b]]
    next_v = [0.0 if term[t] else fin[t] if trunc[t] else v[t + 1] for t in range(T)]
    end = [term[t] or trunc[t] for t in range(T)]
    log_rho = [float(x) - float(y) for x, y in zip(ro["target_log_prob"][:, b], ro["behavior_log_prob"][:, b])]
    return v, r, next_v, end, log_rho


def episode_horizon(end, s):
    """Last step index of the episode that contains step s (or T-1)."""
    t = s
    while t < len(end) - 1 and not end[t]:
        t += 1
    return t


def naive_vtrace(ro, *, gamma, lam, rho_bar=1.0, c_bar=1.0, traces="vtrace"):
    """vs_s = V(s_s) + sum_{t=s}^{h(s)} γ^{t-s} (prod_{i=s}^{t-1} c_i) rho_t delta_t (double loop);
    A_s = delta_s + γλ(1-end_s)(vs_{s+1} - V(s_{s+1}));
    pg_A_s = r_s + γ (vs_{s+1} if the episode goes on inside the rollout else V'_s) - V(s_s)."""
    T, B = ro["rewards"].shape
    vs = [[0.0] * B for _ in range(T)]
    adv = [[0.0] * B for _ in range(T)]
    pg = [[0.0] * B for _ in range(T)]
    for b in range(B):
        v, r, next_v, end, log_rho = naive_column(ro, b)
        rho = [min(rho_bar, math.exp(x)) for x in log_rho]
        c = [lam * min(c_bar, math.exp(x)) if traces == "vtrace" else lam for x in log_rho]
        delta = [r[t] + gamma * next_v[t] - v[t] for t in range(T)]
        for s in range(T):
            total = 0.0
            for t in range(s, episode_horizon(end, s) + 1):
                prod_c = 1.0
                for i in range(s, t):
                    prod_c *= c[i]
                total += gamma ** (t - s) * prod_c * rho[t] * delta[t]
            vs[s][b] = v[s] + total
        for s in range(T):
            goes_on = s < T - 1 and not end[s]
            adv[s][b] = delta[s] + (gamma * lam * (vs[s + 1][b] - v[s + 1]) if goes_on else 0.0)
            pg[s][b] = r[s] + gamma * (vs[s + 1][b] if goes_on else next_v[s]) - v[s]
    return vs, adv, pg


def naive_realigned_advantages(ro, *, gamma, lam, rho_bar=1.0, c_bar=1.0, traces="vtrace"):
    """A_s expanded to a sum: delta_s + γλ sum_{t=s+1}^{h(s)} γ^{t-s-1} (prod_{i=s+1}^{t-1} c_i)
    rho_t delta_t (no rho factor on the first term), zero tail if s ends its episode."""
    T, B = ro["rewards"].shape
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        v, r, next_v, end, log_rho = naive_column(ro, b)
        rho = [min(rho_bar, math.exp(x)) for x in log_rho]
        c = [lam * min(c_bar, math.exp(x)) if traces == "vtrace" else lam for x in log_rho]
        delta = [r[t] + gamma * next_v[t] - v[t] for t in range(T)]
        for s in range(T):
            tail = 0.0
            if not end[s]:
                for t in range(s + 1, episode_horizon(end, s) + 1):
                    prod_c = 1.0
                    for i in range(s + 1, t):
                        prod_c *= c[i]
                    tail += gamma ** (t - s - 1) * prod_c * rho[t] * delta[t]
            out[s][b] = delta[s] + gamma * lam * tail
    return out


def naive_gae(ro, *, gamma, lam):
    """A_s = sum_{t=s}^{h(s)} (γλ)^{t-s} delta_t."""
    T, B = ro["rewards"].shape
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        v, r, next_v, end, _ = naive_column(ro, b)
        for s in range(T):
            out[s][b] = sum(
                (gamma * lam) ** (t - s) * (r[t] + gamma * next_v[t] - v[t])
                for t in range(s, episode_horizon(end, s) + 1)
            )
    return out


def t64(rows):
    return torch.tensor(rows, dtype=F64)


# ---------------------------------------------------------------- naive references


@pytest.mark.parametrize(
    "seed,gamma,lam,rho_bar,c_bar",
    [
        (0, 0.99, 0.95, 1.0, 1.0),
        (1, 0.9, 1.0, 1.0, 1.0),
        (2, 0.97, 0.8, 2.0, 0.5),
        (3, 1.0, 0.9, float("inf"), float("inf")),
    ],
)
def test_vtrace_matches_naive_reference(seed, gamma, lam, rho_bar, c_bar):
    ro = random_rollout(seed)
    assert ro["terminated"].any() and ro["truncated"].any()
    out = run_vtrace(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    assert isinstance(out, RealignedReturns)
    vs, adv, pg = naive_vtrace(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    torch.testing.assert_close(out.vs, t64(vs), rtol=0, atol=1e-10)
    torch.testing.assert_close(out.advantages, t64(adv), rtol=0, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, t64(pg), rtol=0, atol=1e-10)
    rhos = torch.clamp(torch.exp(ro["target_log_prob"] - ro["behavior_log_prob"]), max=rho_bar)
    torch.testing.assert_close(out.clipped_rhos, rhos, rtol=0, atol=0)
    expanded = naive_realigned_advantages(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    torch.testing.assert_close(out.advantages, t64(expanded), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "seed,gamma,lam,rho_bar,c_bar",
    [
        (4, 0.99, 0.95, 1.0, 1.0),
        (5, 0.97, 0.8, 2.0, 0.5),  # c_bar has no effect on uncorrected traces
    ],
)
def test_uncorrected_traces_match_naive_reference(seed, gamma, lam, rho_bar, c_bar):
    ro = random_rollout(seed)
    out = run_vtrace(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar, traces="uncorrected")
    vs, adv, pg = naive_vtrace(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar, traces="uncorrected")
    torch.testing.assert_close(out.vs, t64(vs), rtol=0, atol=1e-10)
    torch.testing.assert_close(out.advantages, t64(adv), rtol=0, atol=1e-10)
    expanded = naive_realigned_advantages(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, traces="uncorrected")
    torch.testing.assert_close(out.advantages, t64(expanded), rtol=0, atol=1e-10)
    # the traces differ from V-trace's wherever some rho_t < 1 inside an episode
    assert not torch.allclose(
        out.advantages, run_vtrace(ro, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar).advantages
    )


def test_uncorrected_traces_hand_computed():
    """T = 3, one env, no episode end, V = 0 everywhere (so delta_t = r_t), gamma 0.5, lam 0.5:
    rho = (1, 0.5, 1) -> vs - V = (1 + 0.25*0.5*2 + 0.0625*3, 0.5*2 + 0.25*3, 3) with c = lam."""
    z = torch.zeros(3, 1, dtype=torch.float64)
    out = realigned_returns(
        behavior_log_prob=z,
        target_log_prob=torch.log(t64([[1.0], [0.5], [1.0]])),
        rewards=t64([[1.0], [2.0], [3.0]]),
        values=z,
        next_values=z,
        episode_end=torch.zeros(3, 1, dtype=torch.bool),
        gamma=0.5,
        lam=0.5,
        traces="uncorrected",
    )
    torch.testing.assert_close(out.vs, t64([[1.4375], [1.75], [3.0]]), rtol=0, atol=1e-12)
    # advantages_t = delta_t + gamma lam (vs_{t+1} - V_{t+1}): (1 + 0.25*1.75, 2 + 0.25*3, 3)
    torch.testing.assert_close(out.advantages, t64([[1.4375], [2.75], [3.0]]), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="traces"):
        realigned_returns(
            behavior_log_prob=z,
            target_log_prob=z,
            rewards=z,
            values=z,
            next_values=z,
            episode_end=torch.zeros(3, 1, dtype=torch.bool),
            gamma=0.5,
            lam=0.5,
            traces="retrace",
        )


@pytest.mark.parametrize("seed,gamma,lam", [(10, 0.99, 0.95), (11, 0.9, 0.0), (12, 1.0, 1.0)])
def test_gae_matches_naive_reference(seed, gamma, lam):
    ro = random_rollout(seed)
    out = run_gae(ro, gamma=gamma, lam=lam)
    assert isinstance(out, GAEReturns)
    torch.testing.assert_close(out.advantages, t64(naive_gae(ro, gamma=gamma, lam=lam)), rtol=0, atol=1e-10)
    torch.testing.assert_close(out.returns, out.advantages + ro["values_all"][:-1], rtol=0, atol=0)


# ---------------------------------------------------------------- on-policy identity


@pytest.mark.parametrize("seed,gamma,lam", [(20, 0.99, 0.95), (21, 0.9, 0.5), (22, 1.0, 1.0)])
def test_on_policy_vtrace_is_lambda_return_and_gae(seed, gamma, lam):
    ro = random_rollout(seed)
    ro["target_log_prob"] = ro["behavior_log_prob"].clone()  # β = π_T
    out = run_vtrace(ro, gamma=gamma, lam=lam, rho_bar=1.0, c_bar=1.0)
    ref = run_gae(ro, gamma=gamma, lam=lam)
    torch.testing.assert_close(out.vs, ref.returns, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.advantages, ref.advantages, rtol=0, atol=1e-12)
    assert torch.all(out.clipped_rhos == 1.0)
    # λ-returns from their own recursion: G_t = r_t + γ[(1-λ) V'_t + λ G_{t+1}], cut at ends
    v, r, next_v, end, _ = naive_column(ro, 0)
    T = len(r)
    G = [0.0] * T
    for t in reversed(range(T)):
        goes_on = t < T - 1 and not end[t]
        G[t] = r[t] + gamma * (((1 - lam) * next_v[t] + lam * G[t + 1]) if goes_on else next_v[t])
    torch.testing.assert_close(out.vs[:, 0], torch.tensor(G, dtype=F64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- episode boundaries


def column(values_all, rewards, terminated, truncated, final_values, log_rho):
    T = len(rewards)
    behavior = torch.full((T, 1), -1.0, dtype=F64)
    return dict(
        values_all=t64([[x] for x in values_all]),
        rewards=t64([[x] for x in rewards]),
        terminated=torch.tensor([[x] for x in terminated]),
        truncated=torch.tensor([[x] for x in truncated]),
        final_values=t64([[x] for x in final_values]),
        behavior_log_prob=behavior,
        target_log_prob=behavior + t64([[x] for x in log_rho]),
    )


def sub_rollout(ro, start, stop):
    """Rows [start, stop) of a rollout as a rollout of its own (values_all gets one extra row)."""
    return {k: (v[start : stop + 1] if k == "values_all" else v[start:stop]) for k, v in ro.items()}


@pytest.mark.parametrize("end_kind", ["terminated", "truncated", "both"])
def test_split_episode_equals_separate_episodes(end_kind):
    ro = random_rollout(30, T=12, B=4, p_term=0.0, p_trunc=0.0)
    k = 5  # episode A = steps 0..4
    ro["terminated"][k - 1] = end_kind in ("terminated", "both")
    ro["truncated"][k - 1] = end_kind in ("truncated", "both")
    full = run_vtrace(ro, gamma=0.97, lam=0.9, rho_bar=1.5, c_bar=1.2)
    first = run_vtrace(sub_rollout(ro, 0, k), gamma=0.97, lam=0.9, rho_bar=1.5, c_bar=1.2)
    second = run_vtrace(sub_rollout(ro, k, 12), gamma=0.97, lam=0.9, rho_bar=1.5, c_bar=1.2)
    for name in RealignedReturns._fields:
        joined = torch.cat([getattr(first, name), getattr(second, name)])
        torch.testing.assert_close(getattr(full, name), joined, rtol=0, atol=1e-12)
    g_full = run_gae(ro, gamma=0.97, lam=0.9)
    g_joined = [
        torch.cat([a, b])
        for a, b in zip(
            run_gae(sub_rollout(ro, 0, k), gamma=0.97, lam=0.9), run_gae(sub_rollout(ro, k, 12), gamma=0.97, lam=0.9)
        )
    ]
    torch.testing.assert_close(g_full.advantages, g_joined[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(g_full.returns, g_joined[1], rtol=0, atol=1e-12)

    # Episode A never reads the next episode's first value V(obs[k]).
    ro["values_all"][k] += 1000.0
    moved = run_vtrace(ro, gamma=0.97, lam=0.9, rho_bar=1.5, c_bar=1.2)
    for name in RealignedReturns._fields:
        torch.testing.assert_close(getattr(moved, name)[:k], getattr(full, name)[:k], rtol=0, atol=0)
    assert not torch.equal(moved.vs[k], full.vs[k])


def test_termination_zeroes_the_bootstrap():
    # step 1 terminates; the value after it is 0 no matter what V(obs[2]) or final_values say.
    ro = column(
        values_all=[0.5, 2.0, 7.0, 3.0],
        rewards=[1.0, 4.0, -1.0],
        terminated=[False, True, False],
        truncated=[False, False, False],
        final_values=[9.0, 9.0, 9.0],
        log_rho=[0.0, 0.0, 0.0],
    )
    nv = next_values_of(ro)
    assert nv[1, 0] == 0.0
    out = run_vtrace(ro, gamma=0.9, lam=0.8)
    assert out.vs[1, 0] == pytest.approx(4.0, abs=1e-14)  # r_1 + γ·0
    assert out.advantages[1, 0] == pytest.approx(4.0 - 2.0, abs=1e-14)
    # step 0 continues into step 1: vs_0 = V0 + δ0 + γλ(vs_1 - V1)
    assert out.vs[0, 0] == pytest.approx(0.5 + (1.0 + 0.9 * 2.0 - 0.5) + 0.9 * 0.8 * (4.0 - 2.0), abs=1e-14)
    # terminated wins over truncated when both are set
    both = next_state_values(
        values_tp1=t64([[1.0]]),
        final_values=t64([[5.0]]),
        terminated=torch.tensor([[True]]),
        truncated=torch.tensor([[True]]),
    )
    assert both[0, 0] == 0.0


def test_truncation_bootstraps_from_final_obs_not_next_episode():
    ro = column(
        values_all=[0.5, 2.0, 7.0, 3.0],
        rewards=[1.0, 4.0, -1.0],
        terminated=[False, False, False],
        truncated=[False, True, False],
        final_values=[float("nan"), 6.0, float("nan")],
        log_rho=[0.0, 0.0, 0.0],
    )
    nv = next_values_of(ro)
    torch.testing.assert_close(nv[:, 0], t64([2.0, 6.0, 3.0]), rtol=0, atol=0)  # NaN never read
    out = run_vtrace(ro, gamma=0.9, lam=0.8)
    assert out.vs[1, 0] == pytest.approx(4.0 + 0.9 * 6.0, abs=1e-14)  # V(final_obs), not V(obs[2])=7
    assert out.pg_advantages[1, 0] == pytest.approx(4.0 + 0.9 * 6.0 - 2.0, abs=1e-14)
    # rollout end (t = T-1) bootstraps from V(obs[T])
    assert out.vs[2, 0] == pytest.approx(-1.0 + 0.9 * 3.0, abs=1e-14)
    assert out.advantages[2, 0] == pytest.approx(-1.0 + 0.9 * 3.0 - 7.0, abs=1e-14)


# ---------------------------------------------------------------- closed-form limits


def test_gamma_zero_limit():
    ro = random_rollout(40)
    out = run_vtrace(ro, gamma=0.0, lam=0.95, rho_bar=1.3)
    V, r = ro["values_all"][:-1], ro["rewards"]
    rho = torch.clamp(torch.exp(ro["target_log_prob"] - ro["behavior_log_prob"]), max=1.3)
    torch.testing.assert_close(out.vs, V + rho * (r - V), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.advantages, r - V, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.pg_advantages, r - V, rtol=0, atol=1e-12)
    torch.testing.assert_close(run_gae(ro, gamma=0.0, lam=0.95).advantages, r - V, rtol=0, atol=1e-12)


def test_lambda_zero_limit():
    ro = random_rollout(41)
    out = run_vtrace(ro, gamma=0.95, lam=0.0, rho_bar=1.3)
    V, r = ro["values_all"][:-1], ro["rewards"]
    delta = r + 0.95 * next_values_of(ro) - V
    rho = torch.clamp(torch.exp(ro["target_log_prob"] - ro["behavior_log_prob"]), max=1.3)
    torch.testing.assert_close(out.advantages, delta, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.vs, V + rho * delta, rtol=0, atol=1e-12)  # c = 0: one-step
    torch.testing.assert_close(run_gae(ro, gamma=0.95, lam=0.0).advantages, delta, rtol=0, atol=1e-12)


def test_gamma_one_lambda_one_on_policy_is_monte_carlo():
    ro = random_rollout(42, T=6, B=1, p_term=0.0, p_trunc=0.0)
    ro["target_log_prob"] = ro["behavior_log_prob"].clone()
    out = run_vtrace(ro, gamma=1.0, lam=1.0)
    r, v = ro["rewards"][:, 0], ro["values_all"][:, 0]
    mc = torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0]) + v[-1]
    torch.testing.assert_close(out.vs[:, 0], mc, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- dtypes, autograd, validation


def test_float32_matches_float64():
    ro64 = random_rollout(50)
    ro32 = {k: (v.float() if v.is_floating_point() else v) for k, v in ro64.items()}
    a, b = run_vtrace(ro64, gamma=0.99, lam=0.95), run_vtrace(ro32, gamma=0.99, lam=0.95)
    for name in RealignedReturns._fields:
        assert getattr(b, name).dtype == torch.float32
        torch.testing.assert_close(getattr(b, name).double(), getattr(a, name), rtol=1e-5, atol=1e-5)
    g = run_gae(ro32, gamma=0.99, lam=0.95)
    assert g.advantages.dtype == torch.float32


def test_works_on_detached_and_on_grad_inputs():
    ro = random_rollout(51)
    ro["values_all"].requires_grad_(True)
    with_grad = run_vtrace(ro, gamma=0.99, lam=0.95)
    assert with_grad.vs.requires_grad  # nothing detached silently inside
    with_grad.vs.sum().backward()
    assert ro["values_all"].grad is not None
    detached = run_vtrace({k: v.detach() for k, v in ro.items()}, gamma=0.99, lam=0.95)
    assert not detached.vs.requires_grad
    torch.testing.assert_close(detached.vs, with_grad.vs.detach(), rtol=0, atol=0)


def _kwargs(ro):
    return dict(
        behavior_log_prob=ro["behavior_log_prob"],
        target_log_prob=ro["target_log_prob"],
        rewards=ro["rewards"],
        values=ro["values_all"][:-1],
        next_values=next_values_of(ro),
        episode_end=ro["terminated"] | ro["truncated"],
        gamma=0.99,
        lam=0.95,
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(rewards=torch.zeros(13, 4, dtype=F64)), "rewards"),
        (dict(values=torch.zeros(13, dtype=F64)), "values"),
        (dict(episode_end=torch.zeros(13, 5)), "episode_end"),
        (dict(rewards=torch.zeros(13, 5, dtype=torch.float32)), "rewards"),
        (dict(gamma=1.5), "gamma"),
        (dict(lam=-0.1), "lam"),
        (dict(lam=float("nan")), "lam"),
        (dict(rho_bar=0.0), "rho_bar"),
        (dict(c_bar=-1.0), "c_bar"),
        (dict(gamma="0.9x"), "gamma"),
    ],
)
def test_vtrace_rejects_bad_input(change, match):
    kw = _kwargs(random_rollout(60))
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        realigned_returns(**kw)


def test_gae_and_next_state_values_reject_bad_input():
    ro = random_rollout(61)
    kw = _kwargs(ro)
    with pytest.raises(ValueError, match="next_values"):
        gae(
            rewards=kw["rewards"],
            values=kw["values"],
            next_values=kw["next_values"][:-1],
            episode_end=kw["episode_end"],
            gamma=0.9,
            lam=0.9,
        )
    with pytest.raises(ValueError, match="lam"):
        gae(
            rewards=kw["rewards"],
            values=kw["values"],
            next_values=kw["next_values"],
            episode_end=kw["episode_end"],
            gamma=0.9,
            lam=2,
        )
    with pytest.raises(ValueError, match="truncated"):
        next_state_values(
            values_tp1=ro["values_all"][1:],
            final_values=ro["final_values"],
            terminated=ro["terminated"],
            truncated=ro["truncated"].double(),
        )
    with pytest.raises(ValueError, match="final_values"):
        next_state_values(
            values_tp1=ro["values_all"][1:],
            final_values=ro["final_values"][:, :2],
            terminated=ro["terminated"],
            truncated=ro["truncated"],
        )
    with pytest.raises(ValueError, match="rewards"):
        gae(
            rewards=kw["rewards"][:0],
            values=kw["values"][:0],
            next_values=kw["next_values"][:0],
            episode_end=kw["episode_end"][:0],
            gamma=0.9,
            lam=0.9,
        )
