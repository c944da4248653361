"""Definitions of the per-step metrics on hand-built batches, and a short run that logs all of them."""

import json
import math

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.core.loss import grpo_objective_from_logprobs
from grpokit.observe.metrics import (
    PHASES,
    PhaseTimer,
    finish_step_row,
    format_console,
    length_stats,
    read_metrics,
    reward_stats,
    tensor_stats,
)
from grpokit.observe.tracking import render_completions, summarize_prompts
from grpokit.rewards import scoring as rewards_mod

# ---------------------------------------------------------------------------------------------
# reward / group statistics
# ---------------------------------------------------------------------------------------------

def test_zero_std_share_split_into_graduated_and_stuck():
    G = 3
    rewards = torch.tensor([1.0, 1.0, 1.0,      # all right           -> zero std, graduated
                            0.0, 0.0, 0.0,      # all wrong           -> zero std, stuck
                            1.0, 0.0, 0.0,      # one right           -> std sqrt(1/3), has signal
                            0.5, 0.5, 0.5])     # same reward, answers differ (e.g. a format reward only)
    correct = torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 1])
    s = reward_stats(rewards, correct, G)
    assert s["frac_zero_std"] == pytest.approx(3 / 4)
    assert s["frac_graduated"] == pytest.approx(1 / 4)
    assert s["frac_stuck"] == pytest.approx(1 / 4)
    # mean within-group sample std: only group 2 is non-zero: sqrt(((2/3)^2 + 2 (1/3)^2) / (3 - 1))
    assert s["reward_group_std_mean"] == pytest.approx(math.sqrt(1 / 3) / 4)
    assert s["accuracy"] == pytest.approx(6 / 12)
    assert s["reward_mean"] == pytest.approx(5.5 / 12)
    assert s["reward_std"] == pytest.approx(float(rewards.std()))


def test_reward_stats_excludes_nan_rewards_and_works_without_correctness():
    s = reward_stats(torch.tensor([1.0, float("nan"), 0.0, 2.0, 2.0, 2.0]), None, 3)
    # group 0: valid [1, 0] -> std sqrt(0.5); group 1: zero std
    assert s["reward_group_std_mean"] == pytest.approx(math.sqrt(0.5) / 2)
    assert s["frac_zero_std"] == pytest.approx(0.5)
    assert s["reward_mean"] == pytest.approx(7 / 5)
    assert "accuracy" not in s and "frac_graduated" not in s


def test_tensor_and_length_stats():
    s = tensor_stats("advantage", torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    assert (s["advantage_mean"], s["advantage_min"], s["advantage_max"]) == (0.5, -1.0, 2.0)
    assert s["advantage_std"] == pytest.approx(math.sqrt(5 / 3))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    ls = length_stats(mask, torch.tensor([False, True, False]))
    assert ls == pytest.approx({"completion_length_mean": 8 / 3, "completion_length_min": 1.0,
                                "completion_length_max": 4.0, "frac_truncated": 1 / 3,
                                # the two that ended (lengths 3 and 1): TRL's completions/*_terminated_length
                                "completion_length_terminated_mean": 2.0,
                                "completion_length_terminated_min": 1.0,
                                "completion_length_terminated_max": 3.0})
    ended = length_stats(mask, torch.tensor([True, True, True]))
    assert ended["completion_length_terminated_mean"] == 0.0         # none ended: 0, as TRL logs it


# ---------------------------------------------------------------------------------------------
# clip fractions on ratios set by hand
# ---------------------------------------------------------------------------------------------

def test_clip_fractions_on_hand_set_ratios():
    ratios = torch.tensor([[0.5, 1.0, 1.25, 1.3],     # A = +1: only 1.3 > 1 + 0.28 is clipped (high)
                           [0.5, 0.9, 1.5, 0.79]])    # A = -1: 0.5 < 1 - 0.2 is clipped (low); 0.79 is masked
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, -1.0])
    old = torch.zeros(2, 4)
    new = ratios.log().requires_grad_(True)
    loss, m = grpo_objective_from_logprobs(new, old, None, mask, adv, 0.2, 0.0, clip_eps_high=0.28)
    assert float(m["clip_ratio_high"]) == pytest.approx(1 / 7)
    assert float(m["clip_ratio_low"]) == pytest.approx(1 / 7)
    assert float(m["clip_ratio"]) == pytest.approx(2 / 7)
    assert float(m["mean_ratio"]) == pytest.approx((0.5 + 1.0 + 1.25 + 1.3 + 0.5 + 0.9 + 1.5) / 7)
    # "clipped" means exactly: the token's gradient is zero (the clip branch is the active min)
    loss.backward()
    flagged = torch.tensor([[0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)
    valid = mask.bool()
    assert (new.grad[flagged] == 0).all() and (new.grad[valid & ~flagged] != 0).all()


def test_clip_fraction_is_zero_on_policy():
    """mu = 1: the ratio is exactly 1, so nothing is clipped and mean_ratio is 1."""
    new = torch.randn(3, 5)
    _, m = grpo_objective_from_logprobs(new, None, None, torch.ones(3, 5), torch.tensor([1.0, -1.0, 0.5]))
    assert float(m["clip_ratio"]) == 0.0 and float(m["mean_ratio"]) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# token entropy against a direct computation
# ---------------------------------------------------------------------------------------------

def direct_entropy(model, rollout, temperature):
    """H_t = -sum_v p_v log p_v of the full softmax(logits / tau) at each completion position. [N, T]"""
    from grpokit.model.logprobs import position_ids_from_mask

    ids, att = rollout.input_ids, rollout.attention_mask
    T = rollout.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
    logp = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_entropy_metric_equals_direct_computation_across_micro_batches(tiny_model, char_tokenizer, tmp_path):
    """policy_update's `entropy` (token-weighted over micro-batches) = masked mean of the direct entropy."""
    from grpokit.rollout.groups import sample_groups
    from grpokit.train.state import TrainState, make_optimizer
    from grpokit.train.update import policy_update
    tau = 0.7
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "rollout.temperature": tau,
                        "rollout.prompts_per_step": 3, "rollout.num_generations": 2,
                        "optim.micro_batch_size": 2, "loss.beta": 0.0, "run.output_dir": str(tmp_path)})
    torch.manual_seed(0)
    rollout = sample_groups(tiny_model, char_tokenizer, ["1+2=", "33+44=", "7*8="], 2, 10, temperature=tau,
                            backend="generate")
    mask = rollout.completion_mask.float()
    want = float((direct_entropy(tiny_model, rollout, tau) * mask).sum() / mask.sum())
    opt, sched = make_optimizer(tiny_model, cfg)
    state = TrainState(cfg, tiny_model, char_tokenizer, None, opt, sched, [], stream=None)
    out = policy_update(state, rollout, torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0]),
                        old_lp=None, ref_lp=None, loss_mask=mask, timer=PhaseTimer())
    assert out["entropy"] == pytest.approx(want, rel=1e-5)
    assert 0 < out["entropy"] <= math.log(len(char_tokenizer))


# ---------------------------------------------------------------------------------------------
# timers, console, tracking
# ---------------------------------------------------------------------------------------------

def test_phase_timer_elapsed_includes_open_timers():
    timer = PhaseTimer()
    with timer("step"):
        with timer("generate"):
            sum(range(10000))
        snap = timer.elapsed()
        assert snap["time/step"] >= snap["time/generate"] > 0
    assert timer.pop()["time/step"] >= snap["time/step"]
    assert timer.elapsed() == {}


def test_finish_step_row_adds_throughput_and_memory():
    timer = PhaseTimer()
    row = {"completion_tokens": 100.0}
    with timer("step"):
        with timer("generate"):
            sum(range(10000))
        finish_step_row(row, timer)
    assert row["tokens_per_s"] == pytest.approx(100.0 / row["time/step"])
    assert row["generate_tokens_per_s"] == pytest.approx(100.0 / row["time/generate"])
    assert row["peak_rss_mib"] > 10
    assert format_console(row).startswith("s/step=") and "tok/s=" in format_console(row)


def test_prompt_summary_statuses_and_graduation_step():
    def visit(step, pid, acc, mean=None):
        return {"step": step, "prompt_id": pid, "prompt": pid, "reward_mean": acc if mean is None else mean,
                "reward_std": 0.0 if acc in (0.0, 1.0) else 0.5, "accuracy": acc}

    # "a": graduated at 5
    history = [visit(1, "a", 0.0), visit(3, "a", 0.5), visit(5, "a", 1.0), visit(7, "a", 1.0),
               visit(1, "b", 0.0), visit(4, "b", 0.0),                                           # stuck
               visit(2, "c", 1.0), visit(6, "c", 0.25)]                                          # learning
    s = summarize_prompts(history)
    by = {p["prompt_id"]: p for p in s["prompts"]}
    assert (by["a"]["status"], by["a"]["graduated_at"], by["a"]["visits"]) == ("graduated", 5, 4)
    assert by["b"]["status"] == "stuck" and by["c"]["status"] == "learning"
    assert (s["graduated"], s["stuck"], s["learning"], s["num_visits"]) == (1, 1, 1, 8)


def test_completions_table_plain_and_rich():
    entry = {"step": 4, "prompt": "What is 2+2?", "answer": "4", "reward_mean": 0.5, "reward_std": 0.7,
             "completions": [{"text": "\\boxed{4}", "reward": 1.0, "advantage": 0.7, "rewards": {"rule": 1.0},
                              "length": 9, "truncated": False},
                             {"text": "five\nsix", "reward": 0.0, "advantage": -0.7, "rewards": {"rule": 0.0},
                              "length": 8, "truncated": True}]}
    for use_rich in (False, True):
        text = render_completions(entry, use_rich=use_rich)
        assert "step 4" in text and "answer: 4" in text and "\\boxed{4}" in text
        assert "+0.700" in text and "-0.700" in text and "8+" in text and "five⏎ six" in text


# ---------------------------------------------------------------------------------------------
# a short training run: every metric present and plausible, phases add up to the step time
# ---------------------------------------------------------------------------------------------

def judged(prompts, completions, **kw):
    """Correctness by prompt: 'Up' groups always right, 'Down' always wrong, 'Mixed' alternate."""
    return [1.0 if p.startswith("Up") else 0.0 if p.startswith("Down") else float(i % 2 == 0)
            for i, p in enumerate(prompts)]


PER_STEP_KEYS = (
    "reward_mean", "reward_std", "accuracy", "frac_zero_std", "frac_graduated", "frac_stuck",
    "reward_group_std_mean", "advantage_mean", "advantage_std", "advantage_min", "advantage_max", "loss",
    "policy_loss", "approx_kl", "mean_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio", "entropy",
    "completion_length_mean", "completion_length_min", "completion_length_max", "frac_truncated",
    "learning_rate", "grad_norm", "time/generate", "time/reward", "time/ref_forward", "time/advantage",
    "time/update", "time/save", "time/log", "time/step", "tokens_per_s", "peak_rss_mib")


def plausibility_problems(row, cfg, vocab: int) -> list[str]:
    """Every per-step metric present, finite and in its range; an empty list when all is well."""
    bad = [k for k in PER_STEP_KEYS if not isinstance(row.get(k), (int, float)) or not math.isfinite(row[k])]
    if not any(k.startswith("rewards/") for k in row):
        bad.append("rewards/<function>")
    if bad:
        return [f"missing or non-finite: {bad}"]
    checks = {
        "shares in [0, 1]": all(0 <= row[k] <= 1 for k in ("accuracy", "frac_zero_std", "frac_graduated",
                                                           "frac_stuck", "clip_ratio_low", "clip_ratio_high",
                                                           "frac_truncated")),
        "graduated + stuck <= zero std": (row["frac_graduated"] + row["frac_stuck"]
                                          <= row["frac_zero_std"] + 1e-9),
        "stds >= 0": min(row["reward_std"], row["reward_group_std_mean"], row["advantage_std"]) >= 0,
        "adv min <= mean <= max": row["advantage_min"] <= row["advantage_mean"] <= row["advantage_max"],
        "len in [1, T]": 1 <= row["completion_length_min"] <= row["completion_length_mean"]
        <= row["completion_length_max"] <= cfg.rollout.max_completion_length,
        "entropy in (0, log V]": 0 < row["entropy"] <= math.log(vocab) + 1e-4,
        "kl >= 0": row["approx_kl"] >= 0, "ratio ~ 1 (mu = 1)": abs(row["mean_ratio"] - 1) < 1e-4,
        "lr": row["learning_rate"] == pytest.approx(cfg.optim.learning_rate),
        "grad norm >= 0": row["grad_norm"] >= 0, "throughput > 0": row["tokens_per_s"] > 0,
        "rss > 50 MiB": row["peak_rss_mib"] > 50,
        "phase times >= 0": all(row[f"time/{p}"] >= 0 for p in PHASES if f"time/{p}" in row),
    }
    return [name for name, ok in checks.items() if not ok]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    from easy_task import Ex
    from grpokit.train.loop import train_grpo
    out = tmp_path_factory.mktemp("obs") / "run"
    prompts = [Ex(p, answer="7") for p in ("Up 1:", "Up 2:", "Down 1:", "Down 2:", "Mixed 1:", "Mixed 2:")]
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "reward.funcs": {"accuracy": 1.0},
                        "rollout.prompts_per_step": 3, "rollout.num_generations": 4,
                        "rollout.max_completion_length": 8, "optim.learning_rate": 1e-3, "run.max_steps": 4,
                        "run.output_dir": str(out), "run.progress": False, "run.log_completions_steps": 2,
                        "run.track_prompts": True})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "accuracy", judged)
        state = train_grpo(cfg, train_examples=prompts)
    return cfg, out, len(state.tokenizer)


def test_short_run_logs_every_metric_with_a_plausible_value(short_run):
    cfg, out, vocab = short_run
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert plausibility_problems(row, cfg, vocab) == [], row["step"]


def test_short_run_graduated_and_stuck_match_the_prompts_sampled(short_run):
    cfg, out, _ = short_run
    history = read_metrics(out, "prompt_history.jsonl")
    for row in read_metrics(out):
        sampled = [h["prompt"] for h in history if h["step"] == row["step"]]
        assert len(sampled) == cfg.rollout.prompts_per_step
        assert row["frac_graduated"] == pytest.approx(sum(p.startswith("Up") for p in sampled) / len(sampled))
        assert row["frac_stuck"] == pytest.approx(sum(p.startswith("Down") for p in sampled) / len(sampled))
        assert row["frac_zero_std"] == pytest.approx(row["frac_graduated"] + row["frac_stuck"])
    summary = json.loads((out / "prompt_summary.json").read_text())
    status = {p["prompt"]: p["status"] for p in summary["prompts"]}
    assert status == {"Up 1:": "graduated", "Up 2:": "graduated", "Down 1:": "stuck", "Down 2:": "stuck",
                      "Mixed 1:": "learning", "Mixed 2:": "learning"}
    assert all(p["visits"] == 2 for p in summary["prompts"])  # 4 steps x 3 prompts over 6 prompts


def test_short_run_completions_log(short_run):
    cfg, out, _ = short_run
    entries = read_metrics(out, "completions.jsonl")
    assert sorted({e["step"] for e in entries}) == [2, 4]                     # every log_completions_steps
    for e in entries:
        assert e["answer"] == "7" and len(e["completions"]) == cfg.rollout.num_generations
        rewards = torch.tensor([c["reward"] for c in e["completions"]])
        adv = torch.tensor([c["advantage"] for c in e["completions"]])
        # the logged advantage is the group-normalized reward (r - mean) / std, 0 for a zero-std group
        std = rewards.std()
        want = (rewards - rewards.mean()) / std if std > 1e-8 else torch.zeros_like(rewards)
        assert torch.allclose(adv, want, atol=1e-5)


def test_phase_times_add_up_to_the_step_time(short_run):
    _, out, _ = short_run
    for row in read_metrics(out):
        phases = sum(row.get(f"time/{p}", 0.0) for p in PHASES)
        assert phases == pytest.approx(row["time/step"], rel=0.05), (row["step"], phases, row["time/step"])
        assert row["time/log"] > 0 and "time/save" in row
