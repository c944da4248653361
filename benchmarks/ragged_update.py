"""Ragged completions: grpokit's padded update vs its padding-free update vs TRL 1.16, on one sampled batch.

SmolLM2-135M-Instruct, bf16 mixed precision, the GSM8K recipe (configs/smollm2_gsm8k_cpu.yaml: two-shot chat
prompts, temperature 0.7) with completions of up to --length tokens sampled naturally (EOS ends them):

    1. sample   one generation batch (B x G = 4 x 8) with grpokit's sampler; the rollout, its rewards and
                the length distribution are saved (so every side trains on the same tokens)
    2. sides    each in its own fresh process, in the order given then reversed, --repeats times:
                padded   grpokit as configured (length buckets, a group's prompt run once)
                packed   the same with optim.padding_free=true (grpokit.model.packing)
                trl      TRL's GRPOTrainer on the same tokens (a rollout_func returning them), the same
                         micro-batches (per_device_train_batch_size = optim.micro_batch_size, gradient
                         accumulation over the batch), beta, loss_type grpo, bf16, no checkpointing
                every side trains --steps steps on the batch (the first is left out of the medians) and
                reports: train_s (reference pass + policy forward/backward + optimizer, no sampling),
                ref_s and update_s (grpokit's phases), peak RSS over the steps (VmHWM reset after loading)
    3. the token-slots each grpokit plan runs: padded = each micro-batch's tensor (distinct prompts x
       prompt width + rows x completion width), packed = its real tokens (each prompt once, its rows'
       completions), both over the same micro-batches

The goal (issue 59): packed update_s / padded update_s within 10% of packed slots / padded slots.

--fixed-length: long completions instead of ragged ones (issue 59, "Long completions"). Step 1 samples no
completions: every row gets --length random (non-special) token ids after the recipe's prompt, and each
row a random reward (advantages by group); the sides are then trained on it as above (padded and packed
do the same work here: no padding). --lengths L1,L2,...: one such run per length, the sides' order
alternated from length to length, then each side's peak RSS fitted against the batch's tokens (least
squares): the bytes each further completion token costs, and whether TRL ran out of memory (a side that
dies is reported, not fatal).

    python benchmarks/ragged_update.py --record benchmarks/results/ragged_update.jsonl
    python benchmarks/ragged_update.py --length 128 --steps 2 --repeats 1 --sides padded,packed   # quick
    python benchmarks/ragged_update.py --fixed-length --lengths 512,1024,2048 --sides padded,trl --steps 2 \
        --record benchmarks/results/long_update.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "smollm2_gsm8k_cpu.yaml"


def overrides(args, side: str) -> list[str]:
    out = [f"rollout.max_completion_length={args.length}", f"optim.micro_batch_size={args.micro_batch_size}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.num_generations={args.num_generations}",
           f"task.path={args.data}", "run.max_minutes=0", f"run.seed={args.seed}",
           f"run.output_dir={tempfile.mkdtemp(prefix='ragged-')}"]
    return out + (["optim.padding_free=true"] if side == "packed" else [])


def synthetic(state, rollout, args):
    """The fixed-length batch: rollout's prompts, --length random ids per row, random rewards."""
    from grpokit.core.advantages import group_advantages
    from grpokit.rollout.contract import assemble_rollout

    G, N, L = args.num_generations, rollout.completion_ids.shape[0], args.length
    gen = torch.Generator().manual_seed(args.seed)
    special = set(state.tokenizer.all_special_ids)
    vocab = [i for i in range(len(state.tokenizer)) if i not in special]
    ids = torch.tensor(vocab)[torch.randint(len(vocab), (N, L), generator=gen)]
    r = assemble_rollout(tokenizer=state.tokenizer, prompts=rollout.prompts[::G],
                         prompt_ids=rollout.prompt_ids[::G], prompt_mask=rollout.prompt_mask[::G],
                         completion_ids=ids, group_size=G, eos_ids=[], cut_at_eos=False)
    rewards = torch.rand(N, generator=gen)
    return r, group_advantages(rewards, G), r.completion_mask.float(), rewards


def sample(args) -> dict:
    """Step 1: one generation batch, saved to args.batch; its length distribution."""
    from grpokit import switch
    from grpokit.config.schema import load_config
    from grpokit.observe.metrics import PhaseTimer
    from grpokit.train.loop import build_state
    from grpokit.train.step import generate

    over = overrides(args, "padded")
    if args.fixed_length:                 # sample one token only: the completions are made up
        over.append("rollout.max_completion_length=1")
    cfg = load_config(str(CONFIG), over)
    state = build_state(cfg)
    timer = PhaseTimer()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    with switch.accelerated(state.model, cfg, timer=timer, buffers=state.speedup_buffers, record=False) as s:
        gen = generate(state, timer, s)
    seconds = time.perf_counter() - t0
    b = gen.batch
    rollout, advantages, loss_mask, rewards = b.rollout, b.advantages, b.loss_mask, b.scores.total
    if args.fixed_length:
        rollout, advantages, loss_mask, rewards = synthetic(state, rollout, args)
    torch.save({"rollout": rollout, "advantages": advantages, "loss_mask": loss_mask, "rewards": rewards},
               args.batch)
    lengths = rollout.completion_mask.sum(-1).tolist()
    q = statistics.quantiles(lengths, n=4)
    return {"what": "sample", "rows": len(lengths), "max_length": args.length, "sample_s": seconds,
            "generate_s": timer.pop().get("time/generate"), "lengths": lengths,
            "length_min": min(lengths), "length_p25": q[0], "length_median": q[1], "length_p75": q[2],
            "length_max": max(lengths), "length_mean": statistics.mean(lengths),
            "truncated": int(rollout.truncated.sum()), "prompt_tokens_mean":
            float(rollout.prompt_mask.sum(-1).float().mean()), "fixed_length": args.fixed_length}


def plan_slots(state, rollout) -> dict:
    """Token-slots of the update's micro-batches: as padded tensors, and as real tokens."""
    from grpokit.model.shared_prompts import model_shares_prompts
    from grpokit.train.update import micro_batch_plan

    shared = model_shares_prompts(state.model)
    padded = real = 0
    for rows in micro_batch_plan(state, rollout):
        pm, cm = rollout.prompt_mask[rows], rollout.completion_mask[rows]
        c_len, p_len = cm.sum(-1), pm.sum(-1)
        prompts = torch.unique(torch.cat([rollout.prompt_ids[rows], pm], 1), dim=0).shape[0] if shared \
            else len(rows)
        width_p = int((pm.sum(0) > 0).sum())
        padded += prompts * width_p + len(rows) * int(c_len.max())
        real += (int(p_len.float().mean()) * prompts if shared else int(p_len.sum())) + int(c_len.sum())
    return {"padded_slots": padded, "real_slots": real}


def grpokit_side(args, side: str) -> dict:
    """Step 2 for padded / packed: --steps updates on the saved batch, phase by phase."""
    from grpokit import switch
    from grpokit.cli.recipebench import reset_peak
    from grpokit.config.schema import load_config
    from grpokit.observe.metrics import PhaseTimer, peak_rss_mib
    from grpokit.train.loop import build_state
    from grpokit.train.update import forward_logprobs, policy_update

    cfg = load_config(str(CONFIG), overrides(args, side))
    state = build_state(cfg)
    saved = torch.load(args.batch, weights_only=False)
    r = saved["rollout"]
    rows, load_peak = [], peak_rss_mib()
    reset_peak()
    for _ in range(args.steps):
        timer, t0 = PhaseTimer(), time.perf_counter()
        with switch.accelerated(state.model, cfg, timer=timer, buffers=state.speedup_buffers, record=False):
            with timer("ref"):
                ref = forward_logprobs(state.ref_model, r, cfg, state.dist.logprobs_fn(state.ref_model))
            with timer("update"):
                policy_update(state, r, saved["advantages"], old_lp=None, ref_lp=ref,
                              loss_mask=saved["loss_mask"], timer=timer)
        phases = timer.pop()
        rows.append({"train_s": time.perf_counter() - t0, "ref_s": phases["time/ref"],
                     "update_s": phases["time/update"]})
    timed = rows[1:] or rows
    return {"side": side, **{k: statistics.median(x[k] for x in timed) for k in timed[0]},
            "all_train_s": [round(x["train_s"], 3) for x in rows], "step_peak_mib": peak_rss_mib(),
            "load_peak_mib": load_peak, **plan_slots(state, r)}


def trl_side(args) -> dict:
    """Step 2 for TRL: its trainer on the saved tokens (rollout_func), the same micro-batches."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from transformers import TrainerCallback

    from grpokit.cli.recipebench import reset_peak
    from grpokit.config.schema import load_config
    from grpokit.model.loading import load_model_and_tokenizer
    from grpokit.observe.metrics import peak_rss_mib
    from trl import GRPOConfig, GRPOTrainer

    cfg = load_config(str(CONFIG), overrides(args, "padded"))
    model, tok = load_model_and_tokenizer(cfg.model)
    saved = torch.load(args.batch, weights_only=False)
    r = saved["rollout"]
    N = r.completion_ids.shape[0]
    prompt_ids = [row[m.bool()].tolist() for row, m in zip(r.prompt_ids, r.prompt_mask)]
    completion_ids = [row[m.bool()].tolist() for row, m in zip(r.completion_ids, r.completion_mask)]
    rewards = saved["rewards"].tolist()

    def rollout_func(prompts, trainer):
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def saved_reward(completions, **_):   # the batch's own scores, in its order
        return rewards[:len(completions)]

    G = args.num_generations
    texts = [tok.decode(p) for p in prompt_ids[::G]]
    data = Dataset.from_dict({"prompt": texts * (args.steps + 1)})
    mb = args.micro_batch_size or N
    out_dir = tempfile.mkdtemp(prefix="trl-ragged-")
    tcfg = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=mb, generation_batch_size=N,
                      gradient_accumulation_steps=N // mb, num_generations=G,
                      max_completion_length=args.length, beta=cfg.loss.beta, loss_type="grpo",
                      bf16=True, gradient_checkpointing=False, num_iterations=1,
                      learning_rate=cfg.optim.learning_rate, max_steps=args.steps, logging_steps=1,
                      report_to=[], save_strategy="no", use_cpu=True, seed=args.seed, shuffle_dataset=False,
                      disable_tqdm=True, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
                      scale_rewards="group", mask_truncated_completions=False, dataloader_num_workers=0)
    model.save_pretrained(f"{out_dir}/init")
    model.config._name_or_path = f"{out_dir}/init"
    trainer = GRPOTrainer(model=model, reward_funcs=[saved_reward], args=tcfg, train_dataset=data,
                          processing_class=tok, rollout_func=rollout_func)
    steps: list[float] = []
    load_peak = peak_rss_mib()

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            reset_peak()
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            now = time.perf_counter()
            steps.append(now - self.t)
            self.t = now

    trainer.add_callback(Clock())
    trainer.train()
    timed = steps[1:] or steps
    return {"side": "trl", "train_s": statistics.median(timed), "all_train_s": [round(s, 3) for s in steps],
            "step_peak_mib": peak_rss_mib(), "load_peak_mib": load_peak}


def run_side(args, side: str) -> dict:
    """One side in a fresh process. Under --lengths a side that dies (out of memory: killed, or a
    RuntimeError saying so) gives a row saying how, and the run goes on."""
    cmd = [sys.executable, __file__, *args.argv, "--side", side]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    if args.lengths:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        oom = proc.returncode in (-9, 137) or "out of memory" in proc.stderr.lower()
        how = "out of memory" if oom else f"exit {proc.returncode}: {tail[0][:300]}"
        return {"side": side, "failed": how}
    sys.exit(f"ragged_update: the {side} side failed:\n{proc.stderr[-3000:]}")


def fit_bytes_per_token(rows: list[dict]) -> dict:
    """Per side: least-squares slope and intercept of step peak RSS against the batch's completion tokens
    (the lengths' summaries), in bytes per token and MiB."""
    out = {}
    for side in sorted({k for r in rows for k in r["sides"]}):
        pts = [(r["rows"] * r["length_max"], r["sides"][side]["step_peak_mib"]) for r in rows
               if side in r["sides"]]
        if len(pts) < 2:
            continue
        mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        fitted = [my + slope * (x - mx) for x, _ in pts]
        out[side] = {"bytes_per_token": slope * 2**20, "intercept_mib": my - slope * mx,
                     "max_residual_mib": max(abs(f - y) for f, (_, y) in zip(fitted, pts)),
                     "tokens": [x for x, _ in pts], "peaks_mib": [y for _, y in pts]}
    return out


def summary(sampled: dict, runs: list[dict]) -> dict:
    by = {}
    for row in runs:
        by.setdefault(row["side"], []).append(row)
    failed = {s: rows[0]["failed"] for s, rows in by.items() if any("failed" in r for r in rows)}
    med = {s: {k: statistics.median(r[k] for r in rows) for k in ("train_s", "step_peak_mib")
               + (("update_s", "ref_s", "padded_slots", "real_slots") if s != "trl" else ())}
           for s, rows in by.items() if s not in failed}
    out = {"what": "summary", "sides": med, "failed": failed, "length_mean": sampled["length_mean"],
           "length_max": sampled["length_max"], "rows": sampled["rows"]}
    if "padded" in med and "packed" in med:
        slots = med["padded"]["real_slots"] / med["padded"]["padded_slots"]
        upd = med["packed"]["update_s"] / med["padded"]["update_s"]
        out.update({"real_over_padded_slots": slots, "packed_over_padded_update": upd,
                    "packed_over_padded_train": med["packed"]["train_s"] / med["padded"]["train_s"],
                    "goal_within_10pct": abs(upd - slots) <= 0.10 * slots})
    if "trl" in med:
        for s in ("padded", "packed"):
            if s in med:
                out[f"trl_over_{s}_train"] = med["trl"]["train_s"] / med[s]["train_s"]
                out[f"{s}_over_trl_peak"] = med[s]["step_peak_mib"] / med["trl"]["step_peak_mib"]
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=512, help="max completion tokens")
    p.add_argument("--fixed-length", action="store_true", help="random completions of exactly --length")
    p.add_argument("--lengths", default=None, help="L1,L2,...: one --fixed-length run per length, then "
                                                    "the fitted bytes per token")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per micro-batch, every side")
    p.add_argument("--steps", type=int, default=3, help="updates per side run (the first is warm-up)")
    p.add_argument("--repeats", type=int, default=1, help="sides in order then reversed, this many times")
    p.add_argument("--sides", default="padded,packed,trl")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "gsm8k"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", default=None, help="the saved batch (default: a temporary file)")
    p.add_argument("--record", default=None, help="append every row (JSON lines) to this file")
    p.add_argument("--once", action="store_true", help="each side once, in the order given (--lengths "
                                                        "alternates the order between lengths instead)")
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = [a for a in argv if a != "--side"]
    if args.lengths and not args.fixed_length:
        p.error("--lengths measures long completions: add --fixed-length")
    return args


def over_lengths(args, argv: list[str]) -> int:
    """--lengths: one fixed-length run per length (sides alternated between lengths), then the fit."""
    summaries = []
    lengths = [int(x) for x in args.lengths.split(",")]
    for i, length in enumerate(lengths):
        sides = args.sides.split(",")
        sub = [a for a in argv if not a.startswith("--lengths") and a != args.lengths]
        sub += ["--length", str(length), "--sides", ",".join(sides if i % 2 == 0 else sides[::-1]), "--once"]
        args.batch = None
        summaries.append(one_length(parse(sub), sub))
    fit = {"what": "fit", "lengths": lengths, "fit": fit_bytes_per_token(summaries)}
    print(json.dumps(fit), flush=True)
    _record(args, argv, [fit])
    return 0


def _record(args, argv: list[str], rows: list[dict]) -> None:
    if not args.record:
        return
    head = {"command": "python benchmarks/ragged_update.py " + " ".join(argv),
            "date": time.strftime("%Y-%m-%d"), "machine": f"{_cpu()}, {os.cpu_count()} cores"}
    with open(args.record, "a") as f:
        for row in rows:
            f.write(json.dumps({**head, **row, "commit": _commit(), "cpu": _cpu()}) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.side:
        print(json.dumps(trl_side(args) if args.side == "trl" else grpokit_side(args, args.side)))
        return 0
    if args.lengths:
        return over_lengths(args, argv)
    one_length(args, argv)
    return 0


def one_length(args, argv: list[str]) -> dict:
    """Sample (or make up) the batch, run the sides in order then reversed; returns the summary."""
    if args.batch is None:
        args.batch = tempfile.mkstemp(suffix=".pt", prefix="ragged-batch-")[1]
        args.argv += ["--batch", args.batch]
    sampled = sample(args)
    print(json.dumps({k: v for k, v in sampled.items() if k != "lengths"}), flush=True)
    sides = args.sides.split(",")
    runs = []
    for i in range(args.repeats):
        for side in sides if args.once else sides + sides[::-1]:
            row = {**run_side(args, side), "round": i}
            print(json.dumps(row), flush=True)
            runs.append(row)
    result = summary(sampled, runs)
    print(json.dumps(result), flush=True)
    _record(args, argv, [sampled, *runs, {**result, "summary": True}])
    return result


def _commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
