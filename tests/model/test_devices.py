"""The device rules of grpokit.model.devices, decided without a GPU (visible CUDA devices and the
launcher's environment are arguments). What needs a real GPU is in tests/train/test_cuda.py, run by
scripts/gpu_check.sh."""

import pytest
import torch

from grpokit.config.schema import build_config
from grpokit.errors import ConfigError
from grpokit.model import devices
from grpokit.model.devices import backend_for, launcher_ranks, place_model, resolve_device
from grpokit.model.loading import build_char_tokenizer, load_model_and_tokenizer, tiny_random_model
from grpokit.tasks import Example
from grpokit.train.loop import build_state
from grpokit.trl import GRPOConfig, GRPOTrainer

RANK1_OF_2 = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}


@pytest.mark.parametrize("name, env, count, want", [
    ("auto", {}, 0, "cpu"),
    ("auto", {}, 2, "cuda:0"),
    ("cpu", {}, 2, "cpu"),                        # the CPU on a GPU host
    ("cuda:1", {}, 2, "cuda:1"),
    ("auto", RANK1_OF_2, 2, "cuda:1"),            # each rank its own GPU
    ("cuda", RANK1_OF_2, 2, "cuda:1"),
    ("cpu", RANK1_OF_2, 2, "cpu"),                # gloo ranks on a GPU host
    ("auto", RANK1_OF_2, 0, "cpu"),
    ("cuda", {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, 2, "cuda:1"),   # second host
])
def test_each_rank_resolves_to_its_device(name, env, count, want):
    assert resolve_device(name, env=env, cuda_count=count) == torch.device(want)


@pytest.mark.parametrize("name, env, count, message", [
    ("cuda", {}, 0, "model.device=cuda but no CUDA device is visible: use model.device=cpu"),
    ("cuda:2", {}, 2, "model.device=cuda:2 but this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
    ("cuda:0", RANK1_OF_2, 2, "with 2 ranks would put every rank on one GPU: use model.device=cuda"),
    ("cuda", {"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "2"}, 2,
     "LOCAL_RANK=2 but this host has 2 CUDA device(s): start at most 2 ranks per host"),
])
def test_impossible_placements_are_one_line_errors(name, env, count, message):
    with pytest.raises(ConfigError) as e:
        resolve_device(name, env=env, cuda_count=count)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_reward_model_may_share_one_gpu_across_ranks():
    assert resolve_device("cuda:0", env=RANK1_OF_2, cuda_count=2, where="rm.device",
                          per_rank=False) == torch.device("cuda:0")


def test_the_backend_follows_the_device_not_what_is_visible():
    assert backend_for(resolve_device("cpu", env=RANK1_OF_2, cuda_count=8)) == "gloo"
    assert backend_for(resolve_device("auto", env=RANK1_OF_2, cuda_count=8)) == "nccl"
    assert backend_for(resolve_device("auto", env=RANK1_OF_2, cuda_count=0)) == "gloo"
    assert launcher_ranks({}) == (0, 0, 1) and launcher_ranks(RANK1_OF_2) == (1, 1, 2)


def test_a_model_elsewhere_is_moved_and_a_meta_model_refused():
    tok = build_char_tokenizer()
    model = tiny_random_model(tok)
    assert place_model(model, torch.device("cpu")) is model
    moved = place_model(model, torch.device("meta"))        # the one other device every machine has
    assert {p.device.type for p in moved.parameters()} == {"meta"}
    with pytest.raises(ConfigError, match="the policy has weights on the meta device"):
        place_model(moved, torch.device("cpu"), what="the policy")


def _placements(monkeypatch) -> list:
    """Pretend to be rank 1 of 2 on a host with 2 GPUs; record where models would be placed."""
    seen = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(devices, "_cuda_count", lambda count: 2 if count is None else count)

    def record(model, device, *, what="the model"):
        seen.append(device)
        return model

    return seen, record


def test_the_loader_places_rank_1_on_cuda_1_before_any_process_group(monkeypatch):
    from grpokit.model import loading

    seen, record = _placements(monkeypatch)
    monkeypatch.setattr(loading, "place_model", record)
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "model.device": "auto"})
    load_model_and_tokenizer(cfg.model)
    assert seen == [torch.device("cuda", 1)]


def test_trl_trainer_places_a_given_model_on_its_ranks_gpu(monkeypatch, tmp_path):
    from grpokit.trl import trainer as trl_trainer

    seen, record = _placements(monkeypatch)
    monkeypatch.setattr(trl_trainer, "place_model", record)
    tok = build_char_tokenizer()
    def zero(completions, **kw):
        return [0.0] * len(completions)

    GRPOTrainer(model=tiny_random_model(tok), reward_funcs=[zero],
                args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4,
                                num_generations=2, use_cpu=False, report_to="none"),
                train_dataset=[{"prompt": "Go:"}] * 4, processing_class=tok)
    assert seen == [torch.device("cuda", 1)]


def test_build_state_moves_or_refuses_a_model_given_on_another_device(tmp_path):
    tok = build_char_tokenizer()
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "model.device": "cpu",
                        "run.output_dir": str(tmp_path), "rollout.prompts_per_step": 2,
                        "rollout.num_generations": 2, "reward.funcs": {"rule": 1.0}})
    meta = tiny_random_model(tok).to("meta")
    with pytest.raises(ConfigError, match="the policy has weights on the meta device"):
        build_state(cfg, meta, tok, train_examples=[Example("1+1=", "2")] * 2)


def test_colocated_vllm_under_a_launcher_starts_one_engine_per_rank_in_external_launcher_mode(monkeypatch):
    from grpokit.rollout.vllm_engine import engine_options
    from grpokit.train.preflight import check_environment

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())    # vllm "installed"
    cfg = build_config({"rollout.backend": "vllm", "rollout.vllm_mode": "colocate", "model.device": "cpu"})
    check_environment(cfg)                        # no longer refused (it was until vLLM's mode was wired up)
    common = dict(on_cpu=True, sleep_available=False, want_sleep=True, kv_cache_gib=0.0,
                  gpu_memory_utilization=0.3, enforce_eager="auto")
    ranks = engine_options(**common, launched_ranks=True)
    assert ranks["distributed_executor_backend"] == "external_launcher" and ranks["tensor_parallel_size"] == 1
    alone = engine_options(**common)
    assert "distributed_executor_backend" not in alone and "tensor_parallel_size" not in alone
    assert {k: v for k, v in ranks.items() if k not in alone} == {
        "distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}
