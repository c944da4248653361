"""CUDA checks (marker `cuda`, run by scripts/gpu_check.sh), and that script on a machine without CUDA.

The CUDA tests skip without a device. On CUDA: a bf16 GRPO step of the tiny model moves every weight and
its sampler agrees with the loss's log-probs; fp32 log-probs on the GPU equal the CPU's; with vLLM built
for CUDA, a colocated engine (sleep mode where the platform has it) follows every weight sync.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.model.logprobs import per_token_logprobs
from grpokit.tasks import Example
from grpokit.train.loop import build_state
from grpokit.train.step import train_step

ROOT = Path(__file__).resolve().parents[2]
EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"
PROMPTS = [Example(p, "") for p in ("Say a:", "Go:", "Letters:", "Write:")]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cfg(tmp_path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "model.device": "cuda",
              "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
              "rollout.max_completion_length": 8, "optim.learning_rate": 1e-2, "loss.beta": 0.04,
              "run.output_dir": str(tmp_path), "run.progress": False}
    values.update(over)
    return build_config(values)


@pytest.mark.cuda
@needs_cuda
def test_bf16_step_on_cuda_moves_every_weight(tmp_path):
    tok = build_char_tokenizer()
    state = build_state(_cfg(tmp_path, **{"model.precision": "bf16"}), tiny_random_model(tok), tok,
                        train_examples=PROMPTS)
    assert next(state.model.parameters()).is_cuda
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    for _ in range(2):
        m = train_step(state)
        assert torch.isfinite(torch.tensor(m["loss"]))
    assert [n for n, p in state.model.named_parameters() if torch.equal(p, before[n])] == []


@pytest.mark.cuda
@needs_cuda
def test_fp32_logprobs_on_cuda_equal_the_cpu():
    tok = build_char_tokenizer()
    model = tiny_random_model(tok)
    ids = torch.tensor([tok("Say a: aaab", add_special_tokens=False)["input_ids"]])
    cpu = per_token_logprobs(model, ids, torch.ones_like(ids), 4)
    gpu = per_token_logprobs(model.cuda(), ids.cuda(), torch.ones_like(ids).cuda(), 4).cpu()
    torch.testing.assert_close(gpu, cpu, atol=1e-4, rtol=0)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_colocated_on_cuda_follows_every_sync(tmp_path):
    from grpokit.rollout.vllm_backend import VLLMRollouts, save_plain_folder
    from grpokit.rollout.vllm_engine import SamplingSpec, VLLMEngine

    tok = build_char_tokenizer()
    model = tiny_random_model(tok, hidden=128, heads=2, kv_heads=1)
    save_plain_folder(model, tok, tmp_path / "start")
    engine = VLLMEngine(str(tmp_path / "start"), dtype="float32", max_model_len=64,
                        gpu_memory_utilization=0.2)
    state = build_state(_cfg(tmp_path / "run", **{"rollout.backend": "vllm", "loss.beta": 0.0}), model, tok,
                        train_examples=PROMPTS)
    state.rollout_engine = VLLMRollouts(engine, colocate=True)
    prompt = tok("Go:", add_special_tokens=False)["input_ids"]
    for _ in range(3):
        m = train_step(state)
        engine.wake_up()
        state.rollout_engine.sample(state, ["Go:"])           # syncs this step's weights
        s = engine.generate([prompt], SamplingSpec(n=2, max_tokens=4, seed=0))[0][0]
        full = torch.tensor([prompt + s.token_ids], device="cuda")
        with torch.no_grad():
            lp = per_token_logprobs(state.model, full, torch.ones_like(full), len(s.token_ids))[0].cpu()
        assert float((lp - torch.tensor(s.logprobs)).abs().max()) < 1e-3
        assert m["mismatch/abs_logprob_diff_max"] < 1e-2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_check_without_cuda_says_so_and_fails():
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], check=False, capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("gpu_check: no CUDA device"), out.stdout
