"""MCTS rollouts for training (grpokit.search.mcts_batch): B searches in lockstep worked by hand on the stub,
UCT selection on a hand-worked tree, the token budget and the simulations respected, and the rows'
sampling log-probs equal to a forward pass over each finished trajectory (tiny random model)."""

import math

import pytest
import torch
from search_stubs import StubDecoder

from grpokit.config.schema import build_config
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout import sampler
from grpokit.search.decode import Decoder
from grpokit.search.mcts import search_one
from grpokit.search.mcts_batch import GroupSearch, MctsSpec, StepNode, mcts_sample, search_stats, simulate

pytestmark = pytest.mark.usefixtures("one_thread")
SEP = ". "


def digit_sum_value(batch_rows, texts, ids):
    return [float(sum(int(ch) for ch in t if ch.isdigit())) for t in texts]


def text(tok, row_ids, row_mask):
    return tok.decode(row_ids[row_mask.bool()].tolist(), skip_special_tokens=True)


def test_one_prompt_builds_the_tree_inference_mcts_builds_and_keeps_each_simulation(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=1, cycle=True)
    r, [s] = mcts_sample(dec, ["Q?"], MctsSpec(simulations=3, separator=SEP, width=2), digit_sum_value)
    ref, cost = search_one(StubDecoder(char_tokenizer, depth=1, cycle=True), "Q?", 3, 2,
                           lambda p, c: digit_sum_value(None, c, None), SEP)
    # sim 1: root -> "00. " (k=0) + rollout "\boxed{1}" (k=1); sim 2: "20. " (k=2) + "\boxed{3}" (k=3);
    # sim 3: the root is full, UCT picks B (value 5 > 1) and expands its final step "\boxed{4}" (k=4)
    assert r.completions == ["00. \\boxed{1}", "20. \\boxed{3}", "20. \\boxed{4}"]
    assert [v.value for v in s.visits] == [1.0, 5.0, 6.0]
    tree = [(c.visits, c.value_sum) for c in s.root.children]
    assert tree == [(c.visits, c.value_sum) for c in ref.children] == [(1, 1.0), (2, 11.0)]
    assert (s.tokens, s.prefill_tokens, s.nodes) == (cost["tokens"], cost["prefill_tokens"], cost["nodes"])
    # each token's log-prob is its continuation's (-(k + 1)); the step's and the rollout's concatenated
    lp = r.sampling_logprobs
    assert lp[0, :14].tolist() == [-1.0] * 4 + [-2.0] * 10
    assert lp[2, :14].tolist() == [-3.0] * 4 + [-5.0] * 10
    assert r.completion_mask.sum(-1).tolist() == [14, 14, 14] and not r.truncated.any()
    assert r.group_ids.tolist() == [0, 0, 0] and r.prompts == ["Q?"] * 3


def test_two_prompts_search_in_lockstep_one_decode_call_for_all_expansions_and_one_for_all_rollouts(
        char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=1, cycle=True)
    r, (s0, s1) = mcts_sample(dec, ["Q?", "R!"], MctsSpec(simulations=4, separator=SEP, width=2),
                              digit_sum_value)
    # round 1: expansions k=0 ("00. ", prompt 0), k=1 ("10. ", prompt 1); rollouts k=2, k=3
    # round 2: the roots widen: k=4 "40. ", k=5 "50. "; rollouts k=6, k=7
    # round 3: the roots are full (2 expansions = floor(2 sqrt 2)); UCT picks each one's second child
    #          (values 10 > 2 and 12 > 4), whose final steps k=8, k=9 finish them: no rollout call
    # round 4: the roots widen again (floor(2 sqrt 3) = 3): k=10 -> "00. ", k=11 -> "10. ", each a step
    #          its root already has (the first child is visited again); rollouts k=12, k=13
    assert [(len(p), n) for p, n, _ in dec.calls] == [(2, 1)] * 7
    assert r.completions == ["00. \\boxed{2}", "40. \\boxed{6}", "40. \\boxed{8}", "00. \\boxed{2}",
                             "10. \\boxed{3}", "50. \\boxed{7}", "50. \\boxed{9}", "10. \\boxed{3}"]
    assert [v.value for v in s0.visits] == [2.0, 10.0, 12.0, 2.0]
    assert [v.value for v in s1.visits] == [4.0, 12.0, 14.0, 4.0]
    assert [(c.visits, c.value_sum) for c in s0.root.children] == [(2, 4.0), (2, 22.0)]
    assert s0.root.expansions == 3 and s0.nodes == s1.nodes == 4      # root, two steps, one final step
    assert r.group_ids.tolist() == [0] * 4 + [1] * 4
    stats = search_stats([s0, s1])
    assert stats["tokens"] == sum(c.tokens for c in dec.decoded) == 2 * (14 + 14 + 10 + 14)
    assert stats["simulations"] == 8 and stats["value_sum"] == 60.0 and stats["visits"] == 8


def hand_tree():
    # root N = 10, 3 expansions; A: N 6, W 4.2 (Q 0.7); B: N 3, W 2.4 (Q 0.8); C: N 1, W 0.1 (Q 0.1)
    a, b, c = (StepNode([5], visits=6, value_sum=4.2), StepNode([6], visits=3, value_sum=2.4),
               StepNode([7], visits=1, value_sum=0.1))
    return StepNode([], children=[a, b, c], expansions=3, visits=10, value_sum=6.7)


@pytest.mark.parametrize("c,picked", [(math.sqrt(2), [7]), (0.5, [6])])
def test_uct_selection_on_a_hand_worked_tree_in_the_batched_round(char_tokenizer, c, picked):
    # width 1: the root (3 expansions = floor(sqrt 10)) is full; UCT = Q + c sqrt(ln 10 / N):
    # c = sqrt(2): A 1.5761, B 2.0390, C 2.2460 -> C; c = 0.5: A 1.0097, B 1.2380, C 0.8587 -> B
    dec = StubDecoder(char_tokenizer, depth=1)
    searches = [GroupSearch(0, [1, 2], root=hand_tree()), GroupSearch(1, [3], root=hand_tree())]
    simulate(dec, searches, MctsSpec(simulations=1, separator=SEP, width=1, exploration=c), digit_sum_value)
    prefixes, n, _ = dec.calls[0]
    assert prefixes == [[1, 2, *picked], [3, *picked]] and n == 1   # both searches' expansions, one call
    for s in searches:
        chosen = next(ch for ch in s.root.children if ch.ids == picked)
        assert chosen.expansions == 1 and len(chosen.children) == 1 and s.root.visits == 11


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_model("tiny", mean_length=8)
    cfg = build_config({"rollout.max_completion_length": 16, "rollout.temperature": 1.0})
    return model, tok, cfg


def counting(dec):
    calls = []
    real = dec.extend

    def extend(prefixes, n, limits, separator):
        calls.append((len(prefixes), list(limits), separator))
        return real(prefixes, n, limits, separator)
    dec.extend = extend
    return calls


# the tiny model's filler tokens decode as "<x400>".."<x511>", ...: "<x4" ends a step every few tokens
STEP = "<x4"


def test_without_a_budget_every_group_runs_its_g_simulations_in_at_most_two_calls_a_round(tiny):
    model, tok, cfg = tiny
    dec = Decoder(model, tok, cfg)
    calls = counting(dec)
    torch.manual_seed(0)
    r, searches = mcts_sample(dec, bench_prompts(3), MctsSpec(simulations=5, separator=STEP), digit_sum_value)
    assert [len(s.visits) for s in searches] == [5, 5, 5] and r.completion_ids.shape[0] == 15
    assert len(calls) <= 2 * 5 and all(n <= 3 for n, _, _ in calls)
    steps = [c for c in calls if c[2] == STEP]         # one expansion call a round, one row per expansion
    assert len(steps) <= 5 and sum(n for n, _, _ in steps) == sum(_expansions(s.root) for s in searches)
    assert sum(s.tokens for s in searches) > 0 and (r.completion_mask.sum(-1) > 0).all()
    assert (r.completion_mask.sum(-1) <= 16).all()


def _expansions(node):
    return node.expansions + sum(_expansions(ch) for ch in node.children)


@pytest.mark.parametrize("budget", [1, 7, 25])
def test_the_token_budget_caps_every_group_and_leaves_the_unrun_simulations_empty(tiny, budget):
    model, tok, cfg = tiny
    dec = Decoder(model, tok, cfg)
    calls = counting(dec)
    torch.manual_seed(1)
    spec = MctsSpec(simulations=8, separator=STEP, max_tokens=budget)
    r, searches = mcts_sample(dec, bench_prompts(3), spec, digit_sum_value)
    lengths = r.completion_mask.sum(-1).view(3, 8)
    for s, rows in zip(searches, lengths):
        assert s.tokens <= budget
        assert len(s.visits) == 8 or s.tokens == budget            # it stopped because the budget was spent
        assert (rows[len(s.visits):] == 0).all() and (rows[:len(s.visits)] > 0).all()
    assert all(max(limits) <= budget for _, limits, _ in calls)
    assert r.truncated.view(3, 8)[lengths == 0].all()
    if budget == 1:                                                # one token: one step of one token each
        assert [len(s.visits) for s in searches] == [1, 1, 1] and (lengths[:, 0] == 1).all()


@pytest.mark.parametrize("engine", ["lean", "cached"])
def test_the_rows_sampling_log_probs_are_a_forward_pass_over_each_trajectory(tiny, monkeypatch, engine):
    if engine == "cached":
        monkeypatch.setattr(sampler, "lean_supported", lambda model, n: False)
    model, tok, cfg = tiny
    torch.manual_seed(2)
    prompts = bench_prompts(2) + ["Q3: 7+1="]           # a shorter prompt: left padding
    r, searches = mcts_sample(Decoder(model, tok, cfg), prompts, MctsSpec(simulations=6, separator=STEP),
                              digit_sum_value)
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        again = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    m = r.completion_mask.bool()
    assert torch.allclose(r.sampling_logprobs[m], again[m], atol=1e-4)
    assert (r.sampling_logprobs[~m] == 0).all()
    # every trajectory continues a first-level node of its own tree (the visited path is its prefix)
    for b, s in enumerate(searches):
        for j, v in enumerate(s.visits):
            row = r.completion_ids[b * 6 + j][m[b * 6 + j]].tolist()
            assert row == v.ids and any(row[:len(ch.ids)] == ch.ids for ch in s.root.children)
    assert r.completions == [text(tok, i, mk) for i, mk in zip(r.completion_ids, r.completion_mask)]
