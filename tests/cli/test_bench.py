"""`grpokit bench`: the figures it prints and the comparison line (timings are printed, never asserted)."""

import json
import subprocess
import sys

import pytest

from grpokit.cli import bench


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpokit.cli.bench", *args], capture_output=True,
                          text=True, timeout=600)


def test_bench_prints_one_json_line_with_the_phases_and_equal_work():
    proc = _run("--size", "tiny", "--completion-length", "4", "--fixed-length", "--steps", "2",
                "--warmup", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["side"] == "grpokit"
    assert out["completion_tokens"] == 4 * 8 * 4                  # B x G x T with EOS blocked
    assert out["micro_batch_size"] == 0                           # the whole batch per pass
    assert set(out["phases_s"]) == set(bench.PHASES)
    assert out["s_per_step"] > 0 and out["peak_rss_mib"] > 0 and len(out["all_steps_s"]) == 2
    assert 0 < out["peak_fraction"] and out["matmul_peak_gflops"] > 0


def test_micro_batch_size_reaches_the_update_and_is_checked():
    args = bench.parse_args(["--size", "tiny", "--micro-batch-size", "8"])
    state, _ = bench.bench_state(args)
    assert state.cfg.optim.micro_batch_size == 8
    proc = _run("--micro-batch-size", "5")                        # B x G = 32
    assert proc.returncode == 2 and "--micro-batch-size must be 0 or divide B x G = 32" in proc.stderr


def test_compare_line_takes_the_median_ratio_over_rounds():
    ours = [{"s_per_step": 1.0, "peak_rss_mib": 10, "completion_tokens": 8},
            {"s_per_step": 2.0, "peak_rss_mib": 12, "completion_tokens": 8},
            {"s_per_step": 1.0, "peak_rss_mib": 11, "completion_tokens": 8}]
    trl = [{"s_per_step": 3.0, "peak_rss_mib": 20, "completion_tokens": 8},
           {"s_per_step": 2.0, "peak_rss_mib": 21, "completion_tokens": 8},
           {"s_per_step": 1.5, "peak_rss_mib": 19, "completion_tokens": 8}]
    out = bench.compare(ours, trl)
    assert out["ratios_per_round"] == [3.0, 1.0, 1.5]
    assert out["ratio_trl_over_grpokit_s_per_step"] == 1.5       # median of the per-round ratios
    assert out["grpokit_s_per_step"] == 1.0 and out["trl_s_per_step"] == 2.0
    assert out["rss_grpokit_mib"] == 12 and out["rss_trl_mib"] == 21   # the largest peak of each side
    assert "ratios_per_round" not in bench.compare(ours[:1], trl[:1])


def test_rounds_is_stripped_from_the_sides_arguments_and_checked():
    assert bench._without_option(["--size", "tiny", "--rounds", "3", "--steps", "2"], "--rounds") == \
        ["--size", "tiny", "--steps", "2"]
    assert bench._without_option(["--rounds=3", "--fixed-length"], "--rounds") == ["--fixed-length"]
    proc = _run("--rounds", "0")
    assert proc.returncode == 2 and "--rounds must be >= 1" in proc.stderr
    proc = _run("--rounds", "2")
    assert proc.returncode == 2 and "add --compare-trl" in proc.stderr


def test_compare_trl_alternates_sides_and_counts_equal_tokens():
    pytest.importorskip("trl")
    proc = _run("--size", "tiny", "--completion-length", "4", "--fixed-length", "--steps", "2",
                "--warmup", "1", "--compare-trl", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in proc.stdout.strip().splitlines()]
    assert [(d["side"], d["round"]) for d in lines[:4]] == [("grpokit", 1), ("trl", 1),
                                                            ("trl", 2), ("grpokit", 2)]
    last = lines[-1]
    assert last["tokens_grpokit"] == last["tokens_trl"] == 4 * 8 * 4
    assert len(last["ratios_per_round"]) == 2 and last["ratio_trl_over_grpokit_s_per_step"] > 0


def test_compare_trl_gives_trl_the_same_micro_batches():
    pytest.importorskip("trl")
    proc = _run("--size", "tiny", "--completion-length", "4", "--fixed-length", "--steps", "2",
                "--warmup", "1", "--compare-trl", "--micro-batch-size", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    grpokit, trl, last = [json.loads(x) for x in proc.stdout.strip().splitlines()]
    assert grpokit["micro_batch_size"] == trl["micro_batch_size"] == 8
    assert trl["gradient_accumulation_steps"] == 4 * 8 // 8          # one optimizer step per generation batch
    assert last["micro_batch_grpokit"] == last["micro_batch_trl"] == 8
    assert last["tokens_grpokit"] == last["tokens_trl"] == 4 * 8 * 4
