"""`grpokit sweep SWEEP.yaml`: a grid of training runs over seeds, resumable, one table and one plot.

    grpokit sweep configs/sweeps/k.yaml             # run every cell not yet finished
    grpokit sweep configs/sweeps/k.yaml --dry-run   # list the cells and their state, run nothing
    grpokit sweep configs/sweeps/k.yaml --max-cells 2

The sweep file (format: `grpokit.config.sweep_spec`) is checked and every cell's config built before the
first cell starts, so a malformed file is one line and exit 2 with nothing run. Each cell is a normal
`train_grpo` run (in this process, one after another) into <output_dir>/<labels>__seed-<s>.

Resume: `sweep_cell.json` is written into a cell's folder after its final model, so a kill at any
moment leaves a cell either finished (skipped next time, never re-run) or not. An unfinished cell
with a checkpoint (run.save_steps > 0) resumes from it; one without restarts from step 0 (its
folder's partial run replaced). A finished cell whose config no longer matches the sweep file stops
the sweep with an error instead of mixing two configs in one table.

Several processes may run one sweep file at once (e.g. one per core with OMP_NUM_THREADS=1): each
claims a cell before running it (`.<cell>.claim` beside the cell folder, created exclusively, holding
its PID) and skips cells a live process holds; a claim left by a dead process is taken over.

After each cell: results.csv / results.json (`grpokit.observe.sweep_results`) rewritten, one progress line
(cells done / total, elapsed, ETA from the mean time of the cells run so far); at the end the PNG
<output_dir>/<name>.png.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpokit.config.run_config import demo_config
from grpokit.config.schema import GRPOConfig
from grpokit.config.sweep_spec import Cell, Sweep, expand, load_sweep
from grpokit.errors import UserError, check_out_dir, write_text_aside
from grpokit.observe.sweep_results import DONE_FILE, cell_row, sweep_plot, write_table
from grpokit.train.loop import train_grpo
from grpokit.train.run_dir import list_checkpoints

_VOLATILE = ("resume", "overwrite", "progress")  # run keys that may differ between attempts of one cell


def _comparable(cfg: GRPOConfig) -> dict[str, Any]:
    tree = json.loads(json.dumps(cfg.to_dict()))
    for key in _VOLATILE:
        tree["run"].pop(key, None)
    return tree


def is_done(cell: Cell) -> bool:
    """The cell's run finished: its done marker (written after the final model) is there."""
    return (cell.folder / DONE_FILE).is_file() and (cell.folder / "final").is_dir()


def check_finished(cells: list[Cell]) -> None:
    """Refuse finished cells whose recorded config differs from the sweep file's (edited since)."""
    for cell in cells:
        if not is_done(cell):
            continue
        done = json.loads((cell.folder / DONE_FILE).read_text(encoding="utf-8"))
        if done.get("config") != _comparable(cell.cfg):
            old, new = done.get("config") or {}, _comparable(cell.cfg)
            diff = [f"{s}.{k}" for s in new if isinstance(new[s], dict) for k in new[s]
                    if old.get(s, {}).get(k) != new[s][k]]
            changed = ", ".join(diff[:4]) or "keys"
            raise UserError(f"cell {cell.folder} finished with another config ({changed} "
                            "changed): delete that folder to rerun it, or give the sweep another output_dir")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # exists, owned by someone else
        return True
    return True


def claim(cell: Cell) -> Path | None:
    """Claim a cell for this process: the claim file's path, or None when a live process holds it."""
    path = cell.folder.parent / f".{cell.folder.name}.claim"
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid == os.getpid():                         # this process's earlier attempt (interrupted)
                return path
            if pid and _alive(pid):
                return None
            path.unlink(missing_ok=True)                   # its process died: take the cell over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return path
    return None


def _prepare_attempt(cell: Cell) -> bool:
    """Set run.resume / run.overwrite for a cell's attempt; True when it continues a checkpoint."""
    resumed = bool(list_checkpoints(cell.folder))
    cell.cfg.run.resume = resumed
    cell.cfg.run.overwrite = not resumed and cell.folder.exists()
    return resumed


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_sweep(sweep: Sweep, cells: list[Cell], *, train: Callable[[GRPOConfig], Any] | None = None,
              max_cells: int | None = None, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the unfinished cells in order (at most max_cells of them); return the results rows.

    Args:
        sweep: the checked sweep file (`load_sweep`).
        cells: its expanded grid (`expand`).
        train: fn(cfg) that runs one cell; default `grpokit.train.loop.train_grpo`.
        max_cells: stop after this many cells were run (None: all).
        say: where the progress lines go.
    """
    train = train or train_grpo
    check_finished(cells)
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    rows = {c.folder: cell_row(c.folder, c.labels, c.seed) for c in cells if is_done(c)}
    todo = [c for c in cells if not is_done(c)][:max_cells]
    start, spent = time.monotonic(), []
    say(f"sweep {sweep.name}: {len(cells)} cells, {len(rows)} finished before, {len(todo)} to run now")
    for cell in todo:
        held = claim(cell)
        if held is None or is_done(cell):               # another process runs it, or just finished it
            say(f"sweep {sweep.name}: cell {cell.folder.name} is run by another process, skipped")
            if held is not None:
                held.unlink(missing_ok=True)
            continue
        resumed = _prepare_attempt(cell)
        note = " (resuming its checkpoint)" if resumed else ""
        say(f"sweep {sweep.name}: cell {cell.folder.name}{note}")
        t0 = time.monotonic()
        train(cell.cfg)
        wall = time.monotonic() - t0
        done = {"labels": cell.labels, "seed": cell.seed, "wall_s": round(wall, 2), "resumed": resumed,
                "config": _comparable(cell.cfg)}
        write_text_aside(cell.folder / DONE_FILE, json.dumps(done, indent=1) + "\n")  # last: the cell is done
        held.unlink(missing_ok=True)
        rows[cell.folder] = cell_row(cell.folder, cell.labels, cell.seed)
        write_table([rows[c.folder] for c in cells if c.folder in rows], sweep.output_dir)
        spent.append(wall)
        left = len(cells) - len(rows)
        eta = f", ETA {_clock(left * sum(spent) / len(spent))}" if left else ""
        say(f"sweep {sweep.name}: {len(rows)}/{len(cells)} cells done, elapsed "
            f"{_clock(time.monotonic() - start)}{eta}")
    rows.update({c.folder: cell_row(c.folder, c.labels, c.seed) for c in cells
                 if c.folder not in rows and is_done(c)})  # cells other processes finished meanwhile
    ordered = [rows[c.folder] for c in cells if c.folder in rows]
    if ordered:
        write_table(ordered, sweep.output_dir)
        x_values = list(sweep.variants) if sweep.variants else (next(iter(sweep.axes.values()))
                                                                if sweep.axes else [])
        png = sweep_plot(ordered, name=sweep.name, label_keys=sweep.label_keys,
                         x_values=x_values or ["all seeds"], metrics=sweep.plot,
                         path=sweep.output_dir / f"{sweep.name}.png")
        say(f"sweep {sweep.name}: table {sweep.output_dir / 'results.csv'}, plot {png}")
    return ordered


def prepare(path: str | Path) -> tuple[Sweep, list[Cell]]:
    """Load, check and expand a sweep file, and check its finished cells: every error before any run."""
    sweep = load_sweep(path)
    check_out_dir(sweep.output_dir, "output_dir")
    cells = expand(sweep, demo_config)
    check_finished(cells)
    return sweep, cells


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit sweep", description="Run a grid of GRPO configs over seeds.")
    p.add_argument("sweep", help="the sweep YAML file (base, axes / variants, derived, seeds, output_dir)")
    p.add_argument("--dry-run", action="store_true", help="list the cells and whether each is finished")
    p.add_argument("--max-cells", type=int, default=None, help="run at most this many unfinished cells")
    args = p.parse_args(argv)
    if args.max_cells is not None and args.max_cells < 1:
        raise UserError(f"--max-cells must be at least 1, got {args.max_cells}: or leave it out to run all")
    sweep, cells = prepare(args.sweep)
    if args.dry_run:
        for cell in cells:
            state = "finished" if is_done(cell) else "to run"
            print(f"{cell.folder}  {state}  max_steps={cell.cfg.run.max_steps}", flush=True)
        print(f"sweep {sweep.name}: {len(cells)} cells", flush=True)
        return 0
    run_sweep(sweep, cells, max_cells=args.max_cells, say=lambda line: print(line, flush=True))
    return 0
