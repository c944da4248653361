"""The docs' snippets as steps a test can run: every ```bash / ```sh / ```python block of README.md and
docs/*.md, each shell command line of it (continuations joined, comments dropped, `&&` chains split) and
each Python block whole.

What a snippet needs to run in seconds, offline, on one core is declared here, each entry with its reason:

- FIXTURES: the files the prose assumes in the folder a page runs in (a model at `path/to/hf-model`, ...);
- SUBSTITUTIONS: text rewritten before a block runs (a download, a fixed /tmp path, a file that only a
  long experiment makes);
- CONTEXT: names a Python block takes from the prose around it (`model`, `dataset`, ...), defined before
  it runs;
- SIZE (and SIZE_EXTRA): the flags appended to each runnable command (one step, two problems, ...);
- AFTER: a step that needs what a later block of its page makes, and that block;
- PARSE_ONLY: commands whose arguments are parsed and state built, not run (and why);
- SKIPS: the commands that need the network, a GPU, several processes or a server, and why.

A command matching neither a SKIPS nor a runnable kind fails its test ("no rule"): nothing passes unseen.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE_NAME = "tests/docs/doc_snippets.py"
LANGS = ("bash", "sh", "python")
FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")

# The small offline model that stands in for every real one: a tiny random Qwen2 with the char tokenizer and
# a ChatML/tool chat template, saved at this path of the work folder (and linked from the other model paths
# the docs name). `path/to/hf-model` is itself a path the docs use, so most blocks run on it untouched.
STANDIN_MODEL = "path/to/hf-model"
SMOLLM2 = "smollm2-135m-instruct"

# work-folder path -> ("repo:PATH" or a file test_snippets._seed makes, reason): what the prose assumes
FIXTURES: dict[str, tuple[str, str]] = {
    "configs": ("repo:configs", "commands run from the repository root: its configs/"),
    "benchmarks": ("repo:benchmarks", "... its benchmarks/ scripts"),
    "scripts": ("repo:scripts", "... its scripts/"),
    STANDIN_MODEL: ("model", "the placeholder of the prose, made real: the tiny stand-in model"),
    "models/qwen2-0.5b-instruct": ("model", "coming_from_trl.md downloads it first (skipped): the stand-in"),
    "models/qwen2.5-0.5b-instruct": ("model", "agents.md's model: the stand-in"),
    "train.jsonl": ("train.jsonl", "the reader's data, 'prompt' and 'answer' columns"),
    "data.jsonl": ("data.jsonl", "the reader's data, 'question' and 'final' columns"),
    "deepmath.jsonl": ("deepmath.jsonl", "DeepMath's columns (chat prompt, solution), for the download"),
    "deepmath": ("deepmath", "the same rows as `dataset.save_to_disk(\"deepmath\")` writes them"),
    "cfg.yaml": ("cfg.yaml", "the reader's own config: a copy of configs/demo.yaml"),
    "../shared/data/gsm8k": ("gsm8k", "GSM8K's train.jsonl / test.jsonl format, 8 problems"),
    "runs/a": ("run/runs/demo", "observability.md's two runs to overlay: a finished 1-step demo run"),
    "runs/b": ("run/runs/demo", "... the same run again"),
}

# (language, regex, replacement, reason); applied to a block's text before it is split or run
SUBSTITUTIONS: list[tuple[str, str, str, str]] = [
    ("python", r"(?<![.\w])max_steps=200\b",
     "max_steps=1, num_generations=2, per_device_train_batch_size=2, max_completion_length=8",
     "200 steps take minutes: one step of two completions of eight tokens exercises the same program"),
    ("python", r"max_completion_length=512\b",
     "max_completion_length=16, max_steps=1, num_generations=2, per_device_train_batch_size=2",
     "the agents program, shrunk to one step of two completions"),
    ("python", r'load_dataset\("trl-lib/DeepMath-103K", split="train"\)',
     'load_dataset("json", data_files="deepmath.jsonl", split="train")',
     "DeepMath-103K is a download: the same columns (prompt messages, solution) from a local file"),
    ("bash", r"--model smollm2-135m-instruct\b", f"--model {STANDIN_MODEL}",
     "SmolLM2-135M steps take seconds each on one core: the tiny stand-in runs the same flags"),
    ("bash", r"/tmp/arith-demo\b", "arith-demo", "a test writes only inside its own tmp folder"),
    ("bash", r"rollout\.tree\.widths=\[2,4\]", "rollout.tree.widths=[1,2]",
     "the sized run samples G = 2 completions: a tree of two leaves, forking at the same token"),
    ("bash", r"\bsamples_7600x8\.jsonl\b", "samples.jsonl",
     "the 7600x8 sample file is the long experiment's: the page's own `rm collect` output stands in"),
    ("bash", r"\bother\.jsonl\b", "samples.jsonl",
     "'other samples' of the prose: the page's own `rm collect` output stands in"),
    ("bash", r"runs/rm/demo-outcome\b", "runs/rm",
     "scripts/rm_experiments.py's outcome RM (an hour): the RM the page's `rm train` wrote stands in"),
]

_CHAT_ROWS = ("rows = [{'prompt': [{'role': 'user', 'content': f'What is {a}*{b}?'}],\n"
              "         'solution': str(a * b)} for a, b in [(12, 34), (56, 78), (11, 22), (90, 13)]]\n"
              "dataset = __import__('datasets').Dataset.from_list(rows)\n")
_RM_INPUTS = ("prompts = ['What is 1+2?', 'What is 1+2?', 'What is 3+4?', 'What is 3+4?']\n"
              "completions = ['1+2=3. \\\\boxed{3}', '1+2=4. \\\\boxed{4}', '3+4=7. \\\\boxed{7}', '3+4=8. "
              "\\\\boxed{8}']\n"
              "answers, groups = ['3', '3', '7', '7'], ['a', 'a', 'b', 'b']\n"
              "generator = __import__('torch').Generator().manual_seed(0)\n")


@dataclass(frozen=True)
class Context:
    """Names a Python block takes from its page's prose (`marker`: a text only that block holds)."""
    page: str
    marker: str
    prelude: str
    reason: str


# Pages whose snippets run programs in the sandbox: skipped, with the reason, where bubblewrap is missing.
NEEDS_BWRAP = ("docs/sandbox.md", "docs/code.md")

CONTEXT: list[Context] = [
    Context("README.md", "tools=[multiply]",
            "from trl.rewards import accuracy_reward\n"
            f"model = {STANDIN_MODEL!r}\n" + _CHAT_ROWS
            + "def multiply(a: int, b: int) -> int:\n    \"\"\"Multiply.\n\n    Args:\n        a: one.\n"
              "        b: two.\n    \"\"\"\n    return a * b\n",
            "the agents sketch names a model, a reward, a dataset and a tool defined in docs/agents.md"),
    Context("docs/agents.md", "tools=[multiply]",
            "from trl.rewards import accuracy_reward\n" + _CHAT_ROWS,
            "TRL's accuracy_reward and a dataset of products, as the page's prose describes"),
    Context("docs/search.md", "search_evaluate(model",
            "from grpokit.cli.main import demo_config\n"
            "from grpokit.model.loading import load_model_and_tokenizer\n"
            "from grpokit.tasks import load_examples\n"
            "cfg = demo_config({'rollout.max_completion_length': 24, 'run.output_dir': 'runs/search-api'})\n"
            "model, tokenizer = load_model_and_tokenizer(cfg.model, seed=0)\n"
            "examples = load_examples(cfg.task, cfg.task.eval_split)[:2]\n",
            "the demo's model, config and two held-out problems, as the page's measured rows use"),
    Context("docs/reward_models.md", "load_reward_model(",
            "from grpokit.cli.main import demo_config\n"
            "from grpokit.rewards.rm_train import init_reward_model\n"
            "from grpokit.train.loop import train_grpo\n"
            "cfg = demo_config({'run.max_steps': 1, 'run.eval_limit': 2, 'rollout.num_generations': 2,\n"
            "                   'rollout.prompts_per_step': 2, 'run.output_dir': 'runs/rm-api'})\n"
            "model, tokenizer = init_reward_model('builtin:arith-demo', 'outcome', seed=0)\n"
            "process_model, _ = init_reward_model('builtin:arith-demo', 'process', seed=0)\n",
            "a run config (the demo's, one step), an outcome and a process model on the demo's backbone, "
            "and train_grpo"),
    Context("docs/reward_models.md", "init_reward_model(",
            _RM_INPUTS + "from grpokit.rewards.rm_data import label_samples as _label\n"
            "held_out = _label(prompts, completions, answers, groups, kind='outcome',\n"
            "                  step_separator='\\n')\n",
            "the page's prompts / completions / answers / groups, a torch generator and held-out samples"),
]

# Flags appended to each runnable command (argparse and grpokit's overrides both keep the last value)
TRAIN_SIZE = ["run.max_steps=1", "run.eval_limit=2", "rollout.num_generations=2",
              "rollout.prompts_per_step=4", "rollout.max_completion_length=8", "run.eval_steps=0"]
SIZE: dict[str, tuple[list[str], str]] = {
    "train": (TRAIN_SIZE + ["run.overwrite=true"],
              "one step of 4x2 completions of 8 tokens (8: the SmolLM2 recipes' micro-batch divides it), "
              "2 held-out problems; the page's runs share one folder, so a later run in runs/demo "
              "replaces the earlier (as --overwrite)"),
    "eval": (["--limit", "2"], "two held-out problems"),
    "sft": (["--steps", "2", "--stop-at", "2", "--warmup-steps", "1", "--batch-size", "4",
             "--eval-limit", "2"], "two SFT steps of four examples"),
    "plot": ([], "reads a finished run: seconds"),
    "report": ([], "reads a finished run: seconds"),
    "rm collect": (["--num-prompts", "2", "--num-generations", "2"], "two problems, two samples each"),
    "rm train": (["--epochs", "1", "--batch-size", "4"], "one epoch"),
    "rm eval": ([], "scores a few samples: seconds"),
    "sweep": ([], "--dry-run only lists the cells"),
    "benchmarks/trl_time_to_accuracy.py": (TRAIN_SIZE, "TRL's side of the race, one step"),
}

# (regex on the command, flags appended after SIZE's, reason): where a command's own settings need more room
SIZE_EXTRA: list[tuple[str, list[str], str]] = [
    (r"preset=dapo", ["rollout.max_completion_length=72"],
     "DAPO's overlong buffer (64 tokens) needs completions longer than 64"),
    (r"run\.iterations=", ["run.iterations=2", "run.steps_per_iteration=1", "run.max_steps=2"],
     "two iterations of one step (max_steps must equal iterations x steps_per_iteration)"),
]

# (page, regex on a step's text, regex on the producer's, reason): a step that reads what a later block of
# its page writes runs after that block (the page's order otherwise)
AFTER: list[tuple[str, str, str, str]] = [
    ("docs/reward_models.md", r"rm:runs/rm\b|load_reward_model\(", r"rm train .*--out runs/rm\b",
     "the page opens with the use of an RM that its section 2 trains"),
]

# Commands validated without running: their arguments parsed and their state built, as the command would
PARSE_ONLY = {
    "bench": "parsed and its model, reference and optimizer built (bench.parse_args, bench.bench_state), not "
             "timed: each side is a fresh interpreter that measures the matmul peak first (~35 s a line); "
             "tests/cli/test_bench.py runs the comparison end to end",
}

# (regex on the command, reason): commands that do not run here. Checked before SIZE.
SKIPS: list[tuple[str, str]] = [
    (r"&$", "two processes at once"),
    (r"^(sudo )?(apt-get|apt|dnf)\b", "installs a system package"),
    (r"^grpokit sandbox-serve\b", "a server that runs until stopped (tests/sandbox/test_remote.py serves "
                                  "one, docs/sandbox.md's Python block too)"),
    (r"reward\.sandbox_url=", "needs a `grpokit sandbox-serve` on another machine (tests/rewards/"
                              "test_code_rewards.py trains through one on loopback)"),
    (r"^(pip|python -m pip)\b", "installs or removes packages (the network, this environment)"),
    (r"^(python -m venv|\.|source)\s", "creates or activates a virtual environment"),
    (r"^(huggingface-cli|hf)\s+download\b", "downloads a model from the Hub (network)"),
    (r"^ruff\b", "lints the repository: the README test command runs it (.ci/run)"),
    (r"^python -m pytest\b", "runs the test suite this test belongs to (.ci/run runs it)"),
    (r"^tensorboard\b", "a web server that runs until stopped"),
    (r"rollout\.backend=vllm|^grpokit vllm-serve\b", "needs vLLM: its own venv (.ci/run's vllm job)"),
    (r"^torchrun\b", "several processes (tests/train/test_distributed.py runs torchrun on CPU)"),
    (r"^python scripts/experiments\.py\b", "a whole experiment (hours of sweeps) or its figures redrawn "
                                            "into docs/: `grpokit sweep --dry-run` below runs"),
    (r"^grpokit sweep (?!.*--dry-run)", "runs a grid of full training runs (hours); --dry-run runs"),
    (r"^python benchmarks/agents_demo\.py run\b", "trains a demonstration for 10-60 minutes (its raw rows "
                                                  "are the page's generated tables)"),
    (r"grpokit train configs/agents_calculator_smollm2\.yaml", "needs the SmolLM2 warm start that the "
                                                               "config's sft command builds, then an hour"),
    (r"^python benchmarks/async_vs_sync\.py\b", "6-9 training runs side by side (20+ minutes); its raw rows "
                                                "are the page's generated tables"),
    (r"^python benchmarks/search_demo\.py\b", "run: trains two reward models and evaluates every "
                                              "method (~30 min); table / plot: its raw rows, redrawn"),
    (r"^grpokit eval .*--search .*--(rm|prm) runs/", "needs a reward model trained by `grpokit rm train` "
                                                    "first (minutes); the `--prm steps` lines run"),
    (r"^grpokit rm (collect|train) .*runs/gsm8k_search/", "SmolLM2-135M on GSM8K: 20-35 minutes a command on "
                                                          "one core; its raw rows are search.md's table"),
]
SMOLLM2_REASON = (f"SmolLM2-135M steps take seconds each on one core: model.name_or_path={STANDIN_MODEL} "
                  "appended")


@dataclass(frozen=True)
class Block:
    page: str      # path relative to the repository root
    line: int      # line number (1-based) of the block's first line
    lang: str
    text: str      # dedented


@dataclass
class Step:
    """One thing to run: a shell command (kind 'grpokit' / 'script') or a Python block; or a skip."""
    page: str
    line: int
    kind: str                       # grpokit | script | python | skip | unknown
    command: str                    # as written (a command) or the block's text (python)
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    code: str = ""                  # python: one prelude line, then the block (compiled at line - 1)
    reason: str = ""                # why skipped, or the size override applied
    part: str = ""                  # "2/3": the second of three commands chained on one line
    writes: str = ""                # python: a block that opens with `# name.py` is that file, written first

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}" + (f" ({self.part})" if self.part else "")


def find_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a markdown text in LANGS, plus unlabeled ones (lang '')."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if m.group(2) in LANGS or m.group(2) == "":
            out.append(Block(page, i + 2, m.group(2), textwrap.dedent("\n".join(lines[i + 1:j]))))
        i = j + 1
    return out


def doc_blocks(root: Path = ROOT) -> list[Block]:
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [b for p in pages for b in find_blocks(p.read_text(encoding="utf-8"), str(p.relative_to(root)))]


def substitute(text: str, lang: str) -> str:
    for where, pattern, new, _ in SUBSTITUTIONS:
        if where == ("python" if lang == "python" else "bash"):
            text = re.sub(pattern, new, text)
    return text


def command_lines(text: str, first_line: int) -> list[tuple[int, str]]:
    """(markdown line, command) for each command of a shell block: continuations joined, comments dropped,
    `a && b` split into two commands at the same line."""
    out, pending, start = [], "", 0
    for k, raw in enumerate(text.split("\n")):
        if not pending:
            start = first_line + k
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line, pending = pending + raw, ""
        tokens = shlex.split(line, comments=True)
        at_once = " &" if "&" in tokens else ""   # `a & b`: both run at the same time
        chunk: list[str] = []
        for token in tokens + ["&&"]:
            if token in ("&&", ";", "&"):
                if chunk:
                    out.append((start, shlex.join(chunk) + at_once))
                chunk = []
            else:
                chunk.append(token)
    return out


def plan_command(page: str, line: int, command: str) -> Step:
    """The step of one shell command: skipped (with its reason) or runnable with its size flags."""
    step = Step(page, line, "unknown", command)
    argv = shlex.split(command.rstrip(" &"))
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):          # VAR=value prefixes
        key, value = argv.pop(0).split("=", 1)
        step.env[key] = value
    if argv[:2] == ["taskset", "-c"]:   # pins a core; CI machines may lack core N, so it runs unpinned
        argv = argv[3:]
    for pattern, reason in SKIPS:
        if re.search(pattern, shlex.join(argv) + (" &" if command.endswith("&") else "")):
            step.kind, step.reason = "skip", reason
            return step
    if argv[:1] == ["grpokit"] and len(argv) > 1:
        name = " ".join(argv[1:3]) if argv[1] == "rm" else argv[1]
        step.kind, step.argv = "grpokit", argv[1:]
    elif argv[:1] == ["python"] and len(argv) > 1 and argv[1].endswith(".py"):
        name = argv[1]
        step.kind, step.argv = "script", argv[1:]
    else:
        step.reason = f"no rule for this command: add it to SIZE (runnable) or SKIPS in {HERE_NAME}"
        return step
    if name in PARSE_ONLY:
        step.kind, step.reason = "parse", PARSE_ONLY[name]
        return step
    if name not in SIZE:
        step.kind, step.reason = "unknown", f"no size rule for '{name}': add it to SIZE in {HERE_NAME}"
        return step
    flags, step.reason = SIZE[name]
    flags = [f for f in flags if not _smaller_already(step.argv, f)]
    flags += [f for pattern, extra, why in SIZE_EXTRA if re.search(pattern, command) for f in extra]
    step.reason += "".join(f"; {why}" for pattern, _, why in SIZE_EXTRA if re.search(pattern, command))
    config = next((a for a in argv[2:] if a.endswith((".yaml", ".yml"))), None)
    if (step.kind == "script" or name in ("train", "eval")) and (
            SMOLLM2 in command or (config and (ROOT / config).is_file()
                                   and SMOLLM2 in (ROOT / config).read_text(encoding="utf-8"))):
        flags.append(f"model.name_or_path={STANDIN_MODEL}")
        step.reason += "; " + SMOLLM2_REASON
    if step.kind == "script":   # its overrides are positional (parse_args): after the page's, before options
        at = next((i for i, a in enumerate(step.argv) if i > 0 and a.startswith("--")), len(step.argv))
        step.argv[at:at] = flags
    else:
        step.argv = step.argv + flags
    return step


def _smaller_already(argv: list[str], flag: str) -> bool:
    """True when the command already sets `flag`'s key to a number no larger (run.eval_limit=0 stays 0)."""
    key, _, value = flag.partition("=")
    mine = [a.partition("=")[2] for a in argv if a.startswith(key + "=")] if value else []
    try:
        return bool(mine) and float(mine[-1]) <= float(value)
    except ValueError:
        return False


def plan_python(block: Block) -> Step:
    code = substitute(block.text, "python")
    step = Step(block.page, block.line, "python", block.text, code=code)
    m = re.match(r"#\s*([\w/.-]+\.py)\s*$", block.text.split("\n", 1)[0])
    step.writes = m.group(1) if m else ""
    for ctx in CONTEXT:
        if ctx.page == block.page and ctx.marker in block.text:
            step.code = "exec(" + repr(ctx.prelude) + ")\n" + code
            step.reason = ctx.reason
            return step
    step.code = "pass\n" + code
    return step


def plan_block(block: Block) -> list[Step]:
    if block.lang == "python":
        return [plan_python(block)]
    steps = [plan_command(block.page, line, cmd)
             for line, cmd in command_lines(substitute(block.text, "bash"), block.line)]
    for step in steps:
        same = [s for s in steps if s.line == step.line]
        if len(same) > 1:
            step.part = f"{same.index(step) + 1}/{len(same)}"
    return steps


def page_order(steps: list[Step]) -> list[Step]:
    """A page's steps in the order they run: the page's, each AFTER step moved just behind its producer."""
    order = list(steps)
    for page, pattern, producer, _ in AFTER:
        made = [s for s in order if s.page == page and re.search(producer, s.command)]
        for step in [s for s in order if s.page == page and re.search(pattern, s.command)]:
            if made and order.index(step) < order.index(made[-1]):
                order.remove(step)
                order.insert(order.index(made[-1]) + 1, step)
    return order


def looks_like_commands(block: Block) -> bool:
    """An unlabeled block that holds shell commands (it should say ```bash, so that it is run)."""
    first = next((ln.strip() for ln in block.text.split("\n") if ln.strip()), "")
    return bool(re.match(r"^([A-Z_]+=\S+ )*(grpokit|python|pip|torchrun|tensorboard)\s", first))
