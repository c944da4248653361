"""Every field of trl.GRPOConfig is mapped to grpokit's config or refused with a reason; the docs table is
generated from the same declaration."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from grpokit.config.schema import SECTIONS, ConfigError, build_config
from grpokit.trl import GRPOConfig
from grpokit.trl.fields import (
    DERIVED,
    FIELDS,
    MAP,
    REASONS,
    REFUSE,
    SAME,
    TRAINER,
    mapping_table,
)
from grpokit.trl.translate import COPY, translate

DOC = Path(__file__).resolve().parents[2] / "docs" / "coming_from_trl.md"


def _other_value(default):
    """A value that is not the default, of the default's kind."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 7
    if isinstance(default, str):
        return "something_else"
    if isinstance(default, list):
        return ["something_else"]
    return 3  # None


def test_every_trl_field_is_declared_with_trls_default():
    trl = pytest.importorskip("trl")
    theirs = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(theirs) == set(FIELDS), (set(theirs) ^ set(FIELDS))
    for name, f in theirs.items():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert FIELDS[name].default == default, name


def test_every_field_is_mapped_or_refused_with_a_reason():
    keys = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    for name, f in FIELDS.items():
        if f.kind == REFUSE:
            assert f.target in REASONS, name
        elif f.kind in (MAP, DERIVED):   # names the grpokit key it sets
            assert any(k in f.target for k in keys) or "refused" in f.target, name
        else:
            assert f.kind in (TRAINER, SAME) and len(f.target) > 10, name


@pytest.mark.parametrize("name", [n for n, f in FIELDS.items() if f.kind == REFUSE])
def test_a_refused_field_at_another_value_stops_with_one_line_naming_it(name):
    value = _other_value(FIELDS[name].default)
    with pytest.raises(ConfigError) as e:
        translate(GRPOConfig(**{name: value}), num_prompts=64)
    msg = str(e.value)
    assert f"GRPOConfig.{name}=" in msg and REASONS[FIELDS[name].target] in msg and "\n" not in msg


def test_copied_fields_reach_their_grpokit_key():
    for name, key in COPY.items():
        default = FIELDS[name].default
        value = {"importance_sampling_level": "sequence", "vllm_mode": "server", "epsilon_high": 0.3,
                 "delta": 2.0, "top_p": 0.5, "vllm_gpu_memory_utilization": 0.5, "num_generations": 4,
                 "epsilon": 0.1, "adam_beta1": 0.8, "adam_beta2": 0.9, "adam_epsilon": 1e-6,
                 "multi_objective_aggregation": "normalize_then_sum", "top_entropy_quantile": 0.2,
                 "entropy_coef_max": 8.0, "off_policy_mask_threshold": 0.5}.get(name, _other_value(default))
        t = translate(GRPOConfig(**{name: value}), num_prompts=64)
        assert t.overrides[key] == value, name


def test_derived_fields_translate():
    t = translate(GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=4, num_generations=8,
                             num_train_epochs=2, logging_steps=0.25, warmup_steps=0.1, save_strategy="no",
                             eval_strategy="steps", eval_steps=5, sync_ref_model=True, bf16=False,
                             lr_scheduler_type="constant_with_warmup", scale_rewards=False, top_k=None,
                             model_init_kwargs={"dtype": "bfloat16"}, optim="adamw_torch"), num_prompts=20)
    o = t.overrides
    assert (o["rollout.prompts_per_step"], o["optim.micro_batch_size"]) == (2, 4)   # 16 completions / G=8
    assert o["run.max_steps"] == 20 and o["run.logging_steps"] == 5 and o["optim.warmup_steps"] == 2
    assert o["run.save_steps"] == 0 and o["loss.ref_model_sync_steps"] == 512
    assert o["run.eval_steps"] == 0 and t.trainer["eval_steps"] == 5    # TRL's evaluation runs at eval_steps
    assert o["loss.scale_rewards"] == "none" and o["optim.lr_scheduler_type"] == "constant"
    assert o["model.dtype"] == "bfloat16" and o["rollout.top_k"] == 0
    cfg = build_config(o)
    assert cfg.batch_size == 16 and cfg.loss.ref_model_mixup_alpha == 0.6


def test_trl_defaults_that_differ_from_the_paper_are_noted():
    t = translate(GRPOConfig(max_steps=10), num_prompts=64)
    notes = "\n".join(t.notes)
    assert "loss.loss_type = 'dapo' from TRL's default" in notes
    assert "loss.beta = 0.0 from TRL's default" in notes
    explicit = translate(GRPOConfig(max_steps=10, loss_type="grpo", beta=0.04), num_prompts=64)
    assert not any("loss_type" in n or "loss.beta" in n for n in explicit.notes)


def test_bad_batch_and_unknown_names_are_one_line_errors():
    with pytest.raises(ConfigError, match="not a multiple of num_generations=8"):
        translate(GRPOConfig(per_device_train_batch_size=6), num_prompts=64)
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        GRPOConfig(learnin_rate=1e-6)
    with pytest.raises(ConfigError, match="steps_per_generation=3 is not supported"):
        translate(GRPOConfig(steps_per_generation=3, gradient_accumulation_steps=2), num_prompts=64)
    with pytest.raises(ConfigError, match="max_steps must be set"):
        translate(GRPOConfig(), num_prompts=None)


def test_a_real_trl_config_translates_like_ours():
    trl = pytest.importorskip("trl")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trl.GRPOConfig(output_dir="o", bf16=False, max_steps=5, report_to="none")
    ours = GRPOConfig(output_dir="o", bf16=False, max_steps=5, report_to="none")
    assert translate(theirs, num_prompts=64).overrides == translate(ours, num_prompts=64).overrides


def test_docs_table_is_generated_from_the_fields():
    text = DOC.read_text(encoding="utf-8")
    assert mapping_table() in text, "run: python scripts/update_trl_docs.py"
    for name in FIELDS:
        assert f"| `{name}` |" in text, name


def test_fields_mapped_in_this_wave_reach_grpokit():
    """issue 56 item 5: gradient_checkpointing_kwargs, ddp_timeout, full_determinism, vllm_server_timeout."""
    kw = {"use_reentrant": False}
    t = translate(GRPOConfig(gradient_checkpointing=True, gradient_checkpointing_kwargs=kw, ddp_timeout=60,
                             full_determinism=True, vllm_server_timeout=5.0), num_prompts=64)
    o = t.overrides
    assert o["model.gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert (o["run.ddp_timeout_s"], o["run.full_determinism"]) == (60, True)
    assert o["rollout.vllm_server_timeout_s"] == 5.0
    assert translate(GRPOConfig(), num_prompts=64).overrides["model.gradient_checkpointing_kwargs"] == {}
    cfg = build_config(o)
    assert cfg.model.gradient_checkpointing_kwargs == {"use_reentrant": False}


def test_gradient_checkpointing_kwargs_reach_the_model(monkeypatch):
    import transformers

    from grpokit.config.sections import ModelConfig
    from grpokit.model.loading import load_model_and_tokenizer

    seen = []
    real = transformers.PreTrainedModel.gradient_checkpointing_enable

    def enable(self, gradient_checkpointing_kwargs=None):
        seen.append(gradient_checkpointing_kwargs)
        return real(self, gradient_checkpointing_kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "gradient_checkpointing_enable", enable)
    load_model_and_tokenizer(ModelConfig(name_or_path="builtin:tiny-random", device="cpu",
                                         gradient_checkpointing=True,
                                         gradient_checkpointing_kwargs={"use_reentrant": False}))
    assert seen == [{"use_reentrant": False}]


def test_full_determinism_turns_on_deterministic_algorithms(monkeypatch):
    import torch

    from grpokit.train.preflight import enable_full_determinism

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        enable_full_determinism()
        assert torch.are_deterministic_algorithms_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before)


def test_data_seed_log_level_ddp_and_vllm_fields_reach_grpokit_and_none_keeps_the_default():
    """issue 56 item 5: data_seed, log_level, run_name, the five ddp_* fields, vllm_max_model_length; TRL's
    None (and log_level "passive") leave grpokit's default, which is PyTorch's."""
    t = translate(GRPOConfig(data_seed=11, log_level="warning", ddp_backend="gloo", ddp_static_graph=True,
                             ddp_find_unused_parameters=True, ddp_bucket_cap_mb=50,
                             ddp_broadcast_buffers=False), num_prompts=64)
    run = build_config(t.overrides).run
    assert (run.data_seed, run.log_level, run.ddp_backend) == (11, "warning", "gloo")
    assert (run.ddp_find_unused_parameters, run.ddp_bucket_cap_mb, run.ddp_broadcast_buffers,
            run.ddp_static_graph) == (True, 50, False, True)
    t = translate(GRPOConfig(vllm_max_model_length=4096, run_name="r1"), num_prompts=64)
    assert (t.overrides["rollout.vllm_max_model_length"], t.overrides["run.run_name"]) == (4096, "r1")
    default = build_config(translate(GRPOConfig(), num_prompts=64).overrides).run
    assert (default.data_seed, default.log_level, default.ddp_backend) == (None, "passive", "auto")
    assert (default.ddp_find_unused_parameters, default.ddp_bucket_cap_mb, default.ddp_broadcast_buffers,
            default.ddp_static_graph) == (False, 25, True, False)
    t = translate(GRPOConfig(torch_empty_cache_steps=5), num_prompts=64)
    assert build_config(t.overrides).run.torch_empty_cache_steps == 5
    assert default.torch_empty_cache_steps == 0


def test_num_tokens_is_the_runs_token_count_and_include_num_input_tokens_seen_adds_transformers_name(
        tiny_model, char_tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets")
    from grpokit.trl import GRPOTrainer

    rows = datasets.Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    trainer = GRPOTrainer(model=tiny_model, processing_class=char_tokenizer, train_dataset=rows,
                          reward_funcs=lambda completions, **k: [float(len(c)) for c in completions],
                          args=GRPOConfig(output_dir=str(tmp_path), num_generations=4, max_steps=2,
                                          per_device_train_batch_size=8, max_completion_length=4, bf16=False,
                                          report_to="none", logging_steps=1,
                                          include_num_input_tokens_seen="non_padding"))
    trainer.train()
    logged = [r for r in trainer.state.log_history if "num_tokens" in r]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["num_tokens"] for r in logged] == [s["input_tokens_seen"] for s in steps]
    assert all(r["num_input_tokens_seen"] == r["num_tokens"] for r in logged)
    assert trainer.state.num_input_tokens_seen == steps[-1]["input_tokens_seen"]
