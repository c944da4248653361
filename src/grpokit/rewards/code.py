"""[B] Code rewards: each completion's program run against its problem's tests, in the sandbox.

    reward.funcs: {code_tests: 1.0}                  the share of tests passed (0 on timeout, crash, ...)
    reward.funcs: {code_all: 1.0, code_format: 0.1}  1 when every test passes; 1 for a parseable block

The program is the completion's last fenced ```python block (any fenced block when none is marked python);
for completion-style problems (HumanEval: the prompt is a signature and docstring) the prompt's code
continued by the completion, cut where the function ends (a line starting at column 0 that is not code
of it). What runs, in one sandboxed interpreter (grpokit.sandbox): the program, then the problem's setup
(imports, `candidate = f`), then each test on its own, counted passed or failed.

`CodeRunner` holds the sandbox pool of a run and runs each distinct (program, tests) once per batch, so
code_tests and code_all together, or G equal completions of a group, cost one execution. The rewards are
`async def`: they run beside the run's other async rewards (grpokit.rewards.calls), the pool running
reward.sandbox_workers programs at once. Each batch's outcomes (passed, failed, timeout, memory, crash,
output_too_large, no_program), the sandbox seconds and programs per second go into the step's metrics
(`code/...`, RewardBatch.metrics).
"""

from __future__ import annotations

import ast
import asyncio
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from grpokit.config.code_checks import CODE_REWARDS  # noqa: F401  (declared once, there)
from grpokit.rewards.calls import RewardError
from grpokit.sandbox import OUTCOMES, Limits, Result, SandboxPool, SandboxUnavailable, check_sandbox
from grpokit.sandbox.remote import RemoteSandbox

NO_PROGRAM = "no_program"
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
_OPEN = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n(.*)\Z", re.S)   # a block never closed
_CACHE = 4096                # (program, tests) results kept: a batch's worth and more


def _text(completion: Any) -> str:
    """A completion's text (chat completions: the last assistant message's content)."""
    if isinstance(completion, list):
        said = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
        return said[-1] if said else ""
    return str(completion)


def fenced_block(text: str) -> str | None:
    """The last ```python block of `text`, else its last fenced block of any language; a ```python block
    the completion opened and never closed (cut at the length limit) counts from its fence to the end;
    None without."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    python = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    chosen = python or [b for lang, b in blocks if not lang]
    tail = _OPEN.search(text[text.rfind("```") :]) if text.count("```") % 2 else None
    if tail is not None:
        return tail.group(1)
    return chosen[-1] if chosen else None


def _continued(code_prompt: str, completion: str) -> str:
    """A completion-style program: the prompt's code and the completion up to the first line at column 0
    that does not continue the function (HumanEval's stop lines: def, class, if, print, #)."""
    lines = completion.split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line[:1] and not line[:1].isspace() and not line.startswith(("'", '"', ")", "]", "}")):
            lines = lines[:i]
            break
    return code_prompt + "\n".join(lines)


def extract_program(completion: Any, style: str, code_prompt: str = "", entry_point: str = "") -> str | None:
    """The program a completion writes (None: it wrote none).

    style 'fenced': the last fenced block. style 'completion': a fenced block when the completion has one
    (a chat model answering a completion-style prompt; the prompt's code goes first when the block does
    not define `entry_point` itself), else the prompt's code continued by the completion."""
    text = _text(completion)
    block = fenced_block(text)
    if style == "fenced":
        return block
    if block is not None:
        defines = bool(entry_point) and re.search(rf"^\s*def {re.escape(entry_point)}\b", block, re.M)
        return block if defines else code_prompt + block
    return _continued(code_prompt, text)


def parses(program: str | None) -> bool:
    try:
        return program is not None and bool(program.strip()) and ast.parse(program) is not None
    except (SyntaxError, ValueError):
        return False


class CodeRunner:
    """The sandbox of a run (a local SandboxPool, or a RemoteSandbox: `grpokit sandbox-serve`), the results
    of the (program, tests) pairs it ran, and the last batch's figures (`take_metrics`)."""

    def __init__(self, *, mode: str = "bwrap", workers: int = 2, limits: Limits = Limits(),
                 url: str | None = None) -> None:
        if url is not None:                   # the server's own mode and limits apply
            self.sandbox: Any = RemoteSandbox(url)
        else:
            try:
                check_sandbox(mode)           # bubblewrap missing: one line naming the package
            except SandboxUnavailable as e:   # said in the config's terms
                said = str(e).replace("pass mode='process'", "set reward.sandbox=process")
                raise SandboxUnavailable(said) from None
            self.sandbox = SandboxPool(workers=workers, limits=limits, mode=mode)
        self.batches = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpokit-code-rewards")
        self.runs: OrderedDict[tuple, Future] = OrderedDict()   # (program, setup, tests) -> its run
        self.metrics: dict[str, float] = {}

    def _submit(self, jobs: list[tuple[str, list[str]]]) -> list[Future]:
        """One future per job, the jobs sent as one batch (`map`: one request to a remote sandbox)."""
        futures: list[Future] = [Future() for _ in jobs]

        def deliver(batch: Future) -> None:
            try:
                for f, r in zip(futures, batch.result()):
                    f.set_result(r)
            except BaseException as e:        # noqa: BLE001  every waiting reward sees the failure
                for f in futures:
                    if not f.done():
                        f.set_exception(e)

        self.batches.submit(self.sandbox.map, jobs).add_done_callback(deliver)
        return futures

    async def results(self, programs: Sequence[str | None], setups: Sequence[str],
                      tests: Sequence[Sequence[str]]) -> list[Result | None]:
        """One Result per program (None: no program), each distinct (program, setup, tests) run once: a
        second reward over the same batch, awaited beside the first, waits for the same runs."""
        keys = [None if p is None else (p, s, tuple(t)) for p, s, t in zip(programs, setups, tests)]
        distinct = [k for k in dict.fromkeys(keys) if k is not None]
        fresh = [k for k in distinct if k not in self.runs]
        start = time.perf_counter()
        for k, f in zip(fresh, self._submit([(f"{k[0]}\n\n{k[1]}", list(k[2])) for k in fresh])):
            self.runs[k] = f
        got: dict[tuple, Result] = {}
        try:
            for k in distinct:
                got[k] = await asyncio.wrap_future(self.runs[k])
        except BaseException:
            for k in fresh:                   # a failed or interrupted batch is run again next time
                self.runs.pop(k, None)
            raise
        while len(self.runs) > _CACHE:
            self.runs.popitem(last=False)
        out = [None if k is None else got[k] for k in keys]
        self._record(out, [got[k] for k in fresh], time.perf_counter() - start)
        return out

    def _record(self, batch: list[Result | None], ran: list[Result], wall: float) -> None:
        """The batch's outcomes (every call over the same batch sees the same ones) and the work done
        (added up over the calls that ran programs) until `take_metrics`."""
        counts = Counter(NO_PROGRAM if r is None else r.outcome for r in batch)
        m = self.metrics
        m.update({f"code/{o}": float(counts.get(o, 0)) for o in (*OUTCOMES, NO_PROGRAM)})
        m["code/programs_run"] = m.get("code/programs_run", 0.0) + len(ran)
        m["code/sandbox_s"] = m.get("code/sandbox_s", 0.0) + sum(r.seconds for r in ran)
        m["code/wall_s"] = m.get("code/wall_s", 0.0) + (wall if ran else 0.0)

    def take_metrics(self) -> dict[str, float]:
        """The figures of the batch scored since the last call (then cleared), with programs per second."""
        out, self.metrics = self.metrics, {}
        if out:
            wall = out["code/wall_s"]
            out["code/programs_per_s"] = out["code/programs_run"] / wall if wall > 0 else 0.0
        return out

    def close(self) -> None:
        self.batches.shutdown(wait=True)
        self.sandbox.close()


def _programs(completions: Sequence, kw: dict[str, Any]) -> list[str | None]:
    n = len(completions)
    styles, prompts = kw.get("code_style") or ["fenced"] * n, kw.get("code_prompt") or [""] * n
    entries = kw.get("entry_point") or [""] * n
    return [extract_program(c, s, p, e) for c, s, p, e in zip(completions, styles, prompts, entries)]


def code_rewards(runner: CodeRunner) -> dict[str, Callable]:
    """code_tests, code_all and code_format over one runner (TRL's reward signature, by keyword)."""

    async def run(completions, tests, test_setup=None, **kw) -> list[Result | None]:
        missing = [i for i, t in enumerate(tests) if not t]
        if missing:
            raise ValueError(f"completion {missing[0]} has no tests: a code reward needs the task's 'tests' "
                             "column (task.name=functions, humaneval, mbpp or code)")
        setups = test_setup or [""] * len(completions)
        try:
            return await runner.results(_programs(completions, kw), setups, tests)
        except (PermissionError, SandboxUnavailable) as e:   # the sandbox, not a completion: stop the run
            raise RewardError(f"code rewards: {e}") from None

    async def code_tests(prompts, completions, tests, **kw) -> list[float]:
        """The share of the problem's tests the program passes (0 without a program)."""
        return [0.0 if r is None else r.fraction for r in await run(completions, tests, **kw)]

    async def code_all(prompts, completions, tests, **kw) -> list[float]:
        """1 when the program passes every test, else 0."""
        return [float(r is not None and r.outcome == "passed") for r in await run(completions, tests, **kw)]

    for fn in (code_tests, code_all):
        fn.batch_metrics = runner.take_metrics            # type: ignore[attr-defined]
    return {"code_tests": code_tests, "code_all": code_all, "code_format": code_format}


def code_format(prompts, completions, **kw) -> list[float]:
    """1 when the completion holds a program that parses (a fenced block for fenced problems); nothing
    runs."""
    return [float(parses(p)) for p in _programs(completions, kw)]


def runner_for(reward: Any) -> CodeRunner:
    """The runner reward.sandbox* describe (a `grpokit.config.schema.RewardConfig`)."""
    limits = Limits(wall_seconds=reward.sandbox_timeout_s, cpu_seconds=reward.sandbox_timeout_s,
                    memory_mib=reward.sandbox_memory_mib)
    return CodeRunner(mode=reward.sandbox, workers=reward.sandbox_workers, limits=limits,
                      url=reward.sandbox_url)
