"""Reward parsing options (asyncrl.tasks.llm.answer_formats): GSM8k's '####', the last number and
\\boxed{}, strict and lenient, on real-format and malformed completions."""

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.tasks.llm import answer_formats, gsm_answers
from asyncrl.tasks.llm.answer_formats import extract_answer, reward

DATA = Path(__file__).parent / "data"

# What instruct models write (own text in the styles of GSM8k solutions, MATH-style boxes and prose).
REAL = {
    "gsm8k": "She bakes 6*14 = <<6*14=84>>84 rolls.\nAfter the morning 84-59 = <<84-59=25>>25 are left.\n#### 25",
    "boxed": "First, $6 \\times 14 = 84$ rolls. Then $84 - 59 = 25$.\n\nThe answer is $\\boxed{25}$.",
    "prose": "She bakes 84 rolls and sells 59, so she has 25 rolls left.",
}


@pytest.mark.parametrize(
    "text, fmt, strict, expected",
    [
        (REAL["gsm8k"], "gsm8k", True, 25),
        (REAL["gsm8k"], "boxed", True, None),  # no box: strict gives nothing
        (REAL["gsm8k"], "boxed", False, 25),  # lenient: the last number
        (REAL["gsm8k"], "last_number", True, 25),
        (REAL["boxed"], "boxed", True, 25),
        (REAL["boxed"], "gsm8k", True, None),
        (REAL["boxed"], "gsm8k", False, 25),
        (REAL["boxed"], "last_number", True, 25),
        (REAL["prose"], "gsm8k", True, None),
        (REAL["prose"], "gsm8k", False, 25),
        (REAL["prose"], "boxed", False, 25),
        (REAL["prose"], "last_number", False, 25),
    ],
)
def test_each_format_on_real_format_answers(text, fmt, strict, expected):
    got = extract_answer(text, fmt, strict=strict)
    assert got == (None if expected is None else Fraction(expected))
    assert reward(text, 25, answer_format=fmt, strict=strict) == (1.0 if expected == 25 else 0.0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{72}", 72),
        ("\\boxed {72}", 72),
        ("\\fbox{72}", 72),
        ("\\boxed{\\frac{144}{2}}", 72),  # nested braces: the whole fraction
        ("\\boxed{\\dfrac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{-\\frac{1}{2}}", Fraction(-1, 2)),
        ("\\boxed{\\$1{,}234}", 1234),  # LaTeX thousands separator, escaped dollar
        ("\\boxed{1\\,234}", 1234),  # thin space
        ("\\boxed{72 \\text{ apples}}", 72),
        ("\\boxed{\\text{72}}", 72),
        ("\\boxed{3} then \\boxed{5}", 5),  # the last box
        ("\\boxed{\\boxed{7}}", 7),
        ("\\boxed{72.50}", Fraction(145, 2)),
        ("\\boxed{}", None),
        ("\\boxed{x+y}", None),
        ("\\boxed{72", None),  # cut before the box closed
        ("\\boxed{2\\frac{1}{2}}", None),  # a mixed number is not read as 2
        ("\\boxed{\\frac{1}{0}}", None),
        ("\\boxed{\\frac12}", None),
        ("boxed{72}", None),  # no backslash: not a box
        ("the answer is 72", None),
    ],
)
def test_boxed_strict(text, expected):
    assert answer_formats.boxed_answer(text) == (None if expected is None else Fraction(expected))
    assert extract_answer(text, "boxed", strict=True) == answer_formats.boxed_answer(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 72.", 72),
        ("1,234 apples", 1234),
        ("from 3 to -5", -5),
        ("$12.50 each", Fraction(25, 2)),
        ("5 and 6, total 11 dollars", 11),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_last_number(text, expected):
    assert answer_formats.last_number(text) == (None if expected is None else Fraction(expected))
    for strict in (True, False):  # last_number is the same either way
        assert extract_answer(text, "last_number", strict=strict) == answer_formats.last_number(text)


def test_lenient_falls_back_only_when_the_named_format_gives_nothing():
    text = "#### 12\nchecking: 3 + 4 = 7"
    assert extract_answer(text, "gsm8k", strict=False) == 12  # the marker's number, not the last one
    assert extract_answer("#### twelve\n3*4 = 12", "gsm8k", strict=False) == 12  # a marker line without a number
    assert extract_answer("\\boxed{x} = 9", "boxed", strict=False) == 9
    assert extract_answer("\\boxed{4} = 9", "boxed", strict=False) == 4


def test_gsm8k_strict_is_the_original_reward():
    for line in (DATA / "gsm-own-train.jsonl").read_text().splitlines():
        answer = json.loads(line)["answer"]
        target = gsm_answers.parse_final_answer(answer)
        assert reward(answer, target) == gsm_answers.reward(answer, target) == 1.0
        assert reward(answer, target + 1) == gsm_answers.reward(answer, target + 1) == 0.0


def test_unknown_format_raises():
    with pytest.raises(ValueError, match="answer_format must be one of gsm8k, boxed, last_number"):
        extract_answer("#### 1", "hash")


TEXT = st.text(alphabet=st.sampled_from(list("0123456789 -+,.$#{}\\boxedfrac\n")) | st.characters(), max_size=80)


@given(TEXT, st.sampled_from(answer_formats.ANSWER_FORMATS), st.booleans())
def test_malformed_text_never_raises_and_reward_is_0_or_1(text, fmt, strict):
    got = extract_answer(text, fmt, strict=strict)
    assert got is None or isinstance(got, Fraction)
    assert reward(text, 7, answer_format=fmt, strict=strict) in (0.0, 1.0)
    if strict and fmt == "gsm8k":
        assert reward(text, 7) == gsm_answers.reward(text, 7)


@given(st.text(max_size=40).filter(lambda s: "####" not in s), st.integers(-(10**6), 10**6), st.text(max_size=20))
def test_a_stated_answer_is_found_in_every_format(prefix, n, words):
    words = "".join(c for c in words if not c.isdigit() and c not in "#\\\n")
    assert extract_answer(f"{prefix}\n#### {n} {words}", "gsm8k") == n
    assert extract_answer(f"{prefix} \\boxed{{{n}}} {words}", "boxed") == n
    assert extract_answer(f"{prefix} so the answer is {n}{words}", "last_number") == n
    assert reward(f"{prefix}\n#### {n:,}", Decimal(n)) == 1.0  # comma-grouped thousands


@given(st.integers(0, 10**4), st.integers(1, 10**4))
def test_boxed_fractions_are_exact(a, b):
    assert answer_formats.boxed_answer(f"\\boxed{{\\frac{{{a}}}{{{b}}}}}") == Fraction(a, b)
