"""The readings behind docs/experiments.md: histograms, gradient share, advantage noise, seed bands."""

import json
import math

import pytest
import torch

from grpokit.observe.experiment_plots import Panels
from grpokit.observe.experiments import (
    advantage_noise,
    cell_series,
    gradient_share,
    group_weight,
    pass_rate_histogram,
    seed_bands,
)
from grpokit.observe.metrics import length_stats
from grpokit.observe.tracking import group_rows
from grpokit.rollout.groups import Rollout


def _row(step, acc, adv_tokens=0.0):
    return {"step": step, "prompt_id": "p", "accuracy": acc, "adv_abs": adv_tokens / 10,
            "adv_abs_tokens": adv_tokens}


def test_pass_rate_histogram_counts_groups_by_correct_answers_in_the_window():
    history = [_row(1, 0.0), _row(1, 0.25), _row(2, 0.25), _row(2, 1.0), _row(9, 0.5),
               {"step": 2, "prompt_id": "x"}]
    hist = pass_rate_histogram(history, steps=(1, 2), group_size=4)
    assert hist == [0.25, 0.5, 0.0, 0.0, 0.25]   # 4 groups with an accuracy; step 9 outside the window
    assert all(math.isnan(v) for v in pass_rate_histogram(history, steps=(20, 30), group_size=4))


def test_gradient_share_is_the_share_of_advantage_weighted_tokens_per_bucket():
    history = [_row(1, 0.0, 0.0), _row(1, 0.25, 30.0), _row(2, 0.75, 10.0), _row(2, 1.0, 0.0)]
    share = gradient_share(history, steps=(1, 2), group_size=4)
    assert share == pytest.approx([0.0, 0.75, 0.0, 0.25, 0.0])
    assert gradient_share(history, steps=(1, 2), group_size=4, key="adv_abs") == pytest.approx(share)
    assert all(math.isnan(v) for v in gradient_share([_row(1, 0.0, 0.0)], steps=(1, 1), group_size=4))


def test_group_weight_is_a_groups_mean_signal_against_a_half_right_group():
    history = [_row(1, 0.25, 3.0), _row(1, 0.25, 5.0), _row(2, 0.5, 8.0), _row(2, 0.5, 8.0),
               _row(2, 1.0, 0.0)]
    weight = group_weight(history, steps=(1, 2), group_size=4)
    assert weight[1] == pytest.approx(0.5) and weight[2] == 1.0 and weight[4] == 0.0
    assert math.isnan(weight[0]) and math.isnan(weight[3])
    assert all(math.isnan(v) for v in group_weight(history[:2], steps=(1, 2), group_size=4))


def test_group_rows_record_where_the_advantage_goes():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    rollout = Rollout(prompt_ids=torch.zeros(4, 1, dtype=torch.long),
                      prompt_mask=torch.ones(4, 1, dtype=torch.long),
                      completion_ids=torch.zeros(4, 4, dtype=torch.long), completion_mask=mask,
                      group_ids=torch.tensor([0, 0, 1, 1]), completions=["a"] * 4,
                      prompts=["p", "p", "q", "q"], truncated=torch.zeros(4, dtype=torch.bool), group_size=2)
    adv = torch.tensor([0.5, -0.5, 2.0, -1.0])
    rows = group_rows(3, rollout, torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]), adv)
    assert [r["adv_abs"] for r in rows] == pytest.approx([1.0, 3.0])
    assert [r["adv_abs_tokens"] for r in rows] == pytest.approx([0.5 * 3 + 0.5 * 1, 2.0 * 2 + 1.0 * 4])
    assert "adv_abs" not in group_rows(3, rollout, torch.ones(4), None)[0]


def test_length_stats_split_by_correctness():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    out = length_stats(mask, torch.zeros(3, dtype=torch.bool), torch.tensor([1.0, 0.0, 0.0]))
    assert out["completion_length_correct"] == 3.0 and out["completion_length_wrong"] == 1.5
    none_right = length_stats(mask, torch.zeros(3, dtype=torch.bool), torch.zeros(3))
    assert math.isnan(none_right["completion_length_correct"])
    assert "completion_length_wrong" not in length_stats(mask, torch.zeros(3, dtype=torch.bool))


def test_advantage_noise_falls_with_group_size_and_vanishes_on_uniform_pools():
    g = torch.Generator().manual_seed(0)
    pass_rates = torch.linspace(0.1, 0.9, 32)[:, None]
    pool = (torch.rand(32, 128, generator=g) < pass_rates).float()
    out = advantage_noise(pool, group_sizes=(2, 8, 32), generator=g)
    assert out[2]["adv_rmse"] > out[8]["adv_rmse"] > out[32]["adv_rmse"]
    assert out[2]["frac_zero_std"] > out[8]["frac_zero_std"] > out[32]["frac_zero_std"]
    assert out[8]["mixed_prompts"] == 32
    flat = advantage_noise(torch.ones(4, 16), group_sizes=(4,), generator=g)[4]
    assert flat == {"adv_noise": 0.0, "adv_rmse": 0.0, "frac_zero_std": 1.0, "mixed_prompts": 0}
    unscaled = advantage_noise(pool, group_sizes=(8,), scale_rewards="none", generator=g)[8]
    assert unscaled["adv_noise"] < out[8]["adv_noise"]   # r - mean of 0/1 rewards is below (r - mean) / std
    with pytest.raises(ValueError, match="group sizes"):
        advantage_noise(pool, group_sizes=(128,))
    with pytest.raises(ValueError, match="scale_rewards"):
        advantage_noise(pool, group_sizes=(4,), scale_rewards="batch")


def test_advantage_noise_never_draws_the_anchor_as_its_own_mate():
    pool = torch.zeros(1, 5)
    pool[0, 0] = 1.0            # the only correct completion is the anchor: every group of 2 holds one 1
    out = advantage_noise(pool, group_sizes=(2,), anchors=1, resamples=50,
                          generator=torch.Generator().manual_seed(1))
    assert out[2]["frac_zero_std"] == 0.0 and out[2]["adv_noise"] == pytest.approx(0.0, abs=1e-6)


def _fake_cell(folder, seed, accs, B=4, G=2):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"rollout": {"prompts_per_step": B,
                                                                "num_generations": G}}))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "time/step": 0.5 + seed,
                    "frac_zero_std": s / 10}) + "\n" for s in range(1, 5)))
    (folder / "eval.jsonl").write_text("".join(
        json.dumps({"tag": t, "step": s,
                    "accuracy": a}) + "\n" for (t, s), a in zip([("before", 0), ("step2", 2),
                                                                                     ("after", 4)], accs)))


def test_seed_bands_align_seeds_and_map_steps_to_completions_and_seconds(tmp_path):
    _fake_cell(tmp_path / "a__seed-0", 0, [0.2, 0.4, 0.6])
    _fake_cell(tmp_path / "a__seed-1", 1, [0.2, 0.2, 0.8])
    rows = [{"variant": "a", "seed": s, "folder": f"a__seed-{s}"} for s in (0, 1)]
    band, = seed_bands(rows, tmp_path, "eval/accuracy", x="completions")
    assert band.label == "variant=a" and band.xs == [0.0, 16.0, 32.0]
    assert band.mean == pytest.approx([0.2, 0.3, 0.7]) and band.lo == pytest.approx([0.2, 0.2, 0.6])
    xs, _ = cell_series(tmp_path / "a__seed-1", "eval/accuracy", x="seconds")
    assert xs == [0.0, 3.0, 6.0]                      # 1.5 s a step
    _, smooth = cell_series(tmp_path / "a__seed-0", "frac_zero_std", window=2)
    assert smooth == pytest.approx([0.1, 0.15, 0.25, 0.35])
    with pytest.raises(ValueError, match="x must be"):
        cell_series(tmp_path / "a__seed-0", "frac_zero_std", x="tokens")
    png = Panels(title="t", columns=2)
    png.curves([band], title="acc", xlabel="completions", ylabel="accuracy", percent=True)
    png.bars({"a": [0.1, float("nan")]}, categories=["x", "y"], title="share", ylabel="share")
    path = png.save(tmp_path / "out" / "fig.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "experiments.py"
    spec = importlib.util.spec_from_file_location("experiments_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_experiment_report_runs_on_a_tiny_sweep(tmp_path, monkeypatch):
    """scripts/experiments.py's six reports draw a PNG and a table from a real (tiny) sweep's folders."""
    import yaml

    from grpokit.cli.sweep import prepare, run_sweep

    spec = {"name": "tiny", "output_dir": str(tmp_path / "out"),
            "base": {"overrides": {"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
                                   "rollout.max_completion_length": 6, "run.max_steps": 3,
                                   "run.eval_limit": 4, "run.eval_steps": 2, "run.track_prompts": True,
                                   "run.progress": False}},
            "axes": {"rollout.num_generations": [2, 8]}, "seeds": [0]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sweep, cells = prepare(tmp_path / "sweep.yaml")
    run_sweep(sweep, cells, say=lambda line: None)
    script = _script()
    monkeypatch.setattr(script, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(script, "POOL_PROMPTS", 3)
    monkeypatch.setattr(script, "POOL_SIZE", 12)
    (tmp_path / "results").mkdir()
    rows = script.sweep_rows(tmp_path / "out")
    for name in script.EXPERIMENTS:
        fig, table, _ = getattr(script, f"report_{name}")(tmp_path / "out", rows)
        assert fig.save(tmp_path / "figs" / f"{name}.png").stat().st_size > 5_000
        assert table.startswith("| ") and "rollout.num_generations" not in table
        assert table.count("\n") >= 3, name                               # header, rule, one line per cell
    noise = json.loads((tmp_path / "results" / "k_noise.json").read_text())
    assert set(noise) == {"start", "after_G8_seed0"} and set(noise["start"]["group"]) == {"2", "8"}


def test_reports_without_a_finished_sweep_are_one_line_errors(tmp_path, monkeypatch, capsys):
    from grpokit.errors import UserError
    from grpokit.observe.experiments import sweep_rows

    with pytest.raises(UserError, match="run the sweep first"):
        sweep_rows(tmp_path / "nothing")
    monkeypatch.chdir(tmp_path)                       # not the repository root: no configs/sweeps here
    script = _script()
    assert script.run_command(script.main, ["k", "--report"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: configs/sweeps/k.yaml not found")
