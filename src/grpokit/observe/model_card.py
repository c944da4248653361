"""The model card written beside the final model: `final/README.md`, as the Hugging Face Hub reads it.

Front matter (base_model, library_name: grpokit, tags: [grpo]), the objective's settings as they
were resolved, the reward functions with their weights, and the held-out evaluation before and
after training when the run evaluated (eval.jsonl; `grpokit.observe.demo.before_after_table`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpokit.observe.demo import before_after_table

# (config section, field, what it is) shown in the card's objective table
OBJECTIVE = (("loss", "loss_type", "loss aggregation"),
             ("loss", "beta", "KL coefficient (k3, to a frozen reference)"),
             ("loss", "epsilon", "clip range low"),
             ("loss", "epsilon_high", "clip range high (None: epsilon)"),
             ("loss", "importance_sampling_level", "ratio level"),
             ("loss", "scale_rewards", "advantage scaling"),
             ("loss", "num_iterations", "updates per generation batch (mu)"),
             ("rollout", "num_generations", "completions per prompt (G)"),
             ("rollout", "prompts_per_step", "prompts per step (B)"),
             ("rollout", "max_completion_length", "longest completion (tokens)"),
             ("rollout", "temperature", "sampling temperature"), ("optim", "learning_rate", "learning rate"),
             ("run", "max_steps", "optimizer steps"), ("run", "seed", "seed"))


def model_card(cfg: Any, run_dir: str | Path | None = None,
               reward_names: dict[str, float] | None = None) -> str:
    """The card's Markdown text.

    Args:
        cfg: the run's grpokit.config.schema.GRPOConfig.
        run_dir: the run's output_dir (its eval.jsonl gives the evaluation table), or None.
        reward_names: reward function name -> weight (default: cfg.reward.funcs).
    """
    rewards = reward_names if reward_names is not None else cfg.reward.funcs
    lines = ["---", f"base_model: {cfg.model.name_or_path}", "library_name: grpokit", "tags:", "- grpo",
             "---", "",
             f"# {Path(cfg.run.output_dir).name or 'grpokit model'}", "",
             (f"Fine-tuned from `{cfg.model.name_or_path}` with GRPO (Group Relative Policy Optimization, "
              "DeepSeekMath, Shao et al. 2024) using grpokit."), "",
             "## Objective", "", "| setting | value | meaning |", "|---|---|---|"]
    for section, name, meaning in OBJECTIVE:
        lines.append(f"| `{section}.{name}` | `{getattr(getattr(cfg, section), name)!r}` | {meaning} |")
    lines += ["", "Rewards (weight): " + ", ".join(f"`{k}` ({w:g})" for k, w in rewards.items()), "",
              "## Evaluation", ""]
    try:
        table = before_after_table(run_dir) if run_dir is not None else None
    except FileNotFoundError:
        table = None
    lines += ["```", table, "```"] if table else [("No held-out evaluation was run (run.eval_limit=0, or no "
                                                   "eval_dataset).")]
    lines += ["", "The full resolved config is in `grpokit_config.json` beside this card."]
    return "\n".join(lines) + "\n"


def write_model_card(folder: str | Path, cfg: Any, run_dir: str | Path | None = None,
                     reward_names: dict[str, float] | None = None) -> Path:
    """Write `folder/README.md` (see `model_card`); returns its path."""
    path = Path(folder) / "README.md"
    path.write_text(model_card(cfg, run_dir, reward_names), encoding="utf-8")
    return path
