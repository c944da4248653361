"""Micro-batch plans (grpokit.model.buckets): prompt-aware buckets keep a GRPO group's prompt run once."""

import torch

from grpokit.model.buckets import length_buckets, micro_batches, prompt_buckets


def _groups_batch(prompt_lens, completion_lens, G):
    """Left-padded prompts [N, P] (prompt u repeated G times, distinct ids per prompt) and lengths."""
    P = max(prompt_lens)
    ids, mask = [], []
    for u, p in enumerate(prompt_lens):
        row = torch.zeros(P, dtype=torch.long)
        row[P - p:] = torch.arange(p) + 1000 * (u + 1)
        m = torch.zeros(P, dtype=torch.long)
        m[P - p:] = 1
        ids += [row] * G
        mask += [m] * G
    return torch.stack(ids), torch.stack(mask), torch.tensor(completion_lens)


def _shared_cost(plan, prompt_ids, prompt_mask, comp, overhead):
    """Token-slots of a plan when each distinct prompt of a micro-batch runs once."""
    total = 0.0
    for rows in plan:
        uniq = torch.unique(torch.cat([prompt_ids[rows], prompt_mask[rows]], 1), dim=0).shape[0]
        P, T = float(prompt_mask[rows].sum(-1).max()), float(comp[rows].max())
        total += uniq * P + len(rows) * T + overhead
    return total


def _is_partition(plan, N, max_rows):
    rows = torch.cat(plan).tolist()
    return sorted(rows) == list(range(N)) and all(0 < len(g) <= max_rows for g in plan)


def test_long_prompts_keep_each_group_in_one_micro_batch():
    # GSM8K-like: 4 prompts of ~470 tokens, 8 completions each of 60-256 tokens
    torch.manual_seed(0)
    comp = torch.randint(60, 257, (32,))
    comp[torch.randperm(32)[:12]] = 256                                 # many truncated, as at the start
    ids, mask, comp = _groups_batch([452, 470, 498, 530], comp.tolist(), G=8)
    plan = micro_batches(mask, torch.arange(256)[None] < comp[:, None], 8, 135_000_000, prompt_ids=ids)
    assert _is_partition(plan, 32, 8)
    assert all(len(set((g // 8).tolist())) == 1 for g in plan)        # one prompt per micro-batch
    by_total = length_buckets(mask.sum(-1) + comp, 8, 7.4)             # the prompt-blind plan
    ours, blind = (_shared_cost(p, ids, mask, comp, 7.4) for p in (plan, by_total))
    assert ours < 0.7 * blind, (ours, blind)


def test_a_long_straggler_is_split_off_when_that_beats_rerunning_the_prompt():
    # one prompt of 10 tokens, 7 rows of 5 tokens and one of 200: the straggler alone pays 10 + 200
    ids, mask, comp = _groups_batch([10], [5] * 7 + [200], G=8)
    plan = prompt_buckets(ids, mask, comp, 8, overhead_tokens=0.0)
    assert sorted(len(g) for g in plan) == [1, 7] and plan[0].tolist() == [7]
    # a prompt of 2000 tokens: running it twice costs more than the padding, so one micro-batch
    ids, mask, comp = _groups_batch([2000], [5] * 7 + [200], G=8)
    assert [len(g) for g in prompt_buckets(ids, mask, comp, 8, overhead_tokens=0.0)] == [8]


def test_small_groups_are_joined_and_launch_cost_decides_how_far():
    ids, mask, comp = _groups_batch([6, 6, 6, 6], [4] * 8, G=2)
    one = prompt_buckets(ids, mask, comp, 8, overhead_tokens=1000.0)   # launches dear: one micro-batch
    assert len(one) == 1 and _is_partition(one, 8, 8)
    apart = prompt_buckets(ids, mask, comp, 8, overhead_tokens=0.0)    # free launches: nothing to gain
    assert _is_partition(apart, 8, 8)
    assert _shared_cost(apart, ids, mask, comp, 0.0) <= _shared_cost(one, ids, mask, comp, 0.0)
    assert all(len(set((g // 2).tolist())) == 1 for g in apart)


def test_micro_batches_without_shared_prompts_is_the_length_plan():
    ids, mask, comp = _groups_batch([5, 9, 7], [3, 8, 2], G=1)           # every prompt once
    cm = torch.arange(8)[None] < comp[:, None]
    want = [g.tolist() for g in micro_batches(mask, cm, 2, 10**6)]
    assert [g.tolist() for g in micro_batches(mask, cm, 2, 10**6, prompt_ids=ids)] == want
    # and the plan is deterministic
    ids, mask, comp = _groups_batch([40, 40], [9, 3, 9, 3], G=2)
    cm = torch.arange(9)[None] < comp[:, None]
    a = micro_batches(mask, cm, 2, 10**8, prompt_ids=ids)
    assert [g.tolist() for g in a] == [g.tolist() for g in micro_batches(mask, cm, 2, 10**8, prompt_ids=ids)]
