"""Tasks: the arithmetic generator, GSM8K / MATH-500 / jsonl loading, prompting, bad data."""

import json
import logging
import re
import sys
import types
from pathlib import Path

import pytest

from grpokit.config.schema import TaskConfig
from grpokit.rewards.scoring import REWARDS
from grpokit.rewards.steps import check_steps
from grpokit.tasks import BOXED_INSTRUCTION, R1_INSTRUCTION, Example, TaskError, load_examples, prompt_text

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_gsm8k = pytest.mark.skipif(not (DATA / "gsm8k" / "train.jsonl").is_file(), reason="GSM8K data absent")
needs_math500 = pytest.mark.skipif(not (DATA / "math500" / "test.jsonl").is_file(),
                                   reason="MATH-500 data absent")


def _accuracy(examples: list[Example], completions: list[str]) -> list[float]:
    return REWARDS["accuracy"](["q"] * len(examples), completions, answer=[e.answer for e in examples])


# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------

def _small(**kw) -> TaskConfig:
    return TaskConfig(**{"num_train": 300, "num_eval": 50, **kw})


def test_arithmetic_two_terms_prompt_and_solution():
    train = load_examples(_small(), "train")
    assert len(train) == 300
    for ex in train:
        m = re.fullmatch(r"What is (\d{2})([+-])(\d{2})\?", ex.prompt)
        assert m, ex.prompt
        a, op, b = int(m[1]), m[2], int(m[3])
        value = a + b if op == "+" else a - b
        assert ex.answer == ex.columns["answer"] == str(value)
        assert ex.columns["solution"] == f"{a}{op}{b}={value}. \\boxed{{{value}}}"
    assert any(int(ex.answer) < 0 for ex in train)  # negative results are allowed


def test_arithmetic_three_terms_left_to_right():
    for ex in load_examples(_small(terms=3, digits=2), "test"):
        m = re.fullmatch(r"What is (\d+)([+-])(\d+)([+-])(\d+)\?", ex.prompt)
        a, op1, b, op2, c = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
        ab = a + b if op1 == "+" else a - b
        abc = ab + c if op2 == "+" else ab - c
        assert ex.columns["solution"] == f"{a}{op1}{b}={ab}, {ab}{op2}{c}={abc}. \\boxed{{{abc}}}"


def test_arithmetic_with_products_respects_precedence():
    examples = load_examples(_small(terms=3, operators="+-*"), "train")
    assert any("*" in ex.prompt for ex in examples)
    for ex in examples:
        expr = ex.prompt[len("What is "):-1]
        assert re.fullmatch(r"[\d+*-]+", expr)
        assert int(ex.answer) == eval(expr)  # test-only oracle on a digits-and-operators string
        steps = check_steps(ex.columns["solution"])  # every worked step passes the step verifier
        assert len(steps) == 2 and all(s.correct for s in steps)


def test_arithmetic_splits_disjoint_and_seeded():
    cfg = _small()
    train, held_out = load_examples(cfg, "train"), load_examples(cfg, "test")
    assert len(held_out) == 50
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}
    assert len({e.prompt for e in train}) == len(train)
    assert load_examples(cfg, "train") == train  # same seed, same problems
    assert load_examples(_small(seed=7), "train") != train
    assert load_examples(_small(num_train=100), "test") == held_out  # held-out set ignores num_train


def test_arithmetic_instruction_and_r1():
    ex = load_examples(_small(instruction=True), "train")[0]
    assert re.fullmatch(r"What is \d+[+-]\d+\? Put the final answer in \\boxed\{\}\.", ex.prompt)
    assert ex.prompt.endswith(" " + BOXED_INSTRUCTION)
    assert load_examples(_small(format="r1"), "train")[0].prompt.endswith(" " + R1_INSTRUCTION)
    assert load_examples(_small(format="r1"), "train")[0].columns["task_format"] == "r1"


def test_arithmetic_space_limits(caplog):
    # digits=1 draws operands 0..9: 10 * 10 problems of the form a+b
    with pytest.raises(TaskError, match="only 100 distinct problems"):
        load_examples(TaskConfig(digits=1, terms=2, operators="+", num_train=5, num_eval=100), "train")
    with caplog.at_level(logging.WARNING):
        train = load_examples(TaskConfig(digits=1, terms=2, operators="+", num_train=500,
                                         num_eval=20), "train")
    assert len(train) == 80 and "only 80 distinct problems" in caplog.text
    with pytest.raises(TaskError, match="got 'validation_x'"):
        load_examples(_small(), "validation_x")


def test_few_shot_is_deterministic_and_never_the_question():
    cfg = _small(few_shot=2, instruction=True)
    examples = load_examples(cfg, "train")
    shots = [ex.prompt.split("\n\n")[:-1] for ex in examples]
    assert all(len(s) == 2 for s in shots)
    for ex, demo in zip(examples, shots):
        question = ex.prompt.split("\n\n")[-1]
        assert question.endswith(BOXED_INSTRUCTION)
        assert all(not question.startswith(d.split("\n")[0]) for d in demo)
        assert all(re.fullmatch(r"What is .+\?\n.+\. \\boxed\{-?\d+\}", d) for d in demo)
    assert load_examples(cfg, "train") == examples
    with pytest.raises(TaskError, match="few_shot=400 needs more"):
        load_examples(_small(few_shot=400), "test")


def test_few_shot_traces_solve_the_examples_with_the_calculator():
    cfg = _small(operators="*", few_shot=2, few_shot_traces="calculator", chat_template=True)
    ex = load_examples(cfg, "test")[0]
    assert [m["role"] for m in ex.prompt] == ["user", "assistant", "user", "assistant", "user"]
    for question, answer in (ex.prompt[0:2], ex.prompt[2:4]):
        a, b = map(int, re.fullmatch(r"What is (\d+)\*(\d+)\?", question["content"]).groups())
        assert answer["content"] == (f"<tool_call>multiply({a},{b})</tool_call>"
                                     f"<tool_response>{a * b}</tool_response>\\boxed{{{a * b}}}")
    shots = load_examples(_small(operators="*", few_shot=2), "test")[0].prompt.split("\n\n")
    # the same examples and question as without traces (those solved in the head)
    assert [m["content"] for m in ex.prompt[::2]] == [d.split("\n")[0] for d in shots[:-1]] + [shots[-1]]


def test_chat_messages_and_prompt_text():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    cfg = _small(chat_template=True, system_prompt="You add numbers.", few_shot=1, format="r1")
    ex = load_examples(cfg, "test")[0]
    assert [m["role"] for m in ex.prompt] == ["system", "user", "assistant", "user"]
    assert ex.prompt[2]["content"].startswith("<think>") and "</think> \\boxed{" in ex.prompt[2]["content"]
    assert ex.prompt[3]["content"].endswith(R1_INSTRUCTION)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0},
                                                                              unk_token="[UNK]")))
    with pytest.raises(TaskError, match="set task.chat_template=false"):
        prompt_text(ex, tok)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = prompt_text(ex, tok)
    assert text.startswith("<system>You add numbers.\n<user>What is") and text.endswith("<assistant>")
    plain = load_examples(_small(), "test")[0]
    assert prompt_text(plain, tok) == plain.prompt


# ---------------------------------------------------------------------------------------------
# GSM8K and MATH-500 (the real data, when present beside the repo)
# ---------------------------------------------------------------------------------------------

@needs_gsm8k
def test_gsm8k_full_data_answers_check():
    cfg = TaskConfig(name="gsm8k", path=str(DATA / "gsm8k"))
    for split, rows in (("train", 7473), ("test", 1319)):
        examples = load_examples(cfg, split)
        assert len(examples) == rows
        assert all("," not in e.answer and e.columns["answer"] == e.answer for e in examples)
        boxed = [f"The total is \\boxed{{{e.answer}}}." for e in examples]
        off_by_one = [f"\\boxed{{{int(e.answer) + 1}}}" for e in examples]
        assert _accuracy(examples, boxed) == [1.0] * rows
        assert _accuracy(examples, off_by_one) == [0.0] * rows
    first = load_examples(cfg, "train")[0]
    assert first.answer == "72" and first.prompt.startswith("Natalia sold clips")
    assert "<<" not in first.columns["solution"] and first.columns["solution"].endswith("\\boxed{72}")


@needs_gsm8k
def test_gsm8k_file_path_and_default_location(monkeypatch):
    one_file = TaskConfig(name="gsm8k", path=str(DATA / "gsm8k" / "train.jsonl"))
    assert len(load_examples(one_file, "test")) == 1319  # test.jsonl beside the given train.jsonl
    monkeypatch.chdir(REPO)  # task.path unset: ../shared/data/gsm8k relative to the working directory
    assert len(load_examples(TaskConfig(name="gsm8k"), "test")) == 1319


@needs_math500
def test_math500_full_data_answers_check():
    cfg = TaskConfig(name="math500", path=str(DATA / "math500"))
    examples = load_examples(cfg, "test")
    assert len(examples) == 500
    assert _accuracy(examples, [f"So \\boxed{{{e.answer}}}" for e in examples]) == [1.0] * 500
    numeric = [e for e in examples if re.fullmatch(r"-?\d+", e.answer)][:100]
    assert _accuracy(numeric, [f"\\boxed{{{int(e.answer) + 1}}}" for e in numeric]) == [0.0] * len(numeric)
    assert {"solution", "subject", "level"} <= set(examples[0].columns)
    with pytest.raises(TaskError, match="no 'train' split .*found: test.*MATH-500 is a test set"):
        load_examples(cfg, "train")


def test_no_data_anywhere_says_set_task_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if `datasets` were not installed
    with pytest.raises(TaskError, match="not installed: set task.path"):
        load_examples(TaskConfig(name="gsm8k"), "train")


def test_hub_fallback_through_datasets(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        if split == "test":
            raise ConnectionError("offline\nsecond line")
        return [{"question": "2+2?", "answer": "2+2=4\n#### 4"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    examples = load_examples(TaskConfig(name="gsm8k"), "train")
    assert ([(e.prompt, e.answer) for e in examples] == [("2+2?", "4")]
            and calls == [("openai/gsm8k", "main", "train")])
    with pytest.raises(TaskError, match="could not load openai/gsm8k split 'test'.*offline second line"):
        load_examples(TaskConfig(name="gsm8k"), "test")


# ---------------------------------------------------------------------------------------------
# jsonl and bad data
# ---------------------------------------------------------------------------------------------

def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_jsonl_task_columns(tmp_path):
    _write(tmp_path / "train.jsonl", [{"q": "Capital of France?", "a": "Paris", "source": "geo"},
                                      {"q": "6*7?", "a": 42, "source": "arith"}])
    cfg = TaskConfig(name="jsonl", path=str(tmp_path), prompt_column="q", answer_column="a", instruction=True)
    examples = load_examples(cfg, "train")
    assert examples[0].prompt == "Capital of France? " + BOXED_INSTRUCTION
    assert examples[1].answer == "42" and examples[1].columns["source"] == "arith"
    assert examples[1].columns["answer"] == "42" and "q" not in examples[1].columns


def test_jsonl_chat_prompts(tmp_path):
    messages = [{"role": "user", "content": "Say 1."}]
    _write(tmp_path / "d.jsonl", [{"prompt": messages, "answer": "1"}])
    assert load_examples(TaskConfig(name="jsonl", path=str(tmp_path / "d.jsonl"), chat_template=True),
                         "train")[0].prompt == messages


GOOD = {"question": "a", "answer": "#### 1"}


@pytest.mark.parametrize("task,lines,line,message", [
    ("gsm8k", [GOOD, GOOD, '{"question": "c", '], 3, "not valid JSON"),
    ("gsm8k", [GOOD, {"question": "b"}], 2, "missing field 'answer' (fields: question)"),
    ("gsm8k", [{"question": "a", "answer": "so #### seven"}], 1,
     "final answer 'seven' after '####' is not a number"),
    ("gsm8k", [{"question": "a", "answer": "1,5"}, GOOD], 1, "answer has no '#### <number>' final answer"),
    ("gsm8k", ["[1, 2]"], 1, "expected a JSON object, got list"),
    ("math500", [{"problem": "p", "answer": "1"}, {"problem": "", "answer": "2"}], 2,
     "field 'problem' must be a non-empty"),
    ("jsonl", [{"prompt": "p"}], 1, "missing field 'answer'"),
])
def test_bad_rows_name_file_and_line(tmp_path, task, lines, line, message):
    path = _write(tmp_path / "train.jsonl", lines)
    with pytest.raises(TaskError) as info:
        load_examples(TaskConfig(name=task, path=str(path)), "train")
    text = str(info.value)
    assert text.startswith(f"{path} line {line}: ") and message in text and "\n" not in text


def test_empty_split_and_missing_paths(tmp_path):
    _write(tmp_path / "train.jsonl", ["", "  "])
    with pytest.raises(TaskError, match="train.jsonl' has no examples .*only blank lines"):  # names the file
        load_examples(TaskConfig(name="jsonl", path=str(tmp_path)), "train")
    with pytest.raises(TaskError, match="no 'test' split .*found: train"):
        load_examples(TaskConfig(name="jsonl", path=str(tmp_path)), "test")
    with pytest.raises(TaskError, match="does not exist"):
        load_examples(TaskConfig(name="jsonl", path=str(tmp_path / "nope.jsonl")), "train")
