"""The final model: one save for every mode (one process, DDP or FSDP ranks, full weights or LoRA).

    run.output_dir/final/
        model.safetensors + config.json       the policy, save_pretrained (plain transformers loads it)
        adapter_model.safetensors, merged/    LoRA: the adapter (peft) and a merged plain model
        tokenizer files, grpokit_config.json, README.md (the model card)

Several ranks: every rank takes part in gathering the full weights (a collective under FSDP), rank 0
writes. The folder is written aside and renamed (`checkpoint.written_aside`): a kill leaves no half export.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpokit.model.lora import is_peft_model, save_lora
from grpokit.observe.model_card import write_model_card
from grpokit.train import checkpoint


def save_final(state, out_dir: str | Path) -> Path:
    """save_pretrained folder (model + tokenizer + grpokit_config.json + model card) at out_dir."""
    out = Path(out_dir)
    weights = state.dist.full_state_dict(state.model)      # every rank: the full weights on rank 0

    def write() -> None:
        with checkpoint.written_aside(out) as tmp:          # then renamed to out
            if is_peft_model(state.model):  # LoRA: the adapter here, a merged plain model in out/merged
                state.tokenizer.save_pretrained(save_lora(state.model, tmp, weights))
            else:
                state.model.save_pretrained(tmp, state_dict=weights)
            state.tokenizer.save_pretrained(tmp)
            (tmp / "grpokit_config.json").write_text(json.dumps(state.cfg.to_dict(), indent=2))
            weights_by_reward = {name: w for name, _, w in state.reward_funcs}
            write_model_card(tmp, state.cfg, state.cfg.run.output_dir, weights_by_reward)

    state.dist.on_main(write)
    return out
