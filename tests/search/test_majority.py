"""Majority voting: the mode of the final answers wins, a tie goes to the answer sampled first."""

from search_stubs import StubDecoder

from grpokit.search.common import answer_key, summarize
from grpokit.search.majority import majority, vote
from grpokit.tasks import Example


def test_vote_picks_the_mode_and_the_first_sample_that_carries_it():
    assert vote(["3", "5", "5", "3", "5"]) == 1        # 5 has three votes; its first sample is index 1
    assert vote([None, "7", None]) == 1                 # no answer: no vote
    assert vote([None, None]) is None


def test_vote_breaks_a_tie_by_the_first_sampled_answer():
    assert vote(["4", "9", "9", "4"]) == 0              # 4 and 9 have two votes each; 4 came first
    assert vote(["9", "4", "4", "9"]) == 0
    assert vote([None, "2", "1"]) == 1


def test_answer_key_compares_numbers_by_value():
    assert answer_key("x \\boxed{95}") == answer_key("\\boxed{95.0}") == answer_key("#### 95")
    assert answer_key("\\boxed{95}") != answer_key("\\boxed{96}")
    assert answer_key("no answer here") is None and answer_key("\\boxed{ }") is None


def test_majority_on_hand_made_completions(char_tokenizer):
    texts = {"What is 1+1?": ["1+1=3. \\boxed{3}", "1+1=2. \\boxed{2}", "\\boxed{2.0}", "\\boxed{3}",
                              "\\boxed{2}"],
             "What is 2+2?": ["\\boxed{5}", "\\boxed{4}", "nothing", "\\boxed{4}", "\\boxed{5}"]}
    examples = [Example(p, a, {"answer": a}) for p, a in (("What is 1+1?", "2"), ("What is 2+2?", "4"))]
    dec = StubDecoder(char_tokenizer, texts)
    results = majority(dec, examples, 5)
    assert [r.completion for r in results] == ["1+1=2. \\boxed{2}", "\\boxed{5}"]   # 2: 3 votes; 5-4 tie: 5
    assert [r.correct for r in results] == [1.0, 0.0]
    assert [r.extra["votes"] for r in results] == [3, 2]
    assert results[0].tokens == sum(len(t) + 1 for t in texts["What is 1+1?"])
    assert sum(r.tokens for r in results) == sum(c.tokens for c in dec.decoded)


def test_majority_records_every_candidate_and_the_report_gives_pass_at_n(char_tokenizer):
    texts = {"What is 1+1?": ["\\boxed{3}", "\\boxed{3}", "\\boxed{2}"],   # voted wrong, one right sample
             "What is 2+2?": ["no answer", "\\boxed{5}", "\\boxed{6}"]}      # none right
    examples = [Example(p, a, {"answer": a}) for p, a in (("What is 1+1?", "2"), ("What is 2+2?", "4"))]
    results = majority(StubDecoder(char_tokenizer, texts), examples, 3)
    first = results[0].extra["candidates"]
    assert [c["correct"] for c in first] == [0.0, 0.0, 1.0]
    assert [c["answer"] for c in first] == [answer_key("\\boxed{3}")] * 2 + [answer_key("\\boxed{2}")]
    assert [c["tokens"] for c in first] == [len(t) + 1 for t in texts["What is 1+1?"]]
    assert results[1].extra["candidates"][0]["answer"] is None
    summary = summarize(results)
    assert summary["accuracy"] == 0.0 and summary["oracle_accuracy"] == 0.5   # pass@3: problem 1 only
