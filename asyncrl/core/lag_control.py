"""Lag controls for experiments: which of the weight versions an actor has received acts next.

- ``policy_delay`` K: act with the newest received version that is at least K versions older
  than the newest one (the oldest kept while fewer exist): a constant extra backward lag.
- ``policy_age_buffer`` K: each rollout acts with a version drawn uniformly from the last K
  received: the simulated asynchrony of VACO's MuJoCo study (arXiv:2603.01365).
Both 0/1 (the defaults) mean: act with the newest version. A lag replay (serial mode,
:mod:`asyncrl.core.lag_trace`) picks with ``lagging`` and keeps ``replay_depth`` versions.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class WeightHistory:
    """The last few (version -> flat weights [P]) an actor received, in their wire dtype (float32,
    float16, or bfloat16 as uint16 bit patterns: asyncrl.wire.codec.PAYLOAD_DTYPES).

    Raises:
        ValueError: a negative delay, a buffer below 1, or both controls at once.
    """

    def __init__(self, *, policy_delay: int = 0, policy_age_buffer: int = 1, seed: int = 0, replay_depth: int = 0):
        if policy_delay < 0 or policy_age_buffer < 1:
            raise ValueError(
                f"policy_delay must be >= 0 and policy_age_buffer >= 1, got {policy_delay}, {policy_age_buffer}"
            )
        if policy_delay > 0 and policy_age_buffer > 1:
            raise ValueError("use policy_delay or policy_age_buffer, not both")
        self.delay, self.buffer = policy_delay, policy_age_buffer
        self.keep = max(policy_delay + 1, policy_age_buffer, replay_depth)
        self.versions: OrderedDict[int, np.ndarray] = OrderedDict()
        self.rng = np.random.default_rng(seed)

    @property
    def needs_every_version(self) -> bool:
        """True when older versions matter (the actor must keep each message, not only the newest)."""
        return self.keep > 1

    def add(self, version: int, flat: np.ndarray) -> None:
        if self.versions and version <= next(reversed(self.versions)):
            return  # stale or repeated
        view = flat.view()  # no copy (a received buffer is the transport's, immutable; a version is 1-3 GB for
        view.flags.writeable = False  # a 0.5-1.5B model): read-only, so no holder can change a kept version
        self.versions[version] = view
        while len(self.versions) > self.keep:
            self.versions.popitem(last=False)

    def drop_above(self, version: int) -> int:
        """Drop the versions newer than ``version`` (forged ones: asyncrl.roles.actor_weights);
        returns how many."""
        above = [v for v in self.versions if v > version]
        for v in above:
            del self.versions[v]
        return len(above)

    def state_dict(self) -> dict:
        """The versions kept (as tensors) and the generator's state, for a checkpoint."""

        return {
            "versions": [[v, _to_tensor(w)] for v, w in self.versions.items()],
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, d: dict) -> None:
        self.versions = OrderedDict((int(v), _from_tensor(w)) for v, w in d["versions"])
        self.rng.bit_generator.state = d["rng"]

    @property
    def newest(self) -> int:
        return next(reversed(self.versions)) if self.versions else -1

    def choose(self) -> tuple[int, np.ndarray]:
        """(version, flat weights) to act with for the next rollout. Raises LookupError if empty."""
        if not self.versions:
            raise LookupError("no weights received yet")
        keys = list(self.versions)
        if self.delay > 0:
            target = keys[-1] - self.delay
            older = [v for v in keys if v <= target]
            version = older[-1] if older else keys[0]
        elif self.buffer > 1:
            version = keys[int(self.rng.integers(len(keys)))]
        else:
            version = keys[-1]
        return version, self.versions[version]

    def lagging(self, lag: int) -> tuple[int, np.ndarray]:
        """(version, flat weights) ``lag`` versions behind the newest, or the oldest kept when that
        one is not (fewer versions exist, or the history keeps fewer). Raises LookupError if empty."""
        if not self.versions:
            raise LookupError("no weights received yet")
        keys = list(self.versions)
        target = keys[-1] - lag
        version = next((v for v in reversed(keys) if v <= target), keys[0])
        return version, self.versions[version]


def _to_tensor(flat: np.ndarray):
    """A checkpointable tensor of a flat buffer: bfloat16 bit patterns (uint16) as a bfloat16 tensor."""
    import torch

    if flat.dtype == np.uint16:
        return torch.from_numpy(flat.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(flat.copy())


def _from_tensor(t) -> np.ndarray:
    """Inverse of :func:`_to_tensor`."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
