"""The README's promises: the two set-up commands, the code map, and a config reference in sync."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _generator():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_headline_table_and_the_demo_output_are_computed_from_their_raw_rows():
    mod = _generator()
    assert mod.HEAD_START in README and mod.DEMO_START in README, "the README has lost its markers"
    assert mod.render_readme(README) == README, "run: python scripts/update_readme.py"


def test_one_edited_figure_fails_the_check():
    mod = _generator()
    table = README.split(mod.HEAD_START, 1)[1].split(mod.HEAD_END, 1)[0]
    figure = re.search(r"\d+\.\d%", table).group(0)                  # the first measured figure
    edited = README.replace(figure, "9" + figure, 1)
    assert edited != README and mod.render_readme(edited) != edited


def test_the_agents_tables_come_from_their_raw_rows():
    mod = _generator()
    page = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    assert mod.AGENTS_START in page, "docs/agents.md has lost its results markers"
    assert mod.render_agents(page) == page, "run: python scripts/update_readme.py"
    block = page.split(mod.AGENTS_START, 1)[1].split(mod.AGENTS_END, 1)[0]
    figure = re.search(r"\d+\.\d%", block).group(0)
    assert mod.render_agents(page.replace(figure, "9" + figure, 1)) == page   # an edited figure is put back


def test_the_demo_and_performance_tables_come_from_their_raw_rows():
    mod = _generator()
    for name, start, render in (("demo.md", mod.SEEDS_START, mod.render_demo_page),
                                ("performance.md", mod.BENCH_START, mod.render_performance),
                                ("memory.md", mod.MEMORY_START, mod.render_memory),
                                ("real_model.md", mod.GSM8K_START, mod.render_real_model),
                                ("async.md", mod.ASYNC_START, mod.render_async),
                                ("search.md", mod.TREE_START, mod.render_tree)):
        page = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert start in page, f"docs/{name} has lost its markers"
        assert render(page) == page, "run: python scripts/update_readme.py"


def test_config_reference_is_in_sync_with_the_config():
    mod = _generator()
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert mod.START in page and mod.render(page) == page, "run: python scripts/update_readme.py"


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250, "the README is the front page: move detail to docs/"


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



def test_bench_record_keeps_the_rows_with_how_they_were_measured():
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "scripts" / "bench_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = ['{"side": "grpokit", "s_per_step": 2.0, "micro_batch_size": 8, "round": 1}', "not json",
             '{"ratio_trl_over_grpokit_s_per_step": 2.5, "micro_batch_grpokit": 8}']
    rows = mod.records(lines, {"command": "grpokit bench ...", "commit": "abc", "date": "2026-12-04"})
    assert len(rows) == 2 and rows[0]["side"] == "grpokit" and rows[0]["commit"] == "abc"
    assert rows[1]["compare"]["ratio_trl_over_grpokit_s_per_step"] == 2.5 and rows[1]["micro_batch_size"] == 8


def test_the_beam_cache_figures_come_from_their_raw_rows():
    mod = _generator()
    page = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    block = page[page.index("<!-- beam-cache:start -->"):page.index("<!-- beam-cache:end -->")]
    figure = block.split("x faster")[0].rsplit(" ", 1)[1]               # the per-token ratio, e.g. 3.34
    edited = page.replace(block, block.replace(f"{figure}x faster", f"9{figure}x faster"))
    assert edited != page and mod.render_tree(edited) == page            # an edited figure is put back


def _measured_blocks():
    """(page, block name, blocks) for every generated block that scripts/docs_blocks.py collects."""
    mod = _generator()
    return [(page, name, blocks) for blocks in mod.MEASURED_BLOCKS
            for page in blocks
            for name in blocks[page]]


def test_every_measured_block_is_generated_from_its_raw_files():
    mod = _generator()
    blocks = _measured_blocks()
    assert len(blocks) >= 30
    for page, name, table in blocks:
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        assert f"<!-- {name}:start -->" in text, f"docs/{page} has lost the markers of {name}"
        assert mod.render_measured(page, text, table) == text, "run: python scripts/update_readme.py"


def test_one_edited_figure_in_any_measured_block_fails_the_check():
    mod = _generator()
    for page, name, table in _measured_blocks():
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        start = text.index(f"<!-- {name}:start -->")
        body_end = text.index(f"<!-- {name}:end -->")
        figure = re.compile(r"\d+\.\d+|\d{2,}").search(text, start + len(name) + 15, body_end)
        assert figure, f"{name}: no figure in the block"
        edited = text[:figure.start()] + "9" + text[figure.start():]
        assert mod.render_measured(page, edited, table) == text, f"{name}: an edited figure is not put back"
