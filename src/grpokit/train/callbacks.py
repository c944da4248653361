"""What `train_grpo` tells the outside world while it runs: transformers-style callbacks and the
hooks TRL hands to reward functions.

    hooks = TrainHooks(cfg, callbacks=[MyCallback()])   # transformers.TrainerCallback objects
    train_grpo(cfg, callbacks=hooks)

Callbacks get TRL's events with transformers' arguments ``(args, state, control, **kwargs)``:
``on_train_begin``, ``on_step_end`` (with ``metrics=`` the step's row), ``on_log`` (``logs=``),
``on_evaluate`` (``metrics=``), ``on_save`` (``checkpoint=``) and ``on_train_end``; setting
``control.should_training_stop`` in any of them ends the run after the current step, which is then
saved as the final model. ``state`` is a real `transformers.TrainerState` whose ``log_history``
gets one row per step (grpokit's keys plus TRL's names: reward, reward_std, kl, ...).

Reward functions receive, as in TRL, ``trainer_state`` (that TrainerState), ``log_metric(name,
value)`` (averaged over the step, written to the metrics.jsonl row under its name) and
``log_extra(column, values)`` (per-completion values, written to the row as ``extra/<column>``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

# TRL's log names for grpokit's metrics, so TRL-minded callbacks and log_history readers find them.
TRL_NAMES = {"reward": "reward_mean", "reward_std": "reward_std", "kl": "approx_kl", "entropy": "entropy",
             "clip_ratio/region_mean": "clip_ratio", "clip_ratio/low_mean": "clip_ratio_low",
             "clip_ratio/high_mean": "clip_ratio_high", "completions/mean_length": "completion_length_mean",
             "frac_reward_zero_std": "frac_zero_std", "grad_norm": "grad_norm", "loss": "loss",
             "num_tokens": "input_tokens_seen"}


class TrainHooks:
    """The callbacks of one run, the TrainerState they share, and the reward functions' log hooks.

    Args:
        cfg: the run's `grpokit.config.schema.GRPOConfig` (max_steps and the intervals go into the state).
        callbacks: transformers.TrainerCallback instances (or classes, instantiated here).
        args: what callbacks receive as ``args`` (the TRL-style config when there is one; default cfg).
    """

    def __init__(self, cfg: Any, callbacks: list | None = None, args: Any = None) -> None:
        from transformers import TrainerControl, TrainerState

        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in (callbacks or [])]
        self.args = cfg if args is None else args
        self.state = TrainerState(max_steps=cfg.run.max_steps, logging_steps=cfg.run.logging_steps,
                                  save_steps=cfg.run.save_steps, eval_steps=cfg.run.eval_steps)
        self.control = TrainerControl()
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._extra: dict[str, list] = defaultdict(list)
        self._saved: str | None = None   # the checkpoint written during the current step

    # -- reward-function hooks ------------------------------------------------------------------
    def reward_kwargs(self) -> dict[str, Any]:
        """The keywords TRL adds to every reward call."""
        return {"trainer_state": self.state, "log_metric": self.log_metric, "log_extra": self.log_extra}

    def log_metric(self, name: str, value: float) -> None:
        self._metrics[str(name)].append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        self._extra[str(column)].extend(values)

    def step_metrics(self) -> dict[str, float]:
        """The step's log_metric values, each averaged; cleared for the next step."""
        out = {k: sum(v) / len(v) for k, v in self._metrics.items() if v}
        self._metrics.clear()
        return out

    def step_extras(self) -> dict[str, list]:
        """The step's log_extra columns as ``extra/<column>`` lists (JSON-safe); cleared."""
        plain = (int, float, str, bool, type(None))
        out = {f"extra/{k}": [v if isinstance(v, plain) else str(v) for v in vals]
               for k, vals in self._extra.items()}
        self._extra.clear()
        return out

    # -- events ---------------------------------------------------------------------------------
    def _fire(self, event: str, **kwargs: Any) -> None:
        from transformers import TrainerControl

        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                out = fn(self.args, self.state, self.control, **kwargs)
                if isinstance(out, TrainerControl):
                    self.control = out

    def _sync(self, train_state: Any) -> None:
        self.state.global_step = train_state.step
        n = len(train_state.stream.examples)
        self.state.epoch = train_state.stream.cursor / n if n else 0.0

    def train_begin(self, train_state: Any) -> None:
        self._sync(train_state)
        self._fire("on_train_begin", model=train_state.model, processing_class=train_state.tokenizer,
                   optimizer=train_state.optimizer, lr_scheduler=train_state.scheduler)

    def step_end(self, train_state: Any, row: dict[str, Any]) -> bool:
        """Record the step's row, fire on_step_end and on_log; True when a callback asked to stop."""
        self._sync(train_state)
        logs = {**row, **trl_names(row), "epoch": self.state.epoch}
        self.state.log_history.append(logs)
        self._fire("on_step_end", model=train_state.model, metrics=row)
        self._fire("on_log", logs=logs)
        if self._saved is not None:
            self._fire("on_save", checkpoint=self._saved)
            self._saved = None
        return bool(self.control.should_training_stop)

    def evaluate(self, row: dict[str, Any]) -> dict[str, Any]:
        """Fire on_evaluate with an evaluation's row (eval.jsonl's) plus what reward functions sent to
        log_metric during it; the row is returned as it came (for the trackers)."""
        during = {**self.step_metrics(), **self.step_extras()}   # logged while this evaluation scored
        if row:  # other ranks evaluate nothing
            full = {**row, **during}
            logged = {f"eval_{k}": v for k, v in full.items() if k not in ("tag", "step")}
            self.state.log_history.append({**logged, "step": row.get("step", self.state.global_step)})
            self._fire("on_evaluate", metrics=full)
        return row

    def observe(self, step: int, rollout: Any, scores: Any, advantages: Any, correct: Any = None) -> None:
        """A step's batch (the `grpokit.observe.tracking.Tracker.observe` arguments); nothing to do here
        (`grpokit.trl.logs.TRLHooks` keeps TRL's completions table from it)."""

    def save(self, path: Any) -> None:
        """A checkpoint was written during the step: on_save fires after on_step_end, as in transformers."""
        self._saved = str(path)

    def train_end(self, train_state: Any) -> None:
        self._sync(train_state)
        self._fire("on_train_end", model=train_state.model, processing_class=train_state.tokenizer)


def trl_names(row: dict[str, Any]) -> dict[str, float]:
    """TRL's names for the row's values: reward, kl, ..., and rewards/<func>/mean for each function."""
    out = {trl: row[ours] for trl, ours in TRL_NAMES.items() if ours in row}
    for key, value in row.items():
        per_func = key.startswith("rewards/") and key.count("/") == 1
        if per_func and isinstance(value, float) and math.isfinite(value):
            out[f"{key}/mean"] = value
    return out


class Observers:
    """Several step observers (a Tracker, the callbacks' hooks) as the one `tracker` a step takes."""

    def __init__(self, *observers: Any) -> None:
        self.observers = observers

    def observe(self, *args: Any, **kwargs: Any) -> None:
        for o in self.observers:
            o.observe(*args, **kwargs)
