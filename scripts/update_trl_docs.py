"""Regenerate the generated parts of docs/coming_from_trl.md (the field-by-field table and the refused count)
from grpokit/trl/fields.py.

    python scripts/update_trl_docs.py
"""

from pathlib import Path

from grpokit.trl.fields import sync_docs

if __name__ == "__main__":
    page = Path(__file__).resolve().parents[1] / "docs" / "coming_from_trl.md"
    print("updated" if sync_docs(page) else "up to date")
