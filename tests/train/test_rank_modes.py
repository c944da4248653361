"""Modes on 2 CPU ranks (gloo, torch.multiprocessing, WORLD_SIZE=2 as torchrun sets it): FSDP with LoRA and a
KL reference, a damaged newest sharded checkpoint, Algorithm 1 with one reward model for all ranks, and an
agent run whose environments' random states each rank resumes as its own."""

import dataclasses
import datetime
import hashlib
import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import TrainerCallback

from easy_task import EASY, PROMPTS
from grpokit.config.schema import build_config
from grpokit.train.loop import train_grpo

pytest.importorskip("peft")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str, task: str, extra: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    result = TASKS[task](out, extra)
    torch.save(result, Path(out) / f"result-{task}-{rank}.pt")
    torch.distributed.barrier()  # no rank tears gloo down while its peer still uses it (exit SIGABRT)
    torch.distributed.destroy_process_group()


def _spawn(task: str, out: Path, extra: str = "") -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(_free_port(), str(out), task, extra), nprocs=2, join=True)
    return [torch.load(out / f"result-{task}-{r}.pt", weights_only=True) for r in range(2)]


def _lora_cfg(out: str, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.prompts_per_step": 4, "rollout.num_generations": 4, "rollout.max_completion_length": 8,
              "optim.learning_rate": 1e-2, "run.output_dir": out, "run.progress": False, "run.max_steps": 3,
              "run.save_steps": 1, "run.save_total_limit": 3, "run.fsdp": True, "model.lora_r": 4,
              "model.lora_alpha": 8, "loss.beta": 0.04, "model.lora_target_modules": ["q_proj", "v_proj"]}
    values.update(over)
    return build_config(values)


def _weights(state) -> dict:
    return {k: v.detach().clone() for k, v in state.dist.full_state_dict(state.model).items()}


def _fsdp_lora(out: str, extra: str) -> dict:
    """3 steps straight; 2 steps, the newest checkpoint damaged, then resumed to 3 (falls back to step 1)."""
    straight = _weights(train_grpo(_lora_cfg(out + "/straight"), train_examples=PROMPTS))
    train_grpo(_lora_cfg(out + "/a", **{"run.max_steps": 2}), train_examples=PROMPTS)
    if int(os.environ["RANK"]) == 0:          # one shard of the newest checkpoint loses its tail
        shard = sorted((Path(out) / "a" / "checkpoint-2" / "sharded").glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[:-64])
    torch.distributed.barrier()
    resumed = _weights(train_grpo(_lora_cfg(out + "/a", **{"run.resume": True}), train_examples=PROMPTS))
    return {"straight": straight, "resumed": resumed}


def _rm_hash(rm) -> str:
    h = hashlib.sha256()
    for k, v in sorted(rm.model.state_dict().items()):
        h.update(k.encode() + v.detach().float().numpy().tobytes())
    return h.hexdigest()


def _iterative_cfg(out: str, rm_path: str, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "reward.funcs": {f"rm:{rm_path}": 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": out, "run.max_steps": 4,
              "run.iterations": 2, "run.steps_per_iteration": 2, "run.save_steps": 2,
              "rm.learning_rate": 1e-2, "rm.train_batch_size": 4, "rm.replay_share": 0.25}
    values.update(over)
    return build_config(values)


class _StopAfter(TrainerCallback):
    """Ends the run after step `step` (every rank holds one, so every rank stops there)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def _iterative_resume(out: str, rm_path: str) -> dict:
    """Algorithm 1 on 2 ranks, 4 steps straight; cut after step 3 (its checkpoint inside iteration 2, each
    rank holding its own step-3 samples), then resumed to 4: the RM and the replay pool after iteration 2."""
    def record(state) -> dict:
        pool = [dataclasses.asdict(s) for s in state.reward_loop.history]
        return {"rm": _rm_hash(state.reward_loop.rm), "pool": json.dumps(pool, sort_keys=True)}

    straight = train_grpo(_iterative_cfg(out + "/straight", rm_path, **{"run.save_steps": 1}))
    train_grpo(_iterative_cfg(out + "/cut", rm_path, **{"run.save_steps": 1}), callbacks=[_StopAfter(3)])
    resumed = train_grpo(_iterative_cfg(out + "/cut", rm_path, **{"run.save_steps": 1, "run.resume": True}))
    return {"straight": record(straight), "resumed": record(resumed)}


def _iterative(out: str, rm_path: str, fsdp: bool = False) -> dict:
    """Algorithm 1 on 2 ranks: the RM's hash after every iteration, and the saved RM's; whether the reference
    equals the policy right after each iteration's reset (under FSDP: the gathered weights, on rank 0)."""
    hashes, reset = [], []

    def watch(state, metrics):
        if state.reward_loop.at_boundary(state.step):
            hashes.append(_rm_hash(state.reward_loop.rm))
            ref, policy = (state.dist.full_state_dict(m) for m in (state.ref_model, state.model))
            reset.append(sorted(ref) == sorted(policy) and all(torch.equal(ref[k], policy[k]) for k in ref))

    state = train_grpo(_iterative_cfg(out + "/run", rm_path, **{"run.fsdp": fsdp}),
                       hooks={"after_step": watch})
    saved = load_file(Path(out) / "run" / "checkpoint-4" / "reward_model.safetensors")
    live = state.reward_loop.rm.model.state_dict()
    return {"hashes": hashes, "final": _rm_hash(state.reward_loop.rm), "reset": reset,
            "saved_equal": all(torch.equal(saved[k], live[k]) for k in saved),
            "samples": len(state.reward_loop.history)}


def _agent_cfg(out: str, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.environment": "guess_number",   # no secret in the rows: reset() draws it from env.rng
              "rollout.prompts_per_step": 4, "rollout.num_generations": 2, "rollout.max_completion_length": 8,
              "optim.learning_rate": 1e-2, "run.output_dir": out, "run.progress": False, "run.max_steps": 3,
              "run.save_steps": 1, "run.save_total_limit": 3, "run.eval_limit": 0}
    values.update(over)
    return build_config(values)


def _agent_resume(out: str, extra: str) -> dict:
    """3 steps straight; 2 steps, then resumed to 3: weights and this rank's environment states."""
    straight = train_grpo(_agent_cfg(out + "/straight"), train_examples=PROMPTS)
    train_grpo(_agent_cfg(out + "/cut", **{"run.max_steps": 2}), train_examples=PROMPTS)
    resumed = train_grpo(_agent_cfg(out + "/cut", **{"run.resume": True}), train_examples=PROMPTS)
    return {"straight": _weights(straight), "resumed": _weights(resumed),
            "env_straight": json.dumps(straight.agent.rng_state()),
            "env_resumed": json.dumps(resumed.agent.rng_state())}


def _slow_eval(out: str, extra: str) -> dict:
    """A process group whose collectives time out after 8 s, and rank 0's first evaluation taking 16 s:
    rank 1 waits for it (before 2026-12-06 it went on into the first step's collectives and timed out)."""
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    slowed = []

    def slow_on_rank_0(prompts, completions, **kw):   # the evaluation scores 3 completions, a step 1 x 4
        if int(os.environ["RANK"]) == 0 and len(completions) == 3 and not slowed:
            slowed.append(time.sleep(16))
        return [0.0] * len(completions)

    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
                        "rollout.max_completion_length": 4, "run.output_dir": out + "/run",
                        "run.progress": False, "run.max_steps": 1, "run.save_steps": 0, "run.eval_limit": 3})
    state = train_grpo(cfg, train_examples=PROMPTS, eval_examples=PROMPTS[:3],
                       reward_funcs=[("slow", slow_on_rank_0, 1.0)])
    evals = (Path(out) / "run" / "eval.jsonl").read_text().splitlines() if state.dist.is_main else []
    return {"step": state.step, "evals": [json.loads(line)["tag"] for line in evals], "slowed": len(slowed)}


TASKS = {"fsdp_lora": _fsdp_lora, "slow_eval": _slow_eval, "iterative": _iterative,
         "agent_resume": _agent_resume, "iterative_resume": _iterative_resume,
         "iterative_fsdp": lambda out, rm_path: _iterative(out, rm_path, fsdp=True)}


def test_fsdp_with_lora_and_a_reference_trains_and_resumes_bit_identically(tmp_path):
    ranks = _spawn("fsdp_lora", tmp_path)
    straight, resumed = ranks[0]["straight"], ranks[0]["resumed"]
    assert any(".lora_B." in k for k in straight)                      # the adapters are in the weights
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []
    a = tmp_path / "a"
    assert (a / "checkpoint-2.corrupt").is_dir() and (a / "latest").read_text() == "checkpoint-3"
    manifest = json.loads((a / "checkpoint-3" / "manifest.json").read_text())["files"]
    assert "sharded/.metadata" in manifest and any(f.endswith(".distcp") for f in manifest)
    assert (a / "final" / "adapter_model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(a / "final" / "merged")   # plain transformers loads it
    assert merged.config.model_type == "qwen2"


def _saved_rm(tmp_path: Path) -> str:
    from grpokit.rewards.rm_train import init_reward_model, save_reward_model

    rm = tmp_path / "rm"
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    save_reward_model(model, tok, rm, kind="outcome", step_separator="\n", init="builtin:tiny-random",
                      report={})
    return str(rm)


@pytest.mark.parametrize("mode", ["iterative", "iterative_fsdp"], ids=["ddp", "fsdp"])
def test_algorithm_1_keeps_one_reward_model_on_every_rank(tmp_path, mode):
    ranks = _spawn(mode, tmp_path / "dist", _saved_rm(tmp_path))
    # the reference reset to the policy at each iteration's end (under FSDP it crashed before 2026-12-05:
    # the policy's root kept gathered plain tensors that sync_reference mixed with the reference's shards)
    assert ranks[0]["reset"] == [True, True]
    assert len(ranks[0]["hashes"]) == 2 and ranks[0]["hashes"] == ranks[1]["hashes"]
    assert ranks[0]["hashes"][0] != ranks[0]["hashes"][1]                 # the RM did train
    assert ranks[0]["final"] == ranks[1]["final"] and ranks[0]["saved_equal"] and ranks[1]["saved_equal"]
    # both ranks' samples (2 steps x 2 prompts x 4 completions per iteration) in the one replay pool
    assert ranks[0]["samples"] == ranks[1]["samples"] == 2 * 2 * 2 * 4


def test_algorithm_1_resumed_inside_an_iteration_trains_the_rm_on_every_ranks_own_samples(tmp_path):
    """A checkpoint inside an iteration keeps every rank's samples of it, and each rank resumes its own: the
    RM after the iteration and the replay pool are those of the straight run (before 2026-12-06 rank 0 saved
    only its own samples and every rank loaded them: rank 0's counted twice, rank 1's were lost)."""
    ranks = _spawn("iterative_resume", tmp_path / "dist", _saved_rm(tmp_path))
    for r in ranks:
        assert r["resumed"]["pool"] == r["straight"]["pool"]
        assert r["resumed"]["rm"] == r["straight"]["rm"]
    assert len(json.loads(ranks[0]["straight"]["pool"])) == 2 * 2 * 2 * 4 and ranks[0] == ranks[1]
    blob = torch.load(tmp_path / "dist" / "cut" / "checkpoint-3" / "reward_loop.pt", weights_only=True)
    assert [len(share) for share in blob["current_by_rank"]] == [4, 4]   # step 3: 1 prompt x 4 per rank


def test_the_other_ranks_wait_for_an_evaluation_longer_than_the_process_groups_timeout(tmp_path):
    ranks = _spawn("slow_eval", tmp_path)
    assert [r["step"] for r in ranks] == [1, 1] and [r["slowed"] for r in ranks] == [1, 0]
    assert ranks[0]["evals"] == ["before", "after"]


def test_an_agent_run_resumes_every_ranks_environments_bit_identically(tmp_path):
    ranks = _spawn("agent_resume", tmp_path)
    assert ranks[0]["env_straight"] != ranks[1]["env_straight"]            # each rank plays its own episodes
    for r in ranks:
        assert r["env_resumed"] == r["env_straight"]                       # rank 1's too, not rank 0's
        assert [k for k in r["straight"] if not torch.equal(r["straight"][k], r["resumed"][k])] == []
    first = load_file(tmp_path / "straight" / "checkpoint-1" / "model.safetensors")
    assert any(not torch.equal(ranks[0]["straight"][k], v) for k, v in first.items())   # steps 2, 3 trained
    blob = torch.load(tmp_path / "cut" / "checkpoint-2" / "trainer_state.pt", weights_only=True)
    envs = [rank["env"] for rank in blob["rank_rng"]]                     # every rank's, in the checkpoint
    assert len(envs) == 2 and envs[0] != envs[1]
