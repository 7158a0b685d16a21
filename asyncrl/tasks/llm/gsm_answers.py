"""GSM8k-format answers: the final-answer parser, the verifiable reward, the calculator and the error
analysis of a completion against the reference solution.

The format is GSM8k's (Cobbe et al. 2021, arXiv:2110.14168; https://github.com/openai/grade-school-math):
a worked solution whose lines carry calculator annotations ``<<48/2=24>>`` and whose last line is
``#### <final number>``. The problems themselves (generator, splits, prompt text, JSONL files):
:mod:`asyncrl.tasks.llm.gsm_problems`.

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.tasks.llm.gsm_problems import Problem

ANSWER_MARKER = "####"


# A number after the marker: optional sign directly before the digits; either comma-grouped thousands
# ("1,234", "-12,345.5") or plain digits ("1234", "3.75"). A trailing "." is not a decimal point.
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")

# ---------------------------------------------------------------- final answer and reward


def parse_final_answer(text: str) -> Decimal | None:
    """The final number of a solution or model completion, or None when it has none.

    Exactly which number: the first number on the rest of the line that follows the FIRST ``####``
    in ``text``. Numbers elsewhere (the worked steps, a second ``####``, later lines) are ignored, and
    so is anything after that first number on the line ("#### 72 clips, 3 bags" gives 72).
    A number is an optional sign (``-``, ``+`` or the Unicode minus ``−``) written directly before
    its digits, then either comma-grouped thousands (``1,234``, ``12,345,678``) or plain digits, then
    an optional decimal part (``3.75``); a leading ``$`` or other non-digit text is skipped.
    "1,23" is not a grouped number: it reads as 1. A trailing period ends the number ("72." is 72).

    Args:
        text: any string (model output may be malformed).

    Returns:
        The number as an exact Decimal, or None when there is no ``####`` or no number after it on
        its line (malformed answers get reward 0, they do not raise).
    """
    at = text.find(ANSWER_MARKER)
    if at < 0:
        return None
    line = text[at + len(ANSWER_MARKER) :].split("\n", 1)[0]
    m = _NUMBER.search(line)
    if m is None:
        return None
    s = m.group(0).replace(",", "").replace("−", "-")
    try:
        return Decimal(s)
    except InvalidOperation:  # not reachable with the pattern above; kept so a bad pattern cannot crash a role
        return None


def reward(completion: str, target: Decimal | int) -> float:
    """Verifiable reward: 1.0 iff :func:`parse_final_answer` of ``completion`` equals ``target``.

    Equality is numeric and exact (Decimal): "72", "72.0", "+72" all match 72; "72.5" does not.

    Args:
        completion: model output (the text after the prompt).
        target: the problem's final number.

    Returns:
        1.0 or 0.0 (0.0 for completions without a parsable final answer).
    """
    got = parse_final_answer(completion)
    return 1.0 if got is not None and got == Decimal(target) else 0.0


# ---------------------------------------------------------------- calculator


class CalculatorError(ValueError):
    """An annotation expression the calculator does not evaluate (not numbers and + - * / ( ), or / 0)."""


_CALC_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|([-+*/()]))")


def calculate(expr: str) -> Fraction:
    """The exact value of an arithmetic expression: numbers, ``+ - * /``, parentheses, unary minus.

    A small recursive-descent parser (never ``eval``): the usual precedence (``*`` and ``/`` before
    ``+`` and ``-``, left to right), numbers are plain digits with an optional decimal part (``3``,
    ``0.25``, ``.5``; no thousands separators, no exponents), spaces are ignored.

    Args:
        expr: e.g. ``"48/2"`` or ``"(3+4)*2"``.

    Returns:
        The value as a fractions.Fraction (exact: ``1/3`` stays a third).

    Raises:
        CalculatorError: an empty or malformed expression, any other character, or a division by zero.
    """
    toks: list[str] = []
    pos, s = 0, expr.rstrip()
    while pos < len(s):
        m = _CALC_TOKEN.match(s, pos)
        if m is None:
            raise CalculatorError(f"cannot read {expr!r} at {pos}")
        toks.append(m.group(1) or m.group(2))
        pos = m.end()
    at = 0

    def peek() -> str | None:
        return toks[at] if at < len(toks) else None

    def take() -> str:
        nonlocal at
        at += 1
        return toks[at - 1]

    def atom() -> Fraction:
        t = peek()
        if t is None:
            raise CalculatorError(f"{expr!r} ends early")
        take()
        if t == "-":
            return -atom()
        if t == "+":
            return atom()
        if t == "(":
            v = sum_()
            if peek() != ")":
                raise CalculatorError(f"unbalanced parentheses in {expr!r}")
            take()
            return v
        if t in "*/)":
            raise CalculatorError(f"unexpected {t!r} in {expr!r}")
        return Fraction(t)

    def product() -> Fraction:
        v = atom()
        while peek() in ("*", "/"):
            op, rhs = take(), atom()
            if op == "/" and rhs == 0:
                raise CalculatorError(f"division by zero in {expr!r}")
            v = v * rhs if op == "*" else v / rhs
        return v

    def sum_() -> Fraction:
        v = product()
        while peek() in ("+", "-"):
            v = v + product() if take() == "+" else v - product()
        return v

    value = sum_()
    if at != len(toks):
        raise CalculatorError(f"unexpected {toks[at]!r} in {expr!r}")
    return value


def format_number(value: Fraction, *, places: int = 6) -> str:
    """How the calculator writes a value: an integer as digits (``-12``); otherwise a decimal rounded
    half-even to ``places`` decimals with trailing zeros dropped (``2.5``, ``0.333333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    q = (Decimal(value.numerator) / Decimal(value.denominator)).quantize(Decimal(1).scaleb(-places))
    text = format(q, "f").rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def calculator_completion(text: str) -> str | None:
    """What a calculator appends to a solution that has just opened an annotation and written ``=``.

    GSM8k's calculator (Cobbe et al. 2021, section 3.1 and appendix): when the text ends inside an open
    annotation ``<<expr=`` (the last ``<<`` has no ``>>`` after it and ``expr`` holds no ``=``), the
    value of ``expr`` and the closing ``>>`` are written for the model.

    Args:
        text: the completion so far.

    Returns:
        ``"<value>>>"`` (e.g. ``"24>>"`` for text ending in ``"<<48/2="``), or None when the text does
        not end in an open annotation's ``=`` or the expression is not one :func:`calculate` evaluates.
    """
    if not text.endswith("="):
        return None
    at = text.rfind("<<")
    if at < 0:
        return None
    expr = text[at + 2 : -1]
    if "=" in expr or ">>" in expr:
        return None
    try:
        return format_number(calculate(expr)) + ">>"
    except (ValueError, ArithmeticError):  # CalculatorError is a ValueError; Decimal overflow an ArithmeticError
        return None


# ---------------------------------------------------------------- error analysis

_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>=]*)>>")
_BINARY = re.compile(r"\s*(\d+)\s*([-+*/])\s*(\d+)\s*")

FIRST_ERRORS = (
    "correct",
    "setup: wrong op",
    "setup: wrong first operand",
    "setup: wrong second operand",
    "setup: malformed",
    "arithmetic",
    "stopped early",
    "extra steps",
    "final answer",
)


def first_error(problem: Problem, completion: str) -> tuple[str, int | None]:
    """Where a completion first leaves the reference solution, read from its calculator annotations.

    The k-th annotation ``<<expr=result>>`` of the completion is compared with the k-th of the
    reference answer, in order, until one differs:

    - ``setup: ...``: the expression differs. For a reference ``a<op>b``: ``wrong op`` if the
      completion's operator differs, else ``wrong first operand`` (the carried running value) if its
      first number differs, else ``wrong second operand`` (the number copied from the question);
      ``malformed`` if the completion's expression is not two whole numbers and an operator.
    - ``arithmetic``: same expression, wrong result (impossible with the calculator on).
    - ``stopped early``: fewer annotations than the reference.

    A completion with reward 1 is ``correct`` whatever its annotations. If every reference annotation
    is matched: ``extra steps`` when the completion has more, else ``final answer`` (the number after
    ``####`` was not copied right). Only the reference's annotations are needed, so this reads the generator's problems
    (and GSM8k's own, where a step's annotation may hold more than two numbers: those differ as
    ``setup: malformed`` or ``setup: wrong op``).

    Args:
        problem: the problem (its answer is the reference).
        completion: the model's text after the prompt.

    Returns:
        (category, step) with category one of :data:`FIRST_ERRORS` and step the 0-based index of the
        reference step where the error is (None for ``correct``, ``extra steps`` and ``final answer``).
    """
    if reward(completion, problem.target) == 1.0:
        return "correct", None
    ref, got = _ANNOTATION.findall(problem.answer), _ANNOTATION.findall(completion)
    for k, (r_expr, r_res) in enumerate(ref):
        if k >= len(got):
            return "stopped early", k
        g_expr, g_res = got[k]
        if g_expr.strip() != r_expr.strip():
            rm, gm = _BINARY.fullmatch(r_expr), _BINARY.fullmatch(g_expr)
            if rm is None or gm is None:
                return "setup: malformed", k
            if gm.group(2) != rm.group(2):
                return "setup: wrong op", k
            if int(gm.group(1)) != int(rm.group(1)):
                return "setup: wrong first operand", k
            return "setup: wrong second operand", k
        if g_res.strip() != r_res.strip():
            return "arithmetic", k
    return ("extra steps" if len(got) > len(ref) else "final answer"), None


def error_breakdown(problems: list[Problem], completions: list[str]) -> dict:
    """Accuracy by number of steps, step error rates by operation, and the first-error counts.

    Args:
        problems: the problems; completions: one model completion each (same order).

    Returns:
        {"accuracy": float, "n": int,
         "by_steps": {n_steps: [correct, total]},
         "by_op": {op: [errors, reached]}: a reference step "reached" when all earlier steps matched
             (:func:`first_error`), an error when the first error is at that step,
         "first_error": {category: count} in :data:`FIRST_ERRORS` order (zero counts left out)}.

    Raises:
        ValueError: lists of different lengths.
    """
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    by_steps: dict[int, list[int]] = {}
    by_op: dict[str, list[int]] = {}
    counts = dict.fromkeys(FIRST_ERRORS, 0)
    correct = 0
    for pr, text in zip(problems, completions):
        ref = _ANNOTATION.findall(pr.answer)
        ok = reward(text, pr.target) == 1.0
        correct += ok
        cell = by_steps.setdefault(len(ref), [0, 0])
        cell[0] += ok
        cell[1] += 1
        cat, at = first_error(pr, text)
        counts[cat] += 1
        reached = len(ref) if at is None else at + 1
        for k in range(reached):
            m = re.search(r"[-+*/]", ref[k][0])
            op = m.group(0) if m else "?"
            cell = by_op.setdefault(op, [0, 0])
            cell[1] += 1
            cell[0] += k == at
    return {
        "accuracy": correct / len(problems) if problems else 0.0,
        "n": len(problems),
        "by_steps": dict(sorted(by_steps.items())),
        "by_op": dict(sorted(by_op.items())),
        "first_error": {k: v for k, v in counts.items() if v},
    }
