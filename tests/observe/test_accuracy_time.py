"""Held-out accuracy against training seconds: the sums, the first crossing, the table and the figure."""

import json

import pytest

from grpokit.cli.main import main as cli_main
from grpokit.observe.accuracy_time import eval_seconds, summary_lines, time_to
from grpokit.observe.plots import Run


def run_folder(path, seconds_per_step, accuracies, eval_steps):
    """A run folder: metrics.jsonl with time/step, eval.jsonl with accuracy at the given steps."""
    path.mkdir()
    steps = len(seconds_per_step)
    (path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s + 1, "time/step": t, "reward_mean": 0.5}) + "\n"
        for s, t in enumerate(seconds_per_step)))
    (path / "eval.jsonl").write_text("".join(
        json.dumps({"tag": "before" if s == 0 else ("after" if s == steps else f"step{s}"), "step": s,
                    "accuracy": a}) + "\n" for s, a in zip(eval_steps, accuracies)))
    return path


def test_an_evaluation_sits_at_the_summed_seconds_of_the_steps_before_it():
    metrics = [{"step": 1, "time/step": 2.0}, {"step": 2, "time/step": 3.0}, {"step": 3, "time/step": 5.0},
               {"step": 2, "time/step": 4.0}]          # step 2 logged again after a resume: the last counts
    evals = [{"step": 3, "accuracy": 0.9}, {"step": 0, "accuracy": 0.2}, {"step": 2, "accuracy": 0.5},
             {"step": 1, "reward_mean": 1.0}]          # a row without accuracy is not a point
    assert eval_seconds(metrics, evals) == [(0.0, 0.2), (6.0, 0.5), (11.0, 0.9)]


def test_time_to_target_is_the_first_crossing_or_none():
    points = [(0.0, 0.2), (6.0, 0.96), (11.0, 0.9), (20.0, 0.99)]
    assert time_to(points, 0.95) == 6.0          # the first evaluation at or above, not the last
    assert time_to(points, 0.2) == 0.0
    assert time_to(points, 0.995) is None


def test_summary_names_each_runs_time_and_the_ratio_to_the_first():
    fast = Run("grpokit", [{"step": s, "time/step": 10.0} for s in range(1, 5)],
               [{"step": 0, "accuracy": 0.2}, {"step": 2, "accuracy": 0.97}, {"step": 4, "accuracy": 0.99}])
    slow = Run("trl", [{"step": s, "time/step": 40.0} for s in range(1, 5)],
               [{"step": 0, "accuracy": 0.2}, {"step": 4, "accuracy": 0.96}])
    never = Run("other", [{"step": 1, "time/step": 1.0}], [{"step": 1, "accuracy": 0.5}])
    lines = summary_lines([fast, slow, never], 0.95)
    assert lines[0] == "grpokit: 95% held-out after 20 s of training (best 99.0%, last 99.0%)"
    assert lines[1] == ("trl: 95% held-out after 160 s of training (best 96.0%, last 96.0%); "
                        "8.00x the first run's time")
    assert lines[2] == "other: never reached 95% in 1 s (best 50.0%, last 50.0%)"


def test_plot_target_draws_the_figure_and_prints_the_times(tmp_path, capsys):
    a = run_folder(tmp_path / "a", [10.0] * 4, [0.2, 0.6, 0.96], [0, 2, 4])
    b = run_folder(tmp_path / "b", [30.0] * 4, [0.2, 0.5, 0.7], [0, 2, 4])
    assert cli_main(["plot", str(a), str(b), "--out", str(tmp_path / "cmp"), "--target", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "a: 95% held-out after 40 s of training" in out and "b: never reached 95% in 120 s" in out
    assert (tmp_path / "cmp" / "time_to_accuracy.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("target", ["0", "1.5", "-0.2"])
def test_a_target_outside_0_1_is_a_one_line_error(tmp_path, capsys, target):
    a = run_folder(tmp_path / "a", [1.0], [0.5], [1])
    with pytest.raises(SystemExit) as e:
        cli_main(["plot", str(a), "--target", target])
    assert e.value.code == 2 and "--target must be an accuracy in (0, 1]" in capsys.readouterr().err


def test_the_accuracy_axis_zooms_in_on_low_curves():
    from grpokit.observe.accuracy_time import y_range

    assert y_range([0.2, 0.95], None) == (-0.03, 1.03)
    assert y_range([0.01, 0.012], 0.95) == (-0.03, 1.03)                 # the target stays in view
    low, high = y_range([0.010, 0.008, 0.012], None)                      # GSM8K at 135M
    assert high == pytest.approx(0.0156) and low < 0 < 0.012 < high
    assert y_range([], None)[1] > 0                                       # no points: still a valid range
