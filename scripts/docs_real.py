"""The measured tables of docs/real_model.md (SmolLM2-135M-Instruct, arithmetic and GSM8K), generated from the
runs' raw rows under benchmarks/results/ (scripts/update_readme.py writes them; tests/cli/test_readme.py
checks them)."""

import re
import statistics

from docs_measured import RESULTS, load, pct, rows, table
from docs_race_band import seeds as race_seeds

from grpokit.observe.accuracy_time import eval_seconds

ARITH = "arith_smollm2_t1_lr1e5_seed0"
RACE = "arith_{side}_race_1thread_60min_seed{seed}"
# (recipe, training budget and threads, eval file, metrics file); GSM8K runs' "before" is the start
# re-measured once into gsm8k_smollm2_baseline.jsonl
SUMMARY = [
    (
        "arithmetic, 200 problems (the shipped config: temperature 1.0, lr 1e-5)",
        "60 min on 2 threads",
        f"{ARITH}_eval.jsonl",
        f"{ARITH}_metrics.jsonl",
    ),
    *((f"arithmetic, seed {seed}, " + ("beside TRL (one core each, the same hour)" if side == "smollm2"
                                         else "TRL 1.16's GRPOTrainer on the same config, that hour"),
       "60 min on 1 thread", RACE.format(side=side, seed=seed) + "_eval.jsonl",
       RACE.format(side=side, seed=seed) + "_metrics.jsonl")
      for seed in race_seeds("smollm2") for side in ("smollm2", "trl")),
    (
        "GSM8K, seed 1, prompt-aware micro-batches",
        "30 min on 2 threads",
        "gsm8k_smollm2_rule_seed1_30min_eval.json",
        "gsm8k_smollm2_rule_seed1_30min_metrics.jsonl",
    ),
    (
        "GSM8K, seed 2, beside TRL (one core each)",
        "30 min on 1 thread",
        "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
        "gsm8k_smollm2_rule_seed2_30min_1thread_metrics.jsonl",
    ),
    (
        "GSM8K, seed 0 again, seed 2's protocol (one core each, 2026-12-03 late)",
        "30 min on 1 thread",
        "gsm8k_smollm2_pass8_500_seed0_30min_1thread_after.json",
        "gsm8k_smollm2_rule_seed0_30min_1thread_s30_metrics.jsonl",
    ),
    (
        "GSM8K, seed 1 again, seed 2's protocol",
        "30 min on 1 thread",
        "gsm8k_smollm2_pass8_500_seed1_30min_1thread_after.json",
        "gsm8k_smollm2_rule_seed1_30min_1thread_s30_metrics.jsonl",
    ),
    (
        "GSM8K, seed 2, TRL 1.16's GRPOTrainer on the same config",
        "30 min on 1 thread",
        "gsm8k_trl_seed2_30min_1thread_alone_eval.jsonl",
        "gsm8k_trl_seed2_30min_1thread_alone_metrics.jsonl",
    ),
    (
        "GSM8K, accuracy reward only (ablation)",
        "45 min on 2 threads",
        "gsm8k_smollm2_acc_only_seed0_eval.json",
        "gsm8k_smollm2_acc_only_seed0_metrics.jsonl",
    ),
]


def _ends(name: str) -> tuple[dict, dict]:
    """(before, after) evaluations of a run: its own first and last rows, or, for a GSM8K run that kept only
    its final evaluation, the start re-measured into gsm8k_smollm2_baseline.jsonl."""
    evals = rows(name) if name.endswith(".jsonl") else [load(name)]
    if len(evals) > 1 and evals[0].get("tag") == "before":
        return evals[0], evals[-1]
    return rows("gsm8k_smollm2_baseline.jsonl")[-1], evals[-1]


def summary() -> str:
    out = []
    for recipe, budget, evals, metrics in SUMMARY:
        b, a = _ends(evals)
        out.append(
            [
                recipe,
                f"{len(rows(metrics))} steps, {budget}",
                f"{pct(b['accuracy'])} -> {pct(a['accuracy'])}",
                f"{pct(b['format_rate'])} -> {pct(a['format_rate'])}",
                f"`{evals}`",
            ]
        )
    return table(
        [
            "recipe (seed 0 unless named; greedy held-out)",
            "training",
            "accuracy before -> after",
            "format rate before -> after",
            "raw rows",
        ],
        out,
    )


def arith_curve() -> str:
    """The shipped arithmetic recipe's hour: held-out accuracy and training seconds at each evaluation."""
    seconds, total = [], 0.0
    for r in rows(f"{ARITH}_metrics.jsonl"):
        total += r.get("time/step", 0.0)
        seconds.append(total)
    evals = rows(f"{ARITH}_eval.jsonl")
    steps = [f"{e['step']}" + (" (the hour's end)" if e is evals[-1] else "") for e in evals]
    acc = [f"**{pct(e['accuracy'])}**" if e is evals[-1] else pct(e["accuracy"]) for e in evals]
    secs = [f"{seconds[e['step'] - 1]:.0f}" if e["step"] else "0" for e in evals]
    return table(["step", *steps], [["held-out accuracy", *acc], ["training seconds", *secs]])


def _median_phases(metrics: list[dict]) -> str:
    keys = (("time/generate", "generation"), ("time/ref_forward", "reference"), ("time/update", "update"))
    parts = [f"{name} {statistics.median(r[k] for r in metrics):.2f}" for k, name in keys if k in metrics[0]]
    return f" ({', '.join(parts)})" if parts and "time/ref_forward" in metrics[0] else ""


def _race_evals(metrics: list[dict], evals: list[dict]) -> str:
    """Each evaluation as 'training minute: accuracy' (grpokit.observe.accuracy_time's clock)."""
    return ", ".join(f"{s / 60:.0f}: {100 * a:.1f}" for s, a in eval_seconds(metrics, evals)[:-1])


def _race_rss(name: str, metrics: list[dict]) -> str:
    if (RESULTS / f"{name}_time_v.txt").is_file():
        return f"{_max_rss_gib(f'{name}_time_v.txt')} (`/usr/bin/time -v`)"
    rss = max((r.get("peak_rss_mib", 0) for r in metrics), default=0)
    return f"{rss:.0f} MiB (the run's metrics)" if rss else "not in its metrics"


def race() -> str:
    """The full hour on one core each, every seed: steps, s/step, the evaluations, peak RSS."""
    out = []
    for seed in race_seeds("smollm2"):
        for side, label in (
            ("smollm2", "grpokit (bf16 mixed)"),
            ("trl", "TRL 1.16 GRPOTrainer (its bf16 default)"),
        ):
            name = RACE.format(side=side, seed=seed)
            m, evals = rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl")
            out.append(
                [
                    f"{seed}, {label}",
                    f"{len(m)} ({sum(r.get('time/step', 0.0) for r in m):.0f} s)",
                    f"{statistics.median(r['time/step'] for r in m):.2f}{_median_phases(m)}",
                    _race_evals(m, evals),
                    f"**{pct(evals[-1]['accuracy'])}**",
                    _race_rss(name, m),
                ]
            )
    return table(
        [
            "seed, side",
            "steps in 60 min",
            "median s/step",
            "held-out accuracy at each evaluation before the end (training minute: %)",
            "end",
            "peak RSS",
        ],
        out,
    )


def gsm8k_seeds() -> str:
    """The rule recipe's GSM8K seeds with raw rows: steps, and the greedy evaluation after (500 problems)."""
    out = []
    for seed, training, evals, metrics in (
        (
            1,
            "30 min, 2 threads",
            "gsm8k_smollm2_rule_seed1_30min_eval.json",
            "gsm8k_smollm2_rule_seed1_30min_metrics.jsonl",
        ),
        (
            2,
            "30 min, 1 thread (beside TRL)",
            "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
            "gsm8k_smollm2_rule_seed2_30min_1thread_metrics.jsonl",
        ),
    ):
        a = _ends(evals)[1]
        out.append(
            [
                seed,
                training,
                len(rows(metrics)),
                pct(a["accuracy"]),
                pct(a["format_rate"]),
                f"{a['completion_length_mean']:.1f}",
                f"`{evals}`",
            ]
        )
    return table(
        [
            "seed",
            "training",
            "steps",
            "accuracy after (500, greedy)",
            "format rate after",
            "mean length after",
            "raw rows",
        ],
        out,
    )


def _max_rss_gib(name: str) -> str:
    """The peak RSS `/usr/bin/time -v` wrote to benchmarks/results/NAME."""
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", (RESULTS / name).read_text()).group(1))
    return f"{kb / 2**20:.1f} GiB"


def gsm8k_vs_trl() -> str:
    """GSM8K seed 2, each side on one core for 30 training minutes, and the start they both left from."""
    start = rows("gsm8k_trl_seed1_before_eval.jsonl")[0]
    out = [["starting model (grpokit's evaluator, `gsm8k_trl_seed1_before_eval.jsonl`)", "-", "-", start]]
    for label, tag, evals in (
        (
            "grpokit (the run above)",
            "gsm8k_smollm2_rule_seed2_30min_1thread",
            "gsm8k_smollm2_rule_seed2_30min_1thread_eval.json",
        ),
        (
            "TRL 1.16 GRPOTrainer (bf16 default)",
            "gsm8k_trl_seed2_30min_1thread_alone",
            "gsm8k_trl_seed2_30min_1thread_alone_eval.jsonl",
        ),
    ):
        steps = [r["time/step"] for r in rows(f"{tag}_metrics.jsonl")]
        shown = ", ".join(f"{x:.1f}" for x in steps[:3]) + (", ..." if len(steps) > 3 else "")
        out.append(
            [label, len(steps), f"{shown} (median {statistics.median(steps):.1f})", _ends(evals)[1], tag]
        )
    lines = []
    for label, steps, secs, e, *tag in out:
        right = round(e["accuracy"] * e["num_problems"])
        lines.append(
            [
                label,
                steps,
                secs,
                f"{pct(e['accuracy'])} ({right})",
                pct(e["format_rate"]),
                f"{e['completion_length_mean']:.1f}",
                f"{100 * e['frac_truncated']:.0f}%",
                _max_rss_gib(f"{tag[0]}_time_v.txt") if tag else "-",
            ]
        )
    return table(
        [
            "side (seed 2, 1 thread, 30 training minutes)",
            "steps",
            "s/step",
            "accuracy after (500, greedy)",
            "format rate after",
            "mean length after",
            "cut at 256",
            "peak RSS (`/usr/bin/time -v`)",
        ],
        lines,
    )


def _trained(tag: str) -> tuple[int, float, str]:
    """(steps, median s/step, 'right of sampled') of a GSM8K run's metrics (32 completions a step)."""
    m = rows(f"gsm8k_smollm2_{tag}_metrics.jsonl")
    right = round(sum(r["accuracy"] for r in m) * 32)
    return len(m), statistics.median(r["time/step"] for r in m), f"{right} of {32 * len(m)}"


def _greedy_and_sampled(e: dict) -> list[str]:
    n = e["num_problems"]
    return [f"{pct(e['accuracy'])} ({round(e['accuracy'] * n)})", pct(e["format_rate"]),
            f"{e['completion_length_mean']:.1f}", f"{100 * e['pass@1']:.2f}%",
            f"{pct(e['pass@8'])} ({round(e['pass@8'] * n)} of {n:.0f})", pct(e["sampled_format_rate"]),
            f"{e['sampled_completion_length_mean']:.0f}"]


PASSK_HEAD = ["greedy accuracy", "greedy format", "greedy length", "pass@1 (sampled)", "pass@8",
              "sampled format rate", "sampled length"]


def passk(which: str) -> str:
    """pass@8 before and after seed 2's 30 minutes, on the 500 test problems or the first 40."""
    out = [[label, *_greedy_and_sampled(load(f"gsm8k_smollm2_pass8_{which}_{tag}.json"))]
           for label, tag in (("SmolLM2-135M-Instruct (before)", "before"),
                              ("seed 2 after 30 minutes (12 steps)", "seed2_after"))]
    return table(["model", *PASSK_HEAD], out)


def seeds_s30() -> str:
    """Seeds 0 / 1 / 2, 30 minutes on one core each, then greedy and 8 samples on the 500 test problems."""
    out = [["starting model", "-", "-", *_greedy_and_sampled(load("gsm8k_smollm2_pass8_500_before.json"))]]
    for seed, tag, after in ((0, "rule_seed0_30min_1thread_s30", "seed0_30min_1thread_after"),
                             (1, "rule_seed1_30min_1thread_s30", "seed1_30min_1thread_after"),
                             ("2 (above)", "rule_seed2_30min_1thread", "seed2_after")):
        steps, med, right = _trained(tag)
        out.append([seed, f"{steps} ({med:.1f})", right,
                    *_greedy_and_sampled(load(f"gsm8k_smollm2_pass8_500_{after}.json"))])
    return table(["seed", "steps (median s/step)", "right samples in training", *PASSK_HEAD], out)


def ablations() -> str:
    """Seed 2, 30 minutes, one change each; greedy on the first 100 test problems."""
    out = []
    for label, tag in (("shipped (G 8, B 4, 256 tokens, lr 1e-5, full)", "rule_seed2_30min_1thread"),
                       ("G 16, B 2", "ablation_g16_seed2_30min_1thread"),
                       ("400 new tokens", "ablation_len400_seed2_30min_1thread"),
                       ("lr 5e-6", "ablation_lr5e6_seed2_30min_1thread"),
                       ("LoRA r 16 on all 7 projections, lr 1e-4", "ablation_lora_seed2_30min_1thread")):
        steps, med, right = _trained(tag)
        e = load(f"gsm8k_smollm2_{tag}_eval100.json")
        out.append([label, steps, f"{med:.1f}", right, pct(e["accuracy"]), pct(e["format_rate"]),
                    f"{e['completion_length_mean']:.1f}", f"{100 * e['frac_truncated']:.0f}%"])
    return table(["run", "steps", "median s/step", "right samples", "acc. (100)", "format (100)",
                  "length (100)", "cut"], out)


def prompt_buckets() -> str:
    """Micro-batches planned by total length against prompt-aware ones (benchmarks/prompt_buckets.py)."""
    sides = [r for r in rows("gsm8k_smollm2_prompt_buckets.jsonl") if "side" in r]
    out = []
    for side, label in (("length", "by total length (before)"), ("prompt", "prompt-aware (now)")):
        rs = sorted((r for r in sides if r["side"] == side), key=lambda r: r["round"])
        out.append([label, rs[0]["micro_batches"], f"{rs[0]['token_slots']:,}",
                    ", ".join(f"{r['ref_s']:.1f}" for r in rs),
                    ", ".join(f"{r['update_s']:.1f}" for r in rs)])
    return table(["plan", "micro-batches", "token-slots", "reference pass (s, rounds 1, 2)",
                  "policy update (s, rounds 1, 2)"], out)


def race_2threads() -> str:
    """The 2-thread race: grpokit's hour against TRL's 50 steps, read at step 50 and at TRL's seconds."""
    sides = []
    trl = "arith_trl_t1_lr1e5_seed0_50steps"
    for label, name in (("grpokit", ARITH), ("TRL 1.16 GRPOTrainer (bf16 default)", trl)):
        m, evals = rows(f"{name}_metrics.jsonl"), rows(f"{name}_eval.jsonl")
        seconds = [sum(r["time/step"] for r in m[:k]) for k in range(len(m) + 1)]
        sides.append((label, m, {e["step"]: (e["accuracy"], seconds[e["step"]]) for e in evals}, seconds[-1]))
    budget = sides[1][3]
    out = []
    for label, m, at, total in sides:
        within = [f"{pct(a)} (step {k})" for k, (a, t) in at.items() if t <= budget and k]
        out.append([label, len(m), f"{total:.0f}", f"{statistics.median(r['time/step'] for r in m):.2f}",
                    f"{pct(at[50][0])} ({at[50][1]:.0f} s)", "; ".join(within[-2:])])
    return table(["", "steps", "training seconds", "s/step (median)", "held-out accuracy at step 50",
                  f"evaluations within {budget:.0f} s of training (last two)"], out)


def seed2_beside_trl() -> str:
    """Seed 2 with TRL's first attempt beside it: steps in the budget, the first steps, the peak RSS."""
    out = []
    for label, tag in (("grpokit (bf16 mixed)", "gsm8k_smollm2_rule_seed2_30min_1thread"),
                       ("TRL 1.16 GRPOTrainer (its bf16 default)", "gsm8k_trl_seed2_30min_1thread")):
        m = rows(f"{tag}_metrics.jsonl")
        med = statistics.median(r["time/step"] for r in m)
        median = f"{med:.1f}{_median_phases(m)}" if len(m) > 2 else "-"
        out.append([label, f"{len(m)} logged in {sum(r['time/step'] for r in m):.0f} s",
                    " / ".join(f"{r['time/step']:.1f}" for r in m[:2]), median,
                    _max_rss_gib(f"{tag}_time_v.txt")])
    return table(["side", "steps in the budget", "s/step, steps 1 / 2", "median s/step",
                  "peak RSS (`/usr/bin/time -v`)"], out)


BLOCKS = {
    "real_model.md": {
        "real-gsm8k-vs-trl": gsm8k_vs_trl,
        "real-summary": summary,
        "real-arith-curve": arith_curve,
        "real-race": race,
        "real-gsm8k-seeds": gsm8k_seeds,
    "real-ablations": ablations,
    "real-pass8-500": lambda: passk("500"),
    "real-pass8-40": lambda: passk("first40"),
    "real-seeds-s30": seeds_s30,
    "real-prompt-buckets": prompt_buckets,
    "real-race-2threads": race_2threads,
    "real-seed2-beside-trl": seed2_beside_trl,
    }
}
