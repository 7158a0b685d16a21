"""GRPO math against hand-computed values: group advantages, token broadcast with padding, loss
averaging, and asyncrl.algo's PPO-clip (ppo_losses) and VACO (vaco_loss) applied to flattened tokens (values and
gradients)."""

import math

import pytest
import torch

from asyncrl.algo import grpo
from asyncrl.algo.ppo_losses import ppo_clip_loss
from asyncrl.algo.vaco_loss import vaco_policy_loss

MASK = torch.tensor([[True, True, False], [True, False, False]])
ADV = torch.tensor([2.0, -1.0])  # one advantage per completion, B = 2


def _token_inputs():
    """Token ratios r = [1, 1.5 | 0.5] on the three completion tokens; padding holds junk on purpose."""
    beta = torch.tensor([[-1.0, -2.0, 123.0], [-0.5, 77.0, -9.0]])
    lp = torch.tensor([[-1.0, -2.0 + math.log(1.5), -55.0], [-0.5 + math.log(0.5), 3.0, 1e4]], requires_grad=True)
    return lp, beta


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    a = grpo.group_advantages(r, eps=0.0)
    # group 0: mean 0.5, population std 0.5; group 1: equal rewards; group 2: mean 2, std sqrt(0.5)
    s = math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0] * 4, [1 / s, -1 / s, 0.0, 0.0]]))
    a = grpo.group_advantages(r, scale_by_std=False)
    assert torch.allclose(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4, [1.0, -1.0, 0.0, 0.0]]))
    a = grpo.group_advantages(r, eps=0.5)
    assert torch.allclose(a[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_weight_negatives_by_hand():
    # one right completion of four (rewards 1, 0, 0, 0): mean 0.25, population std sqrt(3) / 4
    a = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), eps=0.0)
    s = math.sqrt(3)
    assert torch.allclose(a, torch.tensor([[3 / s, -1 / s, -1 / s, -1 / s], [0.0] * 4]))
    assert grpo.weight_negatives(a, 1.0) is a  # GRPO unchanged
    assert torch.allclose(
        grpo.weight_negatives(a, 0.25), torch.tensor([[3 / s, -0.25 / s, -0.25 / s, -0.25 / s], [0.0] * 4])
    )
    psr = grpo.weight_negatives(a, 0.0)  # positive samples only
    assert psr[0, 0] == a[0, 0] and (psr[0, 1:] == 0).all() and (psr[1] == 0).all()
    assert torch.equal(grpo.weight_negatives(a, 2.0)[0, 1:], 2 * a[0, 1:])
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="negative_weight must be a finite number >= 0"):
            grpo.weight_negatives(a, bad)


def test_equal_rewards_give_exactly_zero_even_where_rounding_would_not():
    r = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    assert (grpo.group_advantages(r, eps=0.0) == 0).all()
    assert (grpo.group_advantages(torch.tensor([[5.0], [2.0]])) == 0).all()  # G = 1


@pytest.mark.parametrize(
    "bad", [torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]]), torch.tensor([[1.0, math.nan]]), torch.zeros(0, 3)]
)
def test_group_advantages_rejects_bad_rewards(bad):
    with pytest.raises(ValueError):
        grpo.group_advantages(bad)


def test_token_advantages_padding_gets_none():
    ta = grpo.token_advantages(ADV, MASK)
    assert torch.equal(ta, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
    # [P, G] input, prompt-major rows
    ta = grpo.token_advantages(torch.tensor([[1.0, -1.0]]), MASK)
    assert torch.equal(ta, torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="3 advantages for 2 completions"):
        grpo.token_advantages(torch.ones(3), MASK)
    with pytest.raises(ValueError, match="bool"):
        grpo.token_advantages(ADV, MASK.float())


def test_token_weights_by_hand():
    assert torch.equal(grpo.token_weights(MASK), MASK.float())
    # N = 3 tokens, B' = 2 rows of lengths 2 and 1
    assert torch.allclose(grpo.token_weights(MASK, averaging="sequence"), torch.tensor([[0.75, 0.75, 0], [1.5, 0, 0]]))
    assert torch.allclose(grpo.token_weights(MASK, averaging="constant", max_len=4), MASK.float() * 3 / 8)
    # an empty row counts in no average
    m = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    assert torch.allclose(
        grpo.token_weights(m, averaging="sequence"), torch.tensor([[0.75, 0.75, 0], [0, 0, 0], [1.5, 0, 0]])
    )
    with pytest.raises(ValueError, match="averaging"):
        grpo.token_weights(MASK, averaging="batch")
    with pytest.raises(ValueError, match="shorter than the longest"):
        grpo.token_weights(MASK, averaging="constant", max_len=1)
    with pytest.raises(ValueError, match="no completion token"):
        grpo.token_weights(torch.zeros(2, 3, dtype=torch.bool))


def test_flatten_tokens_drops_padding_in_row_major_order():
    lp, beta = _token_inputs()
    tb = grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV)
    assert torch.allclose(tb.log_prob - tb.behavior_log_prob, torch.log(torch.tensor([1.0, 1.5, 0.5])))
    assert torch.equal(tb.advantages, torch.tensor([2.0, 2.0, -1.0]))
    assert tb.log_prob.requires_grad and not tb.advantages.requires_grad and not tb.behavior_log_prob.requires_grad
    with pytest.raises(ValueError, match="log_prob is"):
        grpo.flatten_tokens(MASK, log_prob=lp[:, :2], behavior_log_prob=beta, advantages=ADV)


@pytest.mark.parametrize(
    "averaging, loss, grad_first",
    [
        # token terms min(rA, clip(r)A): 2 (r = 1), 2.4 (r = 1.5 clipped), -0.8 (r = 0.5 clipped)
        ("token", -(2 + 2.4 - 0.8) / 3, -2 / 3),
        # mean of the row means: ((2 + 2.4) / 2 + (-0.8)) / 2
        ("sequence", -((2 + 2.4) / 2 - 0.8) / 2, -0.5),
        # sum over tokens / (B' * max_len) with max_len = 4
        ("constant", -(2 + 2.4 - 0.8) / 8, -0.25),
    ],
)
def test_grpo_is_ppo_clip_on_token_ratios_by_hand(averaging, loss, grad_first):
    lp, beta = _token_inputs()
    tb = grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV, averaging=averaging, max_len=4)
    out = ppo_clip_loss(**tb._asdict(), clip_eps=0.2)
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    assert out.clip_fraction_two_sided.item() == pytest.approx(2 / 3)
    assert out.no_grad_fraction.item() == pytest.approx(2 / 3)  # both clipped tokens are on the outward side
    out.loss.backward()
    # d/d log π of -w r A / N: only the unclipped token has a gradient; padding gets exactly zero
    expected = torch.zeros(2, 3)
    expected[0, 0] = grad_first
    assert torch.allclose(lp.grad, expected, atol=1e-6)


def test_vaco_on_tokens_by_hand():
    lp, beta = _token_inputs()
    tb = grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV)
    # tv = 0.5 mean |r - 1| = 1/6 > δ = 0.1: the filter fires; tokens 2 (A > 0, r > 1) and 3 (A < 0, r < 1)
    # would move r further from 1 and are detached; the loss value still counts them: -mean(r A)
    out = vaco_policy_loss(**tb._asdict(), tv_threshold=0.1)
    assert out.tv_estimate.item() == pytest.approx(1 / 6)
    assert out.no_grad_fraction.item() == pytest.approx(2 / 3)
    assert out.loss.item() == pytest.approx(-(2 + 3 - 0.5) / 3)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, 0, 0], [0, 0, 0]]), atol=1e-6)
    # under the budget every token keeps its gradient -r A / N
    lp.grad = None
    vaco_policy_loss(
        **grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV)._asdict(), tv_threshold=1.0
    ).loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, -1.0, 0], [1 / 6, 0, 0]]), atol=1e-6)


def test_sequence_weights_leave_vaco_filter_decisions_unchanged():
    lp, beta = _token_inputs()
    kw = dict(log_prob=lp, behavior_log_prob=beta, advantages=ADV)
    a = vaco_policy_loss(**grpo.flatten_tokens(MASK, **kw)._asdict(), tv_threshold=0.1)
    b = vaco_policy_loss(**grpo.flatten_tokens(MASK, averaging="sequence", **kw)._asdict(), tv_threshold=0.1)
    assert torch.equal(a.keep_mask, b.keep_mask) and a.tv_estimate == b.tv_estimate
    # the sequence-averaged value: ((2 + 3) / 2 + (-0.5)) / 2, as the weights promise
    assert b.loss.item() == pytest.approx(-((2 + 3) / 2 - 0.5) / 2)


# ---- advantage realignment without a critic (llm.realign = "is_baseline"; docs/llm-realignment.md) ----

# 2 prompts x G = 3, rho_bar = 1. Sequence log-ratios log π_T/β -> weights w = min(1, π_T/β):
#   prompt 0: rewards [1, 0, 0], π_T/β [0.5, 1, 1]  -> w [0.5, 1, 1]
#   prompt 1: rewards [1, 1, 0], π_T/β [3, 0.25, 1] -> w [1 (3 truncated at rho_bar), 0.25, 1]
REWARDS3 = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
LOG_RATIO3 = torch.log(torch.tensor([[0.5, 1.0, 1.0], [3.0, 0.25, 1.0]], dtype=torch.float64))
# prompt 0: b_T = 0.5 / 2.5 = 0.2 (b_β = 1/3); σ_w² = (0.5 * 0.8² + 0.2² + 0.2²) / 2.5 = 0.16, σ_w = 0.4
# prompt 1: b_T = 1.25 / 2.25 = 5/9 (b_β = 2/3); σ_w² = (1.25 * (4/9)² + (5/9)²) / 2.25 = 20/81, σ_w = 2√5/9
SIGMA1 = 2 * math.sqrt(5) / 9


def test_realigned_group_advantages_by_hand():
    out = grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, rho_bar=1.0, eps=0.0)
    expect = torch.tensor(
        [[0.8 / 0.4, -0.2 / 0.4, -0.2 / 0.4], [(4 / 9) / SIGMA1, (4 / 9) / SIGMA1, (-5 / 9) / SIGMA1]],
        dtype=torch.float64,
    )
    assert torch.allclose(out.advantages, expect, atol=1e-12)
    assert torch.allclose(
        out.advantages[1],
        torch.tensor([2 / math.sqrt(5), 2 / math.sqrt(5), -math.sqrt(5) / 2], dtype=torch.float64),
        atol=1e-12,
    )
    assert torch.allclose(out.baseline_shift, torch.tensor([0.2 - 1 / 3, 5 / 9 - 2 / 3], dtype=torch.float64))
    assert torch.allclose(out.weights, torch.tensor([[0.5, 1.0, 1.0], [1.0, 0.25, 1.0]], dtype=torch.float64))
    assert out.advantages.dtype == torch.float64
    # eps in the denominator, and no division without scale_by_std: r - b_T
    out = grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, eps=0.1)
    assert math.isclose(float(out.advantages[0, 0]), 0.8 / 0.5, rel_tol=1e-12)
    out = grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, scale_by_std=False)
    assert torch.allclose(
        out.advantages, torch.tensor([[0.8, -0.2, -0.2], [4 / 9, 4 / 9, -5 / 9]], dtype=torch.float64), atol=1e-12
    )


def test_realigned_weights_are_truncated_at_rho_bar():
    # rho_bar = inf: prompt 1's weights [3, 0.25, 1], b_T = 3.25 / 4.25 = 13/17
    out = grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, rho_bar=math.inf, scale_by_std=False)
    assert math.isclose(float(out.weights[1, 0]), 3.0, rel_tol=1e-12)
    assert math.isclose(float(out.baseline_shift[1]), 13 / 17 - 2 / 3, rel_tol=1e-12)
    assert math.isclose(float(out.advantages[1, 2]), -13 / 17, rel_tol=1e-12)
    # rho_bar = 2: [2, 0.25, 1], b_T = 2.25 / 3.25 = 9/13; prompt 0 (no weight over 1) is unchanged
    out2 = grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, rho_bar=2.0, scale_by_std=False)
    assert math.isclose(float(out2.baseline_shift[1]), 9 / 13 - 2 / 3, rel_tol=1e-12)
    assert torch.equal(out2.advantages[0], out.advantages[0])
    # every ratio past rho_bar: the weights are equal, so b_T = b_β and the advantages are today's
    big = torch.full((2, 3), 4.0, dtype=torch.float64) + torch.arange(3.0, dtype=torch.float64)
    out = grpo.realigned_group_advantages(REWARDS3, big, rho_bar=1.0)
    assert torch.equal(out.advantages, grpo.group_advantages(REWARDS3)) and (out.baseline_shift == 0).all()


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_realigned_advantages_at_zero_lag_are_group_advantages_bit_for_bit(scale_by_std):
    gen = torch.Generator().manual_seed(0)
    for rewards in (
        torch.randint(0, 2, (16, 8), generator=gen).float(),
        torch.rand(16, 7, generator=gen),
        torch.rand(5, 3, generator=gen, dtype=torch.float64),
    ):
        for log_ratio in (torch.zeros_like(rewards), torch.full_like(rewards, -0.3)):  # all w equal per group
            out = grpo.realigned_group_advantages(rewards, log_ratio, scale_by_std=scale_by_std)
            assert torch.equal(out.advantages, grpo.group_advantages(rewards, scale_by_std=scale_by_std))
            assert torch.equal(out.baseline_shift, torch.zeros(rewards.shape[0], dtype=rewards.dtype))


def test_realigned_equal_reward_group_gets_exactly_zero():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]])
    log_ratio = torch.log(torch.tensor([[0.3, 1.0, 0.7], [0.5, 1.0, 1.0]]))
    out = grpo.realigned_group_advantages(rewards, log_ratio, eps=0.0)
    assert (out.advantages[0] == 0).all() and torch.allclose(out.advantages[1], torch.tensor([2.0, -0.5, -0.5]))
    # very stale completions: weights that underflow float32 still normalise (log space)
    out = grpo.realigned_group_advantages(
        rewards, torch.tensor([[0.0] * 3, [-200.0, -300.0, -300.0]]), scale_by_std=False
    )
    assert torch.allclose(out.advantages[1], torch.tensor([0.0, -1.0, -1.0]), atol=1e-6)
    assert bool(torch.isfinite(out.advantages).all())


def test_realigned_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="rho_bar"):
        grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3, rho_bar=0.0)
    with pytest.raises(ValueError, match="log_ratio"):
        grpo.realigned_group_advantages(REWARDS3, LOG_RATIO3[:, :2])
    with pytest.raises(ValueError, match="log_ratio must be finite"):
        grpo.realigned_group_advantages(REWARDS3, torch.full((2, 3), -math.inf, dtype=torch.float64))
    with pytest.raises(ValueError, match="rewards"):
        grpo.realigned_group_advantages(REWARDS3[0], LOG_RATIO3[0])


def test_sequence_log_ratio_sums_policy_tokens_only():
    target = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 99.0]])
    behavior = torch.tensor([[-1.5, -7.0, -2.0], [-1.0, 0.0, -99.0]])
    policy_mask = torch.tensor([[True, False, True], [True, True, False]])  # [0, 1]: calculator; [1, 2]: padding
    got = grpo.sequence_log_ratio(target, behavior, policy_mask)
    assert torch.allclose(got, torch.tensor([0.5 - 1.0, 0.5 - 0.25]))
    assert float(grpo.sequence_log_ratio(target, behavior, torch.zeros(2, 3, dtype=torch.bool))[0]) == 0.0
    with pytest.raises(ValueError, match="behavior_log_prob"):
        grpo.sequence_log_ratio(target, behavior[:, :2], policy_mask)


# ---- KL penalty toward the reference (llm.kl_coef) ----


def test_kl_k3_value_and_gradient_by_hand():
    # d = log π_ref - log π_θ = [0, ln 2, -ln 2, 30 (clamped to 20)]
    ref = torch.tensor([-1.0, -1.0 + math.log(2.0), -1.0 - math.log(2.0), 29.0], dtype=torch.float64)
    lp = torch.full((4,), -1.0, dtype=torch.float64, requires_grad=True)
    kl = grpo.kl_k3(lp, ref)
    expect = [0.0, 1.0 - math.log(2.0), math.log(2.0) - 0.5, math.exp(20.0) - 21.0]  # e^d - d - 1
    assert torch.allclose(kl, torch.tensor(expect, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    kl[:3].sum().backward()
    # d/d log π_θ = 1 - e^d: 0, 1 - 2, 1 - 0.5; the clamped token gets none
    assert torch.allclose(lp.grad, torch.tensor([0.0, -1.0, 0.5, 0.0], dtype=torch.float64), atol=1e-12)
    lp.grad = None
    grpo.kl_k3(lp, ref)[3].backward()
    assert float(lp.grad[3]) == 0.0
    with pytest.raises(ValueError):
        grpo.kl_k3(lp, ref[:2])
