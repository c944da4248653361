"""Asynchronous GRPO (rollout.async.*, grpokit.train.async_rollouts): K = 0 equals the synchronous run bit for
bit; lags follow the fixed schedule and never exceed K, even with a slow worker; the worker samples with
the weights pushed every N steps; a killed worker is restarted with the same numbers, or the run stops with
one line; a killed run resumes to the weights of an uninterrupted one (CPU, tiny random model)."""

import os
import signal
from pathlib import Path

import pytest
import torch

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train.async_rollouts import DELAY_ENV, AsyncRollouts, AsyncWorkerError
from grpokit.train.checkpoint import list_checkpoints
from grpokit.train.loop import build_state, train_grpo
from grpokit.train.update import forward_logprobs
from live_runs import (  # tests/live_runs.py
    ForkServer,
    assert_same_weights,
    final_weights,
    logged,
    tiny_train_argv,
    wait_for,
)

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"


def tiny(out: Path, K: int | None = 1, N: int = 1, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 6,
              "run.save_steps": 2, "rollout.reuse_activations": False, "rollout.async.max_staleness": K,
              "rollout.async.weight_sync_steps": N, "rollout.async.worker_threads": 1}
    return build_config({**values, **over})


# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical results on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted async run, K = 1: its final weights and metrics."""
    out = tmp_path_factory.mktemp("straight")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    train_grpo(tiny(out))
    torch.set_num_threads(n)
    return out


@pytest.mark.parametrize("K,N", [(0, 1), (1, 1), (1, 2), (2, 1), (2, 3), (3, 2)])
def test_the_schedule_never_lags_more_than_k_and_samples_only_pushed_versions(K, N, tmp_path):
    ar = AsyncRollouts(tiny(tmp_path, K, N))
    versions = [ar.version_for(b) for b in range(40)]
    assert all(0 <= b - v <= min(b, K) for b, v in enumerate(versions))
    assert all(v % N == 0 for v in versions)
    assert versions == sorted(versions)
    if K == 0:
        assert versions == list(range(40))
    elif N <= K:   # every batch after the first is sampled before the step before it has updated: overlap
        assert all(v < b for b, v in enumerate(versions) if b >= 1)
    else:          # N = K + 1: every N-th batch waits for the newest weights
        assert [b for b, v in enumerate(versions) if v == b] == list(range(0, 40, N))


def test_k0_through_the_worker_equals_the_synchronous_run_bit_for_bit(tmp_path):
    sync, worker = tmp_path / "sync", tmp_path / "k0"
    train_grpo(tiny(sync, K=None, **{"run.max_steps": 4}))
    train_grpo(tiny(worker, K=0, **{"run.max_steps": 4}))
    assert_same_weights(final_weights(sync), final_weights(worker))
    a, b = read_metrics(sync), read_metrics(worker)
    keys = ["reward_mean", "loss", "grad_norm", "completion_tokens"]
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert [r["async/policy_lag"] for r in b] == [0.0] * 4
    assert all("tis/mean_weight" not in r for r in b)   # on-policy: no correction applied


def test_k0_at_the_default_thread_count_equals_the_synchronous_run_bit_for_bit(tmp_path):
    """The user's default: torch's threads on every core and rollout.async.worker_threads=0. With K = 0 the
    trainer and the worker take turns, so the worker samples on the trainer's thread count and nothing is
    pinned: the same reductions as the synchronous run (before 2026-12-06 the worker took half the cores and
    the trainer the rest, and the weights differed)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: nothing to split")
    torch.set_num_threads(cores)               # the default a user gets (one_thread restores its own after)
    sync, worker = tmp_path / "sync", tmp_path / "k0"
    train_grpo(tiny(sync, K=None, **{"run.max_steps": 4}))
    train_grpo(tiny(worker, K=0, **{"run.max_steps": 4, "rollout.async.worker_threads": 0}))
    assert torch.get_num_threads() == cores    # the trainer's threads are its own again
    assert_same_weights(final_weights(sync), final_weights(worker))


def test_lags_follow_the_schedule_and_a_slow_worker_blocks_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setenv(DELAY_ENV, "0.4")     # the worker sleeps 0.4 s before each batch: slower than a step
    K, N = 2, 1
    cfg = tiny(tmp_path, K, N, **{"run.max_steps": 6, "run.save_steps": 0})
    train_grpo(cfg)
    rows = read_metrics(tmp_path)
    ar = AsyncRollouts(cfg)
    assert [r["async/policy_lag"] for r in rows] == [float(b - ar.version_for(b)) for b in range(6)]
    assert max(r["async/policy_lag"] for r in rows) <= K
    assert all(r["async/wait_s"] > 0.2 for r in rows[K + 1:])   # the trainer waited at the bound
    assert all(r["async/dropped_groups"] == 0.0 for r in rows)
    lagged = [r for r in rows if r["async/policy_lag"] > 0]
    assert lagged and all("tis/mean_weight" in r and "mismatch/abs_logprob_diff_mean" in r for r in lagged)


@pytest.mark.parametrize("K,N", [(1, 1), (1, 2), (2, 2)])
def test_weights_reach_the_worker_every_n_steps(K, N, tmp_path):
    cfg = tiny(tmp_path, K, N)
    state = build_state(cfg)
    ar = state.async_rollouts
    seen: dict[int, dict] = {}
    try:
        for step in range(5):
            state.step = step
            seen[step] = {k: v.clone() for k, v in state.model.state_dict().items()}
            rollout, _, info = ar.next(state)
            w = ar.version_for(step)
            assert info["async/policy_lag"] == step - w == rollout.policy_lag
            now = {k: v.clone() for k, v in state.model.state_dict().items()}
            state.model.load_state_dict(seen[w])     # the weights the schedule says sampled it
            mask = rollout.completion_mask
            then_lp = forward_logprobs(state.model, rollout, cfg) * mask
            state.model.load_state_dict(now)
            now_lp = forward_logprobs(state.model, rollout, cfg) * mask
            assert torch.allclose(rollout.sampling_logprobs, then_lp, atol=1e-4), step
            if w != step:   # and not the trainer's current weights
                assert (rollout.sampling_logprobs - now_lp).abs().max() > 1e-3, step
            with torch.no_grad():   # an "update": the next version differs
                for p in state.model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
    finally:
        ar.close()


@pytest.mark.parametrize("delivered", [False, True])
def test_a_killed_worker_is_restarted_and_the_run_is_unchanged(straight, tmp_path, delivered):
    """delivered: the worker dies right after delivering batch 3, so the death is found by the checkpoint
    save after step 4, when the trainer's weights are already a version past what batch 4 needs."""
    def kill_worker(state, metrics):
        if state.step == 3:
            if delivered:
                state.async_rollouts._wait_for(3)
            state.async_rollouts.proc.kill()

    train_grpo(tiny(tmp_path), hooks={"after_step": kill_worker})
    assert_same_weights(final_weights(straight), final_weights(tmp_path))
    rows = read_metrics(tmp_path)
    assert [r["async/worker_restarts"] for r in rows][-1] == 1.0
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(straight)]


def test_a_worker_that_dies_past_max_restarts_stops_the_run_in_one_line_and_it_resumes(straight, tmp_path):
    def kill_worker(state, metrics):
        if state.step == 3:
            state.async_rollouts.proc.kill()

    with pytest.raises(AsyncWorkerError) as err:
        train_grpo(tiny(tmp_path, **{"rollout.async.max_restarts": 0}), hooks={"after_step": kill_worker})
    assert "\n" not in str(err.value) and "--resume" in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2"]
    train_grpo(tiny(tmp_path, **{"run.resume": True}))
    assert_same_weights(final_weights(straight), final_weights(tmp_path))


def test_a_run_stopped_after_a_checkpoint_resumes_to_the_uninterrupted_weights(straight, tmp_path):
    def crash(state, metrics):
        if state.step == 5:
            raise KeyboardInterrupt   # after checkpoint-4; the worker had batch 5 sampled ahead
    with pytest.raises(KeyboardInterrupt):
        train_grpo(tiny(tmp_path), hooks={"after_step": crash})
    train_grpo(tiny(tmp_path, **{"run.resume": True}))
    assert_same_weights(final_weights(straight), final_weights(tmp_path))
    assert [r["loss"] for r in read_metrics(tmp_path)] == [r["loss"] for r in read_metrics(straight)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from Linux /proc")
def test_sigkill_mid_run_then_resume_is_bit_identical_and_the_worker_ends_with_it(tmp_path):
    server = ForkServer()
    try:
        ref, out = tmp_path / "ref", tmp_path / "killed"
        args = ("rollout.reuse_activations=false", "rollout.async.max_staleness=1",
                "rollout.async.worker_threads=1", "run.resume=auto")
        argv = lambda o: tiny_train_argv(o, EASY, *args, steps=8, save=2)  # noqa: E731
        assert server.wait(server.run(argv(ref), str(ref) + ".log")) == 0, Path(str(ref) + ".log").read_text()
        pid = server.run(argv(out), str(out) + ".log")
        wait_for(lambda: logged(out) >= 5, "step 5")
        workers = children(pid)   # the worker (and multiprocessing's resource tracker)
        assert workers
        assert server.kill(pid) == -signal.SIGKILL
        wait_for(lambda: all(_zombie(w) for w in workers), "the orphaned worker to end", timeout=15)
        assert server.wait(server.run(argv(out), str(out) + ".log")) == 0, Path(str(out) + ".log").read_text()
        assert_same_weights(final_weights(ref), final_weights(out))
        assert [r["step"] for r in read_metrics(out)] == list(range(1, 9))
    finally:
        server.close()


def children(pid: int) -> list[int]:
    """The pids whose parent is pid (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _zombie(pid: int) -> bool:
    """The process has ended (gone, or a zombie nobody reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("over,needle", [
    ({"rollout.async.weight_sync_steps": 3}, "weight_sync_steps=3 must be between 1 and max_staleness + 1"),
    ({"rollout.dynamic_sampling": True}, "rollout.dynamic_sampling: not supported"),
    ({"rollout.async.max_staleness": -1}, "max_staleness must be >= 0"),
    ({"rollout.async.worker_threads": -2}, "worker_threads must be >= 0"),
])
def test_async_settings_that_cannot_work_are_refused_in_one_line(over, needle, tmp_path):
    with pytest.raises(ConfigError) as err:
        tiny(tmp_path, **over)
    assert needle in str(err.value) and "\n" not in str(err.value)


class RecordingEngine:
    """A vLLM stand-in behind `grpokit vllm-serve`'s HTTP server: seeded random tokens, log-probs from
    the weights it was last sent, and a fingerprint of those weights at every generate call."""

    def __init__(self, model, eos_id: int):
        self.model, self.eos_id = model, eos_id
        self.seen: list[tuple[int, float]] = []    # (seed, fingerprint of the weights held)

    def generate(self, prompt_ids, spec):
        from grpokit.model.logprobs import per_token_logprobs
        from grpokit.rollout.vllm_backend import Sample

        self.seen.append((spec.seed, fingerprint(self.model.state_dict())))
        g = torch.Generator().manual_seed(spec.seed)
        out = []
        for ids in prompt_ids:
            group = []
            for _ in range(spec.n):
                n = int(torch.randint(1, spec.max_tokens + 1, (1,), generator=g))
                toks = torch.randint(10, 60, (n,), generator=g).tolist()[:-1] + [self.eos_id]
                full = torch.tensor([list(ids) + toks])
                with torch.no_grad():
                    lp = per_token_logprobs(self.model, full, torch.ones_like(full), len(toks))[0]
                group.append(Sample(toks, lp.tolist()))
            out.append(group)
        return out

    def load_weights(self, weights):
        self.model.load_state_dict(dict(weights), strict=False)

    def sleep(self):
        pass

    def wake_up(self):
        pass


def fingerprint(weights: dict) -> float:
    return float(sum(t.double().sum() * (i + 1) for i, t in enumerate(weights.values())))


def test_server_mode_the_worker_drives_the_server_with_the_weights_of_the_schedule(tmp_path):
    import copy
    import threading

    from grpokit.cli.vllm_serve import make_server
    from grpokit.model.loading import load_model_and_tokenizer

    K, N = 2, 2
    cfg = tiny(tmp_path, K, N, **{"rollout.backend": "vllm", "rollout.vllm_mode": "server",
                                  "run.max_steps": 6, "run.save_steps": 3})
    model, tok = load_model_and_tokenizer(cfg.model, seed=cfg.run.seed)
    versions = {0: fingerprint(model.state_dict())}
    engine = RecordingEngine(copy.deepcopy(model), tok.eos_token_id)
    server = make_server(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        train_grpo(tiny(tmp_path, K, N, **{"rollout.backend": "vllm", "rollout.vllm_mode": "server",
                                           "rollout.vllm_server_base_url": url, "run.max_steps": 6,
                                           "run.save_steps": 3}),
                   model, tok, hooks={"after_step": lambda s, m: versions.__setitem__(
                       s.step, fingerprint(s.model.state_dict()))})
    finally:
        server.shutdown()
        server.server_close()
    ar = AsyncRollouts(cfg)
    # batches 0..5 plus the K sampled ahead of the end; each one with the weights of version w(b)
    assert [seed for seed, _ in engine.seen] == [(cfg.run.seed * 1_000_003 + b) % (2**31 - 1)
                                                  for b in range(len(engine.seen))]
    assert len(engine.seen) >= 6
    for b, (_, held) in enumerate(engine.seen[:6]):
        assert held == pytest.approx(versions[ar.version_for(b)], rel=1e-9), b
    rows = read_metrics(tmp_path)
    assert [r["async/policy_lag"] for r in rows] == [float(b - ar.version_for(b)) for b in range(6)]
