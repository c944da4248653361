"""`GRPOTrainer`: TRL's trainer API, trained by grpokit's loop (`grpokit.train.loop.train_grpo`).

    from grpokit.trl import GRPOConfig, GRPOTrainer     # was: from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(model="path/to/model", reward_funcs=[my_reward], args=GRPOConfig(...),
                          train_dataset=dataset, eval_dataset=eval_dataset)
    out = trainer.train()                    # transformers' TrainOutput; state.log_history as TRL writes it
    metrics = trainer.evaluate()             # eval_loss, eval_reward, eval_rewards/<f>/mean, ...
    trainer.save_model("out/final")

What it does, in order: translate the TRL config (`grpokit.trl.translate`; a refused field stops
here with one line), read the datasets (`grpokit.tasks.hf`), make the reward triples, load or take
the policy (a PEFT config wraps it) and, with beta > 0, its frozen reference (as TRL: a copy, or
none for a PEFT model whose base with the adapters disabled is the reference), print the resolved
config with the TRL defaults that differ from grpokit's, then hand all of it to `train_grpo` with
TRL's logging and evaluation schedule (`grpokit.trl.logs`, `grpokit.trl.evaluation`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from grpokit.cli.main import describe
from grpokit.config.schema import ConfigError, build_config
from grpokit.config.schema import GRPOConfig as NestedConfig
from grpokit.config.validation import objective_warnings
from grpokit.core.entropy import applied_entropy_coef
from grpokit.core.token_masks import high_entropy_mask, off_policy_mask
from grpokit.model.devices import place_model, resolve_device
from grpokit.model.loading import (
    check_tokenizer_fits,
    load_model_and_tokenizer,
    prepare_tokenizer,
    without_hub_kernels,
)
from grpokit.model.lora import is_peft_model, reference_for
from grpokit.model.quantized import is_quantized, prepare_quantized
from grpokit.observe.model_card import write_model_card
from grpokit.train.loop import data_seed, save_final, train_grpo
from grpokit.train.resume import newest_complete_checkpoint
from grpokit.train.state import TrainState
from grpokit.train.update import bonus_enabled
from grpokit.trl.agents import agent_overrides, build_agent, check_data, for_tokenizer, train_examples
from grpokit.trl.config import GRPOConfig
from grpokit.trl.dataloaders import eval_dataloader, train_dataloader
from grpokit.trl.evaluation import EvalRun, evaluate_sets
from grpokit.trl.generation import generation_options, restore_saved
from grpokit.trl.inputs import (
    disable_dropout,
    eval_sets,
    is_iterable_dataset,
    model_name,
    qlora_keys,
    refuse_images,
    reward_triples,
    wrap_peft,
)
from grpokit.trl.logs import TRLHooks
from grpokit.trl.translate import Translation, prepare_dataset_args, translate

log = logging.getLogger("grpokit")


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
        eval_dataset: the same, or a dict / DatasetDict of them (metrics prefixed eval_<name>_).
        processing_class: the policy's tokenizer (default: the model's).
        reward_processing_classes: tokenizers of reward models, one per reward function (None for plain).
        callbacks: transformers.TrainerCallback objects (see `grpokit.train.callbacks`).
        optimizers: must be (None, None): grpokit builds its AdamW from the config.
        peft_config: a peft config (LoraConfig, ...) to wrap a plain model with.
        tools: functions the model may call (TRL's agent argument; `grpokit.trl.agents`).
        rollout_func: a generation function of your own, `rollout_func(prompts, trainer)`.
        environment_factory: one environment per rollout (its public methods are tools, its
            get_reward() a reward column), or a dict of them routed by an `environment` column.

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
        if train_dataset is None and environment_factory is None:
            raise ConfigError("`train_dataset` is required unless an `environment_factory` is provided: "
                              "give a datasets.Dataset, an IterableDataset or a list of dicts with a "
                              "'prompt' column")
        name = model if isinstance(model, str) else model_name(model)
        self.args = args if args is not None else GRPOConfig(output_dir=f"{Path(name).name}-GRPO")
        refuse_images(train_dataset, processing_class)
        check_data(train_dataset, environment_factory, getattr(self.args, "max_steps", -1))
        iterable = is_iterable_dataset(train_dataset)
        prepare_dataset_args(self.args, iterable, eval_dataset)
        num_prompts = None if iterable or train_dataset is None else len(train_dataset)
        self.translation = translate(self.args, num_prompts, int(os.environ.get("WORLD_SIZE", "1")))
        t = self.translation.overrides
        limit = t["run.max_steps"] * t["rollout.prompts_per_step"] if iterable else None
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.train_examples = train_examples(train_dataset, environment_factory,
                                             t["rollout.prompts_per_step"], limit)
        self.eval_sets = eval_sets(eval_dataset)
        self.eval_examples = [ex for examples in self.eval_sets.values() for ex in examples]
        self.reward_triples, self.reward_processing_classes = reward_triples(
            reward_funcs, self.translation.trainer["reward_weights"], reward_processing_classes,
            optional=environment_factory is not None)   # an environment's get_reward() may be the reward
        self._agent_keys = agent_overrides(tools, environment_factory)   # rollout.tools / environment
        self.config = self._nested_config(name, qlora_keys(t, peft_config, model))
        for warning in objective_warnings(self.config):
            log.warning(warning)
        self.agent = build_agent(tools, environment_factory, rollout_func, self, self.config.run.seed)
        if self.agent is not None:   # get_reward() columns, named after the environment class, weight 1
            self.reward_triples += self.agent.reward_funcs
            self.reward_processing_classes += [None] * len(self.agent.reward_funcs)
        self.reward_funcs = [fn for _, fn, _ in self.reward_triples]
        self.reward_func_names = [n for n, _, _ in self.reward_triples]
        self.model, self.processing_class = self._policy(model, processing_class, peft_config)
        self.train_examples = for_tokenizer(self.train_examples, self.processing_class)
        # TRL's reference: a frozen copy with beta > 0, none for PEFT (the base with adapters disabled)
        self._reference = reference_for(self.model) if self.config.loss.beta > 0 else None
        self.ref_model = None if is_peft_model(self.model) else self._reference
        self.callback_handler = self._hooks(callbacks)
        self.state = self.callback_handler.state
        self._train_state: TrainState | None = None
        print(self.describe(), flush=True)

    def _nested_config(self, name: str, extra: dict[str, Any]) -> NestedConfig:
        """grpokit's config: the translation plus what the trainer itself knows (rewards, data, model)."""
        return build_config({**self.translation.overrides, **self._agent_keys, "model.name_or_path": name,
                             "reward.funcs": {n: w for n, _, w in self.reward_triples},
                             "task.name": "hf", "task.path": "in-memory:train_dataset",
                             "run.eval_limit": -1 if self.eval_examples else 0, **extra})

    def _hooks(self, callbacks: list | None) -> TRLHooks:
        tr, cfg = self.translation.trainer, self.config
        per_step = cfg.rollout.prompts_per_step * cfg.rollout.num_generations
        return TRLHooks(cfg, callbacks, self.args, logging_steps=tr["log_every"], eval_steps=tr["eval_steps"],
                        eval_delay=tr["eval_delay"], eval_on_start=tr["eval_on_start"],
                        evaluate=self._scheduled_evaluation if self.eval_sets else None,
                        logging_first_step=tr["logging_first_step"], table_size=per_step,
                        completions_per_step=per_step)

    def _policy(self, model: Any, processing_class: Any, peft_config: Any):
        """The policy and its tokenizer, prepared as grpokit's loader prepares them."""
        cfg = self.config
        if isinstance(model, str):   # QLoRA: quantized and prepared by the loader, the adapters peft_config's
            quantized = cfg.model.load_in_4bit or cfg.model.load_in_8bit
            model, tokenizer = load_model_and_tokenizer(dataclasses.replace(cfg.model, lora_r=0) if quantized
                                                        else cfg.model, seed=cfg.run.seed)
        else:
            if self.translation.trainer["model_dtype"] is not None:
                raise ConfigError("model_init_kwargs applies to a model given by path, but the model is "
                                  "already loaded: unset model_init_kwargs or pass the path")
            tokenizer = processing_class
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model_name(model))
            # this rank's device (cuda:LOCAL_RANK under torchrun), decided from the launcher's environment
            place_model(model, resolve_device(cfg.model.device), what="the model")
            without_hub_kernels(model)     # plain PyTorch layers (grpokit.model.loading.without_hub_kernels)
            if is_quantized(model) and not is_peft_model(model):   # loaded 4-bit / 8-bit by the user
                model = prepare_quantized(model, cfg.model)
            if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs=cfg.model.gradient_checkpointing_kwargs or None)
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

    # -- TRL / transformers attributes ----------------------------------------------------------
    @property
    def _logs(self) -> dict[str, Any]:
        """TRL's completions table of the latest generation batch (prompt, completion, rewards, ...)."""
        return self.callback_handler.logs

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus' coefficient now (adaptive control moves it during training)."""
        ts = self._train_state
        return self.config.loss.entropy_coef if ts is None or ts.entropy_coef is None else ts.entropy_coef

    @property
    def reward_weights(self) -> torch.Tensor:
        """TRL's weight of each reward function, in reward_funcs' order (an environment's get_reward: 1)."""
        return torch.tensor([w for _, _, w in self.reward_triples], dtype=torch.float32)

    @property
    def tools(self) -> list:
        """TRL's tools: the standalone functions and each environment's methods."""
        if getattr(self, "_shown_tools", None) is not None:
            return list(self._shown_tools)
        return self.agent.tool_functions() if self.agent is not None else []

    @tools.setter
    def tools(self, value: list | None) -> None:
        """TRL's `trainer.tools = [...]`: the tool section the prompts render from now on (functions or
        JSON-schema dicts); the calls still run the tools and environment methods given at construction,
        as in TRL; [] or None: no tools shown and no tool loop (`grpokit.agents.agent.Agent.show_tools`).
        With a rollout_func they are only kept, for the function to read."""
        if self.agent is None and value:
            raise ConfigError("trainer.tools is set, but this trainer was built without tools: pass "
                              "tools=[...] (or environment_factory=...) to GRPOTrainer")
        if self.agent is not None and self.agent.rollout_func is None:
            self.agent.show_tools(value)
        self._shown_tools = list(value or [])   # a rollout_func reads them back from trainer.tools

    @property
    def environments(self) -> list | None:
        """The environment of each rollout of the latest batch (None without an environment_factory)."""
        return self.agent.environments if self.agent is not None else None

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's MoE router auxiliary loss: grpokit trains none (router_aux_loss_coef is refused)."""
        return False

    def get_high_entropy_mask(self, entropies: Any, mask: Any, threshold: float) -> Any:
        """TRL's helper: the valid tokens whose entropy is at least the `threshold` quantile (bool [N, T];
        grpokit.core.token_masks.high_entropy_mask)."""
        return high_entropy_mask(entropies, mask, threshold)

    @staticmethod
    def get_off_policy_mask(advantages: Any, per_token_logps: Any, sampling_per_token_logps: Any, mask: Any,
                            off_policy_threshold: float) -> Any:
        """TRL's helper: DeepSeek-V3.2's off-policy sequence mask, 1 keep / 0 drop ([N, 1];
        grpokit.core.token_masks.off_policy_mask)."""
        return off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask,
                               off_policy_threshold)

    def add_callback(self, callback: Any) -> None:
        self.callback_handler.callbacks.append(callback() if isinstance(callback, type) else callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_handler.callbacks = [cb for cb in self.callback_handler.callbacks
                                           if cb is not callback and type(cb) is not callback]

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused: grpokit works offline. Upload output_dir/final with huggingface_hub yourself."""
        raise ConfigError("push_to_hub is not supported: grpokit writes locally only; upload the saved "
                          "folder "
                          "with huggingface_hub (HfApi().upload_folder) yourself")

    # -- training -------------------------------------------------------------------------------
    def _resume_config(self, resume: Any) -> NestedConfig:
        """The config of a resumed run: grpokit continues from the newest complete checkpoint."""
        if not resume:
            return self.config
        if isinstance(resume, (str, Path)):
            newest, _ = newest_complete_checkpoint(self.config.run.output_dir)
            if newest is None or Path(resume).resolve() != newest.resolve():
                raise ConfigError(f"resume_from_checkpoint='{resume}': grpokit resumes the newest complete "
                                  f"checkpoint in output_dir ({newest}); pass True, or that path")
        return self._nested_config(self.config.model.name_or_path, {"run.resume": True})

    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, ignore_keys_for_eval: Any = None,
              **kwargs: Any) -> Any:
        """Train (grpokit's loop); returns transformers' TrainOutput(global_step, training_loss, metrics).

        Args:
            resume_from_checkpoint: True (or the newest checkpoint's path) continues the run in
                output_dir bit-identically; None takes args.resume_from_checkpoint.
        """
        from transformers.trainer_utils import TrainOutput  # transformers' trainer module: loaded when used

        if kwargs or trial is not None:
            raise ConfigError(f"train() got {', '.join(kwargs) or 'trial'}: grpokit's train takes "
                              "resume_from_checkpoint only (no hyperparameter search)")
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else \
            self.translation.trainer["resume_from_checkpoint"]
        cfg = self._resume_config(resume)
        with generation_options(self.model, self.translation.trainer["generation"]):
            self._train_state = train_grpo(cfg, model=self.model, tokenizer=self.processing_class,
                                           train_examples=self.train_examples,
                                           eval_examples=self.eval_examples,
                                           callbacks=self.callback_handler, reward_funcs=self.reward_triples,
                                           ref_model=self._reference, agent=self.agent)
        if self.translation.trainer["generation"]:   # the run's sampling options stay out of the saved model
            restore_saved(self.model, Path(cfg.run.output_dir) / "final")
        metrics = self.callback_handler.train_metrics
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def get_train_dataloader(self):
        """TRL's training DataLoader: one epoch of generation batches (each prompt num_generations times in
        a row) in the order grpokit trains on, from where training stands (`grpokit.trl.dataloaders`)."""
        cfg, ts = self.config, self._train_state
        return train_dataloader(self.train_examples, seed=data_seed(cfg.run), shuffle=cfg.task.shuffle,
                                cursor=0 if ts is None else ts.stream.cursor,
                                prompts_per_step=cfg.rollout.prompts_per_step,
                                num_generations=cfg.rollout.num_generations)

    def get_eval_dataloader(self, eval_dataset: Any = None):
        """TRL's eval DataLoader: eval_dataset's rows (a name picks one of a dict), each
        num_generations_eval times, in batches of per_device_eval_batch_size rows."""
        if isinstance(eval_dataset, str):
            if eval_dataset not in self.eval_sets:
                raise ConfigError(f"eval_dataset '{eval_dataset}' is not one of the trainer's eval datasets "
                                  f"({', '.join(map(str, self.eval_sets))}): give one of those names")
            sets = {eval_dataset: self.eval_sets[eval_dataset]}
        else:
            sets = self.eval_sets if eval_dataset is None else eval_sets(eval_dataset)
        if not sets:
            raise ConfigError("get_eval_dataloader() needs an eval_dataset: pass one to GRPOTrainer or here")
        tr = self.translation.trainer
        return eval_dataloader([ex for examples in sets.values() for ex in examples],
                               num_generations=tr["num_generations_eval"], batch_size=tr["eval_batch_size"])

    # -- evaluation -----------------------------------------------------------------------------
    def _eval_run(self) -> EvalRun:
        tr, lo, ts = self.translation.trainer, self.config.loss, self._train_state
        coef = None
        if bonus_enabled(self.config):    # the coefficient a training step would apply now (adaptive gate)
            coef = applied_entropy_coef(self.entropy_coef, math.inf if ts is None else ts.last_entropy,
                                        lo.entropy_target, lo.use_adaptive_entropy)
        return EvalRun(self.config, self.model, self.processing_class, self.reward_triples,
                       num_generations=tr["num_generations_eval"], batch_size=tr["eval_batch_size"],
                       ref_model=self._reference if ts is None else ts.ref_model,
                       entropy_coef=coef, reward_extra=self.callback_handler.reward_kwargs(),
                       agent=self.agent)

    def _scheduled_evaluation(self) -> dict[str, Any]:
        with generation_options(self.model, self.translation.trainer["generation"]):
            return evaluate_sets(self._eval_run(), self.eval_sets)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None,
                 metric_key_prefix: str = "eval") -> dict[str, Any]:
        """TRL's evaluation: the GRPO loss and reward metrics on sampled completions of eval_dataset (one
        dataset, or a dict of them prefixed `<prefix>_<name>_`); logged to state.log_history, fires
        on_evaluate; returns the metrics (eval_loss, eval_reward, eval_rewards/<f>/mean, ...)."""
        sets = self.eval_sets if eval_dataset is None else eval_sets(eval_dataset)
        if not sets:
            raise ConfigError("evaluate() needs an eval_dataset: pass one to GRPOTrainer or to evaluate()")
        with generation_options(self.model, self.translation.trainer["generation"]):
            metrics = evaluate_sets(self._eval_run(), sets, metric_key_prefix)
        self.callback_handler.log_evaluation(metrics)
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> Path:
        """A save_pretrained folder (model, tokenizer, grpokit_config.json, README.md model card) that plain
        transformers loads; default: args.output_dir."""
        out = Path(output_dir or self.config.run.output_dir)
        if self._train_state is not None:
            return save_final(self._train_state, out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.processing_class.save_pretrained(out)
        write_model_card(out, self.config, None, {n: w for n, _, w in self.reward_triples})
        return out


__all__ = ["GRPOConfig", "GRPOTrainer", "Translation"]
