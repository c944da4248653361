"""What best-of-n and beam search rank candidates by: an outcome RM, a process RM, or the step verifier.

    score = outcome_scorer(load_reward_model("runs/rm", cfg.rm))     # one float per completion
    score = process_scorer(load_reward_model("runs/prm", cfg.rm), "min")   # the steps' min (or last)
    score = process_scorer(VerifierSteps(". "), "min")                  # `--prm steps`: no model at all
    score(prompts, completions)  ->  [float, ...]

A process scorer reads one score per step and aggregates them (`aggregate`):

    min:  s = min_j r_j   (a solution is as good as its weakest step; the usual choice for PRM search)
    last: s = r_J         (the score of the last step so far, the PRM's estimate that the solution is right)

A completion with no step scores -inf (it never beats a scored one). Neither scorer sees the reference
answer. `VerifierSteps` is the arithmetic step verifier (`grpokit.rewards.steps.check_steps`) as a
process scorer: a step scores 1 when every equation ending in it is right, else 0, and the step holding
the final box scores 1 only when, in addition, the boxed value equals the last equation's result (the
answer agrees with the work shown): the labels `grpokit rm collect --step-labels verifier` writes, with
that self-consistency check standing in for the reference answer. A text without a box (a partial
solution in beam search) is judged on its equations only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpokit.rewards.answers import extract_boxed, normalize_number
from grpokit.rewards.outcome_rm import META_FILE, load_reward_model
from grpokit.rewards.rm_data import verifier_step_labels
from grpokit.rewards.rm_text import completion_text, split_steps
from grpokit.rewards.steps import check_steps
from grpokit.search.common import SearchError

AGGREGATES = ("min", "last")
VERIFIER = "steps"    # `--prm steps`: the rule-based step verifier instead of a process RM folder
Scorer = Callable[[Sequence[Any], Sequence[str]], list[float]]


def aggregate(step_scores: Sequence[float], how: str) -> float:
    """One score from a completion's step scores: their min, or the last one; -inf without steps."""
    if not step_scores:
        return -math.inf
    return min(step_scores) if how == "min" else step_scores[-1]


def answer_agrees(text: str) -> bool:
    """Whether the last boxed value equals the result of the last equation written before it.

    True without a box (a partial solution has not answered yet) or without an equation before it."""
    boxed = extract_boxed(text)
    box_at = text.rfind("\\boxed")
    before = [s for s in check_steps(text) if s.end <= box_at]
    if boxed is None or not before:
        return True
    result = normalize_number(before[-1].text.rsplit("=", 1)[-1])
    value = normalize_number(boxed)
    return result is not None and value is not None and abs(result - value) < 1e-9


class VerifierSteps:
    """The arithmetic step verifier as a process scorer (see the module docstring); no model, no answer."""

    kind = "process"

    def __init__(self, step_separator: str) -> None:
        self.step_separator = step_separator

    def score_steps(self, prompts: Sequence[Any],
                    completions: Sequence[Any]) -> list[list[tuple[int, float]]]:
        """Per completion, (end char of the step, 1.0 or 0.0) for each step."""
        out = []
        for completion in completions:
            text = completion_text(completion)
            spans = split_steps(text, self.step_separator)
            labels = verifier_step_labels(text, spans, answer_agrees(text))
            out.append([(end, label) for (_, end), label in zip(spans, labels)])
        return out


def outcome_scorer(rm) -> Scorer:
    """An outcome reward model's score per completion (`RewardModel.__call__`)."""
    return lambda prompts, completions: [float(s) for s in rm(list(prompts), list(completions))]


def process_scorer(prm, how: str) -> Scorer:
    """A process scorer's (`ProcessRewardModel`, `VerifierSteps`) step scores, aggregated by `how`."""
    if how not in AGGREGATES:
        raise SearchError(f"--prm-agg must be one of {', '.join(AGGREGATES)}, got {how!r}")

    def score(prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
        steps = prm.score_steps(list(prompts), list(completions))
        return [aggregate([r for _, r in pairs], how) for pairs in steps]
    return score


def load_outcome(path: str, rm_cfg, policy_device) -> Scorer:
    """`--rm PATH`: an outcome reward-model folder as a scorer."""
    rm = load_reward_model(path, rm_cfg, policy_device=policy_device)
    if rm.kind != "outcome":
        raise SearchError(f"--rm '{path}' holds a {rm.kind} reward model: pass it as --prm {path}")
    return outcome_scorer(rm)


def _trained_separator(path: str) -> str | None:
    """The step separator a PRM folder was trained with (its grpokit_rm.json), or None."""
    try:
        return json.loads((Path(path) / META_FILE).read_text(encoding="utf-8")).get("step_separator")
    except (OSError, ValueError, AttributeError):
        return None     # no or unreadable metadata: load_reward_model reports what is wrong


def load_process(path: str, how: str, separator: str | None, rm_cfg, policy_device) -> tuple[Scorer, str]:
    """`--prm PATH` (or `--prm steps`): a process scorer and the step separator it splits steps at.

    The separator is --step-separator, else the PRM folder's own (the one it was trained with; a
    different --step-separator is overridden with a warning, as `load_reward_model` does), else
    rm.step_separator."""
    if path == VERIFIER:
        prm = VerifierSteps(separator or rm_cfg.step_separator)
    else:
        separator = separator or _trained_separator(path)
        options = {"step_separator": separator} if separator else {}
        prm = load_reward_model(path, rm_cfg, policy_device=policy_device, **options)
        if prm.kind != "process":
            raise SearchError(f"--prm '{path}' holds an {prm.kind} reward model: pass it as --rm {path}")
    return process_scorer(prm, how), prm.step_separator
