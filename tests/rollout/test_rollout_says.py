"""What a sampler knows of its rows travels on the Rollout (tree, unrun rows, reward keywords, search
figures), through select, concat, the device move and the stored forms; the step reads it from there."""

import torch

from grpokit.config.schema import build_config
from grpokit.rollout.async_worker import rollout_from, rollout_payload
from grpokit.rollout.contract import assemble_rollout, concat_rollouts, pad_rows
from grpokit.rollout.tree import TreeSpec
from grpokit.train.distributed import Distributed
from grpokit.train.step import compute_advantages, tree_stats

EOS, PAD = 1, 0
TREE = TreeSpec((2, 2), (2,))


def _rollout(tok, *, tree=None, unrun=None, kwargs=None, stats=None):
    ids = torch.tensor([[5, 6, 7, EOS], [5, 6, 8, EOS], [5, 9, 7, EOS], [5, 9, 6, EOS]])
    return assemble_rollout(tokenizer=tok, prompts=["ab"], prompt_ids=pad_rows([[3, 4]], 2, PAD),
                            prompt_mask=torch.ones(1, 2, dtype=torch.long), completion_ids=ids,
                            group_size=4, eos_ids=[EOS], tree=tree, unrun=unrun, reward_kwargs=kwargs,
                            sampler_stats=stats)


def test_the_said_fields_survive_select_concat_the_device_move_and_the_payload(char_tokenizer):
    a = _rollout(char_tokenizer, tree=TREE, unrun=torch.tensor([0, 0, 1, 1]),
                 kwargs={"environments": ["e0", "e1", "e2", "e3"]}, stats={"nodes": 3.0, "tokens": 10.0})
    b = _rollout(char_tokenizer, tree=TREE, kwargs={"environments": list("wxyz")}, stats={"nodes": 2.0})
    both = concat_rollouts([a, b], PAD)
    assert both.tree == TREE and both.unrun.tolist() == [False, False, True, True] + [False] * 4
    assert both.reward_kwargs["environments"] == ["e0", "e1", "e2", "e3", "w", "x", "y", "z"]
    assert both.sampler_stats == {"nodes": 5.0, "tokens": 10.0}
    picked = both.select([4, 5, 6, 7])
    assert picked.reward_kwargs["environments"] == list("wxyz") and not picked.unrun.any()
    assert picked.tree == TREE and picked.sampler_stats == both.sampler_stats
    moved = a.to("meta")
    assert moved.unrun.device.type == "meta" and moved.tree == TREE
    back = rollout_from(rollout_payload(a))       # the async worker's bytes: weights_only loadable
    assert back.tree == TREE and torch.equal(back.unrun, a.unrun) and back.sampler_stats == a.sampler_stats
    assert back.reward_kwargs == {}               # live objects are read before a rollout is stored
    mixed = concat_rollouts([a, _rollout(char_tokenizer)], PAD)
    assert mixed.tree is None                     # trees of one shape only


def test_advantages_and_metrics_read_the_tree_from_the_rollout_not_the_config(char_tokenizer, tmp_path):
    cfg = build_config({"run.output_dir": str(tmp_path), "rollout.num_generations": 4})   # no tree here
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    flat = compute_advantages(cfg, _rollout(char_tokenizer), rewards, None)
    tree = compute_advantages(cfg, _rollout(char_tokenizer, tree=TREE), rewards, None)
    assert flat.dim() == 1 and tree.shape == (4, 4)
    assert not torch.allclose(tree, flat[:, None].expand(4, 4))   # the segments' own term is there
    assert tree_stats(_rollout(char_tokenizer), Distributed()) == {}
    stats = tree_stats(_rollout(char_tokenizer, tree=TREE), Distributed())
    # the first two tokens once per child of the root (2), the last two once per leaf (4): 2*2 + 4*2 of 16
    assert stats["tree/decoded_tokens"] == 12.0 and stats["tree/flat_tokens"] == 16.0
