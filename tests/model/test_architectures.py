"""Every architecture grpokit's decode loop serves (CACHE_MODEL_TYPES), as a tiny random model built offline
from its family's config: the sampler's log-probs equal a full forward, the training forward's shared
prompts equal one row at a time, greedy decoding equals `model.generate`; LoRA on a MoE's fused experts
(peft target_parameters) trains. Tool runs on MoE, Gemma and GPT-OSS:
tests/agents/test_tools_on_architectures.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from grpokit.model import testing
from grpokit.model.loading import build_char_tokenizer
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.shared_prompts import CACHE_MODEL_TYPES
from grpokit.rollout import sampler
from grpokit.rollout.groups import sample_groups

PROMPTS = ["What is 1+2?", "33+44=", "7*"]


def family_model(model_type: str, tok, seed: int = 0):
    return testing.family_model(model_type, len(tok), tok.eos_token_id, tok.pad_token_id, seed=seed)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize("model_type", CACHE_MODEL_TYPES)
def test_the_decode_loop_reproduces_the_models_own_forward(model_type, tok):
    model = family_model(model_type, tok)
    assert model.config.model_type == model_type and sampler.choose_backend(model, "auto")
    torch.manual_seed(0)
    r = sample_groups(model, tok, PROMPTS, 3, 10, temperature=1.0)                  # the cached decode loop
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        full = per_token_logprobs(model, r.input_ids, r.attention_mask, T)          # prompts shared
        rows = torch.cat([per_token_logprobs(model, r.input_ids[i:i + 1], r.attention_mask[i:i + 1], T)
                          for i in range(r.input_ids.shape[0])])                     # one row at a time
    m = r.completion_mask.bool()
    assert m.sum() > len(PROMPTS) * 3          # completions of several tokens
    torch.testing.assert_close(r.sampling_logprobs[m], full[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(full[m], rows[m], atol=1e-5, rtol=0)
    fast = sample_groups(model, tok, PROMPTS, 1, 10, backend="fast", greedy=True, suppress_eos=True)
    ref = sample_groups(model, tok, PROMPTS, 1, 10, backend="generate", greedy=True, suppress_eos=True)
    assert torch.equal(fast.completion_ids, ref.completion_ids)


def test_hybrid_linear_attention_models_stay_on_generate(tok):
    """Their caches are not a DynamicCache of attention layers: `auto` leaves them to model.generate."""
    cfg = AutoConfig.for_model("qwen3_next", vocab_size=len(tok), **testing.FAMILY_SIZES)
    assert "qwen3_next" not in CACHE_MODEL_TYPES
    assert not sampler.choose_backend(AutoModelForCausalLM.from_config(cfg), "auto")


def test_lora_on_a_moes_fused_experts_trains_only_the_adapters(tok, tmp_path):
    """peft's target_parameters on Qwen3-MoE's 3-D expert weights (model.lora_target_parameters)."""
    pytest.importorskip("peft")
    from easy_task import EASY
    from grpokit.config.schema import build_config
    from grpokit.train.loop import build_state
    from grpokit.train.step import train_step

    cfg = build_config({"model.lora_r": 4, "model.lora_target_modules": ["q_proj", "v_proj"],
                        "model.lora_target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                        "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
                        "rollout.num_generations": 4,
                        "rollout.max_completion_length": 8, "optim.learning_rate": 1e-2,
                        "run.output_dir": str(tmp_path), "run.progress": False, "model.device": "cpu"})
    from easy_task import PROMPTS as EASY_PROMPTS

    state = build_state(cfg, family_model("qwen3_moe", tok), tok, train_examples=EASY_PROMPTS)
    trainable = {n: p.detach().clone() for n, p in state.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    assert any("experts" in n for n in trainable)                   # the experts' own adapters
    frozen = {n: p.detach().clone() for n, p in state.model.named_parameters() if not p.requires_grad}
    for _ in range(2):
        train_step(state)
    moved = [n for n, p in state.model.named_parameters()
             if n in trainable and not torch.equal(p, trainable[n])]
    assert any("experts" in n for n in moved)
    assert all(torch.equal(p, frozen[n]) for n, p in state.model.named_parameters() if n in frozen)
