"""Built-in offline environments (`rollout.environment: calculator | guess_number`).

    calculator    products of 3-4 digit numbers (the arithmetic task with task.operators="*"), which a
                  small model cannot do in its head: calling multiply(a, b) is the way to be right. The
                  reward is the task's answer check (the boxed number against the row's answer).
    guess_number  find a secret number from 1 to 15 by guessing; each guess is answered higher, lower or
                  yes, so the feedback decides the next move. No dataset (task.name=environment): the
                  secret comes from the environment's own seeded `rng`. The reward is the environment's
                  (get_reward: 1 when found).
"""

from __future__ import annotations

import random


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

    def reset(self, secret: int | None = None, **row) -> str:
        self.secret = int(secret) if secret is not None else self.rng.randint(self.low, self.high)
        self.guesses, self.found = 0, False
        return f"Guess my number from {self.low} to {self.high}."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        self.guesses += 1
        if self.found:
            return "found already"
        if int(number) == self.secret:
            self.found = True
            return "yes"
        return "higher" if self.secret > int(number) else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0


ENVIRONMENTS = {"calculator": Calculator, "guess_number": GuessNumber}
