"""Reward functions used by the trainer tests (loaded by import path, as a user's would be)."""

import os
import time


def share_of_a(prompts, completions, **kwargs):
    """Share of completion characters that are 'a': an easy reward whose optimum is 'aaaa...'."""
    return [sum(ch == "a" for ch in c) / max(len(c), 1) for c in completions]


def paced_dense(prompts, completions, **kwargs):
    """A reward that differs within every group (so every step moves the weights), given after sleeping
    $REWARD_SLEEP seconds: a test slows a run down with it without changing what the run learns."""
    time.sleep(float(os.environ.get("REWARD_SLEEP", "0")))
    return [sum(map(ord, c)) % 13 / 13 for c in completions]


def broken(prompts, completions, **kwargs):
    """A reward function with a bug: it raises on its first call."""
    raise KeyError("answer")
