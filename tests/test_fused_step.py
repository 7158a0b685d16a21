"""The fused minibatch step (asyncrl.tasks.control.fused_step: forward, loss, gradient, clip and Adam
in one compiled graph) trains what the eager step trains, to float rounding, for a preset of each
kind; it is deterministic; a non-finite step is skipped and counted; a compiler failure falls back
to the eager step with a warning."""

from __future__ import annotations

import logging

import learner_group_case as case
import pytest
import torch

from asyncrl.core.optim import make_optimizer
from asyncrl.tasks.control import fused_step
from asyncrl.tasks.control.update import learner_iteration

pytestmark = pytest.mark.compiles  # the real compile, here and in every thread (tests/conftest.py)

CASES = [
    ("decoupled_ppo", ()),
    ("vaco", ("algo.tv_threshold=0.01", "algo.tv_filter_trigger=iteration")),  # the filter fires
    ("ppo", ()),
    ("vaco_no_filter", ()),  # realigned advantages
]


def trained(preset, sets, compile_loss, batch_edit=None):
    algo, policy, _, batch = case.make_case(preset, sets)
    opt = make_optimizer(policy.parameters(), lr=1e-3, eps=algo.adam_eps)
    if batch_edit:
        batch_edit(batch)
    gen = torch.Generator().manual_seed(7)
    stats = [
        learner_iteration(policy, opt, batch, cfg=algo, generator=gen, version=case.VERSION, compile_loss=compile_loss)
        for _ in range(2)
    ]
    return [p.detach().clone() for p in policy.parameters()], stats, opt


@pytest.mark.parametrize("preset,sets", CASES, ids=[c[0] for c in CASES])
def test_fused_step_trains_what_the_eager_step_trains(preset, sets):
    eager, eager_stats, _ = trained(preset, sets, False)
    fused, fused_stats, _ = trained(preset, sets, True)
    assert max(float((a - b).abs().max()) for a, b in zip(eager, fused)) < 1e-4
    assert any(not torch.equal(a, b) for a, b in zip(eager, case.make_case(preset, sets)[1].parameters()))
    for got, want in zip(fused_stats, eager_stats):
        for key in (
            "policy_loss",
            "value_loss",
            "approx_kl",
            "tv_estimate",
            "no_grad_fraction",
            "entropy",
            "grad_norm",
        ):
            assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), key
        if "filter_fire_rate" in want:
            assert got["filter_fire_rate"] == pytest.approx(want["filter_fire_rate"], abs=0.05)


def test_fused_step_is_deterministic():
    a, _, _ = trained("decoupled_ppo", (), True)
    b, _, _ = trained("decoupled_ppo", (), True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_fused_step_skips_a_non_finite_step():
    def poison(batch):
        batch["rewards"][0, 0] = float("nan")  # every advantage it reaches, and the loss, go NaN

    params, _, opt = trained("decoupled_ppo", (), True, poison)
    assert opt.skipped > 0 and float(opt.steps) + opt.skipped == 2 * 2 * 4  # 2 iterations x 2 epochs x 4 minibatches
    assert all(torch.isfinite(p).all() for p in params)


def test_a_compiler_failure_falls_back_to_the_eager_step(monkeypatch, caplog):
    def broken(fn, **kw):
        def fail(*args):
            raise RuntimeError("no C++ compiler")

        return fail

    monkeypatch.setattr(fused_step.torch, "compile", broken)
    eager, _, _ = trained("ppo", (), False)
    with caplog.at_level(logging.WARNING, logger="asyncrl.learner"):
        fallback, _, _ = trained("ppo", (), True)
    assert all(torch.equal(a, b) for a, b in zip(eager, fallback))
    assert "torch.compile of the fused minibatch step failed" in caplog.text


@pytest.mark.parametrize("preset,sets", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_a_warm_up_in_a_thread_compiles_the_first_iteration_and_changes_nothing(preset, sets):
    """The learner compiles in a thread while it serves (asyncrl.core.background.Warmup): the warm-up
    leaves the policy and optimizer bit-identical, and the first iteration, in another thread, then
    takes no compile and trains what an iteration without warm-up trains."""
    from torch._dynamo.utils import counters

    from asyncrl.core.background import Warmup
    from asyncrl.core.spec import RolloutSpec
    from asyncrl.tasks.control.update import warm_up_compiled_step

    want, _, _ = trained(preset, sets, True)
    torch._dynamo.reset()
    algo, policy, opt, batch = case.make_case(preset, sets)
    before = [t.clone() for t in (opt.flat_params, opt.exp_avg, opt.exp_avg_sq, opt.steps)]
    buffers = [b.clone() for b in policy.buffers()]
    T, N = batch["rewards"].shape
    spec = RolloutSpec(obs_dim=case.OBS, action_dim=case.ACT, discrete=False, rollout_length=T, num_envs=N)
    ok = {}
    rows = T * N // algo.num_minibatches
    Warmup(lambda: ok.setdefault("ok", warm_up_compiled_step(policy, opt, algo, rows=rows, spec=spec))).wait()
    assert ok["ok"] is True
    assert all(torch.equal(a, b) for a, b in zip(before, (opt.flat_params, opt.exp_avg, opt.exp_avg_sq, opt.steps)))
    assert all(torch.equal(a, b) for a, b in zip(buffers, policy.buffers()))
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    gen = torch.Generator().manual_seed(7)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            learner_iteration(policy, opt, batch, cfg=algo, generator=gen, version=case.VERSION, compile_loss=True)
    assert counters["stats"]["unique_graphs"] == graphs  # no compile in the iterations
    assert all(torch.equal(a, b) for a, b in zip(want, policy.parameters()))
