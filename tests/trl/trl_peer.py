"""Run TRL 1.16's `GRPOTrainer._compute_loss` on a batch of log-probs we choose, without a model.

The trainer object is made without __init__ and given only what `_compute_loss` reads; its forward
(`_get_per_token_logps_and_entropies`) returns our leaf tensors, so the loss' gradient with respect to
the per-token log-probs and entropies can be compared with grpokit's pure objective on the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch


def one_process() -> SimpleNamespace:
    """An accelerate Accelerator of one process: every collective is the identity."""
    return SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        pad_across_processes=lambda x, dim=0, pad_index=0: x,
    )


def trl_trainer(trl, settings: dict) -> object:
    """A `trl.GRPOTrainer` with the attributes `_compute_loss` reads, from a dict of TRL config values."""
    s = {
        "loss_type": "dapo",
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": None,
        "delta": None,
        "importance_sampling_level": "token",
        "use_bias_correction_kl": False,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "entropy_target": 0.2,
        "entropy_coef_delta": 0.005,
        "entropy_coef_min": 0.0,
        "entropy_coef_max": 1.0,
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 1.05,
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
        "use_vllm": False,
        "max_completion_length": 8,
        "last_world_entropy": float("inf"),
        **settings,
    }
    t = object.__new__(trl.GRPOTrainer)
    t.args = SimpleNamespace(
        steps_per_generation=1,
        **{
            k: s[k]
            for k in (
                "delta",
                "use_bias_correction_kl",
                "sapo_temperature_pos",
                "sapo_temperature_neg",
                "vespo_k_pos",
                "vespo_lambda_pos",
                "vespo_k_neg",
                "vespo_lambda_neg",
                "entropy_target",
                "entropy_coef_delta",
                "entropy_coef_min",
                "entropy_coef_max",
            )
        },
    )
    for name in (
        "loss_type",
        "beta",
        "importance_sampling_level",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
        "entropy_coef",
        "use_adaptive_entropy",
        "use_vllm",
        "max_completion_length",
    ):
        setattr(t, name, s[name])
    t.epsilon_low = s["epsilon"]
    t.epsilon_high = s["epsilon_high"] if s["epsilon_high"] is not None else s["epsilon"]
    t.vllm_importance_sampling_correction = s["use_vllm"]
    t.accelerator = one_process()
    t.model = SimpleNamespace(training=True)
    t.current_gradient_accumulation_steps = 1
    t._entropy_bonus_enabled = s["entropy_coef"] != 0.0 or s["use_adaptive_entropy"]
    t._last_world_entropy = s["last_world_entropy"]
    t._entropy_window_stats = None
    t.aux_loss_enabled = False
    t.router_aux_loss_coef = 0.0
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return t


def trl_loss(trl, batch: dict, settings: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """(loss, d loss / d logprobs, d loss / d entropy, the trainer) of TRL's `_compute_loss` on `batch`.

    batch: logprobs, entropy, mask [N, T], advantages [N]; optional old, ref, sampler [N, T] log-probs and
    is_ratio ([N, T] or [N, 1] vLLM importance weights).
    """
    t = trl_trainer(trl, settings)
    logprobs = batch["logprobs"].clone().requires_grad_(True)
    entropy = batch["entropy"].clone().requires_grad_(True)
    t._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logprobs, entropy, None)
    N, T = batch["mask"].shape
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": batch["mask"],
        "advantages": batch["advantages"],
        "num_items_in_batch": batch["mask"].sum(),
    }
    for ours, theirs in (
        ("old", "old_per_token_logps"),
        ("ref", "ref_per_token_logps"),
        ("sampler", "sampling_per_token_logps"),
        ("is_ratio", "importance_sampling_ratio"),
    ):
        if batch.get(ours) is not None:
            inputs[theirs] = batch[ours]
    loss = trl.GRPOTrainer._compute_loss(t, None, inputs)
    d_logprobs, d_entropy = torch.autograd.grad(loss, (logprobs, entropy), allow_unused=True)
    return loss.detach(), d_logprobs, torch.zeros_like(entropy) if d_entropy is None else d_entropy, t
