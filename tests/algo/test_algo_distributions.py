"""Tests of asyncrl.algo.distributions against torch.distributions."""

import math

import pytest
import torch
from torch import distributions as td

from asyncrl.algo.distributions import Categorical, DiagGaussian


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("per_sample_std", [False, True])
def test_gaussian_matches_torch(dtype, per_sample_std):
    g = torch.Generator().manual_seed(0)
    N, Adim = 64, 6
    mean = torch.randn(N, Adim, generator=g, dtype=dtype)
    log_std = (
        torch.randn(N, Adim, generator=g, dtype=dtype) * 0.5
        if per_sample_std
        else torch.randn(Adim, generator=g, dtype=dtype) * 0.5
    )
    actions = mean + 2.0 * torch.randn(N, Adim, generator=g, dtype=dtype)
    ours = DiagGaussian(mean, log_std)
    ref = td.Independent(td.Normal(mean, torch.exp(log_std).expand_as(mean)), 1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert ours.log_prob(actions).shape == (N,) and ours.entropy().shape == (N,)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions), **tol)
    torch.testing.assert_close(ours.entropy(), ref.entropy(), **tol)
    assert ours.log_prob(actions).dtype == dtype


def test_gaussian_gradients_match_torch():
    g = torch.Generator().manual_seed(1)
    mean = torch.randn(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    log_std = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randn(8, 3, generator=g, dtype=torch.float64)
    ours = DiagGaussian(mean, log_std).log_prob(actions).sum() + DiagGaussian(mean, log_std).entropy().sum()
    grads = torch.autograd.grad(ours, (mean, log_std))
    dist = td.Independent(td.Normal(mean, torch.exp(log_std).expand_as(mean)), 1)
    ref_grads = torch.autograd.grad(dist.log_prob(actions).sum() + dist.entropy().sum(), (mean, log_std))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gaussian_sample_and_mode():
    mean = torch.tensor([[1.0, -2.0]], dtype=torch.float64).expand(20_000, 2).contiguous()
    log_std = torch.tensor([math.log(0.5), math.log(2.0)], dtype=torch.float64)
    dist = DiagGaussian(mean.requires_grad_(True), log_std)
    a = dist.sample(torch.Generator().manual_seed(2))
    b = dist.sample(torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and a.shape == (20_000, 2) and not a.requires_grad
    torch.testing.assert_close(a.mean(0), torch.tensor([1.0, -2.0], dtype=torch.float64), atol=0.05, rtol=0)
    torch.testing.assert_close(a.std(0), torch.tensor([0.5, 2.0], dtype=torch.float64), atol=0.05, rtol=0)
    assert torch.equal(dist.mode(), mean.detach()) and not dist.mode().requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_categorical_matches_torch(dtype):
    g = torch.Generator().manual_seed(3)
    N, K = 64, 7
    logits = 3.0 * torch.randn(N, K, generator=g, dtype=dtype)
    actions = torch.randint(0, K, (N,), generator=g)
    ours, ref = Categorical(logits), td.Categorical(logits=logits)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert ours.log_prob(actions).shape == (N,) and ours.entropy().shape == (N,)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions), **tol)
    torch.testing.assert_close(ours.entropy(), ref.entropy(), **tol)


def test_categorical_masked_logits_and_gradients():
    logits = torch.tensor([[0.0, -math.inf, 1.0], [2.0, 2.0, 2.0]], dtype=torch.float64, requires_grad=True)
    dist = Categorical(logits)
    ent = dist.entropy()
    assert torch.isfinite(ent).all()
    torch.testing.assert_close(ent[1], torch.tensor(math.log(3.0), dtype=torch.float64))
    torch.testing.assert_close(ent, td.Categorical(logits=logits).entropy())
    lp = dist.log_prob(torch.tensor([2, 0]))
    lp.sum().backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    td.Categorical(logits=ref_logits).log_prob(torch.tensor([2, 0])).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)


def test_categorical_sample_and_mode():
    probs = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    dist = Categorical(torch.log(probs).expand(30_000, 3))
    a = dist.sample(torch.Generator().manual_seed(4))
    assert a.dtype == torch.int64 and a.shape == (30_000,)
    assert torch.equal(a, dist.sample(torch.Generator().manual_seed(4)))
    freq = torch.bincount(a, minlength=3).double() / 30_000
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    assert torch.all(dist.mode() == 1)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="mean"):
        DiagGaussian(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="log_std"):
        DiagGaussian(torch.zeros(4, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="log_std"):
        DiagGaussian(torch.zeros(4, 3), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="actions"):
        DiagGaussian(torch.zeros(4, 3), torch.zeros(3)).log_prob(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="logits"):
        Categorical(torch.zeros(5))
    with pytest.raises(ValueError, match="logits"):
        Categorical(torch.zeros(5, 3, dtype=torch.int64))
    dist = Categorical(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="actions"):
        dist.log_prob(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="actions"):
        dist.log_prob(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="actions"):
        dist.log_prob(torch.tensor([0, 1, 2]))
