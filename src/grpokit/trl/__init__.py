"""TRL's GRPO API on grpokit: a TRL program runs by changing one import.

    from grpokit.trl import GRPOConfig, GRPOTrainer      # instead of: from trl import ...

`GRPOConfig` takes TRL 1.16's field names and defaults (a real `trl.GRPOConfig` works too);
`GRPOTrainer` takes TRL's arguments and trains with grpokit's loop. Every TRL field is mapped to
grpokit's config or refused with a one-line reason (`grpokit.trl.fields`, docs/coming_from_trl.md).

    config     GRPOConfig (TRL's names and defaults);  fields: every TRL field and its fate
    translate  a TRL config to grpokit's GRPOConfig;   inputs: datasets, reward functions, peft configs
    generation_batch  steps_per_generation / generation_batch_size -> rollout.steps_per_generation
    trainer    GRPOTrainer: train(), evaluate(), save_model(), callbacks, on grpokit.train.loop.train_grpo
    dataloaders  get_train_dataloader() / get_eval_dataloader(): TRL's batch layout, grpokit's order
    logs       state.log_history and _logs as TRL writes them; evaluation: TRL's eval_loss and metrics
    generation transformers-generate options (min_p, repetition_penalty, generation_kwargs) for a run
    agents     its tools=, environment_factory=, rollout_func= (grpokit.agents)
"""

from grpokit.trl.config import GRPOConfig
from grpokit.trl.fields import FIELDS, mapping_table
from grpokit.trl.trainer import GRPOTrainer
from grpokit.trl.translate import translate

__all__ = ["FIELDS", "GRPOConfig", "GRPOTrainer", "mapping_table", "translate"]
