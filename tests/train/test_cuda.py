"""CUDA paths (marker `cuda`, run by scripts/gpu_check.sh; skipped without a device).

What each shows on a GPU: a model given on the CPU ends on the GPU (train_grpo), and so does a reward model
with rm.device=auto; model.device=cpu on a GPU host leaves the GPU untouched; a run repeats bit for bit and
resumes bit for bit (the checkpoint's CUDA RNG state, the deterministic prompt-cache gather); the gather's
backward is deterministic; bf16 sampling (bf16 KV cache) agrees with the update's log-probs.
The device rules that need no GPU are tested in tests/model/test_devices.py.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit.config.schema import build_config
from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.precision import autocast_for
from grpokit.model.shared_prompts import GatherRows
from grpokit.rewards.outcome_rm import RewardModel
from grpokit.rollout.groups import sample_groups
from grpokit.tasks import Example
from grpokit.train.loop import build_state, train_grpo
from grpokit.train.step import train_step

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"
PROMPTS = [Example(p, "") for p in ("Say a:", "Go:", "Letters:", "Write:")]
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def _cfg(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "model.device": "cuda", "task.name": "arithmetic",
              "task.num_train": 64, "task.num_eval": 8, "reward.funcs": {EASY: 1.0},
              "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "rollout.max_completion_length": 8,
              "optim.learning_rate": 3e-3, "loss.beta": 0.04, "run.eval_limit": 8, "run.progress": False,
              "run.output_dir": str(out), "run.max_steps": 4, "run.save_steps": 2}
    values.update(over)
    return build_config(values)


def test_a_cpu_model_given_to_train_grpo_trains_on_the_gpu(tmp_path):
    tok = build_char_tokenizer()
    model = tiny_random_model(tok)                                        # built on the CPU
    state = train_grpo(_cfg(tmp_path / "run", **{"run.max_steps": 1}), model, tok)
    assert next(state.model.parameters()).is_cuda
    assert state.ref_model is not None and next(state.ref_model.parameters()).is_cuda


def test_reward_model_auto_follows_the_policy_to_the_gpu():
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    tok = build_char_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1,
                      pad_token_id=tok.pad_token_id)
    rm = RewardModel(AutoModelForSequenceClassification.from_config(cfg), tok, device="auto")
    assert next(rm.model.parameters()).is_cuda
    assert len(rm(prompts=["Go:"], completions=["aa"])) == 1


def test_cpu_device_on_a_gpu_host_leaves_the_gpu_alone(tmp_path):
    tok = build_char_tokenizer()
    before = torch.cuda.memory_allocated()
    state = build_state(_cfg(tmp_path, **{"model.device": "cpu"}), tiny_random_model(tok), tok,
                        train_examples=PROMPTS)
    train_step(state)
    assert not next(state.model.parameters()).is_cuda
    assert torch.cuda.memory_allocated() == before


def _weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def test_a_run_repeats_and_resumes_bit_for_bit_on_the_gpu(tmp_path):
    """Two runs of 4 steps with one seed, and a run stopped at step 2 then resumed: equal weights."""
    a, b = tmp_path / "a", tmp_path / "b"
    train_grpo(_cfg(a))
    train_grpo(_cfg(b, **{"run.max_steps": 2}))
    train_grpo(_cfg(b, **{"run.resume": True}))
    wa, wb = _weights(a / "final"), _weights(b / "final")
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []


def test_gather_rows_backward_is_deterministic_and_equals_index_add():
    x = torch.randn(5, 3, 40, 16, device="cuda", requires_grad=True)
    rows = torch.tensor([4, 0, 0, 1, 4, 4, 2, 3] * 16, device="cuda")
    grad = torch.randn(rows.numel(), 3, 40, 16, device="cuda")
    first, = torch.autograd.grad(GatherRows.apply(x, 0, rows), x, grad)
    again, = torch.autograd.grad(GatherRows.apply(x, 0, rows), x, grad)
    plain, = torch.autograd.grad(x.cpu().index_select(0, rows.cpu()), x, grad.cpu())
    assert torch.equal(first, again)
    torch.testing.assert_close(first.cpu(), plain.cpu(), atol=1e-5, rtol=1e-5)


def test_bf16_sampling_agrees_with_the_update_logprobs(tmp_path):
    """The lean sampler on CUDA in bf16 (bf16 KV cache and SDPA) against the bf16 forward the update runs."""
    tok = build_char_tokenizer()
    state = build_state(_cfg(tmp_path, **{"model.precision": "bf16"}), tiny_random_model(tok), tok,
                        train_examples=PROMPTS)
    torch.manual_seed(0)
    r = sample_groups(state.model, tok, [e.prompt for e in PROMPTS], 4, 16, backend="fast")
    T = r.completion_ids.shape[1]
    with torch.no_grad(), autocast_for(state.model):
        lp = per_token_logprobs(state.model, r.input_ids, r.attention_mask, T)
    m = r.completion_mask.bool()
    diff = (lp - r.sampling_logprobs[:, :T].to(lp.device)).abs()[m]
    assert float(diff.max()) < 0.1, float(diff.max())
