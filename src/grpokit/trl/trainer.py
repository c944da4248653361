"""`GRPOTrainer`: TRL's trainer API, trained by grpokit's loop (`grpokit.train.loop.train_grpo`).

    from grpokit.trl import GRPOConfig, GRPOTrainer     # was: from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(model="path/to/model", reward_funcs=[my_reward], args=GRPOConfig(...),
                          train_dataset=dataset)
    trainer.train()
    trainer.save_model("out/final")

What it does, in order: translate the TRL config (`grpokit.trl.translate`; a refused field stops
here with one line), read the datasets (`grpokit.tasks.hf`), make the reward triples, load or take
the policy (a PEFT config wraps it; with beta > 0 grpokit's loop builds the reference: a frozen copy,
or the adapter-disabled base of a PEFT model), print the resolved config with the TRL defaults that
differ from grpokit's, then hand all of it to `train_grpo` with the callbacks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from grpokit.cli.main import describe
from grpokit.config.schema import ConfigError, build_config
from grpokit.config.schema import GRPOConfig as NestedConfig
from grpokit.model.loading import (
    check_tokenizer_fits,
    load_model_and_tokenizer,
    prepare_tokenizer,
    resolve_device,
)
from grpokit.observe.model_card import write_model_card
from grpokit.train import checkpoint
from grpokit.train.callbacks import TrainHooks
from grpokit.train.evaluate import evaluate as evaluate_model
from grpokit.train.loop import save_final, train_grpo
from grpokit.train.state import TrainState
from grpokit.trl.agents import agent_overrides, build_agent, check_data, for_tokenizer, train_examples
from grpokit.trl.config import GRPOConfig
from grpokit.trl.inputs import (
    dataset_examples,
    disable_dropout,
    is_iterable_dataset,
    model_name,
    reward_triples,
    wrap_peft,
)
from grpokit.trl.translate import Translation, translate


class GRPOTrainer:
    """TRL's `GRPOTrainer` signature on grpokit.

    Args:
        model: a local model folder or grpokit alias (builtin:arith-demo, ...), a transformers
            PreTrainedModel or a peft PeftModel.
        reward_funcs: one or a list of: a callable ``f(prompts, completions, **kwargs)`` (plain or
            ``async def``), a built-in reward name or import path, a reward-model folder or a
            sequence-classification model (its logit is the score).
        args: a `grpokit.trl.GRPOConfig` or a real `trl.GRPOConfig` (TRL's defaults when None).
        train_dataset: a datasets.Dataset / IterableDataset or a list of dicts with a 'prompt' column.
        eval_dataset: the same, evaluated before and after training and by `evaluate()`.
        processing_class: the policy's tokenizer (default: the model's).
        reward_processing_classes: tokenizers of reward models, one per reward function (None for plain).
        callbacks: transformers.TrainerCallback objects (see `grpokit.train.callbacks`).
        optimizers: must be (None, None): grpokit builds its AdamW from the config.
        peft_config: a peft config (LoraConfig, ...) to wrap a plain model with.
        tools, environment_factory, rollout_func: TRL's agent arguments (`grpokit.trl.agents`): functions the
            model may call; one environment per rollout (its methods are tools, get_reward() a reward);
            a generation function of your own.

    Raises:
        ConfigError: a refused TRL field, inconsistent batch sizes, a bad dataset or reward function.
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None,
                 reward_processing_classes: Any = None, callbacks: list | None = None,
                 optimizers: tuple = (None, None), peft_config: Any = None, tools: list | None = None,
                 rollout_func: Any = None, environment_factory: Any = None) -> None:
        if tuple(optimizers) != (None, None):
            raise ConfigError("optimizers=(...) is not supported: grpokit builds AdamW and its schedule from "
                              "the config (learning_rate, lr_scheduler_type, optim); leave optimizers unset")
        name = model if isinstance(model, str) else model_name(model)
        self.args = args if args is not None else GRPOConfig(output_dir=f"{Path(name).name}-GRPO")
        check_data(train_dataset, environment_factory, getattr(self.args, "max_steps", -1))
        iterable = is_iterable_dataset(train_dataset)
        num_prompts = None if iterable or train_dataset is None else len(train_dataset)
        self.translation = translate(self.args, num_prompts, int(os.environ.get("WORLD_SIZE", "1")))
        t = self.translation.overrides
        limit = t["run.max_steps"] * t["rollout.prompts_per_step"] if iterable else None
        B = t["rollout.prompts_per_step"]
        self.train_examples = train_examples(train_dataset, environment_factory, B, limit)
        self.eval_examples = (
            [] if eval_dataset is None else dataset_examples(eval_dataset, where="eval_dataset"))
        self.reward_funcs = reward_triples(reward_funcs, self.translation.trainer["reward_weights"],
                                           reward_processing_classes,
                                           optional=environment_factory is not None)   # get_reward may do
        self._agent_keys = agent_overrides(tools, environment_factory)   # rollout.tools / environment
        self.config = self._nested_config(name, {})
        self.agent = build_agent(tools, environment_factory, rollout_func, self, self.config.run.seed)
        self.reward_funcs += self.agent.reward_funcs if self.agent is not None else []   # get_reward columns
        self.model, self.processing_class = self._policy(model, processing_class, peft_config)
        self.train_examples = for_tokenizer(self.train_examples, self.processing_class)
        self.callback_handler = TrainHooks(self.config, callbacks, args=self.args)
        self.state = self.callback_handler.state
        self._train_state: TrainState | None = None
        print(self.describe(), flush=True)

    def _nested_config(self, name: str, extra: dict[str, Any]) -> NestedConfig:
        """grpokit's config: the translation plus what the trainer itself knows (rewards, data, model)."""
        return build_config({**self.translation.overrides, **self._agent_keys, "model.name_or_path": name,
                             "reward.funcs": {n: w for n, _, w in self.reward_funcs},
                             "task.name": "hf", "task.path": "in-memory:train_dataset",
                             "run.eval_limit": -1 if self.eval_examples else 0, **extra})

    def _policy(self, model: Any, processing_class: Any, peft_config: Any):
        """The policy and its tokenizer, prepared as grpokit's loader prepares them."""
        cfg = self.config
        if isinstance(model, str):
            model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
        else:
            if self.translation.trainer["model_dtype"] is not None:
                raise ConfigError("model_init_kwargs applies to a model given by path, but the model is "
                                  "already loaded: unset model_init_kwargs or pass the path")
            tokenizer = processing_class
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model_name(model))
            model.to(resolve_device(cfg.model.device))
            if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
                model.gradient_checkpointing_enable()
                model.config.use_cache = False
        if processing_class is not None:
            tokenizer = processing_class
        prepare_tokenizer(tokenizer)
        check_tokenizer_fits(tokenizer, model, cfg.model.name_or_path)
        model = wrap_peft(model, peft_config)
        if self.translation.trainer["disable_dropout"]:
            disable_dropout(model)
        model.train()
        return model, tokenizer

    def describe(self) -> str:
        """The printed config: TRL's defaults applied where they differ from grpokit's, then every
        resolved grpokit key that differs from the paper's defaults."""
        notes = self.translation.notes
        head = ["grpokit.trl: TRL-style GRPOConfig translated to grpokit's config"]
        if notes:
            head.append("TRL's defaults applied (they differ from grpokit's paper defaults; set them to "
                        "change):")
            head += [f"  - {n}" for n in notes]
        return "\n".join(head + [describe(self.config)])

    def add_callback(self, callback: Any) -> None:
        self.callback_handler.callbacks.append(callback() if isinstance(callback, type) else callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_handler.callbacks = [cb for cb in self.callback_handler.callbacks
                                           if cb is not callback and type(cb) is not callback]

    def _resume_config(self, resume: Any) -> NestedConfig:
        """The config of a resumed run: grpokit continues from the newest complete checkpoint."""
        if not resume:
            return self.config
        if isinstance(resume, (str, Path)):
            newest, _ = checkpoint.newest_complete_checkpoint(self.config.run.output_dir)
            if newest is None or Path(resume).resolve() != newest.resolve():
                raise ConfigError(f"resume_from_checkpoint='{resume}': grpokit resumes the newest complete "
                                  f"checkpoint in output_dir ({newest}); pass True, or that path")
        return self._nested_config(self.config.model.name_or_path, {"run.resume": True})

    def train(self, resume_from_checkpoint: Any = None, **kwargs: Any):
        """Train (grpokit's loop); returns transformers' TrainOutput(global_step, training_loss, metrics).

        Args:
            resume_from_checkpoint: True (or the newest checkpoint's path) continues the run in
                output_dir bit-identically; None takes args.resume_from_checkpoint.
        """
        from transformers.trainer_utils import TrainOutput

        if kwargs:
            raise ConfigError(f"train() got {', '.join(kwargs)}: grpokit's train takes "
                              "resume_from_checkpoint only")
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else \
            self.translation.trainer["resume_from_checkpoint"]
        cfg = self._resume_config(resume)
        self._train_state = train_grpo(cfg, model=self.model, tokenizer=self.processing_class,
                                       train_examples=self.train_examples, eval_examples=self.eval_examples,
                                       callbacks=self.callback_handler, reward_funcs=self.reward_funcs,
                                       agent=self.agent)
        losses = [row["loss"] for row in self.state.log_history if isinstance(row.get("loss"), float)]
        loss = sum(losses) / len(losses) if losses else float("nan")
        steps = self._train_state.step
        return TrainOutput(steps, loss, {"train_loss": loss, "steps": steps})

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Greedy evaluation of the policy on eval_dataset: mean of every reward function and the total
        (accuracy too when the data has an answer column); fires on_evaluate; keys 'eval_<name>'."""
        examples = self.eval_examples if eval_dataset is None else \
            dataset_examples(eval_dataset, where="eval_dataset")
        if not examples:
            raise ConfigError("evaluate() needs an eval_dataset: pass one to GRPOTrainer or to evaluate()")
        result = evaluate_model(self.model, self.processing_class, examples, self.config, limit=-1,
                                reward_funcs=self.reward_funcs, progress=False,
                                reward_extra=self.callback_handler.reward_kwargs(), agent=self.agent)
        self.callback_handler.evaluate({"tag": "evaluate", "step": self.state.global_step, **result})
        return {f"{metric_key_prefix}_{k}": v for k, v in result.items()}

    def save_model(self, output_dir: str | None = None) -> Path:
        """A save_pretrained folder (model, tokenizer, grpokit_config.json, README.md model card) that plain
        transformers loads; default: args.output_dir."""
        out = Path(output_dir or self.config.run.output_dir)
        if self._train_state is not None:
            return save_final(self._train_state, out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.processing_class.save_pretrained(out)
        write_model_card(out, self.config, None, {n: w for n, _, w in self.reward_funcs})
        return out


__all__ = ["GRPOConfig", "GRPOTrainer", "Translation"]
