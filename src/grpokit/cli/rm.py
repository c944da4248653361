"""`grpokit rm`: collect labeled samples, train a reward model, evaluate one.

    grpokit rm collect configs/demo.yaml --out samples.jsonl --num-prompts 1000 --num-generations 8
    grpokit rm train --data samples.jsonl --init builtin:arith-demo --kind outcome --out rm_dir
    grpokit rm eval --rm rm_dir --data other.jsonl

`collect` samples G completions per problem of the config's TRAIN split from its policy
(model.name_or_path, the rollout.* sampling settings) and labels them with the answer checker (and,
with --step-labels, each step by the verifier or by rm.mc_rollouts Monte Carlo continuations).
`train` holds out --eval-share of the groups (problems) whole, trains, prints the held-out AUC and
accuracy after every epoch, and saves the folder `rm:PATH` loads (the figures in grpokit_rm.json's
"report"). `--data` also reads a `grpokit train` completions.jsonl log, labeled by the checker.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from grpokit.config.schema import RMConfig, load_config
from grpokit.errors import UserError, check_out_dir, check_out_file
from grpokit.model.loading import load_model_and_tokenizer
from grpokit.rewards.outcome_rm import load_reward_model
from grpokit.rewards.rm_data import (
    KINDS,
    STEP_LABELS,
    RMSample,
    collect_samples,
    keep_groups,
    read_samples,
    split_by_group,
    write_samples,
)
from grpokit.rewards.rm_text import separator_flag
from grpokit.rewards.rm_train import (
    OBJECTIVES,
    PRECISIONS,
    evaluate_reward_model,
    init_reward_model,
    make_rm_optimizer,
    save_reward_model,
    train_reward_model,
)
from grpokit.tasks import load_examples
from grpokit.train.checkpoint import written_aside
from grpokit.train.guard import owned_folder

SEP_DEFAULT = RMConfig().step_separator


def _say(line: str) -> None:
    print(line, flush=True)


def _figures(m: dict[str, float]) -> str:
    return (f"AUC {m['auc']:.4f}, accuracy {m['accuracy']:.4f}, within-group AUC {m['group_auc']:.4f} "
            f"over {int(m['num_samples'])}")


def cmd_collect(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit rm collect",
                                description="Sample and label completions of a config's training problems.")
    p.add_argument("items", nargs="+", help="a YAML config, then key=value overrides")
    p.add_argument("--out", required=True, help="the samples .jsonl file to write")
    p.add_argument("--num-prompts", type=int, default=500, help="training problems to sample (seeded choice)")
    p.add_argument("--num-generations", type=int, default=None,
                   help="completions per problem (default rollout.num_generations)")
    p.add_argument("--step-labels", choices=STEP_LABELS, default=None,
                   help="also label each step (rm.step_separator): verifier | mc (rm.mc_rollouts rollouts)")
    p.add_argument("--seed", type=int, default=0, help="seed of the problem choice and of sampling")
    args = p.parse_intermixed_args(argv)
    if "=" in args.items[0]:
        raise UserError("grpokit rm collect needs a YAML config first, "
                        "e.g. grpokit rm collect configs/demo.yaml")
    out = check_out_file(args.out, "--out")
    cfg = load_config(args.items[0], args.items[1:])
    G = args.num_generations or cfg.rollout.num_generations
    if args.num_prompts < 1 or G < 1:
        raise UserError("--num-prompts and --num-generations must be at least 1")
    examples = load_examples(cfg.task, cfg.task.train_split)
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(args.seed))
    pick = order[:args.num_prompts]
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    torch.manual_seed(args.seed)
    start = time.time()
    samples = collect_samples(model, tokenizer, cfg, [examples[i] for i in pick.tolist()], num_generations=G,
                              kind="process" if args.step_labels else "outcome",
                              step_labels=args.step_labels or "verifier")
    write_samples(out, samples)
    right = sum(s.label for s in samples) / len(samples)
    _say(f"wrote {len(samples)} samples ({len(pick)} problems x {G}, {right:.1%} right"
         + (f", steps by {args.step_labels} split by {cfg.rm.step_separator!r}" if args.step_labels else "")
         + f") to {out} in {time.time() - start:.1f}s")
    return 0


def _read_all(paths: list[str], kind: str, separator: str) -> list[RMSample]:
    return [s for path in paths for s in read_samples(path, kind=kind, step_separator=separator)]


def _refuse_non_empty(out: Path, overwrite: bool) -> None:
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"--out '{out}' exists and is not empty: choose another folder or pass --overwrite")


def _train_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grpokit rm train",
                                description="Train a reward model from labeled samples.")
    p.add_argument("--data", action="append", required=True, help="a samples .jsonl (repeat for more files)")
    p.add_argument("--init", required=True,
                   help="the policy (or RM folder) whose backbone starts the RM: a path or builtin:...")
    p.add_argument("--kind", choices=KINDS, default="outcome")
    p.add_argument("--objective", choices=OBJECTIVES, default="pointwise")
    p.add_argument("--out", required=True, help="the reward-model folder to write")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--batch-size", type=int, default=32, help="samples (pairwise: pairs) per optimizer step")
    p.add_argument("--eval-share", type=float, default=0.2, help="share of the groups (problems) held out")
    p.add_argument("--max-groups", type=int, default=0,
                   help="use the samples of this many groups (problems), chosen at random (seeded; 0: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out split, the head and the order")
    p.add_argument("--step-separator", default=SEP_DEFAULT, type=separator_flag,
                   help="process RM: the text that ends a step, backslash escapes read ('\\n': a newline)")
    p.add_argument("--max-length", type=int, default=0, help="longest input in tokens (0: the model's limit)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16: the forward under bf16 autocast (fp32 weights and AdamW)")
    p.add_argument("--last-turn", action="store_true",
                   help="read a chat prompt's system and last message only (drop few-shot turns); "
                        "saved in the folder, which scores the same way")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or not args.learning_rate > 0:
        raise UserError("--epochs and --batch-size must be at least 1 and --learning-rate above 0")
    if args.max_groups < 0:
        raise UserError(f"--max-groups must be >= 0 (0: every group), got {args.max_groups}")
    if not 0 <= args.eval_share < 1:
        raise UserError(f"--eval-share must be in [0, 1), got {args.eval_share}: e.g. 0.2 holds out a fifth")
    return args


def cmd_train(argv: list[str]) -> int:
    args = _train_args(argv)
    out = check_out_dir(args.out, "--out")
    with owned_folder(out, "--out"):   # one writer per --out; SIGINT / SIGTERM: one line, --out as it was
        _refuse_non_empty(out, args.overwrite)
        return _train(args, out)


def _train(args: argparse.Namespace, out: Path) -> int:
    samples = _read_all(args.data, args.kind, args.step_separator)
    samples = keep_groups(samples, args.max_groups, torch.Generator().manual_seed(args.seed))
    train, held = split_by_group(samples, args.eval_share, torch.Generator().manual_seed(args.seed))
    _say(f"{len(samples)} samples of {len({s.group for s in samples})} groups: {len(train)} train, "
         f"{len(held)} held out (whole groups)")
    model, tokenizer = init_reward_model(args.init, args.kind, args.seed, device=args.device)
    optimizer = make_rm_optimizer(model, args.learning_rate)
    generator = torch.Generator().manual_seed(args.seed)  # the only source of the sample order
    common = {"kind": args.kind, "step_separator": args.step_separator, "last_turn": args.last_turn}
    speed = {"precision": args.precision}
    start, held_out, history = time.time(), None, []
    for epoch in range(1, args.epochs + 1):
        stats = train_reward_model(model, tokenizer, train, objective=args.objective, optimizer=optimizer,
                                   epochs=1, batch_size=args.batch_size, generator=generator,
                                   max_length=args.max_length, **common, **speed)
        line = f"epoch {epoch}/{args.epochs}: loss {stats['loss']:.4f} ({int(stats['steps'])} steps)"
        if held:
            held_out = evaluate_reward_model(model, tokenizer, held, batch_size=64,
                                             max_length=args.max_length, **common, **speed)
            line += f"; held out: {_figures(held_out)}"
        history.append({"epoch": epoch, **stats, **({"held_out": held_out} if held else {})})
        _say(line + f"  [{time.time() - start:.0f}s]")
    report = {"held_out": held_out, "objective": args.objective, "data": args.data, "epochs": args.epochs,
              "learning_rate": args.learning_rate, "batch_size": args.batch_size,
              "eval_share": args.eval_share, "precision": args.precision, "max_groups": args.max_groups,
              "seed": args.seed, "num_train": len(train), "num_held_out": len(held),
              "train_seconds": round(time.time() - start, 1), "history": history}
    with written_aside(out) as tmp:   # swapped in whole: the old --out stays until the new one is complete
        save_reward_model(model, tokenizer, tmp, init=args.init, report=report, **common)
    _say(f"reward model saved to {out}" + (f" (held out: {_figures(held_out)})" if held_out else ""))
    return 0


def cmd_eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit rm eval", description="AUC and accuracy of a reward model.")
    p.add_argument("--rm", required=True, help="a reward-model folder (grpokit rm train --out)")
    p.add_argument("--data", action="append", required=True, help="a samples .jsonl (repeat for more files)")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)
    try:  # score with the separator the RM was trained with; a broken file is the loader's to report
        saved = json.loads((Path(args.rm) / "grpokit_rm.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    trained_with = saved.get("step_separator", SEP_DEFAULT) if isinstance(saved, dict) else SEP_DEFAULT
    rm = load_reward_model(args.rm, None, device="auto", step_separator=trained_with)
    separator = getattr(rm, "step_separator", SEP_DEFAULT)
    samples = _read_all(args.data, rm.kind, separator)
    metrics = evaluate_reward_model(rm.model, rm.tokenizer, samples, kind=rm.kind, batch_size=args.batch_size,
                                    step_separator=separator, last_turn=rm.last_turn)
    _say(f"{rm.kind} RM {args.rm}: {_figures(metrics)}" + (" steps" if rm.kind == "process" else " samples"))
    return 0


COMMANDS = {"collect": cmd_collect, "train": cmd_train, "eval": cmd_eval}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: grpokit rm {collect,train,eval} ... (grpokit rm CMD --help for its options)")
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        raise UserError(f"unknown rm command '{argv[0]}': use one of {', '.join(COMMANDS)}")
    return COMMANDS[argv[0]](argv[1:])
