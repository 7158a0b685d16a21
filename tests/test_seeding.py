"""Seeds from (run seed, actor id, restart count, env index) through SeedSequence (asyncrl.core.seeding)."""

import numpy as np
import pytest

from asyncrl.core.seeding import actor_seeds, fingerprint, stream_seed
from asyncrl.tasks.control.envs import VecEnv


def test_no_two_streams_of_a_run_share_a_seed():
    ids = ["actor0", "actor1", "a0", "a1", "host1-a0", "host1-a1", "host2-a0", "host2-a1"]
    seen = {}
    for actor_id in ids:
        for restart in range(3):
            s = actor_seeds(1, actor_id, restart, 8)
            for kind, value in [*((f"env{i}", v) for i, v in enumerate(s.env)), ("action", s.action), ("lag", s.lag)]:
                key = (actor_id, restart, kind)
                assert value not in seen, (key, seen.get(value))
                seen[value] = key
    assert len(seen) == len(ids) * 3 * 10


def test_same_inputs_same_seeds_and_run_seed_matters():
    assert actor_seeds(7, "actor0", 0, 4) == actor_seeds(7, "actor0", 0, 4)
    assert set(actor_seeds(7, "actor0", 0, 4).env).isdisjoint(actor_seeds(8, "actor0", 0, 4).env)
    # the env index names the stream, not the number of envs: env i is the same with more envs
    assert actor_seeds(7, "a", 0, 8).env[:4] == actor_seeds(7, "a", 0, 4).env
    assert all(0 <= v < 2**64 for v in actor_seeds(7, "a", 0, 4).env)


def test_ids_that_concatenate_alike_differ():
    # variable-length keys could collide ("a" + "1b" vs "a1" + "b"); hashed ids cannot
    assert stream_seed(1, "a1", 0, 0, 0) != stream_seed(1, "a", 0, 0, 0)
    assert fingerprint(actor_seeds(1, "a", 1, 2)) != fingerprint(actor_seeds(1, "a", 0, 2))


@pytest.mark.parametrize(
    "args",
    [
        (-1, "a", 0, 0, 0),
        (1, "", 0, 0, 0),
        (1, "a", -1, 0, 0),
        (1, "a", 2**32, 0, 0),
        (1.5, "a", 0, 0, 0),
        (True, "a", 0, 0, 0),
    ],
)
def test_bad_inputs_raise(args):
    with pytest.raises(ValueError):
        stream_seed(*args)


def test_readme_actors_start_in_distinct_states():
    """The README's by-hand actors a0 and a1 (same run seed) and its multi-host actors hostK-aJ:
    every one of their HalfCheetah envs starts from another initial state."""
    firsts = []
    for actor_id in ("a0", "a1", "host1-a0", "host1-a1", "host2-a0", "host2-a1"):
        env = VecEnv("HalfCheetah-v5", 8, seed=0)
        try:
            firsts.append(env.reset(seeds=actor_seeds(1, actor_id, 0, 8).env).copy())
        finally:
            env.close()
    rows = np.concatenate(firsts)
    assert len({r.tobytes() for r in rows}) == len(rows)
    with pytest.raises(ValueError):
        VecEnv("asyncrl/Corridor-v0", 2, seed=0).reset(seeds=[1])
