"""A user's reward module, loaded by import path in test_rewards.py ('example_user_rewards:...')."""


def short_answer_bonus(prompts, completions, answer, **kwargs):
    """TRL signature: 1.0 for completions shorter than 20 characters that mention the answer."""
    return [1.0 if len(c) < 20 and str(a) in c else 0.0 for c, a in zip(completions, answer)]


class Scorers:
    @staticmethod
    def abstain(prompts, completions, **kwargs):
        return [None] * len(completions)


NOT_A_FUNCTION = 3
