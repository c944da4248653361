"""grpokit.train.ppo: GAE, clipped value loss, the value model, and the PPO step against GRPO's contract."""

import pytest
import torch

import grpokit.train.collect as collect_mod
from easy_task import PROMPTS, easy_config
from grpokit.config.schema import ConfigError, build_config
from grpokit.core.ppo import clipped_value_loss, gae, terminal_rewards, whiten
from grpokit.observe.metrics import PhaseTimer
from grpokit.train.loop import build_state
from grpokit.train.ppo import ValueModel, ppo_learn
from grpokit.train.step import step_function


def test_terminal_reward_sits_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = terminal_rewards(torch.tensor([2.0, float("nan"), 5.0]), mask)
    # row 0 ends at t=2; row 1's NaN (unscored) counts as 0; row 2 has no valid token: no reward
    assert out.tolist() == [[0, 0, 2.0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_gae_with_gamma_and_lambda_one_is_reward_minus_value():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).float()
    values = torch.tensor([[0.1, 0.4, -0.3, 9.0], [0.5, 0.25, 7.0, 7.0]])   # values past the end are ignored
    rewards = terminal_rewards(torch.tensor([1.0, -1.0]), mask)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # A_t = R - V_t on valid tokens; returns = R on valid tokens
    assert torch.allclose(adv, torch.tensor([[0.9, 0.6, 1.3, 0], [-1.5, -1.25, 0, 0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0, 0], [-1.0, -1.0, 0, 0]]))


def test_gae_hand_derived_with_discount():
    # one completion of 2 tokens, gamma 0.5, lam 0.5, V = (1, 2), r = (0, 4):
    #   delta_1 = 4 - 2 = 2;               A_1 = 2
    #   delta_0 = 0 + 0.5 * 2 - 1 = 0;     A_0 = 0 + 0.25 * 2 = 0.5
    adv, ret = gae(torch.tensor([[0.0, 4.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2), 0.5, 0.5)
    assert torch.allclose(adv, torch.tensor([[0.5, 2.0]]))
    assert torch.allclose(ret, torch.tensor([[1.5, 4.0]]))


def test_gae_matches_a_plain_python_loop():
    torch.manual_seed(0)
    N, T, gamma, lam = 5, 7, 0.9, 0.8
    lengths = [7, 3, 1, 5, 6]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])
    rewards, values = torch.randn(N, T) * mask, torch.randn(N, T)
    adv, _ = gae(rewards, values, mask, gamma, lam)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in reversed(range(n)):
            v_next = float(values[i, t + 1]) if t + 1 < n else 0.0
            running = float(rewards[i, t]) + gamma * v_next - float(values[i, t]) + gamma * lam * running
            assert adv[i, t].item() == pytest.approx(running, abs=1e-5)
        assert adv[i, n:].abs().sum() == 0


def test_whiten_uses_only_valid_tokens():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    out = whiten(x, torch.tensor([[1, 1, 0]]))
    assert torch.allclose(out, torch.tensor([[-1.0, 1.0, 0.0]]), atol=1e-4)   # mean 2, std 1


def test_clipped_value_loss_hand_derived():
    # token 0: V=1.0, V_old=0.0, ret=1.0, c=0.2 -> clipped V=0.2; max((0)^2, (0.8)^2) / 2 = 0.32 (clip wins)
    # token 1: V=0.1, V_old=0.0, ret=1.0       -> clipped V=0.1; both 0.81; / 2 = 0.405 (no clip)
    values = torch.tensor([[1.0, 0.1]], requires_grad=True)
    loss, mets = clipped_value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2)
    assert loss.item() == pytest.approx((0.32 + 0.405) / 2)                 # grpo: per-completion token mean
    assert mets["value_clipfrac"].item() == pytest.approx(0.5)
    loss.backward()
    # token 0 takes the clipped branch (no gradient through clip at 1.0 - 0.0 > 0.2): d/dV = 0
    # token 1: d/dV of 0.5 * (V - 1)^2 / 2 = (0.1 - 1) / 2 = -0.45
    assert torch.allclose(values.grad, torch.tensor([[0.0, -0.45]]))


def test_value_model_is_initialised_from_the_policy_and_separate(tiny_model, char_tokenizer):
    vm = ValueModel(tiny_model)
    for (n, p), q in zip(tiny_model.get_decoder().named_parameters(), vm.backbone.parameters()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr(), n
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    values = vm(ids, torch.ones_like(ids), completion_length=3)
    assert values.shape == (1, 3) and values.dtype == torch.float32
    assert not any(p.requires_grad is False for p in vm.parameters())


def test_ppo_step_updates_policy_and_value_model_and_keeps_the_reference(tmp_path):
    cfg = easy_config(tmp_path, **{"loss.algorithm": "ppo", "run.max_steps": 2})
    state = build_state(cfg, train_examples=PROMPTS)
    pol = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    val = {n: p.detach().clone() for n, p in state.critic.model.named_parameters()}
    for _ in range(2):  # the head starts near zero; by step 2 the backbone has gradient too
        m = step_function(cfg)(state)  # the loop's choice for loss.algorithm=ppo: ppo_train_step
    for key in ("loss", "value_loss", "value_clipfrac", "approx_kl", "value_grad_norm", "returns_mean"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), key
    assert [n for n, p in state.model.named_parameters() if torch.equal(p, pol[n])] == []
    assert [n for n, p in state.critic.model.named_parameters() if torch.equal(p, val[n])] == []
    for n, p in state.ref_model.named_parameters():
        assert torch.equal(p, pol[n])


def test_ppo_micro_batches_give_the_big_batch_gradients(tmp_path, monkeypatch):
    """Policy and value gradients of one PPO update with 4 micro-batches equal one pass over 32 rows."""
    grads = {}

    def capture_policy(state):
        grads[("policy", state.cfg.optim.micro_batch_size)] = [p.grad.clone()
                                                               for p in state.model.parameters()]
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0

    monkeypatch.setattr("grpokit.train.ppo.optimizer_step", capture_policy)
    for mb in (0, 8):
        cfg = easy_config(tmp_path, **{"loss.algorithm": "ppo", "optim.micro_batch_size": mb})
        state = build_state(cfg, train_examples=PROMPTS)
        critic_step = state.critic.step

        def capture_value(max_norm, mb=mb, state=state, critic_step=critic_step):
            grads[("value", mb)] = [p.grad.clone() for p in state.critic.model.parameters()]
            return critic_step(max_norm)
        state.critic.step = capture_value
        torch.manual_seed(0)
        rollout, scores, _, _ = collect_mod.collect_batch(state, PhaseTimer())
        rollout.completion_mask[::3, 5:] = 0                               # unequal lengths
        ppo_learn(state, rollout, scores.total, PhaseTimer())
    for kind in ("policy", "value"):
        for a, b in zip(grads[(kind, 0)], grads[(kind, 8)]):
            assert torch.allclose(a, b, atol=1e-6), kind


def test_ppo_config_fields_are_validated():
    assert build_config({"loss.algorithm": "ppo"}).loss.lam == 0.95
    with pytest.raises(ConfigError, match="loss.algorithm must be one of grpo, ppo"):
        build_config({"loss.algorithm": "ppo2"})
    with pytest.raises(ConfigError, match="loss.gamma and loss.lam"):
        build_config({"loss.gamma": 1.5})
    with pytest.raises(ConfigError, match="model.lora_r=0"):
        build_config({"loss.algorithm": "ppo", "model.lora_r": 8})


def test_the_loop_picks_the_step_once_and_train_step_stays_grpo(tmp_path):
    from types import SimpleNamespace

    from grpokit.train.ppo import ppo_train_step
    from grpokit.train.step import train_step
    ppo, grpo = easy_config(tmp_path, **{"loss.algorithm": "ppo"}), easy_config(tmp_path)
    assert step_function(ppo) is ppo_train_step and step_function(grpo) is train_step
    with pytest.raises(ValueError, match="loss.algorithm=ppo: run grpokit.train.ppo.ppo_train_step"):
        train_step(SimpleNamespace(cfg=ppo))
