"""The hostile programs of benchmarks/sandbox_programs.py through the reward path of a real training run.

    python benchmarks/sandbox_hostile_train.py [--only NAMES] [--record FILE.jsonl]

A GRPO run (grpokit.trl's GRPOTrainer, a tiny random model with the char tokenizer, G = 2, one prompt per
step, one step per program) whose completions come from a `rollout_func`: in each group one completion is
the hostile program in a ```python block, the other a correct solution. The code rewards
(grpokit.rewards.code, reward.sandbox=bwrap by default) run both in the sandbox, the advantages and the
update follow as in any run. Before each step the benchmark checks what the previous step's program left:
the watched folders (a sample project with a .env, a run folder, a fake home with .ssh/id_rsa) against
their digest, files dropped in the machine's /tmp or /dev/shm, processes left behind; after the last
step the same once more. One row per program: outcome, reward, sandbox seconds, what changed, whether the
run went on (the trainer's next step happened, or the run ended normally after the last).

Process mode (reward.sandbox=process) runs the program as the trainer's own user beside the trainer: a
program that kills its parent kills the sandbox's harness only, but one that kills the trainer's pid or
fills the disk reaches the trainer; benchmarks/sandbox_hostile.py runs the suite in that mode with a
caller process per program, which is where to read what process mode does not stop.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import string
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sandbox_hostile import digest, kill, left_behind, listener, meta, plant  # noqa: E402
from sandbox_programs import SOLVE, TESTS, hostile  # noqa: E402

from grpokit.config.sections import ModelConfig  # noqa: E402
from grpokit.model.loading import load_model_and_tokenizer  # noqa: E402
from grpokit.rewards.code import CodeRunner, code_rewards  # noqa: E402
from grpokit.sandbox import Limits  # noqa: E402


class Probe:
    """The suite's state between steps: which program ran last, its mark, the folders' digest."""

    def __init__(self, root: Path, folders: dict, tag: str, port: int) -> None:
        self.root, self.folders, self.tag, self.port = root, folders, tag, port
        self.baseline = self.digest()
        self.rows: list[dict] = []
        self.pending: dict | None = None          # the row of the program whose aftermath is not checked

    def digest(self) -> str:
        """The watched folders only (the trainer's own output folder beside them changes every step)."""
        return "".join(digest(d) for d in self.folders.values())

    def program(self, name: str, source: str) -> str:
        mark = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**9):09d}"
        self.pending = {"program": name, "mark": mark, "step_started": time.monotonic()}
        return string.Template(source).safe_substitute(mark=mark, port=self.port, tag=self.tag,
                                                       **{k: str(v) for k, v in self.folders.items()})

    def check_previous(self, went_on: bool) -> None:
        """What the last program left, now that its step is over."""
        row, self.pending = self.pending, None
        if row is None:
            return
        time.sleep(0.2)                           # a detached process has had time to show up
        mark = row.pop("mark")
        left = left_behind(mark)
        for pid in left:
            kill(int(pid.split()[0]))
        host_tmp = [*Path("/tmp").glob(f"{mark}-*"), *Path("/dev/shm").glob(f"{mark}-*")]
        for path in host_tmp:
            path.unlink(missing_ok=True)
        changed = self.digest() != self.baseline
        if changed:                               # put the folders back for the next program
            plant(self.root, self.tag)
            self.baseline = self.digest()
        row.update(watched_changed=changed, wrote_host_tmp=bool(host_tmp), left_processes=len(left),
                   run_went_on=went_on, step_s=time.monotonic() - row.pop("step_started"))
        self.rows.append(row)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="bwrap", choices=["bwrap"])
    p.add_argument("--record", default=str(HERE / "results" / "sandbox_hostile_train.jsonl"))
    p.add_argument("--only", default="", help="comma-separated program names (default: all)")
    args = p.parse_args(argv)
    from grpokit.trl import GRPOConfig, GRPOTrainer

    only = set(filter(None, args.only.split(",")))
    programs = {name: src for name, src, _ in hostile() if not only or name in only}
    tag = f"HOSTILE-SECRET-{secrets.token_hex(6)}"
    root = Path(tempfile.mkdtemp(prefix="sandbox-hostile-train-", dir="/var/tmp"))
    folders = plant(root, tag)
    server, port = listener(tag)
    probe = Probe(root, folders, tag, port)
    runner = CodeRunner(mode=args.mode, workers=2, limits=Limits())
    results: dict[str, object] = {}
    ask = runner.results

    async def recorded(programs_, setups, tests):         # the sandbox's Result of each hostile program
        out = await ask(programs_, setups, tests)
        for prog, res in zip(programs_, out):
            if prog is not None and prog != SOLVE:
                results[probe.pending["program"] if probe.pending else "?"] = res
        return out

    runner.results = recorded
    model, tok = load_model_and_tokenizer(ModelConfig(name_or_path="builtin:tiny-random", device="cpu"))

    def rollout(prompts, trainer):
        probe.check_previous(went_on=True)
        name = prompts[0].split(": ", 1)[1]
        texts = [f"```python\n{probe.program(name, programs[name])}```", f"```python\n{SOLVE}```"]
        texts = [texts[i % 2] for i in range(len(prompts))]
        comp = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        return {"prompt_ids": [tok(q, add_special_tokens=False)["input_ids"] for q in prompts],
                "completion_ids": comp, "logprobs": [[-1.0] * len(c) for c in comp]}

    rows = [{"prompt": f"program: {name}", "tests": TESTS} for name in programs]
    out_dir = root / "trainer"
    cfg = GRPOConfig(output_dir=str(out_dir), num_generations=2, per_device_train_batch_size=2,
                     max_completion_length=512, max_steps=len(rows), report_to="none", bf16=False,
                     learning_rate=1e-4, seed=0, logging_steps=1, shuffle_dataset=False, save_strategy="no")
    rewards = code_rewards(runner)
    trainer = GRPOTrainer(model, reward_funcs=[rewards["code_tests"]], args=cfg, train_dataset=rows,
                          processing_class=tok, rollout_func=rollout)
    start = time.monotonic()
    trainer.train()
    probe.check_previous(went_on=True)            # the run ended normally after the last program
    wall = time.monotonic() - start
    steps = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    server.close()
    runner.close()
    info = {**meta(), "bench": "sandbox_hostile_train", "mode": args.mode, "as_root": os.geteuid() == 0,
            "command": "python benchmarks/sandbox_hostile_train.py " + " ".join(argv or sys.argv[1:])}
    with open(args.record, "a") as f:
        for row in probe.rows:
            res = results.get(row["program"])
            row.update(outcome=getattr(res, "outcome", "not_run"), reward=getattr(res, "fraction", 0.0),
                       sandbox_s=getattr(res, "seconds", 0.0), detail=getattr(res, "detail", ""),
                       leaked=bool(res) and tag in (res.stdout + res.stderr + res.detail))
            f.write(json.dumps({**info, **row}) + "\n")
        f.write(json.dumps({**info, "summary": True, "programs": len(probe.rows), "train_steps": len(steps),
                            "wall_s": wall}) + "\n")
    print(f"{'program':24s} {'outcome':16s} reward  secs changed tmp leak left went_on")
    for r in probe.rows:
        print(f"{r['program']:24s} {r['outcome']:16s} {r['reward']:6.2f} {r['sandbox_s']:5.2f} "
              f"{str(r['watched_changed'])[0]:7s} {str(r['wrote_host_tmp'])[0]:3s} {str(r['leaked'])[0]:4s} "
              f"{r['left_processes']:4d} {r['run_went_on']}")
    print(f"{len(probe.rows)} programs, {len(steps)} training steps logged, {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
