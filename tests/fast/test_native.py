"""The sampler's fused C kernels (grpokit.fast.native): each equals the PyTorch ops it replaces, and the
sampler falls back to those ops when no library can be built."""

import contextlib
import logging

import pytest
import torch
import torch.nn.functional as F

from grpokit import fast, switch
from grpokit.fast import native, whole_step
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout import decode_linear, sampler
from grpokit.rollout.groups import sample_groups

K = native.kernels()
needs_kernels = pytest.mark.skipif(K is None, reason="no C compiler could build grpokit's decode kernels")


@pytest.fixture(autouse=True)
def accelerated():
    """The sampler's kernels are on only inside `grpokit.switch.accelerated`: every test here runs in it."""
    with switch.accelerated(torch.nn.Linear(1, 1)):
        yield


@needs_kernels
def test_both_code_paths_are_built(portable_kernels):
    flags = native.cpu_id().split()
    assert K.vector_width == (8 if "avx2" in flags and "fma" in flags else 1)
    assert portable_kernels.vector_width == 1


@pytest.fixture()
def torch_ops(monkeypatch):
    """The sampler without native kernels (GRPOKIT_NATIVE=0), restored after the test."""
    monkeypatch.setenv("GRPOKIT_NATIVE", "0")
    monkeypatch.setattr(native, "_loaded", False)
    yield
    monkeypatch.setattr(native, "_loaded", False)


# x [..., hd]; the decoder's convention
def _rope(x, cos, sin):
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


@needs_kernels
@pytest.mark.parametrize("nh,nkv,hd,qk_norm", [(4, 2, 32, False), (8, 4, 64, True), (2, 2, 128, False),
                                               (6, 2, 24, True)])
# 30 keys: 8-key blocks and a remainder; 5: the remainder only
@pytest.mark.parametrize("slot", [29, 4])
def test_rope_attend_equals_sdpa_with_masks_and_cache_write(lib, nh, nkv, hd, qk_norm, slot):
    torch.manual_seed(0)
    n, S, eps, scale = 5, 40, 1e-6, hd ** -0.5
    qkv = torch.randn(n, (nh + 2 * nkv) * hd)
    pos = torch.randint(0, 30, (n,))
    cos, sin = torch.randn(64, hd), torch.randn(64, hd)
    qn, kn = (torch.rand(hd) + 0.5, torch.rand(hd) + 0.5) if qk_norm else (None, None)
    kv = torch.randn(2, n, nkv, S, hd)
    mask = torch.rand(n, S) > 0.3
    mask[:, slot] = True                                                  # a row always sees its own token
    before = kv.clone()
    out = torch.empty(n, nh * hd)
    lib.rope_attend(qkv, pos, cos, sin, qn, kn, eps, kv, slot, mask, nh, scale, out)

    q, k, v = qkv.view(n, nh + 2 * nkv, hd).split([nh, nkv, nkv], 1)
    if qk_norm:
        q, k = F.rms_norm(q, (hd,), qn, eps), F.rms_norm(k, (hd,), kn, eps)
    c, s = cos[pos][:, None], sin[pos][:, None]
    q, k = _rope(q, c, s), _rope(k, c, s)
    want_kv = before.clone()
    want_kv[0, :, :, slot], want_kv[1, :, :, slot] = k, v
    assert torch.allclose(kv, want_kv, atol=1e-5)                          # only slot `slot` written
    keys, vals = want_kv[0, :, :, :slot + 1], want_kv[1, :, :, :slot + 1]
    ref = F.scaled_dot_product_attention(q[:, :, None], keys, vals, attn_mask=mask[:, None, None, :slot + 1],
                                         scale=scale, enable_gqa=True)    # [n, nh, 1, hd]
    assert torch.allclose(out, ref.reshape(n, nh * hd), atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("hd", [64, 24])                        # the vector value loop, the plain one
def test_rope_attend_with_shared_prompt_equals_copied_prompt(lib, hd):
    """Three rows of two prompts (rows 0, 1 read prompt 1; row 2 prompt 0): the prompt's keys read from one
    copy equal the same keys copied into each row's cache (1e-5), and only the row's own slot is written."""
    torch.manual_seed(0)
    nh, nkv, n, P, T, eps, scale = 6, 2, 3, 13, 9, 1e-6, hd ** -0.5
    slot = P + 5
    qkv, pos = torch.randn(n, (nh + 2 * nkv) * hd), torch.randint(0, 30, (n,))
    cos, sin = torch.randn(64, hd), torch.randn(64, hd)
    prefix, prefix_row = torch.randn(2, 2, nkv, P, hd), torch.tensor([1, 1, 0])
    own = torch.randn(2, n, nkv, T, hd)
    mask = torch.rand(n, P + T) > 0.3
    mask[:, slot] = True
    copied = torch.cat([prefix[:, prefix_row], own], 3)                  # [2, n, nkv, P + T, hd]
    want = torch.empty(n, nh * hd)
    lib.rope_attend(qkv, pos, cos, sin, None, None, eps, copied, slot, mask, nh, scale, want)
    own_before, out = own.clone(), torch.empty(n, nh * hd)
    lib.rope_attend(qkv, pos, cos, sin, None, None, eps, own, slot, mask, nh, scale, out, prefix=prefix,
                    prefix_row=prefix_row)
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.allclose(own[:, :, :, slot - P], copied[:, :, :, slot], atol=1e-6)   # the new key and value
    own[:, :, :, slot - P] = own_before[:, :, :, slot - P]
    assert torch.equal(own, own_before)                                   # nothing else written


@needs_kernels
def test_add_rms_and_silu_mul_equal_torch(lib):
    torch.manual_seed(0)
    h, y, w = torch.randn(7, 96), torch.randn(7, 96), torch.rand(96)
    out, h0 = torch.empty(7, 96), h.clone()
    lib.add_rms(h, y, w, 1e-6, out)
    assert torch.allclose(h, h0 + y) and torch.allclose(out, F.rms_norm(h0 + y, (96,), w, 1e-6), atol=1e-6)
    lib.add_rms(h, None, w, 1e-6, out)                                      # no residual: the norm alone
    assert torch.allclose(h, h0 + y) and torch.allclose(out, F.rms_norm(h, (96,), w, 1e-6), atol=1e-6)
    gu = torch.randn(7, 2 * 83) * 30                                      # large |gate|: the exp's clamps
    gate, up = gu.chunk(2, -1)                                            # 83: 8-wide blocks and a remainder
    assert torch.allclose(lib.silu_mul(gu), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_sample_law_logprobs_greedy_and_zero_mass(lib):
    torch.manual_seed(0)
    logits = torch.randn(1, 50) * 2
    logits[0, 7] = float("-inf")                                          # a suppressed token (EOS blocked)
    for temperature in (1.0, 0.6):
        draws, lps = lib.sample(logits.repeat(60_000, 1), temperature, greedy=False)
        logp = torch.log_softmax(logits[0] / temperature, -1)
        assert torch.allclose(lps, logp[draws], atol=1e-5)
        freq = torch.bincount(draws, minlength=50).double() / draws.numel()
        assert freq[7] == 0
        stat = (((freq - logp.exp().double()) ** 2 / logp.exp().double().clamp(min=1e-12)).sum()
                * draws.numel())
        assert stat < 100                                                 # chi-square, 48 dof: p ~ 1e-5 at 90
        wrong = torch.softmax(logits[0], -1).double() if temperature != 1.0 else torch.full((50,), 1 / 49.0)
        wrong[7] = 0
        # the test has power
        assert ((freq - wrong) ** 2 / wrong.clamp(min=1e-12)).sum() * draws.numel() > 1000
    z = torch.randn(9, 300)
    tok, lp = lib.sample(z, 0.8, greedy=True)
    assert torch.equal(tok, z.argmax(-1))
    assert torch.allclose(lp, torch.log_softmax(z / 0.8, -1).gather(-1, tok[:, None])[:, 0], atol=1e-5)


def _lean_models(char_tokenizer):
    import transformers

    out = {"qwen2": build_model("tiny")}                                   # q/k/v biases
    for arch, cls in (("llama", transformers.LlamaConfig), ("qwen3", transformers.Qwen3Config)):
        cfg = cls(vocab_size=len(char_tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, head_dim=16,
                  eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
        torch.manual_seed(0)
        out[arch] = (transformers.AutoModelForCausalLM.from_config(cfg), char_tokenizer)
    return out


PROMPTS = ["What is 1+2?", "33+44=", "7*8?", "a"]                      # unequal lengths: left padding


@needs_kernels
def test_sampler_with_kernels_equals_sampler_without(char_tokenizer, monkeypatch):
    """Greedy rows and log-probs (1e-5) with and without the kernels: Qwen2 (biases), Llama, Qwen3
    (q/k norm), GQA, left-padded prompts of unequal length."""
    for name, (model, tok) in _lean_models(char_tokenizer).items():
        runs = {}
        for flag in ("1", "0"):
            monkeypatch.setenv("GRPOKIT_NATIVE", flag)
            monkeypatch.setattr(native, "_loaded", False)
            runs[flag] = sample_groups(model, tok, PROMPTS, 2, 24, backend="fast", greedy=True,
                                       temperature=0.7, suppress_eos=True)
        a, b = runs["1"], runs["0"]
        assert torch.equal(a.completion_ids, b.completion_ids), name
        assert torch.allclose(a.sampling_logprobs, b.sampling_logprobs, atol=1e-5), name
    monkeypatch.setattr(native, "_loaded", False)


def _one_call_modes() -> list[str]:
    """The one-call step's matmul paths this build has: packed panels (AVX2 tile), PyTorch's sgemm."""
    if K is None:
        return []
    return (["panels"] if K.vector_width == 8 else []) + (["sgemm"] if K.whole_step else [])


@contextlib.contextmanager
def _matmuls(mode: str):
    """Engines built inside use the one-call step's `mode` matmuls ("sgemm": as a build without AVX2)."""
    width = K.vector_width
    K.vector_width = 1 if mode == "sgemm" else width
    try:
        yield
    finally:
        K.vector_width = width


@needs_kernels
def test_decode_steps_equal_torch_ops_while_rows_leave(char_tokenizer, monkeypatch):
    """The engine fed the same tokens with and without kernels, each prompt's cache slots copied to its
    rows or kept once and shared: equal logits (1e-5) at every step, across two rounds of finished rows
    being dropped from the batch and the cache."""
    from grpokit.rollout.groups import encode_prompts

    for name, (model, tok) in _lean_models(char_tokenizer).items():
        ids, mask = encode_prompts(tok, PROMPTS, None)
        torch.manual_seed(1)
        feed = torch.randint(5, 40, (8, 20))                               # [N, steps] tokens to feed
        logits = {}
        # one C call / per layer / no kernels; "-shared": the prompts' slots kept once (no one-call step)
        for mode in _one_call_modes() + ["layers", "torch", "layers-shared", "torch-shared"]:
            with torch.no_grad(), _matmuls(mode), monkeypatch.context() as m:
                if mode.endswith("-shared"):
                    m.setattr(fast.Scope, "whole_step", lambda self, dec, rows: None)
                eng = sampler._LeanEngine(model.eval(), ids, mask, 2, 20)
                assert (eng.dec.prefix is not None) == mode.endswith("-shared"), (name, mode)
                assert eng.dec.whole is not None or not _one_call_modes() or mode.endswith("-shared"), name
                assert eng.dec.whole is None or eng.dec.whole.panels == (mode != "sgemm")
                if mode not in ("panels", "sgemm"):
                    eng.dec.whole = None
                if mode.startswith("torch"):
                    eng.dec.native = None
                rows, out = torch.arange(8), [eng.first_logits()]
                for t in range(19):
                    if t in (6, 13):                                      # drop every third live row
                        keep = torch.tensor([i for i in range(rows.numel()) if i % 3 != 1])
                        eng.keep_rows(keep, t)
                        rows = rows[keep]
                    out.append(eng.step(feed[rows, t], t))
            logits[mode] = out
        for mode in _one_call_modes() + ["layers", "layers-shared", "torch-shared"]:
            for t, (a, b) in enumerate(zip(logits[mode], logits["torch"])):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5), (name, mode, t)


@needs_kernels
@pytest.mark.parametrize("mode", _one_call_modes())
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_call_step_split_over_threads_equals_torch_ops(tiny_model, char_tokenizer, threads, mode):
    """The one-call step cuts the rows into one range per torch thread (7 rows: ranges of 7, 3 + 4,
    2 + 2 + 3); every range's logits equal the PyTorch ops' (1e-5) at each step."""
    from grpokit.rollout.groups import encode_prompts

    ids, mask = encode_prompts(char_tokenizer, PROMPTS[:1] + ["12+30=", "9-2="], None)
    feed = torch.randint(5, 40, (21, 12), generator=torch.Generator().manual_seed(threads))
    before = torch.get_num_threads()
    try:
        out = {}
        for side in ("whole", "torch"):
            torch.set_num_threads(threads if side == "whole" else before)
            with torch.no_grad(), _matmuls(mode):
                eng = sampler._LeanEngine(tiny_model.eval(), ids, mask, 7, 12)
                assert eng.dec.whole is not None and eng.dec.whole.panels == (mode == "panels")
                if side == "torch":
                    eng.dec.whole, eng.dec.native = None, None
                keep = torch.arange(0, 21, 3)                              # 7 live rows of 21
                eng.keep_rows(keep, 0)
                out[side] = [eng.step(feed[keep, t], t) for t in range(11)]
    finally:
        torch.set_num_threads(before)
    for t, (a, b) in enumerate(zip(out["whole"], out["torch"])):
        assert a.shape == (7, b.shape[1]) and torch.allclose(a, b, atol=1e-5), t


@needs_kernels
@pytest.mark.skipif(K is None or not K.whole_step, reason="no BLAS sgemm_ symbol in this PyTorch build")
@pytest.mark.parametrize("M,K_,N,bias",
                         [(1, 7, 3, True), (32, 128, 256, True), (9, 64, 1000, False), (5, 512, 96, False)])
def test_c_linear_through_torch_sgemm_equals_f_linear(M, K_, N, bias):
    torch.manual_seed(M)
    x, W = torch.randn(M, K_), torch.randn(N, K_)
    b = torch.randn(N) if bias else None
    y = torch.full((M, N), float("nan"))
    K.linear(x, W, b, out=y)
    assert torch.allclose(y, F.linear(x, W, b), atol=1e-4)


@needs_kernels
def test_kernels_first_loaded_inside_bf16_autocast(monkeypatch):
    # LoRA with model.precision=bf16 first reached the kernels inside the sampler's autocast region, where
    # the fp32 check against F.linear got a bf16 result and raised "Float did not match BFloat16"
    monkeypatch.setattr(native, "_loaded", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loaded = native.kernels()
    assert loaded is not None and loaded.whole_step
    monkeypatch.setattr(native, "_loaded", False)


@needs_kernels
@pytest.mark.parametrize("M,K_,N,bias", [(1, 7, 3, True), (6, 128, 256, True), (13, 64, 1000, False),
                                         (16, 512, 96, True), (11, 72, 100, True)])
def test_packed_linear_equals_f_linear(lib, M, K_, N, bias):
    """gk_linear_packed on panels from pack_panels: row tiles of 6 and their remainders, N not a multiple
    of 16 (the last panel writes only its real columns), a padded bias or none."""
    torch.manual_seed(M)
    x, W = torch.randn(M, K_), torch.randn(N, K_)
    b = torch.randn(N) if bias else None
    y = torch.full((M, N), float("nan"))
    P, bp = whole_step.pack_panels(W, lib), whole_step.pad_bias(b)
    n16 = -(-N // 16) * 16
    want = torch.cat([W, W.new_zeros(n16 - N, K_)]).view(n16 // 16, 16, K_).transpose(1, 2)
    assert torch.equal(P, want) and (bp is None or bp.shape[0] == n16)   # P[p, k, c] = W[16 p + c, k]
    lib.linear_packed(x, P, bp, n_out=N, out=y)
    assert torch.allclose(y, F.linear(x, W, b), atol=1e-4)


@needs_kernels
def test_one_call_step_only_where_it_applies(tiny_model, monkeypatch):
    """Packed (oneDNN) weights and non-SiLU MLPs keep the per-layer path; a recording decoder (reuse)
    takes the per-layer path at every step, since only it hands each projection to the record."""
    assert (sampler.LeanDecoder(tiny_model, 2, 16).whole is not None) == bool(_one_call_modes())
    monkeypatch.setattr(decode_linear, "PACK_MIN_ELEMENTS", 1)                  # every weight packed
    assert sampler.LeanDecoder(tiny_model, 2, 16).whole is None
    monkeypatch.undo()
    dec = sampler.LeanDecoder(tiny_model, 2, 16)
    dec.silu = False
    assert whole_step.WholeStep.plan(dec, 2) is None
    dec = sampler.LeanDecoder(tiny_model, 2, 16)
    calls = []
    monkeypatch.setattr(whole_step.WholeStep, "__call__", lambda self, *a: calls.append(a))
    dec.record = object()                                                  # stands in for an ActivationRecord
    monkeypatch.setattr(dec, "_layers_native", lambda h, *a: h)            # the per-layer path, stubbed out
    dec.step(torch.tensor([3, 4]), torch.tensor([0, 0]), 0, torch.ones(2, 16, dtype=torch.bool))
    assert calls == []


@needs_kernels
def test_decoder_uses_kernels_for_float32_cpu_only(tiny_model):
    assert sampler.LeanDecoder(tiny_model, 2, 16).native is K
    with switch.plain():                                                    # the switch off: PyTorch ops only
        dec = sampler.LeanDecoder(tiny_model, 2, 16)
        assert dec.native is None and dec.whole is None
    assert sampler.LeanDecoder(tiny_model.to(torch.bfloat16), 2, 16).native is None


def test_no_compiler_falls_back_to_torch_ops(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", False)
    with caplog.at_level(logging.INFO, logger="grpokit"):
        assert native.kernels() is None
    assert "decoding with PyTorch ops" in caplog.text
    model, tok = build_model("tiny")
    r = sample_groups(model, tok, bench_prompts(2), 2, 8, backend="fast", suppress_eos=True)
    assert r.completion_ids.shape == (4, 8)
    monkeypatch.setattr(native, "_loaded", False)


def test_build_is_cached_and_can_be_switched_off(monkeypatch, tmp_path, torch_ops):
    assert native.kernels() is None                                       # GRPOKIT_NATIVE=0
    if native.compiler() is None:
        pytest.skip("no C compiler")
    first = native.build(tmp_path)
    assert first is not None and first.parent == tmp_path
    stamp = first.stat().st_mtime_ns
    assert native.build(tmp_path) == first and first.stat().st_mtime_ns == stamp   # found, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]           # no temporary file left behind


@needs_kernels
def test_prefill_by_steps_only_for_short_prompts(tiny_model, char_tokenizer, monkeypatch):
    """Prompts up to PREFILL_STEPS_MAX tokens are prefilled by one-call steps, longer ones by the batched
    pass; both give the PyTorch ops' first logits and cache (1e-5)."""
    from grpokit.rollout.groups import encode_prompts

    if not _one_call_modes():
        pytest.skip("no one-call step in this build")
    used = []
    prefill = whole_step.WholeStep.prefill
    monkeypatch.setattr(whole_step.WholeStep, "prefill",
                        lambda self, *a: used.append(a[0].shape[1]) or prefill(self, *a))
    for prompts in (PROMPTS, ["1+2+3+4+5+6+7+8+9 is what?", "a"]):        # longest 12 and 26 characters
        ids, mask = encode_prompts(char_tokenizer, prompts, None)
        with torch.no_grad():
            eng = sampler._LeanEngine(tiny_model.eval(), ids, mask, 2, 4)
        assert eng.dec.whole is not None
        P = ids.shape[1]
        with torch.no_grad():                                             # the PyTorch-ops reference
            dec = sampler.LeanDecoder(tiny_model, ids.shape[0] * 2, P + 4)
            dec.whole, dec.native = None, None
            want = dec.prefill(ids, mask, 2).repeat_interleave(2, 0)
        assert torch.allclose(eng.first_logits(), want, atol=1e-5)
        assert torch.allclose(eng.dec.kv[..., :P, :], dec.kv[..., :P, :], atol=1e-5)
    assert used == [12] and sampler.PREFILL_STEPS_MAX < 26                # the short prompts only


_REGROW = """
import resource, torch
from grpokit.fast import native
kept = native.keep_freed_memory()
faults = []
for _ in range(4):                       # one pass's worth of large activations, allocated then all freed
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(k << 18) for k in range(1, 11)]   # 1..10 MiB, written: 55 MiB
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(kept, *faults)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="a glibc malloc setting")
def test_keep_freed_memory_stops_refaulting_each_pass():
    """Without it, glibc maps pass 1's blocks, raises its (moving) mmap threshold when they are freed,
    serves pass 2 from a fresh heap and trims it again: ~14,000 faults in pass 2, every time. Later
    passes vary with glibc's heuristics (0-12,500 seen). With it the pages are mostly reused: passes 2-4
    together took 0-2,560 faults while `import grpokit` loaded the whole package (10 runs), up to 7,400
    against ~34,000-39,000 without since the package is imported lazily (a smaller heap at the start;
    2026-12-02), so pass 2 is compared with the plain one's. GRPOKIT_KEEP_MEMORY=0 leaves malloc alone."""
    import os
    import subprocess
    import sys

    def run(**env):
        out = subprocess.run([sys.executable, "-c", _REGROW], capture_output=True, text=True, check=True,
                             env={**os.environ, **env}).stdout.split()
        return out[0] == "True", [int(x) for x in out[1:]]

    kept, faults = run()
    plain_kept, plain_faults = run(GRPOKIT_KEEP_MEMORY="0")
    assert kept and not plain_kept
    assert plain_faults[1] > 10000, plain_faults                          # the refaulting it prevents
    assert faults[1] < plain_faults[1] / 2 and sum(faults[1:]) < 10000, (faults, plain_faults)


def test_keep_freed_memory_rejects_other_values(monkeypatch):
    monkeypatch.setenv("GRPOKIT_KEEP_MEMORY", "false")
    with pytest.raises(ValueError, match="set it to 0 .* or 1"):
        native.keep_freed_memory()
