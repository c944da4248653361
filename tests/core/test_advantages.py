"""[C] group_advantages against the chapter's worked examples and a plain-loop reference."""

import math

import pytest
import torch

from grpokit.core.advantages import group_advantages, process_advantages


def test_chapter_four_reward_example_differences_from_mean():
    r = torch.tensor([1.5, 1.0, 0.0, 0.0])
    # mean = 2.5 / 4 = 0.625 -> differences +0.875, +0.375, -0.625, -0.625
    centred = group_advantages(r, 4, scale_rewards="none")
    assert torch.allclose(centred, torch.tensor([0.875, 0.375, -0.625, -0.625]))


def test_chapter_eight_reward_example_population_and_bessel_std():
    r = torch.tensor([1.5, 0, 1.5, 0, 1.0, 1.5, 0.5, 1.5])
    centred = r - r.mean()
    population = centred / r.std(unbiased=False)
    expected = torch.tensor([0.89, -1.48, 0.89, -1.48, 0.10, 0.89, -0.69, 0.89])
    assert torch.allclose(population, expected, atol=0.006)
    # The default (Bessel) divides by a std larger by sqrt(8/7): advantages are the chapter's times sqrt(7/8).
    adv = group_advantages(r, 8)
    assert torch.allclose(adv, population * math.sqrt(7 / 8), atol=1e-6)
    assert torch.allclose(adv, expected * math.sqrt(7 / 8), atol=0.006)


@pytest.mark.parametrize("mode", ["group", "batch", "none"])
def test_all_equal_group_gives_exact_zeros(mode):
    r = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.0, 0.0, 1.0, 0.0])
    adv = group_advantages(r, 4, scale_rewards=mode)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[4:].abs().sum() > 0


def test_matches_plain_loop_reference():
    torch.manual_seed(0)
    r = torch.randint(0, 3, (24,)).float() / 2
    adv = group_advantages(r, 6)
    for g in range(4):
        vals = r[g * 6:(g + 1) * 6].tolist()
        mean = sum(vals) / 6
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 5)
        for j, v in enumerate(vals):
            want = 0.0 if std < 1e-8 else (v - mean) / (std + 1e-8)
            assert adv[g * 6 + j].item() == pytest.approx(want, abs=1e-6)


def test_nan_rewards_are_excluded_from_group_statistics():
    r = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    adv = group_advantages(r, 4)
    vals = torch.tensor([1.0, 0.0, 1.0])
    want = (vals - vals.mean()) / (vals.std() + 1e-8)
    assert adv[1] == 0
    assert torch.allclose(adv[[0, 2, 3]], want)


def test_group_scaling_invariant_and_none_scales_linearly():
    r = torch.tensor([1.0, 0.0, 0.5, 2.0])
    assert torch.allclose(group_advantages(3 * r, 4), group_advantages(r, 4), atol=1e-6)
    assert torch.allclose(group_advantages(3 * r, 4, scale_rewards="none"),
                          3 * group_advantages(r, 4, scale_rewards="none"))


def test_process_advantages_follow_the_paper_formula():
    # Two completions (G = 2), T = 5. Steps: completion 0 ends steps at tokens 1 and 4 with rewards 1, 0;
    # completion 1 ends one step at token 2 with reward 1.
    steps = [[(1, 1.0), (4, 0.0)], [(2, 1.0)]]
    adv = process_advantages(steps, group_size=2, completion_length=5)
    vals = torch.tensor([1.0, 0.0, 1.0])
    mean, std = vals.mean(), vals.std()          # 2/3, sqrt(1/3)
    n = lambda v: (v - mean) / std               # noqa: E731
    # Token t's advantage sums the normalized rewards of steps ending at or after t.
    want0 = [n(1.0) + n(0.0), n(1.0) + n(0.0), n(0.0), n(0.0), n(0.0)]
    want1 = [n(1.0), n(1.0), n(1.0), 0.0, 0.0]
    assert torch.allclose(adv, torch.tensor([want0, want1]), atol=1e-6)
