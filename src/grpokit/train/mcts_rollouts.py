"""MCTS rollouts for training (rollout.mcts.*): a Monte Carlo tree search per prompt samples its group.

    rollout.mcts.enabled: true     # generate_and_score samples with MctsRollouts.sample, not sample_groups

Each group's G = rollout.num_generations trajectories are the completed trajectories of G simulations of
a search over reasoning steps (`grpokit.search.mcts_batch`: the B prompts' searches run in lockstep, one
decode call for all expansions and one for all rollouts per round). A simulation's value is, by
rollout.mcts.value:

    reward      the run's own reward functions (reward.funcs, with the example's columns: the verifier
                against the reference answer) on the completed text, their weighted sum
    steps       the arithmetic step verifier (`grpokit.search.scorers.VerifierSteps`), the min over steps
    PATH        a reward-model folder: an outcome RM's score, or a process RM's min over steps

The update is GRPO on those G trajectories: each row is scored by reward.funcs as any sampled row is,
and the advantages are the group's (`compute_advantages`, unchanged); the search's node values steer
which trajectories are sampled, they add no term to the advantage. Rows of simulations that the token
budget (rollout.mcts.max_tokens) left unrun are empty and say so (`Rollout.unrun`): scoring gives them NaN
rewards (`blank_rows`: left out of the group's mean and std, advantage 0, as a skipped score) and they
hold no token. The searches' figures travel with the rollout (`Rollout.sampler_stats`: `mcts_stats`).

Resume: the trees live for one step (nothing to checkpoint); the sampler draws from torch's global RNG,
which checkpoints save, and the values are deterministic, so a resumed run repeats the same searches.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpokit.rewards.outcome_rm import load_reward_model
from grpokit.rewards.scoring import RewardBatch, reward_kwargs, score_responses, token_char_ends
from grpokit.rollout.groups import Rollout
from grpokit.search.decode import Decoder
from grpokit.search.mcts_batch import MctsSpec, Value, mcts_sample
from grpokit.search.scorers import VERIFIER, Scorer, load_process, outcome_scorer, process_scorer


def load_scorer(cfg, device) -> tuple[Scorer | None, str]:
    """(the scorer of rollout.mcts.value, None for `reward`; the step separator): rollout.mcts.separator,
    else a process RM folder's own, else rm.step_separator."""
    r = cfg.rollout
    if r.mcts_value == "reward":
        return None, r.mcts_separator or cfg.rm.step_separator
    if r.mcts_value == VERIFIER:
        return load_process(VERIFIER, "min", r.mcts_separator, cfg.rm, device)
    options = {"step_separator": r.mcts_separator} if r.mcts_separator else {}
    rm = load_reward_model(r.mcts_value, cfg.rm, policy_device=device, **options)
    if rm.kind == "outcome":
        return outcome_scorer(rm), r.mcts_separator or cfg.rm.step_separator
    return process_scorer(rm, "min"), r.mcts_separator or rm.step_separator


def reward_value(state, examples: list) -> Value:
    """A simulation's value: the weighted sum of the run's reward functions on its completed text, with
    its example's columns (as `grpokit.train.collect.score_batch` scores a row)."""
    cfg = state.cfg

    def value(batch_rows, texts, ids) -> list[float]:
        picked = [examples[b] for b in batch_rows]
        columns = {k: [ex.columns.get(k) for ex in picked] for k in picked[0].columns}
        extra: dict[str, Any] = dict(completion_ids=list(ids), **reward_kwargs(cfg))
        if any(getattr(fn, "process", False) for _, fn, _ in state.reward_funcs):
            extra["completion_char_ends"] = [token_char_ends(state.tokenizer, row) for row in ids]
        scores = score_responses(state.reward_funcs, [ex.prompt for ex in picked], list(texts), columns,
                                 reward_errors=cfg.reward.reward_errors, **extra)
        return scores.total.tolist()
    return value


class MctsRollouts:
    """The run's MCTS sampler: its value scorer (a reward-model folder is loaded once, at the first step)
    and the search's shape."""

    def __init__(self, state) -> None:
        r = state.cfg.rollout
        self.scorer, separator = load_scorer(state.cfg, next(state.model.parameters()).device)
        self.spec = MctsSpec(simulations=r.num_generations, separator=separator, width=r.mcts_width,
                             max_tokens=r.mcts_max_tokens, exploration=r.mcts_exploration)

    def value(self, state, examples: list) -> Value:
        if self.scorer is None:
            return reward_value(state, examples)
        scorer = self.scorer
        return lambda batch_rows, texts, ids: scorer([examples[b].prompt for b in batch_rows], list(texts))

    def sample(self, state, examples: list) -> Rollout:
        """The B examples' searches in lockstep: a Rollout of B * G trajectories."""
        decoder = Decoder(state.model, state.tokenizer, state.cfg)
        device = next(state.model.parameters()).device
        rollout, _ = mcts_sample(decoder, [ex.prompt for ex in examples], self.spec,
                                 self.value(state, examples), device)
        return rollout


def blank_rows(scores: RewardBatch, correct: torch.Tensor | None,
               rows: list[int]) -> tuple[RewardBatch, torch.Tensor | None]:
    """Rows left out of their groups: every reward NaN (total and per function), no step reward, and
    correctness NaN (unknown). In place; returned for convenience."""
    if rows:
        idx = torch.tensor(rows)
        scores.total[idx] = math.nan
        for v in scores.per_func.values():
            v[idx] = math.nan
        if scores.step_rewards is not None:
            for i in rows:
                scores.step_rewards[i] = []
        if correct is not None:
            correct[idx] = math.nan
    return scores, correct


def mcts_stats(rollout: Rollout, dist) -> dict[str, float]:
    """The step's search figures, over every rank: decoded tokens (all groups, and per group), prefill
    tokens, nodes and simulations per group, and the mean backed-up value. Empty without MCTS."""
    if "nodes" not in rollout.sampler_stats:
        return {}
    total = {k: dist.sum(v) for k, v in rollout.sampler_stats.items()}
    groups = max(total["groups"], 1.0)
    return {"mcts/decoded_tokens": total["tokens"], "mcts/decoded_tokens_per_group": total["tokens"] / groups,
            "mcts/prefill_tokens": total["prefill_tokens"], "mcts/nodes_per_group": total["nodes"] / groups,
            "mcts/simulations_per_group": total["simulations"] / groups,
            "mcts/mean_value": total["value_sum"] / max(total["visits"], 1.0)}
