"""The built-in code task (task.name=functions): small Python functions generated offline from task.seed.

Each problem is one family (digits of an int, a list's elements, a string's characters) with its
parameters (a digit predicate, a divisor, a threshold, a character), for example:

    Write a Python function `sum_even_digits(n)` that returns the sum of the even digits of the
    non-negative integer n.
    Example: sum_even_digits(2846) == 20
    Answer with the complete function in a ```python code block.

The prompt shows one example; the five tests that grade (f(x) equal to y in value and exact type, values
from the reference implementation on seeded random inputs) are never in the prompt. Families x
parameters give the problems; a seeded fifth of them (task.num_eval at most) is held out, so the
held-out split asks for functions the policy never trained on, from the families it did.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.tasks.base import Problem
from grpokit.tasks.code import FENCED_INSTRUCTION, code_columns

HIDDEN_TESTS = 5
# The tests compare by exact type, element by element: a returned object whose __eq__ always says True
# (the classic way to pass `assert f(x) == y` without solving anything) fails them. It runs after the
# program, so the program cannot replace it.
SAME = """def _same(a, b):
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b"""


@dataclass(frozen=True)
class Family:
    """One kind of function: its name and description from a parameter, its reference, its inputs, and
    a reference program (the `solution` column `grpokit sft` warms the code demo's model up on)."""

    name: str                                   # format string over the parameter: "count_{p}_digits"
    arg: str                                    # the argument's name: n, xs, s
    text: str                                   # "returns the ..." with {p}
    params: tuple                               # parameter values
    ref: Callable[[Any, Any], Any]              # ref(param, x)
    draw: Callable[[random.Random], Any]        # one input
    body: str                                   # the program's body over {p} (a digit test: {d})
    wide: tuple = ()                            # task.functions_wide's parameters (default: params)
    near: Callable[[random.Random, Any], Any] | None = None   # wide: one input for a parameter


def _int(rng: random.Random) -> int:
    return rng.randrange(0, 10 ** rng.randint(1, 7))


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(-20, 40) for _ in range(rng.randint(0, 8))]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeghilmnorstu") for _ in range(rng.randint(1, 7)))


def _near(low: Callable[[int], int], high: Callable[[int], int]) -> Callable[[random.Random, int], list[int]]:
    """Wide lists for parameter p: up to 8 ints in [low(p), high(p)], so the tests still grade a large p."""
    return lambda rng, p: [rng.randint(low(p), high(p)) for _ in range(rng.randint(0, 8))]


def _text(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(1, 5)))


DIGIT_TESTS = {"even": lambda d: d % 2 == 0, "odd": lambda d: d % 2 == 1, "nonzero": lambda d: d > 0,
               "large": lambda d: d >= 5, "small": lambda d: d < 5}
DIGIT_WORDS = {"even": "even", "odd": "odd", "nonzero": "non-zero", "large": "5-or-more",
               "small": "less-than-5"}
DIGIT_CODE = {"even": "d % 2 == 0", "odd": "d % 2 == 1", "nonzero": "d > 0", "large": "d >= 5",
              "small": "d < 5"}
LETTERS = "abcdeghilmnorstu"                   # the strings' alphabet (_word)


def _digits(n: int) -> list[int]:
    return [int(c) for c in str(n)]


def _product(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


_DIGITS = "map(int, str(n))"
_MULTIPLES = _near(lambda p: -3 * p, lambda p: 5 * p)       # some multiples of a large divisor too
_AROUND = _near(lambda p: p - 30, lambda p: p + 30)         # both sides of a large threshold
FAMILIES = (
    Family("sum_{p}_digits", "n", "the sum of the {w} digits of the non-negative integer n",
           tuple(DIGIT_TESTS), lambda p, n: sum(d for d in _digits(n) if DIGIT_TESTS[p](d)), _int,
           f"    return sum(d for d in {_DIGITS} if {{d}})"),
    Family("count_{p}_digits", "n", "how many digits of the non-negative integer n are {w}",
           tuple(DIGIT_TESTS), lambda p, n: sum(DIGIT_TESTS[p](d) for d in _digits(n)), _int,
           f"    return sum(1 for d in {_DIGITS} if {{d}})"),
    Family("product_{p}_digits", "n", "the product of the {w} digits of the non-negative integer n (1 when "
           "there are none)", tuple(DIGIT_TESTS), lambda p, n: _product([d for d in _digits(n)
                                                                          if DIGIT_TESTS[p](d)]), _int,
           f"    out = 1\n    for d in {_DIGITS}:\n        if {{d}}:\n            out *= d\n    return out"),
    Family("count_multiples_of_{p}", "xs", "how many numbers in the list of integers xs are divisible by {p}",
           (2, 3, 4, 5, 6, 7), lambda p, xs: sum(x % p == 0 for x in xs), _ints,
           "    return sum(1 for x in xs if x % {p} == 0)", tuple(range(2, 100)), _MULTIPLES),
    Family("sum_multiples_of_{p}", "xs", "the sum of the numbers in the list of integers xs that are "
           "divisible by {p}", (2, 3, 4, 5, 6, 7), lambda p, xs: sum(x for x in xs if x % p == 0), _ints,
           "    return sum(x for x in xs if x % {p} == 0)", tuple(range(2, 100)), _MULTIPLES),
    Family("count_above_{p}", "xs", "how many numbers in the list of integers xs are greater than {p}",
           (0, 5, 10, 15, 20), lambda p, xs: sum(x > p for x in xs), _ints,
           "    return sum(1 for x in xs if x > {p})", tuple(range(300)), _AROUND),
    Family("sum_above_{p}", "xs", "the sum of the numbers in the list of integers xs that are greater "
           "than {p}", (0, 5, 10, 15, 20), lambda p, xs: sum(x for x in xs if x > p), _ints,
           "    return sum(x for x in xs if x > {p})", tuple(range(300)), _AROUND),
    Family("add_{p}_to_each", "xs", "a new list with {p} added to every number of the list of integers xs",
           (1, 2, 3, 5, 10), lambda p, xs: [x + p for x in xs], _ints,
           "    return [x + {p} for x in xs]", tuple(range(1, 300))),
    Family("count_{p}", "s", "how many times the letter '{p}' occurs in the string s", tuple("aeimnorst"),
           lambda p, s: s.count(p), _text, "    return s.count('{p}')", tuple(LETTERS)),
    Family("remove_{p}", "s", "the string s with every letter '{p}' removed", tuple("aeimnorst"),
           lambda p, s: s.replace(p, ""), _text, "    return s.replace('{p}', '')", tuple(LETTERS)),
    Family("words_longer_than_{p}", "s", "how many space-separated words of the string s are longer than "
           "{p} letters", (1, 2, 3, 4, 5), lambda p, s: sum(len(w) > p for w in s.split()), _text,
           "    return sum(1 for w in s.split() if len(w) > {p})", tuple(range(1, 7))),
)


def solution(family: Family, param: Any) -> str:
    """The reference program as a fenced block: what a right answer looks like."""
    body = family.body.format(p=param, d=DIGIT_CODE.get(param, ""))
    return f"```python\ndef {family.name.format(p=param)}({family.arg}):\n{body}\n```"


def _problem(family: Family, param: Any, rng: random.Random, wide: bool = False) -> Problem:
    name = family.name.format(p=param)
    words = DIGIT_WORDS.get(param, param) if isinstance(param, str) else param
    inputs, seen = [], set()
    while len(inputs) < HIDDEN_TESTS + 1:          # distinct inputs: one example, five hidden tests
        x = family.near(rng, param) if wide and family.near else family.draw(rng)
        if repr(x) not in seen:
            seen.add(repr(x))
            inputs.append(x)
    example, hidden = inputs[0], inputs[1:]
    question = (f"Write a Python function `{name}({family.arg})` that returns "
                f"{family.text.format(p=param, w=words)}.\n"
                f"Example: {name}({example!r}) == {family.ref(param, example)!r}\n{FENCED_INSTRUCTION}")
    tests = [f"assert _same({name}({x!r}), {family.ref(param, x)!r})" for x in hidden]
    columns = code_columns(tests, setup=SAME, entry_point=name) | {"solution": solution(family, param)}
    return Problem(question, "", "", columns)


def function_problems(num_train: int, num_eval: int, seed: int, wide: bool = False
                      ) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    """(train, held_out): every family x parameter once, a seeded fifth (at most num_eval) held out;
    task.num_train caps the training problems. wide (task.functions_wide): each family over its wider
    parameter range (1148 problems instead of 65; the code demo's
    task)."""
    rng = random.Random(seed)
    combos = [(f, p) for f in FAMILIES for p in (f.wide or f.params if wide else f.params)]
    rng.shuffle(combos)
    n_eval = min(num_eval, len(combos) // 5)
    held, train = combos[:n_eval], combos[n_eval:][:num_train]
    return (tuple(_problem(f, p, rng, wide) for f, p in train),
            tuple(_problem(f, p, rng, wide) for f, p in held))
