"""issue 61 A4: a rollout built on the CPU (a vLLM server's samples in the async thread, a TRL rollout_func's
ids) reaches the update on the policy's device: `collect_batch` moves it, `Rollout.to` moves every tensor."""

import torch

from grpokit.model.testing import bench_prompts, build_model
from grpokit.rollout.groups import sample_groups
from grpokit.train import collect


def _rollout():
    model, tok = build_model("tiny", mean_length=6)
    torch.manual_seed(0)
    r = sample_groups(model, tok, bench_prompts(2), 2, 6, backend="generate")
    r.sampling_logprobs = torch.zeros(r.completion_ids.shape)
    r.model_mask = r.completion_mask.clone()
    return r


def test_rollout_to_moves_every_tensor_and_is_itself_when_there():
    r = _rollout()
    assert r.to("cpu") is r and r.to(None) is r
    moved = r.to("meta")
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group_ids", "truncated",
                 "sampling_logprobs", "model_mask"):
        assert getattr(moved, name).device.type == "meta", name
        assert getattr(r, name).device.type == "cpu", name                # the original is left as it was
    assert moved.completions == r.completions and moved.group_size == r.group_size


def test_collect_batch_puts_the_rollout_on_the_policys_device(monkeypatch):
    r = _rollout()
    monkeypatch.setattr(collect, "_sampled_and_scored", lambda state, timer: (r, "scores", None, {}))
    monkeypatch.setattr(collect, "model_device", lambda model: torch.device("meta"))
    out, scores, _, _ = collect.collect_batch(type("S", (), {"model": None})(), None)
    assert out.completion_ids.device.type == "meta" and out.input_ids.device.type == "meta"
    assert scores == "scores"
