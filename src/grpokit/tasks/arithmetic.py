"""The built-in arithmetic task: offline, seeded, small enough for a character-level model.

Problems are ``What is 37+58?`` with `task.terms` operands of `task.digits` digits and operators
from `task.operators`. Each problem is an index into the space of all operand/operator choices,
so sampling without replacement makes the held-out problems disjoint from the training ones, and
the held-out set is drawn first so it does not change with `task.num_train`.

The worked solution does products first, then sums left to right, one equation per operation:
``12+34=46, 46-5=41. \\boxed{41}`` (every equation there passes the 'steps' verifier).
"""

from __future__ import annotations

import functools
import logging
import random
import re

from grpokit.agents.formats import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN
from grpokit.tasks.base import Problem, TaskError

logger = logging.getLogger(__name__)


def solve(operands: list[int], operators: list[str]) -> tuple[int, list[str]]:
    """The value with the usual precedence, and the equations that compute it in order."""
    values, pending, steps = [operands[0]], [], []
    for op, b in zip(operators, operands[1:]):
        if op == "*":
            a = values[-1]
            values[-1] = a * b
            steps.append(f"{a}*{b}={a * b}")
        else:
            pending.append(op)
            values.append(b)
    acc = values[0]
    for op, b in zip(pending, values[1:]):
        new = acc + b if op == "+" else acc - b
        steps.append(f"{acc}{op}{b}={new}")
        acc = new
    return acc, steps


def _decode(index: int, low: int, count: int, terms: int, ops: list[str]) -> tuple[list[int], list[str]]:
    """Problem number `index` -> (operands, operators): a mixed-radix number."""
    operands, operators = [], []
    for _ in range(terms):
        index, r = divmod(index, count)
        operands.append(low + r)
    for _ in range(terms - 1):
        index, r = divmod(index, len(ops))
        operators.append(ops[r])
    return operands, operators


def _problem(operands: list[int], operators: list[str]) -> Problem:
    expr = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(operators, operands[1:]))
    value, steps = solve(operands, operators)
    reasoning = ", ".join(steps) + "."
    solution = f"{reasoning} \\boxed{{{value}}}"
    return Problem(f"What is {expr}?", str(value), reasoning, {"solution": solution})


@functools.lru_cache(maxsize=4)  # the train and held-out loads share one generation (and one warning)
def arithmetic_problems(digits: int, terms: int, operators: str, num_train: int, num_eval: int,
                        seed: int) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    """(train, held-out) problems; disjoint, and the same for the same arguments.

    Raises:
        TaskError: the problem space cannot hold num_eval problems plus at least one to train on.
    """
    ops = list(dict.fromkeys(operators))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    count = 10 ** digits - low
    space = count ** terms * len(ops) ** (terms - 1)
    if space <= num_eval:
        raise TaskError(f"arithmetic with digits={digits}, terms={terms}, operators={operators!r} has only "
                        f"{space} distinct problems, not enough for task.num_eval={num_eval} plus training: "
                        f"lower task.num_eval or raise task.digits / task.terms")
    if num_train > space - num_eval:
        logger.warning("arithmetic: only %d distinct problems remain after the %d held out; training on "
                       "those instead of task.num_train=%d (lower it, or raise task.digits / task.terms)",
                       space - num_eval, num_eval, num_train)
        num_train = space - num_eval
    rng = random.Random(seed)
    held_out = rng.sample(range(space), num_eval)  # random.sample never materializes a large range
    taken = set(held_out)
    draw = rng.sample(range(space), min(space, num_train + num_eval))
    train = [i for i in draw if i not in taken][:num_train]

    def build(indices: list[int]) -> tuple[Problem, ...]:  # tuples: the cached result must not change
        return tuple(_problem(*_decode(i, low, count, terms, ops)) for i in indices)

    return build(train), build(held_out)


def calculator_trace(prompt: str | list[dict], answer_prefix: str = "") -> str:
    """'What is 123*456?' -> the call, its result, `answer_prefix` and the boxed answer. The question is the
    prompt's last one (chat messages: the last message's), so a system prompt or examples before it are
    allowed. A BPE tokenizer merges '>' with a following '\\' ('</tool_response>\\boxed' ends in '>\\'),
    which the inserted result, tokenized alone, never ends in: a prefix starting with a space or a letter
    keeps the trace's tokens those of a rollout."""
    text = prompt if isinstance(prompt, str) else str(prompt[-1]["content"])
    found = re.findall(r"What is (\d+)\*(\d+)\?", text)
    if not found:
        raise ValueError(f"not a product question: {text!r:.60}")
    a, b = map(int, found[-1])
    return (f"{CALL_OPEN}multiply({a},{b}){CALL_CLOSE}{RESPONSE_OPEN}{a * b}{RESPONSE_CLOSE}"
            f"{answer_prefix}\\boxed{{{a * b}}}")
