"""Iterative GRPO (Algorithm 1): the replay share, the reference reset, RM continual training, and a kill
inside an iteration that resumes bit-identically (CPU, tiny random models, seconds)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from grpokit.config.schema import ConfigError, build_config
from grpokit.rewards.rm_data import RMSample
from grpokit.rewards.scoring import build_reward_funcs
from grpokit.train.distributed import Distributed
from grpokit.train.iterative import RewardLoop, replay_count, training_mix
from grpokit.train.loop import train_grpo

pytestmark = pytest.mark.usefixtures("one_thread")  # the same reductions in every run: bit-identical on CPU


def test_replay_makes_its_share_of_the_mix():
    # 90 new samples at share 0.1: 10 replayed, 10 / (90 + 10) = 0.1 exactly
    assert replay_count(90, 1000, 0.1) == 10
    assert replay_count(90, 4, 0.1) == 4        # no more than the pool holds
    assert replay_count(90, 1000, 0.0) == 0
    assert replay_count(60, 1000, 0.25) == 20   # 20 / 80 = 0.25
    history = [f"old{i}" for i in range(500)]
    mix, k = training_mix([f"new{i}" for i in range(180)], history, 0.1, torch.Generator().manual_seed(0))
    assert k == 20 and len(mix) == 200
    old = [s for s in mix if s.startswith("old")]
    assert len(old) / len(mix) == pytest.approx(0.1) and len(set(old)) == 20   # without replacement
    again, _ = training_mix([f"new{i}" for i in range(180)], history, 0.1, torch.Generator().manual_seed(0))
    assert again == mix                                                         # the generator decides


def test_bad_iteration_settings_are_one_line():
    with pytest.raises(ConfigError, match="exactly one 'rm:PATH'"):
        build_config({"run.iterations": 2, "run.steps_per_iteration": 3, "run.max_steps": 6})
    with pytest.raises(ConfigError, match="run.max_steps=6"):
        build_config({"run.iterations": 2, "run.steps_per_iteration": 3, "run.max_steps": 5,
                      "reward.funcs": {"rm:/x": 1.0}})
    with pytest.raises(ConfigError, match="rm.replay_share"):
        build_config({"rm.replay_share": 1.0})


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    """An outcome RM initialised from the tiny random policy, saved as `grpokit rm train` saves it."""
    from grpokit.rewards.rm_train import init_reward_model, save_reward_model

    out = tmp_path_factory.mktemp("rm") / "rm"
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    save_reward_model(model, tok, out, kind="outcome", step_separator="\n", init="builtin:tiny-random",
                      report={})
    return out


def _cfg(out: Path, rm: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {f"rm:{rm}": 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 6,
              "run.iterations": 3, "run.steps_per_iteration": 2, "run.save_steps": 1,
              "run.save_total_limit": 3,
              "rm.learning_rate": 1e-2, "rm.train_batch_size": 4, "rm.replay_share": 0.25}
    values.update(over)
    return build_config(values)


@pytest.fixture(scope="module")
def full_run(tiny_rm, tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("iter") / "run"
    resets = []

    def watch(state, metrics):  # the reference equals the policy right after each iteration's end
        if state.step % 2 == 0:
            resets.append(all(torch.equal(r, p) for r, p in zip(state.ref_model.parameters(),
                                                                 state.model.parameters())))

    rm_before = load_file(tiny_rm / "model.safetensors")
    state = train_grpo(_cfg(out, tiny_rm), hooks={"after_step": watch})
    torch.set_num_threads(n)
    return out, state, resets, rm_before


def test_each_iteration_trains_the_rm_with_replay_and_resets_the_reference(full_run):
    out, state, resets, rm_before = full_run
    rows = [json.loads(line) for line in (out / "iterations.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3] and [r["step"] for r in rows] == [2, 4, 6]
    assert all(r["samples"] == 2 * 2 * 4 for r in rows)          # M steps x B x G samples each
    # 0.25 / 0.75 * 16 = 5.33 -> 5; none at first
    assert [r["replay_samples"] for r in rows] == [0, 5, 5]
    # the random policy never writes a boxed answer: every sample is labeled wrong, one class, so the AUC is
    # undefined and reported as NaN, not as a made-up figure (a ranking is measured in the test below)
    assert all(r["verified_accuracy"] == 0.0 and math.isnan(r["rm_auc"]) for r in rows)
    assert resets == [True, True, True]
    moved = [k for k, v in state.reward_loop.rm.model.state_dict().items()
             if k in rm_before and not torch.equal(v, rm_before[k])]
    assert moved, "the reward model was not trained"
    assert len(state.reward_loop.history) == 48 and state.reward_loop.iteration == 3


def _labeled(generator: torch.Generator) -> list[RMSample]:
    """16 verifier-labeled samples: every other one the boxed sum (1.0), the rest a wrong text (0.0)."""
    out = []
    for i in range(16):
        a, b = torch.randint(0, 50, (2,), generator=generator).tolist()
        prompt, right = f"What is {a}+{b}?", i % 2 == 0
        text = f"\\boxed{{{a + b}}}" if right else f"x{a}y{b}z"
        out.append(RMSample(prompt, text, float(right), None, prompt))
    return out


@pytest.mark.parametrize("continual", [True, False])
def test_the_rm_measured_on_fresh_samples_ranks_them_once_trained(tiny_rm, tmp_path, continual):
    """Three iterations of fresh labeled samples (both classes): the AUC before each RM update is a number;
    the untrained RM ranks them badly (measured 0.11), after one continual update it ranks fresh ones
    (measured 1.0 at iterations 2 and 3); frozen it stays bad (measured 0.0, 0.06)."""
    cfg = _cfg(tmp_path, tiny_rm, **{"rm.continual_training": continual})
    loop = RewardLoop(cfg, build_reward_funcs(cfg))
    state, aucs = SimpleNamespace(dist=Distributed(), ref_model=None, step=0), []
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        loop.current = _labeled(generator)
        state.step += cfg.run.steps_per_iteration
        aucs.append(loop.end_iteration(state)["rm_auc"])
    assert all(0.0 <= a <= 1.0 for a in aucs) and aucs[0] < 0.5, aucs       # a number, not NaN
    assert all(a >= 0.9 for a in aucs[1:]) if continual else all(a < 0.5 for a in aucs[1:]), aucs


def test_each_rank_resumes_its_own_share_of_the_iterations_samples(tiny_rm, tmp_path):
    """reward_loop.pt keeps every rank's samples of the iteration; a rank takes its own back, and on another
    rank count rank 0 takes them all (none lost, none doubled)."""
    cfg = _cfg(tmp_path, tiny_rm)
    funcs = build_reward_funcs(cfg)
    shares = [_labeled(torch.Generator().manual_seed(seed))[:3] for seed in (1, 2)]
    saver = RewardLoop(cfg, funcs, rank=0, world_size=2)
    saver.shares = shares
    saver.save(tmp_path)
    assert saver.shares is None                                   # used once: the next save gathers again
    for rank, world, want in ((0, 2, shares[0]), (1, 2, shares[1]), (0, 1, shares[0] + shares[1])):
        loop = RewardLoop(cfg, funcs, rank=rank, world_size=world)
        loop.load(tmp_path)
        assert loop.current == want, (rank, world)


@pytest.mark.parametrize("stop_at", [2, 3])   # at an iteration's end, and inside an iteration
def test_a_kill_inside_iterative_mode_resumes_bit_identically(full_run, tiny_rm, tmp_path, stop_at):
    ref_out, ref_state, _, _ = full_run
    out = tmp_path / "run"

    def kill(state, metrics):
        if state.step == stop_at:
            raise KeyboardInterrupt  # after that step's checkpoint, as a kill would leave it

    with pytest.raises(KeyboardInterrupt):
        train_grpo(_cfg(out, tiny_rm), hooks={"after_step": kill})
    state = train_grpo(_cfg(out, tiny_rm, **{"run.resume": True}))
    for a, b in ((state.model, ref_state.model),
                 (state.reward_loop.rm.model, ref_state.reward_loop.rm.model)):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), name
    assert (out / "iterations.jsonl").read_text() == (ref_out / "iterations.jsonl").read_text()
    ckpt = out / "checkpoint-6"
    assert {"reward_model.safetensors",
            "reward_loop.pt"} <= set(json.loads((ckpt / "manifest.json").read_text())["files"])
