"""MCTS: UCT selection on a hand-worked tree, and a search on the stub with every token counted by hand."""

import math

import pytest
from search_stubs import StubDecoder

from grpokit.search.mcts import (
    Node,
    back_up,
    may_expand,
    search_one,
    select_child,
    select_leaf,
    uct,
)


def digit_sum(prompts, completions):
    return [float(sum(int(ch) for ch in c if ch.isdigit())) for c in completions]


def hand_tree():
    # root N = 10; A: N 6, W 4.2 (Q 0.7); B: N 3, W 2.4 (Q 0.8); C: N 1, W 0.1 (Q 0.1)
    a, b, c = Node([1], visits=6, value_sum=4.2), Node([2], visits=3, value_sum=2.4), Node([3], visits=1,
                                                                                           value_sum=0.1)
    return Node([], children=[a, b, c], expansions=3, visits=10, value_sum=6.7), a, b, c


def test_uct_by_hand():
    root, a, b, c = hand_tree()
    # UCT = Q + sqrt(2) * sqrt(ln 10 / N): A 0.7 + 0.8761 = 1.5761, B 0.8 + 1.2390 = 2.0390, C 0.1 + 2.1460
    assert uct(10, a) == pytest.approx(1.57608, abs=1e-4)
    assert uct(10, b) == pytest.approx(2.03896, abs=1e-4)
    assert uct(10, c) == pytest.approx(2.24597, abs=1e-4)
    assert select_child(root) is c                      # exploration wins with c = sqrt(2)
    assert select_child(root, c=0.5) is b               # A 1.0097, B 1.2380, C 0.8587
    assert uct(10, Node([4])) == math.inf
    root.children.append(Node([4]))
    assert select_child(root) is root.children[-1]      # an unvisited child first


def test_progressive_widening_by_hand():
    assert [may_expand(Node([], visits=n, expansions=e), 2) for n, e in
            [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (5, 4)]] == [True, True, False, True, True, False]
    # floor(2 sqrt(N)) for N = 1..5: 2, 2, 3, 4, 4; at least one expansion for an unvisited node
    assert not may_expand(Node([], done=True), 2)


def test_select_leaf_stops_at_a_node_with_expansions_left():
    root, a, b, c = hand_tree()
    assert select_leaf(root, width=2) == [root]         # 3 expansions < floor(2 sqrt(10)) = 6: expand it
    assert select_leaf(root, width=1) == [root, c]      # 3 = floor(sqrt(10)): descend by UCT to C (C may
                                                        # take its first child)
    back_up([root, c], 1.0, [3, 9])
    assert (root.visits, c.visits, c.value_sum, c.best) == (11, 2, 1.1, (1.0, [3, 9]))
    assert root.best == (1.0, [3, 9]) and a.best == (-math.inf, [])
    back_up([root, a], 1.0, [1, 5])                     # a tie keeps the solution found first
    assert root.best == (1.0, [3, 9]) and a.best == (1.0, [1, 5])


def test_mcts_on_the_stub_counts_every_token_by_hand(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=1, cycle=True)
    root, cost = search_one(dec, "Q?", simulations=3, width=2, scorer=digit_sum, separator=". ")
    # sim 1: expand the root: "00. " (4 tokens) = A; rollout "\boxed{1}" + EOS (10); value 0+0+1 = 1
    # sim 2: expand the root: "20. " = B; rollout "\boxed{3}" (10); value 5
    # sim 3: the root (N 2, 2 expansions = floor(2 sqrt 2)) is full: UCT A 1 + 1.18, B 5 + 1.18 -> B;
    #        B (N 1) may take floor(2 sqrt 1) = 2 children: "\\boxed{4}" + EOS, finished: value 6
    a, b = root.children
    assert (a.visits, a.value_sum, b.visits, b.value_sum, root.visits) == (1, 1.0, 2, 11.0, 3)
    assert cost == {"tokens": 4 + 10 + 4 + 10 + 10, "prefill_tokens": 2 + 6 + 2 + 6 + 6, "nodes": 4}
    assert cost["tokens"] == sum(c.tokens for c in dec.decoded)
    value, ids = root.best                              # the best-valued completed solution
    assert value == 6.0 and char_tokenizer.decode(ids, skip_special_tokens=True) == "20. \\boxed{4}"


def test_a_finished_node_is_backed_up_again_without_decoding(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=0)          # every step is the final answer "\boxed{0}"
    root, cost = search_one(dec, "Q?", simulations=4, width=1, scorer=digit_sum, separator=". ")
    # sim 1 expands the root (one finished child); with width 1 the root (N 1..3) may not widen
    # (floor(sqrt N) = 1): sims 2-4 select the finished child and back its value up again
    assert len(dec.calls) == 1 and cost["tokens"] == 10 and cost["nodes"] == 2
    assert root.visits == 4 and root.children[0].visits == 4
