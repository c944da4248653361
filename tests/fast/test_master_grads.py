"""Gradients added straight into the master weights (grpokit.fast.master_grads) against autograd's."""

import pytest
import torch

from grpokit import fast, switch
from grpokit.fast import master_grads
from grpokit.model import speedups
from grpokit.model.logprobs import head_logprobs, per_token_logprobs
from grpokit.model.precision import set_compute_dtype
from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout.groups import sample_groups


def _batch(tied: bool):
    model, tok = build_model("tiny", mean_length=6)
    if tied:                               # as SmolLM2: the lm-head is the embedding
        model.lm_head.weight = model.model.embed_tokens.weight
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(3), 4, 12, backend="generate")
    return model, r


def _grads(model, r, rows: bool, micro_batches: int) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    T = r.completion_ids.shape[1]
    for rows_idx in torch.arange(r.input_ids.shape[0]).chunk(micro_batches):   # gradient accumulation
        with master_grads.installed(model) if rows else torch.enable_grad():
            lp = per_token_logprobs(model, r.input_ids[rows_idx], r.attention_mask[rows_idx], T)
        (lp * r.completion_mask[rows_idx]).sum().mul(0.1).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
def test_gradients_equal_autograds_dense_embedding_backward(tied):
    model, r = _batch(tied)
    want, got = _grads(model, r, False, 3), _grads(model, r, True, 3)
    emb = "model.embed_tokens.weight"
    assert want.keys() == got.keys() and want[emb].abs().sum() > 0
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name
    seen = torch.unique(r.input_ids)
    untouched = torch.ones(want[emb].shape[0], dtype=torch.bool)
    untouched[seen] = False
    if not tied:                          # only looked-up rows get a gradient from the lookup alone
        assert (got[emb][untouched] == 0).all() and got[emb][seen].abs().sum() > 0


def test_padding_row_gets_no_gradient_and_no_grad_lookups_are_plain():
    emb = torch.nn.Embedding(10, 4, padding_idx=0)
    ids = torch.tensor([[0, 3, 3, 5], [0, 0, 7, 3]])
    g = torch.randn(2, 4, 4)
    emb(ids).backward(g)
    want = emb.weight.grad.clone()
    emb.weight.grad = None
    with master_grads.installed(emb):
        out = emb(ids)
        out.backward(g)
        with torch.no_grad():
            plain = emb(ids)
    assert torch.equal(emb.weight.grad, want) and (want[0] == 0).all() and (want[3] != 0).all()
    assert not plain.requires_grad and torch.equal(plain, out.detach())
    assert "forward" not in vars(emb)                                     # restored on exit


def test_installed_by_the_switch_in_mixed_precision_for_one_process_only():
    model, _ = build_model("tiny")
    emb = model.model.embed_tokens
    with switch.accelerated(model):                         # fp32: measured no gain, autograd's path
        assert "forward" not in vars(emb)
    set_compute_dtype(model, torch.bfloat16)
    with switch.accelerated(model):
        assert "forward" in vars(emb)
    with switch.accelerated(model, world_size=2):          # DDP reduces a gradient before a hook adds rows
        assert "forward" not in vars(emb)
    emb.weight.requires_grad_(False)                      # a frozen embedding (LoRA): autograd's lookup
    with switch.accelerated(model):
        assert "forward" not in vars(emb)


def _head_grads(weight, hidden, targets, installed: bool) -> torch.Tensor:
    weight.grad = None
    with master_grads.installed(torch.nn.Module()) as casts, \
            speedups.scoped(fast.Scope(torch.nn.Module(), head_casts=casts if installed else None)):
        for h, t in zip(hidden.chunk(3), targets.chunk(3)):             # three micro-batches
            lp = head_logprobs(h, t, weight, None, temperature=1.0, compute_dtype=torch.bfloat16)
            lp.sum().backward()
    return weight.grad.clone()


@pytest.mark.parametrize("add_rows", [4096, 16, 24])                    # 64 rows: one slice, 4, 2 + a rest
def test_bf16_head_gradient_lands_in_the_float32_master_as_autograds_does(monkeypatch, add_rows):
    monkeypatch.setattr(master_grads, "ADD_ROWS", add_rows)
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 16) * 0.1)
    hidden, targets = torch.randn(6, 5, 16), torch.randint(0, 64, (6, 5))
    want, got = _head_grads(weight, hidden, targets, False), _head_grads(weight, hidden, targets, True)
    assert got.dtype == torch.float32 and want.abs().sum() > 0
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)


def test_the_head_cast_is_made_once_per_weight_version():
    weight = torch.nn.Parameter(torch.randn(8, 4))
    casts = master_grads.HeadCasts()
    first = casts(weight, torch.bfloat16)
    assert casts(weight, torch.bfloat16) is first and first.is_leaf and first.dtype == torch.bfloat16
    with torch.no_grad():
        weight.add_(1.0)                                                   # an optimizer step
    second = casts(weight, torch.bfloat16)
    assert second is not first and torch.equal(second, weight.detach().to(torch.bfloat16))
    with torch.inference_mode():                                          # a no-grad pass: not kept
        assert casts(weight, torch.bfloat16) is not second
    assert casts(weight, torch.bfloat16) is second
    frozen = torch.nn.Parameter(torch.randn(8, 4), requires_grad=False)
    assert not casts(frozen, torch.bfloat16).requires_grad                # a frozen head: a plain cast
    model, _ = build_model("tiny")
    set_compute_dtype(model, torch.bfloat16)
    head = model.lm_head.weight
    with switch.accelerated(model) as scope:          # the switch hands its scope the casts
        assert isinstance(scope.head_casts, master_grads.HeadCasts)
        assert speedups.active().cast_head(head, torch.bfloat16) is speedups.active().cast_head(head,
                                                                                                torch.bfloat16)
    plain = speedups.active().cast_head(head, torch.bfloat16)            # outside: autograd's cast, each time
    assert speedups.active() is speedups.PLAIN
    assert plain is not speedups.active().cast_head(head, torch.bfloat16)



def test_the_sorted_sum_cuda_takes_adds_what_index_add_does():
    """issue 61 A5: on CUDA the rows go through index_put_(accumulate=True) (sorted, one thread per id)
    instead of index_add_'s atomics; here both run on the CPU, with heavily repeated ids, and must agree."""
    torch.manual_seed(0)
    ids = torch.randint(0, 7, (500,))                                  # each id ~70 times
    src = torch.randn(500, 16)
    plain, sorted_ = torch.zeros(7, 16), torch.zeros(7, 16)
    master_grads.sum_rows_into(plain, ids, src, sorted_sum=False)
    master_grads.sum_rows_into(sorted_, ids, src, sorted_sum=True)
    want = torch.stack([src[ids == v].sum(0) for v in range(7)])
    assert torch.allclose(plain, want, atol=1e-5) and torch.allclose(sorted_, want, atol=1e-5)
    again = torch.zeros(7, 16)
    master_grads.sum_rows_into(again, ids, src, sorted_sum=True)
    assert torch.equal(again, sorted_)


def test_add_rows_picks_the_sorted_sum_by_the_weights_device(monkeypatch):
    seen = []
    monkeypatch.setattr(master_grads, "sum_rows_into",
                        lambda dst, ids, src, sorted_sum: seen.append(sorted_sum))
    weight = torch.zeros(5, 3, requires_grad=True)
    master_grads.add_rows(weight, torch.tensor([1, 1, 2]), None, torch.ones(3, 3))
    assert seen == [False]                                             # CPU: index_add_, as before
