"""The TRL conformance suite's fixtures: the implementation under test, tiny offline models, datasets.

Every case takes `impl`: grpokit.trl always, and TRL 1.16 itself when GRPOKIT_CONFORMANCE_TRL=1 (the
optional job that keeps the cases honest: a case is fair when TRL passes it). The models are tiny
random-init transformers models saved once per session with grpokit's offline character tokenizer; the
datasets are `datasets.Dataset`s of the columns TRL's tests use, built here (no hub id anywhere).

Skips use one reason from `SKIP` only.
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

datasets = pytest.importorskip("datasets")

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and not enable_thinking "
    "%}(no thinking) {% endif %}{% endif %}"
)
PROMPTS = [
    "Good code is",
    "A test should",
    "Small steps are",
    "Read the error",
    "Names matter because",
    "Simple beats",
    "Measure before",
    "One change at",
    "Write it down",
    "Logs tell",
    "Keep it",
    "Ship",
]
TEST_PROMPTS = ["Errors are", "Tools help", "Clear is", "Think then"]
IMPLS = ["grpokit"] + (["trl"] if os.environ.get("GRPOKIT_CONFORMANCE_TRL") == "1" else [])
ARGS = {
    "learning_rate": 0.1,
    "per_device_train_batch_size": 3,
    "num_generations": 3,
    "max_completion_length": 8,
    "max_steps": 2,
    "report_to": "none",
    "bf16": False,
    "save_strategy": "no",
}


@dataclass
class Impl:
    """One implementation of TRL's API: its module and what the cases need from it."""

    name: str
    module: Any
    tmp: Any

    @property
    def GRPOConfig(self):  # noqa: N802  (TRL's class name)
        return self.module.GRPOConfig

    @property
    def GRPOTrainer(self):  # noqa: N802
        return self.module.GRPOTrainer

    def args(self, **overrides: Any):
        """A GRPOConfig of TRL's test sizes (3 completions per step, 8 tokens, lr 0.1), 2 steps, in tmp."""
        values = {"output_dir": str(self.tmp / "out"), **ARGS, **overrides}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' deprecation notes
            return self.GRPOConfig(**values)

    def high_entropy_mask(self, entropies, mask, threshold):
        """GRPOTrainer.get_high_entropy_mask on one process."""
        owner = SimpleNamespace(
            accelerator=SimpleNamespace(
                num_processes=1, gather=lambda x: x, pad_across_processes=lambda x, dim, pad_index: x
            )
        )
        return self.GRPOTrainer.get_high_entropy_mask(owner, entropies, mask, threshold)

    def off_policy_mask(self, advantages, logps, sampling_logps, mask, threshold):
        return self.GRPOTrainer.get_off_policy_mask(advantages, logps, sampling_logps, mask, threshold)


@pytest.fixture(params=IMPLS)
def impl(request, tmp_path) -> Impl:
    module = importlib.import_module("grpokit.trl" if request.param == "grpokit" else "trl")
    return Impl(request.param, module, tmp_path)


def _tokenizer():
    from grpokit.model.loading import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _save(model, tok, folder):
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _tiny_shape(tok) -> dict:   # the shape every tiny fixture model shares
    return dict(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, pad_token_id=tok.pad_token_id)


def _causal(kind: str, tok, **extra):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

    common = dict(_tiny_shape(tok), max_position_embeddings=128, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id)
    config = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}[kind](
        **common, **extra
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _eos_logit(tok, weight: float):
    """A Llama whose EOS logit is about `weight` x 4 at every position, the others near 0: the last attention
    output adds a constant 100 on hidden unit 0, which dominates the final RMSNorm (h_0 ~ 4), and only
    EOS reads unit 0. weight 0.9 ends about one token in four; -10 never ends."""
    model = _causal("llama", tok, attention_bias=True)
    with torch.no_grad():
        model.model.layers[-1].self_attn.o_proj.bias[0] = 100.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tok.eos_token_id, 0] = weight
    return model


def _reward_model(tok, kind: str = "qwen2"):
    from transformers import AutoModelForSequenceClassification, LlamaConfig, Qwen2Config

    config = (Qwen2Config if kind == "qwen2" else LlamaConfig)(**_tiny_shape(tok), num_labels=1)
    torch.manual_seed(1)
    return AutoModelForSequenceClassification.from_config(config)


REMOTE_CODE = """
from transformers import Qwen2Config, Qwen2ForCausalLM


class RemoteConfig(Qwen2Config):
    model_type = "remote_qwen2"


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig
"""


def _remote(tok, folder):
    """A model folder whose architecture lives in its own modeling file (needs trust_remote_code)."""
    import json

    _save(_causal("qwen2", tok), tok, folder)
    (folder / "modeling_remote.py").write_text(REMOTE_CODE)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="remote_qwen2",
        architectures=["RemoteForCausalLM"],
        auto_map={
            "AutoConfig": "modeling_remote.RemoteConfig",
            "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Folders of tiny models (every one with the character tokenizer and its chat template)."""
    tok = _tokenizer()
    root = tmp_path_factory.mktemp("conformance-models")
    out = {
        name: _save(_causal(kind, tok, **extra), tok, root / name)
        for name, kind, extra in (
            ("qwen2", "qwen2", {}),
            ("llama", "llama", {}),
            ("qwen2_tied", "qwen2", {"tie_word_embeddings": True}),
            (
                "qwen3_moe",
                "qwen3_moe",
                {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
            ),
        )
    }
    out["ends_early"] = _save(_eos_logit(tok, 0.9), tok, root / "ends_early")
    out["never_ends"] = _save(_eos_logit(tok, -10.0), tok, root / "never_ends")
    out["reward"] = _save(_reward_model(tok), tok, root / "reward")
    out["reward_llama"] = _save(_reward_model(tok, "llama"), tok, root / "reward_llama")
    out["remote"] = _remote(tok, root / "remote")
    return SimpleNamespace(**out)


def _rows(prompts: list[str], conversational: bool) -> list[dict]:
    if conversational:
        return [{"prompt": [{"role": "user", "content": p}]} for p in prompts]
    return [{"prompt": p} for p in prompts]


@pytest.fixture(scope="session")
def data():
    """TRL's prompt-only dataset formats: standard and conversational, train and test splits."""

    def build(prompts, conversational=False):
        return datasets.Dataset.from_list(_rows(prompts, conversational))

    return SimpleNamespace(
        train=build(PROMPTS),
        test=build(TEST_PROMPTS),
        conversational=build(PROMPTS, True),
        conversational_test=build(TEST_PROMPTS, True),
        both=datasets.DatasetDict(train=build(PROMPTS), test=build(TEST_PROMPTS)),
    )
