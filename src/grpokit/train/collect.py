"""[A] + [B] for one step: the prompts sampled into groups and scored, with DAPO's dynamic sampling.

`collect_batch` takes this rank's B prompts (k x B with rollout.steps_per_generation = k) from the
stream, samples G completions each (`grpokit.rollout.groups.sample_groups`, the vLLM engine, or
rollout.mcts's tree searches: `grpokit.train.mcts_rollouts`) and scores them (`grpokit.rewards.scoring`); with
rollout.dynamic_sampling, groups whose rewards are all equal are dropped and new prompts sampled.
GRPO's `train_step` and PPO's `ppo_train_step` both start here.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from grpokit.model.devices import model_device
from grpokit.observe.metrics import PhaseTimer
from grpokit.rewards.scoring import correctness, reward_kwargs, score_responses, token_char_ends
from grpokit.rollout.groups import Rollout, merge_kept_groups, sample_groups
from grpokit.rollout.tree import TreeSpec
from grpokit.rollout.vllm_backend import vllm_agent_sampler, vllm_sample
from grpokit.train.mcts_rollouts import MctsRollouts, blank_rows
from grpokit.train.state import TrainState


def _reward_columns(examples: list, group_size: int) -> dict[str, list]:
    keys = examples[0].columns.keys() if examples else []
    return {k: [ex.columns.get(k) for ex in examples for _ in range(group_size)] for k in keys}


def generate_and_score(state: TrainState, examples: list, timer: PhaseTimer):
    """[A] + [B] for one set of prompts: (rollout, reward batch, correctness [N] or None)."""
    return score_batch(state, examples, sample_batch(state, examples, timer), timer)


def sample_batch(state: TrainState, examples: list, timer: PhaseTimer) -> Rollout:
    """[A] G completions of each prompt (what the sampler hands the rewards: `Rollout.reward_kwargs`)."""
    cfg, r = state.cfg, state.cfg.rollout
    prompts = [ex.prompt for ex in examples]
    with timer("generate"), state.dist.unsharded(state.model):
        # vllm: another engine samples (grpokit.rollout.vllm_backend); the same Rollout contract
        if state.agent is not None:   # tools / environments: multi-turn (grpokit.agents)
            rollout = state.agent.sample(state.model, state.tokenizer, examples, r.num_generations, cfg,
                                         sampler=vllm_agent_sampler(state))
        elif r.backend == "vllm":
            rollout = vllm_sample(state, prompts)
        elif r.mcts_enabled:   # G simulations of a tree search per prompt (grpokit.train.mcts_rollouts)
            if state.mcts is None:
                state.mcts = MctsRollouts(state)
            rollout = state.mcts.sample(state, examples)
        else:
            rollout = sample_groups(state.model, state.tokenizer, prompts, r.num_generations,
                                    r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                                    top_k=r.top_k, max_prompt_length=r.max_prompt_length,
                                    truncate_prompt=r.truncate_prompt, backend=r.backend,
                                    generation_batch_size=r.generation_batch_size,
                                    chat_template_kwargs=cfg.task.chat_template_kwargs, tree=TreeSpec.of(r))
    return rollout


def score_batch(state: TrainState, examples: list, rollout: Rollout, timer: PhaseTimer):
    """[B] the rewards of a sampled batch: (rollout, reward batch, correctness [N] or None). The step
    waits for all of it: time/reward_wait = time/reward (reward.overlap: `Scoring`)."""
    with timer("reward_wait"), timer("reward"):
        return (rollout, *scored(state, examples, rollout))


def scored(state: TrainState, examples: list, rollout: Rollout):
    """[B] score_responses over a sampled batch: (reward batch, correctness [N] or None). Rows the
    sampler did not run (`Rollout.unrun`, MCTS) get NaN rewards: out of their group's statistics."""
    cfg, r = state.cfg, state.cfg.rollout
    columns = _reward_columns(examples, r.num_generations)
    ids = [row[m.bool()].tolist() for row, m in zip(rollout.completion_ids, rollout.completion_mask)]
    extra: dict[str, Any] = dict(completion_ids=ids, **reward_kwargs(cfg), **state.reward_hooks,
                                 **rollout.reward_kwargs)   # environments= (TRL's keyword), rollout_func's
    if any(getattr(fn, "process", False) for _, fn, _ in state.reward_funcs):
        extra["completion_char_ends"] = [token_char_ends(state.tokenizer, row) for row in ids]
    scores = score_responses(state.reward_funcs, rollout.prompts, rollout.completions, columns,
                             reward_errors=cfg.reward.reward_errors, **extra)
    if state.reward_loop is not None:  # the RM's next training data, labeled by the verifier
        state.reward_loop.record(rollout, columns)
    correct = correctness(scores.per_func, rollout.prompts, rollout.completions, columns)
    if rollout.unrun is not None:
        return blank_rows(scores, correct, rollout.unrun.nonzero().flatten().tolist())
    return scores, correct


def collect_batch(state: TrainState, timer: PhaseTimer):
    """Prompts for one generation (one step's, or rollout.steps_per_generation steps'), sampled and scored,
    the rollout on the policy's device (a vLLM server's, an async thread's or a rollout_func's tensors are
    built on the CPU): (rollout, scores, correct, info)."""
    rollout, scores, correct, info = _sampled_and_scored(state, timer)
    return rollout.to(model_device(state.model)), scores, correct, info


def _prompts_here(state: TrainState) -> int:
    """This rank's prompts: B, or k * B when one generation feeds k steps (rollout.steps_per_generation)."""
    r = state.cfg.rollout
    return r.prompts_per_step * r.steps_per_generation // state.dist.world_size


def _sampled_and_scored(state: TrainState, timer: PhaseTimer):
    """With dynamic sampling (DAPO), groups whose rewards are all equal are dropped and new prompts
    sampled, at most `max_resample_rounds` extra rounds."""
    cfg = state.cfg
    B, G = _prompts_here(state), cfg.rollout.num_generations
    if state.async_rollouts is not None:   # rollout.async: the worker sampled it, up to K versions ago
        with timer("generate"):            # the wait for the batch (async/wait_s: the same)
            rollout, examples, info = state.async_rollouts.next(state)
        return (*score_batch(state, examples, rollout, timer), info)
    rollout, scores, correct = generate_and_score(state, state.stream.take(B), timer)
    info: dict[str, float] = {}
    if not cfg.rollout.dynamic_sampling:
        return rollout, scores, correct, info
    parts, dropped, extra_gens, rounds = [], 0, 0, 0
    while True:
        std = torch.nan_to_num(scores.total.view(-1, G), nan=0.0).std(-1)  # [groups]
        keep = (std > 1e-8).nonzero().squeeze(-1).tolist()
        dropped += (scores.total.numel() // G) - len(keep)
        parts.append((rollout, scores, correct, keep))
        have = sum(len(k) for *_, k in parts)
        if state.dist.all_true(have >= B or rounds >= cfg.rollout.max_resample_rounds):  # ranks in lock-step
            break
        rounds += 1
        extra_gens += B * G
        rollout, scores, correct = generate_and_score(state, state.stream.take(B), timer)
    rollout, scores, correct = merge_kept_groups(parts, B, G, state.tokenizer.pad_token_id)
    info = {"dynamic/groups_dropped": float(dropped), "dynamic/extra_generations": float(extra_gens),
            "dynamic/groups_kept": float(rollout.group_ids.numel() // G)}
    return rollout, scores, correct, info


# ---- reward.overlap: the rewards on a thread beside the step's passes ----------------------------------
class Scoring:
    """[B] one batch's `scored` running on a background thread (reward.overlap), started right after
    sampling, so that the step's reference / pi_old passes run while the reward functions (the sandbox's
    programs, a server's replies) do.

        with scoring:                          # the thread is joined on the way out, also when a pass raises
            ref_lp = ...                       # the passes, on the main thread
        scores, correct = scoring.result()     # or what a reward function raised, as without overlap

    time/reward is the scoring's own wall time (the thread's), time/reward_wait the main thread's wait
    for it after its passes; `Scoring.finished` holds scores computed on the main thread (no overlap).
    """

    def __init__(self, state: TrainState | None = None, examples: list | None = None, rollout=None,
                 timer: PhaseTimer | None = None) -> None:
        self._out: tuple | None = None
        self._error: BaseException | None = None
        self._timer, self._thread, self._seconds = timer, None, 0.0
        if state is not None:
            self._thread = threading.Thread(target=self._run, name="grpokit-rewards", daemon=True,
                                            args=(state, examples, rollout))
            self._thread.start()

    @classmethod
    def finished(cls, scores, correct) -> Scoring:
        """Scores already in (the step waited for them)."""
        done = cls()
        done._out = (scores, correct)
        return done

    def _run(self, state: TrainState, examples: list, rollout) -> None:
        start = time.perf_counter()
        try:
            self._out = scored(state, examples, rollout)
        except BaseException as e:   # re-raised on the main thread by result(): the same object
            self._error = e
        finally:
            self._seconds = time.perf_counter() - start

    def __enter__(self) -> Scoring:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.join()

    def join(self) -> None:
        """Wait for the thread (once); its wall time goes to time/reward, the wait to time/reward_wait."""
        if self._thread is None:
            return
        with self._timer("reward_wait"):
            self._thread.join()
        self._thread = None
        self._timer.seconds["reward"] += self._seconds

    def result(self):
        """(reward batch, correctness [N] or None), after waiting; re-raises what the scoring raised."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._out


def collect_overlapped(state: TrainState, timer: PhaseTimer):
    """`collect_batch` with the scoring left running (reward.overlap): (rollout on the policy's device,
    Scoring, info). Dynamic sampling, which needs the rewards before the step goes on, is refused
    (grpokit.config.overlap_checks)."""
    if state.async_rollouts is not None:   # the worker's batch, scored on the trainer's side
        with timer("generate"):
            rollout, examples, info = state.async_rollouts.next(state)
    else:
        examples, info = state.stream.take(_prompts_here(state)), {}
        rollout = sample_batch(state, examples, timer)
    scoring = Scoring(state, examples, rollout, timer)
    return rollout.to(model_device(state.model)), scoring, info
