"""Best-of-N: the scorer's argmax is chosen; ties go to the first sample; NaN never wins."""

import math

from search_stubs import StubDecoder

from grpokit.search.best_of_n import best_of_n, pick_best
from grpokit.tasks import Example


def test_pick_best_is_the_first_argmax_and_skips_nan():
    assert pick_best([0.1, 0.7, 0.3]) == 1
    assert pick_best([0.5, 0.9, 0.9]) == 1
    assert pick_best([math.nan, -3.0]) == 1
    assert pick_best([-math.inf, -math.inf]) == 0


def test_best_of_n_picks_the_scorers_argmax(char_tokenizer):
    texts = {"What is 3+4?": ["\\boxed{6}", "\\boxed{7}", "\\boxed{8}", "\\boxed{77}"]}
    seen = []

    def fake_scorer(prompts, completions):   # prefers the completion with the most 7s
        seen.append((list(prompts), list(completions)))
        return [float(c.count("7")) for c in completions]

    dec = StubDecoder(char_tokenizer, texts)
    [result] = best_of_n(dec, [Example("What is 3+4?", "7", {"answer": "7"})], 4, fake_scorer)
    assert result.completion == "\\boxed{77}" and result.correct == 0.0   # the RM's pick, right or not
    assert {k: result.extra[k] for k in ("score", "pick")} == {"score": 2.0, "pick": 3}
    assert result.extra["candidates"] == [    # every sample: its answer, right or not, cost, score
        {"answer": repr(float(v)), "correct": float(v == 7), "tokens": len(t) + 1,
         "score": float(t.count("7"))} for t, v in zip(texts["What is 3+4?"], (6, 7, 8, 77))]
    assert seen == [(["What is 3+4?"] * 4, texts["What is 3+4?"])]        # every sample scored once
    assert result.tokens == sum(len(t) + 1 for t in texts["What is 3+4?"])
    assert result.tokens == sum(c.tokens for c in dec.decoded)
