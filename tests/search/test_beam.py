"""Beam search: exactly `budget` beams per round, every generated token counted (hand counts on a stub)."""

from search_stubs import StubDecoder

from grpokit.search.beam import Beam, beam, search_one, select
from grpokit.tasks import Example


def digit_sum(prompts, completions):
    """A fake process scorer: the sum of the digits written so far."""
    return [float(sum(int(ch) for ch in c if ch.isdigit())) for c in completions]


def test_select_keeps_the_best_and_breaks_ties_by_order():
    pool = [Beam([1], 0.5, True), Beam([2], 0.9, False), Beam([3], 0.5, False), Beam([4], 0.1, False)]
    assert [b.ids for b in select(pool, 2)] == [[2], [1]]
    assert [b.ids for b in select(pool, 3)] == [[2], [1], [3]]
    assert len(select(pool, 9)) == 4


def test_beam_keeps_budget_beams_and_counts_tokens_by_hand(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=2)
    best, cost = search_one(dec, "Q?", width=2, expand=2, scorer=digit_sum, separator=". ")
    # round 0: the empty solution expanded 2 * 2 times: "00. " "10. " "20. " "30. " (4 tokens each);
    #   kept: "30. " (3), "20. " (2)
    # round 1: each of the 2 beams expanded twice with "01. " / "11. ": 4 steps of 4 tokens;
    #   scores 30.01.=4, 30.11.=5, 20.01.=3, 20.11.=4 -> kept "30. 11. " (5), "30. 01. " (4, first of the 4s)
    # round 2: each beam ends with "\boxed{0}" / "\boxed{1}" + EOS (10 tokens): 4 steps of 10 tokens;
    #   scores 6 ("30. 11. \boxed{1}"), 5, 5, 4 -> every kept beam has ended
    assert [(len(prefixes), n) for prefixes, n, _ in dec.calls] == [(1, 4), (2, 2), (2, 2)]
    assert cost == {"tokens": 4 * 4 + 4 * 4 + 4 * 10, "prefill_tokens": 2 + 2 * (2 + 4) + 2 * (2 + 8),
                    "rounds": 3}
    assert char_tokenizer.decode(best.ids, skip_special_tokens=True) == "30. 11. \\boxed{1}"
    assert best.done and best.score == 6.0
    assert cost["tokens"] == sum(c.tokens for c in dec.decoded)


def test_beam_stops_at_the_token_limit(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=5, max_new_tokens=8)
    best, cost = search_one(dec, "Q?", width=3, expand=1, scorer=digit_sum, separator=". ")
    # two steps of 4 tokens reach the 8-token limit: every beam is finished without an answer
    assert [limits for _, _, limits in dec.calls] == [[8], [4, 4, 4]]
    assert cost["tokens"] == 3 * 4 + 3 * 4 and cost["rounds"] == 2
    assert best.done and len(best.ids) == 8


def test_beam_keeps_finished_beams_in_the_pool(char_tokenizer):
    dec = StubDecoder(char_tokenizer, depth=0)   # every step is a final answer: all beams end in round 0
    [result] = beam(dec, [Example("Q?", "2", {"answer": "2"})], 2, digit_sum, ". ", expand=3)
    # round 0: 2 * 3 answers \boxed{0..5}; the best (5) is chosen and is wrong
    assert result.completion == "\\boxed{5}" and result.correct == 0.0
    assert result.tokens == 6 * 10 and result.extra["rounds"] == 1
