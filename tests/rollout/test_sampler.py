"""The fast sampler (sampler.py): same distribution as `model.generate`, exact masks and log-probs."""

import logging

import pytest
import torch

from grpokit.model.logprobs import per_token_logprobs, position_ids_from_mask
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout import decode_linear, sampler, sampling
from grpokit.rollout.groups import encode_prompts, sample_groups

PROMPTS = ["What is 1+2?", "33+44=", "7*8?", "a"]


def _greedy_pair(model, tok, prompts, n):
    a = sample_groups(model, tok, prompts, 1, n, backend="fast", greedy=True, suppress_eos=True)
    b = sample_groups(model, tok, prompts, 1, n, backend="generate", greedy=True, suppress_eos=True)
    return a, b


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_greedy_equals_generate_on_bench_models(size):
    model, tok = build_model(size)
    assert sampler.lean_supported(model, 64)
    n = 16 if size == "tiny" else 8
    a, b = _greedy_pair(model, tok, PROMPTS[:3], n)
    assert a.completion_ids.shape == b.completion_ids.shape == (3, n)
    assert torch.equal(a.completion_ids, b.completion_ids)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_greedy_equals_generate_on_other_lean_architectures(char_tokenizer, arch):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config,
           "mistral": transformers.MistralConfig}[arch]
    cfg = cls(vocab_size=len(char_tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, head_dim=16,
              eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert sampler.lean_supported(model, 64)
    a, b = _greedy_pair(model, char_tokenizer, PROMPTS, 12)
    assert torch.equal(a.completion_ids, b.completion_ids)


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; bins with expected count < 5 are pooled."""
    n = counts.sum()
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_first_token_distribution_matches_generate_warpers(char_tokenizer, temperature, top_k, top_p):
    """Chi-square: 40k first tokens of one prompt vs the distribution transformers' warpers define."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from grpokit.model.loading import tiny_random_model

    model = tiny_random_model(char_tokenizer, seed=3)
    with torch.no_grad():  # sharpen the logits (x3) so the distribution is far from uniform
        model.get_decoder().norm.weight.mul_(3.0)
    ids, mask = encode_prompts(char_tokenizer, ["12+7="], None)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=position_ids_from_mask(mask)).logits[:, -1]
    for warp in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None,
                 TopPLogitsWarper(top_p) if top_p < 1 else None):
        logits = warp(ids, logits) if warp is not None else logits
    want = logits.softmax(-1)[0]                                          # [V]
    torch.manual_seed(0)
    toks, _ = sampler.fast_sample(model, ids, mask, 40_000, 1, temperature=temperature, top_p=top_p,
                                  top_k=top_k, eos_ids=[char_tokenizer.eos_token_id],
                                  pad_id=char_tokenizer.pad_token_id)
    counts = torch.bincount(toks[:, 0], minlength=want.numel())
    assert counts[want == 0].sum() == 0                                   # filtered tokens never drawn
    assert int((want > 0).sum()) > 5
    assert _chi_square_pvalue(counts, want) > 1e-3
    # and the test has power: the unfiltered distribution is rejected when filters are on
    if top_k:
        with torch.no_grad():
            raw = model(input_ids=ids, attention_mask=mask).logits[0, -1].softmax(-1)
        assert _chi_square_pvalue(counts, raw) < 1e-6


def test_sample_categorical_frequencies_and_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2]]).repeat(50_000, 1)
    torch.manual_seed(0)
    draws = sampling.sample_categorical(probs)
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    assert freq[0] == 0 and freq[2] == 0
    assert torch.allclose(freq, probs[0].double(), atol=0.01)


@pytest.mark.parametrize("engine", ["lean", "cached"])
def test_natural_lengths_masks_and_logprobs_match_recomputation(monkeypatch, engine):
    """Rows stop at spread-out lengths (finished rows are dropped mid-decode); masks end at the first EOS
    and the returned log-probs equal a forward pass over the finished batch."""
    if engine == "cached":
        monkeypatch.setattr(sampler, "lean_supported", lambda model, n: False)
    model, tok = build_model("tiny", mean_length=8)
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(4), 8, 40, temperature=0.8, backend="fast")
    lengths = r.completion_mask.sum(-1)
    # varied lengths, some rows dropped early
    assert len(set(lengths.tolist())) >= 6
    eos = tok.eos_token_id
    for row, n, trunc in zip(r.completion_ids, lengths.tolist(), r.truncated.tolist()):
        assert (row[:n - 1] != eos).all() and (row[n - 1] == eos) != trunc
        assert (row[n:] == tok.pad_token_id).all()
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        again = per_token_logprobs(model, r.input_ids, r.attention_mask, T, temperature=0.8)
    m = r.completion_mask.bool()
    assert torch.allclose(r.sampling_logprobs[m], again[m], atol=1e-4)
    assert (r.sampling_logprobs[~m] == 0).all()


def test_lean_path_is_skipped_for_hooked_or_unknown_models(char_tokenizer, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    from grpokit.model.loading import tiny_random_model

    model = tiny_random_model(char_tokenizer)
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, o: o)
    assert not sampler.lean_supported(model, 32)                          # a hook would be bypassed
    handle.remove()
    assert sampler.lean_supported(model, 32)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(char_tokenizer), n_embd=32, n_layer=1, n_head=2,
                                      eos_token_id=char_tokenizer.eos_token_id))
    with caplog.at_level(logging.INFO, logger="grpokit"):
        assert not sampler.choose_backend(gpt2, "auto")
        r = sample_groups(gpt2, char_tokenizer, PROMPTS[:2], 2, 5)
    assert "using model.generate" in caplog.text
    assert r.sampling_logprobs is None and r.completion_ids.shape[0] == 4


def test_decode_linear_packs_only_large_weights_and_agrees_with_f_linear():
    torch.manual_seed(0)
    big = torch.nn.Linear(512, 1024)
    small = torch.nn.Linear(128, 256, bias=False)
    lin_big = decode_linear.DecodeLinear(big.weight, big.bias, rows=32)
    lin_small = decode_linear.DecodeLinear(small.weight, None, rows=32)
    assert lin_small.packed is None
    if torch.backends.mkldnn.is_available():
        assert lin_big.packed is not None
    with torch.no_grad():
        for rows in (1, 7, 32, 100):                     # rows dropped or prefill: any row count works
            x = torch.randn(rows, 1, 512)
            assert torch.allclose(lin_big(x), big(x), atol=1e-5, rtol=1e-5)
            y = torch.randn(rows, 128)
            assert torch.equal(lin_small(y), small(y))


@pytest.mark.parametrize("engine", ["lean", "cached", "generate"])
def test_sampling_leaves_every_module_mode_as_it_was(monkeypatch, engine):
    """The model's own forward (cached engine, `generate`) runs in eval mode and every module's mode is
    restored, a block the user froze in eval included; the lean decoder reads the weights only."""
    if engine == "cached":
        monkeypatch.setattr(sampler, "lean_supported", lambda model, n: False)
    model, tok = build_model("tiny")
    model.train()
    model.model.layers[1].eval()                                          # a user's frozen block
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.training))
    if engine == "lean":
        # the hook alone would refuse it
        monkeypatch.setattr(sampler, "lean_supported", lambda model, n: True)
    before = {name: m.training for name, m in model.named_modules()}
    sample_groups(model, tok, bench_prompts(2), 2, 6, backend="generate" if engine == "generate" else "fast",
                  suppress_eos=True)
    assert {name: m.training for name, m in model.named_modules()} == before
    assert seen == ([] if engine == "lean" else [False] * 6)              # prefill + 5 decode steps, in eval
