"""run.max_minutes: the run stops after the step that spends the training-time budget, then evaluates
and saves exactly as at run.max_steps."""

import json

import pytest
from tests.train.test_guards import tiny

import grpokit.train.loop as loop_mod
from grpokit.config.schema import ConfigError
from grpokit.observe.metrics import PhaseTimer, read_metrics
from grpokit.train.loop import train_grpo

pytestmark = pytest.mark.usefixtures("one_thread")


class TenSecondSteps(PhaseTimer):
    """Every step reports 10 s of training, whatever it really took: the budget check is deterministic."""

    def pop(self):
        out = super().pop()
        return {**out, "time/step": 10.0} if "time/step" in out else out


def test_the_run_stops_after_the_step_that_spends_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_mod, "PhaseTimer", TenSecondSteps)
    out = tmp_path / "run"
    cfg = tiny(out, **{"run.max_steps": 50, "run.max_minutes": 0.5, "run.eval_limit": 4, "task.num_eval": 8})
    state = train_grpo(cfg)
    assert state.step == 3                                   # 10 + 10 + 10 s reaches the 30 s budget
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["tag"], e["step"]) for e in evals] == [("before", 0), ("after", 3)]
    assert (out / "final" / "config.json").is_file()


def test_no_budget_runs_every_step(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_mod, "PhaseTimer", TenSecondSteps)
    assert train_grpo(tiny(tmp_path / "run", **{"run.max_steps": 4})).step == 4


def test_a_negative_budget_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        tiny(tmp_path / "run", **{"run.max_minutes": -1})
    assert str(e.value) == "run.max_minutes must be >= 0 (0 = no time budget), got -1.0"
