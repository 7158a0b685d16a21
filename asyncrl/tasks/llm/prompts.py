"""Prompts as a model expects them, and the tokens that end its answer.

A :class:`PromptFormat` turns a question into prompt token ids (``llm.prompt_format``, docs/llm.md,
"Prompts"):

- ``plain``: ``"Question: <q>\\nAnswer:"`` (:func:`asyncrl.tasks.llm.gsm_problems.format_prompt`, the tiny
  model's format), after an optional system prompt and few-shot examples, each ``"Question: <q>\\nAnswer:
  <worked solution>"``, separated by blank lines.
- ``chat``: the tokenizer's own chat template (``apply_chat_template`` with ``add_generation_prompt``):
  an optional system message, then a user / assistant pair per few-shot example, then the question as
  the user's turn.
- ``auto``: ``chat`` when the tokenizer has a chat template, else ``plain``.

BOS: when the tokenizer puts a BOS token in front of what it encodes (its own ``add_special_tokens``
behaviour, as Llama's and Mistral's SentencePiece tokenizers do), the prompt starts with exactly one
BOS: added unless the rendered text (a chat template that writes ``{{ bos_token }}``) already starts
with it. Tokenizers that name a BOS token without adding it (GPT-2 style byte-level BPE, e.g. Qwen's
and SmolLM2's) get none, as with their own encoding. Other special tokens are never added: the text is
encoded with ``add_special_tokens=False``.

Stops (:func:`stop_ids`): the tokenizer's EOS, every ``eos_token_id`` of the model's
generation_config.json (a list for many instruct models) and the chat template's end-of-turn token
(``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``: the first special token the template writes after
an assistant message). The sampler ends a row on any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROMPT_FORMATS = ("auto", "plain", "chat")


class PromptError(ValueError):
    """A prompt the tokenizer's chat template will not render (message is one line)."""


def plain_text(question: str, *, system_prompt: str = "", few_shot: Sequence[tuple[str, str]] = ()) -> str:
    """The plain prompt of ``question``: ``"Question: <q>\\nAnswer:"``, after the system prompt and the
    few-shot (question, answer) pairs, all separated by a blank line (the question alone when there are none)."""
    parts = [system_prompt] if system_prompt else []
    parts += [f"Question: {q}\nAnswer: {a}" for q, a in few_shot]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def chat_messages(
    question: str, *, system_prompt: str = "", few_shot: Sequence[tuple[str, str]] = ()
) -> list[dict[str, str]]:
    """The conversation a chat template renders: [system], (user, assistant) per example, user."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for q, a in few_shot:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return messages + [{"role": "user", "content": question}]


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether ``tokenizer`` starts what it encodes (with special tokens) with its BOS token."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos


@dataclass(frozen=True)
class PromptFormat:
    """How questions become prompt token ids (see the module docstring).

    chat: render with the tokenizer's chat template (False: the plain format).
    system_prompt: '' for none.
    few_shot: (question, worked answer) pairs shown before the question, in order.
    bos_id: the BOS id every prompt starts with exactly once, or None (no BOS added).
    """

    chat: bool
    system_prompt: str = ""
    few_shot: tuple[tuple[str, str], ...] = ()
    bos_id: int | None = None

    def texts(self, tokenizer, questions: Sequence[str]) -> list[str]:
        """The prompt text of each question (special tokens of a chat template written out).

        Raises:
            PromptError: the chat template rejects the conversation (e.g. one without a system role).
        """
        kw = {"system_prompt": self.system_prompt, "few_shot": self.few_shot}
        if not self.chat:
            return [plain_text(q, **kw) for q in questions]
        from jinja2 import TemplateError

        try:
            out = tokenizer.apply_chat_template(
                [chat_messages(q, **kw) for q in questions], tokenize=False, add_generation_prompt=True
            )
        except TemplateError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            what = " (with a system prompt: leave llm.system_prompt empty)" if self.system_prompt else ""
            raise PromptError(f"the tokenizer's chat template rejects the prompt{what}: {first}") from None
        return list(out)

    def encode(self, tokenizer, questions: Sequence[str]) -> list[list[int]]:
        """Prompt token ids of each question: :meth:`texts` encoded without added special tokens, then
        ``bos_id`` in front where the text does not already start with it (never twice).

        Raises:
            PromptError: as :meth:`texts`.
        """
        if not questions:
            return []
        ids = tokenizer(self.texts(tokenizer, questions), add_special_tokens=False)["input_ids"]
        if self.bos_id is None:
            return [list(x) for x in ids]
        return [list(x) if x[:1] == [self.bos_id] else [self.bos_id, *x] for x in ids]

    def describe(self) -> dict:
        """The format as JSON-able values (cache keys, llm-start.json)."""
        return {
            "chat": self.chat,
            "system_prompt": self.system_prompt,
            "few_shot": [list(x) for x in self.few_shot],
            "bos_id": self.bos_id,
        }


def make_format(
    tokenizer, style: str = "auto", *, system_prompt: str = "", few_shot: Sequence[tuple[str, str]] = ()
) -> PromptFormat:
    """The :class:`PromptFormat` of ``style`` (one of :data:`PROMPT_FORMATS`) for ``tokenizer``.

    Raises:
        ValueError: an unknown style.
        PromptError: style ``chat`` for a tokenizer without a chat template.
    """
    if style not in PROMPT_FORMATS:
        raise ValueError(f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {style!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if style == "chat" and not has_template:
        raise PromptError("prompt format 'chat', but the tokenizer has no chat template (use plain or auto)")
    return PromptFormat(
        chat=style == "chat" or (style == "auto" and has_template),
        system_prompt=system_prompt,
        few_shot=tuple((q, a) for q, a in few_shot),
        bos_id=tokenizer.bos_token_id if tokenizer_adds_bos(tokenizer) else None,
    )


_MARK = "ANSWER"  # an assistant message whose end the template is asked to write


def end_of_turn_id(tokenizer) -> int | None:
    """The token a chat template writes after an assistant message (``<|im_end|>`` in ChatML), or None.

    Renders a user / assistant exchange and returns the first token after the assistant's text if it
    is a special token (whitespace tokens before it are skipped; any other text means there is none).
    None for a tokenizer without a chat template or one that rejects the exchange.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _MARK}], tokenize=False
        )
    except TemplateError:
        return None
    at = text.rfind(_MARK)
    if at < 0:
        return None
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for i in tokenizer(text[at + len(_MARK) :], add_special_tokens=False)["input_ids"]:
        if i in special:
            return int(i)
        if tokenizer.decode([i]).strip():
            return None
    return None


def stop_ids(tokenizer, generation_eos: int | Sequence[int] | None = None) -> tuple[int, ...]:
    """Every token id that ends a completion: the tokenizer's EOS, then ``generation_eos`` (the model's
    generation_config.json ``eos_token_id``: an id or a list), then :func:`end_of_turn_id`; each once,
    in that order.

    Raises:
        PromptError: none at all (a tokenizer without EOS and no generation config naming one).
    """
    ids: list[int] = []
    extra = generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
    for i in [tokenizer.eos_token_id, *extra, end_of_turn_id(tokenizer)]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise PromptError("no stop token: the tokenizer has no EOS token and generation_config.json names none")
    return tuple(ids)
