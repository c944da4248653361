"""TRL's logs on grpokit's loop: `trainer.state.log_history` and `trainer._logs` as TRL's GRPOTrainer
keeps them (transformers' Trainer conventions), from grpokit's per-step metrics rows.

    every logging_steps   a row of TRL's metric names averaged over the steps since the last row (NaN
                          ignored; grad_norm and learning_rate: the latest), plus epoch and step
    every eval_steps      the evaluation's row (eval_loss, eval_reward, ...: grpokit.trl.evaluation)
    when train() ends     train_runtime, train_samples_per_second, train_steps_per_second, total_flos,
                          train_loss (the mean step loss of this call) and the steps' metrics since
                          the last row, then on_train_end
    _logs                 the latest generation batch: prompt, completion, rewards[<func>], advantages,
                          extra[<column>] (log_extra), images (always empty: text-only)

metrics.jsonl keeps every step with grpokit's own names.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from grpokit.core.policy_terms import CLIPPED
from grpokit.train.callbacks import TrainHooks

# TRL's name -> grpokit's metrics-row key, for every step
STEP_NAMES = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "learning_rate",
              "reward": "reward_mean", "reward_std": "reward_std", "frac_reward_zero_std": "frac_zero_std",
              "entropy": "entropy", "step_time": "time/step", "entropy_coef": "entropy_coef",
              "cispo_clip_ratio": "cispo_clip_ratio", "vespo/phi_seq_mean": "vespo/phi_seq_mean",
              "sampling/sampling_logp_difference/mean": "mismatch/abs_logprob_diff_mean",
              "sampling/sampling_logp_difference/max": "mismatch/abs_logprob_diff_max",
              "sampling/importance_sampling_ratio/mean": "tis/mean_weight",
              "tools/call_frequency": "tools/call_frequency",
              "tools/failure_frequency": "tools/failure_frequency"}
CLIP_NAMES = {"clip_ratio/low_mean": "clip_ratio_low", "clip_ratio/high_mean": "clip_ratio_high",
              "clip_ratio/region_mean": "clip_ratio"}
COMPLETION_NAMES = {"completions/mean_length": "completion_length_mean",
                    "completions/min_length": "completion_length_min",
                    "completions/max_length": "completion_length_max",
                    "completions/clipped_ratio": "frac_truncated",
                    "completions/mean_terminated_length": "completion_length_terminated_mean",
                    "completions/min_terminated_length": "completion_length_terminated_min",
                    "completions/max_terminated_length": "completion_length_terminated_max"}
# logged as the last value, not a mean
LATEST = ("grad_norm", "learning_rate", "num_tokens", "num_input_tokens_seen", "entropy_coef")
NOT_IN_FINAL_ROW = ("loss", "grad_norm", "learning_rate")              # transformers' own in step rows only


def trl_completion_metrics(stats: dict[str, float]) -> dict[str, float]:
    """TRL's completions/* names for `grpokit.observe.metrics.length_stats` figures."""
    return {trl: stats[ours] for trl, ours in COMPLETION_NAMES.items() if ours in stats}


def trl_step_metrics(row: dict[str, Any], loss_type: str, beta: float, custom: set[str]) -> dict[str, Any]:
    """One step's metrics under TRL's names (kl only with beta != 0, clip ratios for the clipped loss
    types, policy_loss with an entropy bonus), plus the reward functions' log_metric values."""
    names = {**STEP_NAMES, **COMPLETION_NAMES, **(CLIP_NAMES if loss_type in CLIPPED else {})}
    out = {trl: row[ours] for trl, ours in names.items() if ours in row}
    if beta != 0 and "approx_kl" in row:
        out["kl"] = row["approx_kl"]
    if "entropy_bonus" in row:               # TRL's policy_loss: the loss before the bonus is subtracted
        out["policy_loss"] = row["loss"] + row["entropy_bonus"]
    for key, value in row.items():
        if key.startswith("rewards/") and key.count("/") == 1:
            out[f"{key}/mean"] = value
        elif key.startswith("rewards/") and key.endswith("/std") and key.count("/") == 2:
            out[key] = value
    out.update({k: row[k] for k in custom if k in row})
    return out


def average(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """TRL's averaging of the steps since the last log row: the mean of the finite values (None when
    there is none); LATEST keys take the last value."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        finite = [float(v) for v in values if not math.isnan(float(v))]
        if key in LATEST:
            out[key] = values[-1] if values else None
        else:
            out[key] = sum(finite) / len(finite) if finite else None
    return out


class TRLHooks(TrainHooks):
    """grpokit's callback bridge with TRL's logging cadence, evaluation schedule and completions table.

    Args:
        cfg, callbacks, args: as `grpokit.train.callbacks.TrainHooks`.
        logging_steps: a row every N steps (transformers' logging_steps; 0: none but the last);
            logging_first_step: also at step 1.
        eval_steps: evaluate every N steps (0: never during training) from step eval_delay on;
            eval_on_start: also before step 1.
        evaluate: returns an evaluation's metrics (grpokit.trl.evaluation), or None without an eval set.
        table_size: rows kept in `logs` (TRL: the generation batch).
        completions_per_step: completions of one step (transformers' train_samples_per_second).
    """

    def __init__(self, cfg: Any, callbacks: list | None, args: Any, *, logging_steps: int,
                 eval_steps: int = 0, eval_delay: float = 0, eval_on_start: bool = False,
                 evaluate: Callable[[], dict] | None = None, logging_first_step: bool = False,
                 table_size: int = 8, completions_per_step: int = 8) -> None:
        super().__init__(cfg, callbacks, args=args)
        self.loss_type, self.beta = cfg.loss.loss_type, cfg.loss.beta
        self.num_iterations = cfg.loss.num_iterations
        self.logging_steps, self.logging_first_step = logging_steps, logging_first_step
        self.eval_steps, self.eval_on_start, self.evaluate_fn = eval_steps, eval_on_start, evaluate
        self.eval_delay = eval_delay
        self.completions_per_step = completions_per_step
        self.logs: dict[str, Any] = {"images": deque(maxlen=table_size), "prompt": deque(maxlen=table_size),
                                     "completion": deque(maxlen=table_size),
                                     "rewards": defaultdict(lambda: deque(maxlen=table_size)),
                                     "advantages": deque(maxlen=table_size),
                                     "extra": defaultdict(lambda: deque(maxlen=table_size))}
        self.custom: set[str] = set()        # names reward functions sent to log_metric
        self.train_metrics: dict[str, Any] = {}
        self._window: list[dict[str, Any]] = []
        self._losses: list[float] = []
        self._start, self._first_step = 0.0, 0

    # -- reward-function hooks: also TRL's table and metric names --------------------------------
    def log_metric(self, name: str, value: float) -> None:
        super().log_metric(name, value)
        self.custom.add(str(name))

    def log_extra(self, column: str, values: list) -> None:
        super().log_extra(column, values)
        self.logs["extra"][str(column)].extend(values)

    def observe(self, step: int, rollout: Any, scores: Any, advantages: Any, correct: Any = None) -> None:
        """The step's batch into `logs` (TRL's completions table)."""
        chat = [isinstance(p, list) for p in rollout.prompts]
        self.logs["prompt"].extend(rollout.prompts)
        self.logs["completion"].extend([{"role": "assistant", "content": c}] if is_chat else c
                                       for c, is_chat in zip(rollout.completions, chat))
        for name, values in scores.per_func.items():
            self.logs["rewards"][name].extend(values.tolist())
        self.logs["advantages"].extend(advantages.tolist())

    # -- events ---------------------------------------------------------------------------------
    def log(self, logs: dict[str, Any]) -> None:
        """transformers' Trainer.log: epoch added, a log_history row with the step, on_log fired."""
        logs["epoch"] = self.state.epoch
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self._fire("on_log", logs=logs)

    def log_evaluation(self, metrics: dict[str, Any] | None) -> None:
        """An evaluation's metrics (plus what reward functions logged during it) as a row; on_evaluate."""
        if metrics is None:
            return
        metrics.update({f"eval_{k}": v for k, v in self.step_metrics().items()})
        self.step_extras()                                # log_extra of the evaluation: only in `logs`
        self.log(metrics)
        self._fire("on_evaluate", metrics=metrics)

    def train_begin(self, train_state: Any) -> None:
        super().train_begin(train_state)
        self._start, self._first_step, self._losses = time.perf_counter(), train_state.step, []
        if self.eval_on_start and self.evaluate_fn is not None:
            self.log_evaluation(self.evaluate_fn())

    def step_end(self, train_state: Any, row: dict[str, Any]) -> bool:
        """A step's row: into the window, a TRL row every logging_steps, an evaluation every eval_steps."""
        self._sync(train_state)
        # the run's prompt + completion tokens (every rank, kept across a resume): TRL's num_tokens
        self.state.num_input_tokens_seen = int(row.get("input_tokens_seen", self.state.num_input_tokens_seen))
        self._losses.append(float(row.get("loss", math.nan)))
        tokens = {"num_tokens": float(self.state.num_input_tokens_seen)}
        if str(getattr(self.args, "include_num_input_tokens_seen", "no")) not in ("no", "False"):
            tokens["num_input_tokens_seen"] = tokens["num_tokens"]   # transformers' name, when asked
        self._window.append({**trl_step_metrics(row, self.loss_type, self.beta, self.custom), **tokens})
        self._fire("on_step_end", model=train_state.model, metrics=row)
        step = self.state.global_step
        if (self.logging_steps and step % self.logging_steps == 0) or (step == 1 and self.logging_first_step):
            self.log(average(self._window))
            self._window = []
        if (self.eval_steps and step % self.eval_steps == 0 and step >= self.eval_delay
                and self.evaluate_fn is not None):
            self.log_evaluation(self.evaluate_fn())
        if self._saved is not None:
            self._fire("on_save", checkpoint=self._saved)
            self._saved = None
        return bool(self.control.should_training_stop)

    def _total_flos(self, model: Any) -> float:
        """transformers' estimate (`floating_point_ops`): 6 x non-embedding parameters x tokens trained on
        (the prompt and completion tokens of every step, once per loss.num_iterations pass)."""
        count = getattr(model, "num_parameters", None)
        params = (count(exclude_embeddings=True) if callable(count)
                  else sum(p.numel() for p in model.parameters()))
        flos = 6.0 * params * self.state.num_input_tokens_seen * self.num_iterations
        self.state.total_flos = flos
        return flos

    def train_end(self, train_state: Any) -> None:
        """transformers' last row (runtime, throughput, train_loss, the steps since the last row), then
        on_train_end."""
        self._sync(train_state)
        runtime = time.perf_counter() - self._start
        steps = max(train_state.step - self._first_step, 0)
        finite = [x for x in self._losses if not math.isnan(x)]
        leftover = {k: v for k, v in average(self._window).items() if k not in NOT_IN_FINAL_ROW}
        self._window = []
        metrics = {"train_runtime": round(runtime, 4),
                   "train_samples_per_second": round(steps * self.completions_per_step / max(runtime, 1e-9),
                                                     3),
                   "train_steps_per_second": round(steps / max(runtime, 1e-9), 3),
                   "total_flos": self._total_flos(train_state.model),
                   "train_loss": sum(finite) / len(finite) if finite else math.nan}
        self.train_metrics = {**metrics, **leftover}
        self.log(self.train_metrics)
        self._fire("on_train_end", model=train_state.model, processing_class=train_state.tokenizer)
