"""Monte Carlo tree search over reasoning steps (UCT), at inference.

    results = mcts(decoder, examples, budget=8, scorer=prm_score, separator=". ", width=2)

A node is a partial solution (token ids after the prompt); an edge is one sampled reasoning step
(`Decoder.extend`: up to the step separator, EOS or the length limit). The budget is the number of
simulations; each one does

    1. select:   from the root, while the node is not finished and may not take another child, go to the
                 child with the largest  UCT = W/N + c * sqrt(ln N_parent / N)  (unvisited: +inf; a tie:
                 the child created first). Progressive widening: a node of N visits may have been
                 expanded max(1, floor(width * sqrt(N))) times, so a much-visited node keeps sampling
                 new steps (with a fixed width, a tree over a two-step solution fills up after a few
                 simulations and the rest only revisit finished leaves)
    2. expand:   sample one step from that node: a new child (a step already there is not added twice;
                 the attempt still counts as an expansion and its tokens are spent)
    3. simulate: complete the child's solution with one sampled rollout (to EOS or the limit); its value
                 v is the scorer's score of the completed text (a finished child is scored as it is)
    4. back up:  N += 1, W += v on the child and every node above it; each node keeps the best-valued
                 completed solution that passed through it

A finished node (EOS or the limit) that is selected again is not decoded: its value is backed up again.
The answer is the best-valued completed solution of the whole search (the root's record; a tie: the one
found first): a value is the scorer's judgment of a whole solution, so the best one found is kept rather
than the end of the most-visited path (docs/search.md: on the same trees, 23/50 demo problems right
against 19/50). Values are the scorer's raw
scores; UCT's c = sqrt(2) assumes values in [0, 1] (the step verifier's 0/1, or a PRM with
rm.transform=sigmoid). Cost: every expansion step and every rollout token; each decode call also
prefills the node's prompt + partial solution (`prefill_tokens`), since no KV cache is kept between calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from grpokit.search.common import ProblemResult, one_at_a_time
from grpokit.search.decode import Decoder
from grpokit.search.scorers import Scorer

C_UCT = math.sqrt(2.0)


@dataclass
class Node:
    """A partial solution in the search tree."""

    ids: list[int]                      # token ids after the prompt
    done: bool = False                  # ended with EOS, or reached the token limit
    children: list[Node] = field(default_factory=list)
    expansions: int = 0                 # steps sampled from this node (duplicates included)
    visits: int = 0                     # N
    value_sum: float = 0.0              # W
    best: tuple[float, list[int]] = (-math.inf, [])   # the best (value, completed ids) seen through it


def uct(parent_visits: int, child: Node, c: float = C_UCT) -> float:
    """UCT score of a child: mean value plus the exploration bonus; +inf for an unvisited child."""
    if child.visits == 0:
        return math.inf
    return child.value_sum / child.visits + c * math.sqrt(math.log(parent_visits) / child.visits)


def select_child(node: Node, c: float = C_UCT) -> Node:
    """The child with the largest UCT score; a tie goes to the child created first."""
    scores = [uct(node.visits, ch, c) for ch in node.children]
    return node.children[max(range(len(scores)), key=lambda i: (scores[i], -i))]


def may_expand(node: Node, width: int) -> bool:
    """Progressive widening: a node of N visits may be expanded max(1, floor(width * sqrt(N))) times."""
    return not node.done and node.expansions < max(1, math.floor(width * math.sqrt(node.visits)))


def select_leaf(root: Node, width: int, c: float = C_UCT) -> list[Node]:
    """The path from the root to the node to expand (or to a finished node to back up again)."""
    path = [root]
    while not path[-1].done and not may_expand(path[-1], width) and path[-1].children:
        path.append(select_child(path[-1], c))
    return path


def back_up(path: Sequence[Node], value: float, completed: list[int]) -> None:
    """Add one visit of value `value` to every node of the path; keep the best completed solution."""
    for node in path:
        node.visits += 1
        node.value_sum += value
        if value > node.best[0]:
            node.best = (value, completed)


def search_one(decoder: Decoder, prompt, simulations: int, width: int, scorer: Scorer,
               separator: str) -> tuple[Node, dict[str, int]]:
    """MCTS on one prompt: the root (its tree) and the costs {tokens, prefill_tokens, nodes}."""
    head, limit = decoder.prompt_ids(prompt), decoder.max_new_tokens
    root, cost = Node([]), {"tokens": 0, "prefill_tokens": 0, "nodes": 1}
    for _ in range(simulations):
        path = select_leaf(root, width)
        node = path[-1]
        if node.done:
            back_up(path, node.best[0], node.best[1])
            continue
        [step] = decoder.extend([head + node.ids], 1, [limit - len(node.ids)], separator)[0]
        node.expansions += 1
        cost["tokens"] += step.tokens
        cost["prefill_tokens"] += len(head) + len(node.ids)
        ids = node.ids + step.ids
        child = next((ch for ch in node.children if ch.ids == ids), None)
        if child is None:
            child = Node(ids, done=step.ended or len(ids) >= limit)
            node.children.append(child)
            cost["nodes"] += 1
        path.append(child)
        completed = child.ids
        if not child.done:
            [rest] = decoder.extend([head + child.ids], 1, [limit - len(child.ids)], None)[0]
            cost["tokens"] += rest.tokens
            cost["prefill_tokens"] += len(head) + len(child.ids)
            completed = child.ids + rest.ids
        text = decoder.tokenizer.decode(completed, skip_special_tokens=True)
        back_up(path, scorer([prompt], [text])[0], completed)
    return root, cost


def mcts(decoder: Decoder, examples: Sequence, budget: int, scorer: Scorer, separator: str, *,
         width: int = 2, progress: bool = False) -> list[ProblemResult]:
    """MCTS with `budget` simulations per example (one problem at a time)."""
    def solve(prompt) -> tuple[str, int, dict]:
        root, cost = search_one(decoder, prompt, budget, width, scorer, separator)
        value, ids = root.best
        return (decoder.tokenizer.decode(ids, skip_special_tokens=True), cost["tokens"],
                {"score": value, "prefill_tokens": cost["prefill_tokens"], "nodes": cost["nodes"]})
    return one_at_a_time(examples, solve, progress=progress, desc="search mcts")
