"""A fixed control batch and policy for the learner-group tests (tests/test_learner_group.py): the
test process builds it for the single-learner reference, each member process of a group for its
share. Synthetic (no env): T x N samples with backward lag, episode ends and column-dependent
rewards, so the members' shares differ in their statistics."""

from __future__ import annotations

import torch

from asyncrl.core import config
from asyncrl.core.optim import make_optimizer
from asyncrl.tasks.control.policy import build_policy
from asyncrl.tasks.control.update import learner_iteration

T, N, OBS, ACT = 16, 8, 5, 2
VERSION = 4


def make_case(preset: str, sets: tuple[str, ...] = (), seed: int = 0):
    """(algo config, policy, optimizer, batch [T(+1), N, ...]) for ``preset``, the same in every process."""
    cfg = config.load(None, [f"algo.preset={preset}", "algo.num_epochs=2", "algo.num_minibatches=4", *sets])
    torch.manual_seed(seed)
    policy = build_policy(cfg.policy, OBS, ACT, discrete=False)
    policy.obs_mean.copy_(torch.linspace(-0.5, 0.5, OBS))
    opt = make_optimizer(policy.parameters(), lr=1e-3, eps=cfg.algo.adam_eps)  # the learner's (FlatAdam)
    g = torch.Generator().manual_seed(seed + 1)
    col = torch.arange(N, dtype=torch.float32)
    batch = {
        "obs": torch.randn(T + 1, N, OBS, generator=g) + 0.3 * col.view(1, N, 1),
        "actions": torch.randn(T, N, ACT, generator=g),
        "rewards": torch.randn(T, N, generator=g) + 0.5 * col,  # the second share earns more: its statistics differ
        "terminated": torch.rand(T, N, generator=g) < 0.05,
        "truncated": torch.zeros(T, N, dtype=torch.bool),
        "final_obs": torch.randn(T, N, OBS, generator=g),
    }
    batch["truncated"][T - 1, ::3] = True
    with torch.no_grad():
        x = policy.normalize(batch["obs"][:-1].reshape(T * N, OBS))
        lp = policy.distribution(x).log_prob(batch["actions"].reshape(T * N, ACT)).view(T, N)
    batch["behavior_log_prob"] = lp + 0.4 * torch.randn(T, N, generator=g)  # backward lag
    batch["behavior_version"] = VERSION - torch.randint(0, 4, (T, N), generator=g)
    return cfg.algo, policy, opt, batch


def share(batch: dict, rank: int, world: int) -> dict:
    """Member ``rank``'s equal block of columns."""
    n = N // world
    return {k: v[:, rank * n : (rank + 1) * n] for k, v in batch.items()}


def train(algo, policy, opt, batch, iterations: int = 2, **kw) -> tuple[list[torch.Tensor], list[dict]]:
    """(parameters after ``iterations`` learner iterations on ``batch``, each iteration's stats)."""
    gen = torch.Generator().manual_seed(7)
    stats = [
        learner_iteration(policy, opt, batch, cfg=algo, generator=gen, version=VERSION, **kw) for _ in range(iterations)
    ]
    return [p.detach().clone() for p in policy.parameters()], stats
