"""Every shell command and Python block of README.md and docs/*.md runs here, so none can rot.

One test per command line (bash) or block (python), named `page:line`. The blocks of one page run in
order in one work folder (a later command reads what an earlier one wrote: `grpokit eval --model
runs/demo/final` after `grpokit train`), each in a fresh process forked from a server that has imported
torch / transformers / TRL / grpokit once (tests/docs/snippet_server.py). The work folder holds the
files the prose assumes (doc_snippets.FIXTURES, made by `_seed`: a model at `path/to/hf-model`, GSM8K
at `../shared/data/gsm8k`, ...), and every command gets the size flags of doc_snippets.SIZE. What does not
run here is skipped with its reason (doc_snippets.SKIPS).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import doc_snippets as ds
import pytest

from grpokit.model.loading import build_char_tokenizer, tiny_random_model

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
        path = os.pathsep.join([str(ds.ROOT / "src"), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
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
        reply = self.proc.stdout.readline()
        assert reply, f"the snippet server died (exit {self.proc.poll()}) running {request}"
        rc = json.loads(reply)["rc"]
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
    chat = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "solution": str(a + b)}
            for a, b in rows]
    _jsonl(folder / "deepmath.jsonl", chat)
    datasets.Dataset.from_list(chat).save_to_disk(str(folder / "deepmath"))
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


class Pages:
    """Each page's work folder and which of its steps have run (each runs once; later ones read its files)."""

    def __init__(self, root: Path, seed: Path, server: SnippetServer, blocks: list[ds.Block]):
        self.root, self.seed, self.server = root, seed, server
        self.steps: dict[str, list[ds.Step]] = {}
        for block in blocks:
            if block.lang in ds.LANGS:
                self.steps.setdefault(block.page, []).extend(ds.plan_block(block))
        self.steps = {page: ds.page_order(steps) for page, steps in self.steps.items()}
        self.results: dict[str, tuple[int, str]] = {}

    def work(self, page: str) -> Path:
        work = self.root / page.replace("/", "_").replace(".md", "") / "work"
        if not work.exists():
            for link, (target, _) in ds.FIXTURES.items():
                path = work / link
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(ds.ROOT / target[5:] if target.startswith("repo:") else self.seed / target)
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
        return self.server.run(work, kind=step.kind, argv=step.argv, env=step.env)   # grpokit, script, parse


@pytest.fixture(scope="module")
def seed(tmp_path_factory, server):
    return _seed(tmp_path_factory.mktemp("snippet-seed"), server)


@pytest.fixture(scope="module")
def pages(tmp_path_factory, server, seed):
    return Pages(tmp_path_factory.mktemp("snippet-pages"), seed, server, ds.doc_blocks())


STEPS = [s for b in ds.doc_blocks() if b.lang in ds.LANGS for s in ds.plan_block(b)]


@pytest.mark.parametrize("step", STEPS, ids=[s.id for s in STEPS])
def test_snippet_runs(step, pages):
    if step.kind == "skip":
        pytest.skip(f"{step.command!r}: {step.reason}")
    if step.page in ds.NEEDS_BWRAP and shutil.which("bwrap") is None:
        pytest.skip("runs programs in the sandbox: needs bubblewrap (apt-get install bubblewrap)")
    assert step.kind != "unknown", f"{step.id}: {step.command!r}: {step.reason}"
    rc, out = pages.run(next(s for s in pages.steps[step.page] if s.id == step.id))
    what = step.command if step.kind != "python" else "python block"
    assert rc == 0, f"{step.id} failed (exit {rc}): {what}\n  ran {step.argv} ({step.reason})\n{out[-4000:]}"


ROTTEN = """# A page with rotten snippets
```bash
grpokit train run.max_stepz=1     # a config key that does not exist
grpokit eval --limit 2 --no-such-flag
grpokit train run.max_steps=1
```

```python
from grpokit.rewards.scoring import score_responses, get_reward_fn   # a name that does not exist
```

```bash
grpokit frobnicate --now
```
"""


def test_a_rotten_snippet_fails(tmp_path, server, seed):
    """The check can fail: an unknown config key, an unknown flag, a missing function, an unknown command."""
    blocks = ds.find_blocks(ROTTEN, "rotten.md")
    assert [(b.line, b.lang) for b in blocks] == [(3, "bash"), (9, "python"), (13, "bash")]
    rotten = Pages(tmp_path, seed, server, blocks)
    steps = rotten.steps["rotten.md"]
    assert [s.id for s in steps] == [f"rotten.md:{n}" for n in (3, 4, 5, 9, 13)]
    assert steps[2].argv[-len(ds.SIZE["train"][0]):] == ds.SIZE["train"][0]    # the size flags come last
    rc, out = rotten.run(steps[0])
    assert rc == 2 and "unknown config key 'run.max_stepz'" in out and "max_steps" in out, out[-2000:]
    rc, out = rotten.run(steps[1])
    assert rc == 2 and "--no-such-flag" in out, out[-2000:]
    rc, out = rotten.run(steps[3])
    assert rc == 1 and "ImportError" in out and 'File "rotten.md", line 9' in out, out[-2000:]
    assert steps[4].kind == "unknown" and "rule for" in steps[4].reason   # fails in test_snippet_runs
    with pytest.raises(AssertionError, match="rotten.md:3 failed"):
        test_snippet_runs(steps[0], rotten)


def test_commands_are_split_and_planned():
    text = ("pip install torch && grpokit train \\\n    loss.beta=0.0   # the comment goes\n"
            "OMP_NUM_THREADS=1 taskset -c 1 grpokit eval --model runs/demo/final\n"
            "grpokit sweep k.yaml & grpokit sweep k.yaml\n")
    pinned = "OMP_NUM_THREADS=1 taskset -c 1 grpokit eval --model runs/demo/final"
    assert ds.command_lines(text, 10) == [(10, "pip install torch"), (10, "grpokit train loss.beta=0.0"),
                                          (12, pinned), (13, "grpokit sweep k.yaml &"),
                                          (13, "grpokit sweep k.yaml &")]
    pip, train, ev, bg, _ = [ds.plan_command("p.md", line, c) for line, c in ds.command_lines(text, 10)]
    assert pip.kind == "skip" and "network" in pip.reason
    assert train.argv[:2] == ["train", "loss.beta=0.0"] and "run.max_steps=1" in train.argv
    assert ev.env == {"OMP_NUM_THREADS": "1"} and ev.argv[:3] == ["eval", "--model", "runs/demo/final"]
    assert bg.kind == "skip" and "two processes" in bg.reason
    kept = ds.plan_command("p.md", 1, "grpokit train run.eval_limit=0")   # a size flag never enlarges a run
    assert "run.eval_limit=2" not in kept.argv and "run.max_steps=1" in kept.argv


def test_no_unlabeled_block_holds_commands():
    """A block of commands without ```bash would escape this test: each one must say its language."""
    unlabeled = [f"{b.page}:{b.line}" for b in ds.doc_blocks() if b.lang == "" and ds.looks_like_commands(b)]
    assert not unlabeled, f"label these blocks ```bash (or ```python) so they run here: {unlabeled}"
