"""[A] sample_groups and [D] per_token_logprobs on tiny random-init models."""

import pytest
import torch

from grpokit.model import logprobs as lp_mod
from grpokit.model import shared_prompts
from grpokit.model.logprobs import per_token_logprobs, position_ids_from_mask
from grpokit.rollout.groups import completion_mask_from_ids, sample_groups

PROMPTS = ["What is 1+2?", "What is 33+44?", "7*8?"]


def naive_logprobs(model, ids, att, T, temperature=1.0):
    logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
    logp = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, dim=-1)  # the full [B, T, V]
    return logp.gather(-1, ids[:, -T:, None]).squeeze(-1)


@pytest.mark.parametrize("plain_head", [True, False])
def test_per_token_logprobs_equals_naive_values_and_gradients(tiny_model, char_tokenizer,
                                                              monkeypatch, plain_head):
    if not plain_head:
        monkeypatch.setattr(lp_mod, "uses_plain_head", lambda model: False)
        monkeypatch.setattr(shared_prompts, "uses_plain_head", lambda model: False)
    torch.manual_seed(0)
    r = sample_groups(tiny_model, char_tokenizer, PROMPTS, 2, 12, backend="generate")
    T = r.completion_ids.shape[1]
    got = per_token_logprobs(tiny_model, r.input_ids, r.attention_mask, T, temperature=0.7, chunk_rows=5)
    want = naive_logprobs(tiny_model, r.input_ids, r.attention_mask, T, temperature=0.7)
    m = r.completion_mask.bool()
    assert torch.allclose(got[m], want[m], atol=1e-5)
    w = torch.randn(got.shape)
    g1 = torch.autograd.grad((got * w * m).sum(), list(tiny_model.parameters()), allow_unused=True)
    g2 = torch.autograd.grad((want * w * m).sum(), list(tiny_model.parameters()), allow_unused=True)
    for a, b in zip(g1, g2):
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5)


def test_completion_mask_stops_after_first_eos():
    eos = 1
    ids = torch.tensor([[5, 6, 1, 7, 1], [5, 5, 5, 5, 5], [1, 4, 4, 4, 4]])
    mask, truncated = completion_mask_from_ids(ids, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def force_eos_at(model, position, eos_id):
    """Make the model emit non-EOS tokens, then EOS as completion token `position` (0-based)."""
    calls = {"n": 0}

    def hook(module, inputs, output):
        k = calls["n"]
        calls["n"] += 1
        out = output.clone()
        out[..., eos_id] = 1e4 if k == position else -1e4
        return out

    return model.get_output_embeddings().register_forward_hook(hook), calls


@pytest.mark.parametrize("backend", ["fast", "generate"])
def test_sample_groups_mask_stops_exactly_after_forced_eos(tiny_model, char_tokenizer, backend):
    eos = char_tokenizer.eos_token_id
    handle, _ = force_eos_at(tiny_model, 3, eos)
    try:
        torch.manual_seed(0)
        r = sample_groups(tiny_model, char_tokenizer, PROMPTS, 4, 10, backend=backend)
    finally:
        handle.remove()
    assert r.completion_ids.shape[0] == 12
    assert (r.completion_ids[:, 3] == eos).all()
    assert (r.completion_ids[:, :3] != eos).all()
    assert r.completion_mask.sum(-1).tolist() == [4] * 12
    assert (r.completion_ids[:, 4:] == char_tokenizer.pad_token_id).all()
    assert not r.truncated.any()
    assert r.group_ids.tolist() == [g for g in range(3) for _ in range(4)]
    assert len(r.completions) == 12 and r.prompts[4] == PROMPTS[1]


def test_fast_sampler_logprobs_equal_recomputation(tiny_model, char_tokenizer):
    torch.manual_seed(1)
    r = sample_groups(tiny_model, char_tokenizer, PROMPTS, 4, 16, temperature=0.9, backend="fast")
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        again = per_token_logprobs(tiny_model, r.input_ids, r.attention_mask, T, temperature=0.9)
    m = r.completion_mask.bool()
    assert torch.allclose(r.sampling_logprobs[m], again[m], atol=1e-4)


def test_fast_greedy_equals_generate_greedy(tiny_model, char_tokenizer):
    a = sample_groups(tiny_model, char_tokenizer, PROMPTS, 1, 20, backend="fast", greedy=True)
    b = sample_groups(tiny_model, char_tokenizer, PROMPTS, 1, 20, backend="generate", greedy=True)
    T = min(a.completion_ids.shape[1], b.completion_ids.shape[1])
    assert torch.equal(a.completion_ids[:, :T] * a.completion_mask[:, :T],
                       b.completion_ids[:, :T] * b.completion_mask[:, :T])
    assert torch.equal(a.completion_mask.sum(-1), b.completion_mask.sum(-1))


def test_prompts_are_left_padded_and_overlong_prompts_truncated(tiny_model, char_tokenizer, caplog):
    r = sample_groups(tiny_model, char_tokenizer, ["ab", "abcdefgh"], 2, 3, max_prompt_length=5)
    assert r.prompt_mask.tolist()[0] == [0, 0, 0, 1, 1]
    assert r.prompt_mask.tolist()[2] == [1, 1, 1, 1, 1]
    assert char_tokenizer.decode(r.prompt_ids[2]) == "defgh"
    assert "keeping its last 5" in caplog.text
