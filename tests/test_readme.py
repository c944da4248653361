"""The README's promises: the two set-up commands, the code map, and a config reference in sync."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_config_reference_is_in_sync_with_the_config():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render(README) == README, "run: python scripts/update_readme.py"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    cmds = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_cmd = next(c for c in cmds if "pytest" in c)
    assert test_cmd.strip() in ci
    assert any(c.strip().endswith("grpokit train") for c in cmds)


def test_code_map_names_every_block():
    for name in ("sample_groups", "rule_reward", "score_responses", "group_advantages", "per_token_logprobs",
                 "grpo_objective_from_logprobs", "grpo_loss", "train_step", "train_grpo"):
        assert f"`{name}`" in README, name
        import grpokit

        assert callable(getattr(grpokit, name))
