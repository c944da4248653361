"""Regenerate README.md's config reference from the typed config (tests/cli/test_readme.py checks it)."""

import re
import sys
from pathlib import Path

from grpokit.config.schema import config_reference

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def render(readme: str) -> str:
    block = f"{START}\n{config_reference()}\n{END}"
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "README.md")
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"updated {path}")
