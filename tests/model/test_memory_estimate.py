"""The computed GPU memory of a QLoRA run (grpokit.model.memory_estimate): the parameter counts are the
models' own, the unit costs come from a measured row as the docstring says, the peak is its parts'."""

import pytest
import torch

from grpokit.model.memory_estimate import ARCHS, CUDA_CONTEXT_MIB, MIB, Arch, Measured, estimate_mib

TINY = Arch("tiny", vocab=256, hidden=64, layers=3, heads=4, kv_heads=2, intermediate=96, tied=True,
            qkv_bias=True)


def _model(arch: Arch):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kind = Qwen2Config if arch.qkv_bias else LlamaConfig
    cfg = kind(vocab_size=arch.vocab, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
               num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
               intermediate_size=arch.intermediate, tie_word_embeddings=arch.tied)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("arch", [TINY, Arch("untied", 300, 48, 2, 6, 3, 80, tied=False)])
def test_the_counts_are_the_models_own(arch):
    model = _model(arch)
    linear = sum(p.numel() for n, p in model.named_parameters() if n.endswith("_proj.weight"))
    assert linear == arch.linear_params()
    assert sum(p.numel() for p in model.parameters()) == arch.linear_params() + arch.other_params()
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj",
                                                                          "o_proj", "gate_proj", "up_proj",
                                                                          "down_proj"]))
    assert sum(p.numel() for p in lora.parameters() if p.requires_grad) == arch.lora_params(4)


def test_the_published_sizes():
    """Qwen2.5's model cards and SmolLM2's measured full-training count (benchmarks/results)."""
    total = {name: a.linear_params() + a.other_params() for name, a in ARCHS.items()}
    assert total["SmolLM2-135M-Instruct"] == 134_515_008
    assert ARCHS["SmolLM2-135M-Instruct"].lora_params(16) == 4_884_480
    assert total["Qwen2.5-1.5B-Instruct"] == 1_543_714_304
    assert total["Qwen2.5-7B-Instruct"] == 7_615_616_512


def test_unit_costs_and_the_peak_follow_the_docstring():
    row = {"quantized_mib": 2.0, "quantized_params": 4 * MIB, "step_peak_mib": 900.0, "baseline_mib": 300.0,
           "weights_mib": 50.0, "optimizer_state_mib": 10.0, "trainable_params": MIB, "sequence_width": 100}
    m = Measured.from_row(row, TINY, micro_batch=2)
    assert m.bytes_per_quantized_weight == 0.5
    logits = 3 * 200 * 256 * 4
    assert m.activation_bytes == pytest.approx(((900 - 360) * MIB - 4 * MIB - logits) / (200 * 64 * 3))
    full = estimate_mib(TINY, m, r=4, micro_batch=2, width=100, rows=8, checkpointing=False)
    held = full["quantized_linears"] + full["other_weights"] + full["adapters"]
    assert full["quantized_linears"] == TINY.linear_params() * 0.5 / MIB
    assert full["update_peak"] == pytest.approx(held + full["logits"] + full["activations"])
    assert full["peak"] == max(full["update_peak"], full["sampling_peak"]) + CUDA_CONTEXT_MIB
    ckpt = estimate_mib(TINY, m, r=4, micro_batch=2, width=100, rows=8, checkpointing=True)
    assert ckpt["activations"] == pytest.approx(full["activations"] / 3 + 4 * 200 * 64 * 3 / MIB)
    wider = estimate_mib(TINY, m, r=4, micro_batch=4, width=100, rows=8, checkpointing=False)
    assert wider["activations"] == pytest.approx(2 * full["activations"])
