"""Calling reward functions and checking what they return, for `grpokit.rewards.scoring.score_responses`.

Holds `RewardError` (one line naming the function, the completion and the cause), the call of one
function over a batch that, when the batch raises, retries each completion alone to find the
culprit (reward_errors='raise') or drop it (reward_errors='skip'), and the checks of each returned
value: a list of one score per completion, a finite float or None, and for process functions
(end_token_index, reward) pairs inside the completion.

Functions are called as TRL calls them, by keyword: ``fn(prompts=..., completions=..., **kwargs)``,
so TRL's own rewards (``think_format_reward(completions, **kwargs)``) receive what their names say.
``async def`` functions of one batch are awaited together (`run_async_batches`), so three that each
wait 0.2 s on a server take 0.2 s, not 0.6 s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch


class RewardError(ValueError):
    """A reward function failed or misbehaved; the message is one line naming it."""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _as_text(completion: Any) -> str:
    """A completion as text: TRL passes chat completions as [{'role': 'assistant', 'content': ...}]."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def _short(completion: Any) -> str:
    text = _as_text(completion)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def is_conversational(prompt: Any) -> bool:
    """A chat prompt: a list of {'role', 'content'} messages (TRL's conversational format)."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "role" in m
                                                             for m in prompt)


def completions_as_messages(prompts: list, completions: list) -> list:
    """TRL's completions: for a chat prompt, the text as [{'role': 'assistant', 'content': text}]."""
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) and is_conversational(p) else c
            for p, c in zip(prompts, completions)]


def _invoke(fn: Callable, **kwargs: Any) -> Any:
    """fn(**kwargs); an async function is run to completion."""
    out = fn(**kwargs)
    if not inspect.isawaitable(out):
        return out
    result = _run_coroutines([out])[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _run_coroutines(awaitables: list) -> list:
    """Await all at once; each result or the exception it raised (a running loop: in a helper thread)."""
    async def gather() -> list:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from inside an event loop (notebooks)
        return pool.submit(asyncio.run, gather()).result()


def need(value: Any, key: str, reward: str, what: str) -> Any:
    """A keyword a built-in reward cannot do without: RewardError naming it when it is missing."""
    if value is None:
        raise RewardError(f"reward '{reward}' needs the '{key}' keyword ({what}); pass it to score_responses")
    return value


def run_async_batches(funcs: list[Callable], prompts: list, completions: list,
                      kwargs: dict[str, Any]) -> list:
    """The batch calls of every ``async def`` function in `funcs`, awaited concurrently; per function its
    output, an exception it raised, or None for a plain function (called later, one after another)."""
    coros = {i: fn(prompts=prompts, completions=completions, **kwargs)
             for i, fn in enumerate(funcs) if inspect.iscoroutinefunction(fn)}
    done = dict(zip(coros, _run_coroutines(list(coros.values())))) if coros else {}
    return [done.get(i) for i in range(len(funcs))]


def _sample_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """The keywords of completion i alone: per-completion lists are cut to their i-th element."""
    out = {}
    for key, value in kwargs.items():
        per_completion = (isinstance(value, (list, tuple)) and len(value) == n) or (
            isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n)
        out[key] = value[i:i + 1] if per_completion else value
    return out


def _call(name: str, fn: Callable, prompts: list, completions: list, kwargs: dict[str, Any],
          reward_errors: str, awaited: Any = None) -> tuple[list, set[int]]:
    """fn over the batch (by keyword, as TRL calls it); if it raises, once per completion to find (raise)
    or drop (skip) the culprits. `awaited`: the batch output of an async fn, already awaited."""
    n = len(completions)
    try:
        if isinstance(awaited, BaseException):
            raise awaited
        out = (awaited if awaited is not None
               else _invoke(fn, prompts=prompts, completions=completions, **kwargs))
        return _check_list(name, out, n), set()
    except RewardError:
        raise  # a misconfiguration (missing column, bad output), not a per-sample failure
    except Exception as batch_error:
        error = batch_error
    scores: list = [None] * n
    failed: set[int] = set()
    for i in range(n):
        try:
            one = _invoke(fn, prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                          **_sample_kwargs(kwargs, i, n))
            scores[i] = _check_list(name, one, 1)[0]
        except RewardError:
            raise
        except Exception as e:
            if reward_errors == "raise":
                raise RewardError(f"reward '{name}' failed on completion {i} {_short(completions[i])}: "
                                  f"{type(e).__name__}: {_one_line(e)}") from e
            failed.add(i)
    if reward_errors == "raise":  # only the whole batch fails: report the batch error
        raise RewardError(f"reward '{name}' failed on the batch of {n} completions (each alone succeeds): "
                          f"{type(error).__name__}: {_one_line(error)}") from error
    return scores, failed


def _check_list(name: str, out: Any, n: int) -> list:
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        raise RewardError(f"reward '{name}' returned {type(out).__name__}: return a list of {n} scores")
    if len(out) != n:
        raise RewardError(f"reward '{name}' returned {len(out)} scores for {n} completions: "
                          "return one per completion")
    return list(out)


def _score(name: str, value: Any, i: int, completion: Any) -> float:
    """One outcome score as a float (None -> NaN); anything else non-finite is an error."""
    if value is None:
        return math.nan
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise RewardError(f"reward '{name}' returned {type(value).__name__} for completion {i}: "
                          f"return a float, or None to abstain")
    score = float(value)
    if not math.isfinite(score):
        raise RewardError(f"reward '{name}' returned {score} for completion {i} {_short(completion)}: "
                          f"return a finite float, or None to abstain")
    return score


def _steps(name: str, value: Any, i: int, length: int | None) -> list[tuple[int, float]]:
    """One completion's process rewards as checked (token, reward) pairs."""
    if value is None:
        return []
    pairs = []
    for pair in value:
        try:
            token, reward = pair
        except (TypeError, ValueError):
            raise RewardError(f"reward '{name}' (process) gave {pair!r} for completion {i}: "
                              f"give (end_token_index, reward) pairs") from None
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (
                length is not None and token >= length):
            raise RewardError(f"reward '{name}' (process) gave token index {token!r} for completion {i} "
                              f"of {length} tokens: give an index into completion_ids")
        pairs.append((token, _score(name, reward, i, "")))
    return pairs
