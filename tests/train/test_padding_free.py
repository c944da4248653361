"""optim.padding_free and optim.max_tokens_per_micro_batch through the update: the packed update's loss,
metrics and gradients equal the padded update's (fp32, 1e-6) for every loss_type, with mu > 1 and an
entropy bonus; the token budget forms micro-batches by real tokens; a run trains with it on."""

from __future__ import annotations

import json

import pytest
import torch

from easy_task import PROMPTS, easy_config
from grpokit.config.schema import ConfigError, build_config
from grpokit.model import buckets
from grpokit.observe.metrics import PhaseTimer
from grpokit.train import collect as collect_mod
from grpokit.train import step as step_mod
from grpokit.train import update as update_mod
from grpokit.train.loop import build_state, train_grpo

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "vespo", "cispo", "sapo"]


def one_update(tmp_path, monkeypatch, over: dict):
    """(update metrics, gradients of the first update, the rollout) of one step on a fixed ragged batch."""
    grads = []

    def capture(state):
        grads.append([p.grad.clone() for p in state.model.parameters()])
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0

    monkeypatch.setattr("grpokit.train.update.optimizer_step", capture)
    cfg = easy_config(tmp_path, **{"optim.micro_batch_size": 8, **over})
    state = build_state(cfg, train_examples=PROMPTS)
    torch.manual_seed(0)
    rollout, scores, _, _ = collect_mod.collect_batch(state, PhaseTimer())
    for i in range(rollout.completion_mask.shape[0]):          # ragged: lengths 2..8 (right-padded)
        rollout.completion_mask[i, 2 + i % 7:] = 0
    adv = step_mod.compute_advantages(cfg, rollout, scores.total, None)
    ref = step_mod.forward_logprobs(state.ref_model, rollout, cfg)
    old = step_mod.forward_logprobs(state.model, rollout, cfg) if cfg.loss.num_iterations > 1 else None
    out = update_mod.policy_update(state, rollout, adv, old_lp=old, ref_lp=ref,
                                   loss_mask=rollout.completion_mask.float(), timer=PhaseTimer())
    return out, grads[0], ref, rollout


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_packed_update_is_the_padded_update(tmp_path, monkeypatch, loss_type):
    extra = {"loss.loss_type": loss_type, "loss.num_iterations": 2, "loss.beta": 0.04}
    padded, g_pad, ref_pad, rollout = one_update(tmp_path / "a", monkeypatch, extra)
    packed, g_pack, ref_pack, _ = one_update(tmp_path / "b", monkeypatch,
                                             {**extra, "optim.padding_free": True})
    real = rollout.completion_mask.bool()
    torch.testing.assert_close(ref_pack[real], ref_pad[real], atol=1e-6, rtol=0)   # the reference pass
    assert bool((ref_pack[~real] == 0).all()) and not bool((ref_pad[~real] == 0).all())   # packed indeed
    for key in ("loss", "approx_kl", "clip_ratio", "entropy", "loss/iter1"):
        assert packed[key] == pytest.approx(padded[key], abs=1e-6), key
    for a, b in zip(g_pad, g_pack):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_the_token_budget_gives_the_same_update_with_more_rows_where_they_are_short(tmp_path, monkeypatch):
    """Micro-batches of at most 40 real tokens (a group's prompt paid once): the loss and gradients are the
    row-count plan's; short completions share a micro-batch."""
    plans = []
    real_plan = update_mod.micro_batch_plan
    monkeypatch.setattr(update_mod, "micro_batch_plan",
                        lambda s, r: plans.append(real_plan(s, r)) or plans[-1])
    rows, g_rows, _, rollout = one_update(tmp_path / "a", monkeypatch, {"optim.padding_free": True})
    budget, g_budget, _, _ = one_update(tmp_path / "b", monkeypatch,
                                        {"optim.padding_free": True, "optim.max_tokens_per_micro_batch": 40})
    assert rows["loss"] == pytest.approx(budget["loss"], abs=1e-6)
    for a, b in zip(g_rows, g_budget):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    plan = plans[-1]
    p_len, c_len = rollout.prompt_mask.sum(-1), rollout.completion_mask.sum(-1)
    assert sorted(torch.cat(plan).tolist()) == list(range(32))
    for mb in plan:
        prompts = {tuple(rollout.prompt_ids[r].tolist()) for r in mb.tolist()}
        cost = int(c_len[mb].sum()) + sum(int(p_len[r]) for r in {rollout.prompts.index(rollout.prompts[r])
                                                                  for r in mb.tolist()})
        assert cost <= 40 or len(mb) == 1, (mb, cost)
        assert len(prompts) >= 1
    assert len({len(mb) for mb in plan}) > 1                   # rows per micro-batch follow their lengths


def test_token_budget_batches_pays_a_shared_prompt_once():
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_ids = torch.tensor([[1] * 5, [1] * 5, [2] * 5, [2] * 5])
    completion_mask = torch.zeros(4, 10, dtype=torch.long)
    for r, n in enumerate((10, 2, 3, 3)):
        completion_mask[r, :n] = 1
    shared = buckets.token_budget_batches(prompt_mask, completion_mask, 17, 8, prompt_ids=prompt_ids)
    assert [b.tolist() for b in shared] == [[0, 1], [2, 3]]    # 5 + 10 + 2 = 17; 5 + 3 + 3 = 11
    plain = buckets.token_budget_batches(prompt_mask, completion_mask, 17, 8)
    assert [b.tolist() for b in plain] == [[0], [1, 2], [3]]   # each row pays its prompt: 15, 7 + 8, 8
    assert [b.tolist() for b in buckets.token_budget_batches(prompt_mask, completion_mask, 1000, 3)] == \
        [[0, 1, 2], [3]]                                       # and at most max_rows rows


def test_the_settings_are_checked():
    with pytest.raises(ConfigError, match="set optim.padding_free=true too"):
        build_config({"optim.max_tokens_per_micro_batch": 512})
    with pytest.raises(ConfigError, match="reuse_activations=true"):
        build_config({"optim.padding_free": True, "rollout.reuse_activations": True})
    with pytest.raises(ConfigError, match="must be >= 0"):
        build_config({"optim.padding_free": True, "optim.max_tokens_per_micro_batch": -1})
    with pytest.raises(ConfigError, match="value head runs padded rows"):
        build_config({"optim.padding_free": True, "loss.algorithm": "ppo"})


def test_a_packed_run_learns_like_the_padded_run(tmp_path):
    """Six steps, padded and packed, same seed: the rewards and losses per step agree (the sampling is the
    same and the updates equal to float rounding), so the runs do not drift apart."""
    rows = {}
    for free in (False, True):
        cfg = easy_config(tmp_path / str(free), **{"optim.padding_free": free, "run.max_steps": 6,
                                                    "optim.micro_batch_size": 8})
        train_grpo(cfg, train_examples=PROMPTS)
        lines = (tmp_path / str(free) / "run" / "metrics.jsonl").read_text().splitlines()
        rows[free] = [json.loads(line) for line in lines]
    assert len(rows[True]) == len(rows[False]) == 6
    for a, b in zip(rows[False], rows[True]):
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    assert rows[True][-1]["reward_mean"] > rows[True][0]["reward_mean"]            # and it learns
