"""Seeds of every random stream an actor draws from, derived through numpy's SeedSequence.

Each stream is named by (run seed, actor id, restart count, stream kind, index): the run seed is
the SeedSequence's entropy, the rest its spawn key, so no two actors, hosts or restarts of the
same run share an env stream, and the same run seed gives the same streams again (serial mode's
bit-reproducibility). The actor id enters as the 8 32-bit words of its SHA-256, so ids of any
length map to a spawn key of fixed length (keys of different lengths could otherwise collide).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

ENV, ACTION, LAG = 0, 1, 2  # stream kinds
_MAX_WORD = 2**32


class ActorSeeds(NamedTuple):
    env: tuple[int, ...]  # one per env index: the seed of that env's first reset (gymnasium)
    action: int  # the Generator that draws the actor's actions (policy.InferencePolicy)
    lag: int  # the Generator of the lag controls (lag_control.WeightHistory)


def _id_words(actor_id: str) -> tuple[int, ...]:
    digest = hashlib.sha256(actor_id.encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4))


def stream_seed(run_seed: int, actor_id: str, restart: int, kind: int, index: int = 0) -> int:
    """One 64-bit seed (an int in [0, 2**64)) of stream ``kind`` (ENV, ACTION, LAG) number ``index``.

    Raises ValueError for a negative run seed, an empty actor id, or a restart count or index
    outside [0, 2**32)."""
    if isinstance(run_seed, bool) or not isinstance(run_seed, int) or run_seed < 0:
        raise ValueError(f"run seed must be an integer >= 0, got {run_seed!r}")
    if not actor_id:
        raise ValueError("actor id must not be empty")
    for name, value in (("restart count", restart), ("stream index", index), ("stream kind", kind)):
        if not 0 <= value < _MAX_WORD:
            raise ValueError(f"{name} must lie in [0, 2**32), got {value}")
    ss = np.random.SeedSequence(entropy=run_seed, spawn_key=(*_id_words(actor_id), restart, kind, index))
    return int(ss.generate_state(1, np.uint64)[0])


def actor_seeds(run_seed: int, actor_id: str, restart: int, num_envs: int) -> ActorSeeds:
    """The seeds of one actor incarnation: ``num_envs`` env seeds, its action seed and its lag-control
    seed. ``restart``: how many times this actor id joined the run before (0 for the first).

    Raises ValueError as :func:`stream_seed`, or for num_envs < 1."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    env = tuple(stream_seed(run_seed, actor_id, restart, ENV, i) for i in range(num_envs))
    return ActorSeeds(
        env, stream_seed(run_seed, actor_id, restart, ACTION), stream_seed(run_seed, actor_id, restart, LAG)
    )


def fingerprint(seeds: ActorSeeds) -> str:
    """12 hex digits naming an incarnation's streams, for logs: equal fingerprints, equal streams."""
    return hashlib.sha256(repr(tuple(seeds)).encode()).hexdigest()[:12]
