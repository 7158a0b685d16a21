"""GSM8k-format task data: final-answer parser and reward, generator, split, JSONL loader."""

import json
import re
from decimal import Decimal
from fractions import Fraction

import pytest

from asyncrl.tasks.llm import gsm_answers, gsm_problems


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", Decimal(72)),
        ("#### -5", Decimal(-5)),
        ("#### −5", Decimal(-5)),  # Unicode minus
        ("#### +7", Decimal(7)),
        ("#### 1,234", Decimal(1234)),
        ("#### 12,345,678", Decimal(12345678)),
        ("#### $1,234.50 in total", Decimal("1234.50")),
        ("#### 3.75", Decimal("3.75")),
        ("#### 72.", Decimal(72)),  # a trailing period is not a decimal point
        ("#### 72 clips, 3 bags", Decimal(72)),  # extra numbers after the first are ignored
        ("#### 1,23", Decimal(1)),  # not a thousands group: reads as 1
        ("steps 5 and 6\n#### 11\n#### 12", Decimal(11)),  # the first marker wins; numbers before it ignored
        ("####72", Decimal(72)),
        ("the answer is 72", None),  # no marker
        ("#### ", None),
        ("#### seventy-two", None),
        ("####\n72", None),  # the number must be on the marker's line
        ("", None),
        ("#### - 5", Decimal(5)),  # a sign must touch the digits
    ],
)
def test_parse_final_answer(text, expected):
    assert gsm_answers.parse_final_answer(text) == expected


def test_reward_exact_numeric_match():
    assert gsm_answers.reward(" blah\n#### 72", 72) == 1.0
    assert gsm_answers.reward("#### 72.0", Decimal(72)) == 1.0
    assert gsm_answers.reward("#### 72.5", 72) == 0.0
    assert gsm_answers.reward("#### -72", 72) == 0.0
    assert gsm_answers.reward("72", 72) == 0.0  # malformed: no marker, reward 0
    assert gsm_answers.reward("#### 1,234", 1234) == 1.0


_ANNOT = re.compile(r"(\d+)([-+*/])(\d+) = <<\1\2\3=(\d+)>>(\d+)")


def test_generated_problems_have_gsm8k_shape_and_correct_arithmetic():
    splits = gsm_problems.make_splits(seed=3, n_train=300, n_heldout=50)
    for p in splits.train + splits.heldout:
        lines = p.answer.split("\n")
        assert 2 <= len(lines) - 1 <= 4 and lines[-1] == f"#### {p.target}"
        value = None
        for line in lines[:-1]:
            m = _ANNOT.search(line)
            assert m, line
            a, op, b, r, r2 = m.groups()
            assert r == r2
            a, b, r = int(a), int(b), int(r)
            assert {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == r
            assert value is None or value == a
            value = r
            assert all(1 <= x <= 999 for x in (a, b, r))
        assert Decimal(value) == p.target == gsm_answers.parse_final_answer(p.answer)
        assert all(int(n) < 1000 for n in re.findall(r"\d+", p.question))


def test_split_is_deterministic_disjoint_and_keyed_by_question():
    a = gsm_problems.make_splits(seed=7, n_train=400, n_heldout=500)
    b = gsm_problems.make_splits(seed=7, n_train=400, n_heldout=500)
    assert a == b and len(a.train) == 400 and len(a.heldout) == 500
    assert not {p.question for p in a.train} & {p.question for p in a.heldout}
    assert all(gsm_problems.is_heldout(p.question) for p in a.heldout)
    assert not any(gsm_problems.is_heldout(p.question) for p in a.train)
    assert gsm_problems.make_splits(seed=8, n_train=50, n_heldout=0).train != a.train[:50]
    with pytest.raises(ValueError, match="must be >= 0"):
        gsm_problems.make_splits(seed=0, n_train=-1)


def _fixture(path, lines):
    path.write_text("".join(lines), encoding="utf-8")
    return path


# Lines in GSM8k's own format: calculator annotations, several steps, a comma-grouped final answer,
# a dollar amount, extra keys, a blank line.
GSM_LINES = [
    json.dumps(
        {
            "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
            "clips in May. How many clips did Natalia sell altogether in April and May?",
            "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
            "clips altogether in April and May.\n#### 72",
        }
    )
    + "\n",
    json.dumps(
        {
            "question": "A shop sells 4 bikes at $400 each. How much money does it make?",
            "answer": "4 bikes cost 4*400 = $<<4*400=1600>>1,600.\n#### 1,600",
            "id": 2,
        }
    )
    + "\n",
    "\n",
    json.dumps(
        {
            "question": "The temperature was 3 degrees and fell by 8. What is it now? ",
            "answer": "3-8 = <<3-8=-5>>-5\n#### -5",
        }
    )
    + "\n",
]


def test_load_jsonl_reads_gsm8k_format(tmp_path):
    problems = gsm_problems.load_jsonl(_fixture(tmp_path / "test.jsonl", GSM_LINES))
    assert [p.target for p in problems] == [Decimal(72), Decimal(1600), Decimal(-5)]
    assert problems[0].answer.startswith("Natalia sold 48/2 = <<48/2=24>>24 clips in May.")
    assert problems[2].question.endswith("now?")
    out = tmp_path / "back.jsonl"
    gsm_problems.dump_jsonl(problems, out)
    assert gsm_problems.load_jsonl(out) == problems


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json\n", r"bad\.jsonl:2: not valid JSON"),
        ("[1, 2]\n", r"bad\.jsonl:2: expected a JSON object, got list"),
        (json.dumps({"question": "q"}) + "\n", r"bad\.jsonl:2: missing string field 'answer'"),
        (json.dumps({"question": "q", "answer": 5}) + "\n", r"bad\.jsonl:2: missing string field 'answer'"),
        (json.dumps({"question": "q", "answer": "no marker"}) + "\n", r"bad\.jsonl:2: answer has no final"),
    ],
)
def test_load_jsonl_bad_line_one_line_error_with_line_number(tmp_path, bad, message):
    path = _fixture(tmp_path / "bad.jsonl", [GSM_LINES[0], bad])
    with pytest.raises(gsm_problems.GSMFormatError, match=message) as e:
        gsm_problems.load_jsonl(path)
    assert "\n" not in str(e.value)


def test_load_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="GSM8k file not found: .*nope.jsonl$"):
        gsm_problems.load_jsonl(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    "expr, value",
    [
        ("48/2", Fraction(24)),
        ("2+3*4", Fraction(14)),  # * before +
        ("(2+3)*4", Fraction(20)),
        ("10-4-3", Fraction(3)),  # left to right
        ("12/4/3", Fraction(1)),
        ("1/3", Fraction(1, 3)),
        ("-5+2", Fraction(-3)),
        ("3*-2", Fraction(-6)),
        (" 0.25 * 8 ", Fraction(2)),
        (".5+1", Fraction(3, 2)),
    ],
)
def test_calculate_hand_checked(expr, value):
    assert gsm_answers.calculate(expr) == value


@pytest.mark.parametrize(
    "expr", ["", "2+", "2**3", "(2+3", "2+3)", "4/0", "4/(2-2)", "1,000+1", "2e3", "__import__('os')", "x+1", "2 3"]
)
def test_calculate_rejects_anything_else(expr):
    with pytest.raises(gsm_answers.CalculatorError):
        gsm_answers.calculate(expr)


@pytest.mark.parametrize(
    "value, text",
    [
        (Fraction(24), "24"),
        (Fraction(-12), "-12"),
        (Fraction(5, 2), "2.5"),
        (Fraction(1, 3), "0.333333"),
        (Fraction(2, 3), "0.666667"),
        (Fraction(-1, 10**9), "0"),
    ],
)
def test_format_number(value, text):
    assert gsm_answers.format_number(value) == text


@pytest.mark.parametrize(
    "text, tail",
    [
        ("Natalia sold 48/2 = <<48/2=", "24>>"),
        ("a <<1+1=2>>2 then <<2*3=", "6>>"),
        ("<<7-9=", "-2>>"),
        ("<<48/2=24", None),  # not at the '='
        ("48/2=", None),  # no open annotation
        ("<<1+1=2>> 5=", None),  # the last annotation is closed
        ("<<a=b=", None),  # a second '=' inside
        ("<<4/0=", None),  # not evaluable: the model continues alone
        ("<<import os=", None),
    ],
)
def test_calculator_completion(text, tail):
    assert gsm_answers.calculator_completion(text) == tail


def test_generated_annotations_agree_with_the_calculator():
    for p in gsm_problems.make_splits(seed=5, n_train=200, n_heldout=0).train:
        for expr, result in re.findall(r"<<([^=]*)=([^>]*)>>", p.answer):
            assert gsm_answers.format_number(gsm_answers.calculate(expr)) == result


# ---------------------------------------------------------------- error analysis

_REF = gsm_problems.Problem(
    "Tom has 6 cards. He buys 3 more. He splits them equally into 3 bags and keeps one bag. How many?",
    "After getting more, Tom has 6+3 = <<6+3=9>>9 cards.\nAfter sharing, Tom has 9/3 = <<9/3=3>>3 cards.\n#### 3",
    Decimal(3),
)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" " + _REF.answer, ("correct", None)),
        (" Tom has 6*3 = <<6*3=18>>18 cards.\n#### 18", ("setup: wrong op", 0)),
        (" 6+3 = <<6+3=9>>9.\n 8/3 = <<8/3=2.666667>>2.666667\n#### 2.666667", ("setup: wrong first operand", 1)),
        (" 6+3 = <<6+3=9>>9.\n 9/2 = <<9/2=4.5>>4.5\n#### 4.5", ("setup: wrong second operand", 1)),
        (" <<6+3+1=10>>10\n#### 10", ("setup: malformed", 0)),
        (" 6+3 = <<6+3=8>>8\n#### 8", ("arithmetic", 0)),
        (" 6+3 = <<6+3=9>>9\n#### 9", ("stopped early", 1)),
        (" <<6+3=9>>9 <<9/3=3>>3 <<3*1=3>>3\n#### 3", ("correct", None)),  # reward 1: correct whatever the steps
        (" <<6+3=9>>9 <<9/3=3>>3 <<3*2=6>>6\n#### 6", ("extra steps", None)),
        (" <<6+3=9>>9 <<9/3=3>>3\n#### 9", ("final answer", None)),
    ],
)
def test_first_error(completion, expected):
    assert gsm_answers.first_error(_REF, completion) == expected


def test_error_breakdown_counts_by_hand():
    two = _REF
    one = gsm_problems.Problem("q", "a <<5*2=10>>10\n#### 10", Decimal(10))
    comps = [" " + two.answer, " <<6+3=9>>9 <<9/2=4.5>>4.5\n#### 4.5", "#### 7"]
    out = gsm_answers.error_breakdown([two, two, one], comps)
    assert out["accuracy"] == pytest.approx(1 / 3) and out["n"] == 3
    assert out["by_steps"] == {1: [0, 1], 2: [1, 2]}
    # '+' reached twice, never wrong; '/' reached twice, wrong once; '*' reached once, stopped early
    assert out["by_op"] == {"*": [1, 1], "+": [0, 2], "/": [1, 2]}
    assert out["first_error"] == {"correct": 1, "setup: wrong second operand": 1, "stopped early": 1}
    with pytest.raises(ValueError):
        gsm_answers.error_breakdown([two], [])


def test_generated_problems_take_a_step_range_and_keep_the_default_stream():
    from asyncrl.tasks.llm import gsm_problems as gp

    default = gp.make_splits(seed=3, n_train=40, n_heldout=5)
    assert default == gp.make_splits(seed=3, n_train=40, n_heldout=5, steps=(2, 4))  # the tiny model's data kept
    one = gp.make_splits(seed=3, n_train=40, n_heldout=5, steps=(1, 1))
    assert all(p.answer.count("<<") == 1 for p in one.train + one.heldout)
    five = gp.make_splits(seed=3, n_train=20, n_heldout=0, steps=(5, 6)).train
    assert {p.answer.count("<<") for p in five} <= {5, 6}
    for bad in ((0, 2), (3, 2), (1, 9)):
        with pytest.raises(ValueError, match="steps must satisfy"):
            gp.make_splits(seed=3, n_train=1, n_heldout=0, steps=bad)


def test_problem_steps_config_is_checked_and_reported_unused_with_both_files(tmp_path):
    from asyncrl.core import config

    base = ["task.kind=llm"]
    with pytest.raises(config.ConfigError, match="problem_steps_min / llm.problem_steps_max"):
        config.load(None, [*base, "llm.problem_steps_min=3", "llm.problem_steps_max=2"])
    cfg = config.load(None, [*base, "llm.problem_steps_min=1", "llm.problem_steps_max=1"])
    assert (cfg.llm.problem_steps_min, cfg.llm.problem_steps_max) == (1, 1)
    res = config.load_resolved(
        None, [*base, "llm.problem_steps_min=1", "llm.train_file=a.jsonl", "llm.test_file=b.jsonl"]
    )
    assert any("llm.problem_steps_min" in line for line in res.unused)
