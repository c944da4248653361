"""The easy task the trainer tests share: eight short prompts, a reward for writing 'a', a tiny model."""

from dataclasses import dataclass, field
from pathlib import Path

from grpokit.config.schema import build_config

EASY = str(Path(__file__).resolve().with_name("easy_rewards.py")) + ":share_of_a"


@dataclass
class Ex:
    prompt: str
    answer: str = ""
    columns: dict = field(default_factory=dict)


PROMPTS = [Ex(p) for p in ("Say a:", "Go:", "Letters:", "Write:", "Now:", "Type:", "Start:", "Next:")]


def easy_config(tmp_path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.prompts_per_step": 4, "rollout.num_generations": 8, "rollout.max_completion_length": 8,
              "optim.learning_rate": 3e-3, "run.output_dir": str(tmp_path / "run"), "run.max_steps": 30,
              "run.progress": False}
    values.update(over)
    return build_config(values)
