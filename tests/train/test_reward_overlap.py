"""reward.overlap (grpokit.train.collect.Scoring): the rewards scored on a thread while the step's reference
pass runs give the sequential step's numbers bit for bit, really run beside the reference pass (shown by
events, not timings), fail as the sequential step fails, and the modes that need the rewards first are
refused (CPU, tiny random model, seconds)."""

import threading
from pathlib import Path

import pytest
import torch

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.metrics import read_metrics
from grpokit.rewards.calls import RewardError
from grpokit.train import step as step_module
from grpokit.train.loop import train_grpo

EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py")


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {EASY + ":share_of_a": 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 3,
              "run.save_steps": 0}
    values.update(over)
    return build_config(values)


# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


def no_reward_thread() -> bool:
    return not any(t.name == "grpokit-rewards" for t in threading.enumerate())


KEYS = ("reward_mean", "reward_std", "loss", "grad_norm", "advantage_mean", "approx_kl", "reward_errors")


@pytest.mark.parametrize("over", [{}, {"rollout.steps_per_generation": 2, "run.max_steps": 4},
                                  {"loss.kl_in_reward": True, "reward.funcs": {EASY + ":paced_dense": 1.0}}],
                         ids=["plain", "generation_reuse", "kl_in_reward"])
def test_overlap_gives_the_sequential_numbers(tmp_path, over):
    off = train_grpo(tiny(tmp_path / "off", **over))
    on = train_grpo(tiny(tmp_path / "on", **{**over, "reward.overlap": True}))
    a, b = off.model.state_dict(), on.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows_off, rows_on = read_metrics(tmp_path / "off"), read_metrics(tmp_path / "on")
    assert len(rows_off) == len(rows_on) == on.step
    for r_off, r_on in zip(rows_off, rows_on):
        assert [r_off.get(k) for k in KEYS] == [r_on.get(k) for k in KEYS]
        assert {k: v for k, v in r_off.items() if k.startswith("rewards/")} == \
            {k: v for k, v in r_on.items() if k.startswith("rewards/")}
    assert any(r["grad_norm"] > 0 for r in rows_on)   # the weights moved: the identity is not trivial
    sampled = [r for r in rows_on if r.get("generation/slice", 0.0) == 0.0]   # the rows that scored
    for r in sampled:
        assert r["time/reward"] > 0 and r["time/reward_wait"] >= 0
    for r in rows_off:   # sequential: the step waits for all of the scoring (an outer timer around it)
        if "time/reward" in r:
            assert r["time/reward_wait"] >= r["time/reward"]
    assert no_reward_thread()


class Recorder:
    """A reward that tells what ran while it did: it starts, then (blocking=True) returns only once the
    reference pass of the step has finished; the patched reference pass records what it saw."""

    def __init__(self, blocking: bool):
        self.blocking, self.started, self.ref_done = blocking, threading.Event(), threading.Event()
        self.log: list[tuple[str, str, bool]] = []   # (what, thread, reward running at that moment)
        self.running = False
        self.__name__ = "recorder"

    def __call__(self, prompts, completions, **kwargs):
        self.ref_done.clear()
        self.running = True
        self.started.set()
        self.log.append(("reward_start", threading.current_thread().name, True))
        if self.blocking:   # the sequential step would never get here with ref_done set: it would time out
            assert self.ref_done.wait(timeout=60), "the reference pass did not run while the reward waited"
        self.log.append(("reward_end", threading.current_thread().name, True))
        self.running = False
        self.started.clear()
        return [float(len(c) % 3) for c in completions]

    def patch(self, monkeypatch):
        real = step_module.forward_logprobs

        def ref_forward(model, rollout, cfg, fn=None):
            if self.blocking:   # the reward thread may start after the pass would: let it begin first
                assert self.started.wait(timeout=60), "the reward did not start beside the reference pass"
            self.log.append(("ref_start", threading.current_thread().name, self.running))
            out = real(model, rollout, cfg, fn)
            self.log.append(("ref_end", threading.current_thread().name, self.running))
            self.ref_done.set()
            return out

        monkeypatch.setattr(step_module, "forward_logprobs", ref_forward)  # default config: the ref pass only


def test_a_slow_reward_runs_beside_the_reference_pass(tmp_path, monkeypatch):
    rec = Recorder(blocking=True)
    rec.patch(monkeypatch)
    cfg = tiny(tmp_path / "on", **{"reward.overlap": True, "run.max_steps": 2})
    train_grpo(cfg, reward_funcs=[("recorder", rec, 1.0)])
    per_step = [rec.log[i:i + 4] for i in range(0, len(rec.log), 4)]
    assert len(per_step) == 2
    main = threading.main_thread().name
    for events in per_step:
        names = [e[0] for e in events]
        assert names == ["reward_start", "ref_start", "ref_end", "reward_end"], names
        assert events[0][1] == "grpokit-rewards" and events[1][1] == main   # two threads
        assert events[1][2] and events[2][2]     # the reward was running through the whole ref pass
    rows = read_metrics(tmp_path / "on")
    assert all(r["time/reward"] > 0 for r in rows)
    assert no_reward_thread()


def test_without_overlap_the_reward_finishes_before_the_reference_pass(tmp_path, monkeypatch):
    rec = Recorder(blocking=False)
    rec.patch(monkeypatch)
    train_grpo(tiny(tmp_path / "off", **{"run.max_steps": 2}), reward_funcs=[("recorder", rec, 1.0)])
    names = [e[0] for e in rec.log]
    assert names == ["reward_start", "reward_end", "ref_start", "ref_end"] * 2, names
    assert not any(e[2] for e in rec.log if e[0].startswith("ref"))
    assert {e[1] for e in rec.log} == {threading.main_thread().name}


def test_a_raising_reward_fails_the_same_way(tmp_path):
    errors = []
    for overlap in (False, True):
        with pytest.raises(RewardError) as info:
            train_grpo(tiny(tmp_path / str(overlap), **{"reward.overlap": overlap,
                                                       "reward.funcs": {EASY + ":broken": 1.0}}))
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "broken" in errors[0] and "KeyError" in errors[0]
    assert no_reward_thread()


def flaky(prompts, completions, **kwargs):
    """Raises on the batch and on every completion of odd length; scores the others."""
    if len(completions) > 1 or len(completions[0]) % 2:
        raise ValueError("odd")
    return [float(len(completions[0]) % 5)]


def test_skipped_reward_errors_are_the_same_both_ways(tmp_path):
    funcs = [("flaky", flaky, 1.0)]
    runs = {}
    for overlap in (False, True):
        cfg = tiny(tmp_path / str(overlap), **{"reward.overlap": overlap, "reward.reward_errors": "skip"})
        state = train_grpo(cfg, reward_funcs=funcs)
        runs[overlap] = (state.model.state_dict(), read_metrics(tmp_path / str(overlap)))
    (a, rows_off), (b, rows_on) = runs[False], runs[True]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["reward_errors"] for r in rows_off] == [r["reward_errors"] for r in rows_on]
    assert sum(r["reward_errors"] for r in rows_on) > 0   # some completions were skipped


def test_a_failing_pass_still_joins_the_reward_thread(tmp_path, monkeypatch):
    def broken_forward(*args, **kwargs):
        raise RuntimeError("ref pass broke")

    monkeypatch.setattr(step_module, "forward_logprobs", broken_forward)
    with pytest.raises(RuntimeError, match="ref pass broke"):
        train_grpo(tiny(tmp_path / "on", **{"reward.overlap": True}),
                   reward_funcs=[("slow", Recorder(blocking=False), 1.0)])
    assert no_reward_thread()


@pytest.mark.parametrize("over, named", [
    ({"rollout.dynamic_sampling": True}, "rollout.dynamic_sampling"),
    ({"loss.algorithm": "ppo"}, "loss.algorithm=ppo"),
    ({"reward.funcs": {"rm:some/folder": 1.0}}, "a learned reward model on the policy's device"),
    ({"reward.funcs": {"rm:some/folder": 1.0}, "model.device": "cpu", "rm.device": "cpu"},
     "a learned reward model on the policy's device"),
])
def test_refused_combinations_say_what_to_change(tmp_path, over, named):
    with pytest.raises(ConfigError) as info:
        tiny(tmp_path, **{"reward.overlap": True, **over})
    message = str(info.value)
    assert f"reward.overlap=true with {named}" in message and "reward.overlap=false" in message
    assert "\n" not in message
    tiny(tmp_path, **over)   # each of them alone is a valid config: the refusal is the overlap's


def test_composing_modes_are_accepted(tmp_path):
    for over in ({"loss.kl_in_reward": True}, {"rollout.steps_per_generation": 2},
                 {"reward.funcs": {"rm:some/folder": 1.0}, "model.device": "cpu", "rm.device": "cuda"}):
        assert tiny(tmp_path, **{"reward.overlap": True, **over}).reward.overlap is True
