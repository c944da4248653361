"""LoRA (peft): adapters only train, the reference is the base with adapters disabled, save + merge."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from easy_task import PROMPTS, easy_config
from grpokit.config.schema import ConfigError, ModelConfig, build_config
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.lora import (
    DisabledAdapterReference,
    LoRAError,
    reference_for,
    trainable_parameters,
    wrap_lora,
)
from grpokit.train.loop import build_state, train_grpo

pytest.importorskip("peft")


def _lora(model, r=4, **kw):
    return wrap_lora(model, ModelConfig(lora_r=r, lora_alpha=8, **kw))


def test_only_adapters_train_and_the_count_is_r_times_in_plus_out(tiny_model, capsys):
    peft_model = _lora(tiny_model, r=4)
    trainable, total = trainable_parameters(peft_model)
    print(f"LoRA r=4 on q,k,v,o of the tiny model: {trainable} trainable of {total} parameters")
    # tiny Qwen2: hidden 64, 4 heads of 16, 2 KV heads -> q 64x64, k 64x32, v 64x32, o 64x64; 2 layers
    # LoRA adds r * (in + out) per matrix: 4 * (128 + 96 + 96 + 128) = 1792 per layer, 3584 in all
    assert trainable == 3584
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    assert "3584 trainable" in capsys.readouterr().out


def test_reference_is_the_base_model_with_adapters_disabled(tiny_model):
    base = copy.deepcopy(tiny_model)
    policy = _lora(tiny_model)
    with torch.no_grad():  # non-zero B so the adapters change the policy
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ref = reference_for(policy)
    assert isinstance(ref, DisabledAdapterReference)
    assert list(ref.parameters()) == [] and ref.state_dict() == {}         # no second copy of the weights
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16], [0, 0, 20, 21, 22, 23, 24]])
    att = (ids != 0).long()
    with torch.no_grad():
        want = per_token_logprobs(base.eval(), ids, att, 4)
        got = per_token_logprobs(ref, ids, att, 4)
        policy_lp = per_token_logprobs(policy, ids, att, 4)
    assert torch.allclose(got, want, atol=1e-6)
    assert (policy_lp - want).abs().max() > 1e-3                            # adapters on: a different model
    assert policy.training                                                  # the policy's mode is restored


def _realistic_tiny_model(seed: int):
    """The tiny random model with its final norm scaled x4, so logits have a realistic scale.

    Random-init logits are nearly uniform (|e| * |h| ~ 1.3 at most); with the embeddings and lm-head
    frozen, LoRA could then lift P('a') only from 1% to ~3%. Scaled, the cap is far away.
    """
    from grpokit.model.loading import build_char_tokenizer, tiny_random_model

    tok = build_char_tokenizer()
    model = tiny_random_model(tok, seed=seed)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    return model, tok


def test_lora_run_improves_reward_and_saves_an_adapter_that_reloads_and_merges(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = easy_config(tmp_path, **{"model.lora_r": 16, "model.lora_alpha": 32, "optim.learning_rate": 2e-2,
                                   "run.max_steps": 30})
    model, tok = _realistic_tiny_model(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)                  # the adapters' init: independent of the tests run before
    policy = wrap_lora(model, cfg.model)
    trainable, total = trainable_parameters(policy)
    print(f"LoRA r=16: {trainable} trainable of {total} parameters")
    state = train_grpo(cfg, model=policy, tokenizer=tok, train_examples=PROMPTS)
    assert isinstance(state.ref_model, DisabledAdapterReference)
    rows = [json.loads(line)
            for line in (Path(cfg.run.output_dir) / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0]["reward_mean"], sum(r["reward_mean"] for r in rows[-5:]) / 5
    # ~1% 'a' -> 10%+ (runs: 0.14-0.58)
    assert last > first + 0.08, (first, last)
    # the reference is the base, not the policy
    assert rows[-1]["approx_kl"] > 0

    out = Path(cfg.run.output_dir) / "final"
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    state.model.eval()
    with torch.no_grad():
        want = state.model(input_ids=ids).logits
        reloaded = PeftModel.from_pretrained(_realistic_tiny_model(cfg.run.seed)[0], out).eval()
        assert torch.allclose(reloaded(input_ids=ids).logits, want, atol=1e-5)
        merged_here = reloaded.merge_and_unload()
        assert torch.allclose(merged_here(input_ids=ids).logits, want, atol=1e-4)
        exported = AutoModelForCausalLM.from_pretrained(out / "merged").eval()  # plain transformers
        assert torch.allclose(exported(input_ids=ids).logits, want, atol=1e-4)


def test_lora_build_state_holds_one_copy_of_the_weights(tmp_path):
    cfg = easy_config(tmp_path, **{"model.lora_r": 4})
    state = build_state(cfg, train_examples=PROMPTS)
    assert isinstance(state.ref_model, DisabledAdapterReference)
    assert all(p.requires_grad == ("lora_" in n) for n, p in state.model.named_parameters())
    opt_params = [p for g in state.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in opt_params) == trainable_parameters(state.model)[0]


def test_lora_errors_say_what_to_change(tiny_model, monkeypatch):
    with pytest.raises(LoRAError, match="may not include the lm-head"):
        wrap_lora(copy.deepcopy(tiny_model), ModelConfig(lora_r=4, lora_target_modules=["q_proj", "lm_head"]))
    with pytest.raises(LoRAError, match="check model.lora_target_modules"):
        wrap_lora(copy.deepcopy(tiny_model), ModelConfig(lora_r=4, lora_target_modules=["no_such_proj"]))
    with pytest.raises(ConfigError, match="loss.ref_model_sync_steps=0"):
        build_config({"model.lora_r": 4, "loss.ref_model_sync_steps": 5})
    monkeypatch.setitem(sys.modules, "peft", None)                          # peft not installed
    with pytest.raises(LoRAError, match=r"pip install 'grpokit\[peft\]'"):
        wrap_lora(tiny_model, ModelConfig(lora_r=4))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-stored"])
def test_lean_sampler_applies_the_adapters(precision, monkeypatch):
    """A LoRA policy samples on the lean decoder (adapters merged into its weight copies): its log-probs
    equal the PeftModel's own forward (adapters on), as the cached engine's do; DoRA falls back.
    bf16-stored: the base in bfloat16 with peft's float32 adapters (TRL's bf16 LoRA), merged in bf16."""
    from grpokit.model.precision import set_compute_dtype
    from grpokit.model.testing import bench_prompts, build_model
    from grpokit.rollout import sampler
    from grpokit.rollout.groups import sample_groups

    model, tok = build_model("tiny", mean_length=8)
    if precision == "bf16-stored":
        model = model.to(torch.bfloat16)
    policy = _lora(model, r=4, lora_target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    if precision == "bf16-stored":
        assert {p.dtype for n, p in policy.named_parameters() if "lora_" in n} == {torch.float32}
    with torch.no_grad():  # non-zero B: the adapters change the model
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    if precision == "bf16":
        set_compute_dtype(policy, torch.bfloat16)
    assert sampler.lean_supported(policy, 64)
    for engine in ("lean", "cached"):
        if engine == "cached":
            monkeypatch.setattr(sampler, "lean_supported", lambda model, n: False)
        torch.manual_seed(0)
        r = sample_groups(policy, tok, bench_prompts(2), 4, 24, temperature=0.8, backend="fast")
        with torch.no_grad():
            again = per_token_logprobs(policy, r.input_ids, r.attention_mask, r.completion_ids.shape[1],
                                       temperature=0.8)
        m = r.completion_mask.bool()
        tol = 1e-4 if precision == "fp32" else 0.1   # bf16 matmuls on both sides, different fusions
        assert (r.sampling_logprobs[m] - again[m]).abs().max() < tol, engine
    peft = pytest.importorskip("peft")
    dora = peft.get_peft_model(build_model("tiny")[0], peft.LoraConfig(r=4, target_modules=["q_proj"],
                                                                      use_dora=True))
    assert not sampler.lean_supported(dora, 64)


def test_lora_reference_computes_in_the_policys_precision(tiny_model):
    """The reference view holds no weights of its own: it takes the policy's bf16 compute (it ran in fp32,
    2x slower than the policy's passes, with a KL at step 1 that was only the two precisions' rounding)."""
    from grpokit.model.precision import compute_dtype, computing_in, set_compute_dtype

    policy = _lora(tiny_model)                    # B = 0: the adapters change nothing yet
    set_compute_dtype(policy, torch.bfloat16)
    ref = reference_for(policy)
    assert compute_dtype(ref) == torch.bfloat16
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16], [0, 0, 20, 21, 22, 23, 24]])
    att = (ids != 0).long()
    with torch.no_grad():
        ref_lp = per_token_logprobs(ref, ids, att, 4)
        policy_lp = per_token_logprobs(policy, ids, att, 4)
        with computing_in(policy, None):
            fp32_lp = per_token_logprobs(ref, ids, att, 4)
    assert torch.equal(ref_lp, policy_lp)         # the same model in the same precision: KL 0 at step 1
    assert not torch.equal(ref_lp, fp32_lp)
