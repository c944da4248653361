"""The one way from raw rows to a page: a block spec names its rows, its columns and the sentence under them,
and `render` writes it between the block's markers (`<!-- NAME:start -->` ... `<!-- NAME:end -->`).

    Table(name="demo-seeds", rows=demo_rows, columns=(Column("seed", "{seed}"),
          Column("before", "{before:percent}")), note="Mean change {gain:points}.", figures=mean_gain)

A cell or a note is a template over one row's fields (a note: over `figures(rows)`), each field formatted
by name: percent (0.294 -> 29.4%), pct (29.4), points (0.366 -> +36.6 pt), signed (+36.6), ratio (1.31x),
seconds (140 s), plain; or by a Python format spec (`{x:.3f}`). A list field is formatted item by item
and joined with " / " (`{after:pct|, }` joins with ", "). No figure is written by hand: every one comes
from the rows the spec selects (scripts/update_readme.py writes the pages, tests/cli/test_readme.py checks).
"""

from __future__ import annotations

import re
import string
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FORMATS: dict[str, Callable[[float], str]] = {
    "percent": lambda x: f"{100 * x:.1f}%",     # a fraction as a percentage: 0.294 -> 29.4%
    "pct": lambda x: f"{100 * x:.1f}",          # the same without the sign, for lists: 66.0 / 69.4%
    "points": lambda x: f"{100 * x:+.1f} pt",   # a change of a fraction in points: 0.366 -> +36.6 pt
    "signed": lambda x: f"{100 * x:+.1f}",      # the same without the unit
    "ratio": lambda x: f"{x:.2f}x",             # 1.3127 -> 1.31x
    "seconds": lambda x: f"{x:.0f} s",          # 140.3 -> 140 s
    "plain": str,
}


class _Fields(string.Formatter):
    """str.format with the named formats above and list fields joined."""

    def format_field(self, value, format_spec: str) -> str:
        spec, _, sep = format_spec.partition("|")
        if isinstance(value, list | tuple):
            return (sep or " / ").join(self.format_field(v, spec) for v in value)
        if spec in FORMATS:
            return FORMATS[spec](value)
        return format(value, spec)


_FIELDS = _Fields()


def fill(template: str, values: dict) -> str:
    """`template` with its fields taken from `values` and formatted by name (see the module docstring)."""
    return _FIELDS.vformat(template, (), values)


@dataclass(frozen=True)
class Column:
    """One column: its header and the template of its cells (over each row's fields)."""

    header: str
    cell: str


@dataclass(frozen=True)
class Table:
    """A markdown table: one line per row of `rows()`, then `note` (filled from `figures(rows)`) under it.

    `columns` may be a function of the rows where the headers depend on them (a step per column)."""

    rows: Callable[[], list[dict]]
    columns: Sequence[Column] | Callable[[list[dict]], Sequence[Column]]
    note: str = ""
    figures: Callable[[list[dict]], dict] | None = None
    title: str = ""  # a line above the table (a heading or a sentence), a template too

    def text(self, context: dict) -> str:
        rows = self.rows()
        columns = self.columns(rows) if callable(self.columns) else self.columns
        lines = [_line(c.header for c in columns), "|" + "---|" * len(columns)]
        lines += [_line(fill(c.cell, {**context, **r}) for c in columns) for r in rows]
        figures = {**context, **(self.figures(rows) if self.figures else {})}
        out = "\n".join(lines)
        if self.title:
            out = fill(self.title, figures) + "\n\n" + out
        return out + ("\n\n" + fill(self.note, figures) if self.note else "")


@dataclass(frozen=True)
class Text:
    """A paragraph (or a code block): `template` filled from `figures()`."""

    template: str
    figures: Callable[[], dict] = dict
    wrap: int = 0  # > 0: the paragraph refilled to lines of at most this width

    def text(self, context: dict) -> str:
        out = fill(self.template, {**context, **self.figures()})
        return textwrap.fill(out, width=self.wrap) if self.wrap else out


Part = Table | Text


@dataclass(frozen=True)
class Block:
    """A generated block of `page`: its parts (or a function giving them, where the raw files decide how
    many), joined by a blank line, between the markers of `name`. `context`: fields every template of
    the block may use beside the rows' own (a page's relative link prefix)."""

    page: str
    name: str
    parts: Sequence[Part] | Callable[[], Sequence[Part]]
    context: dict = field(default_factory=dict)

    def body(self) -> str:
        parts = self.parts() if callable(self.parts) else self.parts
        return "\n\n".join(p.text(self.context) for p in parts)


def _line(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def render(text: str, block: Block) -> str:
    """`text` with `block`'s body written between its markers; a page without them is an error."""
    start, end = markers(block.name)
    if start not in text or end not in text:
        raise ValueError(f"{block.page} has lost the markers of {block.name}: put `{start}` ... `{end}` back")
    body = block.body()
    return re.sub(
        re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text, flags=re.S
    )


def render_page(page: str, text: str, blocks: Sequence[Block]) -> str:
    """`text` (the page `page`) with every block of `blocks` that belongs to it regenerated."""
    for block in blocks:
        if block.page == page:
            text = render(text, block)
    return text


def write_pages(blocks: Sequence[Block], root: Path = ROOT) -> list[str]:
    """Regenerate every page `blocks` names; the pages that changed."""
    changed = []
    for page in dict.fromkeys(b.page for b in blocks):
        path = root / page
        old = path.read_text(encoding="utf-8")
        new = render_page(page, old, blocks)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def headline_row(what: str, result: str, page: str, file: str, raw: str = "", **figures) -> dict:
    """One row of the headline table (README.md and docs/index.md): `what` and `result` filled from
    `figures`; `page` and `file` the doc page it links (relative to docs/), `raw` the raw files it names."""
    return {
        "what": fill(what, figures), "result": fill(result, figures), "page": page, "file": file,
        "raw": f", `benchmarks/results/{raw}`" if raw else "",
    }
