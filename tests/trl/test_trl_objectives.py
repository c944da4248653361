"""Peer tests: grpokit's pure objective against TRL 1.16's `GRPOTrainer._compute_loss` on the same batch.

Both get the same per-token log-probs and entropies as leaf tensors; the loss and its gradient with
respect to each must agree. One case per objective variant TRL ships (loss types, KL forms, the entropy
bonus and its adaptive gate, the high-entropy and off-policy masks, vLLM's importance-sampling modes).
The largest difference seen is asserted below its bound (MAX_ABS_DIFF) and printed with -s.
"""

from __future__ import annotations

import math

import pytest
import torch
from trl_peer import trl_loss

from grpokit.core.loss import Filters, Variants, grpo_objective_from_logprobs, truncated_is_weights

trl = pytest.importorskip("trl")

MAX_ABS_DIFF = 1e-6  # float32 arithmetic in a different order; observed differences are printed per case
N, T = 6, 8


def batch(seed: int = 0) -> dict:
    """Six completions of 3..8 tokens, ratios around 1 (some beyond the clip), advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 5, 3, 8, 6, 4])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    logprobs = -torch.rand(N, T, generator=g) * 3 - 0.05
    return {
        "logprobs": logprobs,
        "mask": mask,
        "entropy": torch.rand(N, T, generator=g) * 2,
        "advantages": torch.tensor([1.2, -0.7, 0.4, -1.5, 0.0, 0.9]),
        "old": logprobs + 0.3 * torch.randn(N, T, generator=g),
        "ref": logprobs + 0.2 * torch.randn(N, T, generator=g),
        "sampler": logprobs + 0.4 * torch.randn(N, T, generator=g),
    }


def ours(b: dict, s: dict):
    """grpokit's objective on the batch, with the TRL settings `s` spelled as its arguments."""
    logprobs = b["logprobs"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    bonus = s.get("entropy_coef", 0.0) != 0.0 or s.get("use_adaptive_entropy", False)
    coef = s.get("entropy_coef", 0.0)
    if s.get("use_adaptive_entropy") and s.get("last_world_entropy", math.inf) > s.get("entropy_target", 0.2):
        coef = 0.0  # the gate: no bonus above the target
    variants = Variants(**{k: s[k] for k in Variants._fields if k in s})
    filters = Filters(
        s.get("top_entropy_quantile", 1.0), s.get("off_policy_mask_threshold"), coef if bonus else None
    )
    loss, _ = grpo_objective_from_logprobs(
        logprobs,
        b.get("old"),
        b.get("ref"),
        b["mask"],
        b["advantages"],
        s.get("epsilon", 0.2),
        s.get("beta", 0.0),
        clip_eps_high=s.get("epsilon_high"),
        delta=s.get("delta"),
        loss_type=s.get("loss_type", "dapo"),
        importance_sampling_level=s.get("importance_sampling_level", "token"),
        max_completion_length=s.get("max_completion_length", T),
        tis_weights=b.get("is_ratio"),
        kl_bias_correction=s.get("use_bias_correction_kl", False),
        variants=variants,
        filters=filters,
        entropy=entropy,
        sampler_logprobs=b.get("sampler"),
    )
    d_logprobs, d_entropy = torch.autograd.grad(loss, (logprobs, entropy), allow_unused=True)
    return loss.detach(), d_logprobs, torch.zeros_like(entropy) if d_entropy is None else d_entropy


CASES = {
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo", "max_completion_length": 10},
    "dapo": {"loss_type": "dapo"},
    "dapo_clip_higher_delta": {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 1.3},
    "cispo": {"loss_type": "cispo", "epsilon_high": 1.2},
    "sapo": {"loss_type": "sapo"},
    "sapo_temperatures": {"loss_type": "sapo", "sapo_temperature_pos": 0.8, "sapo_temperature_neg": 1.6},
    "luspo_sequence": {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    "vespo": {"loss_type": "vespo"},
    "vespo_params": {
        "loss_type": "vespo",
        "vespo_k_pos": 1.5,
        "vespo_lambda_pos": 2.0,
        "vespo_k_neg": 2.5,
        "vespo_lambda_neg": 1.0,
    },
    "gspo_sequence_grpo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    "kl_k3": {"loss_type": "grpo", "beta": 0.04},
    "kl_bias_corrected": {"loss_type": "dapo", "beta": 0.04, "use_bias_correction_kl": True},
    "kl_bias_corrected_sequence": {
        "loss_type": "grpo",
        "beta": 0.1,
        "use_bias_correction_kl": True,
        "importance_sampling_level": "sequence",
    },
    "entropy_bonus_dapo": {"loss_type": "dapo", "entropy_coef": 0.1},
    "entropy_bonus_luspo": {
        "loss_type": "luspo",
        "importance_sampling_level": "sequence",
        "entropy_coef": 0.3,
    },
    "entropy_adaptive_gate_open": {
        "loss_type": "grpo",
        "entropy_coef": 0.05,
        "use_adaptive_entropy": True,
        "entropy_target": 0.5,
        "last_world_entropy": 0.3,
    },
    "entropy_adaptive_gate_closed": {
        "loss_type": "grpo",
        "entropy_coef": 0.05,
        "use_adaptive_entropy": True,
        "entropy_target": 0.5,
        "last_world_entropy": 0.9,
    },
    "top_entropy_quantile": {"loss_type": "dapo", "top_entropy_quantile": 0.3},
    "top_entropy_quantile_with_bonus": {
        "loss_type": "grpo",
        "top_entropy_quantile": 0.5,
        "entropy_coef": 0.2,
    },
    "off_policy_mask": {"loss_type": "dapo", "off_policy_mask_threshold": 0.05},
    "off_policy_mask_no_sampler": {
        "loss_type": "grpo",
        "off_policy_mask_threshold": 0.02,
        "_no_sampler": True,
    },
}
BASE_KEYS = ("loss_type", "importance_sampling_level", "max_completion_length")


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradient_match_trl(name):
    s = dict(CASES[name])
    b = batch()
    if s.pop("_no_sampler", False):
        b["sampler"] = None
    theirs = trl_loss(trl, b, s)
    mine = ours(b, s)
    diffs = [float((x - y).abs().max()) for x, y in zip(mine, theirs[:3])]
    print(f"{name}: max |diff| loss {diffs[0]:.2e}, d/dlogp {diffs[1]:.2e}, d/dH {diffs[2]:.2e}")
    assert float(theirs[1].abs().max()) > 0  # the batch exercises the gradient
    assert max(diffs) <= MAX_ABS_DIFF, diffs
    extra = set(s) - set(BASE_KEYS)
    if extra and name != "entropy_adaptive_gate_closed":  # the option changes the loss on this batch
        plain = trl_loss(trl, b, {k: v for k, v in s.items() if k in BASE_KEYS})
        assert not all(torch.equal(x, y) for x, y in zip(plain[:3], theirs[:3])), f"{name}: a no-op here"
    bonus = s.get("entropy_coef", 0) and name != "entropy_adaptive_gate_closed"
    assert bool(theirs[2].abs().max() > 0) == bool(bonus)  # only a bonus puts a gradient on H


def trl_is_ratio(old, sampler, mask, mode: str, lo: float | None, hi: float | None) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio, re-derived from its documented modes."""
    diff = torch.nan_to_num((old - sampler) * mask, nan=0.0)
    level, kind = mode.split("_")
    w = torch.exp(diff.sum(-1, keepdim=True) if level == "sequence" else diff)
    if kind == "truncate":
        return torch.clamp(w, min=lo, max=hi)
    low, high = -math.inf if lo is None else lo, math.inf if hi is None else hi
    return w.masked_fill((w < low) | (w > high), 0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "vespo"])
def test_vllm_importance_sampling_modes_match_trl(mode, loss_type):
    if loss_type == "vespo" and mode.startswith("sequence"):
        pytest.skip("TRL refuses vespo with a sequence-level vLLM correction (grpokit's config too)")
    b = batch(1)
    lo, hi = (0.5, 2.0) if mode.endswith("mask") else (None, 1.5)
    level, kind = mode.split("_")
    weights, _ = truncated_is_weights(b["old"], b["sampler"], b["mask"], level, hi, mode=kind, floor=lo)
    expected = trl_is_ratio(b["old"], b["sampler"], b["mask"], mode, lo, hi)
    assert torch.equal(weights, expected)
    assert 0 < float((weights == 0).float().mean() if kind == "mask" else (weights == hi).float().mean()) < 1
    b["is_ratio"] = weights
    s = {"loss_type": loss_type, "use_vllm": True}
    theirs, mine = trl_loss(trl, b, s), ours(b, s)
    diffs = [float((x - y).abs().max()) for x, y in zip(mine, theirs[:3])]
    print(f"vllm {mode} {loss_type}: max |diff| loss {diffs[0]:.2e}, d/dlogp {diffs[1]:.2e}")
    assert max(diffs) <= MAX_ABS_DIFF, diffs


def test_adaptive_entropy_coefficient_moves_as_trls():
    """TRL's controller after one optimizer step equals grpokit's `next_entropy_coef` on the same entropy."""
    from grpokit.core.entropy import next_entropy_coef

    b = batch(2)
    for target in (0.5, 5.0):
        s = {
            "loss_type": "dapo",
            "entropy_coef": 0.05,
            "use_adaptive_entropy": True,
            "entropy_target": target,
            "entropy_coef_delta": 0.01,
            "last_world_entropy": 0.0,
        }
        trainer = trl_loss(trl, b, s)[3]
        step_entropy = float((b["entropy"] * b["mask"]).sum() / b["mask"].sum())
        assert trainer.entropy_coef == pytest.approx(
            next_entropy_coef(0.05, step_entropy, target=target, delta=0.01, coef_min=0.0, coef_max=1.0),
            abs=1e-9,
        )
        assert trainer._last_world_entropy == pytest.approx(step_entropy, rel=1e-6)


def tiny_trl_run(tmp_path, aggregation: str):
    """One real TRL 1.16 step with two reward functions: its logged rewards and advantages."""
    import datasets
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpokit.model.loading import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")

    def letters(completions, **kwargs):
        return [float(len(set(c))) for c in completions]

    def vowels(completions, **kwargs):
        return [float(sum(ch in "aeiou" for ch in c)) for c in completions]

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=8, max_steps=1, report_to="none", bf16=False,
                          save_strategy="no", reward_weights=[0.5, 2.0],
                          multi_objective_aggregation=aggregation)
    data = datasets.Dataset.from_list([{"prompt": p} for p in ("ab", "cd", "ef", "gh")])
    trainer = trl.GRPOTrainer(model=str(tmp_path / "m"), reward_funcs=[letters, vowels], args=args,
                              train_dataset=data)
    trainer.train()
    logs = trainer._logs
    rewards = torch.tensor([list(logs["rewards"]["letters"]), list(logs["rewards"]["vowels"])]).T   # [N, 2]
    return rewards, torch.tensor(list(logs["advantages"]))


def test_normalize_then_sum_advantages_match_trl(tmp_path):
    """GDPO's advantages from TRL 1.16's own run: its logged rewards through `decoupled_advantages` give its
    logged advantages."""
    from grpokit.core.advantages import decoupled_advantages

    rewards, theirs = tiny_trl_run(tmp_path, "normalize_then_sum")
    ours = decoupled_advantages(rewards, torch.tensor([0.5, 2.0]), group_size=4)
    print(f"normalize_then_sum: max |diff| {float((ours - theirs).abs().max()):.2e}")
    assert float(theirs.abs().max()) > 0
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
