"""Reward functions used by the trainer tests (loaded by import path, as a user's would be)."""


def share_of_a(prompts, completions, **kwargs):
    """Share of completion characters that are 'a': an easy reward whose optimum is 'aaaa...'."""
    return [sum(ch == "a" for ch in c) / max(len(c), 1) for c in completions]
