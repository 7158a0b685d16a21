"""Where a completion states its final answer, and the verifiable reward under each answer format
(``llm.answer_format``, ``llm.answer_strict``; docs/llm.md, "Answers").

Formats:

- ``gsm8k``: the first number on the line after the first ``####`` (GSM8k's own marker, Cobbe et al.
  2021, arXiv:2110.14168; :func:`asyncrl.tasks.llm.gsm_answers.parse_final_answer`, unchanged).
- ``boxed``: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched so that
  ``\\boxed{\\frac{1}{2}}`` is read whole (the MATH data set's convention, Hendrycks et al. 2021,
  arXiv:2103.03874, and what instruct models trained on it write).
- ``last_number``: the last number anywhere in the completion (the common fallback for models that
  answer in prose, e.g. "... so she has 72 apples.").

Strict (``strict=True``): only the named format counts; a completion without it has no answer (reward
0). Lenient: when the named format gives no number, the last number of the completion is taken
instead. ``last_number`` is the same either way.

Numbers are read as :func:`~asyncrl.tasks.llm.gsm_answers.parse_final_answer` reads them (a sign
touching the digits, comma-grouped thousands, an optional decimal part; ``$`` and words skipped);
inside ``\\boxed{}`` also LaTeX's ``{,}`` thousands separator, thin spaces (``\\,``, ``\\!``) and
``\\frac{a}{b}`` / ``\\dfrac`` / ``\\tfrac`` (an exact fraction). Values are exact
(:class:`fractions.Fraction`), so ``72``, ``72.0`` and ``\\frac{144}{2}`` all equal 72.

Pure Python: no torch, no transformers. Malformed text never raises: it has no answer.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from asyncrl.tasks.llm.gsm_answers import _NUMBER, parse_final_answer

ANSWER_FORMATS = ("gsm8k", "boxed", "last_number")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}$")


def _number(text: str) -> Fraction | None:
    """The number a matched ``_NUMBER`` string stands for (commas and the Unicode minus normalised)."""
    return Fraction(Decimal(text.replace(",", "").replace("−", "-")))


def last_number(text: str) -> Fraction | None:
    """The last number in ``text`` (as :func:`gsm_answers.parse_final_answer` reads one), or None.

    "72." is 72, "1,234" is 1234, "-5" is -5; "x2" reads 2 (digits need no word boundary).
    """
    matches = _NUMBER.findall(text)
    return _number(matches[-1]) if matches else None


def boxed_content(text: str) -> str | None:
    """The text inside the last ``\\boxed{...}`` / ``\\fbox{...}`` of ``text``, braces balanced, or None
    when there is none or the last one is never closed (a completion cut mid-answer)."""
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    depth, at = 1, starts[-1]
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[at:i]
    return None


def boxed_answer(text: str) -> Fraction | None:
    """The number in the last ``\\boxed{}`` of ``text``, or None (no box, an unclosed one, or no number).

    A whole ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``, with a leading ``-``) is the exact a / b;
    otherwise the first number in the box after LaTeX's ``{,}`` separators and thin spaces are
    removed (``\\boxed{\\$1{,}234}`` is 1234, ``\\boxed{72 \\text{ apples}}`` is 72). Any other box
    with ``frac`` in it (``2\\frac{1}{2}``, ``\\frac12``) has no answer rather than a wrong first number.
    """
    content = boxed_content(text)
    if content is None:
        return None
    content = content.replace("{,}", ",").replace("\\,", "").replace("\\!", "").replace("\\ ", " ").strip()
    frac = _FRAC.match(content.replace(" ", ""))
    if frac is not None:
        num, den = _NUMBER.fullmatch(frac.group(2)), _NUMBER.fullmatch(frac.group(3))
        if num is None or den is None or _number(den.group(0)) == 0:
            return None
        value = _number(num.group(0)) / _number(den.group(0))
        return -value if frac.group(1) else value
    if "frac" in content:  # a mixed number or \frac12: not read (a first number would be a wrong one)
        return None
    m = _NUMBER.search(content)
    return _number(m.group(0)) if m else None


def extract_answer(text: str, answer_format: str = "gsm8k", *, strict: bool = True) -> Fraction | None:
    """The final answer ``text`` states in ``answer_format`` (see the module docstring), or None.

    Args:
        text: a model completion or a reference solution (any string).
        answer_format: one of :data:`ANSWER_FORMATS`.
        strict: True: only that format counts; False: the last number of ``text`` when the format
            gives none.

    Returns:
        The answer as an exact Fraction, or None.

    Raises:
        ValueError: an unknown answer_format.
    """
    if answer_format == "gsm8k":
        got = parse_final_answer(text)
        value = None if got is None else Fraction(got)
    elif answer_format == "boxed":
        value = boxed_answer(text)
    elif answer_format == "last_number":
        return last_number(text)
    else:
        raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
    return value if value is not None or strict else last_number(text)


def reward(completion: str, target: Decimal | int, *, answer_format: str = "gsm8k", strict: bool = True) -> float:
    """Verifiable reward: 1.0 iff :func:`extract_answer` of ``completion`` equals ``target`` exactly.

    With the defaults (``gsm8k``, strict) this is :func:`asyncrl.tasks.llm.gsm_answers.reward`.

    Args:
        completion: model output (the text after the prompt).
        target: the problem's final number.
        answer_format, strict: as :func:`extract_answer`.

    Returns:
        1.0 or 0.0 (0.0 when the completion states no answer).

    Raises:
        ValueError: an unknown answer_format.
    """
    got = extract_answer(completion, answer_format, strict=strict)
    return 1.0 if got is not None and got == Fraction(Decimal(target)) else 0.0
