"""grpokit.train.distributed: 2 CPU ranks (gloo, torch.multiprocessing) against one process on the same
samples.

Each test spawns two ranks that run the real trainer (build_state / train_step / train_grpo) with
WORLD_SIZE=2 in their environment, exactly as torchrun would set it, and compares with the same
config run in this (single) process.
"""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from easy_task import EASY, PROMPTS  # the same easy task as the one-process tests
from grpokit.config.schema import build_config
from grpokit.train.distributed import Distributed, ShardedStream
from grpokit.train.loop import build_state, train_grpo
from grpokit.train.step import train_step


def _config(out: str, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.prompts_per_step": 4, "rollout.num_generations": 4, "rollout.max_completion_length": 8,
              "optim.learning_rate": 1e-2, "run.output_dir": out, "run.progress": False, "run.max_steps": 1,
              "loss.loss_type": "dapo", "loss.scale_rewards": "batch", "optim.micro_batch_size": 4}
    values.update(over)
    return build_config(values)


def fixed_samples(model, tokenizer, prompts, group_size, max_new_tokens, *args, **kwargs):
    """A stand-in for sample_groups whose completions depend only on the prompt text (the same samples
    whichever rank draws the prompt), with lengths and 'a' counts that vary inside each group."""
    from grpokit.rollout.groups import encode_prompts, eos_token_ids
    from grpokit.rollout.vllm_backend import Sample, rollout_from_samples

    eos = eos_token_ids(model, tokenizer)
    ids, mask = encode_prompts(tokenizer, list(prompts), None)
    samples = []
    for p in prompts:
        group = []
        for j in range(group_size):
            text = ("a" * ((len(p) + j) % 4) + "xyz"[: (j * 7 + len(p)) % 3])[: max_new_tokens - 1] or "b"
            toks = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos[0]] if j % 3 else [])
            group.append(Sample(toks[:max_new_tokens], [0.0] * len(toks[:max_new_tokens])))
        samples.append(group)
    return rollout_from_samples(tokenizer, list(prompts), ids, mask, samples, group_size, eos)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, task: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    result = TASKS[task](out)
    torch.save(result, Path(out) / f"result-{task}-{rank}.pt")
    torch.distributed.barrier()  # no rank tears gloo down while its peer still uses it (exit SIGABRT)
    torch.distributed.destroy_process_group()


def _one_step(out, **over):
    import grpokit.train.collect as collect

    collect.sample_groups = fixed_samples
    # lr 1e-3: Adam's first step lr * g / (|g| + eps) turns float-order noise on near-zero gradients
    # into differences proportional to lr; at 1e-3 they stay below the 1e-6 tolerance
    cfg = _config(out + "/run", **{"optim.learning_rate": 1e-3, **over})
    state = build_state(cfg, train_examples=PROMPTS)
    metrics = train_step(state)
    weights = {k: v.detach().clone() for k, v in state.dist.full_state_dict(state.model).items()}
    return {"metrics": metrics, "weights": weights, "rank": state.dist.rank, "world": state.dist.world_size,
            "prompts": state.stream.cursor}


def _train_resume(out, **over):
    """2 steps with a checkpoint each step, then resume to 3; and 3 steps in one go (the real sampler)."""
    common = {"run.save_steps": 1, **over}
    train_grpo(_config(out + "/a", **{"run.max_steps": 2, **common}), train_examples=PROMPTS)
    state = train_grpo(_config(out + "/a", **{"run.max_steps": 3, "run.resume": True, **common}),
                               train_examples=PROMPTS)
    resumed = {k: v.detach().clone() for k, v in state.dist.full_state_dict(state.model).items()}
    state = train_grpo(_config(out + "/b", **{"run.max_steps": 3, **common}), train_examples=PROMPTS)
    straight = {k: v.detach().clone() for k, v in state.dist.full_state_dict(state.model).items()}
    return {"resumed": resumed, "straight": straight, "rank": state.dist.rank}


TASKS = {"step": _one_step, "step_fsdp": lambda o: _one_step(o, **{"run.fsdp": True}),
         "resume": _train_resume, "resume_fsdp": lambda o: _train_resume(o, **{"run.fsdp": True})}


def _spawn(task: str, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(2, _free_port(), str(out), task), nprocs=2, join=True)
    return [torch.load(out / f"result-{task}-{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("task", ["step", "step_fsdp"])
def test_two_ranks_give_the_one_process_update_and_metrics(tmp_path, monkeypatch, task):
    import grpokit.train.collect as collect

    ranks = _spawn(task, tmp_path / "dist")
    monkeypatch.setattr(collect, "sample_groups", fixed_samples)
    single = _one_step(str(tmp_path / "single"))
    assert single["world"] == 1 and [r["world"] for r in ranks] == [2, 2]
    # every rank's cursor: global
    assert ranks[0]["prompts"] == ranks[1]["prompts"] == single["prompts"] == 4
    before = build_state(_config(str(tmp_path / "init")), train_examples=PROMPTS).model.state_dict()
    assert task == "step_fsdp" or all(torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k])
                                      for k in ranks[0]["weights"])      # DDP replicas stay identical
    moved = 0.0
    for name, w in single["weights"].items():
        # Adam's first step divides each element's gradient by its own size (g / (|g| + eps)), so an element
        # whose gradient is near zero carries the reductions' float rounding into its update: a few single
        # elements reach ~1e-3 of the lr-sized step (measured: at most 3 per tensor above 1e-7, largest
        # 1.01e-6), every other element agrees to 1e-4 of it.
        d = (ranks[0]["weights"][name] - w).abs()
        assert float(d.max()) <= 2e-6 and int((d > 1e-7).sum()) <= 8, name
        moved = max(moved, float((w - before[name]).abs().max()))
    assert moved > 5e-4                          # the step did change the weights (lr = 1e-3)
    for key in ("reward_mean", "reward_std", "approx_kl", "completion_tokens", "completion_length_mean",
                "loss", "policy_loss", "advantage_std", "entropy", "grad_norm", "frac_zero_std"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
        assert ranks[1]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5, abs=1e-7), key
    assert single["metrics"]["completion_tokens"] > 0 and single["metrics"]["approx_kl"] == 0.0


@pytest.mark.parametrize("task", ["resume", "resume_fsdp"])
def test_two_rank_run_checkpoints_and_resumes(tmp_path, task):
    ranks = _spawn(task, tmp_path)
    for name, w in ranks[0]["straight"].items():    # 2 steps + resume + 1 step == 3 steps in one go
        assert torch.allclose(ranks[0]["resumed"][name], w, atol=1e-6, rtol=0), name
    run = tmp_path / "a"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]   # rank 0 alone writes, each step once
    ckpt = run / "checkpoint-3"
    blob = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert len(blob["rank_rng"]) == 2 and not torch.equal(blob["rank_rng"][0]["torch"],
                                                          blob["rank_rng"][1]["torch"])
    assert (run / "final" / "config.json").exists()
    if task == "resume_fsdp":                          # sharded checkpoint -> a save_pretrained folder
        from transformers import AutoModelForCausalLM

        from grpokit.train.fsdp_checkpoint import consolidate_checkpoint

        out = consolidate_checkpoint(ckpt, tmp_path / "merged")
        model = AutoModelForCausalLM.from_pretrained(out)
        final = AutoModelForCausalLM.from_pretrained(run / "final")
        for (name, a), b in zip(model.state_dict().items(), final.state_dict().values()):
            assert torch.equal(a, b), name


def test_one_process_is_a_no_op_and_sharding_keeps_groups_whole():
    d = Distributed.from_env(env={})
    assert (d.world_size, d.rank, d.is_main, d.grad_scale) == (1, 0, True, 1.0)
    x = torch.arange(6.0)
    assert d.gather(x) is x and d.sum(3) == 3.0 and d.all_true(True) and d.reduce_sums({"a": 2}) == {"a": 2.0}
    from grpokit.train.data import PromptStream

    streams = [ShardedStream(PromptStream(list(range(10)), seed=3), r, 2) for r in range(2)]
    whole = PromptStream(list(range(10)), seed=3).take(4)
    assert streams[0].take(2) + streams[1].take(2) == whole          # rank r: prompts [2r, 2r+2) of each draw
    assert streams[0].cursor == streams[1].cursor == 4
    with pytest.raises(ValueError, match="divisible by the number of ranks"):
        Distributed(world_size=3).check(4)
    Distributed().check(4, "ppo")                                    # one process: PPO runs
    with pytest.raises(ValueError, match="loss.algorithm=ppo runs in one process, not 2 ranks"):
        Distributed(world_size=2).check(4, "ppo")                    # issue 61 A7: replicas would drift apart


def test_ppo_under_several_ranks_is_refused_before_loading(tmp_path):
    cfg = build_config({"loss.algorithm": "ppo", "run.output_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="launch it without torchrun"):
        build_state(cfg, dist=Distributed(world_size=2))


def test_fsdp_with_vllm_is_refused_at_config_time():
    """issue 61 A3: the engine's weight sync (policy_weights over state_dict()) would read FSDP2's shards."""
    for mode in ("colocate", "server"):
        with pytest.raises(ValueError, match="run.fsdp=true with rollout.backend=vllm"):
            build_config({"run.fsdp": True, "rollout.backend": "vllm", "rollout.vllm_mode": mode,
                                    "model.dtype": "float32"})
    build_config({"run.fsdp": True, "rollout.backend": "fast"})


def test_the_process_group_waits_run_ddp_timeout_s(monkeypatch):
    """TRL's ddp_timeout -> run.ddp_timeout_s -> init_process_group(timeout=...)."""
    import datetime

    import torch.distributed as tdist

    seen = {}
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "init_process_group", lambda backend, **kw: seen.update(kw))
    monkeypatch.setattr(tdist, "get_rank", lambda: 0)
    monkeypatch.setattr(tdist, "get_world_size", lambda: 2)
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    d = Distributed.from_env(env=env, device="cpu", timeout_s=60)
    assert seen["timeout"] == datetime.timedelta(seconds=60) and d.world_size == 2
