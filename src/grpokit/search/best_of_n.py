"""Best-of-N: N samples ranked by a scorer, the top-scored one is the answer.

    results = best_of_n(decoder, examples, budget=8, scorer=load_outcome("runs/rm", cfg.rm, device))

For each problem, `budget` completions are sampled at the rollout temperature (one `sample_groups` call
with group_size = N) and scored by `scorer(prompts, completions) -> [float]`: an outcome RM (`--rm`), or
a process scorer's step scores aggregated by their min or last (`--prm`, `--prm-agg`; see
`grpokit.search.scorers`). The chosen completion is the argmax; a tie goes to the first sampled, and a
NaN score never wins. Cost: the N samples' tokens (the scorer's forward passes are not generated tokens;
their time is in the wall seconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from grpokit.search.common import ProblemResult, candidate_records, in_batches
from grpokit.search.decode import Decoder
from grpokit.search.scorers import Scorer


def pick_best(scores: Sequence[float]) -> int:
    """Index of the highest score; the first one on a tie; NaN counts as -inf."""
    clean = [-math.inf if math.isnan(s) else s for s in scores]
    return max(range(len(clean)), key=lambda i: (clean[i], -i))


def best_of_n(decoder: Decoder, examples: Sequence, budget: int, scorer: Scorer, *,
              progress: bool = False) -> list[ProblemResult]:
    """The top-scored of `budget` samples per example."""
    def solve(chunk: Sequence) -> list[ProblemResult]:
        groups = decoder.complete([ex.prompt for ex in chunk], budget)
        scores = scorer([ex.prompt for ex in chunk for _ in range(budget)],
                        [c.text for group in groups for c in group])
        picks, right, extras = [], [], []
        records = candidate_records(chunk, groups, scores)     # every sample judged once, here
        for g, group in enumerate(groups):
            mine = scores[g * budget:(g + 1) * budget]
            i = pick_best(mine)
            picks.append(group[i])
            right.append(records[g][i]["correct"])
            extras.append({"score": mine[i], "pick": i, "candidates": records[g]})
        return [ProblemResult(c.text, ok, sum(x.tokens for x in group), 0.0, extra)
                for c, ok, group, extra in zip(picks, right, groups, extras)]
    return in_batches(examples, budget, solve, progress=progress, desc="search best-of-n")
