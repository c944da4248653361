"""Search flags: each bad combination is one line (exit 2 on the command line), before any model loads."""

import json

import pytest

from grpokit.cli import main as cli
from grpokit.rewards.rm_text import separator_flag
from grpokit.search.common import SearchError
from grpokit.search.run import SearchSpec

BAD = [
    (SearchSpec("beem", 4), "--search must be one of greedy, majority, best-of-n, beam, mcts, got 'beem' "
                            "(did you mean 'beam'?)"),
    (SearchSpec("mcts", 8), "--search mcts needs a scorer"),
    (SearchSpec("mcts", prm="steps"), "--search mcts needs --budget N (simulations per problem)"),
    (SearchSpec("majority", 4, step_separator="\n"), "--step-separator applies to beam, mcts or a process"),
    (SearchSpec("majority"), "--search majority needs --budget N (samples per problem)"),
    (SearchSpec("beam", 0, prm="steps"), "--budget must be >= 1 (the beam width), got 0"),
    (SearchSpec("greedy", 4), "--search greedy decodes one completion per problem: drop --budget"),
    (SearchSpec("best-of-n", 8), "--search best-of-n needs a scorer"),
    (SearchSpec("best-of-n", 8, rm="a", prm="b"), "give one scorer"),
    (SearchSpec("majority", 8, rm="a"), "--search majority uses no scorer"),
    (SearchSpec("beam", 4), "--search beam scores partial solutions step by step: it needs --prm"),
    (SearchSpec("beam", 4, rm="a"),
     "it needs --prm PATH (a process RM folder) or --prm steps (the arithmetic step verifier), not --rm"),
    (SearchSpec("best-of-n", 4, rm="a", prm_agg="min"), "--prm-agg applies to a process scorer"),
    (SearchSpec("beam", 4, prm="steps", prm_agg="mean"), "--prm-agg must be one of min, last, got 'mean'"),
    (SearchSpec("majority", 4, expand=2), "--expand is beam's continuations per beam (mcts: children"),
    (SearchSpec("beam", 4, prm="steps", expand=0), "--expand must be >= 1"),
    (SearchSpec("beam", 4, prm="steps", step_separator=""), "--step-separator is empty"),
]


@pytest.mark.parametrize("spec, message", BAD, ids=[f"{s.method}-{i}" for i, (s, _) in enumerate(BAD)])
def test_a_bad_spec_is_one_line(spec, message):
    with pytest.raises(SearchError) as e:
        spec.check()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_good_specs_fill_their_defaults():
    assert SearchSpec("greedy").check().budget == 1
    beam = SearchSpec("beam", 4, prm="steps").check()
    assert (beam.expand, beam.prm_agg) == (2, "min")
    assert SearchSpec("best-of-n", 8, rm="x").check().prm_agg is None
    assert SearchSpec("mcts", 8, rm="x", step_separator=". ").check().expand == 2


EVAL = ["eval", "--model", "builtin:tiny-random", "--limit", "2", "run.progress=false"]


@pytest.mark.parametrize("argv, message", [
    ([*EVAL, "--search", "beam", "--budget", "2"], "--search beam scores partial solutions"),
    ([*EVAL, "--search", "majority", "--budget", "-1"], "--budget must be >= 1"),
    ([*EVAL, "--budget", "4"], "--budget belongs to a search: add --search METHOD"),
    ([*EVAL, "--search", "majority", "--budget", "2", "--samples", "4"], "are separate reports"),
    ([*EVAL, "--search", "best-of-n", "--budget", "2", "--rm", "no/such/rm"], "does not exist"),
])
def test_the_command_line_says_one_line_and_writes_nothing(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], out
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_writes_the_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*EVAL, "--search", "majority", "--budget", "3", "--out", "r.json"]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["search"] == "majority" and report["budget"] == 3 and len(report["problems"]) == 2
    assert report["tokens_per_problem"] == sum(p["tokens"] for p in report["problems"]) / 2
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "tokens_per_problem" in printed


def test_a_step_separator_typed_with_a_backslash_is_read_as_its_character(tmp_path, monkeypatch):
    """`--step-separator '\\n'` on a shell passes backslash + n: the report's separator is a newline."""
    monkeypatch.chdir(tmp_path)
    argv = [*EVAL, "--search", "beam", "--budget", "1", "--expand", "1", "--prm", "steps",
            "--step-separator", "\\n", "--out", "r.json"]
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "r.json").read_text())["step_separator"] == "\n"
    assert separator_flag(". ") == ". " and separator_flag("\\t") == "\t"
    assert separator_flag("a\\\\n") == "a\\n"                                # an escaped backslash stays one
