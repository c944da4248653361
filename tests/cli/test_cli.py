"""The `grpokit` command: resolved config printed and saved, presets reported, one-line user errors."""

import json

from grpokit.cli.main import main

TINY = ["model.name_or_path=builtin:tiny-random", "rollout.prompts_per_step=2", "rollout.num_generations=4",
        "rollout.max_completion_length=8", "run.max_steps=1", "run.eval_limit=0", "run.progress=false"]


def test_preset_dapo_prints_and_saves_resolved_values_and_reports_conflicts(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "preset=dapo", "loss_type=grpo", "overlong_buffer=4", f"run.output_dir={out}", *TINY])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "preset: dapo" in printed
    assert "loss.epsilon_high = 0.28   # from preset dapo" in printed
    assert "loss.loss_type = 'grpo'   # explicit, overrides preset dapo ('dapo')" in printed
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] == "dapo"
    assert saved["loss"]["epsilon_high"] == 0.28 and saved["loss"]["beta"] == 0.0
    assert saved["loss"]["loss_type"] == "grpo" and saved["rollout"]["dynamic_sampling"] is True


def test_user_error_is_one_line_without_traceback(tmp_path, capsys):
    rc = main(["train", "loss.betta=0.1", f"run.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == "error: unknown config key 'loss.betta' (did you mean 'loss.beta'?)\n"


def test_debug_flag_shows_the_traceback(tmp_path):
    import pytest

    from grpokit.config.schema import ConfigError

    with pytest.raises(ConfigError):
        main(["train", "loss.betta=0.1", "--debug"])
