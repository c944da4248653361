"""Learned reward models as reward functions: the outcome RM here, the process RM in
`grpokit.rewards.process_rm`.

    reward = load_reward_model("path/to/rm", cfg.rm)     # what reward.funcs {"rm:PATH": 1.0} builds
    reward = RewardModel(model, tokenizer)               # a model object (Python API, TRL's GRPOTrainer)
    reward(prompts=[...], completions=[...])             # -> one float per completion

An outcome RM is an `AutoModelForSequenceClassification` with one label. It reads prompt + completion
as one text built by `grpokit.rewards.rm_text.rm_input` with its own tokenizer (a chat prompt goes through
that tokenizer's chat template, the completion as the assistant turn), right-padded, in batches of
`batch_size`, under `torch.inference_mode`. Its score is the logit at the last non-pad token (the
model's own pooling), or sigmoid of it with transform="sigmoid".

A reward-model folder is a `save_pretrained` folder (model + tokenizer) plus `grpokit_rm.json`:
{"kind": "outcome" | "process", "step_separator": ..., "init": ..., "report": {...}}. A folder without
it is an outcome RM when its config.json names a *ForSequenceClassification architecture (a
*ForTokenClassification one: a process RM). A causal LM is refused: transformers would attach a
random, untrained head and score with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from grpokit.model.loading import ModelError, load_tokenizer, without_hub_kernels
from grpokit.rewards.calls import RewardError
from grpokit.rewards.process_rm import ProcessRewardModel
from grpokit.rewards.rm_batch import (
    check_head,
    check_options,
    encode,
    input_limit,
    prepare_tokenizer,
    rm_device,
    scoring,
    squash,
)
from grpokit.rewards.rm_text import rm_input

log = logging.getLogger("grpokit")
META_FILE = "grpokit_rm.json"
HEADS = {"ForSequenceClassification": "outcome", "ForTokenClassification": "process"}
TRAIN_HINT = "train one with `grpokit rm train`"


class RewardModel:
    """An outcome reward function around an `AutoModelForSequenceClassification` with one label.

    `self.model` is read at every call and put in eval mode for it (its previous mode is restored), so
    the model may be trained in place between calls (Algorithm 1).

    Args:
        model: the classifier; moved to `device` when one is given.
        tokenizer: its own tokenizer (a pad token is set to EOS when missing).
        batch_size: texts per forward pass.
        device: a torch device or 'cpu' / 'cuda' / 'cuda:N' / 'auto' (CUDA when visible); None: where it is.
        precision: 'fp32', or 'bf16' (autocast over the forward; the weights are not cast).
        transform: 'none' (the raw logit, as TRL) or 'sigmoid' (a probability in (0, 1)).
        max_length: longest input in tokens; 0 = the model's max_position_embeddings. Longer is an error.
        name: what errors call it (default: the folder it was loaded from).
        last_turn: read a chat prompt's system messages and last message only (`rm_text.rm_input`);
            a folder sets it from its grpokit_rm.json.
    """

    kind = "outcome"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 32, *,
                 device: str | torch.device | None = None, precision: str = "fp32", transform: str = "none",
                 max_length: int = 0, name: str | None = None, last_turn: bool = False) -> None:
        self.__name__ = name or Path(str(getattr(model.config, "_name_or_path", "") or "reward_model")).name
        check_head(model, self.kind, self.__name__)
        check_options(precision=precision, transform=transform, batch_size=batch_size, max_length=max_length)
        input_limit(model, max_length, self.__name__)  # an rm.max_length beyond the model fails now
        prepare_tokenizer(model, tokenizer)
        if device is not None:
            model.to(rm_device(device))
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.precision = batch_size, precision
        self.transform, self.max_length, self.last_turn = transform, max_length, last_turn

    @classmethod
    def from_path(cls, path: str | Path, tokenizer: Any = None, **options: Any) -> RewardModel:
        """Load a local outcome reward-model folder (and its tokenizer unless one is given)."""
        scorer = load_reward_model(path, tokenizer=tokenizer, **options)
        if not isinstance(scorer, cls):
            raise RewardError(f"'{path}' holds a {scorer.kind} reward model, not an outcome one: "
                              "load it with grpokit.rewards.outcome_rm.load_reward_model")
        return scorer

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        texts = [rm_input(self.tokenizer, p, c, last_turn=self.last_turn)[0]
                 for p, c in zip(prompts, completions)]
        return self.score_texts(texts)

    def score_texts(self, texts: list[str]) -> list[float]:
        """The score of each full RM input text (prompt and completion already joined)."""
        limit = input_limit(self.model, self.max_length, self.__name__)
        scores: list[float] = []
        with scoring(self.model, self.precision) as device:
            for s in range(0, len(texts), self.batch_size):
                enc = encode(self.tokenizer, texts[s:s + self.batch_size], limit=limit, name=self.__name__)
                logits = self.model(input_ids=enc["input_ids"].to(device),
                                    attention_mask=enc["attention_mask"].to(device)).logits  # [b, 1]
                scores += squash(logits[:, 0], self.transform).tolist()
        return scores


def reward_model_for(model: torch.nn.Module, tokenizer: Any,
                     **options: Any) -> RewardModel | ProcessRewardModel:
    """The scorer a model object calls for: a token classifier is a process RM, else an outcome RM."""
    if type(model).__name__.endswith("ForTokenClassification"):
        return ProcessRewardModel(model, tokenizer, **options)
    return RewardModel(model, tokenizer, **options)


def _folder_kind(folder: Path) -> tuple[str, dict]:
    """The kind of reward model a folder holds and its grpokit_rm.json (empty when absent)."""
    if not folder.is_dir():
        raise RewardError(f"reward model folder '{folder}' does not exist: give a folder saved by "
                          f"`grpokit rm train` ({TRAIN_HINT})")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RewardError(f"'{folder}' has no config.json: it is not a reward-model folder; "
                          f"{TRAIN_HINT}") from None
    except (OSError, ValueError) as e:
        raise RewardError(f"'{folder}/config.json' cannot be read ({e}): save the reward model "
                          "again") from None
    arch = " ".join(config.get("architectures") or []) or str(config.get("model_type", "unknown"))
    head = next((kind for suffix, kind in HEADS.items() if suffix in arch), None)
    meta: dict = {}
    if (folder / META_FILE).is_file():
        try:
            meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RewardError(f"'{folder / META_FILE}' is not valid JSON ({e}): save the reward model "
                              "again") from None
    kind = meta.get("kind", head)
    if head is None or kind != head:
        what = f"a {kind} reward model" if meta else "a reward model"
        raise RewardError(f"'{folder}' is a {arch}, not {what} (transformers would attach a random, "
                          f"untrained scoring head): {TRAIN_HINT}")
    return kind, meta


def load_reward_model(path: str | Path, rm_cfg: Any = None, *,
                      policy_device: str | torch.device | None = None,
                      tokenizer: Any = None, **options: Any) -> RewardModel | ProcessRewardModel:
    """A reward-model folder as a reward function: `RewardModel` (outcome) or `ProcessRewardModel` (process).

    Args:
        path: the folder (see the module docstring).
        rm_cfg: a `grpokit.config.schema.RMConfig` (batch_size, device, precision, transform, max_length,
            step_separator); None: the defaults, or `options` by the same names.
        policy_device: where the policy runs; rm.device=auto puts the reward model there.
        tokenizer: use this tokenizer instead of the folder's.

    Raises:
        RewardError: the folder is missing, is not a reward model, has several labels or cannot be loaded.
    """
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    folder = Path(str(path)).expanduser()
    kind, meta = _folder_kind(folder)
    if rm_cfg is not None:
        options = {"batch_size": rm_cfg.batch_size, "device": rm_cfg.device, "precision": rm_cfg.precision,
                   "transform": rm_cfg.transform, "max_length": rm_cfg.max_length,
                   "step_separator": rm_cfg.step_separator, **options}
    device = options.pop("device", "auto")
    separator = options.pop("step_separator", "\n")
    if kind == "process" and meta.get("step_separator") not in (None, separator):
        log.warning("reward model '%s' was trained with step separator %r: scoring with it, not %r",
                    folder, meta["step_separator"], separator)
        separator = meta["step_separator"]
    auto = AutoModelForSequenceClassification if kind == "outcome" else AutoModelForTokenClassification
    try:
        model = auto.from_pretrained(folder)
        without_hub_kernels(model)        # plain PyTorch layers, nothing fetched from the Hub at run time
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(folder)
    except ModelError as e:
        raise RewardError(f"reward model '{folder}': {e}") from None
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise RewardError(f"reward model '{folder}' cannot be loaded: {str(e).splitlines()[0]}") from None
    options.update(device=rm_device(device, policy_device), name=folder.name,
                   last_turn=bool(meta.get("last_turn", False)))   # it reads what it was trained on
    if kind == "process":
        return ProcessRewardModel(model, tokenizer, step_separator=separator, **options)
    return RewardModel(model, tokenizer, **options)
