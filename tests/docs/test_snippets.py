"""Every shell command and Python block of README.md and docs/*.md runs here, so none can rot.

One test per command line (bash) or block (python), named `page:line`. The blocks of one page run in
order in one work folder (a later command reads what an earlier one wrote: `grpokit eval --model
runs/demo/final` after `grpokit train`), each in a fresh process forked from a server that has imported
torch / transformers / TRL / grpokit once (tests/docs/snippet_server.py). The work folder holds the
files the prose assumes (a model at `path/to/hf-model`, `train.jsonl`, GSM8K at `../shared/data/gsm8k`,
...; see `_seed`), and every command gets the size flags of doc_snippets.SIZE. What does not run here
is skipped with its reason (doc_snippets.SKIPS).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import doc_snippets as ds
import pytest

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 180
CHAT_TEMPLATE = (  # ChatML that renders tools, tool calls and tool results (what TRL's tool programs need)
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}{% if m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}{% for c in m.tool_calls or [] %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class SnippetServer:
    """The client of snippet_server.py: one request at a time, the child's output in a log file."""

    def __init__(self, logs: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ds.ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
        self.logs, self.count = logs, 0
        self.proc = subprocess.Popen([sys.executable, str(HERE / "snippet_server.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=logs)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}, "the snippet server did not start"

    def run(self, cwd: Path, **request) -> tuple[int, str]:
        """(exit status, output) of one request run in `cwd`."""
        self.count += 1
        log = self.logs / f"{self.count:03d}.log"
        self.proc.stdin.write(json.dumps({**request, "cwd": str(cwd), "log": str(log),
                                          "timeout": TIMEOUT_S}) + "\n")
        self.proc.stdin.flush()
        rc = json.loads(self.proc.stdout.readline())["rc"]
        return rc, log.read_text(errors="replace")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = SnippetServer(tmp_path_factory.mktemp("snippet-logs"))
    yield srv
    srv.close()


def _seed(folder: Path, server: SnippetServer) -> Path:
    """The files the docs' prose assumes, made once (every page's work folder links to them)."""
    from grpokit.model.loading import build_char_tokenizer, tiny_random_model

    model = folder / "model"
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    tiny_random_model(tok, seed=0, max_positions=2048).save_pretrained(model)
    tok.save_pretrained(model)
    rows = [(a, b) for a in (12, 34, 56, 7) for b in (3, 21)]
    _jsonl(folder / "train.jsonl", [{"prompt": f"What is {a}+{b}?", "answer": str(a + b)} for a, b in rows])
    _jsonl(folder / "data.jsonl", [{"question": f"What is {a}+{b}?", "final": str(a + b)} for a, b in rows])
    chat = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "solution": str(a + b)} for a, b in rows]
    _jsonl(folder / "deepmath.jsonl", chat)
    __import__("datasets").Dataset.from_list(chat).save_to_disk(str(folder / "deepmath"))
    gsm = [{"question": f"Tom has {a} apples and buys {b}. How many now?",
            "answer": f"He has {a}+{b}=<<{a}+{b}={a + b}>>{a + b}.\n#### {a + b}"} for a, b in rows]
    for split in ("train", "test"):
        _jsonl(folder / "gsm8k" / f"{split}.jsonl", gsm)
    shutil.copy(ds.ROOT / "configs" / "demo.yaml", folder / "cfg.yaml")
    work = folder / "run"
    work.mkdir()
    rc, out = server.run(work, kind="grpokit", argv=["train", *ds.SIZE["train"][0]])
    assert rc == 0, "the finished run behind runs/a and runs/b failed:\n" + out[-3000:]
    return folder


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# work-folder path -> seed path (relative to the seed folder): what the prose assumes exists
LINKS = {"configs": ds.ROOT / "configs", "benchmarks": ds.ROOT / "benchmarks", "scripts": ds.ROOT / "scripts",
         ds.STANDIN_MODEL: "model",
         "models/qwen2-0.5b-instruct": "model",      # coming_from_trl.md downloads it (skipped): the stand-in
         "models/qwen2.5-0.5b-instruct": "model",    # agents.md's model: the stand-in
         "train.jsonl": "train.jsonl", "data.jsonl": "data.jsonl", "deepmath.jsonl": "deepmath.jsonl",
         "deepmath": "deepmath", "cfg.yaml": "cfg.yaml", "../shared/data/gsm8k": "gsm8k",
         "runs/a": "run/runs/demo", "runs/b": "run/runs/demo"}   # observability.md's two runs to overlay


class Pages:
    """Each page's work folder and which of its steps have run (a step runs once; later ones read its files)."""

    def __init__(self, root: Path, seed: Path, server: SnippetServer):
        self.root, self.seed, self.server = root, seed, server
        self.steps: dict[str, list[ds.Step]] = {}
        for block in ds.doc_blocks():
            if block.lang in ds.LANGS:
                self.steps.setdefault(block.page, []).extend(ds.plan_block(block))
        self.steps = {page: ds.page_order(steps) for page, steps in self.steps.items()}
        self.results: dict[str, tuple[int, str]] = {}

    def work(self, page: str) -> Path:
        work = self.root / page.replace("/", "_").replace(".md", "") / "work"
        if not work.exists():
            for link, target in LINKS.items():
                path = work / link
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(target if Path(target).is_absolute() else self.seed / target)
        return work

    def run(self, step: ds.Step) -> tuple[int, str]:
        """Run the steps before `step` in its page's order (ds.page_order) first, then `step`."""
        page = self.steps[step.page]
        for earlier in page[:page.index(step)]:
            if earlier.id not in self.results and earlier.kind in ("grpokit", "script", "python", "parse"):
                self.results[earlier.id] = self._run(earlier)
        if step.id not in self.results:
            self.results[step.id] = self._run(step)
        return self.results[step.id]

    def _run(self, step: ds.Step) -> tuple[int, str]:
        work = self.work(step.page)
        if step.kind == "python":
            if step.writes:
                (work / step.writes).write_text(step.command + "\n")
            return self.server.run(work, kind="python", code=step.code, filename=step.page, line=step.line,
                                   env=step.env)
        if step.kind == "script" and "--out" in step.argv:   # the script wants a new folder
            shutil.rmtree(work / step.argv[step.argv.index("--out") + 1], ignore_errors=True)
        return self.server.run(work, kind=step.kind, argv=step.argv, env=step.env)   # grpokit | script | parse


@pytest.fixture(scope="module")
def pages(tmp_path_factory, server):
    return Pages(tmp_path_factory.mktemp("snippet-pages"), _seed(tmp_path_factory.mktemp("snippet-seed"), server),
                 server)


STEPS = [s for b in ds.doc_blocks() if b.lang in ds.LANGS for s in ds.plan_block(b)]


@pytest.mark.parametrize("step", STEPS, ids=[s.id for s in STEPS])
def test_snippet_runs(step, pages):
    if step.kind == "skip":
        pytest.skip(f"{step.command!r}: {step.reason}")
    assert step.kind != "unknown", f"{step.id}: {step.command!r}: {step.reason}"
    rc, out = pages.run(next(s for s in pages.steps[step.page] if s.id == step.id))
    assert rc == 0, (f"{step.id} failed (exit {rc}): {step.command if step.kind != 'python' else 'python block'}"
                     f"\n  run as: {step.argv or ''} ({step.reason})\n{out[-4000:]}")
