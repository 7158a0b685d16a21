"""GRPO math against hand-computed values: group advantages, token broadcast with padding, loss
averaging, and asyncrl.algo.losses' PPO-clip and VACO applied to flattened tokens (values and gradients)."""
import math

import pytest
import torch

from asyncrl.algo.losses import ppo_clip_loss, vaco_policy_loss
from asyncrl.tasks.llm import grpo

MASK = torch.tensor([[True, True, False], [True, False, False]])
ADV = torch.tensor([2.0, -1.0])                   # one advantage per completion, B = 2


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


def test_equal_rewards_give_exactly_zero_even_where_rounding_would_not():
    r = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    assert (grpo.group_advantages(r, eps=0.0) == 0).all()
    assert (grpo.group_advantages(torch.tensor([[5.0], [2.0]])) == 0).all()   # G = 1


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]]), torch.tensor([[1.0, math.nan]]),
                                 torch.zeros(0, 3)])
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
    assert torch.allclose(grpo.token_weights(m, averaging="sequence"), torch.tensor([[0.75, 0.75, 0], [0, 0, 0], [1.5, 0, 0]]))
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


@pytest.mark.parametrize("averaging, loss, grad_first", [
    # token terms min(rA, clip(r)A): 2 (r = 1), 2.4 (r = 1.5 clipped), -0.8 (r = 0.5 clipped)
    ("token", -(2 + 2.4 - 0.8) / 3, -2 / 3),
    # mean of the row means: ((2 + 2.4) / 2 + (-0.8)) / 2
    ("sequence", -((2 + 2.4) / 2 - 0.8) / 2, -0.5),
    # sum over tokens / (B' * max_len) with max_len = 4
    ("constant", -(2 + 2.4 - 0.8) / 8, -0.25),
])
def test_grpo_is_ppo_clip_on_token_ratios_by_hand(averaging, loss, grad_first):
    lp, beta = _token_inputs()
    tb = grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV, averaging=averaging, max_len=4)
    out = ppo_clip_loss(**tb._asdict(), clip_eps=0.2)
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
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
    assert out.filtered_fraction.item() == pytest.approx(2 / 3)
    assert out.loss.item() == pytest.approx(-(2 + 3 - 0.5) / 3)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, 0, 0], [0, 0, 0]]), atol=1e-6)
    # under the budget every token keeps its gradient -r A / N
    lp.grad = None
    vaco_policy_loss(**grpo.flatten_tokens(MASK, log_prob=lp, behavior_log_prob=beta, advantages=ADV)._asdict(),
                     tv_threshold=1.0).loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, -1.0, 0], [1 / 6, 0, 0]]), atol=1e-6)


def test_sequence_weights_leave_vaco_filter_decisions_unchanged():
    lp, beta = _token_inputs()
    kw = dict(log_prob=lp, behavior_log_prob=beta, advantages=ADV)
    a = vaco_policy_loss(**grpo.flatten_tokens(MASK, **kw)._asdict(), tv_threshold=0.1)
    b = vaco_policy_loss(**grpo.flatten_tokens(MASK, averaging="sequence", **kw)._asdict(), tv_threshold=0.1)
    assert torch.equal(a.keep_mask, b.keep_mask) and a.tv_estimate == b.tv_estimate
    # the sequence-averaged value: ((2 + 3) / 2 + (-0.5)) / 2, as the weights promise
    assert b.loss.item() == pytest.approx(-((2 + 3) / 2 - 0.5) / 2)
