"""transformers' hub kernels and grpokit's scoped forwards.

With the `kernels` package installed (transformers 5 depends on it), `from_pretrained` turns hub kernels on
for the model, and every train() / eval() then re-kernelizes it: each decorated layer's forward (RMSNorm,
...) is replaced or deleted. Inside a training step that removed the forwards `grpokit.fast.fused_ops` had
set, and a LoRA run with beta > 0 crashed leaving its first step (the reference pass calls eval()).
grpokit turns them off on every model it trains or scores (`without_hub_kernels`), and the scoped
forwards are removed on exit only where they are still the ones the scope set.
"""

import importlib.util

import pytest
import torch

from easy_task import EASY, PROMPTS
from grpokit.config.schema import build_config
from grpokit.fast.fused_ops import fused_ops
from grpokit.model.loading import build_char_tokenizer, load_model_and_tokenizer, tiny_random_model
from grpokit.train.loop import train_grpo

needs_kernels = pytest.mark.skipif(importlib.util.find_spec("kernels") is None,
                                   reason="transformers' hub kernels need the kernels package")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen2 saved as a plain folder: loaded back through from_pretrained, as users' models are."""
    folder = tmp_path_factory.mktemp("tiny")
    tok = build_char_tokenizer()
    tiny_random_model(tok, seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _norms(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


@needs_kernels
def test_from_pretrained_turns_hub_kernels_on_and_train_eval_then_drop_instance_forwards(saved):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(saved)
    assert model.use_kernels                        # the precondition of the crash: transformers' default
    model.train()                                   # a policy trains
    for m in _norms(model):
        m.forward = lambda x: x
    model.eval()
    assert not any("forward" in vars(m) for m in _norms(model))


def test_grpokit_loads_a_pretrained_folder_with_its_layers_left_alone(saved):
    model, _ = load_model_and_tokenizer(build_config({"model.name_or_path": str(saved)}).model)
    assert not getattr(model, "use_kernels", False)
    with fused_ops(model):
        model.eval()
        model.train()
        assert all("forward" in vars(m) for m in _norms(model))    # the scope's forwards survive
    assert not any("forward" in vars(m) for m in _norms(model))    # and are gone after it


def test_a_forward_put_back_inside_the_scope_is_left_to_whoever_put_it_back():
    model = tiny_random_model(build_char_tokenizer(), seed=0)
    norm = _norms(model)[0]
    with fused_ops(model):
        del norm.forward                            # as a re-kernelizing eval() does
    assert "forward" not in vars(norm)              # exit did not fail on it
    out = model(torch.tensor([[3, 4, 5]])).logits
    assert torch.isfinite(out).all()


@needs_kernels
@pytest.mark.parametrize("given", [False, True], ids=["loaded", "given"])
def test_lora_with_a_reference_trains_on_a_pretrained_model(saved, tmp_path, given):
    pytest.importorskip("peft", reason="model.lora_r needs peft")
    from transformers import AutoModelForCausalLM

    cfg = build_config({"model.name_or_path": str(saved), "model.lora_r": 4, "loss.beta": 0.04,
                        "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
                        "rollout.num_generations": 4, "rollout.max_completion_length": 8,
                        "run.max_steps": 2, "run.eval_limit": 2,
                        "run.progress": False, "run.save_steps": 0, "run.output_dir": str(tmp_path / "run")})
    model = AutoModelForCausalLM.from_pretrained(saved) if given else None
    tok = build_char_tokenizer() if given else None
    state = train_grpo(cfg, model, tok, train_examples=PROMPTS, eval_examples=PROMPTS[:2])
    base = state.model.get_base_model() if hasattr(state.model, "get_base_model") else state.model
    assert state.step == 2 and not any("forward" in vars(m) for m in _norms(state.model))
    assert not base.use_kernels                     # a given model's layers are left alone too
