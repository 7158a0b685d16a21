"""The random draws of the sampled held-out evaluation: one seeded stream per problem, drawn on the CPU.

Every evaluation of a run (before RL, during RL and after it) samples problem i's completion with the
same uniforms, whatever the device the model runs on (the CPU for the start model, ``learner.device``
for the learner's policy), the batch the problem falls in (``llm.eval_batch_size``) and the other
problems beside it. The evaluations then use common random numbers: a problem solved before and not
after changed because the policy changed, not the draws, which is what the paired interval of the
accuracy difference assumes (:func:`asyncrl.tasks.llm.heldout_eval.paired_difference`).

A ``torch.Generator`` on a CUDA device draws another stream than the CPU's from the same seed, and a
stream shared by a batch gives row r of a batch the draws of position r: both would break the pairing.
"""

from __future__ import annotations

import numpy as np
import torch

EVAL_STREAM = 0x65766131  # the spawn-key word of the evaluation's streams (apart from every actor stream)
DRAWS = "per-problem-cpu-v1"  # recorded with each evaluation; evaluations with other draws are not paired


def problem_seed(seed: int, index: int) -> int:
    """The 64-bit seed of problem ``index``'s stream: numpy SeedSequence(entropy=seed, spawn_key=
    (EVAL_STREAM, index)). Raises ValueError for a negative seed or index."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and problem index must be >= 0, got {seed}, {index}")
    return int(np.random.SeedSequence(entropy=seed, spawn_key=(EVAL_STREAM, index)).generate_state(1, np.uint64)[0])


def problem_uniforms(seed: int, n: int, steps: int, *, start: int = 0) -> torch.Tensor:
    """The uniforms of problems ``start`` .. ``start + n - 1``: [n, steps] float32 in [0, 1) on the CPU.

    Row i holds the first ``steps`` draws (one per decoding step) of a CPU ``torch.Generator`` seeded
    with :func:`problem_seed` (seed, start + i), so a problem's row does not depend on n, on the
    problems beside it, or on the device it is moved to afterwards; a longer ``steps`` extends each row.

    Raises:
        ValueError: n < 0, steps < 1, or as :func:`problem_seed`.
    """
    if n < 0 or steps < 1:
        raise ValueError(f"need n >= 0 problems and steps >= 1, got {n}, {steps}")
    out = torch.empty(n, steps)
    for i in range(n):
        out[i] = torch.rand(steps, generator=torch.Generator().manual_seed(problem_seed(seed, start + i)))
    return out
