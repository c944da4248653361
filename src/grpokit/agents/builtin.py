"""Built-in offline environments (`rollout.environment: calculator | guess_number`).

    calculator    products of 3-4 digit numbers (the arithmetic task with task.operators="*"), which a
                  small model cannot do in its head: calling multiply(a, b) is the way to be right. The
                  reward is the task's answer check (the boxed number against the row's answer).
    guess_number  find a secret number from 1 to 15 by guessing; each guess is answered higher, lower or
                  yes, so the feedback decides the next move. The secret is the row's `secret`, else
                  episode k's (task.name=environment numbers its rows: a group's G rollouts then play the
                  same secret, and every evaluation the same episodes), else a draw of the
                  environment's own seeded `rng` (TRL's data-free run). The reward is the environment's
                  (get_reward: 1 when found).

`demonstrations` writes tool-calling traces in the plain format for a supervised warm start
(`grpokit sft --traces calculator`): the calculator's call, result and boxed answer; guess_number's
guesses drawn uniformly from the numbers still possible (a consistent but unhurried searcher that binary
search beats: within 4 guesses it finds 60% of secrets, binary search all).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from grpokit.agents.formats import CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN
from grpokit.tasks.arithmetic import calculator_trace
from grpokit.tasks.base import Example


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return int(a) * int(b)


class Calculator:
    """A calculator for the arithmetic task's products: its one tool multiplies two integers."""

    def reset(self, **row) -> None:
        self.calls = 0
        return None   # the prompt is the task's question as it is

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.calls += 1
        return multiply(a, b)


class GuessNumber:
    """Guess the secret number: each guess is answered 'higher', 'lower' or 'yes'.

    Args:
        low, high: the secret's range (inclusive).
    """

    def __init__(self, low: int = 1, high: int = 15) -> None:
        self.low, self.high = low, high
        self.rng = random.Random(0)        # grpokit seeds it per instance and keeps it in checkpoints
        self.secret, self.guesses, self.found = low, 0, False
        self.after_found = 0               # guesses made after the "yes"

    def reset(self, secret: int | None = None, episode: int | None = None, **row) -> str:
        if secret is None and episode is not None:   # episode k: always the same secret
            secret = random.Random(episode).randint(self.low, self.high)
        self.secret = int(secret) if secret is not None else self.rng.randint(self.low, self.high)
        self.guesses, self.found, self.after_found = 0, False, 0
        return f"Guess my number from {self.low} to {self.high}."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        self.guesses += 1
        if self.found:
            self.after_found += 1
            return "found already"
        if int(number) == self.secret:
            self.found = True
            return "yes"
        return "higher" if self.secret > int(number) else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0


ENVIRONMENTS = {"calculator": Calculator, "guess_number": GuessNumber}


def guesses_after_yes(completions, environments=None, **kwargs) -> list[float]:
    """A reward function for GuessNumber runs: minus the guesses each episode made after its "yes" (0 when
    it stopped there). Guesses after the secret is found never help, so a weight on this column asks
    for fewer turns without trading away success (the environment's own column, `rewards/GuessNumber`)."""
    return [-float(getattr(env, "after_found", 0)) for env in environments or [None] * len(completions)]


def _turn(call: str, result: object) -> str:
    return f"{CALL_OPEN}{call}{CALL_CLOSE}{RESPONSE_OPEN}{result}{RESPONSE_CLOSE}"


def guess_trace(rng: random.Random, env: GuessNumber, max_guesses: int) -> tuple[str, str] | None:
    """(prompt, guesses until 'yes') of the uniform consistent searcher; None past max_guesses."""
    prompt = env.reset(secret=rng.randint(env.low, env.high))
    low, high, parts = env.low, env.high, []
    while len(parts) < max_guesses:
        number = rng.randint(low, high)
        reply = env.guess(number)
        parts.append(_turn(f"guess({number})", reply))
        if reply == "yes":
            return prompt, "".join(parts)
        low, high = (number + 1, high) if reply == "higher" else (low, number - 1)
    return None


def demonstrations(name: str, examples: Sequence[Example], n: int, seed: int,
                   answer_prefix: str = "") -> list[Example]:
    """n traces (Examples whose 'solution' column is the trace) for a supervised warm start (calculator:
    `answer_prefix` between the result and the boxed answer, task.trace_answer_prefix)."""
    rng = random.Random(seed)
    if name == "calculator":
        picked = rng.sample(list(examples), min(n, len(examples)))
        return [Example(ex.prompt, ex.answer, {**ex.columns,
                                               "solution": calculator_trace(ex.prompt, answer_prefix)})
                for ex in picked]
    if name == "guess_number":
        env, out = GuessNumber(), []
        while len(out) < n:
            trace = guess_trace(rng, env, max_guesses=6)
            if trace is not None:
                out.append(Example(trace[0], "", {"solution": trace[1]}))
        return out
    raise ValueError(f"no demonstrations for '{name}': use calculator or guess_number")
