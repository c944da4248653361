"""Generation reuse (rollout.steps_per_generation = k, grpokit.train.generations): one sampling call feeds k
optimizer steps on distinct slices of whole groups, pi_old is the sampling policy's, k = 1 is the plain
step, and a checkpoint between two slices resumes bit-identically (CPU, tiny random model, seconds)."""

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train import step as step_module
from grpokit.train.generations import GENERATION_FILE, check_ranks
from grpokit.train.loop import train_grpo
from grpokit.train.update import forward_logprobs

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 4,
              "run.save_steps": 0}
    values.update(over)
    return build_config(values)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


class Spy:
    """Counts sampling calls and records what each update was given (the real functions still run)."""

    def __init__(self, monkeypatch):
        self.generations, self.updates = [], []
        real_collect, real_update = step_module.collect_batch, step_module.policy_update

        def collect(state, timer):
            out = real_collect(state, timer)
            # the sampling policy's weights, to check pi_old against later
            self.generations.append((out[0], copy.deepcopy(state.model)))
            return out

        def update(state, rollout, advantages, *, old_lp, ref_lp, loss_mask, timer):
            with torch.no_grad():
                now = forward_logprobs(state.model, rollout, state.cfg)          # pi_theta before the update
                sampler = forward_logprobs(self.generations[-1][1], rollout, state.cfg)
            self.updates.append({"rollout": rollout, "old_lp": old_lp, "now": now, "sampler": sampler,
                                 "mask": loss_mask.bool()})
            return real_update(state, rollout, advantages, old_lp=old_lp, ref_lp=ref_lp, loss_mask=loss_mask,
                               timer=timer)

        monkeypatch.setattr(step_module, "collect_batch", collect)
        monkeypatch.setattr(step_module, "policy_update", update)


def test_k1_is_the_plain_step(tmp_path):
    """rollout.steps_per_generation=1 (the default) trains exactly as a config without the key: same
    weights, same rows, no generation/slice field, no generation.pt in any checkpoint."""
    absent = train_grpo(tiny(tmp_path / "absent", **{"run.save_steps": 1}))
    one = train_grpo(tiny(tmp_path / "one", **{"rollout.steps_per_generation": 1, "run.save_steps": 1}))
    assert_same(absent.model.state_dict(), one.model.state_dict())
    rows, ref = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "absent")
    assert [(r["reward_mean"], r["loss"], r["grad_norm"]) for r in rows] == \
        [(r["reward_mean"], r["loss"], r["grad_norm"]) for r in ref]
    assert not any("generation/slice" in r for r in rows)
    assert not list((tmp_path / "one").glob(f"checkpoint-*/{GENERATION_FILE}"))
    assert any(r["grad_norm"] > 0 for r in rows)   # the weights moved: the identity is not trivial


def test_k2_samples_once_per_two_steps_on_distinct_whole_group_slices(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    cfg = tiny(tmp_path / "k2", **{"rollout.steps_per_generation": 2})
    state = train_grpo(cfg)
    assert state.step == 4 and len(spy.generations) == 2 and len(spy.updates) == 4
    B, G = cfg.rollout.prompts_per_step, cfg.rollout.num_generations
    for g, (full, _) in enumerate(spy.generations):
        assert full.completion_ids.shape[0] == 2 * B * G         # k x B prompts x G completions
        first, second = (spy.updates[2 * g + j]["rollout"] for j in range(2))
        for part in (first, second):                             # B whole groups, ids 0..B-1
            assert part.completion_ids.shape[0] == B * G
            assert part.group_ids.tolist() == [i for i in range(B) for _ in range(G)]
            assert all(len(set(part.prompts[i * G:(i + 1) * G])) == 1 for i in range(B))
        assert first.prompts + second.prompts == full.prompts     # the two halves, in order
        assert not set(first.prompts) & set(second.prompts)       # distinct prompts
        assert torch.equal(torch.cat([first.completion_ids, second.completion_ids]), full.completion_ids)
    rows = read_metrics(tmp_path / "k2")
    assert [r["generation/slice"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert all("time/generate" in r for r in rows[::2]) and not any("time/generate" in r for r in rows[1::2])


def test_pi_old_is_the_sampling_policy_so_the_second_slice_has_ratios_off_one(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    train_grpo(tiny(tmp_path / "k2", **{"rollout.steps_per_generation": 2, "run.max_steps": 2}))
    first, second = spy.updates
    for u in (first, second):   # old log-probs: those of the weights that sampled the generation
        assert u["old_lp"] is not None
        torch.testing.assert_close(u["old_lp"][u["mask"]], u["sampler"][u["mask"]], atol=1e-5, rtol=0)
    # slice 0 trains on-policy (ratio 1); slice 1 after one optimizer step (ratio != 1)
    torch.testing.assert_close(first["now"][first["mask"]], first["old_lp"][first["mask"]], atol=1e-5, rtol=0)
    drift = (second["now"] - second["old_lp"])[second["mask"]].abs().max()
    assert drift > 1e-4
    rows = read_metrics(tmp_path / "k2")
    assert rows[0]["mean_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert rows[1]["mean_ratio"] != pytest.approx(1.0)


def test_k2_composes_with_num_iterations(tmp_path, monkeypatch):
    """mu = 2: each step makes two updates of its slice (k x mu = 4 per generation), one sampling call."""
    spy = Spy(monkeypatch)
    train_grpo(tiny(tmp_path / "mu", **{"rollout.steps_per_generation": 2, "loss.num_iterations": 2,
                                         "run.max_steps": 2}))
    assert len(spy.generations) == 1 and len(spy.updates) == 2
    rows = read_metrics(tmp_path / "mu")
    assert all("grad_norm/iter1" in r for r in rows)


def test_a_checkpoint_between_slices_resumes_bit_identically(tmp_path):
    """k = 2, 6 steps straight vs 3 steps (the checkpoint after slice 0 of the second generation), then
    resumed to 6: the same weights, optimizer state and rows."""
    over = {"rollout.steps_per_generation": 2, "run.max_steps": 6, "run.save_steps": 3}
    whole = train_grpo(tiny(tmp_path / "whole", **over))
    out = tmp_path / "cut"
    train_grpo(tiny(out, **{**over, "run.max_steps": 3}))
    assert (out / "checkpoint-3" / GENERATION_FILE).is_file()      # mid-generation: its slice 1 is saved
    resumed = train_grpo(tiny(out, **{**over, "run.resume": True}))
    assert not (out / "checkpoint-6" / GENERATION_FILE).exists()   # a generation's end: nothing left
    assert_same(load_file(out / "final" / "model.safetensors"),
                load_file(tmp_path / "whole" / "final" / "model.safetensors"))
    for name, value in whole.optimizer.state_dict()["state"].items():
        for k, v in value.items():
            assert torch.equal(v, resumed.optimizer.state_dict()["state"][name][k])
    rows, ref = read_metrics(out), read_metrics(tmp_path / "whole")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    keys = ("reward_mean", "loss", "grad_norm", "mean_ratio", "generation/slice")
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in ref]
    assert rows[3]["mean_ratio"] != pytest.approx(1.0)   # step 4 is the resumed slice 1, off-policy


def test_a_checkpoint_between_slices_keeps_multi_turn_trajectories(tmp_path):
    """The saved generation rebuilds a rollout with its tool-call trajectories (calculator environment)."""
    from grpokit.train.generations import load_generation

    over = {"model.name_or_path": "builtin:calculator-demo", "task.name": "arithmetic",
            "rollout.environment": "calculator", "rollout.max_completion_length": 24,
            "reward.funcs": {"rule": 1.0},
            "rollout.steps_per_generation": 2, "run.max_steps": 1, "run.save_steps": 1}
    state = train_grpo(tiny(tmp_path / "agents", **over))
    gen = load_generation(tmp_path / "agents" / "checkpoint-1", None)
    assert gen is not None and gen.first_step == 0 and gen.slices == 2
    assert state.generation is not None
    saved, live = gen.batch.rollout, state.generation.batch.rollout
    assert saved.completions == live.completions and saved.prompts == live.prompts
    assert [t.stop for t in saved.trajectories] == [t.stop for t in live.trajectories]
    assert [len(t.turns) for t in saved.trajectories] == [len(t.turns) for t in live.trajectories]
    assert torch.equal(saved.completion_ids, live.completion_ids)
    assert torch.equal(gen.batch.advantages, state.generation.batch.advantages.cpu())


@pytest.mark.parametrize(("over", "match"), [
    ({"rollout.steps_per_generation": 0}, "must be an integer >= 1"),
    ({"rollout.steps_per_generation": 2, "rollout.async.max_staleness": 1},
     "with rollout.async.max_staleness"),
    ({"rollout.steps_per_generation": 2, "loss.algorithm": "ppo"}, "with loss.algorithm=ppo"),
    ({"rollout.steps_per_generation": 2, "rollout.dynamic_sampling": True}, "with rollout.dynamic_sampling"),
    ({"rollout.steps_per_generation": 2, "rollout.reuse_activations": True},
     "with rollout.reuse_activations=true"),
])
def test_bad_settings_are_one_line_errors(tmp_path, over, match):
    with pytest.raises(ConfigError, match=match) as err:
        tiny(tmp_path, **over)
    assert "\n" not in str(err.value)


def test_several_ranks_need_checkpoints_at_generation_ends(tmp_path):
    check_ranks(tiny(tmp_path, **{"rollout.steps_per_generation": 2, "run.save_steps": 4}), world_size=2)
    check_ranks(tiny(tmp_path, **{"rollout.steps_per_generation": 2, "run.save_steps": 3}), world_size=1)
    with pytest.raises(ConfigError, match="set run.save_steps to a multiple of 2"):
        check_ranks(tiny(tmp_path, **{"rollout.steps_per_generation": 2, "run.save_steps": 3}), world_size=2)
