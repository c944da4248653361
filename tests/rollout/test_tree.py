"""Tree rollouts (grpokit.rollout.tree): leaves share their nodes' tokens, each node decoded once from a
forked KV cache whose log-probs equal a forward pass over each leaf alone; a tree with no branch inside the
completion samples exactly what flat sampling does; node-value advantages against a hand-derived tree."""

import pytest
import torch

from grpokit.core.advantages import group_advantages, tree_advantages
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout import decode_loop, sampler
from grpokit.rollout.groups import render_prompts, sample_groups
from grpokit.rollout.tree import TreeSpec, decoded_tokens

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tree_advantages_against_a_hand_derived_tree():
    # widths [2, 2, 2]: leaves 0-3 under node a (value 1/2), 4-7 under b (1/4); pairs {0,1}=1, {2,3}=0,
    # {4,5}=1/2, {6,7}=0; segments: columns [0,2) depth 0, [2,4) depth 1, [4,6) depth 2
    r = torch.tensor([1., 1., 0., 0., 1., 0., 0., 0.])
    seg = tree_advantages(r, [2, 2, 2], [2, 4], 6, scale_rewards="none")
    want = torch.tensor([[0, 0, 1 / 2, 1 / 2, 0, 0], [0, 0, 1 / 2, 1 / 2, 0, 0],
                         [0, 0, -1 / 2, -1 / 2, 0, 0], [0, 0, -1 / 2, -1 / 2, 0, 0],
                         [0, 0, 1 / 4, 1 / 4, 1 / 2, 1 / 2], [0, 0, 1 / 4, 1 / 4, -1 / 2, -1 / 2],
                         [0, 0, -1 / 4, -1 / 4, 0, 0], [0, 0, -1 / 4, -1 / 4, 0, 0]])
    assert torch.allclose(seg, want)
    # scale_rewards=group divides by the group's (Bessel) std, as the outcome advantage does
    std = r.std()
    assert torch.allclose(tree_advantages(r, [2, 2, 2], [2, 4], 6), want / std, atol=1e-6)
    # over any node's children together the term sums to zero (column 2: depth 1, column 4: depth 2)
    assert torch.allclose(seg[:, 2].view(2, 4).sum(-1), torch.zeros(2))
    assert torch.allclose(seg[:, 4].view(4, 2).sum(-1), torch.zeros(4))


def test_tree_advantages_without_a_branch_in_the_completion_are_zero_and_nan_is_left_out():
    r = torch.tensor([1., 0., 0., 1., 0., 0., 1., 0.])
    assert torch.equal(tree_advantages(r, [8, 1, 1], [3, 5], 7), torch.zeros(8, 7))
    assert torch.equal(tree_advantages(torch.ones(8), [2, 4], [3], 5), torch.zeros(8, 5))  # no signal
    r[1] = float("nan")                       # unscored: out of its nodes' means ({0, 1} = 1, {0..3} = 2/3)
    seg = tree_advantages(r, [2, 2, 2], [1, 2], 3, scale_rewards="none")
    assert torch.isfinite(seg).all() and seg[0, 1] == pytest.approx(1 - 2 / 3) and seg[1, 2] == 0.0


@pytest.fixture(params=["lean", "cached"])
def engine(request, monkeypatch):
    """Each sampling test on both decode engines: the lean decoder, and the model's forward with a cache."""
    if request.param == "cached":
        monkeypatch.setattr(sampler, "lean_supported", lambda model, n: False)
    return request.param


def test_a_tree_with_no_branch_inside_the_completion_samples_exactly_what_flat_sampling_does(engine):
    model, tok = build_model("tiny", mean_length=8)
    prompts = bench_prompts(3)
    torch.manual_seed(5)
    flat = sample_groups(model, tok, prompts, 4, 24, temperature=0.9, backend="fast")
    torch.manual_seed(5)
    one = sample_groups(model, tok, prompts, 4, 24, temperature=0.9, backend="fast",
                        tree=TreeSpec((4, 1, 1), (3, 9)))
    assert torch.equal(flat.completion_ids, one.completion_ids)
    assert torch.equal(flat.sampling_logprobs, one.sampling_logprobs)
    assert torch.equal(flat.completion_mask, one.completion_mask)


def test_forked_caches_give_the_log_probs_of_each_leaf_decoded_alone_and_leaves_share_their_nodes(engine):
    model, tok = build_model("tiny", mean_length=10)
    spec = TreeSpec((2, 2, 3), (4, 7))
    torch.manual_seed(1)
    prompts = bench_prompts(2) + ["Q3: 7+1="]            # a shorter prompt: left padding in the cache
    r = sample_groups(model, tok, prompts, 12, 30, temperature=1.0, backend="fast", tree=spec)
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        again = per_token_logprobs(model, r.input_ids, r.attention_mask, T)   # each leaf alone
    m = r.completion_mask.bool()
    assert torch.allclose(r.sampling_logprobs[m], again[m], atol=1e-4)
    ids = torch.where(m, r.completion_ids, -1)
    for depth, (s, e) in enumerate(spec.segments(T)):   # a node's leaves hold its tokens, to every column
        block = ids.view(-1, spec.block(depth), T)[:, :, :e]
        assert (block == block[:, :1]).all()
    siblings = ids.view(-1, 3, T)[:, :, 7:]              # depth 2's three children branch at token 7
    assert any(not torch.equal(g[0], g[1]) or not torch.equal(g[0], g[2]) for g in siblings)
    lengths = r.completion_mask.sum(-1)
    assert decoded_tokens(r.completion_mask, spec) < int(lengths.sum())   # shared prefixes: decoded once


def test_no_prefix_is_decoded_twice(monkeypatch):
    """Rows picked per column: B * w_0 up to b_1, B * w_0 * w_1 up to b_2, then B * G (no EOS here)."""
    model, tok = build_model("tiny", mean_length=8)
    picked = []
    real = decode_loop.pick_tokens

    def counting(logits, *a, **k):
        picked.append(logits.shape[0])
        return real(logits, *a, **k)

    monkeypatch.setattr(decode_loop, "pick_tokens", counting)
    ids, mask = render_prompts(tok, bench_prompts(2), None, "left")
    spec = TreeSpec((2, 3, 2), (3, 5))
    tokens, _ = sampler.fast_sample(model, ids, mask, 12, 9, temperature=1.0, top_p=1.0, top_k=0, eos_ids=[],
                                    pad_id=tok.pad_token_id, tree=spec)
    assert picked == [4] * 3 + [12] * 2 + [24] * 4
    assert decoded_tokens(torch.ones_like(tokens), spec) == sum(picked) == 4 * 3 + 12 * 2 + 24 * 4


def test_a_path_that_ends_before_a_branch_fills_its_leaves_with_copies():
    model, tok = build_model("tiny", mean_length=3)     # most rows end within a few tokens
    spec = TreeSpec((2, 4), (6,))
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(4), 8, 20, temperature=1.0, backend="fast", tree=spec)
    lengths = r.completion_mask.sum(-1).view(-1, 4)      # [nodes at depth 0, 4 leaves]
    ended = lengths.min(-1).values <= 6
    assert ended.any()
    for node, short in zip(r.completion_ids.view(-1, 4, r.completion_ids.shape[1]), lengths):
        if short.max() <= 6:                             # ended before the fork: four identical leaves
            assert (node == node[:1]).all()


def test_tree_sampling_needs_the_fast_sampler_and_g_leaves():
    model, tok = build_model("tiny", mean_length=8)
    with pytest.raises(ValueError, match="group_size = the tree's 8 leaves"):
        sample_groups(model, tok, bench_prompts(1), 4, 8, backend="fast", tree=TreeSpec((2, 4), (3,)))
    with pytest.raises(ValueError, match="model.generate"):
        sample_groups(model, tok, bench_prompts(1), 8, 8, backend="generate", tree=TreeSpec((2, 4), (3,)))


def test_segments_blocks_and_the_outcome_advantage_with_the_segment_term():
    spec = TreeSpec((2, 2, 2), (2, 4))
    assert spec.leaves == 8 and [spec.block(d) for d in range(3)] == [4, 2, 1]
    assert spec.segments(6) == [(0, 2), (2, 4), (4, 6)] and spec.segments(3) == [(0, 2), (2, 3), (3, 3)]
    r = torch.tensor([1., 1., 0., 0., 1., 0., 0., 0.])
    total = group_advantages(r, 8)[:, None] + tree_advantages(r, [2, 2, 2], [2, 4], 6)
    assert total.shape == (8, 6) and torch.allclose(total[:, 0], group_advantages(r, 8))
