"""One search method over a set of problems: the settings, their checks, and the report.

    spec = SearchSpec("best-of-n", budget=8, rm="runs/rm").check()
    report = search_evaluate(model, tokenizer, examples, cfg, spec, seed=0)
    report["accuracy"], report["tokens_per_problem"], report["problems"][0]

| method | budget is | scorer |
|---|---|---|
| greedy | 1 (no --budget) | none |
| majority | samples per problem | none |
| best-of-n | samples per problem | --rm PATH (outcome RM), or --prm PATH / steps (process; --prm-agg) |
| beam | beam width (each beam: --expand continuations per step) | --prm PATH / steps (required) |
| mcts | simulations (each node: --expand children) | --prm PATH / steps, or --rm PATH (a rollout's value) |

`grpokit eval --search METHOD --budget N` calls `search_evaluate` (grpokit.cli.eval).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.errors import suggest
from grpokit.search.beam import beam
from grpokit.search.best_of_n import best_of_n
from grpokit.search.common import SearchError, summarize
from grpokit.search.decode import Decoder
from grpokit.search.greedy import greedy
from grpokit.search.majority import majority
from grpokit.search.mcts import mcts
from grpokit.search.scorers import AGGREGATES, VERIFIER, load_outcome, load_process

METHODS = ("greedy", "majority", "best-of-n", "beam", "mcts")
BUDGET_IS = {"majority": "samples per problem", "best-of-n": "samples per problem", "beam": "the beam width",
             "mcts": "simulations per problem"}
TREE = ("beam", "mcts")     # step-level methods: --expand and --step-separator apply
PRM_HINT = f"--prm PATH (a process RM folder) or --prm {VERIFIER} (the arithmetic step verifier)"
DEFAULT_EXPAND = 2


@dataclass
class SearchSpec:
    """A search method and its budget and scorer, as given on the command line (None: not given)."""

    method: str
    budget: int | None = None
    rm: str | None = None                # outcome RM folder (best-of-n)
    prm: str | None = None               # process RM folder, or "steps" (best-of-n, beam)
    prm_agg: str | None = None           # min | last (default min)
    expand: int | None = None            # beam: continuations per beam per step (default 2)
    step_separator: str | None = None    # beam / --prm: default the PRM folder's, else rm.step_separator

    def check(self) -> SearchSpec:
        """The spec with defaults filled in; a SearchError (one line) for a bad combination."""
        m = self.method
        if m not in METHODS:
            raise SearchError(f"--search must be one of {', '.join(METHODS)}, got {m!r}{suggest(m, METHODS)}")
        budget = self._budget()
        scored = self.rm is not None or self.prm is not None
        if m in ("greedy", "majority") and scored:
            raise SearchError(f"--search {m} uses no scorer: drop --rm / --prm (best-of-n and beam use one)")
        if m in ("best-of-n", "mcts") and not scored:
            raise SearchError(f"--search {m} needs a scorer: --rm PATH (an outcome RM) or {PRM_HINT}")
        if self.rm is not None and self.prm is not None:
            raise SearchError("give one scorer: --rm (outcome) or --prm (process), not both")
        if m == "beam" and self.prm is None:
            raise SearchError(f"--search beam scores partial solutions step by step: it needs {PRM_HINT}"
                              + (", not --rm" if self.rm is not None else ""))
        if self.prm is None and self.prm_agg is not None:
            raise SearchError("--prm-agg applies to a process scorer: give --prm too, or drop --prm-agg")
        if self.prm is None and m not in TREE and self.step_separator is not None:
            raise SearchError("--step-separator applies to beam, mcts or a process scorer (--prm): drop it")
        if self.prm_agg is not None and self.prm_agg not in AGGREGATES:
            raise SearchError(f"--prm-agg must be one of {', '.join(AGGREGATES)}, got {self.prm_agg!r}")
        if self.step_separator == "":
            raise SearchError("--step-separator is empty: give the text that ends a step, e.g. '\\n' or '. '")
        if self.expand is not None and m not in TREE:
            raise SearchError("--expand is beam's continuations per beam (mcts: children per node): drop it "
                              "or use --search beam / mcts")
        if self.expand is not None and self.expand < 1:
            raise SearchError(f"--expand must be >= 1 (continuations per beam or node), got {self.expand}")
        agg = (self.prm_agg or "min") if self.prm is not None else None
        return dataclasses.replace(self, budget=budget, prm_agg=agg,
                                   expand=(self.expand or DEFAULT_EXPAND) if m in TREE else None)

    def _budget(self) -> int:
        if self.method == "greedy":
            if self.budget not in (None, 1):
                raise SearchError(f"--search greedy decodes one completion per problem: drop --budget "
                                  f"(got {self.budget})")
            return 1
        what = BUDGET_IS[self.method]
        if self.budget is None:
            raise SearchError(f"--search {self.method} needs --budget N ({what})")
        if self.budget < 1:
            raise SearchError(f"--budget must be >= 1 ({what}), got {self.budget}")
        return self.budget


def _finite(value: Any) -> Any:
    """JSON has no infinities or NaN: a non-finite float is reported as null (inside lists and dicts too)."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return None if isinstance(value, float) and not math.isfinite(value) else value


def search_evaluate(model, tokenizer, examples: Sequence, cfg, spec: SearchSpec, *, seed: int = 0,
                    progress: bool = False) -> dict[str, Any]:
    """Run `spec` (checked) on `examples`; the summary, the settings and one row per problem.

    Sampling is seeded with `seed` inside a forked RNG (the caller's state is left untouched)."""
    spec = spec.check()
    device = next(model.parameters()).device
    decoder = Decoder(model, tokenizer, cfg)
    scorer, separator = None, None
    if spec.rm is not None:
        scorer = load_outcome(spec.rm, cfg.rm, device)
        separator = (spec.step_separator or cfg.rm.step_separator) if spec.method in TREE else None
    elif spec.prm is not None:
        scorer, separator = load_process(spec.prm, spec.prm_agg, spec.step_separator, cfg.rm, device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.method == "greedy":
            results = greedy(decoder, examples, progress=progress)
        elif spec.method == "majority":
            results = majority(decoder, examples, spec.budget, progress=progress)
        elif spec.method == "best-of-n":
            results = best_of_n(decoder, examples, spec.budget, scorer, progress=progress)
        elif spec.method == "beam":
            results = beam(decoder, examples, spec.budget, scorer, separator, expand=spec.expand,
                           progress=progress)
        else:
            results = mcts(decoder, examples, spec.budget, scorer, separator, width=spec.expand,
                           progress=progress)
    settings = {"search": spec.method, "budget": spec.budget, "rm": spec.rm, "prm": spec.prm,
                "prm_agg": spec.prm_agg if spec.prm is not None else None, "step_separator": separator,
                "expand": spec.expand, "seed": seed}
    rows = [{"index": i, "correct": r.correct, "tokens": r.tokens, "seconds": r.seconds,
             "completion": r.completion, **{k: _finite(v) for k, v in r.extra.items()}}
            for i, r in enumerate(results)]
    return {**settings, **summarize(results), "problems": rows}
