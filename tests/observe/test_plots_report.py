"""`grpokit plot` and `grpokit report` on synthetic run folders (no training needed, no network)."""

import base64
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from grpokit.cli.main import main as cli_main
from grpokit.observe.metrics import PHASES
from grpokit.observe.plots import ema, load_runs, phase_series, plot_run
from grpokit.observe.report import build_report, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = {"reward.png", "zero_std.png", "kl_clip.png", "length.png", "training.png", "time.png",
           "time_to_accuracy.png"}  # the last: the fake runs have held-out evaluations


def fake_run(folder: Path, steps: int = 30, rate: float = 0.08, G: int = 8) -> Path:
    """A run folder shaped like train_grpo's output: metrics.jsonl with every logged key, eval.jsonl,
    completions.jsonl, prompt_summary.json, config.json. Reward rises like a logistic curve."""
    folder.mkdir(parents=True)
    rows = []
    for s in range(1, steps + 1):
        acc = 1 / (1 + math.exp(-rate * (s - steps / 2)))
        times = {"generate": 1.0 + 0.01 * s, "reward": 0.05, "ref_forward": 0.2, "advantage": 0.001,
                 "update": 0.6, "save": 0.3 if s % 10 == 0 else 0.0, "log": 0.02}
        row = {"step": s, "reward_mean": acc, "reward_std": 0.4, "reward_group_std_mean": 0.3,
               "accuracy": acc, "frac_zero_std": 0.2 + 0.5 * acc * acc, "frac_graduated": 0.5 * acc * acc,
               "frac_stuck": 0.2 * (1 - acc), "rewards/rule": acc, "rewards/format": 0.5 + 0.5 * acc,
               "advantage_mean": 0.0, "advantage_std": 0.9,
               "advantage_min": -2.0, "advantage_max": 2.0, "loss": 0.01 / s, "policy_loss": 0.008 / s,
               "approx_kl": 0.001 * s, "mean_ratio": 1.0, "clip_ratio_low": 0.001 * s,
               "clip_ratio_high": 0.002 * s,
               "clip_ratio": 0.003 * s, "entropy": 2.0 - acc, "grad_norm": 0.5, "learning_rate": 5e-4,
               "completion_length_mean": 20 - 5 * acc, "completion_length_min": 3.0,
               "completion_length_max": 24.0,
               "frac_truncated": 0.3 * (1 - acc), "completion_tokens": 2000.0, "time/optimizer": 0.05,
               **{f"time/{k}": v for k, v in times.items()}, "peak_rss_mib": 500.0}
        row["time/step"] = sum(times.values()) + 0.01
        row["tokens_per_s"] = 2000.0 / row["time/step"]
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"tag": "before", "step": 0, "accuracy": 0.1, "reward_mean": 0.1},
             {"tag": "after", "step": steps, "accuracy": 0.7, "reward_mean": 0.7}]
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    entries = [{"step": s, "prompt_id": f"p{s}", "prompt": f"What is {s}+1? <b>&", "answer": str(s + 1),
                "reward_mean": 0.5, "reward_std": 0.53,
                "completions": [{"text": f"\\boxed{{{s + 1 - (i % 2)}}}", "reward": float(i % 2 == 0),
                                 "advantage": 0.94 if i % 2 == 0 else -0.94,
                                 "rewards": {"rule": float(i % 2 == 0)},
                                 "length": 9, "truncated": i == 3} for i in range(G)]}
               for s in (10, steps)]
    (folder / "completions.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (folder / "config.json").write_text(json.dumps({"run": {"max_steps": steps}, "loss": {"beta": 0.04}}))
    return folder


def assert_png(path: Path, min_size=(300, 200)) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] >= min_size[0] and im.size[1] >= min_size[1], im.size


def test_ema_matches_tensorboard_debiased_smoothing():
    # w = 0.5: s1 = 0.5*1 -> /0.5 = 1 ; s2 = 0.25 + 0.5*3 = 1.75 -> /0.75 = 7/3
    assert ema([1.0, 3.0], 0.5) == pytest.approx([1.0, 7 / 3])
    assert ema([1.0, 3.0], 0.0) == [1.0, 3.0]
    out = ema([1.0, float("nan"), 3.0], 0.5)
    assert math.isnan(out[1]) and out[2] == pytest.approx(7 / 3)


def test_phase_stack_adds_up_to_step_time(tmp_path):
    run = load_runs([fake_run(tmp_path / "a", steps=12)])[0]
    stack = phase_series(run)
    assert "optimizer" in stack and "update (rest)" in stack and "update" not in stack
    for i, row in enumerate(run.metrics):
        assert sum(v[i] for v in stack.values()) == pytest.approx(row["time/step"])
        assert stack["other"][i] == pytest.approx(0.01)
    assert set(PHASES) >= {"generate", "reward", "ref_forward", "update", "save", "log"}


def test_plot_one_run_and_two_overlaid(tmp_path):
    a, b = fake_run(tmp_path / "run_a"), fake_run(tmp_path / "run_b", rate=0.2)
    one = plot_run(a)
    assert {p.name for p in one} == FIGURES and all(p.parent == a / "plots" for p in one)
    for p in one:
        assert_png(p)
    assert cli_main(["plot", str(a), str(b), "--out", str(tmp_path / "cmp"), "--smooth", "0.3"]) == 0
    two = sorted((tmp_path / "cmp").glob("*.png"))
    assert {p.name for p in two} == FIGURES
    for p in two:
        assert_png(p)
    with Image.open(tmp_path / "cmp" / "time.png") as im:  # one stacked panel per run + throughput
        assert im.size[0] > Image.open(a / "plots" / "time.png").size[0]


def test_plot_errors_are_one_line(tmp_path, capsys):
    assert cli_main(["plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no metrics.jsonl" in err and "\n" not in err
    fake_run(tmp_path / "a", steps=3)
    assert cli_main(["plot", str(tmp_path / "a"), "--smooth", "1.5"]) == 2
    assert "smoothing must be in [0, 1)" in capsys.readouterr().err


def test_report_is_self_contained_with_plots_eval_and_completions(tmp_path):
    run = fake_run(tmp_path / "run")
    page = build_report(run)
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == len(FIGURES)
    for b64 in images:
        assert base64.b64decode(b64)[:8] == PNG_MAGIC
    # nothing is fetched: no http(s) references, no external scripts or stylesheets
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", page) and "<script" not in page
    assert "after − before" in page and "+0.6" in page          # eval delta 0.7 - 0.1
    assert "What is 10+1? &lt;b&gt;&amp;" in page                 # prompts are escaped
    assert page.count("class='pos'") == 8 and page.count("class='neg'") == 8  # 2 steps x 4 each
    assert "<b>30</b>" in page                                    # run.max_steps differs from the default
    path = write_report(run)
    assert path == run / "report.html" and path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_report_cli_without_optional_files(tmp_path, capsys):
    run = fake_run(tmp_path / "bare", steps=4)
    for name in ("eval.jsonl", "completions.jsonl", "config.json"):
        (run / name).unlink()
    assert cli_main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "run.eval_limit was 0" in page and "run.log_completions_steps" in page
    assert "r.html" in capsys.readouterr().out


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="no chromium")
def test_report_renders_in_headless_chromium(tmp_path):
    """The page loads in a real browser and every image decodes (naturalWidth > 0)."""
    page = write_report(fake_run(tmp_path / "run"))
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    probe = tmp_path / "probe.html"  # the report plus a script that prints how many images decoded
    probe.write_text(page.read_text(encoding="utf-8").replace(
        "</body>", "<script>window.onload=()=>{const im=[...document.images];document.title="
        "'decoded '+im.filter(i=>i.complete&&i.naturalWidth>0).length+'/'+im.length}</script></body>"),
        encoding="utf-8")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-background-networking",
                          "--disable-component-update", "--disable-sync", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probe.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert f"<title>decoded {len(FIGURES)}/{len(FIGURES)}</title>" in out.stdout, out.stderr[-2000:]


def test_a_learned_reward_gets_the_reward_vs_verified_figure(tmp_path):
    from grpokit.observe.plots import LEARNED_VS_VERIFIED, figures

    run = fake_run(tmp_path / "rm_run")
    assert "reward_vs_verified" not in figures(load_runs([run]))          # rule rewards only: no such figure
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["rewards/rm:runs/rm"] = r.pop("rewards/rule")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figs = figures(load_runs([run]))
    assert "reward_vs_verified" in figs
    labels = {t.get_text() for t in figs["reward_vs_verified"].axes[0].get_legend().get_texts()}
    assert any("rm" in label for label in labels) and any("verified" in label for label in labels)
    assert LEARNED_VS_VERIFIED.eval_key == "accuracy"
    assert "reward_vs_verified.png" in {p.name for p in plot_run(run)}


def test_code_rewards_get_the_sandbox_figure(tmp_path):
    from grpokit.observe.plots import figures

    run = fake_run(tmp_path / "code_run")
    assert "code" not in figures(load_runs([run]))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r.update({"code/passed": float(i), "code/failed": 2.0, "code/timeout": 1.0, "code/crash": 0.0,
                  "code/memory": 0.0, "code/output_too_large": 0.0, "code/no_program": 1.0,
                  "code/wall_s": 0.5, "code/sandbox_s": 0.9})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figs = figures(load_runs([run]))
    outcomes, times = figs["code"].axes[:2]
    assert [t.get_text() for t in outcomes.get_legend().get_texts()] == [
        "passed", "failed", "timeout", "crash", "memory", "output too large", "no program"]
    assert len(times.get_legend().get_texts()) == 2
    assert "code.png" in {p.name for p in plot_run(run)}
