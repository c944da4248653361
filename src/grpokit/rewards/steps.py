"""Arithmetic step verifier: the rule-based process reward of DeepSeekMath section 4.1.3 [B].

Process supervision rewards each reasoning step, not just the final answer. Where the paper uses a
learned process reward model, grpokit checks what can be checked exactly: every equation
``a op b = c`` the model writes. Each one found becomes a step that ends where its result ends.

Recognized forms (spaces, ``$``, thousands commas and ``\\left``/``\\right`` are ignored):

    48/2 = 24                  plain
    <<48/2=24>>24              GSM8K calculator annotation (the step ends at the visible result)
    12+34=46-5=41              run-on chain: 12+34=46 and 46-5=41
    3*4 = 6+6 = 12             proper chain: each side equals the next
    0.2 x 50 = 10, 20% * 50 = 10, \\frac{3}{4} \\times 8 = 6, 2^{10} = 1024

The left side is evaluated exactly with `fractions.Fraction` by a small recursive-descent parser
(no eval). A result written with d decimals may be rounded or truncated to d places
(``10/3 = 3.33`` is right); an integer result must be exact. Equations that touch a variable
(``2x + 3 = 7``, ``\\sqrt{16} = 4``) are skipped rather than judged.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, NamedTuple


class Step(NamedTuple):
    start: int  # char index where the step's left side begins
    end: int  # char index just past the step's result
    correct: bool
    text: str  # the step as written, e.g. '48/2=24'


_TOKEN = re.compile(r"""
  (?P<num>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?)
| (?P<op>\*\*|[-+*/^×÷·−]|\\times(?![A-Za-z])|\\cdot(?![A-Za-z])|\\div(?![A-Za-z]))
| (?P<frac>\\[dt]?frac(?![A-Za-z]))
| (?P<lpar>[({])
| (?P<rpar>[)}])
| (?P<eq>=)
| (?P<pct>\\?%)
| (?P<skip>[ \t]+|\\?\$|\\[,!; ]|\\left(?![A-Za-z])|\\right(?![A-Za-z]))
| (?P<x>[xX](?=[ \t]*[\d($]))
""", re.VERBOSE)
_OPS = {"**": "^", "×": "*", "·": "*", "−": "-", "÷": "/", "\\times": "*", "\\cdot": "*", "\\div": "/"}
# A run that starts right after one of these (no space) continues a longer expression
# (a variable, \sqrt{...}, x^2): its first side is incomplete.
_CONTINUES = re.compile(r"[A-Za-z0-9_^\\}\]]")
_MAX_DIGITS = 30  # longer literals are not arithmetic a model checks; bounds Fraction sizes
_MAX_BITS = 4096  # bound on a power's size, so 9^9^9 cannot stall the verifier


class _Tok(NamedTuple):
    kind: str  # num | op | frac | lpar | rpar | eq | pct | break
    value: str
    start: int
    end: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            out.append(_Tok("break", text[pos], pos, pos + 1))
            pos += 1
            continue
        kind, value = m.lastgroup or "break", m.group(0)
        pos = m.end()
        if kind == "skip":
            continue
        if kind == "x":  # 'x' multiplies only between numbers: 0.2 x 50, not 2x + 3
            prev = out[-1].kind if out else "break"
            kind, value = ("op", "*") if prev in ("num", "rpar", "pct") else ("break", value)
        elif kind == "op":
            value = _OPS.get(value, value)
        out.append(_Tok(kind, value, m.start(), m.end()))
    return out


class _Parser:
    """expr := term (+|- term)*; term := unary (*|/ unary)*; unary := (+|-) unary | power;
    power := postfix (^ unary)?; postfix := primary %*; primary := num | (expr) | {expr} | frac."""

    def __init__(self, toks: list[_Tok]) -> None:
        self.toks, self.i = toks, 0

    def parse(self) -> Fraction | None:
        try:
            value = self.expr()
        except (ValueError, ZeroDivisionError, OverflowError, IndexError):
            return None
        return value if self.i == len(self.toks) else None

    def peek(self, *values: str) -> bool:
        return (self.i < len(self.toks) and self.toks[self.i].kind == "op"
                and self.toks[self.i].value in values)

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek("+", "-"):
            op = self.toks[self.i].value
            self.i += 1
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek("*", "/"):
            op = self.toks[self.i].value
            self.i += 1
            value = value * self.unary() if op == "*" else value / self.unary()
        return value

    def unary(self) -> Fraction:
        if self.peek("+", "-"):
            sign = -1 if self.toks[self.i].value == "-" else 1
            self.i += 1
            return sign * self.unary()
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if not self.peek("^"):
            return base
        self.i += 1
        exp = self.unary()
        size = max(base.numerator.bit_length(), base.denominator.bit_length(), 1)
        if exp.denominator != 1 or abs(exp) * size > _MAX_BITS or (base == 0 and exp < 0):
            raise ValueError("power out of range")
        return base ** int(exp)

    def postfix(self) -> Fraction:
        value = self.primary()
        while self.i < len(self.toks) and self.toks[self.i].kind == "pct":
            self.i += 1
            value /= 100
        return value

    def primary(self) -> Fraction:
        tok = self.toks[self.i]
        self.i += 1
        if tok.kind == "num":
            digits = tok.value.replace(",", "")
            if len(digits) > _MAX_DIGITS:
                raise ValueError("literal too long")
            return Fraction(digits)
        if tok.kind == "lpar":
            value = self.expr()
            close = ")" if tok.value == "(" else "}"
            if self.toks[self.i].kind != "rpar" or self.toks[self.i].value != close:
                raise ValueError("unbalanced")
            self.i += 1
            return value
        if tok.kind == "frac":  # \frac{a}{b}: both groups are braced primaries
            if self.toks[self.i].value != "{":
                raise ValueError("\\frac needs braces")
            num = self.primary()
            if self.toks[self.i].value != "{":
                raise ValueError("\\frac needs braces")
            return num / self.primary()
        raise ValueError(f"unexpected {tok.value!r}")


class _Side(NamedTuple):
    toks: list[_Tok]
    value: Fraction | None  # None: not an arithmetic expression
    lead: Fraction | None  # value of a leading signed number (run-on chains: 46 in '46-5')
    lead_end: int
    computes: bool  # holds an operation (a bare number restates, it does not compute)


def _side(toks: list[_Tok]) -> _Side:
    value = _Parser(toks).parse() if toks else None
    k = 1 if toks and toks[0].kind == "op" and toks[0].value in "+-" else 0
    lead, lead_end = None, toks[-1].end if toks else 0
    if len(toks) > k and toks[k].kind == "num":
        lead_end = toks[k].end
        lead = _Parser(toks[:k + 1]).parse()
    computes = any(t.kind in ("op", "pct", "frac") for t in toks[k:])
    return _Side(toks, value, lead, lead_end, computes)


def _close(value: Fraction, claim_text: str, claim: Fraction) -> bool:
    """Exact for an integer claim; a claim with d decimals may be value rounded/truncated to d."""
    decimals = len(claim_text.rsplit(".", 1)[1]) if "." in claim_text else 0
    return value == claim if decimals == 0 else abs(value - claim) < Fraction(1, 10 ** decimals)


def _annotation_result(text: str, end: int) -> tuple[str, int] | None:
    """The visible result after a GSM8K annotation: '<<48/2=24>>24' -> ('24', its end)."""
    m = re.compile(r"\s*>>\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)").match(text, end)
    return (m.group(1), m.end(1)) if m else None


def _runs(toks: list[_Tok]) -> list[list[_Tok]]:
    runs: list[list[_Tok]] = [[]]
    for tok in toks:
        if tok.kind == "break":
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(tok)
    return [r for r in runs if any(t.kind == "eq" for t in r)]


def _split(run: list[_Tok]) -> list[list[_Tok]]:
    parts: list[list[_Tok]] = [[]]
    for tok in run:
        if tok.kind == "eq":
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def _incomplete_start(text: str, first: _Tok) -> bool:
    """Whether the run continues an expression written before it ('2x+3', '\\sqrt{16}', 'x - 2')."""
    if first.start > 0 and _CONTINUES.match(text[first.start - 1]):
        return True
    before = text[:first.start].rstrip()[-1:]
    return first.kind == "op" and (first.value != "-" or bool(before and _CONTINUES.match(before)))


def _judge(left: _Side, right: _Side) -> tuple[bool, int] | None:
    """(correct, end char) of the step 'left = right', or None when there is nothing to judge."""
    if left.value is None or not left.computes or not right.toks:
        return None
    if right.value is not None and left.value == right.value:
        return True, right.toks[-1].end
    if right.lead is not None:  # a bare result, or a run-on chain '12+34=46-5': judge the 46
        claim = next(t.value for t in right.toks if t.kind == "num").replace(",", "")
        return _close(left.value, claim, right.lead), right.lead_end
    if right.value is not None:
        return False, right.lead_end
    return None


def _run_steps(text: str, run: list[_Tok]) -> list[Step]:
    sides = [_side(p) for p in _split(run)]
    first, last = run[0], run[-1]
    if _incomplete_start(text, first):
        sides[0] = sides[0]._replace(value=None, lead=None)
    if last.end < len(text) and re.match(r"[A-Za-z_\\]", text[last.end]):  # '= 5x', '= 2\sqrt{3}'
        sides[-1] = sides[-1]._replace(value=None, lead=None)
    steps = []
    for left, right in zip(sides, sides[1:]):
        verdict = _judge(left, right)
        if verdict is not None:
            start = left.toks[0].start
            steps.append(Step(start, verdict[1], verdict[0], text[start:verdict[1]]))
    if steps and text[max(first.start - 2, 0):first.start] == "<<":
        visible = _annotation_result(text, last.end)
        if visible is not None:  # judge the result the reader sees, and end the step there
            start, _, ok, _ = steps[-1]
            shown = Fraction(visible[0].replace(",", ""))
            ok = (ok and sides[-1].value is not None
                  and _close(sides[-1].value, visible[0].replace(",", ""), shown))
            steps[-1] = Step(start, visible[1], ok, text[start:visible[1]])
    return steps


def check_steps(text: str) -> list[Step]:
    """Every arithmetic step written in `text`, in order, with its verdict.

    Args:
        text: a completion.

    Returns:
        One `Step` per equation judged; equations with a variable or a non-arithmetic side are
        left out.
    """
    steps: list[Step] = []
    for run in _runs(_tokens(text)):
        steps.extend(_run_steps(text, run))
    return steps


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix, by binary search over C-speed startswith."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_char_ends(tokenizer: Any, ids: list[int], skip_special_tokens: bool = True) -> list[int]:
    """Character end offset of each token in ``tokenizer.decode(ids, skip_special_tokens=...)``.

    Token t covers text[ends[t-1]:ends[t]], so the character at position c belongs to the first
    token with ends[t] > c: this is how a process reward maps a step's last character to the token
    that ends the step. Special tokens (absent from the text) cover nothing.

    Decoding tokens one at a time does not give the text (SentencePiece drops a leading space,
    byte-level BPE splits a character over tokens), so pieces come from incremental
    detokenization (decode a short window, keep what it adds) and are checked against the full
    text; where they disagree every prefix is decoded instead (exact, quadratic).

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens=...)`` (transformers or tokenizers).
        ids: the completion's token ids.
        skip_special_tokens: must match how the completion text was decoded.

    Returns:
        One non-decreasing offset per token; the last is ``len(text)``.
    """
    def decode(part: list[int]) -> str:
        return tokenizer.decode(list(part), skip_special_tokens=skip_special_tokens)

    full = decode(ids)
    ends: list[int] = []
    pieces: list[str] = []
    pos = prefix = read = 0
    for t in range(len(ids)):
        before, after = decode(ids[prefix:read]), decode(ids[prefix:t + 1])
        if len(after) > len(before) and after.startswith(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before):])
            pos += len(pieces[-1])
            prefix, read = read, t + 1
        ends.append(pos)
    if "".join(pieces) == full:
        return ends
    ends, best = [], 0
    for t in range(len(ids)):
        best = max(best, _common_prefix(decode(ids[:t + 1]), full))
        ends.append(best)
    if ends:
        ends[-1] = len(full)
    return ends
