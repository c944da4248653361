"""Tree rollouts in training (rollout.tree.*): a tree with no branch inside the completion trains exactly as
flat GRPO; a branching tree logs the tokens it decoded against flat sampling's; a stopped tree run resumes
to the uninterrupted weights; bad trees are refused in one line (CPU, tiny random model)."""

from pathlib import Path

import pytest
import torch

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train.loop import train_grpo
from live_runs import assert_same_weights, final_weights  # tests/live_runs.py

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"

# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical results on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 8, "rollout.max_completion_length": 12, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 4,
              "run.save_steps": 2}
    return build_config({**values, **over})


def test_a_tree_without_a_branch_inside_the_completion_trains_exactly_as_flat(tmp_path):
    train_grpo(tiny(tmp_path / "flat"))
    train_grpo(tiny(tmp_path / "tree", **{"rollout.tree.widths": [8, 1], "rollout.tree.branch_at": [4]}))
    assert_same_weights(final_weights(tmp_path / "flat"), final_weights(tmp_path / "tree"))
    flat, tree = read_metrics(tmp_path / "flat"), read_metrics(tmp_path / "tree")
    assert [r["loss"] for r in flat] == [r["loss"] for r in tree]
    assert all(r["tree/decoded_tokens"] == r["tree/flat_tokens"] == r["completion_tokens"] for r in tree)


@pytest.fixture(scope="module")
def branching(tmp_path_factory):
    out = tmp_path_factory.mktemp("branching")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    train_grpo(tiny(out, **{"rollout": {"tree": {"widths": [2, 2, 2], "branch_at": [3, 6]}}}))
    torch.set_num_threads(n)
    return out


def test_a_branching_tree_decodes_fewer_tokens_than_flat_sampling_of_its_leaves(branching, tmp_path):
    rows = read_metrics(branching)
    assert len(rows) == 4 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    for r in rows:
        assert r["tree/decoded_tokens"] < r["tree/flat_tokens"] == r["completion_tokens"]
        assert r["tree/decoded_share"] == pytest.approx(r["tree/decoded_tokens"] / r["tree/flat_tokens"])
    train_grpo(tiny(tmp_path))                     # flat: other samples, other weights
    tree, flat = final_weights(branching), final_weights(tmp_path)
    assert any(not torch.equal(tree[k], flat[k]) for k in tree)


def test_a_stopped_tree_run_resumes_to_the_uninterrupted_final_weights(branching, tmp_path):
    tree = {"rollout.tree.widths": [2, 2, 2], "rollout.tree.branch_at": [3, 6]}

    def crash(state, metrics):
        if state.step == 3:
            raise KeyboardInterrupt                # after checkpoint-2
    with pytest.raises(KeyboardInterrupt):
        train_grpo(tiny(tmp_path, **tree), hooks={"after_step": crash})
    train_grpo(tiny(tmp_path, **tree, **{"run.resume": True}))
    assert_same_weights(final_weights(branching), final_weights(tmp_path))
    assert [r["loss"] for r in read_metrics(tmp_path)] == [r["loss"] for r in read_metrics(branching)]


@pytest.mark.parametrize("over,says", [
    ({"rollout.tree.widths": [2, 2]}, "has 4 leaves but rollout.num_generations=8"),
    ({"rollout.tree.widths": [2, 4]}, "branch_at needs 1 token counts"),
    ({"rollout.tree.widths": [2, 4], "rollout.tree.branch_at": [12]}, "must increase, each between 1 and"),
    ({"rollout.tree.widths": [2, 2, 2], "rollout.tree.branch_at": [5, 5]}, "must increase"),
    ({"rollout.tree.widths": [0, 8], "rollout.tree.branch_at": [3]}, "widths >= 1"),
    ({"rollout.tree.branch_at": [3]}, "needs rollout.tree.widths"),
    ({"rollout.tree.widths": "2,4"}, r"must be integers, widths >= 1 \(e.g. rollout.tree.widths=\[2,4\]"),
    ({"rollout.tree.widths": 8}, "must be a list, got 8"),
    ({"rollout.tree.widths": [2, 4], "rollout.tree.branch_at": [3], "rollout.backend": "generate"},
     "with rollout.backend: not supported"),
    ({"rollout.tree.widths": [2, 4], "rollout.tree.branch_at": [3], "rollout.dynamic_sampling": True},
     "with rollout.dynamic_sampling"),
    ({"rollout.tree.widths": [2, 4], "rollout.tree.branch_at": [3], "rollout.async.max_staleness": 1},
     "with rollout.async.max_staleness"),
    ({"rollout.tree.widht": [2, 4]}, "rollout.tree_widths"),
])
def test_bad_trees_are_refused_in_one_line(tmp_path, over, says):
    with pytest.raises(ConfigError, match=says) as err:
        tiny(tmp_path, **over)
    assert "\n" not in str(err.value)
