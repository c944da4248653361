"""MCTS rollouts in training (rollout.mcts.*): a run trains and logs its search; a token budget leaves
empty rows that get no reward and no loss; a stopped run resumes to the uninterrupted weights; the step
verifier or a reward-model folder as the value; impossible combinations refused in one line (CPU, tiny
random model)."""

from pathlib import Path

import pytest
import torch

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.metrics import read_metrics
from grpokit.rewards.rm_train import init_reward_model, save_reward_model
from grpokit.rewards.scoring import RewardBatch
from grpokit.train.loop import train_grpo
from grpokit.train.mcts_rollouts import blank_rows
from live_runs import assert_same_weights, final_weights  # tests/live_runs.py

# the demo's policy writes "37+58=95. \boxed{95}": two steps, the first ending at ". "
MCTS = {"rollout.mcts.enabled": True, "rollout.mcts.separator": ". "}

# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical results on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:arith-demo", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {"rule": 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 6, "rollout.max_completion_length": 24, "optim.learning_rate": 1e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 4,
              "run.save_steps": 2}
    return build_config({**values, **MCTS, **over})


def test_an_mcts_run_trains_logs_its_search_and_resumes_to_the_same_weights(tmp_path):
    train_grpo(tiny(tmp_path / "straight"))
    rows = read_metrics(tmp_path / "straight")
    assert len(rows) == 4 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    for r in rows:
        assert r["mcts/simulations_per_group"] == 6 and r["mcts/nodes_per_group"] >= 2
        assert r["mcts/decoded_tokens"] == 2 * r["mcts/decoded_tokens_per_group"] > 0
        assert 0.0 <= r["mcts/mean_value"] <= 1.5 and r["mcts/prefill_tokens"] > 0     # rule: 0, 0.5, 1.5
        assert r["skipped_updates"] == 0

    def crash(state, metrics):
        if state.step == 3:
            raise KeyboardInterrupt                # after checkpoint-2
    with pytest.raises(KeyboardInterrupt):
        train_grpo(tiny(tmp_path / "stopped"), hooks={"after_step": crash})
    train_grpo(tiny(tmp_path / "stopped", **{"run.resume": True}))
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "stopped")
    assert_same_weights(a, b)
    assert [r["loss"] for r in read_metrics(tmp_path / "stopped")] == [r["loss"] for r in rows]
    train_grpo(tiny(tmp_path / "flat", **{"rollout.mcts.enabled": False}))   # other samples, other weights
    flat = final_weights(tmp_path / "flat")
    assert any(not torch.equal(x, flat[k]) for k, x in a.items())
    assert "mcts/decoded_tokens" not in read_metrics(tmp_path / "flat")[0]


def test_a_token_budget_cuts_the_search_and_its_empty_rows_train_nothing(tmp_path):
    train_grpo(tiny(tmp_path, **{"rollout.mcts.max_tokens": 14, "run.max_steps": 2, "run.save_steps": 0}))
    # the first simulation's step ("37+58=95. ": 10 tokens) and rollout ("\boxed{95}" + EOS: 11) pass 14
    rows = read_metrics(tmp_path)
    for r in rows:
        assert r["mcts/decoded_tokens_per_group"] <= 14 and r["mcts/simulations_per_group"] <= 6
        assert r["skipped_updates"] == 0 and torch.isfinite(torch.tensor(r["loss"]))
    assert any(r["mcts/simulations_per_group"] < 6 for r in rows)      # 14 tokens ran out before 6 sims


def test_blank_rows_leaves_the_unrun_rows_out_of_the_rewards():
    scores = RewardBatch(torch.tensor([1.0, 0.5, 0.0, 0.2]), {"a": torch.tensor([1.0, 0.5, 0.0, 0.2])}, 0,
                         [[(0, 1.0)], [(1, 0.5)], [], [(2, 1.0)]])
    correct = torch.tensor([1.0, 0.0, 0.0, 1.0])
    scores, correct = blank_rows(scores, correct, [1, 3])
    assert torch.equal(scores.total.isnan(), torch.tensor([False, True, False, True]))
    assert scores.per_func["a"][0] == 1.0 and scores.per_func["a"][3].isnan()
    assert scores.step_rewards == [[(0, 1.0)], [], [], []] and correct[1].isnan() and correct[0] == 1.0


@pytest.mark.parametrize("value", ["steps", "outcome", "process"])
def test_the_step_verifier_or_a_reward_model_folder_as_the_value(tmp_path, value):
    if value != "steps":                          # an untrained RM on the tiny model's backbone
        model, tok = init_reward_model("builtin:tiny-random", value, seed=0)
        value = str(save_reward_model(model, tok, tmp_path / "rm", kind=value, step_separator=". ",
                                      init="builtin:tiny-random", report={}))
    train_grpo(tiny(tmp_path / "run", **{"rollout.mcts.value": value, "rm.transform": "sigmoid",
                                         "run.max_steps": 1, "run.save_steps": 0}))
    [r] = read_metrics(tmp_path / "run")
    assert r["mcts/simulations_per_group"] == 6 and 0.0 <= r["mcts/mean_value"] <= 1.0
    assert torch.isfinite(torch.tensor(r["loss"]))


@pytest.mark.parametrize("over,says", [
    ({"rollout.backend": "generate"}, "rollout.mcts.enabled with rollout.backend: not supported"),
    ({"rollout.environment": "calculator"}, "with rollout.tools / rollout.environment"),
    ({"rollout.async.max_staleness": 1}, "with rollout.async.max_staleness"),
    ({"rollout.dynamic_sampling": True}, "with rollout.dynamic_sampling"),
    ({"loss.algorithm": "ppo"}, "with loss.algorithm=ppo"),
    ({"rollout.tree.widths": [2, 3], "rollout.tree.branch_at": [3]}, "with rollout.tree.widths"),
    ({"rollout.mcts.width": 0}, "rollout.mcts.width must be >= 1"),
    ({"rollout.mcts.max_tokens": 0}, "rollout.mcts.max_tokens must be >= 1 or null"),
    ({"rollout.mcts.exploration": -1.0}, "rollout.mcts.exploration must be a finite number >= 0"),
    ({"rollout.mcts.separator": ""}, "rollout.mcts.separator is empty"),
    ({"rollout.mcts.value": "rewards"}, "rollout.mcts.value must be reward, steps or a reward-model folder; "
                                        "'rewards' is none of them.*reward"),
    ({"rollout.mcts.widht": 2}, "rollout.mcts_width"),
])
def test_impossible_mcts_settings_are_refused_in_one_line(tmp_path, over, says):
    with pytest.raises(ConfigError, match=says) as err:
        tiny(tmp_path, **over)
    assert "\n" not in str(err.value)
