"""Mixed precision (model.precision): fp32 master weights, bf16 matmuls, fp32 log-softmax and loss.

Tiny random-init Qwen2 models on the CPU, seconds each. Tolerances (measured, then given ~3x room):
bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%), so a log-prob, a sum over ~100 terms of
bf16-rounded products, moves by a few 1e-3; the gradient of a whole update by ~1% in L2.
"""

import copy
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit import switch
from grpokit.config.schema import ConfigError, build_config
from grpokit.model import precision
from grpokit.model.loading import build_char_tokenizer, frozen_reference, tiny_random_model
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.precision import (
    apply_precision,
    computing_in,
    lost_update_warning,
    reference_storage,
    resolve_precision,
)
from grpokit.observe.metrics import PhaseTimer
from grpokit.rollout.groups import sample_groups
from grpokit.rollout.sampler import LeanDecoder
from grpokit.train.loop import train_grpo
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.step import compute_advantages
from grpokit.train.update import forward_logprobs, policy_update

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"
LOGPROB_ATOL = 0.05        # max |logp_bf16 - logp_fp32| over every token (measured ~0.015)
GRAD_REL = 0.05            # ||g_bf16 - g_fp32|| / ||g_fp32|| (measured ~0.01)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reductions in every run: bit-identical resume
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok):
    return tiny_random_model(tok, seed=0, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)


def _cfg(**over):
    values = {"model.name_or_path": "builtin:tiny-random", "rollout.num_generations": 4,
              "rollout.prompts_per_step": 2, "rollout.max_completion_length": 12, "optim.learning_rate": 1e-3,
              "run.eval_limit": 0, "run.progress": False, "loss.beta": 0.04}
    values.update(over)
    return build_config(values)


def _rollout(model, tok):
    torch.manual_seed(0)
    r = sample_groups(model, tok, ["What is 12+34?", "What is 5+6?"], 4, 12, suppress_eos=True)
    rewards = torch.tensor([c.count("1") / 12.0 + 0.01 * i for i, c in enumerate(r.completions)])
    return r, rewards


def _update(model, tok, rollout, rewards, cfg):
    """One policy update (reference pass included) on `rollout`; returns (weights before, after, metrics)."""
    apply_precision(model, cfg)
    ref = reference_storage(frozen_reference(model), model)
    opt, sched = make_optimizer(model, cfg)
    state = TrainState(cfg, model, tok, ref, opt, sched, [], None)
    before = [p.detach().clone() for p in model.parameters()]
    ref_lp = forward_logprobs(ref, rollout, cfg)
    adv = compute_advantages(cfg, rollout, rewards, None)
    mets = policy_update(state, rollout, adv, old_lp=None, ref_lp=ref_lp,
                         loss_mask=rollout.completion_mask.float(), timer=PhaseTimer())
    return before, [p.detach().clone() for p in model.parameters()], mets


def test_bf16_mixed_update_equals_the_fp32_update_up_to_bf16_rounding(tok):
    fp32, rollout_rewards = _model(tok), None
    rollout_rewards = _rollout(fp32, tok)
    bf16 = copy.deepcopy(fp32)
    b32, a32, m32 = _update(fp32, tok, *rollout_rewards, _cfg(**{"model.precision": "fp32"}))
    b16, a16, m16 = _update(bf16, tok, *rollout_rewards, _cfg(**{"model.precision": "bf16"}))
    assert all(p.dtype == torch.float32 for p in bf16.parameters())          # master weights stay fp32
    assert all(torch.equal(x, y) for x, y in zip(b32, b16))
    # AdamW's first step is lr * g / (|g| + eps): compare the gradients through the clipped-norm metric
    # and the updates' direction (elements whose gradient is ~0 may take either sign in both precisions).
    assert m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=GRAD_REL)
    d32 = torch.cat([(a - b).flatten() for a, b in zip(a32, b32)])
    d16 = torch.cat([(a - b).flatten() for a, b in zip(a16, b16)])
    cos = float(torch.nn.functional.cosine_similarity(d32, d16, dim=0))
    assert cos > 0.95, cos                                                     # measured ~0.99
    assert m16["loss"] == pytest.approx(m32["loss"], abs=2e-3)


def test_bf16_gradient_matches_fp32_within_tolerance(tok):
    model = _model(tok)
    rollout, _ = _rollout(model, tok)
    T = rollout.completion_ids.shape[1]
    grads = []
    for dtype in (None, torch.bfloat16):
        model.zero_grad()
        with computing_in(model, dtype):
            per_token_logprobs(model, rollout.input_ids, rollout.attention_mask, T).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # fp32 grads on fp32 masters
    rel = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert 0 < rel < GRAD_REL, rel                                            # bf16 really ran, and agrees


def test_a_step_at_lr_1e6_changes_the_fp32_master_weights(tok):
    model = _model(tok)
    rollout, rewards = _rollout(model, tok)
    before, after, _ = _update(model, tok, rollout, rewards, _cfg(**{"model.precision": "bf16",
                                                                         "optim.learning_rate": 1e-6}))
    changed = sum(int((a != b).sum()) for a, b in zip(after, before))
    total = sum(b.numel() for b in before)
    assert changed > 0.5 * total, (changed, total)                 # embeddings of unseen tokens: no gradient
    # The same step on weights *stored* in bf16 is rounded away: that is what the warning says.
    stored = _model(tok).to(torch.bfloat16)
    msg = lost_update_warning(stored, 1e-6)
    assert msg is not None and "model.precision=bf16" in msg
    w = stored.model.layers[0].mlp.up_proj.weight
    moved = float(((w.detach() - 1e-6) != w.detach()).float().mean())     # an lr-sized step on each weight
    assert moved < 0.1, moved                                                  # only those near 0 change
    assert lost_update_warning(stored, 1e-2) is None and lost_update_warning(_model(tok), 1e-6) is None


def test_bf16_logprobs_agree_with_fp32_and_the_mu1_ratio_is_exactly_one(tok):
    model = _model(tok)
    rollout, rewards = _rollout(model, tok)
    T = rollout.completion_ids.shape[1]
    with torch.no_grad():
        lp32 = per_token_logprobs(model, rollout.input_ids, rollout.attention_mask, T)
        with computing_in(model, torch.bfloat16):
            lp16 = per_token_logprobs(model, rollout.input_ids, rollout.attention_mask, T)
    assert lp16.dtype == torch.float32                                        # log-softmax in fp32
    # the bf16 sampler's own log-probs
    with computing_in(model, torch.bfloat16):
        torch.manual_seed(0)
        r16 = sample_groups(model, tok, ["What is 12+34?", "What is 5+6?"], 4, 12, suppress_eos=True)
        with torch.no_grad():
            lp_r16 = per_token_logprobs(model, r16.input_ids, r16.attention_mask, r16.completion_ids.shape[1])
    assert float((lp_r16 - r16.sampling_logprobs).abs().max()) < LOGPROB_ATOL
    err = float((lp16 - lp32).abs().max())
    assert 0 < err < LOGPROB_ATOL, err
    _, _, mets = _update(model, tok, rollout, rewards, _cfg(**{"model.precision": "bf16"}))
    assert mets["mean_ratio"] == 1.0 and mets["clip_ratio"] == 0.0            # mu = 1: old = new.detach()


def test_the_sampler_runs_bf16_matmuls_beside_fp32_kernels(tok):
    model = _model(tok)
    ids, mask = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    logits = []
    for dtype in (None, torch.bfloat16):
        with computing_in(model, dtype), switch.accelerated(model):        # the C kernels: behind the switch
            dec = LeanDecoder(model, 1, 8)
            assert (dec.whole is None) == (dtype is not None)                  # the C whole step is fp32 only
            assert all(w["qkv"].weight.dtype == (dtype or torch.float32) for w in dec.layers)
            logits.append(dec.prefill(ids, mask, 1))
    assert logits[1].dtype == torch.float32
    assert 0 < float((logits[1] - logits[0]).abs().max()) < LOGPROB_ATOL


def test_checkpoints_save_and_resume_the_fp32_master_weights_bit_identically(tmp_path):
    def cfg(out, **over):
        return _cfg(**{"model.precision": "bf16", "reward.funcs": {EASY: 1.0}, "task.num_train": 32,
                       "task.num_eval": 4, "run.output_dir": str(out), "run.max_steps": 4,
                       "run.save_steps": 2,
                       "optim.learning_rate": 3e-3, **over})

    full = train_grpo(cfg(tmp_path / "full"))
    saved = load_file(tmp_path / "full" / "checkpoint-2" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in saved.values())              # the masters, not a bf16 copy
    assert all(t.dtype == torch.bfloat16 for t in
               load_file(tmp_path / "full" / "checkpoint-2" / "ref_model.safetensors").values())
    part = tmp_path / "part"
    train_grpo(cfg(part, **{"run.max_steps": 2}))
    resumed = train_grpo(cfg(part, **{"run.resume": True}))
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name
    moved = load_file(tmp_path / "full" / "checkpoint-4" / "model.safetensors")
    assert any(not torch.equal(saved[k], moved[k]) for k in saved)            # the weights did move


def _cpu(monkeypatch, native: bool):
    monkeypatch.setattr(precision, "bf16_matmul_native",
                        lambda device: (native, "AVX512-BF16 (simulated)" if native else "none (simulated)"))


@pytest.mark.parametrize("native", [True, False])
def test_auto_resolves_by_capability_and_model_size(monkeypatch, native, tok, caplog):
    _cpu(monkeypatch, native)
    cpu, big, small = torch.device("cpu"), 135_000_000, 100_000
    choice, why = resolve_precision("auto", cpu, big)
    assert choice == ("bf16" if native else "fp32") and why.startswith("auto: ") and "simulated" in why
    assert resolve_precision("auto", cpu, small)[0] == "fp32"                # too small to pay
    assert resolve_precision("bf16", cpu, small) == ("bf16", "model.precision=bf16")
    assert resolve_precision("fp32", cpu, big) == ("fp32", "model.precision=fp32")
    assert resolve_precision("auto", cpu, big, torch.bfloat16)[0] == "fp32"  # 16-bit storage: its own dtype
    model = _model(tok)
    with caplog.at_level(logging.INFO, logger="grpokit"):
        assert apply_precision(model, _cfg())[0] == "fp32"                    # tiny: fp32 either way
    assert "precision: fp32 (auto: " in caplog.text
    assert precision.compute_dtype(model) is None


def test_precision_is_a_declared_choice():
    assert build_config({}).model.precision == "auto"
    with pytest.raises(ConfigError, match=r"precision must be one of fp32, bf16, auto.*did you mean 'bf16'"):
        build_config({"model.precision": "bf61"})
    with pytest.raises(ConfigError, match="contradicts model.dtype=bfloat16"):
        build_config({"model.precision": "fp32", "model.dtype": "bfloat16"})
    assert build_config({"model.precision": "bf16", "model.dtype": "bfloat16"}).model.precision == "bf16"
