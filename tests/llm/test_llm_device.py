"""learner.precision = bf16 on the llm learner iteration (on the CPU: the same autocast code path as
cuda) and actor.device on a generator: float32 ratios and weights, one line for a missing device."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from micro_config import micro_cfg  # noqa: E402

from asyncrl.core.config import ConfigError  # noqa: E402
from asyncrl.core.seeding import actor_seeds  # noqa: E402
from asyncrl.core.state import LearnerState  # noqa: E402
from asyncrl.tasks import make_task  # noqa: E402


def _cfg(micro_dir, *extra):
    return micro_cfg(
        micro_dir,
        "llm.eval_size=0",
        "algo.num_epochs=2",
        "algo.num_minibatches=2",
        "algo.lr=1e-3",
        "learner.slots_per_batch=2",
        "learner.num_slots=2",
        "run.num_actors=1",
        *extra,
    )


def _slots(cfg, task):
    prod = task.producer()
    prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))
    prod.reset()
    out = []
    for i in range(cfg.learner.slots_per_batch):
        slot = task.spec.allocate()
        prod.collect(slot, version=0)
        slot["rewards"][:] = np.arange(len(slot["rewards"])) % 2  # unequal rewards in each group: a gradient
        out.append((f"a{i}", slot))
    return out


def test_bf16_llm_iteration_keeps_float32_log_probs_and_weights(micro_dir):
    cfg = _cfg(micro_dir, "learner.precision=bf16")
    task = make_task(cfg)
    slots = _slots(cfg, task)
    cfg32 = _cfg(micro_dir)
    bf16, fp32 = LearnerState(cfg, task.spec, task), LearnerState(cfg32, task.spec, make_task(cfg32, spec=task.spec))
    batch = bf16.make_batch(slots)
    from asyncrl.tasks.llm.learn import _token_log_probs

    with torch.no_grad(), bf16.forward_context():
        lp = _token_log_probs(bf16.policy, batch, torch.arange(4), llm=cfg.llm)
    assert lp.dtype == torch.float32
    stats = bf16.iterate(batch)
    fp32.iterate(fp32.make_batch(slots))
    assert all(math.isfinite(stats[k]) for k in ("policy_loss", "grad_norm", "rho_mean"))
    assert stats["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in bf16.policy.parameters())
    # learner.weights_dtype auto: the weights travel as bfloat16 (bit patterns) when the learner trains in bf16
    flat = bf16.flat_weights()
    rounded = torch.cat([p.detach().reshape(-1) for p in bf16.policy.parameters()]).to(torch.bfloat16)
    assert flat.dtype == np.uint16 and np.array_equal(flat, rounded.view(torch.int16).numpy().view(np.uint16))
    assert fp32.flat_weights().dtype == np.float32
    # the same batch, weights and shuffles: only the bf16 matrix products make the two differ
    assert any(not torch.equal(a, b) for a, b in zip(bf16.policy.parameters(), fp32.policy.parameters()))


def test_generator_on_a_missing_device_is_one_line(micro_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = _cfg(micro_dir, "actor.device=cuda")
    prod = make_task(cfg).producer()
    with pytest.raises(ConfigError, match="actor.device = cuda, but torch .* sees no CUDA device"):
        prod.bind(cfg, actor_seeds(cfg.run.seed, "actor0", 0, cfg.env.num_envs))


def test_learner_speed_llm_case_runs_one_iteration(micro_dir):
    """bench/learner_speed.py's synthetic gsm-tiny batch goes through today's llm iteration (the micro model)."""
    import contextlib
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "learner_speed.py"
    spec = importlib.util.spec_from_file_location("learner_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.read_config(path.parents[1] / "configs" / "gsm-tiny.toml")
    step, counts = mod.llm_case(cfg, torch.device("cpu"), contextlib.nullcontext, micro_dir)
    stats = step()
    assert counts["samples"] == 64 and counts["tokens"] == 64 * 256
    assert math.isfinite(stats["policy_loss"]) and len(stats["minibatches"]) == cfg.algo.num_minibatches
