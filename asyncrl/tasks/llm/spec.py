"""The slot of the llm task: whole prompt groups (R = prompts * G rows, prompt-major: row p * G + g),
fixed widths from the config so shared memory and the wire keep one layout.

Fields (S_p = prompt_tokens, L = completion_tokens):
  prompt_ids        [R, S_p] int64  left-padded prompt tokens (pad id where the mask is False)
  prompt_mask       [R, S_p] bool
  completion_ids    [R, L] int64    sampled tokens, EOS kept, padding after it
  completion_mask   [R, L] bool     True on completion tokens up to and including EOS
  policy_mask       [R, L] bool     True on the completion tokens the policy chose: completion_mask
                                    without the tokens a calculator wrote (the RL loss, ratios, TV
                                    estimate and token counts use this mask; attention uses completion_mask)
  behavior_log_prob [R, L] float32  log β of each sampled token (nats), 0 where policy_mask is False
  behavior_version  [R] int64       the policy version that generated the row (one per slot)
  rewards           [R] float32     the verifiable reward of the row's completion
  grant_id          [R] int64       audit tag, written last in each row (asyncrl.core.spec)

For the roles' counting a completion is a one-step episode: ``num_envs`` = R rows, ``rollout_length``
= 1, and ``env_steps`` counts completions (run.total_env_steps is a completion budget).
Pure numpy: no transformers here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncrl.core.spec import Field, SlotSpec


@dataclass(frozen=True)
class TokenSpec(SlotSpec):
    prompts: int  # P prompts per slot
    group_size: int  # G completions per prompt
    prompt_tokens: int  # S_p
    completion_tokens: int  # L
    vocab_size: int  # token ids must lie in 0..vocab_size-1

    def __post_init__(self):
        for name in ("prompts", "group_size", "prompt_tokens", "completion_tokens", "vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"TokenSpec.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def rows(self) -> int:
        return self.prompts * self.group_size

    @property
    def num_envs(self) -> int:
        return self.rows

    @property
    def rollout_length(self) -> int:
        return 1

    @property
    def fields(self) -> tuple[Field, ...]:
        R, S, L = self.rows, self.prompt_tokens, self.completion_tokens
        i64, f32, b = np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.bool_)
        return (
            Field("prompt_ids", (R, S), i64),
            Field("prompt_mask", (R, S), b),
            Field("completion_ids", (R, L), i64),
            Field("completion_mask", (R, L), b),
            Field("policy_mask", (R, L), b),
            Field("behavior_log_prob", (R, L), f32),
            Field("behavior_version", (R,), i64),
            Field("rewards", (R,), f32),
            Field("grant_id", (R,), i64),
        )

    @property
    def log_probabilities(self) -> bool:
        return True

    def to_dict(self) -> dict:
        return {
            "kind": "llm",
            "prompts": self.prompts,
            "group_size": self.group_size,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "vocab_size": self.vocab_size,
        }

    def episode_mismatch(self, arrays: dict[str, np.ndarray], returns: list[float], lengths: list[int]) -> str | None:
        """Every row is one episode whose return is its reward: the report must list exactly the
        slot's rewards (as float32), with lengths of 1..L completion tokens."""
        bad = super().episode_mismatch(arrays, returns, lengths)
        if bad is not None:
            return bad
        if len(returns) != self.rows:
            return f"{len(returns)} episode returns, the slot has {self.rows} rows"
        if any(n > self.completion_tokens for n in lengths):
            return f"an episode longer than {self.completion_tokens} completion tokens"
        if not np.array_equal(np.asarray(returns, np.float64).astype(np.float32), arrays["rewards"]):
            return "episode returns differ from the slot's rewards"
        return None

    def invalid_values(self, arrays: dict[str, np.ndarray]) -> tuple[str, str] | None:
        """("token", detail) for what no honest generator writes: token ids outside the vocabulary, a
        row whose first completion token is masked, policy_mask outside completion_mask, or a row
        without a policy token (the sampler draws every row's first token itself, even one cut at
        length 1 or ending in EOS at once; a calculator only writes after a policy token:
        asyncrl.tasks.llm.sampling.sample). A row without one would leave a minibatch of such rows
        no token to average over."""
        for name in ("prompt_ids", "completion_ids"):
            a = arrays[name]
            if a.min() < 0 or a.max() >= self.vocab_size:
                return "token", f"{name} {a.min()}..{a.max()} outside 0..{self.vocab_size - 1}"
        if not arrays["completion_mask"][:, 0].all():
            return "token", "a row without its first completion token"
        if (arrays["policy_mask"] & ~arrays["completion_mask"]).any():
            return "token", "policy_mask is True outside completion_mask"
        if not arrays["policy_mask"].any(axis=1).all():  # the sampler always chooses a row's first token
            n = int(np.count_nonzero(~arrays["policy_mask"].any(axis=1)))
            return "token", f"{n} rows without a policy token (nothing of them can be trained on)"
        return None
