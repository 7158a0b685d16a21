"""GSM8k-format arithmetic word problems: generator, split, final-answer parser, reward, JSONL loader.

The format is GSM8k's (Cobbe et al. 2021, arXiv:2110.14168; https://github.com/openai/grade-school-math):
one JSON object per line, ``{"question": str, "answer": str}``, where the answer is a worked solution
whose lines carry calculator annotations ``<<48/2=24>>`` and whose last line is ``#### <final number>``.

The generator writes problems of that shape from a seed: a short story of two to four arithmetic steps
(+, -, *, / with exact division) on whole numbers below 1,000 (every operand, intermediate and final
result is in [1, 999]); operands lean small (one digit half of the time) so that a tiny model can learn
some of them quickly, and the mix of easy and hard problems gives GRPO groups with mixed rewards.

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

GENERATOR_VERSION = 1  # bump when generated text changes: it keys the cached tokenizer / model directories
ANSWER_MARKER = "####"
MAX_NUMBER = 999
HELDOUT_PERCENT = 10  # share of all possible questions that belong to the held-out split (by hash)

# A number after the marker: optional sign directly before the digits; either comma-grouped thousands
# ("1,234", "-12,345.5") or plain digits ("1234", "3.75"). A trailing "." is not a decimal point.
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


class GSMFormatError(ValueError):
    """A GSM8k JSONL file or answer that does not have the expected format (message is one line)."""


@dataclass(frozen=True)
class Problem:
    """One word problem.

    question: the question text (no trailing newline).
    answer: the worked solution, GSM8k style, ending with a line ``#### <final>``.
    target: the final number (exact, from the answer's marker line).
    """

    question: str
    answer: str
    target: Decimal


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


# ---------------------------------------------------------------- prompt / completion text


def format_prompt(problem: Problem) -> str:
    """The text a model is conditioned on: ``"Question: <question>\\nAnswer:"``."""
    return f"Question: {problem.question}\nAnswer:"


def format_completion(problem: Problem) -> str:
    """The supervised completion for :func:`format_prompt`: a space, then the worked solution (no EOS)."""
    return " " + problem.answer


# ---------------------------------------------------------------- JSONL loader


def load_jsonl(path: str | Path) -> list[Problem]:
    """Load a GSM8k JSONL file (``{"question": ..., "answer": ...}`` per line; blank lines skipped).

    Extra keys on a line are ignored. Answers keep their calculator annotations.

    Args:
        path: the file, e.g. GSM8k's grade_school_math/data/test.jsonl.

    Returns:
        The problems in file order.

    Raises:
        FileNotFoundError: no such file (one-line message).
        GSMFormatError: a line that is not a JSON object with string "question" and "answer", or whose
            answer has no ``#### <number>``; the message names the file and the 1-based line number.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"GSM8k file not found: {p}")
    problems = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise GSMFormatError(f"{p}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise GSMFormatError(f"{p}:{n}: expected a JSON object, got {type(obj).__name__}")
            for key in ("question", "answer"):
                if not isinstance(obj.get(key), str):
                    raise GSMFormatError(f"{p}:{n}: missing string field {key!r}")
            target = parse_final_answer(obj["answer"])
            if target is None:
                raise GSMFormatError(f"{p}:{n}: answer has no final '#### <number>' line")
            problems.append(Problem(obj["question"].strip(), obj["answer"].strip(), target))
    return problems


def dump_jsonl(problems: list[Problem], path: str | Path) -> None:
    """Write problems in GSM8k's JSONL format (readable back by :func:`load_jsonl`)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for pr in problems:
            f.write(json.dumps({"question": pr.question, "answer": pr.answer}) + "\n")


# ---------------------------------------------------------------- generator

_NAMES = [
    "Natalia",
    "Tom",
    "Aisha",
    "Ben",
    "Carla",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kofi",
    "Lena",
    "Marco",
    "Nadia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
    "Umar",
    "Vera",
]
_ITEMS = [
    "apples",
    "marbles",
    "stickers",
    "cookies",
    "books",
    "pencils",
    "shells",
    "stamps",
    "cards",
    "eggs",
    "flowers",
    "coins",
    "beads",
    "balloons",
    "toys",
    "candles",
]


def _operand(rng: random.Random) -> int:
    """An operand in [1, 999]: one digit half of the time, two digits 35 %, three digits 15 %."""
    u = rng.random()
    if u < 0.5:
        return rng.randint(1, 9)
    if u < 0.85:
        return rng.randint(10, 99)
    return rng.randint(100, MAX_NUMBER)


def _step(rng: random.Random, value: int) -> tuple[str, int, int] | None:
    """One operation on ``value``: (op, operand, result) with the result in [1, 999], or None."""
    op = rng.choice("+-*/")
    if op == "+":
        n = _operand(rng)
        return ("+", n, value + n) if value + n <= MAX_NUMBER else None
    if op == "-":
        n = _operand(rng)
        return ("-", n, value - n) if value - n >= 1 else None
    if op == "*":
        ks = [k for k in range(2, 10) if value * k <= MAX_NUMBER]
        if not ks:
            return None
        k = rng.choice(ks)
        return ("*", k, value * k)
    ks = [k for k in range(2, 10) if value % k == 0]
    if not ks:
        return None
    k = rng.choice(ks)
    return ("/", k, value // k)


_STORY = {
    "+": ["{P} buys {n} more.", "A friend gives {o} {n} more.", "{P} finds {n} more."],
    "-": ["{P} gives {n} to a friend.", "{P} loses {n}.", "{P} uses {n}."],
    "*": ["{P} then gets {n} times as many as {p} has.", "The number of {item} becomes {n} times as large."],
    "/": [
        "{P} splits them equally into {n} bags and keeps one bag.",
        "{P} shares them equally among {n} kids, keeping one share.",
    ],
}
_SOLUTION = {
    "+": "After getting more, {name} has",
    "-": "After giving some away, {name} has",
    "*": "After that, {name} has",
    "/": "After sharing, {name} has",
}


def generate_problem(rng: random.Random) -> Problem:
    """One problem of 2 to 4 steps drawn from ``rng`` (see the module docstring for the distribution).

    Args:
        rng: a seeded random.Random (the only source of randomness).

    Returns:
        A :class:`Problem` whose answer has one line per step, each ``<text> a<op>b = <<a<op>b=r>>r
        <item>.``, then ``#### r``.
    """
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    pron, obj = rng.choice([("she", "her"), ("he", "him")])
    value = _operand(rng)
    n_steps = rng.randint(2, 4)
    story = [f"{name} has {value} {item}."]
    solution = []
    while len(solution) < n_steps:
        step = _step(rng, value)
        if step is None:
            continue
        op, n, result = step
        story.append(rng.choice(_STORY[op]).format(P=pron.capitalize(), p=pron, o=obj, n=n, item=item))
        expr = f"{value}{op}{n}"
        solution.append(f"{_SOLUTION[op].format(name=name)} {expr} = <<{expr}={result}>>{result} {item}.")
        value = result
    question = " ".join(story) + f" How many {item} does {name} have now?"
    answer = "\n".join(solution) + f"\n{ANSWER_MARKER} {value}"
    return Problem(question, answer, Decimal(value))


def is_heldout(question: str) -> bool:
    """Whether a question belongs to the held-out split: by a hash of its text, so the split of a
    question never depends on the seed or on how many problems were drawn (about 10 % are held out)."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


@dataclass(frozen=True)
class Splits:
    """train and heldout: disjoint lists of problems (no question text appears in both)."""

    train: list[Problem]
    heldout: list[Problem]


def make_splits(*, seed: int, n_train: int, n_heldout: int = 500) -> Splits:
    """Deterministic train / held-out split of generated problems.

    Problems are drawn from one random.Random(seed) stream; each new question (duplicates skipped)
    goes to the split :func:`is_heldout` names until that split is full. The same arguments give the
    same lists on every machine and Python version (random.Random's generator is specified).

    Args:
        seed: any int.
        n_train: >= 0, problems in the train split.
        n_heldout: >= 0, problems in the held-out split (500 by default, the floor the RL runs use).

    Returns:
        :class:`Splits`.

    Raises:
        ValueError: a negative count.
    """
    if n_train < 0 or n_heldout < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_heldout={n_heldout}")
    rng = random.Random(seed)
    seen: set[str] = set()
    train: list[Problem] = []
    heldout: list[Problem] = []
    while len(train) < n_train or len(heldout) < n_heldout:
        pr = generate_problem(rng)
        if pr.question in seen:
            continue
        seen.add(pr.question)
        dest, cap = (heldout, n_heldout) if is_heldout(pr.question) else (train, n_train)
        if len(dest) < cap:
            dest.append(pr)
    return Splits(train, heldout)


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
