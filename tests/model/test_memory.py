"""Memory features: chunked log-probs equal the unchunked ones (values and gradients), gradient
checkpointing changes nothing but memory, 8-bit AdamW is optional, and the memory breakdown adds up."""

import sys

import pytest
import torch

from grpokit.cli.membench import compare, memory_breakdown
from grpokit.config.schema import build_config
from grpokit.model import logprobs
from grpokit.model.loading import tiny_random_model
from grpokit.model.logprobs import HeadLogprobs, chunk_logprobs, per_token_logprobs, position_ids_from_mask
from grpokit.train.state import make_optimizer

VOCAB = 4096  # big enough that a [rows, V] chunk is the dominant tensor of the lm-head pass


@pytest.fixture(scope="module")
def big_vocab_model():
    from grpokit.model.testing import build_tokenizer

    tok = build_tokenizer(VOCAB)
    return tiny_random_model(tok, seed=0).train(), tok


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(4, VOCAB, (3, 20))
    att = torch.ones_like(ids)
    att[1, :6] = 0                                                       # a left-padded prompt
    return ids, att


def _unchunked(model, ids, att, T, temperature):
    """The textbook computation: full [B, L, V] logits, log-softmax, gather."""
    logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
    logp = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, dim=-1)   # [B, T, V]
    return logp.gather(-1, ids[:, -T:, None]).squeeze(-1)


def _grads(model, lp, weights):
    model.zero_grad(set_to_none=True)
    (lp * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# V = 64 H: recomputed unless the ratio allows
@pytest.mark.parametrize("keep_probs", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_gradients_equal_the_unchunked_ones(big_vocab_model, temperature, keep_probs,
                                                                 monkeypatch):
    model, _ = big_vocab_model
    if keep_probs:
        monkeypatch.setattr(logprobs, "KEEP_PROBS_VOCAB_RATIO", VOCAB)
    ids, att = _batch()
    T = 12
    weights = torch.randn(3, T)
    want = _unchunked(model, ids, att, T, temperature)
    g_want = _grads(model, want, weights)
    got = per_token_logprobs(model, ids, att, T, temperature=temperature, chunk_rows=5)  # 36 rows: 8 chunks
    g_got = _grads(model, got, weights)
    assert torch.allclose(got, want, atol=1e-5)
    assert g_got.keys() == g_want.keys() and len(g_got) == len(list(model.parameters()))
    for n in g_want:
        assert torch.allclose(g_got[n], g_want[n], atol=1e-5), n
    with torch.no_grad():                                                # the reference's path (no grad)
        assert torch.allclose(per_token_logprobs(model, ids, att, T, temperature=temperature, chunk_rows=7),
                              want.detach(), atol=1e-5)


@pytest.mark.parametrize("keep_probs", [False, True])
def test_head_logprobs_gradients_entropy_and_what_it_saves(keep_probs):
    """HeadLogprobs (bias, temperature, entropy) equals autograd through the plain chunk computation; it
    saves a [R, V] tensor for backward only when told to keep the probabilities."""
    torch.manual_seed(3)
    R, H, V = 11, 8, 50
    h, W, b = (torch.randn(R, H, requires_grad=True), torch.randn(V, H, requires_grad=True),
               torch.randn(V, requires_grad=True))
    t, g = torch.randint(0, V, (R,)), torch.randn(R)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
        lp, ent = HeadLogprobs.apply(h, W, b, t, 0.7, keep_probs, True)
    assert (R * V in sizes) == keep_probs
    want_lp, want_ent = chunk_logprobs(h, t, W, b, 0.7, with_entropy=True)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    assert not ent.requires_grad
    got = torch.autograd.grad(lp, (h, W, b), g)
    want = torch.autograd.grad(want_lp, (h, W, b), g)
    for a, w in zip(got, want):
        assert torch.allclose(a, w, atol=1e-5)
    frozen = HeadLogprobs.apply(h, W.detach(), None, t, 1.0, keep_probs, False)   # a frozen head: only dh
    assert torch.allclose(torch.autograd.grad(frozen, h, g)[0],
                          torch.autograd.grad(chunk_logprobs(h, t, W.detach(), None, 1.0), h, g)[0],
                          atol=1e-5)


def test_bf16_head_keeps_bf16_probabilities_and_its_gradient_matches_fp32():
    """bf16 logits: the probabilities are saved in bf16 (half a float32 [R, V]); keeping or recomputing them
    gives the same gradients bit for bit; they match the float32 computation on the same bf16-rounded
    inputs to bf16 rounding (rel. L2 < 1%); a confident token (1 - p_t ~ 2e-3, where bf16's spacing below 1
    is 2^-9 ~ 2e-3) keeps its gradient g (1 - p_t) to a few percent."""
    torch.manual_seed(4)
    R, H, V = 40, 16, 300
    h32, W32 = torch.randn(R, H), torch.randn(V, H) * 0.3
    W32[7] = h32[0] * 0.5                                                # row 0's target 7: 1 - p_t ~ 2e-3
    t, g = torch.randint(0, V, (R,)), torch.randn(R)
    t[0] = 7
    h16, W16 = h32.bfloat16().requires_grad_(), W32.bfloat16().requires_grad_()
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append((x.numel(), x.dtype)) or x,
                                                  lambda x: x):
        lp = HeadLogprobs.apply(h16, W16, None, t, 0.7, True, False)
    assert (R * V, torch.bfloat16) in sizes and lp.dtype == torch.float32
    kept = torch.autograd.grad(lp, (h16, W16), g)
    again = torch.autograd.grad(HeadLogprobs.apply(h16, W16, None, t, 0.7, False, False), (h16, W16), g)
    assert all(torch.equal(a, b) for a, b in zip(kept, again))
    h, W = h16.detach().float().requires_grad_(), W16.detach().float().requires_grad_()
    want_lp = chunk_logprobs(h, t, W, None, 0.7)
    want = torch.autograd.grad(want_lp, (h, W), g)
    assert 1e-3 < float(1 - want_lp[0].detach().exp()) < 3e-3            # the confident token
    assert torch.allclose(lp, want_lp, rtol=0.01, atol=0.05)             # bf16 logits: z 2^-9 each
    for a, w in zip(kept, want):
        assert float((a.float() - w).norm() / w.norm()) < 0.01
    confident = want[0][0]                                               # dh of row 0: its target's share
    assert float((kept[0][0].float() - confident).norm() / confident.norm()) < 0.05


def test_gradient_checkpointing_gives_the_same_gradients(big_vocab_model):
    import copy

    model, _ = big_vocab_model
    ckpt = copy.deepcopy(model)
    ckpt.gradient_checkpointing_enable()
    ckpt.train()
    ids, att = _batch()
    weights = torch.randn(3, 12)
    g_plain = _grads(model, per_token_logprobs(model, ids, att, 12), weights)
    g_ckpt = _grads(ckpt, per_token_logprobs(ckpt, ids, att, 12), weights)
    assert ckpt.model.gradient_checkpointing
    for n in g_plain:
        assert torch.allclose(g_plain[n], g_ckpt[n], atol=1e-5), n


def test_adamw_8bit_needs_bitsandbytes_and_says_so(tiny_model, monkeypatch):
    cfg = build_config({"optim.optim": "adamw_8bit"})
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install bitsandbytes, or use optim.optim=adamw"):
            make_optimizer(tiny_model, cfg)
        return
    opt, _ = make_optimizer(tiny_model, cfg)
    assert type(opt).__name__ == "AdamW8bit"
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(ValueError, match="pip install bitsandbytes"):
        make_optimizer(tiny_model, cfg)


def test_memory_breakdown_counts_weights_gradients_and_optimizer_state(tiny_model):
    import copy

    from grpokit.train.ppo import ValueModel

    ref = copy.deepcopy(tiny_model).requires_grad_(False)
    value = ValueModel(tiny_model)
    cfg = build_config({})
    opt, _ = make_optimizer(tiny_model, cfg)
    tiny_model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()                                                           # AdamW state: 2 moments per weight
    mib = sum(p.numel() * 4 for p in tiny_model.parameters()) / 2**20
    buffers = sum(b.numel() * b.element_size() for b in tiny_model.buffers()) / 2**20   # rotary inv_freq
    grpo = memory_breakdown([tiny_model, ref], [opt], 1000.0, 100.0, 1024, VOCAB)
    ppo = memory_breakdown([tiny_model, ref, value], [opt], 1000.0, 100.0, 1024, VOCAB)
    assert grpo["weights_mib"] == pytest.approx(2 * (mib + buffers))     # tied embeddings counted once
    assert grpo["gradients_mib"] == pytest.approx(mib)                   # only the policy trains
    assert grpo["optimizer_state_mib"] == pytest.approx(2 * mib, rel=1e-3)  # + one step counter per tensor
    value_mib = sum(t.numel() * t.element_size() for t in [*value.parameters(), *value.buffers()]) / 2**20
    assert ppo["weights_mib"] - grpo["weights_mib"] == pytest.approx(value_mib)
    assert grpo["logits_tensor_mib"] == 1024 * VOCAB * 4 / 2**20
    assert grpo["activations_and_rest_mib"] == pytest.approx(900.0 - 5 * mib - 2 * buffers, rel=1e-3)
    saved = compare({"grpo": {"peak_mib": 600.0, "baseline_mib": 100.0},
                     "ppo": {"peak_mib": 1000.0, "baseline_mib": 100.0}})
    assert saved["grpo_saving_vs_ppo"] == pytest.approx(0.4)
    assert saved["grpo_saving_vs_ppo_over_baseline"] == pytest.approx(1 - 500 / 900)
