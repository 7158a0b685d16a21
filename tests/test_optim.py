"""The learner's flat Adam (asyncrl.core.optim.FlatAdam) takes torch's Adam steps to the bit, clips as
clip_grad_norm_ does, skips non-finite steps, and moves checkpoints both ways with torch's Adam."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.core.iteration import optimizer_step
from asyncrl.core.optim import FlatAdam, GuardedAdam, make_optimizer


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def loss_of(model, k):
    g = torch.Generator().manual_seed(k)
    x, y = torch.randn(32, 5, generator=g), torch.randn(32, 3, generator=g)
    return ((model(x) - y) ** 2).mean() * (1 + k % 3)


def test_flat_adam_takes_torch_adams_steps_to_the_bit():
    a, b = net(), net()
    ref = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    flat = FlatAdam(b.parameters(), lr=1e-2, eps=1e-5)
    for k in range(25):
        ref.zero_grad()
        loss_of(a, k).backward()
        flat.zero_grad()
        loss_of(b, k).backward()
        ref.step()
        flat.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    # the parameters, gradients and moments are views of the flat buffers
    p0 = next(b.parameters())
    assert p0.data_ptr() == flat.flat_params.data_ptr() and p0.grad.data_ptr() == flat.flat_grad.data_ptr()


def test_optimizer_step_with_flat_adam_clips_as_clip_grad_norm_does():
    a, b = net(), net()
    ref = GuardedAdam(a.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    flat = make_optimizer(b.parameters(), lr=1e-2, eps=1e-5)
    assert isinstance(flat, FlatAdam)
    for k in range(10):
        na = optimizer_step(ref, loss_of(a, k) * 50, 0.5)  # large gradients: the clip acts
        nb = optimizer_step(flat, loss_of(b, k) * 50, 0.5)
        assert float(na) == pytest.approx(float(nb), rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_flat_adam_skips_a_non_finite_step():
    b = net()
    flat = FlatAdam(b.parameters(), lr=1e-2, eps=1e-5)
    before = flat.flat_params.clone()
    optimizer_step(flat, loss_of(b, 0) * float("nan"), 0.5)
    assert torch.equal(flat.flat_params, before) and flat.skipped == 1 and float(flat.steps) == 0
    optimizer_step(flat, loss_of(b, 1), 0.5)
    assert not torch.equal(flat.flat_params, before) and flat.consecutive == 0


def test_checkpoints_move_between_flat_and_torch_adam():
    a, b = net(), net()
    ref = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    flat = FlatAdam(b.parameters(), lr=1e-2, eps=1e-5)
    for k in range(5):
        for opt, m in ((ref, a), (flat, b)):
            opt.zero_grad()
            loss_of(m, k).backward()
            opt.step()
    # torch's state into a fresh FlatAdam, and the FlatAdam's into a fresh torch Adam
    c, d = copy.deepcopy(a), copy.deepcopy(b)
    flat2 = FlatAdam(c.parameters(), lr=1e-2, eps=1e-5)
    flat2.load_state_dict(copy.deepcopy(ref.state_dict()))  # as a checkpoint does: saved, then loaded
    ref2 = torch.optim.Adam(d.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    ref2.load_state_dict(copy.deepcopy(flat.state_dict()))
    for k in range(5, 10):
        for opt, m in ((ref, a), (flat2, c), (flat, b), (ref2, d)):
            opt.zero_grad()
            loss_of(m, k).backward()
            opt.step()
    for p, q, r, s in zip(a.parameters(), c.parameters(), b.parameters(), d.parameters()):
        assert torch.equal(p, q) and torch.equal(r, s) and torch.equal(p, r)


def test_state_dict_leaves_the_live_state_alone():
    """A checkpoint taken mid-run (state_dict) must not freeze the live step count it reports later."""
    b = net()
    flat = FlatAdam(b.parameters(), lr=1e-2, eps=1e-5)
    for k in range(3):
        optimizer_step(flat, loss_of(b, k), 0.5)
        first = flat.state_dict()
    assert {float(s["step"]) for s in first["state"].values()} == {3.0}
    optimizer_step(flat, loss_of(b, 3), 0.5)
    assert {float(s["step"]) for s in flat.state_dict()["state"].values()} == {4.0}
    assert {float(s["step"]) for s in first["state"].values()} == {3.0}  # a snapshot stays what it was


def test_mixed_dtypes_fall_back_to_the_fused_adam():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    assert type(make_optimizer(params, lr=1e-3, eps=1e-5)) is GuardedAdam
