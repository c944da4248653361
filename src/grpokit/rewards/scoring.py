"""Reward functions and their weighted sum: block [B] of the DeepSeekMath chapter.

A reward function follows TRL's convention, so TRL reward functions work unchanged; it is called by
keyword, as TRL calls it (``async def`` functions of a batch run concurrently):

    def my_reward(prompts, completions, **kwargs) -> list[float | None]

`completions` holds one string (or one chat message list) per completion; dataset columns arrive
as keyword lists aligned with it (``answer=[...]``), with ``completion_ids`` and the trainer's
extras (``max_completion_length``, ...). ``None`` means "no opinion on this completion".

A process reward function (``fn.process = True``) returns, per completion, a list of
``(end_token_index, reward)`` pairs, one per reasoning step (DeepSeekMath section 4.1.3); those
go to `RewardBatch.step_rewards`, not into the outcome total.

Built-ins (`REWARDS`): accuracy, format, rule (the chapter's 0 / 0.5 / 1.5 rule), length / overlong
(DAPO soft overlong punishment) and steps (an exact arithmetic step verifier).

How one function is called over a batch and its output checked (`RewardError`, per-completion
retry, score checks) lives in `grpokit.rewards.calls`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpokit.config.code_checks import CODE_REWARDS  # grpokit.rewards.code: run in the sandbox
from grpokit.config.sections import RewardConfig
from grpokit.rewards.answers import answers_match, extract_answer, extract_boxed
from grpokit.rewards.calls import (
    RewardError,
    _as_text,
    _call,
    _one_line,
    _score,
    _steps,
    completions_as_messages,
    need,
    run_async_batches,
)
from grpokit.rewards.code import code_rewards, runner_for
from grpokit.rewards.outcome_rm import load_reward_model
from grpokit.rewards.shaping import overlong_reward, steps_reward
from grpokit.rewards.steps import token_char_ends  # noqa: F401  (part of this module's API)

log = logging.getLogger("grpokit")


def _per_completion(value: Any, n: int) -> list:
    """A keyword that may be one value for the batch or one per completion, as a list of n."""
    return list(value) if isinstance(value, (list, tuple)) and len(value) == n else [value] * n


# ---------------------------------------------------------------------------------------------
# Outcome rewards
# ---------------------------------------------------------------------------------------------

def _has_box(text: str) -> bool:
    boxed = extract_boxed(text)
    return boxed is not None and bool(boxed.strip())


def rule_reward(response: str, ground_truth: str) -> float:
    """The chapter's rule: 0.5 for a non-empty ``\\boxed{...}``, 1.0 more if the last one is right.

    Numbers compare numerically (tolerance 0.01; commas, ``$`` and spaces ignored); other answers
    by normalized string, then math-verify. An empty box earns nothing, so ``\\boxed{}`` is not a
    shortcut to the format half.

    Args:
        response: the completion text.
        ground_truth: the reference final answer.

    Returns:
        0.0, 0.5 or 1.5.
    """
    boxed = extract_boxed(response)
    if boxed is None or not boxed.strip():
        return 0.0
    return 1.5 if answers_match(boxed, str(ground_truth), tol=0.01) else 0.5


def rule_rewards(prompts: list, completions: list, answer: list | None = None, **kwargs: Any) -> list[float]:
    """`rule_reward` over a batch (TRL signature; reads the ``answer`` column)."""
    answers = need(answer, "answer", "rule", "reference answers, a dataset column")
    return [rule_reward(_as_text(c), str(a)) for c, a in zip(completions, answers)]


def accuracy_reward(prompts: list, completions: list, answer: list | None = None,
                    **kwargs: Any) -> list[float]:
    """1.0 when the final answer (last box; else ``#### x`` / ``The answer is x``) is right, else 0.0."""
    answers = need(answer, "answer", "accuracy", "reference answers, a dataset column")
    return [1.0 if answers_match(extract_answer(_as_text(c)) or "", str(a)) else 0.0
            for c, a in zip(completions, answers)]


_R1 = re.compile(r"\s*<think>(?P<think>.*?)</think>(?P<answer>.*)", re.DOTALL)


def _r1_format_ok(text: str) -> bool:
    m = _R1.fullmatch(text)
    if m is None or "<think>" in m["think"] or "think>" in m["answer"]:
        return False
    return bool(m["think"].strip()) and _has_box(m["answer"])


def format_reward(prompts: list, completions: list, task_format: str | list = "boxed",
                  **kwargs: Any) -> list[float]:
    """1.0 when the completion has the requested shape, else 0.0.

    ``boxed``: a non-empty ``\\boxed{...}``. ``r1``: ``<think>reasoning</think>`` first (one pair,
    non-empty), then an answer holding a non-empty box. `task_format` is the trainer's
    ``task.format`` (see `reward_kwargs`).
    """
    formats = _per_completion(task_format, len(completions))
    return [1.0 if (_r1_format_ok(t) if f == "r1" else _has_box(t)) else 0.0
            for t, f in zip(map(_as_text, completions), formats)]


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

REWARDS: dict[str, Callable] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "rule": rule_rewards,
    "length": overlong_reward,
    "overlong": overlong_reward,
    "steps": steps_reward,
}




def correctness(per_func: dict[str, torch.Tensor], prompts: list, completions: list,
                columns: dict[str, list]) -> torch.Tensor | None:
    """[N] whether each completion is right (NaN: cannot tell; None: the task has no notion of it): the
    accuracy reward's scores; for a code task (a 'tests' column) every test passed (code_all, else
    code_tests == 1); else the boxed answer checked against the 'answer' column."""
    if "accuracy" in per_func:
        return per_func["accuracy"]
    if "tests" in columns:
        if "code_all" in per_func:
            return per_func["code_all"]
        share = per_func.get("code_tests")
        return None if share is None else torch.where(share.isnan(), share, (share == 1).float())
    if "answer" not in columns:
        return None
    acc = accuracy_reward(prompts, completions, **columns)
    return torch.tensor([math.nan if a is None else float(a) for a in acc])


def _import_module(spec: str, name: str) -> Any:
    try:
        if spec.endswith(".py"):  # a file: 'my_rewards.py:fn'
            path = Path(spec).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules.setdefault(path.stem, module)
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
            return module
        return importlib.import_module(spec)
    except Exception as e:  # a broken user module should name itself, not crash the CLI
        raise RewardError(f"reward '{name}': cannot import '{spec}' ({type(e).__name__}: {_one_line(e)}); "
                          f"check the name and that it is importable (PYTHONPATH)") from None


def get_reward_function(name: str, *, rm: Any = None, policy_device: Any = None) -> Callable:
    """A reward function by built-in name, import path or learned reward model.

    Args:
        name: a key of `REWARDS`, ``'package.module:function'``, ``'path/to/file.py:function'``,
            ``'rm:PATH'`` (a reward-model folder: `grpokit.rewards.outcome_rm.load_reward_model`, outcome or
            process) or a bare folder (the same).
        rm: the `grpokit.config.schema.RMConfig` a reward model is loaded with (None: its defaults).
        policy_device: where the policy runs (rm.device=auto puts the reward model there).

    Returns:
        The callable.

    Raises:
        RewardError: one line naming what was not found.
    """
    if name in REWARDS:
        return REWARDS[name]
    if name in CODE_REWARDS:   # a pool of its own, sized by RewardConfig's defaults
        return code_rewards(runner_for(RewardConfig()))[name]
    if name.startswith("rm:"):  # a learned reward model folder
        return load_reward_model(name[3:], rm, policy_device=policy_device)
    if Path(name).expanduser().is_dir():  # a reward model folder without the prefix
        return load_reward_model(name, rm, policy_device=policy_device)
    if ":" not in name:
        close = difflib.get_close_matches(name, [*REWARDS, *CODE_REWARDS], n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise RewardError(f"unknown reward '{name}'{hint}: use one of {', '.join([*REWARDS, *CODE_REWARDS])} "
                          f"or an import path 'package.module:function'")
    spec, _, attr = name.rpartition(":")
    obj = _import_module(spec, name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardError(f"reward '{name}': '{spec}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardError(f"reward '{name}': '{attr}' is a {type(obj).__name__}, not a function")
    return obj


def build_reward_funcs(cfg: Any,
                       policy_device: torch.device | None = None) -> list[tuple[str, Callable, float]]:
    """(name, function, weight) per reward.funcs entry of a `grpokit.config.schema.GRPOConfig`; an
    'rm:PATH' reward model is loaded with cfg.rm, on the policy's device when rm.device=auto; the code
    rewards share one sandbox pool sized by reward.sandbox* (grpokit.rewards.code)."""
    code: dict[str, Callable] = {}
    if set(cfg.reward.funcs) & set(CODE_REWARDS):
        code = code_rewards(runner_for(cfg.reward))          # one sandbox pool for all of them
    funcs = [(name, code.get(name) or get_reward_function(name, rm=cfg.rm, policy_device=policy_device),
              float(w)) for name, w in cfg.reward.funcs.items()]
    if cfg.reward.overlong_buffer > 0 and "overlong" not in cfg.reward.funcs:
        funcs.append(("overlong", get_reward_function("overlong"), 1.0))  # DAPO soft overlong punishment
    return funcs


def reward_kwargs(cfg: Any) -> dict[str, Any]:
    """The config values built-in rewards read, as keywords for `score_responses`.

        score_responses(funcs, prompts, completions, columns, completion_ids=ids, **reward_kwargs(cfg))

    Args:
        cfg: a `grpokit.config.schema.GRPOConfig`.
    """
    return {"max_completion_length": cfg.rollout.max_completion_length,
            "overlong_buffer": cfg.reward.overlong_buffer, "overlong_penalty": cfg.reward.overlong_penalty,
            "task_format": cfg.task.format, "step_correct_reward": cfg.reward.step_correct_reward,
            "step_wrong_reward": cfg.reward.step_wrong_reward}


# ---------------------------------------------------------------------------------------------
# Scoring: every function over a batch, then the weighted sum
# ---------------------------------------------------------------------------------------------

@dataclass
class RewardBatch:
    """Rewards of one generation batch of N = B * G completions."""

    total: torch.Tensor  # [N] float32: sum_k w_k * r_k over functions that scored it; NaN = excluded
    per_func: dict[str, torch.Tensor]  # name -> [N] float32 raw scores, NaN where None (process: step sum)
    num_errors: int  # completions excluded because a function raised under reward_errors='skip'
    step_rewards: list[list[tuple[int, float]]] | None  # weighted (end_token_index, r) per completion
    metrics: dict[str, float] = field(default_factory=dict)  # the functions' batch figures (code/...)


def _warn_unscored(i: int, prompts: list, completions: list, count: int) -> None:
    log.warning("All reward functions returned None for the following kwargs: prompt=%.80r, completion=%.80r "
                "(completion %d, one of %d such in this batch): it is left out of its group; make at least "
                "one reward function return a number", prompts[i], completions[i], i, count)


def score_responses(reward_funcs: Sequence[tuple[str, Callable, float]], prompts: list, completions: list,
                    columns: dict[str, list], reward_errors: str = "raise", **extra: Any) -> RewardBatch:
    """[B] Score N completions with every reward function and sum them with their weights.

        r_i = sum_k w_k * r_k,i   over the functions k that scored completion i (None abstains)

    A completion every function abstained on gets NaN (excluded from its group's statistics); so
    does one on which a function raised under ``reward_errors='skip'``. Process functions
    (``fn.process``) add weighted steps to `step_rewards` instead of the total; with no outcome
    function the total is 0, the signal then being the steps.

    Args:
        reward_funcs: (name, function, weight) triples; functions from `get_reward_function`.
        prompts: the N prompts (each repeated for its G completions).
        completions: the N completion texts (or chat message lists); for a chat prompt a text is passed
            to the functions as [{'role': 'assistant', 'content': text}], as TRL does.
        columns: dataset columns, each a list of N values (``answer`` at least for the built-ins).
        reward_errors: 'raise' (RewardError naming the function, completion and cause) or 'skip'.
        **extra: further keywords for every function (completion_ids, max_completion_length, ...).

    Returns:
        A `RewardBatch`.

    Raises:
        RewardError: a function raised (with 'raise'), returned a wrong-length list, NaN or inf.
    """
    n = len(completions)
    if reward_errors not in ("raise", "skip"):
        raise RewardError(f"reward_errors must be 'raise' or 'skip', got {reward_errors!r}")
    if len(prompts) != n:
        raise RewardError(f"{len(prompts)} prompts for {n} completions: "
                          "repeat each prompt once per completion")
    for key, values in columns.items():
        if len(values) != n:
            raise RewardError(f"column '{key}' has {len(values)} values for {n} completions: "
                              f"repeat each prompt's columns once per completion")
    kwargs = {**columns, **extra}
    ids = kwargs.get("completion_ids")
    lengths = [len(x) for x in ids] if isinstance(ids, (list, tuple)) and len(ids) == n else [None] * n
    failed: set[int] = set()
    per_func: dict[str, torch.Tensor] = {}
    weighted: list[torch.Tensor] = []
    step_rewards: list[list[tuple[int, float]]] | None = None
    completions = completions_as_messages(prompts, completions)  # chat prompts: TRL's message completions
    awaited = run_async_batches([fn for _, fn, _ in reward_funcs], prompts, completions, kwargs)
    metrics: dict[str, float] = {}
    for (name, fn, weight), batch_out in zip(reward_funcs, awaited):
        out, errors = _call(name, fn, prompts, completions, kwargs, reward_errors, batch_out)
        failed |= errors
        metrics.update(getattr(fn, "batch_metrics", dict)())   # e.g. the sandbox's outcomes
        if getattr(fn, "process", False):
            steps = [_steps(name, v, i, lengths[i]) for i, v in enumerate(out)]
            if step_rewards is None:
                step_rewards = [[] for _ in range(n)]
            for i, pairs in enumerate(steps):
                step_rewards[i].extend((t, weight * r) for t, r in pairs)
            raw = [math.nan if i in errors else sum(r for _, r in pairs) for i, pairs in enumerate(steps)]
            per_func[name] = torch.tensor(raw, dtype=torch.float32)
            continue
        scores = torch.tensor([_score(name, v, i, completions[i]) for i, v in enumerate(out)],
                              dtype=torch.float32)  # [N]
        per_func[name] = scores
        weighted.append(scores * weight)
    if weighted:
        stacked = torch.stack(weighted)  # [F, N]
        total = torch.nansum(stacked, dim=0)
        unscored = torch.isnan(stacked).all(dim=0)
        total[unscored] = math.nan
        if bool(unscored.any()):
            _warn_unscored(int(unscored.nonzero()[0]), prompts, completions, int(unscored.sum()))
    else:
        total = torch.zeros(n, dtype=torch.float32)
    for i in failed:  # excluded from its group's statistics, steps included
        total[i] = math.nan
        if step_rewards is not None:
            step_rewards[i] = []
    return RewardBatch(total, per_func, len(failed), step_rewards, metrics)
