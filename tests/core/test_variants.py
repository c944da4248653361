"""The objective's family (loss_type, importance_sampling_level, clip-higher, delta, mu, reference reset,
dynamic sampling, presets), each against an independent plain-loop implementation of its formula."""

import math
from pathlib import Path

import pytest
import torch

from easy_task import PROMPTS, easy_config
from grpokit.config.schema import ConfigError, build_config
from grpokit.core.loss import grpo_objective_from_logprobs
from grpokit.train import collect as collect_mod
from grpokit.train import step as step_mod
from grpokit.train import update as update_mod
from grpokit.train.loop import build_state
from grpokit.train.step import train_step


def loop_loss(new, old, ref, mask, adv, eps_lo, eps_hi, beta, loss_type, level, t_max, delta=None):
    """Per-element loop written from the formulas in loss.py's docstring (not calling the library)."""
    N, T = len(new), len(new[0])
    per_tok = [[0.0] * T for _ in range(N)]
    for i in range(N):
        valid = [t for t in range(T) if mask[i][t]]
        seq_lr = sum(new[i][t] - old[i][t] for t in valid) / max(len(valid), 1)
        for t in valid:
            r = math.exp(seq_lr if level == "sequence" else new[i][t] - old[i][t])
            a = adv[i]
            r1 = min(r, delta) if delta is not None else r
            obj = min(r1 * a, min(max(r, 1 - eps_lo), 1 + eps_hi) * a)
            d = ref[i][t] - new[i][t]
            obj -= beta * (math.exp(d) - d - 1)
            per_tok[i][t] = -obj
    n_tok = sum(sum(row) for row in mask)
    total = sum(per_tok[i][t] for i in range(N) for t in range(T))
    if loss_type == "grpo":
        return sum(sum(per_tok[i]) / max(sum(mask[i]), 1) for i in range(N)) / N
    if loss_type == "bnpo":
        return total / max(n_tok, 1)
    if loss_type == "dr_grpo":
        return total / (N * t_max)
    return total / max(n_tok, 1)  # dapo, one batch


def random_batch(seed, N=6, T=9, zero_adv=False):
    g = torch.Generator().manual_seed(seed)
    new = torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3 - 1
    old = new + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.2
    ref = new + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.2
    lengths = torch.tensor([9, 4, 0, 1, 6, 0])[:N]
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    adv = (torch.zeros(N, dtype=torch.float64) if zero_adv
           else torch.randn(N, generator=g, dtype=torch.float64))
    return new, old, ref, mask, adv


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("zero_adv", [False, True])
def test_every_variant_equals_plain_loop(loss_type, level, zero_adv):
    new, old, ref, mask, adv = random_batch(3, zero_adv=zero_adv)
    kw = dict(clip_eps_high=0.28, loss_type=loss_type, importance_sampling_level=level,
              max_completion_length=12)
    loss, metrics = grpo_objective_from_logprobs(new, old, ref, mask, adv, 0.2, 0.04, **kw)
    want = loop_loss(new.tolist(), old.tolist(), ref.tolist(), mask.tolist(), adv.tolist(), 0.2, 0.28, 0.04,
                     loss_type, level, 12)
    assert float(loss) == pytest.approx(want, abs=1e-9)
    assert all(torch.isfinite(v) for v in metrics.values())


def test_delta_bounds_the_unclipped_ratio():
    new, old, ref, mask, adv = random_batch(5)
    new = old + 1.0  # ratio e ~ 2.72 everywhere
    loss, _ = grpo_objective_from_logprobs(new, old, ref, mask, adv, 0.2, 0.04, delta=1.5)
    want = loop_loss(new.tolist(), old.tolist(), ref.tolist(), mask.tolist(), adv.tolist(), 0.2, 0.2, 0.04,
                     "grpo", "token", 9, delta=1.5)
    assert float(loss) == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_micro_batches_accumulate_to_the_big_batch_gradient(loss_type):
    new, old, ref, mask, adv = random_batch(7)
    kw = dict(loss_type=loss_type, max_completion_length=9)
    x = new.clone().requires_grad_()
    big, _ = grpo_objective_from_logprobs(x, old, ref, mask, adv, **kw)
    (g_big,) = torch.autograd.grad(big, x)
    y = new.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
        part, _ = grpo_objective_from_logprobs(y[rows], old[rows], ref[rows], mask[rows], adv[rows],
                                               num_sequences=6, num_tokens=float(mask.sum()), **kw)
        total = total + part
    (g_acc,) = torch.autograd.grad(total, y)
    assert float(total.detach()) == pytest.approx(float(big.detach()), abs=1e-12)
    assert torch.allclose(g_acc, g_big, atol=1e-12)


def test_bnpo_does_not_accumulate_like_one_batch():
    # bnpo normalizes by the tokens of each micro-batch: micro-batches of unequal token counts weight
    # their tokens differently from one big batch (documented in the README).
    new, old, ref, mask, adv = random_batch(7)
    big, _ = grpo_objective_from_logprobs(new, old, ref, mask, adv, loss_type="bnpo")
    parts = [grpo_objective_from_logprobs(new[r], old[r], ref[r], mask[r], adv[r], loss_type="bnpo")[0]
             for r in (slice(0, 2), slice(2, 4), slice(4, 6))]
    assert abs(float(sum(parts) / 3) - float(big)) > 1e-3


def test_mu_one_ratio_is_one_and_gradient_is_policy_gradient():
    new, _, _, mask, adv = random_batch(11)
    x = new.clone().requires_grad_()
    loss, m = grpo_objective_from_logprobs(x, None, None, mask, adv, 0.2, 0.0)
    assert float(m["mean_ratio"]) == 1.0 and float(m["clip_ratio"]) == 0.0
    (g,) = torch.autograd.grad(loss, x)
    # plain policy gradient with the same normalization: -(1/N) sum_i A_i/|o_i| sum_t grad logp_{i,t}
    lengths = mask.sum(-1).clamp(min=1)
    expected = -(adv[:, None] * mask / lengths[:, None]) / mask.shape[0]
    assert torch.allclose(g, expected, atol=1e-12)


def test_mu_four_moves_ratios_and_old_forward_runs_once_per_batch(tmp_path, monkeypatch):
    cfg = easy_config(tmp_path, **{"loss.num_iterations": 4, "optim.learning_rate": 1e-2, "loss.beta": 0.0})
    state = build_state(cfg, train_examples=PROMPTS)
    calls = []
    real = step_mod.forward_logprobs
    monkeypatch.setattr(step_mod, "forward_logprobs",
                        lambda model, *a: calls.append(model) or real(model, *a))
    m = train_step(state)
    assert calls == [state.model]  # one old-policy forward for the generation batch (no reference: beta 0)
    assert m["mean_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert abs(m["mean_ratio/iter3"] - 1.0) > 1e-3
    assert m["clip_ratio/iter3"] > 0


def test_reference_reset_makes_ref_equal_policy_and_kl_zero(tmp_path):
    cfg = easy_config(tmp_path, **{"loss.ref_model_sync_steps": 2, "optim.learning_rate": 1e-2})
    state = build_state(cfg, train_examples=PROMPTS)
    m1 = train_step(state)
    m2 = train_step(state)  # sync after this step
    for r, p in zip(state.ref_model.parameters(), state.model.parameters()):
        assert torch.equal(r, p)
    m3 = train_step(state)
    assert m2["approx_kl"] > 0 and m3["approx_kl"] == 0.0
    assert m1["approx_kl"] == 0.0  # first step: policy == reference


def test_mixup_alpha_blends_reference():
    from grpokit.model.loading import sync_reference

    ref, pol = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    want = 0.6 * pol.weight.detach() + 0.4 * ref.weight.detach()
    sync_reference(ref, pol, 0.6)
    assert torch.allclose(ref.weight, want)


def uniform_half(prompts, completions, **kw):
    """Prompts starting with 'U' get equal rewards; the others get the parity of the first character."""
    return [1.0 if p.startswith("U") else float(ord(c[0]) % 2 if c else 0)
            for p, c in zip(prompts, completions)]


def test_dynamic_sampling_keeps_only_informative_groups(tmp_path, monkeypatch):
    from easy_task import Ex
    from grpokit.observe.metrics import PhaseTimer

    prompts = [Ex(p) for p in ("U1:", "U2:", "U3:", "V1:", "U4:", "U5:", "V2:", "U6:")]
    path = str(Path(__file__).resolve()) + ":uniform_half"
    cfg = easy_config(tmp_path, **{"reward.funcs": {path: 1.0}, "rollout.dynamic_sampling": True,
                                   "rollout.max_resample_rounds": 2, "rollout.prompts_per_step": 4,
                                   "rollout.max_completion_length": 6})
    state = build_state(cfg, train_examples=prompts)
    seen = []
    real = collect_mod.generate_and_score
    monkeypatch.setattr(collect_mod, "generate_and_score",
                        lambda st, ex, timer: seen.append([e.prompt for e in ex]) or real(st, ex, timer))
    rollout, scores, _, info = collect_mod.collect_batch(state, PhaseTimer())
    G = cfg.rollout.num_generations
    assert 1 <= len(seen) <= 1 + 2                               # at most max_resample_rounds extra rounds
    assert (scores.total.view(-1, G).std(-1) > 0).all()          # every kept group carries signal
    assert not any(p.startswith("U") for p in rollout.prompts)   # every uniform group was dropped
    n_uniform = sum(p.startswith("U") for batch in seen for p in batch)
    assert info["dynamic/groups_dropped"] == n_uniform
    assert info["dynamic/extra_generations"] == (len(seen) - 1) * 4 * G
    assert info["dynamic/groups_kept"] == rollout.completion_ids.shape[0] // G <= 4
    assert scores.total.numel() == rollout.completion_ids.shape[0] == len(rollout.completions)


@pytest.mark.parametrize("values,message", [
    ({"preset": "dapo", "rollout.num_generations": 1},
     "rollout.num_generations must be >= 2 (GRPO compares completions within a group), got 1"),
    ({"loss.epsilon": 0.3, "loss.epsilon_high": 0.2},
     "loss.epsilon_high (0.2) must be >= loss.epsilon (0.3)"),
    ({"loss.num_iterations": 0}, "loss.num_iterations (mu) must be >= 1, got 0"),
])
def test_invalid_combinations(values, message):
    with pytest.raises(ConfigError) as e:
        build_config(values)
    assert str(e.value) == message


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo", "vespo"])
def test_trainer_micro_batches_give_the_big_batch_loss_and_gradients(tmp_path, monkeypatch, loss_type):
    """One update with micro_batch_size=8 (4 micro-batches) equals one pass over all 32 completions."""
    from grpokit.observe.metrics import PhaseTimer

    grads = {}

    def capture(state):
        grads[state.cfg.optim.micro_batch_size] = [p.grad.clone() for p in state.model.parameters()]
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0

    monkeypatch.setattr("grpokit.train.update.optimizer_step", capture)
    results = {}
    for mb in (0, 8):
        cfg = easy_config(tmp_path, **{"optim.micro_batch_size": mb, "loss.loss_type": loss_type})
        state = build_state(cfg, train_examples=PROMPTS)
        torch.manual_seed(0)
        rollout, scores, _, _ = collect_mod.collect_batch(state, PhaseTimer())
        # make lengths differ so micro-batches carry different token counts
        rollout.completion_mask[::3, 5:] = 0
        adv = step_mod.compute_advantages(cfg, rollout, scores.total, None)
        ref = step_mod.forward_logprobs(state.ref_model, rollout, cfg)
        results[mb] = update_mod.policy_update(state, rollout, adv, old_lp=None, ref_lp=ref,
                                                loss_mask=rollout.completion_mask.float(), timer=PhaseTimer())
    assert results[0]["loss"] == pytest.approx(results[8]["loss"], abs=1e-6)
    assert results[0]["approx_kl"] == pytest.approx(results[8]["approx_kl"], abs=1e-6)
    for a, b in zip(grads[0], grads[8]):
        assert torch.allclose(a, b, atol=1e-6)
