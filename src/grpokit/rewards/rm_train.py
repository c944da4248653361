"""Training and evaluating reward models: the math, the loop and the saved folder.

    model, tokenizer = init_reward_model("builtin:arith-demo", "outcome", seed=0)
    optimizer = make_rm_optimizer(model, 1e-4)
    train_reward_model(model, tokenizer, samples, kind="outcome", objective="pointwise", optimizer=optimizer,
                       epochs=1, batch_size=32, generator=torch.Generator().manual_seed(0),
                       step_separator="\\n")
    evaluate_reward_model(model, tokenizer, held_out, kind="outcome", batch_size=64, step_separator="\\n")
    save_reward_model(model, tokenizer, "rm_dir", kind="outcome", step_separator="\\n", init=..., report=...)

Objectives, with s = the RM's logit (outcome: at the last input token, HF's sequence-classification
pooling; process: at the RM token holding each step's last character, `rm_text.step_token_positions`):

    pointwise   L = -[y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))]      mean over samples (process: steps)
    pairwise    L = -log sigmoid(s_chosen - s_rejected)                   mean over pairs (Bradley-Terry)

Pairs are a right and a wrong completion of one group (problem): every right x wrong combination.
Evaluation: AUC (the probability that a random right sample outscores a random wrong one; ties count
half) and accuracy with the threshold s > 0 (p > 0.5); for a process RM both over steps. Every input is
`rm_text.rm_input`, right-padded; an input longer than the limit is refused, never truncated.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from grpokit.config.schema import ModelConfig
from grpokit.model.loading import eval_mode, load_model_and_tokenizer
from grpokit.rewards.rm_batch import input_limit
from grpokit.rewards.rm_data import KINDS, RMDataError, RMSample
from grpokit.rewards.rm_text import rm_input, rm_tokens, split_steps, step_token_positions

PRECISIONS = ("fp32", "bf16")   # the forward of training and evaluation (bf16: autocast, fp32 weights)
OBJECTIVES = ("pointwise", "pairwise")
Encoded = tuple[list[int], list[int], list[float]]  # (RM token ids, scored positions, their 0/1 labels)


# ---------------------------------------------------------------------------------------------
# Pure math
# ---------------------------------------------------------------------------------------------

def pointwise_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of logits [S] against 0/1 labels [S], mean over S."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry: -log sigmoid(s_chosen - s_rejected), chosen / rejected logits [P], mean over P."""
    return -F.logsigmoid(chosen.float() - rejected.float()).mean()


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Rank AUC (Mann-Whitney): P(score of a positive > score of a negative), ties count 1/2.

    NaN when one class is absent.
    """
    n = len(scores)
    order = sorted(range(n), key=lambda i: scores[i])
    ranks = [0.0] * n
    i = 0
    while i < n:  # tied scores share the mean of their 1-based ranks
        j = i
        while j + 1 < n and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    pos = [r for r, y in zip(ranks, labels) if y >= 0.5]
    n_pos, n_neg = len(pos), n - len(pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return (sum(pos) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def group_auc(scores: Sequence[float], labels: Sequence[float], groups: Sequence[str]) -> float:
    """Mean AUC inside each group that has both classes: how well the RM ranks the completions of one
    prompt, which is what GRPO's group-relative advantage sees (NaN when no group has both)."""
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    per_group = [auc([scores[i] for i in idx], [labels[i] for i in idx]) for idx in members.values()]
    per_group = [a for a in per_group if not math.isnan(a)]
    return sum(per_group) / len(per_group) if per_group else float("nan")


def form_pairs(samples: Sequence[RMSample]) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices: every right x wrong combination inside each group."""
    groups: dict[str, tuple[list[int], list[int]]] = {}
    for i, s in enumerate(samples):
        right, wrong = groups.setdefault(s.group, ([], []))
        (right if s.label >= 0.5 else wrong).append(i)
    return [(r, w) for right, wrong in groups.values() for r in right for w in wrong]


# ---------------------------------------------------------------------------------------------
# Model, optimizer, inputs
# ---------------------------------------------------------------------------------------------

def init_reward_model(policy_name_or_path: str, kind: str, seed: int, *, device: str = "cpu"):
    """A reward model on a policy's backbone: the transformer weights copied, a fresh scalar head (seeded).

    outcome: AutoModelForSequenceClassification, process: AutoModelForTokenClassification (dropout 0),
    both with num_labels=1. The policy is anything `grpokit.model.loading.load_model_and_tokenizer` loads.
    Returns (model in train mode, the policy's tokenizer).
    """
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    if kind not in KINDS:
        raise RMDataError(f"unknown reward-model kind '{kind}': use outcome or process")
    policy, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=policy_name_or_path, device="cpu"),
                                                 seed=seed)
    config = copy.deepcopy(policy.config)
    config.num_labels, config.pad_token_id, config.architectures = 1, tokenizer.pad_token_id, None
    config.classifier_dropout = 0.0  # no dropout: training consumes no global RNG and is reproducible
    auto = AutoModelForSequenceClassification if kind == "outcome" else AutoModelForTokenClassification
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config, dtype=policy.dtype)
    model.base_model.load_state_dict(policy.base_model.state_dict())
    return model.to(device).train(), tokenizer


def make_rm_optimizer(model: torch.nn.Module, learning_rate: float) -> torch.optim.AdamW:
    """AdamW over the reward model's trainable parameters (no weight decay)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate,
                             weight_decay=0.0)


def _limit(model: torch.nn.Module, max_length: int) -> tuple[int, str]:
    """The longest input allowed and where it comes from (max_length, else max_position_embeddings)."""
    name = Path(str(getattr(model.config, "_name_or_path", "") or "")).name or "being trained"
    limit, source = input_limit(model, max_length, name)
    return (limit or 10**9), source


def encode_samples(tokenizer, samples: Sequence[RMSample], *, kind: str, step_separator: str, limit: int,
                   source: str = "rm.max_length", last_turn: bool = False) -> list[Encoded]:
    """RM token ids, the positions whose logits are scored and their labels, per sample."""
    out = []
    for i, s in enumerate(samples):
        text, start = rm_input(tokenizer, s.prompt, s.completion, last_turn=last_turn)
        ids, ends = rm_tokens(tokenizer, text)
        if len(ids) > limit:
            raise RMDataError(f"sample {i} (group {s.group}) is {len(ids)} reward-model tokens long, over "
                              f"the limit of {limit} ({source}): drop or shorten it")
        if not ids:
            raise RMDataError(f"sample {i} (group {s.group}) encodes to no tokens: "
                              "give it a prompt or a completion")
        if kind == "outcome":
            out.append((ids, [len(ids) - 1], [s.label]))
            continue
        spans = split_steps(s.completion, step_separator)
        if s.step_labels is None or len(s.step_labels) != len(spans):
            have = "no" if s.step_labels is None else len(s.step_labels)
            raise RMDataError(f"sample {i} (group {s.group}) has {have} step labels for {len(spans)} steps "
                              f"split by {step_separator!r}: label its steps with the same separator")
        out.append((ids, step_token_positions(text, ends, start, spans), list(s.step_labels)))
    return out


def _scores(model, rows: Sequence[Encoded], kind: str, pad_id: int, precision: str = "fp32") -> torch.Tensor:
    """The logits at every scored position of `rows`, concatenated: [sum of positions]; bf16: the
    forward under bf16 autocast (fp32 weights, optimizer and loss), as the policy's mixed precision."""
    device = next(model.parameters()).device
    L = max(len(ids) for ids, _, _ in rows)
    ids = torch.tensor([r[0] + [pad_id] * (L - len(r[0])) for r in rows], device=device)  # [N, L] right pad
    mask = torch.tensor([[1] * len(r[0]) + [0] * (L - len(r[0])) for r in rows], device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(input_ids=ids, attention_mask=mask).logits[..., 0]  # outcome [N]; process [N, L]
    logits = logits.float()
    if kind == "outcome":
        return logits
    rows_idx = torch.tensor([n for n, r in enumerate(rows) for _ in r[1]], device=device, dtype=torch.long)
    cols = torch.tensor([p for r in rows for p in r[1]], device=device, dtype=torch.long)
    return logits[rows_idx, cols]


def _labels(rows: Sequence[Encoded], device) -> torch.Tensor:
    return torch.tensor([y for r in rows for y in r[2]], device=device)


def _check(kind: str, objective: str, precision: str = "fp32") -> None:
    if precision not in PRECISIONS:
        raise RMDataError(f"unknown precision '{precision}': use {' or '.join(PRECISIONS)}")
    if kind not in KINDS:
        raise RMDataError(f"unknown reward-model kind '{kind}': use outcome or process")
    if objective not in OBJECTIVES:
        raise RMDataError(f"unknown objective '{objective}': use pointwise or pairwise")
    if kind == "process" and objective == "pairwise":
        raise RMDataError("a process RM trains pointwise (BCE on step labels): use --objective pointwise")


# ---------------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------------

def batch_loss(model, encoded: list[Encoded], units: list, kind: str, *, objective: str,
               pad_id: int, precision: str = "fp32") -> torch.Tensor:
    """The loss of one batch: `units` are sample indices (pointwise) or (chosen, rejected) pairs."""
    if objective == "pairwise":
        scores = _scores(model, [encoded[c] for c, _ in units] + [encoded[r] for _, r in units], kind, pad_id,
                         precision)
        return pairwise_loss(scores[:len(units)], scores[len(units):])
    rows = [encoded[i] for i in units]
    scores = _scores(model, rows, kind, pad_id, precision)
    if scores.numel() == 0:  # process samples without steps
        return scores.sum()
    return pointwise_loss(scores, _labels(rows, scores.device))


def train_reward_model(model, tokenizer, samples: Sequence[RMSample], *, kind: str, objective: str,
                       optimizer: torch.optim.Optimizer, epochs: int, batch_size: int,
                       generator: torch.Generator, step_separator: str,
                       max_length: int = 0, last_turn: bool = False,
                       precision: str = "fp32") -> dict[str, float]:
    """Train in place: `epochs` passes over the samples (pointwise) or their pairs (pairwise).

    last_turn: the RM reads a chat prompt's last message only (`rm_text.rm_input`); precision: fp32 or
    bf16 (autocast over the forward; weights, AdamW and the loss in fp32).

    The order of each pass is `torch.randperm(generator=generator)` and nothing else draws random
    numbers, so the same generator state gives bit-identical weights. The model's train/eval mode is
    restored afterwards.

    Returns:
        {"loss": mean batch loss, "loss_last_epoch", "steps": optimizer steps, "units": samples or pairs}.

    Raises:
        RMDataError: pairwise without a right/wrong pair in any group, over-long inputs, bad step labels.
    """
    _check(kind, objective, precision)
    limit, source = _limit(model, max_length)
    encoded = encode_samples(tokenizer, samples, kind=kind, step_separator=step_separator, limit=limit,
                             source=source, last_turn=last_turn)
    units: list = form_pairs(samples) if objective == "pairwise" else list(range(len(samples)))
    if not units:
        raise RMDataError("pairwise training needs a right and a wrong completion of one group: "
                          "no group has both"
                          if objective == "pairwise" else "no samples to train the reward model on")
    was_training, losses, last = model.training, [], []
    model.train()
    try:
        for _ in range(epochs):
            order, last = torch.randperm(len(units), generator=generator).tolist(), []
            for s in range(0, len(order), batch_size):
                batch = [units[i] for i in order[s:s + batch_size]]
                loss = batch_loss(model, encoded, batch, kind, objective=objective,
                                  pad_id=tokenizer.pad_token_id, precision=precision)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                last.append(float(loss.detach()))
            losses += last
    finally:
        model.train(was_training)
    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")
    return {"loss": mean(losses), "loss_last_epoch": mean(last), "steps": float(len(losses)),
            "units": float(len(units))}


@torch.inference_mode()
def score_samples(model, tokenizer, samples: Sequence[RMSample], *, kind: str, batch_size: int,
                  step_separator: str, max_length: int = 0, last_turn: bool = False,
                  precision: str = "fp32") -> tuple[list[float], list[float]]:
    """(logits, labels) over samples (outcome) or over all steps (process), in eval mode."""
    limit, source = _limit(model, max_length)
    encoded = encode_samples(tokenizer, samples, kind=kind, step_separator=step_separator, limit=limit,
                             source=source, last_turn=last_turn)
    scores: list[float] = []
    with eval_mode(model):
        for s in range(0, len(encoded), batch_size):
            scores += _scores(model, encoded[s:s + batch_size], kind, tokenizer.pad_token_id,
                              precision).tolist()
    return scores, [y for r in encoded for y in r[2]]


def evaluate_reward_model(model, tokenizer, samples: Sequence[RMSample], *, kind: str, batch_size: int,
                          step_separator: str, max_length: int = 0, last_turn: bool = False,
                          precision: str = "fp32") -> dict[str, float]:
    """{"auc", "accuracy" (logit > 0 vs the label), "num_samples", "positive_share", "group_auc" (the mean AUC
    within each group that has both classes)}; process: over steps."""
    scores, labels = score_samples(model, tokenizer, samples, kind=kind, batch_size=batch_size,
                                   step_separator=step_separator, max_length=max_length,
                                   last_turn=last_turn, precision=precision)
    n = len(scores)
    hits = sum((s > 0) == (y >= 0.5) for s, y in zip(scores, labels))
    owners = [s.group for s in samples for _ in range(1 if kind == "outcome" else len(s.step_labels or []))]
    return {"auc": auc(scores, labels), "accuracy": hits / n if n else float("nan"), "num_samples": float(n),
            "positive_share": sum(y >= 0.5 for y in labels) / n if n else float("nan"),
            "group_auc": group_auc(scores, labels, owners)}


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def save_reward_model(model, tokenizer, out_dir: str | Path, *, kind: str, step_separator: str, init: str,
                      report: dict[str, Any], last_turn: bool = False) -> Path:
    """A folder `rm:PATH` loads: save_pretrained model + tokenizer, and grpokit_rm.json
    {"kind", "step_separator", "init", "report", "last_turn"} (non-finite figures written as null)."""
    if kind not in KINDS:
        raise RMDataError(f"unknown reward-model kind '{kind}': use outcome or process")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"kind": kind, "step_separator": step_separator, "init": init, "report": _json_ready(report),
            "last_turn": last_turn}
    (out / "grpokit_rm.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out
