"""The lean training step (length-bucketed micro-batches, chunked log-probs) against the plain computation."""

import os

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.core.loss import grpo_objective_from_logprobs
from grpokit.model.buckets import length_buckets, micro_batches
from grpokit.model.loading import frozen_reference
from grpokit.model.logprobs import per_token_logprobs, position_ids_from_mask
from grpokit.model.shared_prompts import can_share_prompts
from grpokit.model.testing import bench_prompts, build_model
from grpokit.observe.metrics import PhaseTimer
from grpokit.rollout.groups import sample_groups
from grpokit.train import state as state_mod
from grpokit.train.loop import build_state
from grpokit.train.state import TrainState, make_optimizer
from grpokit.train.step import train_step
from grpokit.train.update import forward_logprobs, policy_update


def test_length_buckets_hand_examples():
    # [10, 10, 1, 1], no launch cost: two groups (2*10 + 2*1 = 22 slots) beat one (4*10 = 40)
    groups = length_buckets(torch.tensor([1, 10, 1, 10]), max_rows=4, overhead_tokens=0)
    assert [sorted(g.tolist()) for g in groups] == [[1, 3], [0, 2]]
    # a launch cost of 100 slots makes one group cheaper (40 + 100 < 22 + 200)
    assert len(length_buckets(torch.tensor([1, 10, 1, 10]), 4, 100)) == 1
    # equal lengths: the plain consecutive micro-batches
    assert [g.tolist() for g in length_buckets(torch.full((5,), 7), 2, 0)] == [[0, 1], [2, 3], [4]]


def test_length_buckets_partition_and_cost_against_brute_force():
    torch.manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 50, (7,))
        groups = length_buckets(lengths, max_rows=3, overhead_tokens=5.0)
        flat = torch.cat(groups).tolist()
        assert sorted(flat) == list(range(7)) and all(len(g) <= 3 for g in groups)
        cost = sum(len(g) * int(lengths[g].max()) + 5.0 for g in groups)
        # brute force over every cut of the sorted order
        s = sorted(lengths.tolist(), reverse=True)
        best = float("inf")
        for mask in range(1 << 6):
            cuts = [0] + [i + 1 for i in range(6) if mask >> i & 1] + [7]
            parts = [s[a:b] for a, b in zip(cuts, cuts[1:])]
            if all(len(p) <= 3 for p in parts):
                best = min(best, sum(len(p) * p[0] + 5.0 for p in parts))
        assert cost == best


@pytest.fixture()
def varied_batch():
    model, tok = build_model("tiny", mean_length=6)   # EOS-biased: completions stop at spread-out lengths
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(3), 4, 16, backend="fast")
    assert len(set(r.completion_lengths.tolist())) >= 4
    return model, tok, r


def _plain_logprobs(model, r, temperature=1.0):
    """The textbook computation: full [N, P+T, V] log-softmax over the untrimmed batch."""
    ids, att = r.input_ids, r.attention_mask
    T = r.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
    logp = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, -1)
    return logp.gather(-1, ids[:, -T:, None]).squeeze(-1)


def _zero_launch_cost(pm, cm, mb, n_params, by_length=True, prompt_ids=None):
    """micro_batches with no launch cost: as many length buckets as padding makes worthwhile."""
    return micro_batches(pm, cm, mb, 10**12, by_length, prompt_ids=prompt_ids)


def test_bucketed_reference_forward_equals_plain(varied_batch, monkeypatch):
    model, _, r = varied_batch
    cfg = build_config({"rollout.max_completion_length": 24})
    assert len(_zero_launch_cost(r.prompt_mask, r.completion_mask, r.completion_ids.shape[0], 0)) > 2
    monkeypatch.setattr("grpokit.train.update.micro_batches", _zero_launch_cost)
    got = forward_logprobs(model, r, cfg)
    with torch.no_grad():
        want = _plain_logprobs(model, r)
    m = r.completion_mask.bool()
    assert torch.allclose(got[m], want[m], atol=1e-5)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo"])
def test_policy_update_loss_and_gradients_equal_plain_path(varied_batch, monkeypatch, loss_type):
    model, tok, r = varied_batch
    cfg = build_config({"loss.loss_type": loss_type, "loss.beta": 0.04, "rollout.max_completion_length": 16,
                        "rollout.num_generations": 4})
    ref = frozen_reference(model)
    with torch.no_grad():                      # a reference that differs from the policy: non-zero KL
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ref_lp = forward_logprobs(ref, r, cfg)
    adv = torch.randn(r.completion_ids.shape[0])
    mask = r.completion_mask.float()
    # plain path: one full batch, textbook log-probs
    new_lp = _plain_logprobs(model, r)
    loss, _ = grpo_objective_from_logprobs(new_lp, None, ref_lp, mask, adv, 0.2, 0.04, loss_type=loss_type,
                                           max_completion_length=16)
    want = torch.autograd.grad(loss, list(model.parameters()))
    # fast path: policy_update with length buckets (launch cost 0: as many buckets as pays off)
    monkeypatch.setattr("grpokit.train.update.micro_batches", _zero_launch_cost)
    got = {}

    def capture(state, finite=True):
        got["grads"] = [p.grad.clone() for p in state.model.parameters()]
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0
    monkeypatch.setattr("grpokit.train.update.optimizer_step", capture)
    opt, sched = make_optimizer(model, cfg)
    state = TrainState(cfg, model, tok, ref, opt, sched, [], None)
    out = policy_update(state, r, adv, old_lp=None, ref_lp=ref_lp, loss_mask=mask,
                                timer=PhaseTimer())
    assert abs(out["loss"] - float(loss.detach())) < 1e-5
    for a, b in zip(got["grads"], want):
        assert torch.allclose(a, b, atol=1e-5)


def _count_decoder_tokens(model):
    """A hook on the embedding: how many token positions went through the decoder."""
    seen = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
    return seen, handle


@pytest.mark.parametrize("T_cut", [None, 1])
def test_shared_prompt_pass_equals_plain_pass_and_runs_each_prompt_once(T_cut):
    model, tok = build_model("tiny", mean_length=6)
    torch.manual_seed(1)
    # prompts of different lengths (left padding inside the batch), G = 4 rows each, spread-out lengths
    r = sample_groups(model, tok, ["1+2=", "a much longer prompt 33+44=", "7*8?"], 4, 12, backend="fast")
    T = T_cut or r.completion_ids.shape[1]
    ids, att = r.input_ids[:, :r.prompt_ids.shape[1] + T], r.attention_mask[:, :r.prompt_ids.shape[1] + T]
    B, P = r.prompt_ids.shape
    assert can_share_prompts(model, ids, att, T)
    out = {}
    for share in (False, True):
        model.zero_grad()
        seen, handle = _count_decoder_tokens(model)
        lp, ent = per_token_logprobs(model, ids, att, T, return_entropy=True, share_prompts=share)
        handle.remove()
        m = att[:, -T:].float()
        (lp * m).sum().backward()
        out[share] = (lp.detach() * m, ent * m, [p.grad.clone() for p in model.parameters()], sum(seen))
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ      # the CPU switch is restored after the call
    (lp0, e0, g0, n0), (lp1, e1, g1, n1) = out[False], out[True]
    assert n0 == B * (P + T)
    assert n1 == 3 * P + B * (T - 1)                 # 3 distinct prompts once, then the completions
    assert torch.allclose(lp0, lp1, atol=1e-5) and torch.allclose(e0, e1, atol=1e-5)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prompt_pass_is_skipped_when_it_cannot_help_or_apply():
    model, tok = build_model("tiny")
    r = sample_groups(model, tok, ["1+2=", "3+4="], 1, 6, backend="fast", suppress_eos=True)
    assert not can_share_prompts(model, r.input_ids, r.attention_mask, 6)      # every prompt distinct
    r = sample_groups(model, tok, ["1+2="], 4, 6, backend="fast", suppress_eos=True)
    assert can_share_prompts(model, r.input_ids, r.attention_mask, 6)
    model.gradient_checkpointing_enable()                                       # transformers drops the cache
    assert not can_share_prompts(model, r.input_ids, r.attention_mask, 6)


def test_adamw_fused_for_plain_cpu_parameters_and_same_update_as_the_loop():
    """make_optimizer takes AdamW's fused kernel for plain CPU float parameters; one step moves the
    weights as the default per-parameter AdamW does (to float rounding)."""
    model, _ = build_model("tiny")
    cfg = build_config({"optim.learning_rate": 1e-3, "optim.weight_decay": 0.1})
    opt, _ = make_optimizer(model, cfg)
    assert opt.defaults["fused"] is True
    twin = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    loop = torch.optim.AdamW(twin.values(), lr=1e-3, betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2),
                             weight_decay=0.1, foreach=False)
    torch.manual_seed(0)
    for n, p in model.named_parameters():
        p.grad = torch.randn_like(p)
        twin[n].grad = p.grad.clone()
    opt.step()
    loop.step()
    for n, p in model.named_parameters():
        assert torch.allclose(p, twin[n], atol=1e-6), n
    assert not state_mod._can_fuse([torch.zeros(3, dtype=torch.long)])


# The one switch (grpokit.switch): off, a whole train_step is plain PyTorch; on, it computes the same step.

def _one_step(reuse_on: bool, monkeypatch, switch) -> dict:
    """One GRPO step of the built-in tiny model (beta > 0: a reference pass too) inside `switch()`:
    its metrics, every gradient the optimizer stepped on, and the weights after."""
    from grpokit.train import update

    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "task.num_train": 8, "task.num_eval": 2,
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "loss.beta": 0.04,
                        "reward.funcs": {"tests.train.test_guards:dense_reward": 1.0},
                        "rollout.max_completion_length": 10, "rollout.reuse_activations": reuse_on,
                        "optim.learning_rate": 1e-2, "run.eval_limit": 0, "run.progress": False})
    torch.manual_seed(0)
    state = build_state(cfg)
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    grads, real_step = {}, update.optimizer_step

    def step_and_keep_grads(s):
        grads.update({n: p.grad.clone() for n, p in s.model.named_parameters() if p.grad is not None})
        return real_step(s)

    monkeypatch.setattr(update, "optimizer_step", step_and_keep_grads)
    torch.manual_seed(1)
    with switch():
        metrics = train_step(state)
    monkeypatch.setattr(update, "optimizer_step", real_step)
    after = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    return {"metrics": metrics, "grads": grads, "before": before, "after": after}


def _forbid_kernels(monkeypatch) -> None:
    """Every entry point of the optional speed-ups raises: the plain path must never reach one."""
    from grpokit.fast import fused_ops, master_grads, native, reuse, small_attention, whole_step

    def entered(*a, **k):
        raise AssertionError("a speed-up was entered with the switch off")

    for module, name in ((native, "kernels"), (native, "keep_freed_memory"), (whole_step.WholeStep, "plan"),
                         (fused_ops, "fused_ops"), (master_grads, "installed"),
                         (reuse, "reused_logprobs"), (small_attention, "installed"),
                         (reuse.ActivationRecord, "__init__")):
        monkeypatch.setattr(module, name, entered)


@pytest.mark.parametrize("reuse_on", [False, True])
def test_train_step_switch_off_is_plain_and_on_equals_it(monkeypatch, reuse_on):
    import contextlib

    from grpokit import fast, switch
    from grpokit.fast import fused_ops, native

    with monkeypatch.context() as off_patch:
        _forbid_kernels(off_patch)
        off = _one_step(reuse_on, monkeypatch, switch.plain)       # train_step's own switch: overridden
    entered, plans = [], []
    real_plan = fast.Scope.whole_step
    monkeypatch.setattr(fast.Scope, "whole_step", lambda *a: plans.append(p := real_plan(*a)) or p)
    for cls in (fused_ops.SiluMul, fused_ops.RMSNormFn, fused_ops.GatedSiluMul):
        real = cls.apply
        monkeypatch.setattr(cls, "apply",
                            lambda *a, real=real, cls=cls: entered.append(cls.__name__) or real(*a))
    on = _one_step(reuse_on, monkeypatch, contextlib.nullcontext)        # train_step's own switch.accelerated
    if native.kernels() is not None:                                      # the speed-ups really ran
        assert plans and all(p is not None for p in plans)                # the one-call C decode step
        # the training passes' kernels: the plain update's, or the reused update's SiLU x up on the record
        assert ({"GatedSiluMul"} if reuse_on else {"SiluMul", "RMSNormFn"}) <= set(entered)
    assert on["metrics"]["completion_tokens"] == off["metrics"]["completion_tokens"]   # the same samples
    for key in ("loss", "kl", "grad_norm"):
        if key in off["metrics"]:
            assert on["metrics"][key] == pytest.approx(off["metrics"][key], abs=1e-5, rel=1e-4), key
    assert on["grads"].keys() == off["grads"].keys() and off["grads"]
    for n, g in off["grads"].items():
        assert float((on["grads"][n] - g).abs().max()) <= 1e-5 * (float(g.abs().max()) or 1.0), n
    for n, w in off["after"].items():   # Adam amplifies rounding on near-zero gradients: compare to the step
        moved = float((w - off["before"][n]).abs().max())
        assert moved > 0 and float((on["after"][n] - w).abs().max()) <= 1e-2 * moved, n


def test_the_switch_restores_everything_and_nests():
    """Inside `switch.accelerated`: the fused forwards, grpokit's attention entry, the decode kernels; after
    it (even when the block raises) nothing is left; an inner context changes nothing, `switch.plain()`
    turns everything off inside."""
    from grpokit import switch
    from grpokit.fast import native, small_attention
    from grpokit.model.speedups import active

    model, _ = build_model("tiny")
    K = native.kernels()
    with pytest.raises(RuntimeError), switch.accelerated(model) as scope:
        assert scope.on and active() is scope and model.config._attn_implementation == small_attention.NAME
        assert active().decode_kernels(model) is K
        assert K is None or "forward" in vars(model.model.norm)          # the fused RMSNorm swapped in
        with switch.accelerated(build_model("tiny")[0]) as inner:
            assert inner is scope                                         # the outer context decides
        with switch.plain():
            assert active().decode_kernels(model) is None and not active().on
        raise RuntimeError("a failing step")
    assert model.config._attn_implementation == "sdpa" and not active().on
    assert not any("forward" in vars(m) for m in model.modules())        # no module left patched
    assert active().decode_kernels(model) is None                         # outside: the plain path
    with switch.accelerated(model, enabled=False) as off:
        assert not off.on and active().decode_kernels(model) is None
