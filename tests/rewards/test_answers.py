"""Answer extraction and checking: a table of completions against references, then the edges."""

import threading
import time

import pytest

from grpokit.rewards.answers import (
    answers_match,
    extract_answer,
    extract_boxed,
    normalize_answer,
    normalize_number,
)
from grpokit.rewards.scoring import rule_reward

# (completion, reference, the answer is right?)
TABLE = [
    # plain numbers
    (r"\boxed{72}", "72", True),
    (r"\boxed{73}", "72", False),
    (r"\boxed{ 72 }", "72", True),
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{1000}", "1,000", True),
    (r"\boxed{1,001}", "1000", False),
    (r"\boxed{1{,}000}", "1000", True),
    (r"\boxed{1000001}", "1000000", False),  # absolute tolerance: off by one stays wrong
    (r"\boxed{\$18}", "18", True),
    (r"\boxed{$18}", "18", True),
    (r"\boxed{\$1,000.00}", "1000", True),
    (r"\boxed{18.00}", "18", True),
    (r"\boxed{18.}", "18", True),
    (r"\boxed{18.5}", "18", False),
    (r"\boxed{-7}", "-7", True),
    (r"\boxed{7}", "-7", False),
    (r"\boxed{+3}", "3", True),
    (r"\boxed{50\%}", "50", True),
    (r"\boxed{10}", r"10\%", True),
    (r"\boxed{18 dollars}", "18", True),
    (r"\boxed{\text{18 dollars}}", "18", True),
    (r"\boxed{5}", r"5\text{ cm}", True),
    (r"\boxed{\mathbf{72}}", "72", True),
    (r"\boxed{30^\circ}", "30", True),
    (r"\boxed{90^\circ}", "30", False),
    (r"\boxed{3x}", "3", False),  # a variable is not a unit
    # fractions
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"\boxed{\dfrac{1}{2}}", "0.5", True),
    (r"\boxed{\frac12}", "0.5", True),
    (r"\boxed{\frac{1}{3}}", "0.5", False),
    (r"\boxed{3/4}", "0.75", True),
    (r"\boxed{3/4}", r"\frac{3}{4}", True),
    (r"\boxed{4/3}", r"\frac{3}{4}", False),
    (r"\boxed{-\frac{3}{4}}", "-0.75", True),
    (r"\boxed{\frac{-3}{4}}", r"-\frac{3}{4}", True),
    (r"\boxed{0.333}", r"\frac{1}{3}", True),  # within tol 0.01
    (r"\boxed{0.3}", r"\frac{1}{3}", False),
    # text around the answer, several boxes, broken boxes, fallbacks
    (r"She earns $18 in total, so \boxed{18} is it.", "18", True),
    (r"First \boxed{1}, no wait: \boxed{2}", "2", True),
    (r"First \boxed{1}, no wait: \boxed{2}", "1", False),
    (r"\boxed{\frac{1}{2}} is wrong, \boxed{\frac{2}{3}}", r"\frac{2}{3}", True),
    (r"\boxed{{12}}", "12", True),
    (r"\fbox{12}", "12", True),
    (r"so \boxed 5", "5", True),
    (r"\boxed{}", "0", False),
    (r"\boxed{12", "12", False),
    ("I think it is 18.", "18", False),
    ("Adding up: 48+24=72\n#### 72", "72", True),
    ("So the answer is 18 apples", "18", True),
    ("The final answer is 3.5.", "3.5", True),
    ("The answer is $\\frac{1}{2}$.", "0.5", True),
    ("", "5", False),
    # LaTeX equivalence (math-verify)
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\sqrt{2}/2", True),
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", True),
    (r"\boxed{\sqrt{3}/2}", r"\frac{\sqrt{2}}{2}", False),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{12}", True),
    (r"\boxed{\frac{14}{3}}", r"4\frac{2}{3}", True),
    (r"\boxed{[1, 2)}", "[1,2)", True),
    (r"\boxed{(1, 2]}", "[1,2)", False),
    (r"\boxed{(-\infty, 1) \cup (2, \infty)}", r"(-\infty,1)\cup(2,\infty)", True),
    (r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", True),
    (r"\boxed{(\frac{\pi}{2}, 3)}", r"\left( 3, \frac{\pi}{2} \right)", False),
    (r"\boxed{(1,2)}", "(2,1)", False),
    (r"\boxed{\left(1,2\right)}", "(1,2)", True),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", True),
    (r"\boxed{x=5}", "5", True),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", True),
    (r"\boxed{\text{(C)}}", r"\text{(B)}", False),
    (r"\boxed{\text{Evelyn}}", "Evelyn", True),
    # the question copied into the box: an expression to compute is not its value (a policy that
    # found this on the arithmetic task scored 100% held-out while computing nothing)
    (r"94-95=1. \boxed{94-95}", "-1", False),
    (r"\boxed{42+11}", "53", False),
    (r"\boxed{(34 + 31)}", "65", False),
    (r"\boxed{2 \times 3}", "6", False),
    (r"\boxed{2 \cdot 3 + 1}", "7", False),
    (r"\boxed{94-95=-1}", "-1", True),           # an equation ending in the value states the value
    (r"\boxed{x+1}", "1+x", True),                # symbolic references keep math-verify's judgement
]


def test_table_is_large_and_balanced():
    assert len(TABLE) >= 60
    assert sum(ok for *_, ok in TABLE) >= 25 and sum(not ok for *_, ok in TABLE) >= 20


@pytest.mark.parametrize("completion,ref,expected", TABLE)
def test_answer_table(completion, ref, expected):
    pred = extract_answer(completion)
    assert answers_match(pred or "", ref) is expected, (pred, ref)


def test_extract_boxed_edges():
    assert extract_boxed(r"a \boxed{\frac{a}{b^{2}}} b") == r"\frac{a}{b^{2}}"
    assert extract_boxed(r"\boxed{1} and \fbox{2}") == "2"
    assert extract_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces do not close the box
    assert extract_boxed(r"\boxed{}") == ""
    assert extract_boxed(r"\boxed{1} then \boxed{2") is None  # the last box is unbalanced
    assert extract_boxed("no box here") is None
    assert extract_boxed(r"\boxedfoo{1}") is None
    assert extract_boxed(r"\boxed 42.") == "42."


def test_extract_answer_fallbacks():
    assert extract_answer("reasoning\n#### 1,234") == "1,234"
    assert extract_answer("#### 5\nThe final answer is 7") == "7"  # the later one wins
    assert extract_answer("#### 5", fallback=False) is None
    assert extract_answer(r"#### 5 but \boxed{6}") == "6"  # a box beats the fallbacks
    assert extract_answer("The answer is: $-3$.") == "-3"
    assert extract_answer("nothing") is None


@pytest.mark.parametrize("text,value", [
    ("1,000", 1000), ("$18", 18), (r"\$18", 18), ("18.00", 18), ("50%", 50), (r"50\%", 50), ("+3", 3),
    ("-7", -7), ("-$7", -7), ("3/4", 0.75), (r"\frac{1}{2}", 0.5), (r"\dfrac{3}{4}", 0.75),
    (r"\tfrac12", 0.5), ("18 dollars", 18),
    ("18.", 18), (".5", 0.5), ("{18}", 18), (r"$\frac{-3}{4}$", -0.75), ("007", 7),
])
def test_normalize_number(text, value):
    assert normalize_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text",
                         ["3x", "1,2", r"\sqrt{2}", "x=5", "1/0", "", "abc", "1" * 400, "18dollars", "e"])
def test_normalize_number_rejects(text):
    assert normalize_number(text) is None


def test_normalize_answer_ignores_layout():
    assert normalize_answer(r"\left( 1, 2 \right)") == normalize_answer("(1,2)")
    assert normalize_answer(r"\text{Evelyn}") == "evelyn"


def test_rule_reward_values():
    assert rule_reward("no box at all", "72") == 0.0
    assert rule_reward(r"\boxed{}", "72") == 0.0  # an empty box is not an answer
    assert rule_reward(r"\boxed{71}", "72") == 0.5
    assert rule_reward(r"\boxed{72}", "72") == 1.5
    assert rule_reward(r"\boxed{72} wait \boxed{70}", "72") == 0.5  # the last box counts
    assert rule_reward(r"\boxed{ 1,000 }", "1000") == 1.5
    assert rule_reward(r"\boxed{\$18}", " 18 ") == 1.5
    assert rule_reward(r"\boxed{\frac{1}{2}}", "0.5") == 1.5
    assert rule_reward(r"\boxed{18.004}", "18") == 1.5  # tolerance 0.01
    assert rule_reward(r"\boxed{18.02}", "18") == 0.5


def test_the_chapter_rule_gives_a_boxed_expression_only_the_format_half():
    assert rule_reward(r"94-95=1. \boxed{94-95}", "-1") == 0.5
    assert rule_reward(r"94-95=-1. \boxed{-1}", "-1") == 1.5


def test_math_verify_can_be_turned_off():
    assert answers_match(r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", math_verify=True)
    assert not answers_match(r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", math_verify=False)
    assert answers_match("[1, 2)", "[1,2)", math_verify=False)  # normalized strings still match


def test_pathological_expression_times_out_quickly():
    assert answers_match(r"\frac{\pi}{4}", r"\pi/4")  # warm the worker: start-up is not the deadline
    start = time.perf_counter()
    assert answers_match(r"9^{9^{9^{9}}}", "1", timeout_s=0.5) is False
    # it reached math-verify and was cut at the deadline (sympy alone would never finish)
    assert 0.45 <= time.perf_counter() - start < 5.0
    # from a worker thread too (math-verify's own signal timeout would refuse to run there)
    assert answers_match(r"\frac{\pi}{6}", r"\pi/6")  # wait until the killed worker's replacement is up
    result: list = []
    start = time.perf_counter()
    thread = threading.Thread(
        target=lambda: result.append(answers_match(r"8^{8^{8^{8}}}", "2", timeout_s=0.5)))
    thread.start()
    thread.join(timeout=30)
    assert result == [False] and 0.45 <= time.perf_counter() - start < 5.0
    # the killed worker was replaced: later comparisons still work
    assert answers_match(r"\frac{\sqrt{3}}{3}", r"1/\sqrt{3}")


def test_concurrent_threads_get_right_answers():
    pairs = [(r"\sqrt{8}", r"2\sqrt{2}", True), (r"\sqrt{8}", r"3\sqrt{2}", False)]
    results: dict[int, bool] = {}

    def check(i: int) -> None:
        pred, ref, _ = pairs[i]
        results[i] = answers_match(pred, ref, timeout_s=10.0)

    threads = [threading.Thread(target=check, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: ok for i, (_, _, ok) in enumerate(pairs)}


def test_an_empty_last_box_does_not_erase_an_earlier_answer():
    from grpokit.rewards.scoring import format_reward

    text = r"\boxed{12} \boxed{}"
    assert extract_boxed(text) == "12" and extract_boxed(r"\boxed{12} \boxed{ } \boxed{}") == "12"
    assert rule_reward(text, "12") == 1.5                     # right answer, and a box for the format half
    assert format_reward([""], [text]) == [1.0]
    assert extract_boxed(r"\boxed{} \boxed{}") == ""          # only empty boxes: still no answer
    assert rule_reward(r"\boxed{}", "12") == 0.0
    assert extract_boxed(r"\boxed{12} \boxed{1") is None      # a cut last box is not passed over
