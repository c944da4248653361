"""Regenerate every generated block of README.md and docs/*.md: the measured tables from their raw rows under
benchmarks/results/, the config reference and the TRL field tables from the code. Each block is a spec in
scripts/pages/ (one module per page or group of pages) rendered by the one renderer, scripts/pages/render.py;
tests/cli/test_readme.py checks every block against what its rows give.

    python scripts/update_readme.py            # rewrite the blocks that changed
    python scripts/update_readme.py --plots    # and draw docs/arith_race_seeds.png (needs matplotlib)
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pages import race  # noqa: E402  (scripts/pages/: the specs)
from pages.blocks import BLOCKS  # noqa: E402
from pages.render import ROOT, write_pages  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="Regenerate the generated blocks of README.md and "
                                                 "docs/*.md.")
    parser.add_argument("--plots", action="store_true", help="also draw docs/arith_race_seeds.png")
    args = parser.parse_args()
    changed = write_pages(BLOCKS)
    print(f"{len(BLOCKS)} blocks; updated: {', '.join(changed) or 'nothing (all up to date)'}")
    if args.plots:
        print(race.draw(ROOT / "docs" / "arith_race_seeds.png"))


if __name__ == "__main__":
    main()
