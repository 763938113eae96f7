"""The GSM8K / math answer verifier and the synthetic reward: hand-written cases, each with its reason."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from rollflow.rewards.math import (
    answers_match,
    extract_answer,
    gsm8k_reward_fn,
    math_reward_fn,
    parse_gsm8k_reference,
    parse_number,
)
from rollflow.rewards.synthetic import synthetic_reward_fn

# (completion, reference, expected score) - the reference is what follows '####' in GSM8K.
CASES = [
    # extraction: which number is the answer
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{42} but later I wrote 17", "42", 1.0),  # a box beats any later number
    ("First \\boxed{3}, corrected: \\boxed{5}", "5", 1.0),  # the last box wins
    ("6*7 = 42\n#### 42", "42", 1.0),
    ("#### 42\nQuestion: what is 10+7? #### 17", "42", 1.0),  # first '####': rambling is ignored
    ("First 12, then 7. The answer is 42. Check: 6*7=42", "42", 1.0),
    ("The answer is: 7 apples", "7", 1.0),
    ("I have 3 apples and 5 oranges, so 3+5=8 in total.", "8", 1.0),  # last number fallback
    ("She pays 3*4 = 12 dollars.", "12", 1.0),
    ("<<3*4=12>>12 cookies", "12", 1.0),
    ("no numbers here", "3", 0.0),
    ("", "3", 0.0),
    ("The answer is 41", "42", 0.0),
    ("\\boxed{", "3", 0.0),  # cut off inside the box: unreadable, not the 3 from elsewhere
    # commas and thousands separators
    ("#### 1,234", "1234", 1.0),
    ("He earns $1,200.00 a month", "1200", 1.0),
    ("\\boxed{1{,}234}", "1,234", 1.0),
    ("The total is 2,664 dollars", "2,664", 1.0),
    # signs
    ("The answer is -7", "-7", 1.0),
    ("The answer is \u22125", "-5", 1.0),  # unicode minus, which math-verify reads as nothing
    ("x = -3", "-3", 1.0),
    ("6-4=2", "2", 1.0),  # '-4' here is subtraction, and the answer is the last number
    ("The loss is -$5", "-5", 1.0),
    ("The answer is 7", "-7", 0.0),
    # decimals
    ("It costs 5.00", "5", 1.0),
    ("#### 12.5", "12.50", 1.0),
    ("The answer is .5", "1/2", 1.0),
    ("It is 42.", "42", 1.0),  # a sentence's full stop is not a decimal point
    ("0.333", "1/3", 0.0),  # exact comparison: a rounded value is wrong
    # fractions
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{\\dfrac34}", "3/4", 1.0),
    ("I think 1/3 of them", "1/3", 1.0),
    ("1 1/2 cups", "1.5", 1.0),  # mixed number
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("answer: 3/0", "3", 0.0),  # division by zero is not a number
    # percent
    ("It is 25%", "25", 1.0),  # GSM8K stores percents without the sign
    ("It is 25%", "0.25", 1.0),
    ("0.5", "50%", 1.0),
    ("\\boxed{35\\%}", "35", 1.0),
    ("It is 25%", "2.5", 0.0),
    # units and currency
    ("She has 18 dollars left.", "18", 1.0),
    ("\\boxed{18\\text{ cm}}", "18", 1.0),
    ("The answer is $18", "18", 1.0),
    ("\\boxed{\\$1,234.50}", "1234.5", 1.0),
    ("It takes 3 hours", "4", 0.0),
    # symbolic: math-verify decides
    ("\\boxed{\\sqrt{4}}", "2", 1.0),
    ("\\boxed{2^{10}}", "1024", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{\\sqrt{3}}", "2", 0.0),
]


# Math-Verify's own number-extraction regression cases (huggingface/Math-Verify, tests/test_all.py,
# test_number_extraction), as (gold, prediction, expected): before it took their number formats this
# verifier scored 13 of the 19 (it found 2 in "AZYUK2A", and missed "1 000" and the decimal comma).
MATH_VERIFY_NUMBER_CASES = [
    ("-5", "-5", 1.0),
    ("7425000", "7,425,000", 1.0),
    ("1000", "1 000", 1.0),  # a space between thousands
    ("1000", "1000.0", 1.0),
    ("1000.0", "1,000.0", 1.0),
    ("1000.99", "1000,99", 1.0),  # a decimal comma
    ("1,22", "1.22", 1.0),  # ... in the reference too
    ("2.74", "Soucis : 2,74 $ a..", 1.0),
    ("0.4", ".4", 1.0),
    ("1000.99", "1,000.99", 1.0),
    ("1000.99", "1,000.99", 1.0),
    ("1000.99", "$1,000.99", 1.0),
    ("1000.99", "1,000.99$", 1.0),
    ("1000.99", "the number is not 10 which is 1,000.99€", 1.0),
    ("1000.99", "the number is not 10 which is 1,000.99€", 1.0),
    ("1000.99", "so the number is 10 which is 1,000.99m²", 1.0),
    ("1000.99", "not it's not 10 it's 1,000.99m²", 1.0),
    ("0,111", "0.111", 1.0),  # "0," is never a thousands separator
    ("2", "AZYUK2A", 0.0),  # digits glued to letters are not a number
]


@pytest.mark.parametrize(("reference", "completion", "expected"), MATH_VERIFY_NUMBER_CASES)
def test_math_verify_number_extraction_cases(reference: str, completion: str, expected: float) -> None:
    assert math_reward_fn("prompt", completion, reference) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("#### 1,234", "1.234", 0.0),  # a comma before three digits stays a thousands separator
        ("The point is (2,3)", "2.3", 0.0),  # a pair is not a decimal comma ...
        ("The answer is 3,4,5", "3.4", 0.0),  # ... nor is a list
        ("The answer is 12 345 apples", "12345", 1.0),
        ("Give 1 1/2 cups", "1.5", 1.0),  # a mixed number is not a thousands group
        ("The code v2 is wrong", "2", 0.0),
    ],
)
def test_separators_are_read_as_people_write_them(completion: str, reference: str, expected: float) -> None:
    assert math_reward_fn("prompt", completion, reference) == expected


@pytest.mark.parametrize(("completion", "reference", "expected"), CASES)
def test_math_reward_cases(completion: str, reference: str, expected: float) -> None:
    assert math_reward_fn("prompt", completion, reference) == expected


def test_there_are_at_least_30_reward_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(
    ("solution", "reference"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        ("... so 1,000 in all.\n#### 1,000", "1,000"),
        ("#### -3", "-3"),
        ("a #### 5 b #### 6", "6"),  # the last marker is the answer
        ("42", "42"),  # already bare
    ],
)
def test_parse_gsm8k_reference(solution: str, reference: str) -> None:
    assert parse_gsm8k_reference(solution) == reference


def test_parse_gsm8k_reference_rejects_an_empty_marker() -> None:
    with pytest.raises(ValueError, match="nothing after"):
        parse_gsm8k_reference("reasoning ####   ")


def test_gsm8k_reward_takes_full_solutions_or_bare_references() -> None:
    solution = "She bought 3 packs of 4: 3*4=<<3*4=12>>12.\n#### 12"
    assert gsm8k_reward_fn("q", "3 packs of 4 is 12. #### 12", solution) == 1.0
    assert gsm8k_reward_fn("q", "The answer is \\boxed{12}", "12") == 1.0
    assert gsm8k_reward_fn("q", "The answer is 13", solution) == 0.0
    assert gsm8k_reward_fn("q", "12", None) == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        ("1" * 50_000, "42"),  # past Python's 4,300-digit int-conversion limit
        ("\\boxed{" + "9" * 5_000 + "}", "42"),
        ("#### " + "9" * 5_000, "42"),
        ("\\frac{" + "1" * 5_000 + "}{3}", "42"),
        ("1/" + "0" * 5_000, "42"),
        ("42", "1" * 50_000),  # a junk reference is a wrong answer too
        ("\\boxed{\\frac{", "42"),  # unbalanced LaTeX
        ("\x00\x01\udcff", "42"),
        ("42", "reasoning ####  "),  # nothing after the marker
    ],
)
def test_the_verifier_scores_junk_zero_and_never_raises(completion: str, reference: str) -> None:
    assert math_reward_fn("q", completion, reference) == 0.0
    assert gsm8k_reward_fn("q", completion, reference) == 0.0


def test_extract_answer_priorities() -> None:
    assert extract_answer("5 then \\boxed{7} then 9") == "7"
    assert extract_answer("5 #### 7 then 9") == "7 then 9"  # the rest of the line; its first number counts
    assert extract_answer("5, the answer is 7, then 9") == "7, then 9"  # parse_number takes the 7
    assert extract_answer("5 then 9 cm") == "9"
    assert extract_answer("nothing") is None


@pytest.mark.parametrize(
    ("text", "value", "percent"),
    [
        ("$1,234.50", Fraction(2469, 2), False),  # 1234.5 = 2469/2
        ("-3/4 cup", Fraction(-3, 4), False),
        ("1 1/2", Fraction(3, 2), False),
        ("25%", Fraction(25), True),
        ("\\frac{7}{2}", Fraction(7, 2), False),
    ],
)
def test_parse_number(text: str, value: Fraction, percent: bool) -> None:
    assert parse_number(text) == (value, percent)


@pytest.mark.parametrize("text", ["2^{10}", "\\sqrt{2}", "x", "3 + 4"])
def test_parse_number_refuses_expressions(text: str) -> None:
    assert parse_number(text) is None


def test_answers_match_works_off_the_main_thread() -> None:
    # math-verify's own timeouts use signal.alarm, which raises off the main thread; we switch them off.
    results: list[bool] = []
    t = threading.Thread(target=lambda: results.append(answers_match("\\sqrt{4}", "2")))
    t.start()
    t.join()
    assert results == [True]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("47", "47", 1.0),
        (" 47\n", "47", 1.0),  # surrounding whitespace is not part of the answer
        ("37", "47", 0.0),  # the "forgot the carry" distractor
        ("47 ", " 47", 1.0),
        ("47.", "47", 0.0),  # strict: the format is part of the task
        ("4 7", "47", 0.0),
        ("The answer is 47", "47", 0.0),
        ("", "47", 0.0),
        ("110", "110", 1.0),
    ],
)
def test_synthetic_reward(completion: str, answer: str, expected: float) -> None:
    assert synthetic_reward_fn("12+35=", completion, answer, round_operand=False) == expected
