"""Greedy decoding: one argmax completion per problem, the baseline row (`grpokit eval`'s pass@1).

    results = greedy(decoder, examples)

Its accuracy is `grpokit.train.evaluate.evaluate`'s `accuracy` on the same problems (the same decode,
the same batches, the same answer checker); its tokens are each completion's length with the EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpokit.search.common import ProblemResult, correctness, in_batches
from grpokit.search.decode import Decoder


def greedy(decoder: Decoder, examples: Sequence, *, progress: bool = False) -> list[ProblemResult]:
    """One greedy completion per example."""
    def solve(chunk: Sequence) -> list[ProblemResult]:
        rows = [group[0] for group in decoder.complete([ex.prompt for ex in chunk], 1, greedy=True)]
        right = correctness(chunk, [c.text for c in rows])
        return [ProblemResult(c.text, ok, c.tokens, 0.0) for c, ok in zip(rows, right)]
    return in_batches(examples, 1, solve, progress=progress, desc="search greedy")
