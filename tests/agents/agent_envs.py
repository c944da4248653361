"""Environments and tools the agent tests import by path (rollout.environment: agent_envs:Name)."""

from __future__ import annotations

import asyncio
import random
import time


class DiceCalculator:
    """multiply as a method; the reward also rolls the environment's own dice (so resuming must restore
    `rng` to replay the same rewards)."""

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.calls, self.roll = 0, 0.0

    def reset(self, **row) -> None:
        self.calls, self.roll = 0, self.rng.random()
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.calls += 1
        return a * b

    def get_reward(self) -> float:
        return float(self.calls) + self.roll


class Quiz(DiceCalculator):
    """Owns its data: reset() returns the question (drawn with the environment's rng)."""

    def reset(self, **row) -> str:
        super().reset(**row)
        a, b = self.rng.choice([(12, 34), (56, 78), (11, 22), (90, 13)])
        return f"What is {a}*{b}?"


class Greeter:
    """reset appends a greeting when the row names someone; its one tool is not multiply."""

    def reset(self, name: str | None = None, **row) -> str | None:
        return None if name is None else f" Hello {name}."

    def wave(self) -> str:
        """Wave back."""
        return "~"


class AsyncCalculator:
    """An async multiply that notes when each call starts and ends (to measure overlap)."""

    log: list = []

    def reset(self, **row) -> None:
        return None

    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers, slowly.

        Args:
            a: The first factor.
            b: The second factor.
        """
        start = time.monotonic()
        await asyncio.sleep(0.2)
        AsyncCalculator.log.append((start, time.monotonic()))
        return a * b
