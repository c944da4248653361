"""QLoRA (bitsandbytes on the CPU): a 4-bit / int8 frozen base, LoRA adapters train, the reference is the
quantized base with the adapter off, save + merge, bit-identical resume; and optim.optim=adamw_8bit."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from easy_task import PROMPTS, easy_config
from grpokit.config.schema import ConfigError, ModelConfig, build_config
from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.lora import DisabledAdapterReference, reference_for
from grpokit.model.quantized import (
    QuantizationError,
    bnb_config,
    is_quantized,
    prepare_quantized,
    quantize_in_memory,
)
from grpokit.train.loop import train_grpo
from grpokit.train.preflight import check_environment

pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")


# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny_folder(tmp_path: Path, char_tokenizer, family: str) -> Path:
    """A random-init tiny Llama or Qwen2 (hidden 64: one 4-bit block per row), saved with its tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config}[family]
    config = kind(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, eos_token_id=char_tokenizer.eos_token_id,
                  pad_token_id=char_tokenizer.pad_token_id, bos_token_id=char_tokenizer.bos_token_id)
    torch.manual_seed(0)
    folder = tmp_path / family
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    return folder


def _load(folder: Path, **over):
    from grpokit.model.loading import load_model_and_tokenizer

    values = {"load_in_4bit": True, "bnb_4bit_compute_dtype": "float32", **over}
    cfg = ModelConfig(name_or_path=str(folder), device="cpu", lora_r=4, lora_alpha=8, **values)
    torch.manual_seed(1)                                                  # the adapters' init
    return load_model_and_tokenizer(cfg)[0], cfg


def _randomize_b(policy) -> None:
    with torch.no_grad():   # B starts at 0 (the adapter is a no-op): non-zero so A gets a gradient too
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)


IDS = torch.tensor([[10, 11, 12, 13, 14, 15, 16], [0, 0, 20, 21, 22, 23, 24]])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_adapter_gets_a_gradient_and_the_quantized_base_stays_frozen(tmp_path, char_tokenizer,
                                                                            family, bits):
    over = {} if bits == 4 else {"load_in_4bit": False, "load_in_8bit": True}
    policy, _ = _load(_tiny_folder(tmp_path, char_tokenizer, family), **over)
    layer = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert is_quantized(policy)
    assert type(layer) is (bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt)
    assert layer.weight.dtype in (torch.uint8, torch.int8)                # stored packed / as int8
    packed = layer.weight.detach().clone()
    _randomize_b(policy)
    lp = per_token_logprobs(policy, IDS, (IDS != 0).long(), 4)           # [2, 4]
    lp.sum().backward()
    adapters = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)               # only the adapters train
    assert all(p.dtype == torch.float32 for p in adapters.values())       # fp32 master weights
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters.values())
    torch.optim.AdamW(adapters.values(), lr=1e-2).step()
    assert torch.equal(layer.weight, packed)                              # the base did not move


def test_reference_is_the_quantized_base_with_the_adapter_off(tmp_path, char_tokenizer):
    from transformers import AutoModelForCausalLM

    folder = _tiny_folder(tmp_path, char_tokenizer, "qwen2")
    policy, cfg = _load(folder)
    _randomize_b(policy)
    base = AutoModelForCausalLM.from_pretrained(folder, quantization_config=bnb_config(cfg),
                                                device_map={"": "cpu"})
    base = prepare_quantized(base, cfg).eval()
    ref = reference_for(policy)
    assert isinstance(ref, DisabledAdapterReference)
    assert list(ref.parameters()) == [] and ref.state_dict() == {}       # no second copy of the base
    att = (IDS != 0).long()
    with torch.no_grad():
        want = per_token_logprobs(base, IDS, att, 4)
        got = per_token_logprobs(ref, IDS, att, 4)
        on = per_token_logprobs(policy, IDS, att, 4)
    assert torch.allclose(got, want, atol=1e-6)
    assert (on - want).abs().max() > 1e-3                                 # adapter on: another model
    assert policy.training                                                # the policy's mode is restored


def _qlora_config(tmp_path, **over):
    return easy_config(tmp_path, **{"model.lora_r": 8, "model.lora_alpha": 16, "model.load_in_4bit": True,
                                    "model.bnb_4bit_compute_dtype": "float32", "optim.learning_rate": 2e-2,
                                    "loss.beta": 0.04, "run.max_steps": 2, **over})


def test_two_step_qlora_run_saves_the_adapter_and_a_dequantized_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = _qlora_config(tmp_path, **{"model.save_merged_quantized": True})
    state = train_grpo(cfg, train_examples=PROMPTS)
    assert isinstance(state.ref_model, DisabledAdapterReference) and is_quantized(state.model)
    rows = [json.loads(r) for r in (Path(cfg.run.output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["grad_norm"] > 0
    out = Path(cfg.run.output_dir) / "final"
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    merged_config = json.loads((out / "merged" / "config.json").read_text())
    assert "quantization_config" not in merged_config                    # a plain model
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    state.model.eval()
    with torch.no_grad():
        want = state.model(input_ids=ids).logits
        exported = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        assert all(p.dtype == torch.float32 for p in exported.parameters())
        # de-quantized W + delta (fp32) against the 4-bit layer's de-quantize-then-multiply: equal to rounding
        assert torch.allclose(exported(input_ids=ids).logits, want, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(out / "merged", quantization_config=bnb_config(cfg.model))
        assert not torch.equal(exported(input_ids=ids).logits, base(input_ids=ids).logits)
    # the adapter alone, on the same quantized base: what the run trained
    tok = build_char_tokenizer()
    base4 = prepare_quantized(quantize_in_memory(tiny_random_model(tok, seed=cfg.run.seed), cfg.model,
                                                 torch.device("cpu")), cfg.model)
    reloaded = PeftModel.from_pretrained(base4, out).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, want, atol=1e-6)


def test_without_the_flag_only_the_adapter_is_saved(tmp_path):
    state = train_grpo(_qlora_config(tmp_path, **{"run.max_steps": 1, "loss.beta": 0.0}),
                       train_examples=PROMPTS)
    out = Path(state.cfg.run.output_dir) / "final"
    assert (out / "adapter_model.safetensors").is_file() and not (out / "merged").exists()
    assert (out / "tokenizer.json").is_file()


def _weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _metric_rows(out: Path) -> list:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [(r["reward_mean"], r["loss"]) for r in rows]


@pytest.mark.parametrize("kind", ["qlora", "adamw_8bit"])
def test_resume_is_bit_identical(tmp_path, kind):
    """4 steps at once, and 2 steps then a resume to 4: the same adapter / weights, optimizer and rows."""
    over = {"run.save_steps": 2, "run.max_steps": 4}
    if kind == "adamw_8bit":   # full fine-tuning of the tiny model with the 8-bit optimizer
        def make(out, **more):
            return easy_config(out, **{"optim.optim": "adamw_8bit", "loss.beta": 0.04, **over, **more})
    else:
        def make(out, **more):
            return _qlora_config(out, **{**over, **more})
    whole = train_grpo(make(tmp_path / "a"), train_examples=PROMPTS)
    train_grpo(make(tmp_path / "b", **{"run.max_steps": 2}), train_examples=PROMPTS)
    resumed = train_grpo(make(tmp_path / "b", **{"run.resume": True}), train_examples=PROMPTS)
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    _assert_same(_weights(b / "checkpoint-4"), _weights(a / "checkpoint-4"))
    # every moment (8-bit: the codes, their block scales and quantization maps) exactly equal
    torch.testing.assert_close(resumed.optimizer.state_dict()["state"], whole.optimizer.state_dict()["state"],
                               rtol=0, atol=0)
    assert _metric_rows(b) == _metric_rows(a)
    assert any(json.loads(r)["grad_norm"] > 0 for r in (a / "metrics.jsonl").read_text().splitlines())


def test_adamw_8bit_steps_with_8bit_state(tmp_path):
    from grpokit.model.loading import load_model_and_tokenizer

    cfg = easy_config(tmp_path, **{"optim.optim": "adamw_8bit", "run.max_steps": 2})
    before = {n: p.detach().clone() for n, p in load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)[0]
              .named_parameters()}
    state = train_grpo(cfg, train_examples=PROMPTS)
    assert isinstance(state.optimizer, bnb.optim.AdamW8bit)
    embed = state.model.get_input_embeddings().weight                     # [V, 64]: over 4096 values
    moments = state.optimizer.state[embed]
    assert moments["state1"].dtype == torch.uint8 and moments["state2"].dtype == torch.uint8  # 8-bit m, v
    assert moments["state1"].shape == embed.shape and moments["step"] == 2
    moved = [n for n, p in state.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert "model.embed_tokens.weight" in moved and len(moved) > len(before) // 2


def test_quantization_errors_say_what_to_change(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="only LoRA adapters can train: set model.lora_r"):
        build_config({"model.load_in_4bit": True})
    with pytest.raises(ConfigError, match="pick one"):
        build_config({"model.load_in_4bit": True, "model.load_in_8bit": True, "model.lora_r": 4})
    with pytest.raises(ConfigError, match="model.bnb_4bit_quant_type must be one of nf4, fp4"):
        build_config({"model.load_in_4bit": True, "model.lora_r": 4, "model.bnb_4bit_quant_type": "int4"})
    cfg = build_config({"model.load_in_4bit": True, "model.lora_r": 4, "model.device": "cpu"})
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)                # bitsandbytes not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "bitsandbytes" else 1)
    with pytest.raises(ConfigError, match="needs bitsandbytes: pip install .grpokit.qlora..") as e:
        check_environment(cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(QuantizationError, match="grpokit.qlora."):
        bnb_config(cfg.model)
