"""Padding-free log-prob passes (grpokit.model.packing): the rows' real tokens packed end to end give the
padded pass's log-probs, entropies and gradients, for every architecture the decode loop serves, with and
without shared prompts, sliding windows and checkpointing; padding gets 0."""

from __future__ import annotations

import pytest
import torch

from grpokit.model import packing, testing
from grpokit.model.loading import build_char_tokenizer
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.shared_prompts import CACHE_MODEL_TYPES


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def ragged_batch(vocab: int, seed: int = 0, groups: int = 2, group_size: int = 3, P: int = 9, T: int = 12):
    """Rows of `groups` prompts x `group_size` completions: left-padded prompts of different lengths,
    right-padded completions of lengths 1..T (one of each group full length)."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = [], []
    for u in range(groups):
        p = P - 3 * u
        prompt = torch.randint(3, vocab, (p,), generator=g)
        for j in range(group_size):
            L = T if j == 0 else int(torch.randint(1, T, (1,), generator=g))
            row = torch.zeros(P + T, dtype=torch.long)
            row[P - p:P] = prompt
            row[P:P + L] = torch.randint(3, vocab, (L,), generator=g)
            m = torch.zeros(P + T, dtype=torch.long)
            m[P - p:P + L] = 1
            ids.append(row)
            mask.append(m)
    return torch.stack(ids), torch.stack(mask), T


@pytest.mark.parametrize("model_type", CACHE_MODEL_TYPES)
def test_packed_log_probs_equal_the_padded_pass_for_every_architecture(model_type, tok):
    model = testing.family_model(model_type, len(tok), tok.eos_token_id, tok.pad_token_id)
    ids, mask, T = ragged_batch(len(tok))
    real = mask[:, -T:].bool()
    with torch.no_grad():
        for share in (True, False):
            padded = per_token_logprobs(model, ids, mask, T, share_prompts=share, return_entropy=True)
            packed = per_token_logprobs(model, ids, mask, T, share_prompts=share, return_entropy=True,
                                        padding_free=True)
            for a, b in zip(padded, packed):
                torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=0)
                assert bool((b[~real] == 0).all())


def _grads(model, ids, mask, T, **kw):
    model.zero_grad(set_to_none=True)
    lp, ent = per_token_logprobs(model, ids, mask, T, return_entropy=True, entropy_grad=True, **kw)
    real = mask[:, -T:].float()
    ((lp * real).sum() + 0.1 * (ent * real).sum()).backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "mistral", "gemma3_text"])
@pytest.mark.parametrize("share", [True, False])
def test_packed_gradients_equal_the_padded_pass(model_type, share, tok):
    """Sliding windows shorter than the rows (mistral, gemma3_text with window 8) included."""
    kw = {"sliding_window": 5} if model_type == "mistral" else {}
    model = testing.family_model(model_type, len(tok), tok.eos_token_id, tok.pad_token_id, **kw).train()
    model.config.attention_dropout = 0.0
    ids, mask, T = ragged_batch(len(tok), seed=1)
    lp_a, g_a = _grads(model, ids, mask, T, share_prompts=share)
    lp_b, g_b = _grads(model, ids, mask, T, share_prompts=share, padding_free=True)
    real = mask[:, -T:].bool()
    torch.testing.assert_close(lp_b[real], lp_a[real], atol=1e-5, rtol=0)
    assert bool((lp_b[~real] == 0).all()) and not bool((lp_a[~real] == 0).all())   # the packed pass ran
    assert g_a.keys() == g_b.keys() and g_a
    for name in g_a:
        torch.testing.assert_close(g_b[name], g_a[name], atol=1e-5, rtol=1e-4, msg=name)


def test_checkpointing_needs_the_packed_attention_installed_and_then_matches(tok):
    """A checkpointed layer is recomputed in backward: outside `installed` the pass refuses (its recompute
    would attend across rows); inside, gradients equal the padded pass's."""
    model = testing.family_model("qwen2", len(tok), tok.eos_token_id, tok.pad_token_id).train()
    ids, mask, T = ragged_batch(len(tok), seed=2)
    _, g_a = _grads(model, ids, mask, T)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert packing.is_installed(model) is False
    with pytest.raises(ValueError, match="packing.installed"):
        per_token_logprobs(model, ids, mask, T, padding_free=True)
    with packing.installed(model):
        _, g_b = _grads(model, ids, mask, T, padding_free=True)
    assert model.config._attn_implementation == "sdpa"            # set back on exit
    for name in g_a:
        torch.testing.assert_close(g_b[name], g_a[name], atol=1e-5, rtol=1e-4, msg=name)


def test_rows_not_in_the_packable_layout_run_padded(tok):
    """A hole in a completion's mask (not right-padding): the padded pass runs, the result is the same."""
    model = testing.family_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    ids, mask, T = ragged_batch(len(tok), seed=3)
    mask[0, -T + 2] = 0
    assert not packing.packable(mask, T) and packing.packable(*ragged_batch(len(tok))[1:])
    with torch.no_grad():
        a = per_token_logprobs(model, ids, mask, T)
        b = per_token_logprobs(model, ids, mask, T, padding_free=True)
    assert torch.equal(a, b)


def test_row_mask_is_causal_with_its_prefix_and_window():
    m = packing.row_mask(3, 2, None, "cpu")[0, 0]
    assert m.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                          [True, True, True, True, True]]
    w = packing.row_mask(3, 2, 2, "cpu")[0, 0]                     # position q sees q-1 and q only
    assert w.tolist() == [[False, True, True, False, False], [False, False, True, True, False],
                          [False, False, False, True, True]]
    assert packing.row_mask(4, 0, None, "cpu") is None             # plain causal
    add = packing.row_mask(2, 0, None, "cpu", torch.float32)[0, 0]
    assert add[0, 1] == torch.finfo(torch.float32).min and add[1, 0] == 0


def test_a_checkpointed_layer_that_drops_the_layout_raises_instead_of_attending_across_rows(tok):
    """StableLM's layers do not pass keyword arguments on to their attention: the forward finds the layout
    where the packed pass put it, but a recompute in backward cannot, and says so."""
    model = testing.family_model("stablelm", len(tok), tok.eos_token_id, tok.pad_token_id).train()
    ids, mask, T = ragged_batch(len(tok), seed=4)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with packing.installed(model):
        lp = per_token_logprobs(model, ids, mask, T, padding_free=True)
        with pytest.raises(RuntimeError, match="without its layout"):
            lp.sum().backward()
