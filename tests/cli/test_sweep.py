"""`grpokit sweep`: a 2x2 grid runs and writes its table and plot, a kill is resumed without redoing
finished cells, malformed sweep files are one-line errors before anything runs, the shipped sweeps expand."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from grpokit.cli.main import main
from grpokit.cli.sweep import prepare, run_sweep
from grpokit.train.loop import train_grpo

SWEEPS = Path(__file__).resolve().parents[2] / "configs" / "sweeps"
TINY = {"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
        "rollout.max_completion_length": 8, "run.max_steps": 2, "run.eval_limit": 4, "run.progress": False}


def write_sweep(tmp_path: Path, **fields) -> Path:
    spec = {"name": "tiny", "output_dir": str(tmp_path / "out"), "base": {"overrides": dict(TINY)},
            "axes": {"rollout.num_generations": [2, 4]}, "seeds": [0, 1], **fields}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Counter:
    """train(cfg) that records each cell it runs; raise_in names a cell interrupted after its first step."""

    def __init__(self, raise_in: str | None = None):
        self.ran: list[str] = []
        self.raise_in = raise_in

    def __call__(self, cfg):
        name = Path(cfg.run.output_dir).name
        self.ran.append(name)

        def kill(state, metrics):
            if name == self.raise_in and state.step == 1:
                raise KeyboardInterrupt("killed")

        return train_grpo(cfg, hooks={"after_step": kill})


def test_two_by_two_grid_runs_each_cell_and_writes_table_and_plot(tmp_path):
    sweep, cells = prepare(write_sweep(tmp_path))
    train = Counter()
    rows = run_sweep(sweep, cells, train=train, say=lambda line: None)
    names = ["num_generations-2__seed-0", "num_generations-2__seed-1", "num_generations-4__seed-0",
             "num_generations-4__seed-1"]
    assert train.ran == names
    out = tmp_path / "out"
    table = list(csv.DictReader((out / "results.csv").open()))
    assert [r["folder"] for r in table] == names
    assert [r["folder"] for r in json.loads((out / "results.json").read_text())] == names
    assert [(r["rollout.num_generations"], r["seed"]) for r in table] == [("2", "0"), ("2", "1"), ("4", "0"),
                                                                          ("4", "1")]
    for row in rows:
        assert row["steps"] == 2 and row["eval/num_problems"] == 4 and row["wall_s"] > 0
        assert 0.0 <= row["mean/frac_zero_std"] <= 1.0
        assert "eval/accuracy" in row and "mean/time/generate" in row
    assert (out / "tiny.png").stat().st_size > 10_000


def test_killed_sweep_resumes_skipping_finished_cells(tmp_path, capsys):
    path = write_sweep(tmp_path, base={"overrides": {**TINY, "run.save_steps": 1}})
    sweep, cells = prepare(path)
    first = Counter(raise_in="num_generations-2__seed-1")   # the kill lands in cell 2, after its step 1
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, cells, train=first, say=lambda line: None)
    assert first.ran == ["num_generations-2__seed-0", "num_generations-2__seed-1"]
    done = tmp_path / "out" / "num_generations-2__seed-0"
    stamps = {p: p.stat().st_mtime_ns for p in [done / "sweep_cell.json", *(done / "final").iterdir()]}
    half = tmp_path / "out" / "num_generations-2__seed-1"
    assert not (half / "sweep_cell.json").exists() and (half / "checkpoint-1").is_dir()

    sweep, cells = prepare(path)
    second = Counter()
    rows = run_sweep(sweep, cells, train=second, say=lambda line: None)
    assert second.ran == ["num_generations-2__seed-1", "num_generations-4__seed-0",
                          "num_generations-4__seed-1"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps           # the finished cell was not touched
    resumed = json.loads((half / "sweep_cell.json").read_text())
    assert resumed["resumed"] is True and [r["steps"] for r in rows] == [2, 2, 2, 2]
    assert [json.loads(line)["step"] for line in (half / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    assert main(["sweep", str(path)]) == 0                               # all finished: nothing runs
    assert "4 finished before, 0 to run now" in capsys.readouterr().out


def test_max_cells_stops_after_n_and_the_rerun_completes(tmp_path, capsys):
    path = write_sweep(tmp_path, axes={"rollout.num_generations": [2]})
    assert main(["sweep", str(path), "--max-cells", "1"]) == 0
    out = capsys.readouterr().out
    assert "1/2 cells done" in out and "ETA" in out
    first = (tmp_path / "out" / "num_generations-2__seed-0" / "sweep_cell.json").stat().st_mtime_ns
    assert main(["sweep", str(path)]) == 0
    assert "1 finished before, 1 to run now" in capsys.readouterr().out
    assert (tmp_path / "out" / "num_generations-2__seed-0" / "sweep_cell.json").stat().st_mtime_ns == first
    assert len(list(csv.DictReader((tmp_path / "out" / "results.csv").open()))) == 2


def test_finished_cell_with_another_config_is_refused(tmp_path, capsys):
    path = write_sweep(tmp_path, axes={"rollout.num_generations": [2]}, seeds=[0])
    assert main(["sweep", str(path)]) == 0
    capsys.readouterr()
    write_sweep(tmp_path, axes={"rollout.num_generations": [2]}, seeds=[0],
                base={"overrides": {**TINY, "optim.learning_rate": 0.5}})
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cell ") and "optim.learning_rate" in err and "\n" not in err


MALFORMED = [
    ({"axis": {"rollout.num_generations": [2]}}, "unknown key 'axis' (did you mean 'axes'?)"),
    ({"axes": {"rollout.num_generation": [2, 4]}}, "(did you mean 'rollout.num_generations'?)"),
    ({"axes": {}}, "'axes' must map config keys to lists of values"),
    ({"axes": {"rollout.num_generations": 4}}, "axis 'rollout.num_generations' must be a list of values"),
    ({"axes": {"rollout.num_generations": []}}, "axis 'rollout.num_generations' has no values"),
    ({"axes": {"run.seed": [0, 1]}}, "belongs to the sweep (list the seeds under 'seeds')"),
    ({"seeds": []}, "'seeds' must be a non-empty list of integers"),
    ({"derived": {"run.max_steps": "__import__('os').getcwd()"}}, "is not allowed"),
    ({"derived": {"run.max_steps": "8 // rollout.num_generatons"}}, "did you mean 'rollout.num_generations'"),
    ({"axes": {"loss.loss_type": ["grpo", "grpoo"]}}, "loss.loss_type"),
]


@pytest.mark.parametrize("fields,message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_sweep_is_one_line_exit_2_before_anything_runs(tmp_path, capsys, fields, message):
    path = write_sweep(tmp_path, **fields)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_bad_yaml_and_non_mapping_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes: {rollout.num_generations: [2, 4]\nseeds: [0]\n")
    assert main(["sweep", str(bad)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    bad.write_text("- 1\n- 2\n")
    assert main(["sweep", str(bad)]) == 2
    assert "must hold a mapping" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


SHIPPED = {"k": 15, "graduation": 3, "length": 12, "length_chain": 12, "std_scaling": 9, "all_wrong": 9,
           "grpo_vs_ppo": 6}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_sweep_parses_and_expands_to_its_grid(name):
    sweep, cells = prepare(SWEEPS / f"{name}.yaml")
    assert sweep.name == name and len(cells) == SHIPPED[name]
    assert len({c.folder for c in cells}) == len(cells)
    assert {c.cfg.run.seed for c in cells} == {0, 1, 2}
    if name == "k":  # an equal budget of sampled completions: B x G x steps constant
        budgets = {c.cfg.rollout.prompts_per_step * c.cfg.rollout.num_generations * c.cfg.run.max_steps
                   for c in cells}
        assert budgets == {25600}
        assert sorted({c.cfg.rollout.num_generations for c in cells}) == [2, 4, 8, 16, 32]
    if name == "all_wrong":
        assert {c.cfg.batch_size for c in cells} == {128} and {c.cfg.task.digits for c in cells} == {3}


def test_a_cell_claimed_by_a_live_process_is_skipped_and_a_dead_claim_taken_over(tmp_path):
    """Two `grpokit sweep` processes on one file share the grid: a live claim is left alone."""
    import subprocess
    import sys

    sweep, cells = prepare(write_sweep(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / f".{cells[0].folder.name}.claim").write_text(str(holder.pid))
        (tmp_path / "out" / f".{cells[1].folder.name}.claim").write_text(str(dead.pid))
        train, said = Counter(), []
        rows = run_sweep(sweep, cells, train=train, say=said.append)
        assert train.ran == [c.folder.name for c in cells[1:]]       # the live claim's cell is not run
        assert any("run by another process" in line for line in said)
        assert len(rows) == 3 and not list((tmp_path / "out").glob(f".{cells[1].folder.name}.claim"))
    finally:
        holder.kill()
        holder.wait()
    train = Counter()
    rows = run_sweep(sweep, cells, train=train, say=lambda line: None)  # the holder died: its cell now runs
    assert train.ran == [cells[0].folder.name] and len(rows) == 4
