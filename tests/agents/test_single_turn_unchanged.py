"""Single-turn runs are exactly what they were before multi-turn rollouts existed.

`single_turn_reference.json` was recorded by `record()` below on main just before the agents merge
(commit 7fb8e91, this machine kind, one torch thread; its weights and evaluations equal those of 2efb2db,
where the agents branch began): a 3-step demo-model run's metrics.jsonl rows (timings
dropped), its before/after evaluation rows, the sha256 of the final weights, and one sampler call's
tensors. The same calls today must give the same numbers, bit for bit: the tools machinery is off
when no tool or environment is configured, and it changes neither the tensors nor the RNG draws.
(Recorded on this machine's CPU; another CPU's matmul kernels may round differently.)

    PYTHONPATH=src python tests/agents/test_single_turn_unchanged.py   # re-record (prints the JSON)
"""

from __future__ import annotations

import hashlib
import json
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
    metrics = [{k: v for k, v in r.items() if not k.startswith(timing) and not k.endswith("_per_s")}
               for r in rows]
    evals = [json.loads(line) for line in (Path(out) / "eval.jsonl").read_text().splitlines()]
    return {"metrics": metrics, "eval": evals, "weights_sha256": _sha(state.model.state_dict().values())}


def _sampler_call() -> dict:
    tok = build_char_tokenizer()
    model = tiny_random_model(tok, seed=3)
    torch.manual_seed(7)
    r = sample_groups(model, tok, ["What is 12+34?", "Hi"], 3, 20, temperature=0.9, top_k=40)
    return {"completion_ids": r.completion_ids.tolist(), "completion_mask": r.completion_mask.tolist(),
            "logprobs_sha256": _sha([r.sampling_logprobs]), "truncated": r.truncated.tolist(),
            "rng_after": float(torch.rand(1))}


def record() -> dict:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as out:
            return {"demo_run": _demo_run(out), "sampler": _sampler_call()}
    finally:
        torch.set_num_threads(n)


def test_single_turn_run_is_bit_identical_to_before_agents():
    want = json.loads(REFERENCE.read_text())
    got = json.loads(json.dumps(record()))   # the same float -> JSON round trip as the recording
    assert got["sampler"] == want["sampler"]
    assert got["demo_run"]["metrics"] == want["demo_run"]["metrics"]
    assert got["demo_run"]["eval"] == want["demo_run"]["eval"]
    assert got["demo_run"]["weights_sha256"] == want["demo_run"]["weights_sha256"]


if __name__ == "__main__":
    print(json.dumps(record(), indent=1))
    sys.exit(0)
