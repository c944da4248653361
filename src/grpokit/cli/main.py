"""The `grpokit` command: train | eval | sft | plot | report | bench.

    grpokit train                         # the built-in demo: GRPO on arithmetic, offline
    grpokit train cfg.yaml loss.beta=0.0  # a YAML config with dotted overrides
    grpokit train preset=dapo reward.overlong_buffer=4 --overwrite   # the demo: 24-token completions

Each command is a module with `main(argv)` (SUBCOMMANDS), imported only when it runs; the config of
a run comes from `grpokit.config.run_config`. User errors (bad config, missing model, bad data, ...)
print one line and exit 2; --debug shows the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

from grpokit import switch
from grpokit.config.run_config import DEMO, DEMO_TASK_KEYS, demo_config, describe, train_config  # noqa: F401  (public here too)
from grpokit.errors import run_command

SUBCOMMANDS = {  # name -> module with main(argv) -> int, imported when its command runs
    "train": "grpokit.cli.train", "eval": "grpokit.cli.eval", "sft": "grpokit.cli.sft",
    "plot": "grpokit.cli.plot",
    "report": "grpokit.cli.report",
    "bench": "grpokit.cli.bench", "vllm-serve": "grpokit.cli.vllm_serve", "sweep": "grpokit.cli.sweep",
    "rm": "grpokit.cli.rm", "sandbox-serve": "grpokit.cli.sandbox_serve",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    logging.basicConfig(level=logging.INFO, format="grpokit: %(message)s")
    for noisy in ("httpx", "urllib3", "transformers", "matplotlib"):   # matplotlib: its font-cache note
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # bitsandbytes (when installed) tries a hub kernel for its CPU 4-bit matmul at import and logs that it
    # cannot load it offline; grpokit never uses that kernel (grpokit.model.quantized turns it off)
    for noisy in ("bitsandbytes.backends.cpu.ops", "kernels"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the middle of our output
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: grpokit {{{','.join(SUBCOMMANDS)}}} ... (grpokit train: the built-in demo)")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in SUBCOMMANDS:
        switch.for_this_process()   # this process is grpokit's: its one process-wide speed-up
        return run_command(importlib.import_module(SUBCOMMANDS[cmd]).main, rest, debug)
    print(f"error: unknown command '{cmd}': use one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
