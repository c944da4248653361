"""Majority voting (self-consistency, Wang et al. 2022): N samples, the most frequent final answer wins.

    results = majority(decoder, examples, budget=8)

For each problem, `budget` completions are sampled at the rollout temperature (one `sample_groups` call
with group_size = N: the prompt is prefilled once and read by its N rows). Each completion's final
answer is its vote (`grpokit.search.common.answer_key`: the last box, else ``#### x``; numbers compared by
value); completions without an answer do not vote. The winner is the answer with the most votes; a tie
goes to the answer sampled first. The chosen completion is the first sample carrying the winner, judged
by the answer checker; with no answer among the N, the first sample is chosen (and is wrong).
Cost: the N samples' tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from grpokit.search.common import ProblemResult, candidate_records, in_batches
from grpokit.search.decode import Decoder


def vote(keys: Sequence[str | None]) -> int | None:
    """Index of the first completion carrying the most frequent answer key (None keys do not vote).

    Ties go to the answer whose first sample came first; None when no completion has an answer."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(i for i, k in enumerate(keys) if k is not None and counts[k] == top)


def majority(decoder: Decoder, examples: Sequence, budget: int, *,
             progress: bool = False) -> list[ProblemResult]:
    """The voted answer of `budget` samples per example."""
    def solve(chunk: Sequence) -> list[ProblemResult]:
        groups = decoder.complete([ex.prompt for ex in chunk], budget)
        picks, right, extras = [], [], []
        records = candidate_records(chunk, groups)     # every sample's answer key and correctness, once
        for group, candidates in zip(groups, records):
            keys = [c["answer"] for c in candidates]
            i = vote(keys)
            j = 0 if i is None else i
            picks.append(group[j])
            right.append(candidates[j]["correct"])
            extras.append({"votes": 0 if i is None else keys.count(keys[i]),
                           "distinct_answers": len({k for k in keys if k is not None}),
                           "candidates": candidates})
        return [ProblemResult(c.text, ok, sum(x.tokens for x in group), 0.0, extra)
                for c, ok, group, extra in zip(picks, right, groups, extras)]
    return in_batches(examples, budget, solve, progress=progress, desc="search majority")
