"""One agent program, run on TRL 1.16's GRPOTrainer and on grpokit.trl with only its import changed.

    python benchmarks/agents_vs_trl.py                  # prepare the model, 2 rounds x 2 sides, compare
    python benchmarks/agents_vs_trl.py --rounds 3 --steps 8

The program (`PROGRAM` below) is a TRL program a user would write: a `multiply` tool, a small dataset of
two-digit products built in code, a reward that checks the boxed answer, `GRPOConfig(...)`,
`GRPOTrainer(..., tools=[multiply])`. Each side runs it as a file of its own, identical but for its first
line (`from trl import ...` or `from grpokit.trl import ...`), in a fresh process pinned to one core
(`OMP_NUM_THREADS=1 taskset -c CORE`), sides alternating (trl, grpokit, trl, grpokit, ...).

The model is made here, offline, once: a character-level Qwen2 (hidden 64, 2 layers) with ChatML tokens
and a Hermes-style tool chat template (`<tool_call>{json}</tool_call>`, results as `<tool_response>`),
taught a few hundred supervised steps on tool-calling traces for 32 products so that it calls the tool
most of the time and is right part of the time (rewards vary within a group). TRL's tool loop needs:
a chat template that renders a tool-calling conversation (TRL's `supports_tool_calling`), that is
prefix-preserving, and a response parser: the program sets `tokenizer.response_template` (transformers'
format, the same as TRL's for Qwen3's `<tool_call>` blocks), as TRL asks users to for a template it does
not recognise. grpokit reads the same `response_template`.

Per side and round the program prints one JSON line: wall and CPU seconds per step (a TrainerCallback's
time between step ends, the first step's from train begin; CPU time is the process's, less sensitive to
other jobs on a shared core), reward and tool calls per step (log_history with logging_steps=1), peak
RSS; the runner adds the CPU seconds of the whole run (the side's process and the children it reaped:
imports, model loading, grpokit's math-verify worker). Rows go to benchmarks/results/agents_vs_trl.jsonl
(one per side per round, with the 1-minute load average when it started, then a compare row: medians
over the steps after the first, pooled over rounds, and their ratios).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from grpokit.agents.formats import HERMES_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "agents_vs_trl.jsonl"
IMPORTS = {"trl": "from trl import GRPOConfig, GRPOTrainer",
           "grpokit": "from grpokit.trl import GRPOConfig, GRPOTrainer"}

PROGRAM = '''{import_line}

import json, random, re, resource, sys, time

from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

MODEL, STEPS, SEED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def digits_right(completions, answer, **kwargs):
    """The share of the product's digits the last assistant message's boxed number gets right."""
    out = []
    for messages, want in zip(completions, answer):
        found = re.findall(r"\\\\boxed\\{{(\\d+)\\}}", messages[-1].get("content") or "")
        got = found[-1] if found else ""
        out.append(sum(x == y for x, y in zip(got, want)) / len(want) if len(got) == len(want) else 0.0)
    return out


rng = random.Random(0)
pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(32)]
dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"What is {{a}}*{{b}}?"}}],
                              "answer": str(a * b)}} for a, b in pairs])

tokenizer = PreTrainedTokenizerFast.from_pretrained(MODEL)      # a plain `tokenizers` char tokenizer
tokenizer.response_template = {{                # how to read a tool call (transformers' format)
    "defaults": {{"role": "assistant"}},
    "start_anchor": "<|im_start|>assistant\\n",
    "fields": {{
        "tool_calls": {{"open": "<tool_call>", "close_pattern": r"</tool_call>\\s*", "repeats": True,
                       "content": "json", "transform": {{"type": "function", "function": "{{content}}"}}}},
        "content": {{"close_pattern": r"<\\|im_end\\|>\\s*", "content": "text"}},
    }},
}}
model = AutoModelForCausalLM.from_pretrained(MODEL)

args = GRPOConfig(output_dir=sys.argv[4], num_generations=4, per_device_train_batch_size=16,
                  max_completion_length=160, max_tool_calling_iterations=2, learning_rate=1e-4,
                  max_steps=STEPS, seed=SEED, logging_steps=1, report_to="none", save_strategy="no",
                  use_cpu=True, bf16=False, gradient_checkpointing=False, disable_tqdm=True)


class Clock(TrainerCallback):
    """Wall and CPU seconds of each step (the first one's from the start of training)."""

    def on_train_begin(self, *a, **k):
        self.last, self.seconds, self.cpu = (time.perf_counter(), time.process_time()), [], []

    def on_step_end(self, *a, **k):
        now = (time.perf_counter(), time.process_time())
        self.seconds.append(now[0] - self.last[0])
        self.cpu.append(now[1] - self.last[1])
        self.last = now


clock = Clock()
trainer = GRPOTrainer(model=model, reward_funcs=digits_right, args=args, train_dataset=dataset,
                      processing_class=tokenizer, tools=[multiply], callbacks=[clock])
trainer.train()
rows = [r for r in trainer.state.log_history if "reward" in r]
print("RESULT " + json.dumps({{
    "seconds_per_step": clock.seconds,
    "cpu_seconds_per_step": clock.cpu,
    "reward_per_step": [r["reward"] for r in rows],
    "tool_calls_per_trajectory": [r.get("tools/call_frequency") for r in rows],
    "tool_failure_frequency": [r.get("tools/failure_frequency") for r in rows],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}}))
'''



def prepare(folder: Path, sft_steps: int) -> None:
    """The benchmark's model: a char-level Qwen2 taught to call multiply in Hermes chat turns."""
    import random

    import torch

    from grpokit.model.loading import build_char_tokenizer, tiny_random_model
    from grpokit.train.sft import encode_pairs, sft_loss

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = HERMES_TEMPLATE
    schema = [{"type": "function", "function": {"name": "multiply"}}]
    rng = random.Random(1)                      # other products than the program's (seed 0)
    prompts, targets = [], []
    for _ in range(32):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        user = [{"role": "user", "content": f"What is {a}*{b}?"}]
        call = [{"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]
        convo = user + [{"role": "assistant", "content": "", "tool_calls": call},
                        {"role": "tool", "name": "multiply", "content": str(a * b)},
                        {"role": "assistant", "content": f"\\boxed{{{a * b}}}"}]
        head = tok.apply_chat_template(user, tools=schema, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(convo, tools=schema, tokenize=False)
        prompts.append(head)
        targets.append(full[len(head):].removesuffix("<|im_end|>\n"))     # encode_pairs adds the EOS
    model = tiny_random_model(tok, seed=0)
    ids, att, mask = encode_pairs(tok, prompts, targets, mask_tool_results=True)
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(sft_steps):
        loss = sft_loss(model, ids, att, mask)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 50 == 0 or step == sft_steps - 1:
            print(f"sft step {step}: loss {loss.item():.3f}", flush=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_side(side: str, rnd: int, model: Path, steps: int, seed: int, core: int, work: Path) -> dict:
    program = work / f"program_{side}.py"
    program.write_text(PROGRAM.format(import_line=IMPORTS[side]))
    out_dir = work / f"out_{side}_{rnd}"               # a fresh output folder per run
    cmd = ["taskset", "-c", str(core), sys.executable, str(program), str(model), str(steps), str(seed),
           str(out_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": str(ROOT / "src")}
    load = Path("/proc/loadavg").read_text().split()[0]          # the machine is shared: how busy it was
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)     # the side's process and the children it reaped
    tree_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return {**json.loads(lines[-1][len("RESULT "):]), "loadavg_1min_at_start": float(load),
            "process_tree_cpu_seconds": round(tree_cpu, 2),
            "command": f"OMP_NUM_THREADS=1 {' '.join(cmd)}"}


def _after_first(values: list) -> list:
    return values[1:]


def compare(rows: list[dict]) -> dict:
    out: dict = {"kind": "compare"}
    for side in IMPORTS:
        mine = [r for r in rows if r["side"] == side]
        secs = [s for r in mine for s in _after_first(r["seconds_per_step"])]
        cpu = [s for r in mine for s in _after_first(r["cpu_seconds_per_step"])]
        rewards = [x for r in mine for x in r["reward_per_step"]]
        calls = [x for r in mine for x in r["tool_calls_per_trajectory"] if x is not None]
        out[side] = {"median_seconds_per_step": round(statistics.median(secs), 3),
                     "median_cpu_seconds_per_step": round(statistics.median(cpu), 3),
                     "mean_reward": round(statistics.fmean(rewards), 4),
                     "mean_tool_calls_per_trajectory": round(statistics.fmean(calls), 4) if calls else None,
                     "peak_rss_mb": round(max(r["peak_rss_mb"] for r in mine), 1), "rounds": len(mine),
                     "mean_train_wall_seconds": round(
                         statistics.fmean(sum(r["seconds_per_step"]) for r in mine), 2),
                     "mean_process_tree_cpu_seconds": round(
                         statistics.fmean(r["process_tree_cpu_seconds"] for r in mine), 2)}
    for key in ("seconds", "cpu_seconds"):
        out[f"trl_over_grpokit_{key}_per_step"] = round(
            out["trl"][f"median_{key}_per_step"] / out["grpokit"][f"median_{key}_per_step"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    os.sched_setaffinity(0, {a.core})
    with tempfile.TemporaryDirectory(prefix="agents-vs-trl-") as tmp:
        work = Path(tmp)
        prepare(work / "model", a.sft_steps)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        common = {"commit": _commit(), "cpu": _cpu(), "threads": 1, "core": a.core, "steps": a.steps,
                  "seed": a.seed, "date": now}
        rows = []
        for rnd in range(a.rounds):
            for side in ("trl", "grpokit"):
                row = {"kind": "side", "side": side, "round": rnd, **common,
                       **run_side(side, rnd, work / "model", a.steps, a.seed, a.core, work)}
                rows.append(row)
                shown = ("side", "round", "seconds_per_step", "cpu_seconds_per_step", "reward_per_step",
                         "tool_calls_per_trajectory")
                print(json.dumps({k: row[k] for k in shown}), flush=True)
        summary = {**compare(rows), **common,
                   "command": f"python benchmarks/agents_vs_trl.py --rounds {a.rounds} --steps {a.steps} "
                              f"--seed {a.seed} --core {a.core} --sft-steps {a.sft_steps}"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        for row in rows + [summary]:
            f.write(json.dumps(row) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
