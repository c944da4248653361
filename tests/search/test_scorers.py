"""Scorers: the step verifier as a process scorer, and min / last aggregation."""

import math

from grpokit.search.scorers import VerifierSteps, aggregate, answer_agrees, process_scorer


def test_aggregate_min_and_last():
    assert aggregate([0.9, 0.2, 0.7], "min") == 0.2
    assert aggregate([0.9, 0.2, 0.7], "last") == 0.7
    assert aggregate([], "min") == -math.inf


def test_answer_agrees_with_the_last_equation():
    assert answer_agrees("12+30=42. \\boxed{42}")
    assert not answer_agrees("12+30=42. \\boxed{43}")
    assert answer_agrees("\\boxed{7}")                  # no equation to disagree with
    assert answer_agrees("12+30=42. ")                  # no answer yet: a partial solution


def test_verifier_scores_each_step_without_the_reference():
    v = VerifierSteps(". ")
    [good, bad_sum, bad_box] = v.score_steps(["Q"] * 3, ["12+30=42. \\boxed{42}", "12+30=41. \\boxed{41}",
                                                          "12+30=42. \\boxed{41}"])
    assert good == [(10, 1.0), (20, 1.0)]          # (end char of the step, score)
    assert [s for _, s in bad_sum] == [0.0, 1.0]   # the wrong equation's step; its box agrees with it
    assert [s for _, s in bad_box] == [1.0, 0.0]   # a right equation, a box that disagrees
    score_min, score_last = process_scorer(v, "min"), process_scorer(v, "last")
    texts = ["12+30=42. \\boxed{42}", "12+30=41. \\boxed{41}"]
    assert score_min(["Q"] * 2, texts) == [1.0, 0.0]
    assert score_last(["Q"] * 2, texts) == [1.0, 1.0]
    # partial solutions (beam search): the equation decides, the missing box does not count against them
    assert score_min(["Q"] * 2, ["12+30=42. ", "12+30=41. "]) == [1.0, 0.0]
