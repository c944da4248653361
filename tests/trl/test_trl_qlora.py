"""TRL's QLoRA recipe on grpokit.trl: `model_init_kwargs={"quantization_config": BitsAndBytesConfig(...)}`
with a peft LoraConfig, or a model the program loaded 4-bit itself; bitsandbytes' CPU backend."""

from __future__ import annotations

import pytest
import torch

datasets = pytest.importorskip("datasets")
peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig  # noqa: E402

from grpokit.config.schema import ConfigError  # noqa: E402
from grpokit.model.lora import DisabledAdapterReference  # noqa: E402
from grpokit.model.quantized import is_quantized  # noqa: E402
from grpokit.trl import GRPOConfig, GRPOTrainer  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture()
def folder(tmp_path, char_tokenizer):
    """A random-init tiny Llama (hidden 64) saved with the char tokenizer."""
    config = LlamaConfig(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=char_tokenizer.eos_token_id,
                         pad_token_id=char_tokenizer.pad_token_id, bos_token_id=char_tokenizer.bos_token_id)
    torch.manual_seed(0)
    out = tmp_path / "tiny-llama"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    char_tokenizer.save_pretrained(out)
    return out


def _digits(completions, **kwargs):   # varies within a group: a gradient for the adapters
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def _data():
    return datasets.Dataset.from_list([{"prompt": f"{a}+1="} for a in range(16)])


def _args(tmp_path, **over):
    return GRPOConfig(output_dir=str(tmp_path / "out"), num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=6, max_steps=2, beta=0.04, bf16=False, save_strategy="no",
                      learning_rate=5e-2, **over)


NF4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.float32)


def _assert_trains_adapters_only(trainer):
    model = trainer.model
    assert is_quantized(model)
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    assert type(q.base_layer) is bnb.nn.Linear4bit
    packed = q.base_layer.weight.detach().clone()
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert isinstance(trainer._train_state.ref_model, DisabledAdapterReference)   # the base, adapter off
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)
    assert torch.equal(q.base_layer.weight, packed)                                  # the 4-bit base frozen


def test_model_init_kwargs_quantization_config_loads_the_base_4bit_under_the_peft_adapters(tmp_path, folder):
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = GRPOTrainer(model=str(folder), reward_funcs=[_digits], train_dataset=_data(), peft_config=lora,
                          args=_args(tmp_path, model_init_kwargs={"quantization_config": NF4}))
    m = trainer.config.model
    assert (m.load_in_4bit, m.bnb_4bit_quant_type, m.bnb_4bit_use_double_quant, m.bnb_4bit_compute_dtype) == \
        (True, "nf4", True, "float32")
    assert (m.lora_r, m.lora_alpha, m.lora_target_modules) == (4, 8, ["q_proj", "v_proj"])
    k = trainer.model.get_base_model().model.layers[0].self_attn.k_proj
    assert type(k) is bnb.nn.Linear4bit                       # the user's target modules: k_proj not adapted
    _assert_trains_adapters_only(trainer)
    assert (tmp_path / "out" / "final" / "adapter_config.json").is_file()


def test_a_model_the_program_loaded_4bit_trains_its_adapters(tmp_path, folder, char_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=NF4, device_map={"": "cpu"})
    trainer = GRPOTrainer(model=model, processing_class=char_tokenizer, reward_funcs=[_digits],
                          train_dataset=_data(), peft_config=peft.LoraConfig(r=4, target_modules=["q_proj"]),
                          args=_args(tmp_path))
    _assert_trains_adapters_only(trainer)


def test_quantization_refusals_say_what_to_change(tmp_path, folder, char_tokenizer):
    with pytest.raises(ConfigError, match="pass peft_config=LoraConfig"):
        GRPOTrainer(model=str(folder), reward_funcs=[_digits], train_dataset=_data(),
                    args=_args(tmp_path, model_init_kwargs={"quantization_config": NF4}))
    model = AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(ConfigError, match="applies to a model given by path"):
        GRPOTrainer(model=model, processing_class=char_tokenizer, reward_funcs=[_digits],
                    train_dataset=_data(), peft_config=peft.LoraConfig(r=4),
                    args=_args(tmp_path, model_init_kwargs={"quantization_config": NF4}))
    odd = BitsAndBytesConfig(load_in_4bit=True, llm_int8_skip_modules=["lm_head"])
    with pytest.raises(ConfigError, match="llm_int8_skip_modules") as e:
        GRPOTrainer(model=str(folder), reward_funcs=[_digits], train_dataset=_data(),
                    peft_config=peft.LoraConfig(r=4), args=_args(tmp_path, model_init_kwargs={
                        "quantization_config": odd}))
    assert "\n" not in str(e.value)
