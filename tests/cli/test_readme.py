"""The README's promises: the two set-up commands, the code map, and a config reference in sync."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def _code_map_rows() -> dict[str, str]:
    """{block: the one file its row links to} from the README's code map table."""
    section = README.split("## The chapter's code map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if re.match(r"\| \[[A-H]", line):
            block = line.split("|")[1].strip()
            links = re.findall(r"\]\((src/grpokit/[^)]+\.py)\)", line)
            assert len(links) == 1, f"{block}: the row links {links}, not one file"
            rows[block] = links[0]
    return rows


def test_code_map_links_each_block_to_the_file_that_defines_it():
    rows = _code_map_rows()
    defines = {"[A]": "sample_groups", "[B]": "score_responses", "[C]": "group_advantages",
               "[D]": "per_token_logprobs", "[E-F]": "grpo_objective_from_logprobs", "[G]": "train_step",
               "[H]": "train_grpo"}
    assert set(rows) == set(defines)
    for block, name in defines.items():
        text = (ROOT / rows[block]).read_text(encoding="utf-8")
        assert f"def {name}(" in text, f"{block}: {rows[block]} does not define {name}"


def test_optimizer_step_is_one_hop_from_train_step():
    """train_step's file imports the update module, and that file is where `optimizer.step()` runs."""
    step = (ROOT / _code_map_rows()["[G]"]).read_text(encoding="utf-8")
    assert "from grpokit.train.update import" in step
    update = (ROOT / "src/grpokit/train/update.py").read_text(encoding="utf-8")
    assert "state.optimizer.step()" in update and "train/update.py" in README


def test_code_map_names_every_subpackage():
    subpackages = sorted(p.parent.name for p in (ROOT / "src" / "grpokit").glob("*/__init__.py"))
    assert len(subpackages) >= 10
    for name in subpackages:
        assert f"[`{name}/`](src/grpokit/{name})" in README, f"the README's code map does not name {name}/"

