"""The update's forward that reuses the sampler's projection outputs (grpokit.fast.reuse) against the plain
pass."""

import dataclasses
import math

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from grpokit import switch
from grpokit.config.schema import build_config
from grpokit.fast import reuse
from grpokit.model import buckets
from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.testing import VOCAB, bench_prompts, build_tokenizer
from grpokit.rollout.groups import sample_groups
from grpokit.train.loop import build_state
from grpokit.train.step import train_step

ARCHS = {
    "qwen2": (Qwen2Config, {}),                                           # q/k/v biases, GQA
    "llama": (LlamaConfig, {}),                                           # no biases
    "qwen3": (Qwen3Config, {"head_dim": 16}),                             # q/k norms
}


def build(arch: str, tok, mean_length: float = 0.0, seed: int = 0):
    """A random-init model of `arch` (hidden 64, 2 layers, 4 heads / 2 KV heads); mean_length > 0 adds an
    EOS bias to the lm-head so completions stop at spread-out lengths."""
    from transformers import AutoModelForCausalLM

    cls, extra = ARCHS[arch]
    cfg = cls(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
              tie_word_embeddings=False, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if mean_length:
        head = torch.nn.Linear(64, VOCAB, bias=True)
        head.weight = model.lm_head.weight
        with torch.no_grad():
            head.bias.zero_()
            p = 1.0 / mean_length
            head.bias[tok.eos_token_id] = math.log(p * (VOCAB - 1) / (1 - p))
        model.lm_head = head
    return model.train()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def prompts() -> list[str]:
    p = bench_prompts(3)
    p[1] = "a longer prompt, so the batch is left-padded: " + p[1]
    return p


def grads(model, fn) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    lp = fn()
    (lp * torch.linspace(0.5, 1.5, lp.shape[1])).sum().backward()        # unequal weights per position
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close_grads(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for n in a:
        scale = float(a[n].abs().max()) or 1.0
        assert float((a[n] - b[n]).abs().max()) <= tol * scale, n


REUSED_LOGPROBS = reuse.reused_logprobs   # the function itself (tests patch it to count its calls)


def recorded(model, tok, *args, record=True, **kw):
    """sample_groups inside `switch.accelerated(model, record=...)`: (the rollout, the scope's record)."""
    with switch.accelerated(model, record=record) as scope:
        r = sample_groups(model, tok, *args, **kw)
        return r, scope.held_record()


def reused(model, r, rows):
    mask = r.completion_mask[rows]
    T = int(mask.sum(-1).max())
    ids = torch.cat([r.prompt_ids[rows], r.completion_ids[rows, :T]], 1)
    att = torch.cat([r.prompt_mask[rows], mask[:, :T]], 1)
    return ids, att, T


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("natural", [False, True])
def test_reused_forward_equals_the_plain_pass(arch, natural, tok):
    model = build(arch, tok, mean_length=5.0 if natural else 0.0)
    torch.manual_seed(1)
    r, r_rec = recorded(model, tok, prompts(), 4, 12, backend="fast", suppress_eos=not natural, record=True)
    assert isinstance(r_rec, reuse.ActivationRecord) and r_rec.usable(model)
    if natural:   # rows finished early and were dropped from the decode batch
        assert len(set(r.completion_lengths.tolist())) >= 4 and int(r.completion_lengths.min()) < 6
    for rows in (torch.arange(12), torch.tensor([1, 2, 5, 9, 11])):   # the whole batch, and scattered rows
        ids, att, T = reused(model, r, rows)
        m = r.completion_mask[rows, :T]
        lp_plain, g_plain = grads(model, lambda: per_token_logprobs(model, ids, att, T) * m)
        lp_reuse, g_reuse = grads(model, lambda: reuse.reused_logprobs(model, r_rec, rows, ids, att, T) * m)
        assert torch.allclose(lp_plain, lp_reuse, atol=1e-5, rtol=0)
        assert_close_grads(g_plain, g_reuse)


def test_slots_left_unwritten_are_never_read(tok, monkeypatch):
    """The record's buffers start uninitialized: fill them with NaN before decoding; nothing may change."""
    init = reuse.ActivationRecord.__init__

    def nan_init(self, *a, **k):
        init(self, *a, **k)
        for layer in self.comp:
            for buf in layer.values():
                buf.fill_(float("nan"))

    monkeypatch.setattr(reuse.ActivationRecord, "__init__", nan_init)
    model = build("qwen2", tok, mean_length=4.0)
    torch.manual_seed(3)
    r, r_rec = recorded(model, tok, prompts(), 4, 12, backend="fast", record=True)
    assert int(r.completion_lengths.min()) < 4 < int(r.completion_lengths.max())  # rows left the batch early
    rows = torch.arange(12)
    ids, att, T = reused(model, r, rows)
    m = r.completion_mask[:, :T]
    _, g_plain = grads(model, lambda: per_token_logprobs(model, ids, att, T) * m)
    _, g_reuse = grads(model, lambda: reuse.reused_logprobs(model, r_rec, rows, ids, att, T) * m)
    assert all(torch.isfinite(g).all() for g in g_reuse.values())
    assert_close_grads(g_plain, g_reuse)


def test_consuming_drops_what_backward_does_not_need(tok):
    model = build("qwen2", tok)
    r, r_rec = recorded(model, tok, prompts(), 4, 12, backend="fast", suppress_eos=True, record=True)
    rows = torch.arange(12)
    ids, att, T = reused(model, r, rows)
    _, g_plain = grads(model, lambda: per_token_logprobs(model, ids, att, T))
    _, g_reuse = grads(model, lambda: reuse.reused_logprobs(model, r_rec, rows, ids, att, T, consume=True))
    assert_close_grads(g_plain, g_reuse)
    assert all(set(layer) == {"gu"} for layer in r_rec.comp)   # q/k/v, o, down freed during forward
    r_rec.release()
    assert not r_rec.usable(model)


def test_a_record_is_refused_once_the_weights_or_the_model_change(tok):
    model = build("qwen2", tok)
    r, r_rec = recorded(model, tok, prompts(), 2, 4, backend="fast", suppress_eos=True, record=True)
    assert r_rec.usable(model) and r_rec.usable(model, r)
    assert not r_rec.usable(build("qwen2", tok))                  # another model
    edited = dataclasses.replace(r, completion_ids=r.completion_ids.clone())
    edited.completion_ids[1, 2] += 1                                      # a token changed after sampling
    assert not r_rec.usable(model, edited)
    edited.completion_ids[1, 2] -= 1
    assert r_rec.usable(model, edited)                            # the same tokens again
    # dropout in train mode: not the sampled forward
    model.config.attention_dropout = 0.1
    assert not r_rec.usable(model)
    model.config.attention_dropout = 0.0
    with torch.no_grad():
        # an optimizer step bumps the versions
        next(model.parameters()).add_(1e-3)
    assert not r_rec.usable(model)


def test_no_record_where_it_cannot_be_used(tok, monkeypatch):
    model = build("qwen2", tok)
    kw = dict(backend="fast", suppress_eos=True)
    assert recorded(model, tok, prompts(), 2, 4, record=False, **kw)[1] is None   # not asked for
    assert recorded(model, tok, prompts(), 2, 4, backend="generate")[1] is None
    assert recorded(model, tok, prompts(), 2, 4, generation_batch_size=2, **kw)[1] is None   # 2 decode calls
    with switch.plain():                                                    # the switch off: nothing recorded
        assert recorded(model, tok, prompts(), 2, 4, **kw)[1] is None
    assert recorded(model, tok, prompts(), 2, 4, **kw)[1] is not None     # (what the lines above refuse)
    # not the lean path
    model.lm_head = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(64, VOCAB))
    assert recorded(model, tok, prompts(), 2, 4, **kw)[1] is None
    on = {"rollout.reuse_activations": True}
    cfg = build_config(on)
    plain = build("qwen2", tok)
    assert reuse.recording_policy(cfg, 1, plain) is True                  # forced: record to the end
    split = {"rollout.num_generations": 4, "rollout.prompts_per_step": 2, "rollout.generation_batch_size": 4}
    assert not reuse.recording_policy(build_config({**on, **split}), 1, plain)   # decoded in two calls
    assert not reuse.recording_policy(cfg, 2, plain)                      # several processes
    for key, value in (("rollout.reuse_activations", False), ("rollout.dynamic_sampling", True),
                       ("rollout.backend", "generate"), ("loss.algorithm", "ppo")):
        assert not reuse.recording_policy(build_config({**on, key: value}), 1, plain), key
    auto = build_config({})                                               # the default: auto, by model size
    assert not reuse.recording_policy(auto, 1, plain)                     # ~0.1M parameters: it would not pay
    monkeypatch.setattr(reuse, "REUSE_MIN_PARAMS", sum(p.numel() for p in plain.parameters()))
    assert callable(reuse.recording_policy(auto, 1, plain))               # the sampler asks it on the way
    # 32 rows in micro-batches: memory first
    micro = build_config({"optim.micro_batch_size": 8})
    assert not reuse.recording_policy(micro, 1, plain)
    assert reuse.recording_policy(build_config({"optim.micro_batch_size": 8, **on}), 1, plain)
    with pytest.raises(ValueError, match="rollout.reuse_activations must be true, false or auto"):
        build_config({"rollout.reuse_activations": "sometimes"})
    plain.gradient_checkpointing_enable()
    assert not reuse.recording_policy(cfg, 1, plain)


# rewards differ within every group: every step moves the weights
DENSE = "tests.train.test_guards:dense_reward"


def run_steps(reuse_on: bool, monkeypatch, calls: list, iterations: int = 1) -> dict:
    """Two GRPO steps on the built-in tiny model, micro-batches of 4 rows; weights before and after."""
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "task.num_train": 16, "task.num_eval": 4,
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
                        "reward.funcs": {DENSE: 1.0},
                        "rollout.max_completion_length": 10, "optim.micro_batch_size": 4,
                        "optim.learning_rate": 1e-2, "loss.num_iterations": iterations, "loss.beta": 0.04,
                        "rollout.reuse_activations": reuse_on, "run.eval_limit": 0, "run.progress": False})
    real = REUSED_LOGPROBS                                               # the unpatched function
    monkeypatch.setattr(reuse, "reused_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    state = build_state(cfg)
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    losses = [train_step(state)["loss"] for _ in range(2)]
    return {"losses": losses, "before": before,
            "after": {n: p.detach().clone() for n, p in state.model.named_parameters()}}


def test_training_with_reuse_matches_training_without(monkeypatch):
    calls_on, calls_off = [], []
    on = run_steps(True, monkeypatch, calls_on)
    off = run_steps(False, monkeypatch, calls_off)
    # 8 rows in micro-batches of 4, 2 steps
    assert len(calls_on) == 2 * 2 and not calls_off
    assert on["losses"] == pytest.approx(off["losses"], abs=1e-5)
    # Adam amplifies rounding on near-zero gradients: compare to the step size
    for n, w in off["after"].items():
        moved = float((w - off["before"][n]).abs().max())
        assert moved > 0 and float((on["after"][n] - w).abs().max()) <= 1e-2 * moved, n


def test_only_the_first_of_several_iterations_reuses(monkeypatch):
    calls_one, calls_two = [], []
    run_steps(True, monkeypatch, calls_one, iterations=1)
    run_steps(True, monkeypatch, calls_two, iterations=2)
    assert calls_one and calls_two == calls_one                           # iteration 2 runs the plain pass


def test_resume_with_reuse_is_bit_identical(tmp_path, monkeypatch):
    """A record never outlives its step, so a run resumed from a checkpoint repeats the uninterrupted one."""
    from safetensors.torch import load_file

    from grpokit.train.loop import train_grpo
    n = torch.get_num_threads()
    torch.set_num_threads(1)                                              # the same reductions in every run
    try:
        def cfg(out, **over):
            return build_config({"model.name_or_path": "builtin:tiny-random", "task.num_train": 32,
                                 "task.num_eval": 4, "rollout.prompts_per_step": 2,
                                 "rollout.num_generations": 4, "reward.funcs": {DENSE: 1.0},
                                 "rollout.max_completion_length": 8, "rollout.reuse_activations": True,
                                 "optim.learning_rate": 3e-3, "run.max_steps": 4, "run.save_steps": 2,
                                 "run.eval_limit": 0, "run.progress": False,
                                 "run.output_dir": str(out), **over})
        calls = []
        real = REUSED_LOGPROBS
        monkeypatch.setattr(reuse, "reused_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
        train_grpo(cfg(tmp_path / "full"))
        train_grpo(cfg(tmp_path / "cut", **{"run.max_steps": 2}))
        train_grpo(cfg(tmp_path / "cut", **{"run.resume": True}))
    finally:
        torch.set_num_threads(n)
    # every step of the three runs reused
    assert len(calls) == 8
    a = load_file(tmp_path / "full" / "final" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_reuses_only_where_one_padded_micro_batch_is_cheaper(tok, monkeypatch):
    from types import SimpleNamespace

    from grpokit.train.distributed import Distributed
    from grpokit.train.update import micro_batch_plan

    def plan(model, rollout, record, **over):
        cfg = build_config({"rollout.num_generations": 4, "rollout.prompts_per_step": 3, **over})
        state = SimpleNamespace(cfg=cfg, model=model, dist=Distributed())
        return reuse.update_plan(state, rollout, micro_batch_plan(state, rollout), record)

    model = build("qwen2", tok)
    fixed, fixed_rec = recorded(model, tok, prompts(), 4, 12, backend="fast", suppress_eos=True, record=True)
    groups, record, last = plan(model, fixed, fixed_rec)
    assert record is fixed_rec and last and [g.tolist() for g in groups] == [list(range(12))]
    groups, record, _ = plan(model, fixed, fixed_rec, **{"optim.micro_batch_size": 4})
    # micro-batches asked for: memory first
    assert record is None and len(groups) == 3
    groups, record, last = plan(model, fixed, fixed_rec,
                                **{"optim.micro_batch_size": 4, "rollout.reuse_activations": True})
    assert record is fixed_rec and not last and len(groups) == 3  # forced: held through 3 micro-batches

    # a micro-batch's launch cost as for a ~100M-parameter model (the test model's 0.1M would make one
    # micro-batch always cheapest)
    monkeypatch.setattr(reuse, "launch_tokens", lambda n: 10.0)
    monkeypatch.setattr(buckets, "launch_tokens", lambda n: 10.0)
    spread_model = build("qwen2", tok, mean_length=6.0)
    torch.manual_seed(5)
    spread, spread_rec = recorded(spread_model, tok, prompts(), 4, 40, backend="fast", record=True)
    lengths = spread.completion_lengths + spread.prompt_mask.sum(-1)
    # mostly padding if padded to the longest
    assert float(lengths.float().mean()) < 0.6 * float(lengths.max())
    groups, record, _ = plan(spread_model, spread, spread_rec, **{"rollout.max_completion_length": 40})
    assert record is None and len(groups) > 1                             # the length buckets win

    # "auto" asks on the way and stops recording once it cannot pay: no record, its memory not kept
    def pays(lengths):
        asked.append(lengths)
        return reuse.reuse_pays(lengths, 10**8, "grpo")

    asked = []
    torch.manual_seed(5)
    again, again_rec = recorded(spread_model, tok, prompts(), 4, 40, backend="fast", record=pays)
    assert asked and again_rec is None
    assert torch.equal(again.completion_ids, spread.completion_ids)      # recording never changes the samples
    asked.clear()
    kept, kept_rec = recorded(model, tok, prompts(), 4, 12, backend="fast", suppress_eos=True, record=pays)
    assert kept_rec is not None and not asked                     # no row finished early: kept
    assert not spread_rec.usable(model)                           # (and a record is tied to its model)


def test_reuse_pays_counts_padding_against_the_saved_third():
    launch = {"n_params": 10**8}                                          # launch cost 10 token-slots
    equal = torch.full((8,), 50)
    assert reuse.reuse_pays(equal, **launch, loss_type="grpo")            # no padding: 2/3 of the cost
    assert reuse.reuse_pays(equal, **launch, loss_type="grpo", iterations=4)  # still never worse
    mild = torch.tensor([50, 48, 47, 45, 44, 42, 40, 38])                 # ~90% full when padded
    assert reuse.reuse_pays(mild, **launch, loss_type="grpo")
    spread = torch.tensor([50, 5, 5, 5, 5, 5, 5, 5])                      # ~21% full when padded
    assert not reuse.reuse_pays(spread, **launch, loss_type="grpo")
    # with mu = 2 the padded micro-batch also serves the second, plain iteration: 1.67 x 410 > 2 x 340
    some = torch.tensor([50, 50, 50, 50, 30, 30, 30, 30])                 # 80% full
    assert reuse.reuse_pays(some, **launch, loss_type="grpo", iterations=1)
    assert not reuse.reuse_pays(some, **launch, loss_type="grpo", iterations=2)
