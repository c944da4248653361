"""Reward functions, their weighted sum, error handling, and the arithmetic process reward."""

import math
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from grpokit.config.schema import GRPOConfig
from grpokit.rewards.scoring import (
    REWARDS,
    RewardError,
    get_reward_function,
    reward_kwargs,
    score_responses,
    token_char_ends,
)
from grpokit.rewards.steps import check_steps

TESTS = Path(__file__).resolve().parents[1]


def _batch(completions, answers):
    return ["q"] * len(completions), completions, {"answer": list(answers)}


# ---------------------------------------------------------------------------------------------
# built-in outcome rewards
# ---------------------------------------------------------------------------------------------

def test_accuracy_rule_and_format():
    completions = [r"12+34=46. \boxed{46}", r"\boxed{45}", "46", "#### 46", r"\boxed{}"]
    prompts, completions, cols = _batch(completions, ["46"] * 5)
    assert REWARDS["accuracy"](prompts, completions, **cols) == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert REWARDS["rule"](prompts, completions, **cols) == [1.5, 0.5, 0.0, 0.0, 0.0]
    assert REWARDS["format"](prompts, completions) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_chat_style_completions_are_read():
    completions = [[{"role": "assistant", "content": r"\boxed{7}"}], [{"role": "assistant", "content": "7"}]]
    assert REWARDS["accuracy"](["q", "q"], completions, answer=["7", "7"]) == [1.0, 0.0]


def test_r1_format():
    good = r"<think>3+4=7</think> The answer is \boxed{7}."
    cases = [good, r"\boxed{7}", r"<think></think> \boxed{7}", r"<think>a</think><think>b</think> \boxed{7}",
             r"<think>a \boxed{7}</think>", r"<think>a <think> b</think> \boxed{7}", "  " + good]
    assert REWARDS["format"](["q"] * 7, cases, task_format="r1") == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # task_format also arrives per completion, as the task's 'task_format' column
    assert REWARDS["format"](["q"] * 2, [good, r"\boxed{7}"], task_format=["r1", "boxed"]) == [1.0, 1.0]


def test_overlong_reward_dapo_ramp():
    ids = [[0] * n for n in (5, 6, 7, 8, 10, 11)]
    # L_max=10, buffer 4: free up to 6, then -(L-6)/4 * penalty, -penalty past L_max
    out = REWARDS["length"](["q"] * 6, ["c"] * 6, completion_ids=ids, max_completion_length=10,
                            overlong_buffer=4, overlong_penalty=2.0)
    assert out == pytest.approx([0.0, 0.0, -0.5, -1.0, -2.0, -2.0])
    assert REWARDS["overlong"] is REWARDS["length"]
    assert REWARDS["overlong"](["q"], ["c"], completion_ids=[[0] * 10], max_completion_length=10) == [0.0]
    with pytest.raises(RewardError, match="'length' needs the 'completion_ids'"):
        REWARDS["length"](["q"], ["c"], max_completion_length=10)


def test_missing_answer_column_names_the_reward():
    with pytest.raises(RewardError, match="reward 'accuracy' needs the 'answer' keyword"):
        score_responses([("accuracy", REWARDS["accuracy"], 1.0)], ["q"], [r"\boxed{1}"], {},
                        reward_errors="skip")


# ---------------------------------------------------------------------------------------------
# score_responses: weighted sum, None, errors
# ---------------------------------------------------------------------------------------------

def test_weighted_sum_and_none_semantics():
    def partial(prompts, completions, **kw):  # abstains on all but the second completion
        return [None, 2.0, None, None]

    def never(prompts, completions, **kw):
        return [None] * len(completions)

    prompts, completions, cols = _batch([r"\boxed{46}", r"\boxed{45}", "no", r"\boxed{46}"], ["46"] * 4)
    funcs = [("rule", REWARDS["rule"], 1.0), ("format", REWARDS["format"], 0.5), ("partial", partial, 2.0)]
    out = score_responses(funcs, prompts, completions, cols)
    # rule + 0.5 * format + 2 * partial, None left out: [1.5+0.5, 0.5+0.5+4, 0, 1.5+0.5]
    assert out.total.tolist() == pytest.approx([2.0, 5.0, 0.0, 2.0])
    assert out.total.dtype == torch.float32 and out.num_errors == 0 and out.step_rewards is None
    assert out.per_func["rule"].tolist() == [1.5, 0.5, 0.0, 1.5]
    assert math.isnan(out.per_func["partial"][0]) and out.per_func["partial"][1] == 2.0
    only_none = score_responses([("never", never, 1.0)], prompts, completions, cols)
    assert torch.isnan(only_none.total).all()


def _explodes_on_45(prompts, completions, **kw):
    return [1.0 / 0.0 if "45" in c else 1.0 for c in completions]


def test_raise_names_function_sample_and_cause():
    prompts, completions, cols = _batch([r"\boxed{46}", r"here \boxed{45}", r"\boxed{4}"], ["46"] * 3)
    with pytest.raises(RewardError) as info:
        score_responses([("boom", _explodes_on_45, 1.0)], prompts, completions, cols)
    msg = str(info.value)
    assert "'boom'" in msg and "completion 1" in msg and "here \\\\boxed{45}" in msg
    assert "ZeroDivisionError" in msg and "division by zero" in msg and "\n" not in msg


def test_skip_excludes_and_counts():
    prompts, completions, cols = _batch([r"\boxed{46}", r"\boxed{45}", r"\boxed{4}",
                                         r"\boxed{45}"], ["46"] * 4)
    out = score_responses([("rule", REWARDS["rule"], 1.0), ("boom", _explodes_on_45, 1.0)],
                          prompts, completions, cols, reward_errors="skip")
    assert out.num_errors == 2
    assert out.total[0] == 2.5 and out.total[2] == 1.5
    assert torch.isnan(out.total[[1, 3]]).all()  # excluded from the group statistics
    assert out.per_func["rule"][1] == 0.5 and torch.isnan(out.per_func["boom"][1])


def test_batch_only_failure_is_reported():
    def needs_one(prompts, completions, **kw):
        if len(completions) > 1:
            raise RuntimeError("batch too big")
        return [1.0]

    prompts, completions, cols = _batch(["a", "b"], ["1", "1"])
    with pytest.raises(RewardError, match="'needs_one' failed on the batch of 2.*batch too big"):
        score_responses([("needs_one", needs_one, 1.0)], prompts, completions, cols)
    out = score_responses([("needs_one", needs_one, 1.0)], prompts, completions, cols, reward_errors="skip")
    assert out.total.tolist() == [1.0, 1.0] and out.num_errors == 0


def test_per_sample_retry_slices_columns():
    seen = []

    def picky(prompts, completions, answer, completion_ids, max_completion_length, **kw):
        seen.append((list(answer), completion_ids, max_completion_length))
        if len(completions) > 1:
            raise ValueError("retry me")
        return [float(len(completion_ids[0]))]

    prompts, completions, cols = _batch(["a", "b"], ["1", "2"])
    out = score_responses([("picky", picky, 1.0)], prompts, completions, cols, reward_errors="skip",
                          completion_ids=[[1], [1, 2]], max_completion_length=8)
    assert out.total.tolist() == [1.0, 2.0]
    assert seen[1:] == [(["1"], [[1]], 8), (["2"], [[1, 2]], 8)]


@pytest.mark.parametrize("bad,pattern", [
    (lambda prompts, completions, **k: [float("nan")] * len(completions),
     "'bad' returned nan for completion 0"),
    (lambda prompts, completions, **k: [1.0, float("inf")], "'bad' returned inf for completion 1"),
    (lambda prompts, completions, **k: [1.0], "'bad' returned 1 scores for 2 completions"),
    (lambda prompts, completions, **k: 1.0, "'bad' returned float"),
    (lambda prompts, completions, **k: ["1.0", "2.0"], "'bad' returned str for completion 0"),
])
def test_bad_outputs_name_the_function(bad, pattern):
    prompts, completions, cols = _batch(["a", "b"], ["1", "1"])
    for mode in ("raise", "skip"):
        with pytest.raises(RewardError, match=pattern):
            score_responses([("bad", bad, 1.0)], prompts, completions, cols, reward_errors=mode)


def test_columns_must_align_with_completions():
    with pytest.raises(RewardError, match="column 'answer' has 1 values for 2 completions"):
        score_responses([("rule", REWARDS["rule"], 1.0)], ["q", "q"], ["a", "b"], {"answer": ["1"]})


# ---------------------------------------------------------------------------------------------
# loading reward functions
# ---------------------------------------------------------------------------------------------

def test_user_reward_by_import_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    fn = get_reward_function("example_user_rewards:short_answer_bonus")
    out = score_responses([("example_user_rewards:short_answer_bonus", fn, 2.0)], ["q", "q"],
                          [r"\boxed{7}", "a long-winded reply that ends with 7"], {"answer": ["7", "7"]})
    assert out.total.tolist() == [2.0, 0.0]
    assert get_reward_function("example_user_rewards:Scorers.abstain")(["q"], ["c"]) == [None]
    from_file = get_reward_function(f"{TESTS / 'example_user_rewards.py'}:short_answer_bonus")
    assert from_file(["q"], ["7"], answer=["7"]) == [1.0]


@pytest.mark.parametrize("name,pattern", [
    ("acuracy", "unknown reward 'acuracy' \\(did you mean 'accuracy'\\?\\)"),
    ("no_such_module_xyz:f", "reward 'no_such_module_xyz:f': cannot import 'no_such_module_xyz'"),
    ("example_user_rewards:missing", "has no attribute 'missing'"),
    ("example_user_rewards:NOT_A_FUNCTION", "is a int, not a function"),
    ("/nonexistent/rewards.py:f", "cannot import '/nonexistent/rewards.py'"),
])
def test_reward_lookup_errors(monkeypatch, name, pattern):
    monkeypatch.syspath_prepend(str(TESTS))
    with pytest.raises(RewardError, match=pattern) as info:
        get_reward_function(name)
    assert "\n" not in str(info.value)


def test_builtins_resolve_and_config_keywords():
    for name in ("accuracy", "format", "rule", "length", "overlong", "steps"):
        assert get_reward_function(name) is REWARDS[name]
    cfg = GRPOConfig()
    kw = reward_kwargs(cfg)
    assert kw["max_completion_length"] == cfg.rollout.max_completion_length
    assert kw["task_format"] == "boxed" and kw["step_wrong_reward"] == -1.0


# ---------------------------------------------------------------------------------------------
# process supervision: the arithmetic step verifier
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,verdicts", [
    ("12+34=46, 46-5=41. \\boxed{41}", [True, True]),
    ("12+34=46-5=41", [True, True]),  # run-on chain
    ("3*4 = 6+6 = 12", [True, True]),  # proper chain
    ("12 + 34 = 47.", [False]),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.", [True]),
    ("<<3*4=12>>13 eggs", [False]),  # the visible result disagrees
    ("10/3 = 3.33, 2/3 = 0.66, 2/3 = 0.5", [True, True, False]),
    ("5-12=-7, -7+3=-4", [True, True]),
    ("0.2 x 50 = 10, 20% * 50 = 10, $\\frac{3}{4} \\times 8 = 6$, 2^{10} = 1024", [True] * 4),
    ("1,000+2,000=3,000", [True]),
    ("(3+4)*2 = 14", [True]),
    ("2x + 3 = 7, so x - 2 - 3 = 8 and \\sqrt{16} = 4 and 2+3 = 5x", []),  # variables: not judged
    ("9^9^9^9 = 1, 5/0 = 3", []),  # too big / undefined: not judged, and no hang
    ("He had 5 apples = 5 apples", []),  # a restatement computes nothing
])
def test_check_steps(text, verdicts):
    assert [s.correct for s in check_steps(text)] == verdicts


def _char_tokenizer(text: str) -> Tokenizer:
    vocab = {c: i for i, c in enumerate(["[UNK]", "<eos>"] + sorted(set(text)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<eos>"])
    return tok


def _bpe_tokenizer(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["[UNK]", "<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 20, trainer)
    return tok


REASONING = ("She buys 3 packs of 12 eggs: 3*12 = 36 eggs.\n"
             "She uses 8, so 36 - 8 = 27 are left.\n"  # the wrong step
             "Half of them: 28/2 = <<28/2=14>>14. \\boxed{14}")


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_steps_reward_lands_on_result_tokens(kind):
    tok = _char_tokenizer(REASONING) if kind == "char" else _bpe_tokenizer([REASONING, "café 日本 = 3"])
    encoding = tok.encode(REASONING)
    ids = encoding.ids + [tok.token_to_id("<eos>")]
    assert tok.decode(ids) == REASONING
    ends = token_char_ends(tok, ids)
    assert ends[-1] == len(REASONING) and ends == sorted(ends)
    out = score_responses([("steps", REWARDS["steps"], 0.5)], ["q"], [REASONING], {"answer": ["14"]},
                          completion_ids=[ids], completion_char_ends=[ends])
    assert out.total.tolist() == [0.0]  # no outcome reward configured: the signal is the steps
    steps = out.step_rewards[0]
    assert [r for _, r in steps] == [0.5, -0.5, 0.5]  # +1, -1, +1 with weight 0.5
    assert out.per_func["steps"].tolist() == [1.0]  # raw sum
    # Independent oracle: the tokenizer's own offsets. Each step must end on the token that holds
    # the last character of its written result (36, the wrong 27, and the visible 14 after >>).
    last_chars = [REASONING.index("36 eggs") + 1, REASONING.index("27 are") + 1, REASONING.index("14. ") + 1]
    expected = [next(t for t, (a, b) in enumerate(encoding.offsets) if a <= c < b) for c in last_chars]
    assert [t for t, _ in steps] == expected
    if kind == "char":  # one token per character: the index is the character's
        assert expected == last_chars
    else:
        assert len(ids) < len(REASONING)  # multi-character tokens: a real mapping was needed


def test_steps_reward_config_values_and_needs_offsets():
    out = REWARDS["steps"](["q"], ["1+1=3, 1+1=2"], completion_char_ends=[list(range(1, 13))],
                           step_correct_reward=0.25, step_wrong_reward=-2.0)
    assert out == [[(4, -2.0), (11, 0.25)]]
    with pytest.raises(RewardError, match="'steps' needs the 'completion_char_ends'"):
        REWARDS["steps"](["q"], ["1+1=2"])


def test_process_reward_output_is_checked():
    def bad_index(prompts, completions, **kw):
        return [[(5, 1.0)]]

    bad_index.process = True
    with pytest.raises(RewardError, match="token index 5 for completion 0 of 3 tokens"):
        score_responses([("bad_index", bad_index, 1.0)], ["q"], ["abc"], {}, completion_ids=[[1, 2, 3]])


def test_token_char_ends_with_transformers_and_special_tokens():
    from transformers import PreTrainedTokenizerFast

    text = "Café: 12+34=46 日本"
    hf = PreTrainedTokenizerFast(tokenizer_object=_bpe_tokenizer([text]), eos_token="<eos>")
    ids = hf.encode(text) + [hf.eos_token_id]
    ends = token_char_ends(hf, ids)
    assert len(ends) == len(ids) and ends[-1] == ends[-2] == len(text)  # eos covers nothing
    for t in range(len(ids)):  # every prefix of tokens decodes to (a prefix of) the text up to its end
        prefix = hf.decode(ids[:t + 1], skip_special_tokens=True)
        assert text.startswith(prefix.rstrip("\ufffd")) and ends[t] <= len(prefix)
