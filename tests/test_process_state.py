"""A library leaves the process as it found it: no environment variable, no entry of transformers'
attention registries (grpokit's own entry, `grpokit_sdpa`, is added under its own name at first use;
"sdpa" and every other entry stay as they were), no attribute of a grpokit or transformers module, no
torch global setting differs after a training step (the speed-ups on), a reward-model call and an
evaluation. Only the `grpokit` command sets its own process up (`grpokit.switch.for_this_process`).
The models come out as they went in too: no instance attribute (a swapped `forward`) added, removed or
replaced on any of their modules, no config setting (the attention implementation) changed."""

import os
import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from easy_task import EASY, PROMPTS
from grpokit.config.schema import build_config
from grpokit.fast import small_attention
from grpokit.model.loading import build_char_tokenizer, tiny_config
from grpokit.rewards.outcome_rm import RewardModel
from grpokit.train.evaluate import evaluate
from grpokit.train.loop import build_state
from grpokit.train.step import train_step

# Attributes that may be set on first use: caches of something loaded once, which change no behaviour.
LOADED_ONCE = {"grpokit.fast.native._loaded": "the compiled decode kernels (a ctypes library), loaded once"}


def _snapshot() -> dict:
    modules = {name: dict(vars(mod)) for name, mod in list(sys.modules.items())
               if mod is not None and name.split(".")[0] in ("grpokit", "transformers")}
    registries = {cls.__name__: {**cls._global_mapping}
                  for cls in (AttentionInterface, AttentionMaskInterface)}
    return {"env": dict(os.environ), "registries": registries, "modules": modules,
            "torch": (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(),
                      torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
                      torch.is_autocast_enabled("cpu"))}


def _instances(**models) -> dict:
    """Every module's instance attributes and every config's settings, of each model."""
    out = {}
    for label, model in models.items():
        for name, m in model.named_modules():
            out[f"{label}.{name or '<root>'}"] = dict(vars(m))
        for name, m in model.named_modules():
            if hasattr(m, "config"):
                out[f"{label}.{name or '<root>'}.config"] = {k: repr(v) for k, v in vars(m.config).items()}
    return out


def _instance_differences(before: dict, after: dict) -> list[str]:
    out = [f"{k} (module added or removed)" for k in before.keys() ^ after.keys()]
    for owner in before.keys() & after.keys():
        was, now = before[owner], after[owner]
        out += [f"{owner}.{k}" for k in was.keys() ^ now.keys()]
        same = (lambda a, b: a == b) if owner.endswith(".config") else (lambda a, b: a is b)
        out += [f"{owner}.{k}" for k in was.keys() & now.keys() if not same(was[k], now[k])]
    return out


def _differences(before: dict, after: dict) -> list[str]:
    out = [f"env {k}" for k in before["env"].keys() ^ after["env"].keys()]
    out += [f"env {k}" for k in before["env"].keys() & after["env"].keys()
            if before["env"][k] != after["env"][k]]
    for reg, entries in before["registries"].items():
        now = after["registries"][reg]
        added_once = {small_attention.NAME} - entries.keys()   # grpokit's own entry, registered at first use
        out += [f"{reg}[{k}]" for k in entries.keys() | now.keys()
                if entries.get(k) is not now.get(k) and k not in added_once]
    for name, attrs in before["modules"].items():
        now = after["modules"].get(name, {})
        out += [f"{name}.{k}" for k, v in attrs.items() if k in now and now[k] is not v
                and not k.startswith("__") and f"{name}.{k}" not in LOADED_ONCE]
    if before["torch"] != after["torch"]:
        out.append(f"torch settings {before['torch']} -> {after['torch']}")
    return out


def test_a_step_a_reward_model_and_an_evaluation_leave_the_process_as_it_was(tmp_path):
    from transformers import AutoModelForSequenceClassification

    tok = build_char_tokenizer()
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
                        "rollout.max_completion_length": 8, "run.output_dir": str(tmp_path),
                        "loss.beta": 0.04, "run.progress": False})
    state = build_state(cfg, train_examples=PROMPTS)
    config = tiny_config(len(tok), tokenizer=tok)
    config.num_labels = 1
    rm = RewardModel(AutoModelForSequenceClassification.from_config(config), tok)
    before = _snapshot()                   # before any step: nothing may be set up lazily on first use
    models_before = _instances(policy=state.model, reference=state.ref_model, reward_model=rm.model)
    metrics = train_step(state)            # the speed-ups switched on and off again (grpokit.switch)
    scores = rm(prompts=["Go:"] * 2, completions=["aa", "ab"])
    result = evaluate(state.model, state.tokenizer, PROMPTS[:2], cfg, limit=2,
                      reward_funcs=state.reward_funcs)
    assert metrics["completion_tokens"] > 0 and len(scores) == 2 and result
    assert _differences(before, _snapshot()) == []
    assert _instance_differences(models_before, _instances(policy=state.model, reference=state.ref_model,
                                                           reward_model=rm.model)) == []
