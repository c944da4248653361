"""model.cast_lm_head_to_fp32 (TRL's cast_lm_head_to_fp32): a 16-bit model's lm-head weights and logits
in float32, the rest of the model untouched, sampling and log-probs working through it."""

from __future__ import annotations

import torch

from grpokit.model.logprobs import per_token_logprobs
from grpokit.model.precision import cast_lm_head_to_fp32
from grpokit.rollout.groups import sample_groups


def test_an_fp32_head_on_a_bf16_model(char_tokenizer):
    from grpokit.model.loading import tiny_random_model

    model = tiny_random_model(char_tokenizer, seed=0).to(torch.bfloat16)
    cast_lm_head_to_fp32(model)
    cast_lm_head_to_fp32(model)                                  # a second call changes nothing
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert len(model.lm_head._forward_pre_hooks) == 1
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    got = per_token_logprobs(model, ids, mask, 3)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -4:-1]   # bf16
        logits = torch.nn.functional.linear(hidden.float(), model.lm_head.weight)          # fp32 head
        want = torch.log_softmax(logits, -1).gather(-1, ids[:, -3:, None]).squeeze(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    rollout = sample_groups(model, char_tokenizer, ["1+1="], 2, 4, backend="generate")
    assert rollout.completion_ids.shape[0] == 2
