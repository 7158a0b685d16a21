"""Actor-critic networks, observation normalisation, and flat weight buffers.

The observation statistics are buffers of the policy: they travel with the weights in the flat
buffer the broadcaster ships, so an actor always normalises with the statistics of the version it
acts with. Only the learner updates them (:class:`asyncrl.algo.running_stats.RunningMeanStd`).
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from asyncrl.algo.distributions import Categorical, DiagGaussian
from asyncrl.algo.running_stats import RunningMeanStd

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


class PolicyOutput(NamedTuple):
    dist: DiagGaussian | Categorical
    values: torch.Tensor  # [N]


def _mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over normalised observations.

    Continuous actions: diagonal Gaussian with a state-independent log-std parameter.
    Discrete actions: categorical over logits. Orthogonal init; policy head gain 0.01.

    Args:
        obs_dim: D. action_dim: A (continuous) or number of actions K (discrete).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        *,
        discrete: bool,
        hidden_sizes=(64, 64),
        activation: str = "tanh",
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
    ):
        super().__init__()
        self.discrete, self.normalize_obs, self.obs_clip = discrete, normalize_obs, obs_clip
        sizes = [obs_dim, *hidden_sizes]
        self.pi = _mlp([*sizes, action_dim], activation, 0.01)
        self.v = _mlp([*sizes, 1], activation, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_var", torch.ones(obs_dim))

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, D] raw -> [N, D] normalised and clipped to ±obs_clip."""
        if not self.normalize_obs:
            return obs
        return ((obs - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8)).clamp(-self.obs_clip, self.obs_clip)

    def distribution(self, x: torch.Tensor) -> DiagGaussian | Categorical:
        out = self.pi(x).float()  # float32 even under bf16 autocast (asyncrl.core.device): the head's maths is float32
        return Categorical(out) if self.discrete else DiagGaussian(out, self.log_std)

    def forward(self, obs: torch.Tensor, normalized: bool = False) -> PolicyOutput:
        """obs [N, D] raw (or already normalised, ``normalized``) -> (action distribution over [N],
        values [N])."""
        return self.heads(obs if normalized else self.normalize(obs))

    def heads(self, x: torch.Tensor) -> PolicyOutput:
        """x [N, D] already normalised (:meth:`normalize`) -> (action distribution over [N], values [N]).
        The learner normalises a batch once per iteration and runs its minibatches through this."""
        return PolicyOutput(self.distribution(x), self.v(x).squeeze(-1).float())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, D] raw -> V(s) [N]."""
        return self.v(self.normalize(obs)).squeeze(-1).float()

    def set_obs_stats(self, rms: RunningMeanStd) -> None:
        self.obs_mean.copy_(torch.as_tensor(rms.mean, dtype=torch.float32))
        self.obs_var.copy_(torch.as_tensor(rms.var, dtype=torch.float32))


def build_policy(cfg_policy, obs_dim: int, action_dim: int, *, discrete: bool) -> ActorCritic:
    """ActorCritic from a PolicyConfig."""
    return ActorCritic(
        obs_dim,
        action_dim,
        discrete=discrete,
        hidden_sizes=tuple(cfg_policy.hidden_sizes),
        activation=cfg_policy.activation,
        init_log_std=cfg_policy.init_log_std,
        normalize_obs=cfg_policy.normalize_obs,
        obs_clip=cfg_policy.obs_clip,
    )


# ---- flat weights: one contiguous float32 buffer, parameters then buffers, state_dict order ----


def layout(module: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(k, tuple(v.shape)) for k, v in module.state_dict().items()]


def layout_hash(module: nn.Module) -> str:
    """16 hex digits identifying names, shapes and order of the flat buffer."""
    text = ";".join(f"{k}:{s}" for k, s in layout(module))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def flatten_weights(module: nn.Module) -> np.ndarray:
    """All parameters and buffers as one contiguous float32 array [P], in host memory (from any device)."""
    tensors = [v.detach().reshape(-1).to(torch.float32) for v in module.state_dict().values()]
    return torch.cat(tensors).cpu().numpy()


def load_flat_weights(module: nn.Module, flat: np.ndarray) -> None:
    """Inverse of :func:`flatten_weights`. Raises ValueError if the size does not match."""
    sd = module.state_dict()
    total = sum(v.numel() for v in sd.values())
    if flat.ndim != 1 or flat.size != total:
        raise ValueError(f"flat weights have shape {flat.shape}, expected ({total},)")
    src = torch.from_numpy(np.asarray(flat, np.float32))
    off = 0
    with torch.no_grad():
        for v in sd.values():
            n = v.numel()
            v.copy_(src[off : off + n].view_as(v))
            off += n


class InferencePolicy:
    """The actors' copy of the policy: numpy inference from the flat weight buffer.

    A torch forward pass for 8 observations costs about 120 us here, this one about 40 us, and
    an actor calls it once per env step of all its envs. Same maths as :class:`ActorCritic`
    (normalise, clip, MLP, Gaussian or categorical head); the learner recomputes log-probs
    with torch, so float32 rounding differences only add ~1e-6 to log ρ.

    Args:
        template: an ActorCritic with the layout the flat buffers follow.
        seed: seed of the numpy Generator that draws actions.
    """

    _ACT = {
        "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0.0),
        "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    }

    def __init__(self, template: ActorCritic, *, activation: str, seed: int):
        self.names = [k for k, _ in layout(template)]
        self.shapes = [s for _, s in layout(template)]
        self.discrete, self.normalize_obs, self.obs_clip = template.discrete, template.normalize_obs, template.obs_clip
        self.activation = self._ACT[activation]
        self.num_pi_layers = sum(1 for m in template.pi if isinstance(m, nn.Linear))
        self.rng = np.random.default_rng(seed)
        self.load(flatten_weights(template))

    def load(self, flat: np.ndarray) -> None:
        """Take weights from a flat float32 buffer [P] (copied). Raises ValueError on size."""
        total = sum(int(np.prod(s)) for s in self.shapes)
        if flat.ndim != 1 or flat.size != total:
            raise ValueError(f"flat weights have shape {flat.shape}, expected ({total},)")
        flat = np.array(flat, np.float32)
        tensors, off = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = int(np.prod(shape))
            tensors[name] = flat[off : off + n].reshape(shape)
            off += n
        self.layers = [
            (tensors[f"pi.{2 * i}.weight"].T.copy(), tensors[f"pi.{2 * i}.bias"]) for i in range(self.num_pi_layers)
        ]
        self.obs_mean = tensors["obs_mean"]
        self.obs_scale = 1.0 / np.sqrt(tensors["obs_var"] + 1e-8)
        if not self.discrete:
            self.log_std = tensors["log_std"]
            self.std = np.exp(self.log_std)
            self.log_prob_const = float(-self.log_std.sum() - 0.5 * len(self.log_std) * np.log(2 * np.pi))

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """obs [E, D] float32 -> (unclipped actions [E, A] float32 or [E] int64, log-probs [E] float32)."""
        x = obs
        if self.normalize_obs:
            x = np.clip((obs - self.obs_mean) * self.obs_scale, -self.obs_clip, self.obs_clip)
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = self.activation(x)
        if self.discrete:
            z = x - x.max(-1, keepdims=True)
            log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
            actions = np.argmax(log_p + self.rng.gumbel(size=log_p.shape), axis=-1)
            return actions.astype(np.int64), log_p[np.arange(len(actions)), actions].astype(np.float32)
        eps = self.rng.standard_normal(x.shape, dtype=np.float32)
        actions = x + self.std * eps
        return actions.astype(np.float32), (self.log_prob_const - 0.5 * (eps * eps).sum(-1)).astype(np.float32)
