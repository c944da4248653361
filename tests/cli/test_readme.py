"""The README's promises: the two set-up commands, the code map, and every generated block of README.md and
docs/*.md equal to what its raw rows give (scripts/pages/: one spec per block, one renderer)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
sys.path.insert(0, str(ROOT / "scripts"))
from pages import asynchronous, experiments, readme  # noqa: E402  (scripts/pages/: the specs)
from pages.blocks import BLOCKS  # noqa: E402
from pages.raw import benchmarks, newest_group  # noqa: E402
from pages.render import Block, Column, Table, Text, fill, markers, render  # noqa: E402

FIGURE = re.compile(r"\d+\.\d+|\d{2,}")
IDS = [f"{b.page}:{b.name}" for b in BLOCKS]


def _page(block: Block) -> str:
    return (ROOT / block.page).read_text(encoding="utf-8")


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
def test_every_generated_block_is_what_its_rows_give(block):
    text = _page(block)
    assert markers(block.name)[0] in text, f"{block.page} has lost the markers of {block.name}"
    assert render(text, block) == text, "run: python scripts/update_readme.py"


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
def test_an_edited_figure_in_any_block_fails_the_check_and_is_put_back(block):
    text = _page(block)
    start, end = markers(block.name)
    figure = FIGURE.search(text, text.index(start) + len(start), text.index(end))
    assert figure, f"{block.name}: no figure in the block"
    edited = text[:figure.start()] + "9" + text[figure.start():]
    assert render(edited, block) != edited and render(edited, block) == text


def test_every_block_of_the_pages_has_a_spec():
    specs = {(b.page, b.name) for b in BLOCKS}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"<!-- ([\w-]+):start -->", page.read_text(encoding="utf-8")):
            assert (str(page.relative_to(ROOT)), name) in specs, f"{page.name}: block {name} has no spec"


def test_a_page_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="lost the markers of demo-seeds"):
        render("no markers here", next(b for b in BLOCKS if b.name == "demo-seeds"))


def test_the_named_formats():
    values = {"a": 0.294, "d": 0.366, "r": 1.3127, "s": 140.3, "xs": [0.66, 0.694], "n": 3}
    assert fill("{a:percent} {a:pct} {d:points} {d:signed} {r:ratio} {s:seconds} {n:plain}", values) == \
        "29.4% 29.4 +36.6 pt +36.6 1.31x 140 s 3"
    assert fill("{xs:pct} | {xs:.2f|, } | {r:.3f}", values) == "66.0 / 69.4 | 0.66, 0.69 | 1.313"


def test_a_table_spec_renders_its_rows_columns_and_note():
    table = Table(rows=lambda: [{"k": 1, "x": 0.5}, {"k": 2, "x": 0.25}],
                  columns=(Column("k", "{k}"), Column("x", "{x:percent}")),
                  note="Mean {m:percent}.", figures=lambda rs: {"m": sum(r["x"] for r in rs) / len(rs)})
    assert table.text({}) == "| k | x |\n|---|---|\n| 1 | 50.0% |\n| 2 | 25.0% |\n\nMean 37.5%."
    block = Block("page.md", "t", (Text("{w}", lambda: {"w": "above"}), table))
    rendered = render("<!-- t:start -->\nold\n<!-- t:end -->", block)
    assert rendered.startswith("<!-- t:start -->\nabove\n\n| k |")


def test_the_demo_is_the_newest_set_of_seeds_and_says_where_seed_0_ran():
    found = [{"seed": 0, "date": "d1", "commit": "a"}, {"seed": 1, "date": "d1", "commit": "a"},
             {"seed": 0, "date": "d2", "commit": "b"}, {"seed": 1, "date": "d2", "commit": "b"}]
    assert newest_group(found) == found[2:]
    runs = readme.demo_runs()
    assert len({(r["date"], r["commit"]) for r in runs}) == 1 and runs[0]["seed"] == 0
    start, end = markers("demo-output")
    block = " ".join(README.split(start, 1)[1].split(end, 1)[0].split())
    seed0 = runs[0]
    for said in (f"{seed0['wall_s']:.0f} s on {seed0['machine']}", readme.threads_text(seed0["threads"]),
                 f"commit {seed0['commit']}", " / ".join(f"{100 * r['after']:.1f}" for r in runs)):
        assert said in block, said
    assert readme.threads_text("default (2)") == "the default 2 threads"
    assert readme.threads_text("1") == "1 thread"


def test_the_async_server_row_pairs_both_sides_of_one_benchmark():
    name = "async_vllm_server_curve.jsonl"
    runs, summary = asynchronous.paired(name)
    assert not any(r.get("reused_from") for r in runs) and len({r["commit"] for r in runs}) == 1
    reused = [s for rs, s in benchmarks(name) if any(r.get("reused_from") for r in rs)]
    assert reused, "the file keeps a benchmark whose sync side was reused: the row must not take it"
    row = next(line for line in README.splitlines() if "vLLM server as the worker" in line)
    assert f"({summary['k1']['speedup']:.2f}x; bound {summary['k1']['bound_speedup']:.2f}x)" in row
    assert all(f"({s['k1']['speedup']:.2f}x;" not in row for s in reused)
    assert f"{summary['sync']['time_to_target_s'][0]:.0f} s sync" in row


def test_the_claims_row_counts_the_claims_tables_verdicts():
    holding = [c for c in experiments.CLAIMS if c.verdicts() == [True]]
    row = next(line for line in README.splitlines() if "the chapter's claims" in line)
    assert f"| {len(holding)} hold" in row
    claims = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    assert claims.count("| **holds**:") == len(holding)


def test_docs_index_is_a_front_page_with_the_headline_table_and_the_demo_plot():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    start, end = markers("headline")
    table = index.split(start, 1)[1].split(end, 1)[0].strip()
    readme_table = README.split(start, 1)[1].split(end, 1)[0].strip()
    assert table.startswith("| what | result |"), "docs/index.md shows the headline table itself"
    assert table == readme_table.replace("](docs/", "](")        # the README's, linked from docs/
    assert "](demo.md)" in table and "](docs/" not in table
    assert index.index(end) < index.index("demo_plot.png") < index.index("## Where to read next")


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
