"""Final-answer extraction and comparison: the checking half of the rule-based reward [B].

DeepSeekMath scores a completion by its final answer: the content of the last ``\\boxed{...}`` is
compared with the reference. Comparison runs cheapest first and stops at the first verdict:

1. both sides parse as plain numbers (``1,000``, ``$18``, ``18.00``, ``50%``, ``3/4``,
   ``\\frac{1}{2}``, ``18 dollars``): equal when ``|pred - ref| <= tol`` (absolute tolerance, so
   an off-by-one on a large GSM8K answer is still wrong); against a numeric reference, numbers
   joined by + - * (``94-95``) are wrong, an expression to compute rather than its value;
2. the normalized strings are equal (spaces, ``$``, ``\\left``, ``\\text{}``, case ignored);
3. math-verify decides LaTeX equivalence (``\\sqrt{2}/2`` = ``\\frac{\\sqrt{2}}{2}``, intervals,
   tuples, sets) under a hard deadline.

math-verify's own timeout uses ``signal.alarm``, which only works in the main thread, so it runs
here with its timeout off inside a child process that is killed when the deadline passes: a
pathological expression (``9^{9^{9^{9}}}``) costs ``timeout_s`` and a restart, never a hang, from
any thread.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import logging
import math
import os
import queue
import re
import subprocess
import sys
import threading

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _balanced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] == '{', or None if it never closes."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # \{ and \} are literal braces (set notation), not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in `text`.

    Nested braces are balanced (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); the brace-less
    form ``\\boxed 5`` gives ``5``. Only the last box counts, as in the DeepSeekMath rule, except
    that empty boxes are passed over: ``\\boxed{12} \\boxed{}`` gives ``12`` (an empty box states no
    answer, so it cannot take back one stated before it).

    Args:
        text: a model completion or a reference solution.

    Returns:
        The content of the last non-empty box; '' when every box is empty; None when there is no
        box or the last non-empty one never closes (a truncated completion).
    """
    found = None
    for match in reversed(list(_BOX.finditer(text))):
        content = _box_content(text, match.end())
        if content is None or content.strip():
            return content
        found = content
    return found


def _box_content(text: str, i: int) -> str | None:
    """What the box command ending at text[i] holds: a brace group, or a brace-less run (None: neither)."""
    start = i
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        return _balanced(text, i)
    run = re.match(r"[^\s$]+", text[i:])
    return run.group(0) if run and i > start else None


_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?\s*([^\n]*?)\s*(?:\.(?=\s|$)|\n|$)",
                        re.IGNORECASE)


def extract_answer(text: str, fallback: bool = True) -> str | None:
    """The final answer of a completion: the last box, else (with `fallback`) a plain-text form.

    Args:
        text: the completion.
        fallback: when there is no box, accept GSM8K's ``#### 72`` or ``The answer is 72``
            (whichever comes last).

    Returns:
        The answer string, or None when none is found.
    """
    boxed = extract_boxed(text)
    if boxed is not None or not fallback:
        return boxed
    found = [m for pattern in (_HASHES, _ANSWER_IS) for m in pattern.finditer(text)]
    found = [m for m in found if m.group(1).strip(" $")]
    if not found:
        return None
    last = max(found, key=lambda m: m.start())
    return last.group(1).strip().strip("$").strip()


# ---------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------

_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")


def _clean(text: str) -> str:
    """Remove LaTeX that never changes a value: math delimiters, spacing, \\text{}, degrees."""
    s = text.strip()
    s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\!", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    for _ in range(3):  # unwrap nested \text{\textbf{...}}
        s = _WRAPPER.sub(r" \1 ", s)
    s = re.sub(r"\\[,;: ]|~", " ", s)
    s = _DEGREES.sub("", s)
    s = s.strip()
    if s.startswith("\\(") and s.endswith("\\)") or s.startswith("\\[") and s.endswith("\\]"):
        s = s[2:-2].strip()
    s = s.rstrip(".").strip()
    while len(s) >= 2 and s[0] == "{" and _balanced(s, 0) == s[1:-1]:
        s = s[1:-1].strip()
    return s


_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"
_PLAIN = re.compile(rf"(?P<s1>[+-])?\s*\$?\s*(?P<s2>[+-])?\s*(?P<num>{_NUM})\s*(?P<pct>%)?"
                    r"(?:\s+(?P<unit>(?!(?:pi|sqrt|ln|log|sin|cos|tan|exp)\b)[A-Za-z]{2,}(?:\s+[A-Za-z]+)*))?")
_FRAC = re.compile(r"(?P<sign>[+-])?\s*\\frac\s*(?:\{(?P<a>[^{}]*)\}|(?P<a1>\d))"
                   r"\s*(?:\{(?P<b>[^{}]*)\}|(?P<b1>\d))")
_SLASH = re.compile(rf"(?P<a>[+-]?\s*(?:{_NUM}))\s*/\s*(?P<b>[+-]?\s*(?:{_NUM}))")
# Numbers joined by + - * x: an expression left for the checker to compute (``\boxed{94-95}`` for
# "What is 94-95?"), not a final answer. math-verify would evaluate it and call it equal.
_SUM = re.compile(rf"[+-]?\s*(?:{_NUM})(?:\s*(?:[-+*×]|\\times|\\cdot)\s*[+-]?\s*(?:{_NUM}))+")


def _plain_number(s: str) -> float | None:
    m = _PLAIN.fullmatch(s.strip())
    if not m or (m.group("s1") and m.group("s2")):
        return None
    value = float(m.group("num").replace(",", ""))
    return -value if "-" in (m.group("s1"), m.group("s2")) else value


def normalize_number(text: str) -> float | None:
    """Parse an answer that is a plain number, with the decorations models and datasets add.

    Accepts thousands commas (``1,000``), currency (``$18``, ``\\$18``), trailing zeros and a
    trailing period (``18.00.``), signs, ``50%`` (read as 50: GSM8K's percent answers are bare),
    fractions ``3/4``, ``\\frac{1}{2}``, ``\\dfrac12``, unit words after a space (``18 dollars``,
    ``5\\text{ cm}``) and degrees. Anything else (``3x``, ``\\sqrt{2}``, ``1,2``) is not a number.

    Args:
        text: an extracted answer.

    Returns:
        The value as a finite float, or None.
    """
    if not text:
        return None
    s = _clean(text).strip("$").strip()
    value = _plain_number(s)
    if value is None:
        m = _FRAC.fullmatch(s) or _SLASH.fullmatch(s)
        if m is not None:
            groups = m.groupdict()
            a = _plain_number(groups.get("a") or groups.get("a1") or "")
            b = _plain_number(groups.get("b") or groups.get("b1") or "")
            if a is not None and b not in (None, 0.0):
                value = (-1 if groups.get("sign") == "-" else 1) * a / b
    return value if value is not None and math.isfinite(value) else None


def unevaluated_arithmetic(text: str) -> bool:
    """Whether an answer is numbers joined by + - * (``94-95``, ``(2 \\times 3)``): not a value."""
    return _SUM.fullmatch(_clean(text).strip("$").replace("(", "").replace(")", "").strip()) is not None


def normalize_answer(text: str) -> str:
    """Canonical string form for exact comparison: cleaned, no spaces, lower case."""
    return re.sub(r"\s+", "", _clean(text).strip("$")).lower()


# ---------------------------------------------------------------------------------------------
# math-verify in a killable child process
# ---------------------------------------------------------------------------------------------

# The child imports math-verify once, then answers one JSON line [gold, pred] per request with
# "1" / "0". Its timeouts are off (they rely on signal.alarm); the parent enforces the deadline.
_WORKER_SOURCE = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
try:
    from math_verify import parse, verify
except Exception as e:
    print(json.dumps({"ready": False, "error": repr(e)}), flush=True)
    sys.exit(0)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    gold, pred = json.loads(line)
    try:
        g = parse("$" + gold + "$", parsing_timeout=None)
        p = parse("$" + pred + "$", parsing_timeout=None)
        ok = bool(g) and bool(p) and verify(g, p, timeout_seconds=None)
    except Exception:
        ok = False
    print("1" if ok else "0", flush=True)
"""
_STARTUP_S = 120.0  # importing sympy on a busy machine is slow; the per-call deadline starts after


class _TimedOut(Exception):
    """math-verify did not answer before the deadline (never cached)."""


class _Worker:
    """One math-verify child process; a reader thread turns its stdout into a queue."""

    def __init__(self) -> None:
        flags = ["-P"] if sys.version_info >= (3, 11) else []  # keep the cwd off the child's path
        self.proc = subprocess.Popen([sys.executable, *flags, "-c", _WORKER_SOURCE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_ready(self) -> None:
        if self.ready:
            return
        line = self.lines.get(timeout=_STARTUP_S)
        status = json.loads(line) if line else {"ready": False, "error": "worker exited"}
        if not status.get("ready"):
            raise RuntimeError(status.get("error", "worker failed"))
        self.ready = True

    def ask(self, gold: str, pred: str, timeout_s: float) -> bool:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([gold, pred]) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise _TimedOut from None
        if line is None:
            raise RuntimeError("math-verify worker exited")
        return line == "1"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class _WorkerPool:
    """Idle workers shared by all threads; a thread takes one, or starts one when none is idle."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.pid = os.getpid()
        self.broken: str | None = None  # why math-verify cannot run here (then it is skipped)
        # Bound the children (each holds sympy, ~100 MB) when many threads score at once.
        self.slots = threading.BoundedSemaphore(max(2, min(8, os.cpu_count() or 2)))

    def _take(self) -> _Worker:
        with self.lock:
            if self.pid != os.getpid():  # forked: the parent's pipes are not ours
                self.idle, self.pid = [], os.getpid()
            return self.idle.pop() if self.idle else _Worker()

    def equal(self, gold: str, pred: str, timeout_s: float) -> bool:
        with self.slots:
            return self._equal(gold, pred, timeout_s)

    def _equal(self, gold: str, pred: str, timeout_s: float) -> bool:
        worker = None
        try:
            worker = self._take()
            worker.wait_ready()
        except (RuntimeError, OSError, queue.Empty, ValueError) as e:
            if worker is not None:
                worker.kill()  # it cannot even start: stop trying for the rest of this process
            self.broken = f"{type(e).__name__}: {e}"
            logger.warning("math-verify is unavailable (%s): comparing answers without it", self.broken)
            return False
        try:
            result = worker.ask(gold, pred, timeout_s)
        except _TimedOut:
            worker.kill()
            try:
                replacement = _Worker()  # started now so its import overlaps the caller's work
            except OSError:
                raise _TimedOut from None
            with self.lock:
                self.idle.append(replacement)
            raise
        except (RuntimeError, OSError) as e:  # the child died on this input (e.g. out of memory)
            worker.kill()
            logger.debug("math-verify worker failed on %r: %s", pred[:80], e)
            return False
        with self.lock:
            self.idle.append(worker)
        return result

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.kill()


# One pool per process: the children are a cache of expensive imports, not state a caller sees.
_POOL = _WorkerPool()
atexit.register(_POOL.close)


@functools.lru_cache(maxsize=8192)
def _math_verify_equal(gold: str, pred: str, timeout_s: float) -> bool:
    """Cached verdict; a timeout raises _TimedOut, which lru_cache does not store."""
    return _POOL.equal(gold, pred, timeout_s)


@functools.lru_cache(maxsize=1)
def _math_verify_installed() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def answers_match(pred: str, ref: str, tol: float = 0.01, math_verify: bool = True,
                  timeout_s: float = 2.0) -> bool:
    """Whether a predicted final answer equals the reference.

    Args:
        pred: the extracted answer (e.g. the content of the last box).
        ref: the reference answer.
        tol: absolute tolerance when both sides are plain numbers.
        math_verify: fall back to math-verify's LaTeX equivalence for non-numeric answers.
        timeout_s: deadline for one math-verify comparison; past it the answer is wrong.

    Returns:
        True when the answers match by number, by normalized string, or by math-verify. Against a
        numeric reference, an unevaluated sum or product of numbers (``94-95`` for -1) is wrong: a
        policy rewarded for it learns to copy the question into the box.
    """
    if pred is None or ref is None or not pred.strip() or not ref.strip():
        return False
    p, r = normalize_number(pred), normalize_number(ref)
    if p is not None and r is not None:
        return abs(p - r) <= tol
    if r is not None and unevaluated_arithmetic(pred):
        return False
    if normalize_answer(pred) == normalize_answer(ref):
        return True
    if not math_verify or not _math_verify_installed() or _POOL.broken:
        return False
    gold, guess = (_clean(s).replace("$", "") for s in (ref, pred))
    try:
        return _math_verify_equal(gold, guess, float(timeout_s))
    except _TimedOut:
        logger.debug("math-verify timed out after %.1fs on %r", timeout_s, pred[:80])
        return False
