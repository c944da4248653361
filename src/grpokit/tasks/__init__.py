"""Tasks: prompts and reference answers for training and evaluation.

    examples = load_examples(cfg.task, cfg.task.train_split)   # list[Example]
    text = prompt_text(examples[0], tokenizer)                  # what the policy is prompted with

Built-in tasks (`task.name`): ``arithmetic`` (generated offline from `task.seed`), ``gsm8k``,
``math500``, ``jsonl`` (any file with `task.prompt_column` and `task.answer_column`) and ``hf``
(TRL-format data read with `datasets`, taken as it is: `grpokit.tasks.hf`), and ``environment`` (no
data: `task.num_train` / `task.num_eval` empty prompts that `rollout.environment`'s reset() fills, as
TRL's trainer does without a dataset); the code tasks ``functions`` (built-in, generated), ``humaneval``,
``mbpp`` and ``code`` (`grpokit.tasks.code`: graded by running the program in a sandbox). The modules:
`base` (the `Example` record and the task errors), `arithmetic` (the generator), `files` (GSM8K, MATH-500
and jsonl readers), `code` and `functions`, and `hf`.

Prompting is the same for every task. The question is followed by an instruction when
`task.format` is ``r1`` (think inside ``<think> </think>``, then box the answer) or when
`task.instruction` is on (box the answer); `task.few_shot` solved training problems come first
(the same ones for every prompt, never the question itself); with `task.chat_template` the prompt
is a list of chat messages (system, then a user/assistant pair per demonstration, then the
question) rendered later by the tokenizer's chat template.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from grpokit.config.schema import TaskConfig
from grpokit.tasks.arithmetic import arithmetic_problems, calculator_trace
from grpokit.tasks.base import Example, Problem, TaskError
from grpokit.tasks.code import code_problems, humaneval_problems, mbpp_problems
from grpokit.tasks.files import LOADERS
from grpokit.tasks.functions import function_problems
from grpokit.tasks.hf import hf_examples

BOXED_INSTRUCTION = "Put the final answer in \\boxed{}."
R1_INSTRUCTION = "Think step by step inside <think> </think> tags, then put the final answer in \\boxed{}."
_HELD_OUT_NAMES = ("test", "eval", "validation", "valid", "dev")
# Data fields with these names would collide with a reward function's positional arguments.
_RESERVED_COLUMNS = ("prompts", "completions")

__all__ = ["Example", "TaskError", "load_examples", "prompt_text", "BOXED_INSTRUCTION", "R1_INSTRUCTION"]


def _arithmetic(task: TaskConfig, split: str) -> tuple[Problem, ...]:
    train, held_out = arithmetic_problems(task.digits, task.terms, task.operators, task.num_train,
                                          task.num_eval, task.seed)
    return tuple(_held_out(task, split, train, held_out))


def _held_out(task: TaskConfig, split: str, train: Sequence[Problem], held_out: Sequence[Problem],
              ) -> Sequence[Problem]:
    """A generated task's split by name: train, or held out (task.eval_split or a held-out name)."""
    if split == task.train_split or (split == "train" and split != task.eval_split):
        return train
    if split == task.eval_split or split in _HELD_OUT_NAMES:
        return held_out
    raise TaskError(f"task {task.name} has the splits '{task.train_split}' (task.train_split) and "
                    f"'{task.eval_split}' (task.eval_split), got '{split}'")


def _problems(task: TaskConfig, split: str) -> Sequence[Problem]:
    if task.name == "arithmetic":
        return _arithmetic(task, split)
    if task.name == "functions":
        return _held_out(task, split, *function_problems(task.num_train, task.num_eval, task.seed,
                                                              wide=task.functions_wide))
    if task.name == "humaneval":
        return humaneval_problems(split)
    if task.name in ("mbpp", "code"):
        return (mbpp_problems if task.name == "mbpp" else code_problems)(task, split)
    if task.name not in LOADERS:
        raise TaskError(f"unknown task '{task.name}': use arithmetic, functions, humaneval, mbpp, code, "
                    f"{', '.join(LOADERS)}")
    return LOADERS[task.name](task, split)


def _instruction(task: TaskConfig) -> str | None:
    if task.format == "r1":
        return R1_INSTRUCTION
    return BOXED_INSTRUCTION if task.instruction else None


def _solution(problem: Problem, task: TaskConfig) -> str:
    """A demonstration's answer in the format the policy is asked for (task.few_shot_traces=calculator:
    solved with the calculator tool, `<tool_call>multiply(a,b)</tool_call><tool_response>c</tool_response>`
    then task.trace_answer_prefix and `\\boxed{c}`)."""
    if task.few_shot_traces == "calculator":
        return calculator_trace(str(problem.question), task.trace_answer_prefix)
    fmt = task.format
    box = f"\\boxed{{{problem.answer}}}"
    if fmt == "r1":
        return f"<think>{problem.reasoning or 'The answer follows.'}</think> {box}"
    if "\\boxed" in problem.reasoning:  # MATH solutions already box their answer
        return problem.reasoning
    return f"{problem.reasoning} {box}".strip()


def _demos(task: TaskConfig, pool: Sequence[Problem], question: Any) -> list[Problem]:
    """task.few_shot demonstrations: a seeded choice from the training problems, minus the question."""
    rng = random.Random(task.seed)
    candidates = rng.sample(range(len(pool)), min(len(pool), task.few_shot + 1))
    demos = [pool[i] for i in candidates if pool[i].question != question][:task.few_shot]
    if len(demos) < task.few_shot:
        raise TaskError(f"task.few_shot={task.few_shot} needs more training problems than the "
                        f"{len(pool)} in split '{task.train_split}': lower task.few_shot")
    return demos


def _prompt(task: TaskConfig, problem: Problem, demos: list[Problem]) -> str | list[dict]:
    instruction = _instruction(task)
    if isinstance(problem.question, list):  # chat messages from the data: used as they are
        if demos:
            raise TaskError("task.few_shot needs text prompts, but the prompt column holds chat messages: "
                            "set task.few_shot=0")
        return problem.question if task.chat_template else _flatten(problem.question)
    question = f"{problem.question} {instruction}" if instruction else problem.question
    if task.chat_template:
        messages = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
        for demo in demos:
            messages += [{"role": "user", "content": str(demo.question)},
                         {"role": "assistant", "content": _solution(demo, task)}]
        return messages + [{"role": "user", "content": question}]
    parts = [task.system_prompt] if task.system_prompt else []
    parts += [f"{demo.question}\n{_solution(demo, task)}" for demo in demos]
    return "\n\n".join(parts + [question])


def _flatten(messages: list[dict]) -> str:
    """Chat messages as plain text for a run without a chat template."""
    return "\n\n".join(str(m["content"]) for m in messages)


def load_examples(task: TaskConfig, split: str) -> list[Example]:
    """The prompts and reference answers of one split.

    Args:
        task: the task section of the config.
        split: a split name, normally ``task.train_split`` or ``task.eval_split`` (files:
            ``{split}.jsonl`` under task.path; arithmetic: the training or the held-out problems).

    Returns:
        One `Example` per problem, in file (or generation) order. Its columns hold the data's
        extra fields, ``answer`` and ``task_format`` (read by the 'format' reward).

    Raises:
        TaskError: missing data, a malformed row (naming file and line), or an empty split.
    """
    if task.name == "hf":  # TRL-format rows: prompts and columns as they are (no instruction, no few-shot)
        return hf_examples(task, split)
    if task.name == "environment":
        return environment_examples(task, split)
    problems = _problems(task, split)
    if not problems:
        raise TaskError(f"task {task.name}: split '{split}' has no examples: "
                        "check task.path / the split name")
    pool = _problems(task, task.train_split) if task.few_shot else []
    if task.few_shot and not pool:
        raise TaskError(f"task.few_shot={task.few_shot} needs training problems, "
                        f"but '{task.train_split}' is empty")
    out = []
    for problem in problems:
        demos = _demos(task, pool, problem.question) if task.few_shot else []
        extra = {k: v for k, v in problem.columns.items() if k not in _RESERVED_COLUMNS}
        columns = {**extra, "answer": problem.answer, "task_format": task.format}
        out.append(Example(_prompt(task, problem, demos), problem.answer, columns))
    return out


def prompt_text(example: Example, tokenizer: Any) -> str:
    """The prompt as the policy sees it: text as is; chat messages through the chat template.

    Raises:
        TaskError: the tokenizer has no chat template.
    """
    if isinstance(example.prompt, str):
        return example.prompt
    try:
        return tokenizer.apply_chat_template(example.prompt, add_generation_prompt=True, tokenize=False)
    except (ValueError, AttributeError, TypeError) as e:
        msg = " ".join(str(e).split())[:160]
        raise TaskError(f"cannot apply a chat template with this tokenizer ({msg}): "
                        f"set task.chat_template=false or use a tokenizer that has one") from None


def environment_examples(task: TaskConfig, split: str) -> list[Example]:
    """task.name=environment: empty prompts (the system prompt, if any) for the environment's reset() to fill;
    num_train of them for training, num_eval held out. Each row has an `episode` number (held-out ones
    after the training ones), which reset() receives: an environment may play episode k the same way
    every time (then the G rollouts of a group play the same episode, and every evaluation the same ones)."""
    held_out = split == task.eval_split or split in _HELD_OUT_NAMES
    first, n = (task.num_train, task.num_eval) if held_out else (0, task.num_train)
    if task.chat_template:
        system = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
        return [Example(system + [{"role": "user", "content": ""}], "", {"episode": first + i})
                for i in range(n)]
    return [Example(task.system_prompt or "", "", {"episode": first + i}) for i in range(n)]
