"""Tests of asyncrl.algo's losses (policy_loss, vaco_loss, ppo_losses, value_loss): VACO's TV filter
(arXiv:2603.01365), PPO (arXiv:1707.06347), SPO (arXiv:2401.16025) and IMPALA (arXiv:1802.01561) policy
losses. Expected values and gradients of the hand-made minibatches are spelled out per sample in plain Python."""

import math

import pytest
import torch

from asyncrl.algo.policy_loss import PolicyLoss
from asyncrl.algo.ppo_losses import impala_policy_loss, ppo_clip_loss, ppo_kl_loss, spo_loss
from asyncrl.algo.vaco_loss import TVFilter, tv_estimate, tv_filter, vaco_policy_loss
from asyncrl.algo.value_loss import explained_variance, value_loss

F64 = torch.float64

# ---------------------------------------------------------------- the hand-made minibatch
# Four samples, one per sign case of A (r - 1):
#   0: r = 1.5, A = +1.0  -> A(r-1) = +0.5   (pushes TV up)
#   1: r = 0.5, A = -2.0  -> A(r-1) = +1.0   (pushes TV up)
#   2: r = 1.1, A = -0.5  -> A(r-1) = -0.05  (pulls TV down)
#   3: r = 0.7, A = +0.8  -> A(r-1) = -0.24  (pulls TV down)
R = [1.5, 0.5, 1.1, 0.7]
A = [1.0, -2.0, -0.5, 0.8]
BEH = [-1.0, -0.5, -2.0, -1.5]
LP = [BEH[i] + math.log(R[i]) for i in range(4)]  # log π_θ = log β + log r
PG = [0.3, -1.2, 0.7, -0.4]  # IMPALA pg_advantages
# tv = 0.5 * (0.5 + 0.5 + 0.1 + 0.3) / 4
TV = 0.5 * (abs(R[0] - 1) + abs(R[1] - 1) + abs(R[2] - 1) + abs(R[3] - 1)) / 4
KL = (
    (R[0] - 1 - math.log(R[0]))
    + (R[1] - 1 - math.log(R[1]))
    + (R[2] - 1 - math.log(R[2]))
    + (R[3] - 1 - math.log(R[3]))
) / 4
TIGHT = dict(rtol=1e-12, atol=1e-13)


def minibatch():
    log_prob = torch.tensor(LP, dtype=F64, requires_grad=True)
    return log_prob, torch.tensor(BEH, dtype=F64), torch.tensor(A, dtype=F64)


def check(out, log_prob, loss, grad, *, tv=TV, no_grad=0.0, clip=None):
    assert isinstance(out, PolicyLoss)
    assert out.loss.shape == ()
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss, **_approx())
    torch.testing.assert_close(log_prob.grad, torch.tensor(grad, dtype=F64), **TIGHT)
    # every gradient removed by the loss's rule is counted, and nothing else (no A_i = 0 here)
    assert out.no_grad_fraction.item() == pytest.approx(sum(g == 0.0 for g in grad) / len(grad))
    if clip is None:
        assert out.clip_fraction_two_sided is None
    wanted = [("tv_estimate", tv), ("no_grad_fraction", no_grad), ("approx_kl", KL)]
    for name, want in wanted + ([("clip_fraction_two_sided", clip)] if clip is not None else []):
        value = getattr(out, name)
        assert value.shape == () and not value.requires_grad, name
        assert value.item() == pytest.approx(want, **_approx()), name


def _approx():
    return dict(rel=1e-12, abs=1e-13)


def test_hand_minibatch_sanity():
    assert TV == pytest.approx(0.175)
    assert [A[i] * (R[i] - 1) > 0 for i in range(4)] == [True, True, False, False]


def test_vaco_filter_active():
    log_prob, beh, adv = minibatch()
    out = vaco_policy_loss(
        log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=0.1
    )  # 0.175 > 0.1: filter acts
    # value: every sample counts; gradient: samples 0 and 1 are detached.
    loss = -(R[0] * A[0] + R[1] * A[1] + R[2] * A[2] + R[3] * A[3]) / 4  # = -0.1275
    grad = [0.0, 0.0, -R[2] * A[2] / 4, -R[3] * A[3] / 4]  # d r/d log π = r
    check(out, log_prob, loss, grad, no_grad=0.5)


def test_vaco_filter_inactive():
    log_prob, beh, adv = minibatch()
    out = vaco_policy_loss(
        log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=0.2
    )  # 0.175 <= 0.2: all kept
    loss = -(R[0] * A[0] + R[1] * A[1] + R[2] * A[2] + R[3] * A[3]) / 4
    grad = [-R[0] * A[0] / 4, -R[1] * A[1] / 4, -R[2] * A[2] / 4, -R[3] * A[3] / 4]
    check(out, log_prob, loss, grad, no_grad=0.0)


def test_ppo_clip_loss():
    log_prob, beh, adv = minibatch()
    out = ppo_clip_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, clip_eps=0.2)
    # 0: min(1.5*1, 1.2*1) = 1.2            clipped branch, no gradient
    # 1: min(0.5*-2, 0.8*-2) = -1.6         clipped branch, no gradient
    # 2: r = 1.1 inside [0.8, 1.2]: -0.55   gradient r A
    # 3: min(0.7*0.8, 0.8*0.8) = 0.56       unclipped branch although r is outside the band
    loss = -(1.2 * A[0] + 0.8 * A[1] + R[2] * A[2] + R[3] * A[3]) / 4  # = 0.0975
    grad = [0.0, 0.0, -R[2] * A[2] / 4, -R[3] * A[3] / 4]
    assert loss == pytest.approx(0.0975)
    # no gradient for 0 and 1 (clipped branch); |r-1| > 0.2 in either direction for 0, 1, 3
    check(out, log_prob, loss, grad, no_grad=2 / 4, clip=3 / 4)


def test_ppo_kl_loss():
    log_prob, beh, adv = minibatch()
    out = ppo_kl_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, kl_coef=0.5)
    # k3 term per sample: (r - 1) - log r, derivative w.r.t. log π: r - 1
    loss = -(R[0] * A[0] + R[1] * A[1] + R[2] * A[2] + R[3] * A[3]) / 4 + 0.5 * KL
    grad = [(-R[i] * A[i] + 0.5 * (R[i] - 1)) / 4 for i in range(4)]
    check(out, log_prob, loss, grad)


def test_spo_loss():
    log_prob, beh, adv = minibatch()
    eps = 0.2
    out = spo_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, spo_eps=eps)
    # per sample: r A - |A| (r-1)^2 / (2 eps); derivative w.r.t. log π: r A - |A| (r-1) r / eps
    s = [
        R[0] * 1.0 - 1.0 * 0.25 / 0.4,  # 1.5 - 0.625 = 0.875
        R[1] * -2.0 - 2.0 * 0.25 / 0.4,  # -1.0 - 1.25 = -2.25
        R[2] * -0.5 - 0.5 * 0.01 / 0.4,  # -0.55 - 0.0125 = -0.5625
        R[3] * 0.8 - 0.8 * 0.09 / 0.4,
    ]  # 0.56 - 0.18 = 0.38
    loss = -(s[0] + s[1] + s[2] + s[3]) / 4  # = 0.389375
    assert loss == pytest.approx(0.389375)
    grad = [-(R[i] * A[i] - abs(A[i]) * (R[i] - 1) * R[i] / eps) / 4 for i in range(4)]
    check(out, log_prob, loss, grad)


@pytest.mark.parametrize("rho_bar,rho", [(1.0, [1.0, 0.5, 1.0, 0.7]), (1.2, [1.2, 0.5, 1.1, 0.7])])
def test_impala_loss(rho_bar, rho):
    log_prob, beh, _ = minibatch()
    pg = torch.tensor(PG, dtype=F64)
    out = impala_policy_loss(log_prob=log_prob, behavior_log_prob=beh, pg_advantages=pg, rho_bar=rho_bar)
    loss = -(rho[0] * PG[0] * LP[0] + rho[1] * PG[1] * LP[1] + rho[2] * PG[2] * LP[2] + rho[3] * PG[3] * LP[3]) / 4
    grad = [-rho[i] * PG[i] / 4 for i in range(4)]  # ρ and pg_A are constants
    check(out, log_prob, loss, grad)


# ---------------------------------------------------------------- the TV filter


def test_on_policy_nothing_filtered_and_tv_zero():
    g = torch.Generator().manual_seed(0)
    beh = torch.randn(50, generator=g, dtype=F64)
    adv = torch.randn(50, generator=g, dtype=F64)
    assert tv_estimate(beh - beh).item() == 0.0
    filt = tv_filter(log_ratio=beh - beh, advantages=adv, tv_threshold=0.0)
    assert isinstance(filt, TVFilter)
    assert filt.keep_mask.dtype == torch.bool and filt.keep_mask.all()
    assert filt.tv_estimate.item() == 0.0 and filt.filtered_fraction.item() == 0.0
    for loss_fn, kw in [
        (vaco_policy_loss, dict(tv_threshold=0.0)),
        (ppo_clip_loss, dict(clip_eps=0.2)),
        (ppo_kl_loss, dict(kl_coef=1.0)),
        (spo_loss, dict(spo_eps=0.2)),
    ]:
        out = loss_fn(log_prob=beh.clone(), behavior_log_prob=beh, advantages=adv, **kw)
        assert out.tv_estimate.item() == 0.0 and out.no_grad_fraction.item() == 0.0
        assert out.clip_fraction_two_sided in (None, 0.0) and out.approx_kl.item() == 0.0
        assert out.loss.item() == pytest.approx(-adv.mean().item(), rel=1e-12)


def test_mask_sign_rule_hand_cases():
    r = [2.0, 0.5, 2.0, 0.5, 1.0, 3.0]
    adv = [1.0, -1.0, -1.0, 1.0, 5.0, 0.0]
    # A(r-1):  +1   +0.5   -1   -0.5   0     0   -> keep iff <= 0
    want = [False, False, True, True, True, True]
    log_ratio = torch.tensor([math.log(x) for x in r], dtype=F64)
    tv = 0.5 * (1.0 + 0.5 + 1.0 + 0.5 + 0.0 + 2.0) / 6
    filt = tv_filter(log_ratio=log_ratio, advantages=torch.tensor(adv, dtype=F64), tv_threshold=0.4)
    assert filt.tv_estimate.item() == pytest.approx(tv, rel=1e-12)
    assert filt.keep_mask.tolist() == want
    assert filt.filtered_fraction.item() == pytest.approx(2 / 6, rel=1e-12)
    relaxed = tv_filter(log_ratio=log_ratio, advantages=torch.tensor(adv, dtype=F64), tv_threshold=0.5)
    assert relaxed.keep_mask.all() and relaxed.filtered_fraction.item() == 0.0


def test_threshold_boundary_is_inclusive():
    g = torch.Generator().manual_seed(1)
    log_ratio, adv = torch.randn(20, generator=g, dtype=F64), torch.randn(20, generator=g, dtype=F64)
    tv = tv_estimate(log_ratio).item()
    assert tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=tv).keep_mask.all()
    below = tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=math.nextafter(tv, 0.0))
    assert not below.keep_mask.all()
    assert tv_filter(log_ratio=log_ratio, advantages=adv, tv_threshold=float("inf")).keep_mask.all()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_filtered_samples_get_exactly_zero_gradient(dtype):
    g = torch.Generator().manual_seed(2)
    beh = -torch.rand(256, generator=g, dtype=dtype) * 3.0
    log_prob = (beh + 0.6 * torch.randn(256, generator=g, dtype=dtype)).requires_grad_(True)
    adv = torch.randn(256, generator=g, dtype=dtype)
    out = vaco_policy_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=0.2)
    keep = tv_filter(log_ratio=log_prob.detach() - beh, advantages=adv, tv_threshold=0.2).keep_mask
    assert out.tv_estimate.item() > 0.2 and 0.2 < out.no_grad_fraction.item() < 0.8
    out.loss.backward()
    assert torch.all(log_prob.grad[~keep] == 0.0)  # exactly, not approximately
    assert torch.all(log_prob.grad[keep] != 0.0)
    expected = -(torch.exp(log_prob.detach() - beh) * adv) / 256
    torch.testing.assert_close(log_prob.grad[keep], expected[keep])


def test_learning_anchor_uses_anchor_ratio_for_tv_and_mask():
    log_prob, beh, adv = minibatch()
    # β = π_θ here (r = 1): only the anchor ratio q = π_θ/π_T = R can trigger the filter.
    anchor = torch.tensor([LP[i] - math.log(R[i]) for i in range(4)], dtype=F64)
    out = vaco_policy_loss(
        log_prob=log_prob,
        behavior_log_prob=log_prob.detach().clone(),
        advantages=adv,
        tv_threshold=0.1,
        anchor_log_prob=anchor,
    )
    # importance-weighted by π_T/β = 1/R: 0.5 mean (1/R) |R - 1|, unbiased for TV(π_θ, π_T) under β's actions
    assert out.tv_estimate.item() == pytest.approx(0.5 * sum(abs(r - 1) / r for r in R) / 4, rel=1e-12)
    assert out.no_grad_fraction.item() == 0.5
    assert out.approx_kl.item() == 0.0  # measured against β
    out.loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([0.0, 0.0, -A[2] / 4, -A[3] / 4], dtype=F64), **TIGHT)
    # And the other way round: far from β, on the anchor -> no filtering.
    log_prob2, beh2, _ = minibatch()
    out2 = vaco_policy_loss(
        log_prob=log_prob2,
        behavior_log_prob=beh2,
        advantages=adv,
        tv_threshold=0.1,
        anchor_log_prob=log_prob2.detach().clone(),
    )
    assert out2.tv_estimate.item() == 0.0 and out2.no_grad_fraction.item() == 0.0


@pytest.mark.parametrize("delta_mu,sigma", [(0.1, 1.0), (0.5, 1.0), (1.0, 1.0), (0.3, 0.5)])
def test_tv_estimate_converges_to_gaussian_tv(delta_mu, sigma):
    n = 200_000
    g = torch.Generator().manual_seed(3)
    x = sigma * torch.randn(n, generator=g, dtype=F64)  # a ~ β = N(0, σ²)
    log_ratio = (x**2 - (x - delta_mu) ** 2) / (2 * sigma**2)  # log N(x; Δμ, σ²) - log N(x; 0, σ²)
    analytic = 2 * 0.5 * (1 + math.erf(delta_mu / (2 * sigma) / math.sqrt(2))) - 1  # 2Φ(Δμ/2σ) - 1
    # Var|r-1| <= E_β(r-1)^2 = exp(Δμ²/σ²) - 1 (χ² divergence of two Gaussians): 5 std errors.
    tol = 5 * 0.5 * math.sqrt((math.exp(delta_mu**2 / sigma**2) - 1) / n)
    assert abs(tv_estimate(log_ratio).item() - analytic) < tol


def test_log_ratio_is_clamped():
    lr = torch.tensor([1000.0, -1000.0], dtype=F64)
    assert tv_estimate(lr).item() == pytest.approx(0.5 * ((math.exp(20) - 1) + (1 - math.exp(-20))) / 2)
    log_prob = torch.tensor([1000.0, -1000.0], dtype=F64, requires_grad=True)
    out = vaco_policy_loss(
        log_prob=log_prob,
        behavior_log_prob=torch.zeros(2, dtype=F64),
        advantages=torch.ones(2, dtype=F64),
        tv_threshold=float("inf"),
    )
    assert math.isfinite(out.loss.item()) and math.isfinite(out.approx_kl.item())


# ---------------------------------------------------------------- value loss, diagnostics


def test_value_loss_hand_case():
    values = torch.tensor([1.0, 2.0, -1.0], dtype=F64, requires_grad=True)
    targets = torch.tensor([0.5, 2.0, 1.0], dtype=F64, requires_grad=True)
    loss = value_loss(values=values, targets=targets)
    assert loss.item() == pytest.approx((0.25 + 0.0 + 4.0) / 3, rel=1e-12)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([2 * 0.5 / 3, 0.0, 2 * -2.0 / 3], dtype=F64))
    assert targets.grad is None  # targets are constants


def test_explained_variance():
    t = torch.tensor([1.0, 2.0, 4.0, 7.0], dtype=F64)
    assert explained_variance(values=t.clone(), targets=t) == 1.0
    assert explained_variance(values=torch.full_like(t, 3.5), targets=t) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(explained_variance(values=t, targets=torch.ones_like(t)))
    assert isinstance(explained_variance(values=t * 0.9, targets=t), float)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "fn,kw,match",
    [
        (vaco_policy_loss, dict(tv_threshold=-0.1), "tv_threshold"),
        (vaco_policy_loss, dict(tv_threshold=float("nan")), "tv_threshold"),
        (ppo_clip_loss, dict(clip_eps=0.0), "clip_eps"),
        (ppo_clip_loss, dict(clip_eps=float("inf")), "clip_eps"),
        (ppo_kl_loss, dict(kl_coef=-1.0), "kl_coef"),
        (spo_loss, dict(spo_eps=-0.2), "spo_eps"),
    ],
)
def test_bad_scalars_raise(fn, kw, match):
    log_prob, beh, adv = minibatch()
    with pytest.raises(ValueError, match=match):
        fn(log_prob=log_prob, behavior_log_prob=beh, advantages=adv, **kw)


def test_bad_shapes_raise():
    log_prob, beh, adv = minibatch()
    with pytest.raises(ValueError, match="advantages"):
        vaco_policy_loss(log_prob=log_prob, behavior_log_prob=beh, advantages=adv[:3], tv_threshold=0.2)
    with pytest.raises(ValueError, match="behavior_log_prob"):
        ppo_clip_loss(log_prob=log_prob, behavior_log_prob=beh[:, None], advantages=adv, clip_eps=0.2)
    with pytest.raises(ValueError, match="anchor_log_prob"):
        vaco_policy_loss(
            log_prob=log_prob, behavior_log_prob=beh, advantages=adv, tv_threshold=0.2, anchor_log_prob=beh[:2]
        )
    with pytest.raises(ValueError, match="pg_advantages"):
        impala_policy_loss(log_prob=log_prob, behavior_log_prob=beh, pg_advantages=adv.float(), rho_bar=1.0)
    with pytest.raises(ValueError, match="rho_bar"):
        impala_policy_loss(log_prob=log_prob, behavior_log_prob=beh, pg_advantages=adv, rho_bar=0.0)
    with pytest.raises(ValueError, match="advantages"):
        tv_filter(log_ratio=beh, advantages=adv[:2], tv_threshold=0.2)
    with pytest.raises(ValueError, match="log_ratio"):
        tv_estimate(beh[:0])
    with pytest.raises(ValueError, match="targets"):
        value_loss(values=adv, targets=adv[:3])
    with pytest.raises(ValueError, match="targets"):
        explained_variance(values=adv, targets=adv.long())
