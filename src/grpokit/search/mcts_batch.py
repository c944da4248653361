"""MCTS over reasoning steps for B prompts in lockstep, keeping the trajectory of every simulation: the
sampler of MCTS rollouts for training (`grpokit.train.mcts_rollouts`, rollout.mcts.*).

    rollout, searches = mcts_sample(decoder, prompts, MctsSpec(simulations=G, separator=". "), value)

The tree and a simulation are inference MCTS's (`grpokit.search.mcts`): from the root, select by UCT
with progressive widening; expand the selected node by one sampled step; complete the new child with one
sampled rollout (to EOS or the length limit); score the completed text; back the value up the path. For
training three things change:

- **Lockstep over the batch.** Each round runs one simulation of every search still going: B
  selections, then ONE `Decoder.extend` call for all the expansions (one step each), ONE for all the
  rollouts, and ONE value call for the completed texts. The B searches share decode batches, not trees.
- **The group.** Simulation j of prompt b is row b*G + j of the Rollout, G = `simulations`: its
  completed trajectory, i.e. the selected node's partial solution, the new step and the rollout (a
  simulation that selects a finished node yields that node's solution again and decodes nothing). Each
  token keeps its sampling log-prob (`Completion.logprobs`; a node keeps those of its whole partial
  solution), so the rows' `sampling_logprobs` are those of a flat sample's tokens.
- **A token budget** per group (`max_tokens`, None: none): every decode call's limit is also capped at
  what the group has left, so a group never decodes more than max_tokens; its search stops once the
  budget is spent, and the simulations it did not run are empty rows (`to_rollout`).

A value that is not finite (a process scorer's completion with no step, every reward abstaining) is
backed up as 0. A step that equals an existing child's is not added twice (the existing child is
visited; its tokens are still spent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from grpokit.rollout.contract import Rollout, assemble_rollout, pad_rows
from grpokit.search.common import Completion
from grpokit.search.decode import Decoder
from grpokit.search.mcts import C_UCT, Node, back_up, select_leaf

# value(batch indices b, completed texts, completed token ids) -> one value per completion
Value = Callable[[Sequence[int], Sequence[str], Sequence[list[int]]], list[float]]


@dataclass(frozen=True)
class MctsSpec:
    """One group's search: G simulations over steps ending at `separator`."""

    simulations: int                  # G: simulations, and trajectories, per group
    separator: str                    # the text that ends a reasoning step
    width: int = 2                    # progressive widening: max(1, floor(width * sqrt(N))) expansions
    max_tokens: int | None = None     # tokens a group may decode (expansions and rollouts); None: no budget
    exploration: float = C_UCT        # UCT's c


@dataclass
class StepNode(Node):
    """A tree node that also keeps the sampling log-prob of each of its ids and whether it ended with EOS."""

    logprobs: list[float] = field(default_factory=list)
    ended: bool = False


@dataclass
class Visit:
    """One simulation's completed trajectory (token ids after the prompt) and its value."""

    ids: list[int]
    logprobs: list[float]             # per id, under the sampling distribution
    ended: bool                       # ends with EOS (False: cut by the length limit or the token budget)
    value: float = math.nan


@dataclass
class GroupSearch:
    """One prompt's search: its tree, its simulations' trajectories so far and what it cost."""

    index: int                        # b, the prompt's position in the batch
    head: list[int]                   # the prompt's token ids (no padding)
    root: StepNode = field(default_factory=lambda: StepNode([]))
    visits: list[Visit] = field(default_factory=list)
    tokens: int = 0                   # decoded: every expansion and rollout token
    prefill_tokens: int = 0           # prompt + partial solution tokens fed to the decode calls
    nodes: int = 1

    def left(self, spec: MctsSpec) -> float:
        """Tokens this group may still decode (inf without a budget)."""
        return math.inf if spec.max_tokens is None else spec.max_tokens - self.tokens

    def going(self, spec: MctsSpec) -> bool:
        """Simulations left to run, and budget to run them."""
        return len(self.visits) < spec.simulations and self.left(spec) > 0


def _decode(decoder: Decoder, jobs: list[tuple[GroupSearch, StepNode]], spec: MctsSpec,
            separator: str | None) -> list[Completion]:
    """One `Decoder.extend` call: a continuation of each job's node (one step; separator None: to EOS or the
    limit), at most the length left and the group's budget left; its tokens charged to the group."""
    if not jobs:
        return []
    prefixes = [s.head + node.ids for s, node in jobs]
    limits = [int(min(decoder.max_new_tokens - len(node.ids), s.left(spec))) for s, node in jobs]
    out = [group[0] for group in decoder.extend(prefixes, 1, limits, separator)]
    for (s, _), prefix, c in zip(jobs, prefixes, out):
        s.tokens += c.tokens
        s.prefill_tokens += len(prefix)
    return out


def _grow(search: GroupSearch, node: StepNode, step: Completion, limit: int) -> StepNode:
    """The child `step` leads to from `node`: an existing child with the same ids, else a new one."""
    node.expansions += 1
    ids = node.ids + step.ids
    child = next((ch for ch in node.children if ch.ids == ids), None)
    if child is None:
        child = StepNode(ids, done=step.ended or len(ids) >= limit, logprobs=node.logprobs + step.logprobs,
                         ended=step.ended)
        node.children.append(child)
        search.nodes += 1
    return child


def simulate(decoder: Decoder, searches: Sequence[GroupSearch], spec: MctsSpec, value: Value) -> None:
    """One simulation of every search still going (module docstring); each gains one trajectory."""
    live = [s for s in searches if s.going(spec)]
    paths = [select_leaf(s.root, spec.width, spec.exploration) for s in live]
    grow = [i for i, path in enumerate(paths) if not path[-1].done]
    steps = _decode(decoder, [(live[i], paths[i][-1]) for i in grow], spec, spec.separator)
    for i, step in zip(grow, steps):
        paths[i].append(_grow(live[i], paths[i][-1], step, decoder.max_new_tokens))
    roll = [i for i in grow if not paths[i][-1].done and live[i].left(spec) > 0]
    rests = dict(zip(roll, _decode(decoder, [(live[i], paths[i][-1]) for i in roll], spec, None)))
    visits = []
    for i, path in enumerate(paths):
        node, rest = path[-1], rests.get(i)
        if rest is not None:
            visits.append(Visit(node.ids + rest.ids, node.logprobs + rest.logprobs, rest.ended))
        else:        # a finished node (selected again: its value as backed up before), or a cut step
            visits.append(Visit(node.ids, node.logprobs, node.ended, math.nan if i in grow else node.best[0]))
    if grow:                    # the new trajectories, scored together
        texts = [decoder.tokenizer.decode(visits[i].ids, skip_special_tokens=True) for i in grow]
        scores = value([live[i].index for i in grow], texts, [visits[i].ids for i in grow])
        for i, v in zip(grow, scores):
            visits[i].value = float(v) if math.isfinite(v) else 0.0
    for s, path, visit in zip(live, paths, visits):
        back_up(path, visit.value, visit.ids)
        s.visits.append(visit)


def run_searches(decoder: Decoder, searches: Sequence[GroupSearch], spec: MctsSpec, value: Value) -> None:
    """Simulation rounds until every search has run its G simulations or spent its budget (<= G rounds)."""
    while any(s.going(spec) for s in searches):
        simulate(decoder, searches, spec, value)


def to_rollout(decoder: Decoder, prompts: Sequence, searches: Sequence[GroupSearch], group_size: int,
               device) -> Rollout:
    """The searches' trajectories as a Rollout of B * G rows: row b*G + j is prompt b's simulation j.

    A simulation the budget left unrun is an empty row (completion_mask 0, truncated, text "", `unrun`);
    scoring leaves it out of its group's rewards (`grpokit.train.collect.scored`). The searches' sums
    (`search_stats`) travel as the Rollout's `sampler_stats`."""
    G, pad = group_size, decoder.tokenizer.pad_token_id
    rows = [s.visits[j] if j < len(s.visits) else None for s in searches for j in range(G)]
    T = max([len(v.ids) for v in rows if v is not None], default=0) or 1
    P = max(len(s.head) for s in searches)
    return assemble_rollout(
        tokenizer=decoder.tokenizer, prompts=prompts, group_size=G, eos_ids=decoder.eos_ids,
        prompt_ids=pad_rows([s.head for s in searches], P, pad, left=True),
        prompt_mask=pad_rows([[1] * len(s.head) for s in searches], P, 0, left=True),
        completion_ids=pad_rows([[] if v is None else v.ids for v in rows], T, pad),
        lengths=[0 if v is None else len(v.ids) for v in rows], cut_at_eos=False,
        sampling_logprobs=pad_rows([[] if v is None else v.logprobs for v in rows], T, 0.0,
                                   dtype=torch.float32),
        completions=["" if v is None else decoder.tokenizer.decode(v.ids, skip_special_tokens=True)
                     for v in rows], device=device,
        unrun=torch.tensor([v is None for v in rows]), sampler_stats=search_stats(searches))


def mcts_sample(decoder: Decoder, prompts: Sequence, spec: MctsSpec, value: Value,
                device="cpu") -> tuple[Rollout, list[GroupSearch]]:
    """One search per prompt, run in lockstep; the Rollout of their trajectories, and the searches."""
    searches = [GroupSearch(b, decoder.prompt_ids(p)) for b, p in enumerate(prompts)]
    run_searches(decoder, searches, spec, value)
    return to_rollout(decoder, prompts, searches, spec.simulations, device), searches


def search_stats(searches: Sequence[GroupSearch]) -> dict[str, float]:
    """Sums over the searches: decoded and prefill tokens, nodes, simulations run, groups, and the roots'
    value sums and visits (a mean value is their ratio)."""
    return {"tokens": float(sum(s.tokens for s in searches)),
            "prefill_tokens": float(sum(s.prefill_tokens for s in searches)),
            "nodes": float(sum(s.nodes for s in searches)),
            "simulations": float(sum(len(s.visits) for s in searches)),
            "groups": float(len(searches)),
            "value_sum": float(sum(s.root.value_sum for s in searches)),
            "visits": float(sum(s.root.visits for s in searches))}
