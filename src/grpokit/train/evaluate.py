"""Evaluation on a held-out split: greedy pass@1, sampled pass@k, mean reward, format rate, length.

    grpokit eval                                   # the shipped demo checkpoint on 500 held-out problems
    grpokit eval --model runs/demo/final --limit 100 --samples 8 --k 1,4,8
    grpokit eval configs/smollm2_arith_cpu.yaml --limit 50 --out report.json

Greedy decoding (argmax, one completion per problem) gives `accuracy` = pass@1 and the figures the
trainer logs before, during and after training (`grpokit.train.loop._evaluate_and_log` calls
`evaluate`), so `grpokit eval` (grpokit.cli.eval) on the starting model reproduces the trainer's step-0
row exactly.

With `num_samples` n > 0, n completions per problem are also sampled at the rollout temperature and
pass@k is the unbiased estimator of Chen et al. (2021) averaged over problems:

    pass@k = E_problems[ 1 - C(n - c, k) / C(n, k) ],   c = correct samples among n, k <= n
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from grpokit import switch
from grpokit.config.schema import GRPOConfig
from grpokit.observe.agent_metrics import per_trajectory, trajectory_means
from grpokit.rewards.code import code_format
from grpokit.rewards.scoring import (
    REWARDS,
    build_reward_funcs,
    correctness,
    reward_kwargs,
    score_responses,
    token_char_ends,
)
from grpokit.rollout.groups import PromptTooLongError, prompt_log, sample_groups
from grpokit.train.preflight import prompt_tokens

log = logging.getLogger("grpokit")

EVAL_BATCH = 128  # problems decoded at once; fixed so train and `grpokit eval` batch identically


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n - c, k) / C(n, k).

    Computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i), which avoids huge binomials.

    Args:
        n: samples drawn (n >= k).
        c: correct samples among them (0 <= c <= n).
        k: the budget.

    Returns:
        The probability that at least one of k samples drawn without replacement from the n is correct.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}: lower k or raise the sample count")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _score(cfg: GRPOConfig, tokenizer, rollout, examples: Sequence, group_size: int,
           reward_funcs: list | None = None, reward_extra: dict | None = None) -> dict[str, torch.Tensor]:
    """Per-completion reward (the configured weighted sum), correctness (NaN without an answer column),
    format and each function's score (rewards/<name>): each [N]."""
    funcs = reward_funcs or build_reward_funcs(cfg)
    columns = {k: [ex.columns.get(k) for ex in examples for _ in range(group_size)]
               for k in examples[0].columns}
    ids = [row[m.bool()].tolist() for row, m in zip(rollout.completion_ids, rollout.completion_mask)]
    extra: dict[str, Any] = {**reward_kwargs(cfg), "completion_ids": ids, **(reward_extra or {})}
    if any(getattr(fn, "process", False) for _, fn, _ in funcs):
        extra["completion_char_ends"] = [token_char_ends(tokenizer, row) for row in ids]
    extra = {k: v for k, v in extra.items() if k not in columns}  # a column wins (task_format is one)
    scores = score_responses(funcs, rollout.prompts, rollout.completions, columns,
                             reward_errors=cfg.reward.reward_errors, **extra)
    # a TRL dataset needs no answer column; a code task is right when every test passes
    correct = correctness(scores.per_func, rollout.prompts, rollout.completions, columns)
    if correct is None:
        correct = torch.full((len(rollout.completions),), math.nan)
    fmt = code_format if "tests" in columns else REWARDS["format"]
    formatted = fmt(rollout.prompts, rollout.completions, **columns)
    return {**{f"rewards/{k}": v for k, v in scores.per_func.items()},
            "reward": scores.total, "correct": correct.float(),
            "format": torch.tensor(formatted, dtype=torch.float32),
            "length": rollout.completion_mask.sum(-1).float().cpu(),
            "truncated": rollout.truncated.float().cpu(), **per_trajectory(rollout)}


def decode_and_score(model, tokenizer, examples: Sequence, cfg: GRPOConfig, group_size: int, *, greedy: bool,
                     progress: bool, desc: str, reward_funcs: list | None = None,
                     reward_extra: dict | None = None, agent=None) -> dict[str, torch.Tensor]:
    """Decode `group_size` completions per example in fixed batches and score them; tensors [N].

    agent: tools and environments (`grpokit.agents.agent.Agent`): multi-turn, on its evaluation pool."""
    from tqdm import tqdm

    r = cfg.rollout
    parts: list[dict[str, torch.Tensor]] = []
    batch = max(1, EVAL_BATCH // group_size)
    for s in tqdm(range(0, len(examples), batch), desc=desc, disable=not progress, leave=False,
                  dynamic_ncols=True):
        chunk = examples[s:s + batch]
        with switch.accelerated(model):     # grpokit's optional CPU speed-ups (the fast decoder's kernels)
            if agent is not None:
                rollout = agent.sample(model, tokenizer, chunk, group_size, cfg, greedy=greedy,
                                       evaluation=True)
            else:
                rollout = sample_groups(model, tokenizer, [ex.prompt for ex in chunk], group_size,
                                        r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                                        top_k=r.top_k, max_prompt_length=r.max_prompt_length,
                                        truncate_prompt=r.truncate_prompt, backend=r.backend, greedy=greedy,
                                        chat_template_kwargs=cfg.task.chat_template_kwargs)
        parts.append(_score(cfg, tokenizer, rollout, chunk, group_size, reward_funcs,
                            {**(reward_extra or {}), **rollout.reward_kwargs}))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def evaluate(model, tokenizer, examples: Sequence, cfg: GRPOConfig, *, limit: int = -1, num_samples: int = 0,
             ks: Sequence[int] = (1,), seed: int = 0, progress: bool | None = None,
             reward_funcs: list | None = None, reward_extra: dict | None = None,
             agent=None) -> dict[str, float]:
    """Greedy (and optionally sampled) evaluation of `model` on the first `limit` examples.

    Args:
        model: a causal LM (its train/eval mode is restored afterwards).
        tokenizer: its tokenizer (left padding).
        examples: held-out `grpokit.tasks.Example`s (prompt, answer, columns).
        cfg: the run config: rollout.* (length limits, temperature, top_p/top_k for sampling), reward.*.
        limit: evaluate the first `limit` examples; -1 (or 0) = all of them.
        num_samples: n completions sampled per problem for pass@k; 0 = greedy only.
        ks: the k of each pass@k (each <= num_samples).
        seed: sampling seed (the caller's RNG state is left untouched).
        progress: show a progress bar (default: cfg.run.progress).
        reward_funcs: (name, fn, weight) triples to score with; None: cfg.reward.funcs.
        reward_extra: more keywords for every reward call (TRL's trainer_state, log_metric, log_extra).
        agent: tools and environments (`grpokit.agents.agent.Agent`): each problem is a multi-turn episode on
            the agent's evaluation pool (re-seeded here: every evaluation plays the same episodes); the
            result then also has turns_mean, tool_calls_mean and tool_error_rate.

    Returns:
        {num_problems, accuracy (greedy pass@1), reward_mean, format_rate, completion_length_mean,
        frac_truncated}; with sampling also sampled_accuracy, sampled_reward_mean,
        sampled_format_rate, sampled_completion_length_mean and pass@k for each k.
    """
    if not examples:
        raise ValueError("evaluate() got no examples: check task.eval_split")
    examples = list(examples if limit is None or limit <= 0 else examples[:limit])
    if num_samples and any(not 1 <= k <= num_samples for k in ks):
        raise ValueError(f"every k must be in [1, num_samples={num_samples}], got {list(ks)}: "
                         "lower k or raise --samples")
    progress = cfg.run.progress if progress is None else progress
    check_prompt_lengths(tokenizer, examples, cfg)  # one line for every batch: the sampler's own are muted
    if reward_funcs is None:  # built once: an rm: reward model is loaded once, on the policy's device
        reward_funcs = build_reward_funcs(cfg, next(model.parameters()).device)
        reward_funcs += agent.reward_funcs if agent is not None else []
    if agent is not None and agent.eval_pool is not None:
        agent.eval_pool.reseed()
    with _muted(prompt_log):
        greedy = decode_and_score(model, tokenizer, examples, cfg, 1, greedy=True, progress=progress,
                                  desc="eval greedy", reward_funcs=reward_funcs, reward_extra=reward_extra,
                                  agent=agent)
    out = {"num_problems": float(len(examples)), "accuracy": float(greedy["correct"].mean()),
           **{k: float(torch.nanmean(v)) for k, v in greedy.items() if k.startswith("rewards/")},
           "reward_mean": float(torch.nanmean(greedy["reward"])),
           "format_rate": float(greedy["format"].mean()),
           "completion_length_mean": float(greedy["length"].mean()),
           "frac_truncated": float(greedy["truncated"].mean()), **trajectory_means(greedy)}
    if num_samples:
        with torch.random.fork_rng(devices=[]), _muted(prompt_log):
            torch.manual_seed(seed)
            sampled = decode_and_score(model, tokenizer, examples, cfg, num_samples, greedy=False,
                                       progress=progress, desc="eval sampled", reward_funcs=reward_funcs,
                                       reward_extra=reward_extra, agent=agent)
        c = sampled["correct"].view(len(examples), num_samples).sum(-1)   # [problems] correct samples
        out.update({"num_samples": float(num_samples), "sampled_accuracy": float(sampled["correct"].mean()),
                    "sampled_reward_mean": float(torch.nanmean(sampled["reward"])),
                    "sampled_format_rate": float(sampled["format"].mean()),
                    "sampled_completion_length_mean": float(sampled["length"].mean())})
        for k in ks:
            out[f"pass@{k}"] = sum(pass_at_k(num_samples, int(ci), k) for ci in c) / len(examples)
    return out


def check_prompt_lengths(tokenizer, examples: Sequence, cfg: GRPOConfig) -> None:
    """Prompts longer than rollout.max_prompt_length: one line for the whole evaluation.

    With rollout.truncate_prompt=error (what `grpokit eval` uses unless --allow-truncation) that
    line is a `PromptTooLongError`, before anything is decoded: a score on cut questions is not the
    score of the task. With "left" (training's in-loop evaluation) it is one warning saying so.
    """
    limit = cfg.rollout.max_prompt_length
    lengths = [prompt_tokens(tokenizer, ex.prompt, cfg.task.chat_template_kwargs) for ex in examples]
    long = [n for n in lengths if n > limit]
    if not long:
        return
    what = (f"{len(long)} of {len(lengths)} evaluation prompts have more than "
            f"rollout.max_prompt_length={limit} tokens (longest {max(long)})")
    if cfg.rollout.truncate_prompt == "error":
        raise PromptTooLongError(f"{what}: raise rollout.max_prompt_length to {max(long)}, or let them be "
                                 "cut to their last tokens (grpokit eval --allow-truncation)")
    log.warning("%s: each keeps its last %d tokens, so these figures are for cut questions; raise "
                "rollout.max_prompt_length to %d to evaluate them whole", what, limit, max(long))


@contextlib.contextmanager
def _muted(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
