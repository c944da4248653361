"""TRL's GRPOTrainer cases that cannot run here, each skipped with its reason (conformance_helpers.SKIP):
vLLM and the slow accelerator class need a GPU, the vision-language class (its 4-bit variant too) a VLM
processor, the Liger variants their package; a few cases only exercise TRL internals (a mocked training_step,
private forward helpers). The agent cases that cannot run (rollout_func's vLLM weight sync, a tool that
returns an image) are skipped in test_agents.py."""

from __future__ import annotations

import pytest
from conformance_helpers import SKIP


@pytest.mark.skip(reason=SKIP["gpu"])
@pytest.mark.parametrize(
    "case",
    [
        "vllm_and_peft",
        "vllm_structured_outputs",
        "vllm_importance_sampling_correction",
        "vllm_additional_generation_kwargs",
        "vllm_colocate",
        "transformers_paged",
        "continuous_batching",
        "slow_liger_grpo_kernel",
    ],
)
def test_needs_gpu(case):
    """vLLM generation and TRL's slow accelerator-only class."""


@pytest.mark.skip(reason=SKIP["vlm"])
@pytest.mark.parametrize(
    "case",
    [
        "train_vlm",
        "vlm_pad_to_multiple_of",
        "vlm_beta_non_zero",
        "vlm_peft",
        "vlm_importance_sampling",
        "vlm_multi_image",
        "vlm_log_multimodal_false",
        "vlm_and_liger",
        "vlm_and_vllm",
    ],
)
def test_needs_vlm_processor(case):
    """TRL's vision-language class (grpokit refuses an image dataset in one line: test_trl_inputs.py)."""


@pytest.mark.skip(reason=SKIP["vlm"])
def test_vlm_training_quantized():
    """4-bit QLoRA VLM training: bitsandbytes runs here (QLoRA text models: tests/trl/test_trl_qlora.py);
    the VLM is what is missing."""


@pytest.mark.skip(reason=SKIP["private"])
@pytest.mark.parametrize(
    "case",
    [
        "prepare_input_called_with_correct_data",
        "entropy_bonus_flows_gradients",
        "continuous_batching_contract",
        "moe_peft_ref_adapter",
    ],
)
def test_private_helper(case):
    """A mocked training_step's call list, _get_per_token_logps_and_entropies' requires_grad (the bonus'
    gradient is checked against TRL in tests/trl/test_trl_objectives.py), transformers' generation
    API contract, and the PEFT<0.20 reference-adapter workaround."""
