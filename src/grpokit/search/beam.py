"""Step-level beam search guided by a process scorer (a PRM, or the step verifier).

    results = beam(decoder, examples, budget=4, scorer=prm_score, separator=". ", expand=2)

A step is the text up to and including the step separator (`--step-separator`: a newline for
step-per-line solutions; the demo's arithmetic writes ``37+58=95. \\boxed{95}``, whose equation ends at
``". "``). Beams are partial solutions (token ids after the prompt). For each problem:

    beams = [empty solution]; round 0 expands it budget * expand times
    repeat:
        every live beam -> `expand` sampled continuations of one step   (Decoder.extend: a step ends at the
                                                                        separator, at EOS, or the limit)
        score each new candidate (prompt + its partial text) with the process scorer (min or last)
        beams = the `budget` best of (finished beams kept so far + the new candidates)
    until every kept beam is finished (EOS, or rollout.max_completion_length tokens)
    answer = the best-scored beam

Ties keep the earlier candidate (finished beams first, then new ones in sampling order). After round 0
exactly `budget` beams are kept: each live beam gives `expand` >= 1 candidates, so the pool never shrinks.
Cost: generated tokens = every sampled step, kept or discarded. The readable path (`search_one`,
through `Decoder.extend`) also prefills every live beam's prompt + partial solution once a round (shared
by its `expand` rows), reported as `prefill_tokens`. Where the sampler's lean decoder runs the model,
`beam` keeps one KV cache per problem instead (`search_one_kept`, `grpokit.search.kept_cache`): the
prompt is prefilled once, kept beams are forked in the cache, and no token is decoded twice
(`prefill_tokens` is then the prompt's length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpokit import switch
from grpokit.search import kept_cache
from grpokit.search.common import ProblemResult, one_at_a_time
from grpokit.search.decode import Decoder, step_over
from grpokit.search.scorers import Scorer

# Keep each problem's KV cache across rounds (the lean decoder's models; others take the readable path).
# SmolLM2-135M-Instruct, GSM8K, beam 4 x 2, one core: 14.8 against 49.4 ms a generated token, 3.34x
# (benchmarks/beam_cache.py; docs/search.md).
KEEP_CACHE = True


@dataclass
class Beam:
    """A partial (or finished) solution: its token ids after the prompt and its scorer score."""

    ids: list[int]
    score: float
    done: bool         # ended with EOS, or reached the token limit
    row: int = -1      # its row in the kept cache (search_one_kept), whose last id is not yet fed


def select(candidates: Sequence[Beam], width: int) -> list[Beam]:
    """The `width` best-scored candidates, best first; a tie keeps the earlier candidate."""
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, i))
    return [candidates[i] for i in order[:width]]


def next_round(decoder: Decoder, prompt, scorer: Scorer, beams: list[Beam], fresh: list[Beam], width: int,
               cost: dict[str, int]) -> list[Beam]:
    """Score a round's new candidates, count the round, and keep the `width` best of them and the
    finished beams so far."""
    texts = [decoder.tokenizer.decode(c.ids, skip_special_tokens=True) for c in fresh]
    for c, score in zip(fresh, scorer([prompt] * len(fresh), texts)):
        c.score = score
    cost["rounds"] += 1
    return select([b for b in beams if b.done] + fresh, width)


def search_one(decoder: Decoder, prompt, width: int, expand: int, scorer: Scorer,
               separator: str) -> tuple[Beam, dict[str, int]]:
    """Beam search on one prompt: the best finished beam and its costs {tokens, prefill_tokens, rounds}."""
    head, limit = decoder.prompt_ids(prompt), decoder.max_new_tokens
    beams, cost = [Beam([], 0.0, False)], {"tokens": 0, "prefill_tokens": 0, "rounds": 0}
    while any(not b.done for b in beams):
        live = [b for b in beams if not b.done]
        per_beam = expand * width if cost["rounds"] == 0 else expand
        steps = decoder.extend([head + b.ids for b in live], per_beam, [limit - len(b.ids) for b in live],
                               separator)
        fresh = []
        for b, group in zip(live, steps):
            for step in group:
                ids = b.ids + step.ids
                fresh.append(Beam(ids, 0.0, step.ended or len(ids) >= limit))
                cost["tokens"] += step.tokens
        cost["prefill_tokens"] += sum(len(head) + len(b.ids) for b in live)
        beams = next_round(decoder, prompt, scorer, beams, fresh, width, cost)
    return beams[0], cost


@torch.no_grad()
def search_one_kept(decoder: Decoder, prompt, width: int, expand: int, scorer: Scorer,
                    separator: str) -> tuple[Beam, dict[str, int]]:
    """`search_one` with the problem's KV cache kept across rounds: the same rounds, selection and token
    counts; each step is sampled from the same distribution (not the same draws)."""
    head, limit, r = decoder.prompt_ids(prompt), decoder.max_new_tokens, decoder.cfg.rollout
    rows = kept_cache.KeptRows(decoder.model, head, width * expand, limit)
    beams, cost = [Beam([], 0.0, False)], {"tokens": 0, "prefill_tokens": len(head), "rounds": 0}
    logits = rows.first.repeat(width * expand, 1)                        # round 0: the prompt's rows
    while any(not b.done for b in beams):
        live = [b for b in beams if not b.done]
        per_beam = expand * width if cost["rounds"] == 0 else expand
        if cost["rounds"] > 0:
            parents = [b for b in live for _ in range(per_beam)]
            rows.fork([b.row for b in parents])
            pending = torch.tensor([b.ids[-1] for b in parents], device=rows.pos.device)
            logits = rows.step(pending, torch.ones_like(pending, dtype=torch.bool))
        limits = [limit - len(b.ids) for b in live for _ in range(per_beam)]
        steps = kept_cache.decode_round(
            rows, logits, limits, lambda ids: step_over(decoder.tokenizer, decoder.eos_ids, ids, separator),
            temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
        fresh = []
        for i, (step_ids, _) in enumerate(steps):
            ids = live[i // per_beam].ids + step_ids
            ended = step_ids[-1] in decoder.eos_ids or len(ids) >= limit
            fresh.append(Beam(ids, 0.0, ended, row=i))
            cost["tokens"] += len(step_ids)
        beams = next_round(decoder, prompt, scorer, beams, fresh, width, cost)
    return beams[0], cost


def beam(decoder: Decoder, examples: Sequence, budget: int, scorer: Scorer, separator: str, *,
         expand: int = 2, progress: bool = False) -> list[ProblemResult]:
    """Step-level beam search of width `budget` per example (one problem at a time); with the KV cache
    kept across rounds where the lean decoder runs the model (KEEP_CACHE)."""
    def solve(prompt) -> tuple[str, int, dict]:
        if kept(decoder, prompt):
            with switch.accelerated(decoder.model):
                best, cost = search_one_kept(decoder, prompt, budget, expand, scorer, separator)
        else:
            best, cost = search_one(decoder, prompt, budget, expand, scorer, separator)
        return (decoder.tokenizer.decode(best.ids, skip_special_tokens=True), cost["tokens"],
                {"score": best.score, "prefill_tokens": cost["prefill_tokens"], "rounds": cost["rounds"]})
    return one_at_a_time(examples, solve, progress=progress, desc="search beam")


def kept(decoder, prompt) -> bool:
    """Whether this problem's beams keep their KV cache (KEEP_CACHE, a real Decoder, the lean decoder)."""
    return KEEP_CACHE and isinstance(decoder, Decoder) and kept_cache.supported(
        decoder.model, decoder.cfg.rollout.backend, len(decoder.prompt_ids(prompt)), decoder.max_new_tokens)
