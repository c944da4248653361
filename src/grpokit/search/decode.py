"""Decoding for search: whole completions through `sample_groups`, one reasoning step at a time for beam.

    dec = Decoder(model, tokenizer, cfg)                # the rollout.* settings: length, temperature, top-p/k
    dec.complete(prompts, n)                            # n whole completions per prompt (greedy=True: argmax)
    dec.extend(prefixes, n, limits, separator)          # n one-step continuations per token-id prefix
    dec.extend(prefixes, n, limits, None)               # n continuations to EOS (MCTS rollouts)

`extend`'s completions carry their ids and each id's log-prob as grpokit's decode loop reports it: under
the temperature-scaled full distribution (grpokit.rollout.sampling; top-p / top-k choose the draw but are
not in the log-prob, so it is what the trainer's own pass computes): MCTS rollouts for training
(`grpokit.search.mcts_batch`) hand them to the update as the rows' sampling log-probs.

`complete` is `grpokit.rollout.groups.sample_groups` (group_size = n: each prompt is prefilled once and
its KV cache is read by its n rows). `extend` drives the same decode loop (`grpokit.rollout.sampler.
fast_sample`) on token-id prefixes (prompt + the partial solution so far), with a turn driver that ends a
row at the first step separator after some text, at EOS, or at the row's own length limit. A step is
therefore decoded once, up to and including the token that completes the separator: nothing past it is
generated. What this readable path costs instead: each round prefills its prefixes again (the prompt
and the partial solution are recomputed, not kept from the previous round); `extend` reports those
tokens as prefill tokens. Token ids are kept as decoded (no re-tokenization of partial text).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpokit import switch
from grpokit.rollout import sampler
from grpokit.rollout.groups import eos_token_ids, render_prompts, sample_groups
from grpokit.search.common import Completion, SearchError


def step_ended(text: str, separator: str) -> bool:
    """Whether `text` holds a step separator after some non-space text (a step has ended in it)."""
    at = text.find(separator)
    while at >= 0:
        if text[:at].strip():
            return True
        at = text.find(separator, at + 1)
    return False


def step_over(tokenizer, eos_ids, ids: list[int], separator: str | None) -> bool:
    """Whether a step whose ids are `ids` has ended: at EOS, or (separator given) at a step separator.

    Asked after each token of a step (so `ids[:-1]` had not ended it): a new ending is a separator that
    ends in the last token's text, so the last few tokens are decoded first (enough text for the
    separator to start before the last token), and the whole step only when they hold the separator.
    An ask costs a decode of about len(separator) tokens, not of the whole step (O(T^2) over a step)."""
    if ids[-1] in eos_ids:
        return True
    if separator is None:
        return False
    last = len(tokenizer.decode(ids[-1:], skip_special_tokens=True))
    k = 1
    while True:
        tail = tokenizer.decode(ids[-k:], skip_special_tokens=True)
        if k >= len(ids) or len(tail) - last > len(separator):     # one spare: a tail's leading space
            break
        k = min(len(ids), 2 * k)
    if separator not in tail:
        return False
    return step_ended(tail if k >= len(ids) else tokenizer.decode(ids, skip_special_tokens=True), separator)


class StepStop:
    """A turn driver (`grpokit.rollout.turns.TurnDriver`) that ends each row after one reasoning step.

    Every token is a stop candidate, so the loop asks after each one; a row ends at EOS, when its text
    holds the separator after some text (`step_over`: its last tokens decoded, the row's whole text only
    when they hold the separator), or at its own token limit. With separator None
    a row runs to EOS or its limit (a whole completion: MCTS's rollouts)."""

    def __init__(self, tokenizer, eos_ids: Sequence[int], separator: str | None, limits: Sequence[int],
                 vocab_size: int) -> None:
        self.tokenizer, self.eos, self.separator = tokenizer, set(eos_ids), separator
        self.limits = list(limits)                    # per row: the most tokens it may decode
        self.stop_ids = torch.arange(vocab_size)      # [V]: ask after every token
        self.lengths = [0] * len(limits)              # per row: tokens decoded (set when it ends)
        self.trajectories: list = []                  # unused: one turn per row, nothing fed

    def begin(self, prompts: list[list[int]]) -> None:
        """Nothing to prepare: the rows' prefixes are the decode loop's prompts."""

    def after_token(self, row0: int, rows: list[int], column: int,
                    tokens: torch.Tensor) -> tuple[dict[int, list[int]], list[int]]:
        done = []
        for r in rows:
            n = column + 1
            ids = tokens[r, :n].tolist()
            if n >= self.limits[r] or step_over(self.tokenizer, self.eos, ids, self.separator):
                self.lengths[r] = n
                done.append(r)
        return {}, done

    def finish(self, row0: int, tokens: torch.Tensor) -> None:
        for r, n in enumerate(self.lengths):
            if n == 0:                                # still going when the loop's budget ran out
                self.lengths[r] = min(tokens.shape[1], self.limits[r])


class Decoder:
    """The policy and its rollout.* decoding settings, for the search methods."""

    def __init__(self, model, tokenizer, cfg) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.max_new_tokens = cfg.rollout.max_completion_length

    def complete(self, prompts: Sequence, n: int, *, greedy: bool = False) -> list[list[Completion]]:
        """n whole completions per prompt (sample_groups, group_size = n); tokens = the row's mask sum."""
        r = self.cfg.rollout
        with switch.accelerated(self.model):
            ro = sample_groups(self.model, self.tokenizer, list(prompts), n, r.max_completion_length,
                               temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                               max_prompt_length=r.max_prompt_length, truncate_prompt=r.truncate_prompt,
                               backend=r.backend, greedy=greedy,
                               chat_template_kwargs=self.cfg.task.chat_template_kwargs)
        lengths = ro.completion_mask.sum(-1).tolist()                      # [N] tokens up to the EOS
        rows = [Completion(text, int(t), not bool(cut)) for text, t, cut in
                zip(ro.completions, lengths, ro.truncated.tolist())]
        return [rows[i * n:(i + 1) * n] for i in range(len(prompts))]

    def prompt_ids(self, prompt) -> list[int]:
        """The prompt's token ids as the sampler would feed them (chat template applied, no padding)."""
        r = self.cfg.rollout
        ids, mask = render_prompts(self.tokenizer, [prompt], r.max_prompt_length, r.truncate_prompt,
                                   self.cfg.task.chat_template_kwargs)
        return ids[0][mask[0].bool()].tolist()

    def extend(self, prefixes: Sequence[list[int]], n: int, limits: Sequence[int],
               separator: str | None) -> list[list[Completion]]:
        """n sampled one-step continuations of each token-id prefix, each at most limits[i] tokens
        (separator None: continuations to EOS or the limit)."""
        if not sampler.choose_backend(self.model, self.cfg.rollout.backend):
            raise SearchError(f"step-level search decodes with grpokit's sampler, which does not cover "
                              f"this architecture ({getattr(self.model.config, 'model_type', '?')}) or "
                              f"rollout.backend={self.cfg.rollout.backend}: use a model of "
                              f"{', '.join(sampler.FAST_MODEL_TYPES)} and rollout.backend=auto")
        r, pad = self.cfg.rollout, self.tokenizer.pad_token_id
        P = max(len(p) for p in prefixes)
        ids = torch.tensor([[pad] * (P - len(p)) + list(p) for p in prefixes])          # [B, P] left-padded
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prefixes])     # [B, P]
        device = next(self.model.parameters()).device
        row_limits = [lim for lim in limits for _ in range(n)]                           # [B * n]
        vocab = self.model.get_output_embeddings().weight.shape[0]
        driver = StepStop(self.tokenizer, self.eos_ids, separator, row_limits, vocab)
        with switch.accelerated(self.model):
            tokens, logps = sampler.fast_sample(self.model, ids.to(device), mask.to(device), n, max(limits),
                                            temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                            eos_ids=self.eos_ids, pad_id=pad, driver=driver)
        out = []
        for row, length in enumerate(driver.lengths):
            kept = tokens[row, :length].tolist()
            out.append(Completion(self.tokenizer.decode(kept, skip_special_tokens=True), length,
                                  bool(kept) and kept[-1] in self.eos_ids, kept,
                                  logps[row, :length].tolist()))
        return [out[i * n:(i + 1) * n] for i in range(len(prefixes))]
