"""Experiment trackers: TensorBoard read back with its own reader, the others through stand-in modules."""

import importlib.machinery
import importlib.util
import json
import math
import sys
import types

import pytest

from grpokit.config.schema import ConfigError, build_config
from grpokit.observe.loggers import Loggers, build_loggers, resolve_report_to, scalars, tag

ROW = {"step": 3, "reward_mean": 0.5, "approx_kl": 0.01, "time/generate": 1.5, "rewards/rule": 0.25,
       "frac_truncated": float("nan"), "flag": True, "note": "text"}
ENTRY = {"step": 3, "prompt": "What is 2+2?", "answer": "4", "reward_mean": 0.5, "reward_std": 0.7,
         "completions": [{"text": "\\boxed{4}", "reward": 1.0, "advantage": 0.7, "rewards": {}, "length": 9,
                          "truncated": False},
                         {"text": "5 | 6", "reward": 0.0, "advantage": -0.7, "rewards": {}, "length": 5,
                          "truncated": False}]}


def test_tags_and_scalars():
    assert tag("reward_mean") == "train/reward_mean" and tag("time/generate") == "time/generate"
    vals = scalars(ROW)
    assert set(vals) == {"train/reward_mean", "train/approx_kl", "time/generate", "rewards/rule",
                         "train/frac_truncated"}          # no step, bool or string
    assert math.isnan(vals["train/frac_truncated"])


def test_report_to_none_needs_no_package(tmp_path):
    for value in ([], ["none"], "none", None):
        assert resolve_report_to(value) == []
    from grpokit.config.schema import load_config

    assert load_config(None, ["run.report_to=none"]).run.report_to == []   # the YAML / CLI spelling
    loggers = build_loggers(["none"], tmp_path, {})
    assert len(loggers) == 0
    loggers.log(ROW, 3)        # no-ops
    loggers.close()
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_is_a_one_line_error_with_a_suggestion():
    with pytest.raises(ConfigError) as e:
        resolve_report_to(["tensorbord"])
    assert "did you mean 'tensorboard'" in str(e.value) and "\n" not in str(e.value)


def test_missing_package_is_a_one_line_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as e:
        resolve_report_to(["tensorboard", "wandb"])
    msg = str(e.value)
    assert ("wandb package is not installed" in msg and "pip install 'grpokit[wandb]'" in msg
            and "\n" not in msg)


def test_train_cli_fails_fast_on_a_missing_logger(monkeypatch, tmp_path, capsys):
    from grpokit.cli.main import main
    from grpokit.train import loop

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    monkeypatch.setattr(loop, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("model loaded"))
    rc = main(["train", "run.report_to=[tensorboard,mlflow]", f"run.output_dir={tmp_path / 'run'}"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mlflow package is not installed" in err[0]
    assert not (tmp_path / "run").exists()  # failed before touching the output folder


def read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    loggers = build_loggers(["tensorboard"], tmp_path, {"loss": {"beta": 0.04}})
    for step in (1, 2, 3):
        loggers.log({**ROW, "step": step, "reward_mean": 0.1 * step}, step)
    loggers.log_eval({"tag": "after", "step": 3, "accuracy": 0.75, "num_problems": 20.0})
    loggers.log_completions([ENTRY], 3)
    loggers.close()
    acc = read_events(tmp_path / "tensorboard")
    tags = acc.Tags()
    assert {"train/reward_mean", "train/approx_kl", "time/generate", "rewards/rule",
            "eval/accuracy"} <= set(tags["scalars"])
    assert ([(e.step, round(e.value, 6)) for e in acc.Scalars("train/reward_mean")]
            == [(1, 0.1), (2, 0.2), (3, 0.3)])
    assert [(e.step, e.value) for e in acc.Scalars("eval/accuracy")] == [(3, 0.75)]
    assert {"config/text_summary", "completions/text_summary"} <= set(tags["tensors"])
    text = acc.Tensors("completions/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "\\boxed{4}" in text and "5 \\| 6" in text and "+0.700" in text


def test_training_run_writes_tensorboard_scalars_equal_to_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from grpokit.train.loop import train_grpo
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
                        "rollout.num_generations": 4, "rollout.max_completion_length": 8, "run.max_steps": 2,
                        "run.eval_limit": 0, "run.output_dir": str(tmp_path / "run"), "run.progress": False,
                        "run.report_to": ["tensorboard"], "run.log_completions_steps": 1})
    train_grpo(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    acc = read_events(tmp_path / "run" / "tensorboard")
    for key in ("reward_mean", "accuracy", "frac_zero_std", "frac_stuck", "approx_kl", "entropy",
                "clip_ratio_high", "completion_length_mean", "grad_norm", "learning_rate", "time/generate",
                "time/step", "time/log", "tokens_per_s", "peak_rss_mib"):
        got = [(e.step, e.value) for e in acc.Scalars(tag(key))]
        assert got == [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-6)) for r in rows], key
    assert len(acc.Tensors("completions/text_summary")) == 2


class Recorder(types.ModuleType):
    """A stand-in tracker module: records every call, returns simple objects."""

    def __init__(self, name, **extra):
        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)
        self.calls = []
        for fn in extra.get("functions", ()):
            setattr(self, fn, self._recorder(fn))

    def _recorder(self, fn):
        def call(*args, **kwargs):
            self.calls.append((fn, args, kwargs))
            return types.SimpleNamespace(id="run123")
        return call

    def names(self):
        return [c[0] for c in self.calls]


def test_wandb_mlflow_trackio_adapters_with_stand_in_modules(tmp_path, monkeypatch):
    wandb = Recorder("wandb", functions=("init", "log", "finish", "Table"))
    mlflow = Recorder("mlflow",
                      functions=("set_tracking_uri", "create_experiment", "set_experiment", "start_run",
                                           "log_params", "log_metrics", "log_text", "end_run"))
    mlflow.get_experiment_by_name = lambda name: None
    trackio = Recorder("trackio", functions=("init", "log", "finish", "Table"))
    for mod in (wandb, mlflow, trackio):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"loss": {"beta": 0.04}, "run": {"max_steps": 10}}
    loggers = build_loggers(["wandb", "mlflow", "trackio"], tmp_path / "myrun", config)
    loggers.log(ROW, 3)
    loggers.log_completions([ENTRY], 3)
    loggers.close()

    assert wandb.names() == ["init", "log", "Table", "log", "finish"]
    init = wandb.calls[0][2]
    assert init["config"] == config and init["name"] == "myrun" and init["dir"] == str(tmp_path / "myrun")
    assert wandb.calls[1][1][0]["train/reward_mean"] == 0.5 and wandb.calls[1][2] == {"step": 3}
    table = wandb.calls[2][2]
    assert table["columns"][:4] == ["step", "prompt", "answer", "completion"] and len(table["data"]) == 2
    assert (tmp_path / "myrun" / "wandb_run_id").read_text() == "run123"

    assert mlflow.names() == ["set_tracking_uri", "create_experiment", "set_experiment",
                              "start_run", "log_params", "log_metrics", "log_text", "end_run"]
    assert mlflow.calls[0][1][0] == f"sqlite:///{(tmp_path / 'myrun' / 'mlflow.db').resolve()}"
    assert mlflow.calls[1][2]["artifact_location"] == (tmp_path / "myrun" / "mlartifacts").resolve().as_uri()
    assert mlflow.calls[4][1][0] == {"loss.beta": "0.04", "run.max_steps": "10"}
    logged = mlflow.calls[5][1][0]
    assert logged["time/generate"] == 1.5 and "train/frac_truncated" not in logged  # NaN dropped
    assert mlflow.calls[6][1][1] == "completions/step_000003.md"

    assert trackio.names() == ["init", "log", "Table", "log", "finish"]
    assert trackio.calls[0][2]["project"] == "grpokit" and trackio.calls[1][2] == {"step": 3}
    assert trackio.calls[0][2]["name"] == "myrun"


def test_run_name_names_the_run_in_every_tracker(tmp_path, monkeypatch):
    """TRL's run_name -> run.run_name: the name wandb, mlflow and trackio show (else the folder's)."""
    mods = {"wandb": Recorder("wandb", functions=("init", "finish")),
            "mlflow": Recorder("mlflow", functions=("set_tracking_uri", "create_experiment", "set_experiment",
                                                    "start_run", "log_params", "end_run")),
            "trackio": Recorder("trackio", functions=("init", "finish"))}
    mods["mlflow"].get_experiment_by_name = lambda name: None
    for mod in mods.values():
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {"run": {"run_name": "ablation-3"}}
    build_loggers(["wandb", "mlflow", "trackio"], tmp_path / "myrun", config).close()
    assert mods["wandb"].calls[0][2]["name"] == "ablation-3" == mods["trackio"].calls[0][2]["name"]
    assert [c[2]["run_name"] for c in mods["mlflow"].calls if c[0] == "start_run"] == ["ablation-3"]


def test_loggers_close_is_idempotent():
    closed = []
    lg = types.SimpleNamespace(close=lambda: closed.append(1))
    loggers = Loggers([lg])
    loggers.close()
    loggers.close()
    assert closed == [1]


def test_resume_drops_rows_and_events_written_after_the_checkpoint(tmp_path):
    """A run killed after step 3 (checkpoint at 2), resumed to step 4: every log holds steps 1..4 once."""
    pytest.importorskip("tensorboard")
    from grpokit.observe.metrics import read_metrics
    from grpokit.train.loop import train_grpo
    base = {"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
            "rollout.num_generations": 4, "rollout.max_completion_length": 6, "run.eval_limit": 0,
            "run.output_dir": str(tmp_path / "run"), "run.progress": False, "run.report_to": ["tensorboard"],
            "run.log_completions_steps": 1, "run.track_prompts": True, "run.save_steps": 2}
    train_grpo(build_config({**base, "run.max_steps": 3}))
    train_grpo(build_config({**base, "run.max_steps": 4, "run.resume": True}))
    out = tmp_path / "run"
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(out, "prompt_history.jsonl")] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [r["step"] for r in read_metrics(out, "completions.jsonl")] == [1, 1, 2, 2, 3, 3, 4, 4]
    acc = read_events(out / "tensorboard")
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2, 3, 4]
