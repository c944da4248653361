"""Reward-model samples: read and check jsonl files, label completions, collect them from a policy.

    samples = read_samples("samples.jsonl", kind="outcome", step_separator="\\n")    # list[RMSample]
    samples = label_samples(prompts, completions, answers, groups, kind="process", step_separator=". ")
    train, held_out = split_by_group(samples, share=0.2, generator=torch.Generator().manual_seed(0))

A jsonl file holds one of three row kinds (they may be mixed):

    pointwise  {"prompt", "completion", "label": 0|1, "step_labels": [0|1, ...]?, "group": str?}
    pairwise   {"prompt", "chosen", "rejected", "group": str?}   -> two samples (label 1 and 0) of one group
    log        a `grpokit train` completions.jsonl row {"prompt", "answer", "completions": [{"text"}, ...]},
               labeled here by the answer checker (and the step verifier for process RMs)

`group` names the problem (default: `grpokit.observe.tracking.prompt_id` of the prompt): held-out splits
are by group, and pairwise training pairs a right with a wrong completion of one group. Labels come from
`grpokit.rewards.scoring.accuracy_reward` (outcome) and, per step, from the arithmetic verifier or from
Monte Carlo rollouts from each step prefix (Math-Shepherd's hard estimate: a step is good when one of
rm.mc_rollouts continuations reaches the right answer; the last step is labeled by the answer itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit import switch
from grpokit.errors import UserError, written_aside
from grpokit.observe.tracking import prompt_id
from grpokit.rewards.rm_text import completion_text, split_steps
from grpokit.rewards.scoring import accuracy_reward
from grpokit.rewards.steps import check_steps
from grpokit.rollout.groups import sample_groups

KINDS = ("outcome", "process")
STEP_LABELS = ("verifier", "mc")
# (prompts, step prefixes) -> for each prefix, the texts of the continuations sampled from it
RolloutFn = Callable[[Sequence[Any], Sequence[str]], list[list[str]]]


class RMDataError(UserError):
    """Reward-model samples that cannot be used (a bad jsonl row, no pairs, an over-long input)."""


@dataclass
class RMSample:
    """One labeled completion: what a reward model is trained and evaluated on."""

    prompt: str | list[dict]            # text, or chat messages rendered by the RM's chat template
    completion: str
    label: float                        # 1.0 when the final answer is right, else 0.0
    step_labels: list[float] | None = None  # process: one 0/1 per split_steps span of the completion
    group: str = ""                     # the problem's id: held-out splits and pairs stay inside it


# ---------------------------------------------------------------------------------------------
# Reading jsonl files
# ---------------------------------------------------------------------------------------------

def _bad(where: str, what: str) -> RMDataError:
    return RMDataError(f"{where}: {what}")


def _prompt(row: dict, where: str) -> str | list[dict]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        return prompt
    raise _bad(where, "field 'prompt' is missing or not a string / list of chat messages")


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if isinstance(value, list):  # a chat completion: the assistant message
        value = completion_text(value)
    if not isinstance(value, str):
        raise _bad(where, f"field '{key}' is missing or not a string")
    return value


def _binary(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or value in (0, 1):
        return float(value)
    raise _bad(where, f"field '{key}' must be 0 or 1 (or true/false), got {json.dumps(value)}")


def _group(row: dict, prompt: Any, where: str) -> str:
    group = row.get("group", row.get("prompt_id") or prompt_id(prompt))  # a log row names its prompt_id
    if not isinstance(group, (str, int)) or isinstance(group, bool):
        raise _bad(where, "field 'group' must be a string (the problem's id)")
    return str(group)


def _step_labels(row: dict, completion: str, separator: str, where: str) -> list[float]:
    labels = row.get("step_labels")
    if not isinstance(labels, list):
        raise _bad(where, "field 'step_labels' (a list of 0/1, one per step) is missing: a process RM needs "
                   "it (grpokit rm collect --step-labels verifier|mc writes it)")
    steps = len(split_steps(completion, separator))
    if len(labels) != steps:
        raise _bad(where, f"field 'step_labels' has {len(labels)} values but the completion has {steps} "
                   f"steps split by {separator!r}: use the --step-separator the labels were made with")
    return [_binary(v, "step_labels", where) for v in labels]


def _row_samples(row: dict, where: str, kind: str, separator: str) -> list[RMSample]:
    prompt = _prompt(row, where)
    group = _group(row, prompt, where)
    if "completions" in row:  # a completions.jsonl log row: label it here
        if row.get("answer") is None:
            raise _bad(where, "log row has no 'answer': the checker needs the reference answer")
        texts = [c.get("text") if isinstance(c, dict) else c for c in row["completions"]] \
            if isinstance(row["completions"], list) else None
        if texts is None or not all(isinstance(t, str) for t in texts):
            raise _bad(where, "field 'completions' must be a list of {\"text\": ...} entries")
        return label_samples([prompt] * len(texts), texts, [row["answer"]] * len(texts), [group] * len(texts),
                             kind=kind, step_separator=separator)
    if "chosen" in row or "rejected" in row:
        if kind == "process":
            raise _bad(where, "a pairwise row (chosen/rejected) has no step labels: "
                       "train it with --kind outcome")
        return [RMSample(prompt, _text(row, "chosen", where), 1.0, None, group),
                RMSample(prompt, _text(row, "rejected", where), 0.0, None, group)]
    completion = _text(row, "completion", where)
    if "label" not in row:
        raise _bad(where, "field 'label' (0 or 1) is missing (or give chosen/rejected for a pairwise row)")
    label = _binary(row["label"], "label", where)
    steps = _step_labels(row, completion, separator, where) if kind == "process" else None
    return [RMSample(prompt, completion, label, steps, group)]


def read_samples(path: str | Path, *, kind: str, step_separator: str) -> list[RMSample]:
    """Every sample of a jsonl file (pointwise, pairwise and completions-log rows, see the module doc).

    Raises:
        RMDataError: naming the file, the line and the missing or invalid field.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    if path.is_dir():
        raise RMDataError(f"--data '{path}' is a folder: give a .jsonl file")
    samples: list[RMSample] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{path} line {number}"
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise _bad(where, "is not UTF-8 text: save the file as UTF-8") from None
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(where, f"is not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(row, dict):
                raise _bad(where, f"must be a JSON object, not {type(row).__name__}")
            samples.extend(_row_samples(row, where, kind, step_separator))
    if not samples:
        raise RMDataError(f"{path} holds no samples: write one JSON row per line")
    return samples


def write_samples(path: str | Path, samples: Sequence[RMSample]) -> Path:
    """Pointwise jsonl rows (written aside, then renamed): prompt, completion, label, group, step_labels."""
    path = Path(path)
    with written_aside(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for s in samples:
            row: dict[str, Any] = {"prompt": s.prompt, "completion": s.completion, "label": int(s.label),
                                   "group": s.group}
            if s.step_labels is not None:
                row["step_labels"] = [int(v) for v in s.step_labels]
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def keep_groups(samples: Sequence[RMSample], n: int, generator: torch.Generator) -> list[RMSample]:
    """The samples of `n` groups (problems) chosen at random, whole, in their file order (all when n <= 0
    or the data has no more): a smaller training set that keeps every kept problem's samples together."""
    groups = list(dict.fromkeys(s.group for s in samples))
    if n <= 0 or n >= len(groups):
        return list(samples)
    kept = {groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()[:n]}
    return [s for s in samples if s.group in kept]


def split_by_group(samples: Sequence[RMSample], share: float,
                   generator: torch.Generator) -> tuple[list[RMSample], list[RMSample]]:
    """(train, held_out): a random `share` of the groups (problems) is held out, whole; no group is in both.

    Raises:
        RMDataError: fewer than two groups while a held-out share is asked for.
    """
    if share <= 0:
        return list(samples), []
    groups = list(dict.fromkeys(s.group for s in samples))
    if len(groups) < 2:
        raise RMDataError(f"a held-out split needs at least 2 groups (problems), the data has {len(groups)}: "
                          "add samples of other prompts or pass --eval-share 0")
    n_held = min(len(groups) - 1, max(1, round(share * len(groups))))
    order = torch.randperm(len(groups), generator=generator).tolist()
    held = {groups[i] for i in order[:n_held]}
    return [s for s in samples if s.group not in held], [s for s in samples if s.group in held]


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------

def verifier_step_labels(completion: str, spans: Sequence[tuple[int, int]],
                         answer_right: bool) -> list[float]:
    """Per step: 1 when every equation `check_steps` finds ending in it is right; the step holding the last
    \\boxed answer (the last step when there is none) is 1 only when, in addition, the answer is right."""
    equations = check_steps(completion)
    box = completion.rfind("\\boxed")
    answer_step = len(spans) - 1
    if box >= 0:
        answer_step = next((i for i, (s, e) in enumerate(spans) if s <= box < e), answer_step)
    labels = []
    for i, (start, end) in enumerate(spans):
        ok = all(eq.correct for eq in equations if start <= eq.end - 1 < end)
        labels.append(float(ok and (answer_right or i != answer_step)))
    return labels


def mc_step_labels(prompts: Sequence[Any], completions: Sequence[str], answers: Sequence[Any],
                   outcome: Sequence[float], *, step_separator: str,
                   rollout_fn: RolloutFn) -> list[list[float]]:
    """Math-Shepherd hard estimates: step j (not the last) is 1 when one of the continuations sampled from
    the prefix ending with step j reaches the right answer; the last step is the outcome label."""
    jobs = []  # (sample, step, prefix)
    spans = [split_steps(c, step_separator) for c in completions]
    for i, (completion, sp) in enumerate(zip(completions, spans)):
        jobs += [(i, j, completion[:end]) for j, (_, end) in enumerate(sp[:-1])]
    labels = [[0.0] * len(sp) for sp in spans]
    for i, sp in enumerate(spans):
        if sp:
            labels[i][-1] = float(outcome[i])
    if jobs:
        continuations = rollout_fn([prompts[i] for i, _, _ in jobs], [prefix for _, _, prefix in jobs])
        for (i, j, prefix), texts in zip(jobs, continuations):
            full = [prefix + t for t in texts]
            right = accuracy_reward([prompts[i]] * len(full), full, answer=[answers[i]] * len(full))
            labels[i][j] = float(max(right, default=0.0))
    return labels


def label_samples(prompts: Sequence[Any], completions: Sequence[Any], answers: Sequence[Any],
                  groups: Sequence[str], *, kind: str, step_labels: str = "verifier", step_separator: str,
                  rollout_fn: RolloutFn | None = None) -> list[RMSample]:
    """Label completions: outcome by the answer checker; process steps by the verifier or by rollouts.

    Args:
        prompts, completions, answers, groups: one entry per completion (a group is the problem's id).
        kind: "outcome" (no step labels) or "process".
        step_labels: "verifier" (`verifier_step_labels`) or "mc" (`mc_step_labels`, needs rollout_fn).
        step_separator: the text that ends a step (`grpokit.rewards.rm_text.split_steps`).
        rollout_fn: for "mc": (prompts, prefixes) -> continuations per prefix (see `policy_rollout_fn`).
    """
    if kind not in KINDS:
        raise RMDataError(f"unknown reward-model kind '{kind}': use outcome or process")
    if step_labels not in STEP_LABELS:
        raise RMDataError(f"unknown step labels '{step_labels}': use verifier or mc")
    texts = [completion_text(c) for c in completions]
    outcome = accuracy_reward(list(prompts), texts, answer=[str(a) for a in answers])
    steps: list[list[float] | None] = [None] * len(texts)
    if kind == "process" and step_labels == "mc":
        if rollout_fn is None:
            raise RMDataError("step labels 'mc' need a policy to sample continuations from (rollout_fn)")
        steps = list(mc_step_labels(prompts, texts, answers, outcome, step_separator=step_separator,
                                    rollout_fn=rollout_fn))
    elif kind == "process":
        steps = [verifier_step_labels(t, split_steps(t, step_separator), bool(o))
                 for t, o in zip(texts, outcome)]
    return [RMSample(p, t, float(o), s, str(g))
            for p, t, o, s, g in zip(prompts, texts, outcome, steps, groups)]


# ---------------------------------------------------------------------------------------------
# Collecting samples from a policy
# ---------------------------------------------------------------------------------------------

def _sample_texts(model, tokenizer, cfg, prompts: Sequence[Any], group_size: int, chunk: int) -> list[str]:
    """G sampled completions per prompt (the config's sampling settings), G of each prompt contiguous."""
    r, texts = cfg.rollout, []
    for s in range(0, len(prompts), chunk):
        with switch.accelerated(model):     # grpokit's optional CPU speed-ups (the fast decoder's kernels)
            rollout = sample_groups(model, tokenizer, list(prompts[s:s + chunk]), group_size,
                                    r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                                    top_k=r.top_k, max_prompt_length=r.max_prompt_length,
                                    truncate_prompt=r.truncate_prompt, backend=r.backend,
                                    chat_template_kwargs=cfg.task.chat_template_kwargs)
        texts += rollout.completions
    return texts


def policy_rollout_fn(model, tokenizer, cfg, num_rollouts: int, chunk: int = 64) -> RolloutFn:
    """A `RolloutFn` sampling `num_rollouts` continuations per step prefix from the policy."""
    def continue_from(prompts: Sequence[Any], prefixes: Sequence[str]) -> list[list[str]]:
        kwargs = cfg.task.chat_template_kwargs or {}
        heads = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **kwargs)
                 if isinstance(p, list) else p for p in prompts]
        starts = [h + x for h, x in zip(heads, prefixes)]
        texts = _sample_texts(model, tokenizer, cfg, starts, num_rollouts, chunk)
        return [texts[i * num_rollouts:(i + 1) * num_rollouts] for i in range(len(prefixes))]

    return continue_from


def collect_samples(model, tokenizer, cfg, examples: Sequence[Any], *, num_generations: int, kind: str,
                    step_labels: str = "verifier", chunk: int = 64) -> list[RMSample]:
    """Sample `num_generations` completions per example from the policy and label them.

    Args:
        model, tokenizer: the policy (sampling settings from cfg.rollout; RNG: torch's global generator).
        cfg: the GRPOConfig (rollout.*, task.chat_template_kwargs, rm.step_separator, rm.mc_rollouts).
        examples: `grpokit.tasks.Example`s (prompt and answer).
        kind, step_labels: as in `label_samples`.
    """
    prompts = [ex.prompt for ex in examples]
    texts = _sample_texts(model, tokenizer, cfg, prompts, num_generations, chunk)
    rep = [i for i in range(len(examples)) for _ in range(num_generations)]
    rollout_fn = policy_rollout_fn(model, tokenizer, cfg, cfg.rm.mc_rollouts) if step_labels == "mc" else None
    return label_samples([prompts[i] for i in rep], texts, [examples[i].answer for i in rep],
                         [prompt_id(prompts[i]) for i in rep], kind=kind, step_labels=step_labels,
                         step_separator=cfg.rm.step_separator, rollout_fn=rollout_fn)
