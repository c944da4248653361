"""What every search method shares: a decoded completion, a problem's result, answer keys, errors.

Every method ends with one chosen completion per problem; it is judged by the same answer checker as
greedy evaluation (`grpokit.rewards.scoring.accuracy_reward`: the last box, else ``#### x``, against the
reference). Cost is counted in generated tokens: every token the policy decoded for the problem, up to
and including each row's EOS, over every sample, expansion and discarded beam (the prompt and the
re-read partial solutions are not generated tokens; beam and mcts report those as `prefill_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from grpokit.errors import UserError
from grpokit.rewards.answers import extract_answer, normalize_answer, normalize_number
from grpokit.rewards.scoring import REWARDS
from grpokit.train.evaluate import EVAL_BATCH


class SearchError(UserError):
    """A bad search setting (method, budget, scorer): the message is one line that says what to change."""


@dataclass
class Completion:
    """One decoded completion (or one step of one, in beam search)."""

    text: str          # decoded text, special tokens skipped
    tokens: int        # tokens decoded for it, its EOS included
    ended: bool        # it ended with EOS (False: cut by the length limit, or stopped at a step end)
    ids: list[int] = field(default_factory=list)   # its token ids (filled where a method needs them)
    logprobs: list[float] = field(default_factory=list)   # per id: its log-prob under the sampling
                                                          # distribution (Decoder.extend fills it)


@dataclass
class ProblemResult:
    """One problem's outcome under a search method."""

    completion: str     # the chosen completion
    correct: float      # 1.0 / 0.0 by the answer checker (NaN without a reference answer)
    tokens: int         # generated tokens spent on the problem, every candidate counted
    seconds: float      # wall seconds (a batch's time shared equally by its problems)
    extra: dict = field(default_factory=dict)   # method-specific figures (votes, scores, rounds)


def answer_key(text: str) -> str | None:
    """What majority voting counts: the final answer, numbers compared by value ('95', '95.0' agree)."""
    answer = extract_answer(text)
    if answer is None or not answer.strip():
        return None
    number = normalize_number(answer)
    return repr(number) if number is not None else normalize_answer(answer)


def correctness(examples: Sequence, texts: Sequence[str]) -> list[float]:
    """1.0 / 0.0 per (example, chosen completion), by the accuracy reward; NaN when there is no answer."""
    if not examples or "answer" not in examples[0].columns:
        return [float("nan")] * len(texts)
    return REWARDS["accuracy"]([ex.prompt for ex in examples], list(texts),
                               answer=[ex.columns["answer"] for ex in examples])


def candidate_records(examples: Sequence, groups: Sequence[Sequence[Completion]],
                      scores: Sequence[float] | None = None) -> list[list[dict[str, Any]]]:
    """Per problem, one record per sampled candidate: its answer key, correctness, tokens (and score).

    What a report needs to show how far the chosen answer is from the best candidate (pass@N) and how
    the votes or scores fell; the texts are not kept (only the chosen completion's)."""
    size = len(groups[0]) if groups else 0
    flat = [c for group in groups for c in group]
    right = correctness([ex for ex in examples for _ in range(size)], [c.text for c in flat])
    out = []
    for g, group in enumerate(groups):
        rows = []
        for j, c in enumerate(group):
            k = g * size + j
            row = {"answer": answer_key(c.text), "correct": right[k], "tokens": c.tokens}
            if scores is not None:
                row["score"] = scores[k]
            rows.append(row)
        out.append(rows)
    return out


def summarize(results: Sequence[ProblemResult]) -> dict[str, float]:
    """accuracy, tokens_per_problem, seconds and seconds_per_problem over the problems; with candidate
    records (majority, best-of-n), also oracle_accuracy: a right answer among the candidates (pass@N)."""
    n = len(results)
    out = {"num_problems": float(n),
           "accuracy": sum(r.correct for r in results) / n,
           "tokens_per_problem": sum(r.tokens for r in results) / n,
           "seconds": sum(r.seconds for r in results),
           "seconds_per_problem": sum(r.seconds for r in results) / n}
    if results and all("candidates" in r.extra for r in results):
        out["oracle_accuracy"] = sum(any(c["correct"] == 1.0 for c in r.extra["candidates"])
                                     for r in results) / n
    return out


def in_batches(examples: Sequence, rows_per_problem: int, solve: Callable[[Sequence], list[ProblemResult]],
               *, batch_rows: int = EVAL_BATCH, progress: bool = False,
               desc: str = "search") -> list[ProblemResult]:
    """Solve the examples in batches of about `batch_rows` decoded rows (the evaluation batch); each
    batch's wall time is shared equally by its problems."""
    size = max(1, batch_rows // rows_per_problem)
    out: list[ProblemResult] = []
    for s in tqdm(range(0, len(examples), size), desc=desc, disable=not progress, leave=False,
                  dynamic_ncols=True):
        chunk = examples[s:s + size]
        start = time.perf_counter()
        results = solve(chunk)
        share = (time.perf_counter() - start) / len(chunk)
        for r in results:
            r.seconds = share
        out += results
    return out


def one_at_a_time(examples: Sequence, solve: Callable[[Any], tuple[str, int, dict]], *,
                  progress: bool = False, desc: str = "search") -> list[ProblemResult]:
    """Solve the examples one by one: `solve(prompt)` -> (chosen completion, generated tokens, extra);
    each problem's wall time is its own, and the completion is judged by the answer checker."""
    out = []
    for ex in tqdm(examples, desc=desc, disable=not progress, leave=False, dynamic_ncols=True):
        start = time.perf_counter()
        text, tokens, extra = solve(ex.prompt)
        seconds = time.perf_counter() - start
        out.append(ProblemResult(text, correctness([ex], [text])[0], tokens, seconds, extra))
    return out
