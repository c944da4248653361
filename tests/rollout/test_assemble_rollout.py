"""assemble_rollout: the one layout every source of rollouts shares (grpokit.rollout.contract)."""

import torch

from grpokit.rollout.contract import assemble_rollout, pad_rows, row_ends
from grpokit.rollout.vllm_backend import Sample, rollout_from_samples

EOS, PAD = 1, 0


def _prompts(tok, texts):
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    P = max(map(len, rows))
    return pad_rows(rows, P, PAD, left=True), pad_rows([[1] * len(r) for r in rows], P, 0, left=True)


def test_pad_rows_pads_either_side_and_keeps_an_empty_batch_two_dimensional():
    assert pad_rows([[5], [6, 7]], 3, 0).tolist() == [[5, 0, 0], [6, 7, 0]]
    assert pad_rows([[5], [6, 7]], 3, 0, left=True).tolist() == [[0, 0, 5], [0, 6, 7]]
    assert pad_rows([], 4, 0).shape == (0, 4)
    assert pad_rows([[0.5]], 2, 0.0, dtype=torch.float32).dtype == torch.float32


def test_row_ends_cut_at_the_first_eos_within_the_row_or_at_its_length():
    ids = torch.tensor([[5, EOS, 6, 7], [5, 6, 7, 8], [5, 6, EOS, 9], [EOS, 5, 6, 7]])
    mask, truncated = row_ends(ids, [EOS], None, cut_at_eos=True)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False, False]
    # an EOS past a row's own length does not end it; the length does, and the row is truncated
    mask, truncated = row_ends(ids, [EOS], torch.tensor([1, 2, 2, 0]), cut_at_eos=True)
    assert mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert truncated.tolist() == [True, True, True, True]
    # multi-turn: an EOS inside the row ends a turn, not the row; truncated reads the last valid token
    mask, truncated = row_ends(ids, [EOS], torch.tensor([4, 4, 3, 1]), cut_at_eos=False)
    assert mask.sum(-1).tolist() == [4, 4, 3, 1]
    assert truncated.tolist() == [True, True, False, False]


def test_assemble_rollout_lays_out_groups_pads_after_the_end_and_zeroes_untrained_logprobs(char_tokenizer):
    p_ids, p_mask = _prompts(char_tokenizer, ["ab", "c"])                           # B = 2, G = 2
    ids = torch.tensor([[5, EOS, 6], [5, 6, 7], [EOS, 9, 9], [5, 6, EOS]])
    lps = torch.full((4, 3), -0.5)
    model = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 1, 1]])
    r = assemble_rollout(tokenizer=char_tokenizer, prompts=["ab", "c"], prompt_ids=p_ids, prompt_mask=p_mask,
                         completion_ids=ids, group_size=2, eos_ids=[EOS], sampling_logprobs=lps,
                         model_mask=model)
    assert r.prompt_ids.tolist() == p_ids.repeat_interleave(2, 0).tolist()
    assert r.prompts == ["ab", "ab", "c", "c"] and r.group_ids.tolist() == [0, 0, 1, 1]
    assert r.completion_ids.tolist() == [[5, EOS, PAD], [5, 6, 7], [EOS, PAD, PAD], [5, 6, EOS]]
    assert r.truncated.tolist() == [False, True, False, False]
    assert r.model_mask.tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 0], [1, 1, 1]]
    assert (r.sampling_logprobs == -0.5 * r.loss_mask).all()
    assert r.completions == char_tokenizer.batch_decode(r.completion_ids.tolist(), skip_special_tokens=True)
    rows_ids, rows_mask = p_ids.repeat_interleave(2, 0), p_mask.repeat_interleave(2, 0)   # one per row
    one = assemble_rollout(tokenizer=char_tokenizer, prompts=["ab", "ab", "c", "c"], prompts_per_row=True,
                           prompt_ids=rows_ids, prompt_mask=rows_mask, completion_ids=ids, group_size=2,
                           eos_ids=[EOS])
    assert one.prompts == r.prompts and torch.equal(one.prompt_ids, r.prompt_ids)
    assert one.sampling_logprobs is None and one.model_mask is None


def test_an_engine_sample_cut_by_its_length_is_truncated_even_when_pad_is_eos(char_tokenizer):
    """vLLM samples shorter than the batch's longest, without an EOS: the pad that follows them must not
    read as their end (before the one assembler it did when the pad id was an EOS id)."""
    p_ids, p_mask = _prompts(char_tokenizer, ["x"])
    samples = [[Sample([5, 6, 7], [-1.0] * 3), Sample([5], [-1.0])]]
    r = rollout_from_samples(char_tokenizer, ["x"], p_ids, p_mask, samples, 2, [EOS, PAD])
    assert r.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert r.truncated.tolist() == [True, True]
    assert r.sampling_logprobs.tolist() == [[-1.0] * 3, [-1.0, 0.0, 0.0]]
