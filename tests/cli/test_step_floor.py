"""benchmarks/step_floor.py: the bench step's matmuls, counted from the model, and the bench file it reads."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("step_floor", ROOT / "benchmarks" / "step_floor.py")
floor = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(floor)

B, G, T, P = 2, 4, 8, 5


def test_the_step_runs_every_linear_weight_of_the_model_on_each_token():
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    per_layer = sum(m.weight.numel() for m in model.model.layers[0].modules()
                    if isinstance(m, torch.nn.Linear))               # q, k, v, o, gate, up, down: GQA's k, v
    L, head = cfg.num_hidden_layers, model.lm_head.weight.numel()
    phases = floor.step_matmuls(cfg, prompts=B, generations=G, tokens=T, prompt_len=P, micro_batch=G)

    def flops(rows):
        return sum(2 * r * i * o * n for _, r, i, o, n in rows)

    # sampler: each prompt prefilled once (last position through the head), then T steps of B*G rows
    assert flops(phases["generate"]) == 2 * L * per_layer * (B * P + B * G * T) + 2 * head * (B + B * G * T)
    # reference: one pass a group, its prompt once; the head on the completion tokens only
    ref = 2 * L * per_layer * B * (P + G * T) + 2 * head * B * G * T
    assert flops(phases["ref_forward"]) == ref
    assert flops(phases["policy_fwd_bwd"]) == 3 * ref                  # forward, dx, dW
    kinds = {k for k, *_ in phases["policy_fwd_bwd"]}
    assert kinds == {"fwd", "dx", "dw"} and {k for k, *_ in phases["ref_forward"]} == {"fwd"}


def _side(side, s, peak):
    return {"side": side, "s_per_step": s, "matmul_peak_gflops": peak / 2, "matmul_peak_gflops_bf16": peak}


def test_bench_file_gives_the_highest_peak_and_median_steps(tmp_path):
    f = tmp_path / "bench.jsonl"
    rows = [_side("grpokit", 10.0, 400.0), _side("trl", 30.0, 380.0), _side("trl", 34.0, 390.0),
            _side("grpokit", 12.0, 420.0), {"ratio_trl_over_grpokit_s_per_step": 2.9}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert floor.bench_figures(f) == {"peak_gflops": 420.0, "grpokit_s": 11.0, "trl_s": 32.0}
    assert floor.bench_figures(f, "fp32")["peak_gflops"] == 210.0


def test_a_file_without_both_sides_is_refused_with_what_to_give(tmp_path):
    f = tmp_path / "alone.jsonl"
    f.write_text(json.dumps(_side("grpokit", 10.0, 400.0)) + "\n")
    with pytest.raises(SystemExit, match="--compare-trl"):
        floor.bench_figures(f)


def test_a_shape_is_timed_in_positive_seconds():
    assert 0 < floor.linear_seconds(8, 16, 32, torch.float32, rounds=1) < 1
    assert 0 < floor.weight_grad_seconds(8, 16, 32, torch.float32, rounds=1) < 1
