"""Regenerate the generated parts of docs/coming_from_trl.md (the field-by-field table and the refused count)
from grpokit/trl/fields.py, through the pages' renderer (scripts/update_readme.py writes them with the rest).

    python scripts/update_trl_docs.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pages.blocks import BLOCKS  # noqa: E402  (scripts/pages/: the specs)
from pages.render import write_pages  # noqa: E402

if __name__ == "__main__":
    changed = write_pages([b for b in BLOCKS if b.page == "docs/coming_from_trl.md"])
    print("updated" if changed else "up to date")
