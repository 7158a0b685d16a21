"""GSM8k-format arithmetic word problems: generator, train / held-out split, prompt and completion text,
JSONL loader.

The format is GSM8k's (Cobbe et al. 2021, arXiv:2110.14168; https://github.com/openai/grade-school-math):
one JSON object per line, ``{"question": str, "answer": str}``, where the answer is a worked solution
whose lines carry calculator annotations ``<<48/2=24>>`` and whose last line is ``#### <final number>``
(its parser, the reward and the calculator: :mod:`asyncrl.tasks.llm.gsm_answers`).

The generator writes problems of that shape from a seed: a short story of two to four arithmetic steps
(``steps`` sets the range; llm.problem_steps_min / _max) (+, -, *, / with exact division) on whole
numbers below 1,000 (every operand, intermediate and final
result is in [1, 999]); operands lean small (one digit half of the time) so that a tiny model can learn
some of them quickly, and the mix of easy and hard problems gives GRPO groups with mixed rewards.

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from asyncrl.tasks.llm.gsm_answers import ANSWER_MARKER, parse_final_answer

GENERATOR_VERSION = 1  # bump when generated text changes: it keys the cached tokenizer / model directories
MAX_NUMBER = 999
DEFAULT_STEPS = (2, 4)  # arithmetic steps per generated problem (fewest, most)
MAX_STEPS = 8
HELDOUT_PERCENT = 10  # share of all possible questions that belong to the held-out split (by hash)


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


def generate_problem(rng: random.Random, steps: tuple[int, int] = DEFAULT_STEPS) -> Problem:
    """One problem of ``steps[0]`` to ``steps[1]`` steps (2 to 4 by default) drawn from ``rng`` (see the
    module docstring for the distribution).

    Args:
        rng: a seeded random.Random (the only source of randomness).
        steps: (fewest, most) arithmetic steps, 1 <= fewest <= most (checked by :func:`make_splits`).

    Returns:
        A :class:`Problem` whose answer has one line per step, each ``<text> a<op>b = <<a<op>b=r>>r
        <item>.``, then ``#### r``.
    """
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    pron, obj = rng.choice([("she", "her"), ("he", "him")])
    value = _operand(rng)
    n_steps = rng.randint(*steps)
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


def make_splits(*, seed: int, n_train: int, n_heldout: int = 500, steps: tuple[int, int] = DEFAULT_STEPS) -> Splits:
    """Deterministic train / held-out split of generated problems.

    Problems are drawn from one random.Random(seed) stream; each new question (duplicates skipped)
    goes to the split :func:`is_heldout` names until that split is full. The same arguments give the
    same lists on every machine and Python version (random.Random's generator is specified).

    Args:
        seed: any int.
        n_train: >= 0, problems in the train split.
        n_heldout: >= 0, problems in the held-out split (500 by default, the floor the RL runs use).
        steps: (fewest, most) arithmetic steps per problem, 1 <= fewest <= most <= MAX_STEPS (an easier
            task for a model that scores near 0 on the default 2 to 4).

    Returns:
        :class:`Splits`.

    Raises:
        ValueError: a negative count, or steps out of range.
    """
    if n_train < 0 or n_heldout < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_heldout={n_heldout}")
    if not 1 <= steps[0] <= steps[1] <= MAX_STEPS:
        raise ValueError(f"steps must satisfy 1 <= fewest <= most <= {MAX_STEPS}, got {tuple(steps)}")
    rng = random.Random(seed)
    seen: set[str] = set()
    train: list[Problem] = []
    heldout: list[Problem] = []
    while len(train) < n_train or len(heldout) < n_heldout:
        pr = generate_problem(rng, steps)
        if pr.question in seen:
            continue
        seen.add(pr.question)
        dest, cap = (heldout, n_heldout) if is_heldout(pr.question) else (train, n_train)
        if len(dest) < cap:
            dest.append(pr)
    return Splits(train, heldout)
