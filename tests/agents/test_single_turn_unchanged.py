"""Single-turn runs are exactly what they were before multi-turn rollouts existed.

`single_turn_reference.json` holds recordings of `record()` below made with the code of main just
before the agents merge (commit 7fb8e91; its weights and evaluations equal those of 2efb2db, where the
agents branch began), one torch thread, each on the CPU it names (`cpu_signature`): a 3-step demo-model
run's metrics.jsonl rows (timings dropped), its before/after evaluation rows, the sha256 of the final
weights, and one sampler call's tensors. The same calls today must give the same numbers: the tools
machinery is off when no tool or environment is configured, and it changes neither the tensors nor the
RNG draws.

Bit for bit holds on one CPU kind only (another's matmul kernels round differently: a recording made in
2026-11 on a CPU it did not name and the 2026-12-06 Xeon with AMX below differ by ~1e-6 relative in
grad_norm, with the same tokens). So on a
CPU with a recording every figure and hash must be equal; on any other, the tokens, masks, RNG draws and
evaluations must be equal and the floats within 1e-4 relative of the first recording.

    git worktree add /tmp/pre 7fb8e91 && PYTHONPATH=/tmp/pre/src \
        python tests/agents/test_single_turn_unchanged.py   # a recording for this CPU (prints the JSON)
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import tempfile
from pathlib import Path

import torch

from grpokit.config.schema import build_config
from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.rollout.groups import sample_groups
from grpokit.train.loop import train_grpo

REFERENCE = Path(__file__).with_name("single_turn_reference.json")


def _sha(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


# metrics rows gained these keys after the recording (new figures: the recorded ones must not change)
ADDED_AFTER = ("input_tokens_seen",)


def _demo_run(out: str) -> dict:
    cfg = build_config({"model.name_or_path": "builtin:arith-demo", "model.device": "cpu",
                        "task.operators": "+", "task.num_train": 200, "task.num_eval": 20,
                        "rollout.num_generations": 4, "rollout.prompts_per_step": 4,
                        "rollout.max_completion_length": 24, "rollout.max_prompt_length": 64,
                        "optim.learning_rate": 1e-4, "run.max_steps": 3, "run.eval_limit": 8,
                        "run.output_dir": out, "run.progress": False, "run.seed": 0})
    state = train_grpo(cfg)
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "memory", "peak")
    metrics = [{k: v for k, v in r.items() if not k.startswith(timing) and not k.endswith("_per_s")
                and k not in ADDED_AFTER} for r in rows]
    evals = [json.loads(line) for line in (Path(out) / "eval.jsonl").read_text().splitlines()]
    return {"metrics": metrics, "eval": evals, "weights_sha256": _sha(state.model.state_dict().values())}


def _sampler_call() -> dict:
    tok = build_char_tokenizer()
    model = tiny_random_model(tok, seed=3)
    torch.manual_seed(7)
    r = sample_groups(model, tok, ["What is 12+34?", "Hi"], 3, 20, temperature=0.9, top_k=40)
    return {"completion_ids": r.completion_ids.tolist(), "completion_mask": r.completion_mask.tolist(),
            "logprobs_sha256": _sha([r.sampling_logprobs]), "logprobs": r.sampling_logprobs.tolist(),
            "truncated": r.truncated.tolist(),
            "rng_after": float(torch.rand(1))}


def cpu_signature() -> str:
    """The CPU's vendor, model and the instruction sets its matmul kernels choose between."""
    isa = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile")
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name", platform.processor())
    vendor = fields.get("vendor_id", platform.machine())
    return " | ".join([vendor, model, " ".join(f for f in isa if f in flags)])


def record() -> dict:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as out:
            return {"cpu": cpu_signature(), "demo_run": _demo_run(out), "sampler": _sampler_call()}
    finally:
        torch.set_num_threads(n)


def _close(got, want, path: str = "") -> None:
    """got == want, floats within 1e-4 relative (another CPU's rounding); everything else exactly."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7), (path, got, want)
    else:
        assert got == want, (path, got, want)


def test_single_turn_run_is_unchanged_since_before_agents():
    recordings = json.loads(REFERENCE.read_text())["recordings"]
    got = json.loads(json.dumps(record()))   # the same float -> JSON round trip as the recording
    same_cpu = [r for r in recordings if r["cpu"] == got["cpu"]]
    if same_cpu:   # bit for bit: every figure, the sampler's log-probs and the final weights' hash
        want = same_cpu[0]
        assert got["sampler"] == want["sampler"]
        assert got["demo_run"]["metrics"] == want["demo_run"]["metrics"]
        assert got["demo_run"]["eval"] == want["demo_run"]["eval"]
        assert got["demo_run"]["weights_sha256"] == want["demo_run"]["weights_sha256"]
        return
    want = recordings[0]   # another CPU: the same tokens and draws, the floats to its rounding
    for key in ("completion_ids", "completion_mask", "truncated", "rng_after"):
        assert got["sampler"][key] == want["sampler"][key], key
    _close(got["sampler"]["logprobs"], want["sampler"]["logprobs"], "sampler.logprobs")
    _close(got["demo_run"]["metrics"], want["demo_run"]["metrics"], "metrics")
    assert got["demo_run"]["eval"] == want["demo_run"]["eval"]


if __name__ == "__main__":
    print(json.dumps(record(), indent=1))
    sys.exit(0)
