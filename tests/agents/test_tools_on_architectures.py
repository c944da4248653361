"""Multi-turn tool runs on architectures outside the lean decoder: a MoE (Qwen3-MoE), Gemma 3 (sliding
windows, soft-capping) and GPT-OSS, each a tiny family model that memorized the multiply traces, trained
with grpokit's decode loop (its cached engine) feeding the tool results."""

from __future__ import annotations

import json

import pytest
import torch
from agent_models import PROMPTS as CALLS
from agent_models import plain_trace, product

from grpokit.config.schema import build_config
from grpokit.model.loading import build_char_tokenizer
from grpokit.model.testing import family_model
from grpokit.tasks.base import Example
from grpokit.train.loop import train_grpo
from grpokit.train.sft import encode_pairs, sft_loss


def _tool_caller(model_type: str, tok):
    """A family model that memorized the plain-format multiply traces (agent_models.plain_trace)."""
    model = family_model(model_type, len(tok), tok.eos_token_id, tok.pad_token_id).train()
    ids, att, mask = encode_pairs(tok, CALLS, [plain_trace(p) for p in CALLS])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(150):
            sft_loss(model, ids, att, mask).backward()
            opt.step()
            opt.zero_grad()
    return model, CALLS


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gemma3_text", "gpt_oss"])
def test_a_multi_turn_tool_run_trains_on_moe_gemma_and_gpt_oss(model_type, tmp_path):
    tok = build_char_tokenizer()
    model, calls = _tool_caller(model_type, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = build_config({"rollout.tools": ["grpokit.agents.builtin:multiply"], "model.device": "cpu",
                        "rollout.max_completion_length": 120, "reward.funcs": {"accuracy": 1.0},
                        "rollout.num_generations": 2, "rollout.prompts_per_step": 2, "run.max_steps": 2,
                        "run.output_dir": str(tmp_path), "run.progress": False, "run.eval_limit": 0,
                        "optim.learning_rate": 1e-3})
    examples = [Example(p, str(product(p)[2]), {"answer": str(product(p)[2])}) for p in calls]
    train_grpo(cfg, model, tok, train_examples=examples)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and max(r["tools/call_frequency"] for r in rows) > 0    # the tool ran
    assert max(r["tokens/env_mean"] for r in rows) > 0                              # its results were fed
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
