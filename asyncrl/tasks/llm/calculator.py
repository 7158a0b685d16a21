"""GSM8k's calculator in the sampler (Cobbe et al. 2021, arXiv:2110.14168): :class:`Calculator` writes
the value of each annotation ``<<expr=`` a row opens (asyncrl.tasks.llm.sampling's module docstring says
how those tokens are masked); :func:`calculator_for` caches one per tokenizer."""

from __future__ import annotations

import weakref

import torch

from asyncrl.tasks.llm import gsm_answers


class Calculator:
    """Inserts the value of each annotation ``<<expr=`` a row writes (asyncrl.tasks.llm.sampling says how).

    Built once per tokenizer: it precomputes which vocabulary tokens end in ``=`` (the only tokens
    after which a row is decoded and checked). The inserted text is ``"<value>>>"`` tokenised on its
    own (digits are single tokens, so it tokenises as in the training text).

    Args:
        tokenizer: the model's tokenizer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = range(len(tokenizer))
        self.trigger_ids = torch.tensor([i for i in vocab if tokenizer.decode([i]).endswith("=")], dtype=torch.long)

    def insert(self, completion_ids: list[int]) -> list[int]:
        """The token ids to insert after ``completion_ids`` (a row's completion so far), or []."""
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        tail = gsm_answers.calculator_completion(text)
        return [] if tail is None else self.tokenizer(tail, add_special_tokens=False)["input_ids"]


_CALCULATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def calculator_for(tokenizer) -> Calculator:
    """The :class:`Calculator` of ``tokenizer``, built on first use and cached while the tokenizer lives."""
    calc = _CALCULATORS.get(tokenizer)
    if calc is None:
        calc = _CALCULATORS[tokenizer] = Calculator(tokenizer)
    return calc
