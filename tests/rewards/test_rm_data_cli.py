"""`grpokit rm` data and commands: step labels, sample files, bad rows and the `grpokit rm` CLI."""

import json

import pytest
from test_rm_train import SEP, toy_samples

from grpokit.cli.main import main as cli_main
from grpokit.rewards.rm_data import (
    RMDataError,
    label_samples,
    read_samples,
    verifier_step_labels,
    write_samples,
)
from grpokit.rewards.rm_text import split_steps

# ---- samples ------------------------------------------------------------------------------


def test_verifier_step_labels():
    c = "12+34=46. 46*2=93. \\boxed{93}"
    spans = split_steps(c, SEP)
    assert verifier_step_labels(c, spans, answer_right=False) == [1.0, 0.0, 0.0]
    c = "12+34=47. \\boxed{46}"  # a wrong equation, a right answer
    assert verifier_step_labels(c, split_steps(c, SEP), answer_right=True) == [0.0, 1.0]
    samples = label_samples(
        ["What is 12+34?"] * 2,
        ["12+34=46. \\boxed{46}", "12+34=46. \\boxed{45}"],
        [46, 46],
        ["g", "g"],
        kind="process",
        step_separator=SEP,
    )
    assert [(s.label, s.step_labels) for s in samples] == [(1.0, [1.0, 1.0]), (0.0, [1.0, 0.0])]


def test_mc_step_labels_use_rollouts_from_each_prefix():
    seen = []

    def rollouts(prompts, prefixes):  # the continuation of step 1 of '2+2=5. ...' finds the answer once
        seen.extend(prefixes)
        return [
            ["\\boxed{4}", "\\boxed{5}"] if p == "2+2=4. " else ["\\boxed{9}", "\\boxed{8}"] for p in prefixes
        ]

    samples = label_samples(
        ["What is 2+2?"] * 2,
        ["2+2=4. \\boxed{5}", "2+2=5. \\boxed{5}"],
        ["4", "4"],
        ["g", "g"],
        kind="process",
        step_labels="mc",
        step_separator=SEP,
        rollout_fn=rollouts,
    )
    assert seen == ["2+2=4. ", "2+2=5. "]
    assert [s.step_labels for s in samples] == [[1.0, 0.0], [0.0, 0.0]]  # last step: the outcome label
    with pytest.raises(RMDataError, match="rollout_fn"):
        label_samples(["p"], ["c"], ["1"], ["g"], kind="process", step_labels="mc", step_separator=SEP)


def test_jsonl_rows_pointwise_pairwise_and_log(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = [
        {"prompt": "What is 1+1?", "completion": "1+1=2. \\boxed{2}", "label": 1, "step_labels": [1, 1]},
        {"prompt": "What is 1+1?", "chosen": "\\boxed{2}", "rejected": "\\boxed{3}", "group": "x"},
        {
            "step": 3,
            "prompt_id": "abc",
            "prompt": "What is 2+3?",
            "answer": "5",
            "completions": [{"text": "2+3=5. \\boxed{5}"}, {"text": "2+3=6. \\boxed{6}"}],
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    samples = read_samples(path, kind="outcome", step_separator=SEP)
    assert [(s.completion, s.label, s.group) for s in samples[1:]] == [
        ("\\boxed{2}", 1.0, "x"),
        ("\\boxed{3}", 0.0, "x"),
        ("2+3=5. \\boxed{5}", 1.0, "abc"),
        ("2+3=6. \\boxed{6}", 0.0, "abc"),
    ]
    copy = write_samples(tmp_path / "copy.jsonl", samples)
    assert read_samples(copy, kind="outcome", step_separator=SEP) == samples
    process = read_samples(tmp_path / "s.jsonl", kind="outcome", step_separator=SEP)[-2:]
    assert process[0].step_labels is None


BAD_ROWS = [
    ({"completion": "c", "label": 1}, "field 'prompt'"),
    ({"prompt": "p", "label": 1}, "field 'completion'"),
    ({"prompt": "p", "completion": "c"}, "field 'label'"),
    ({"prompt": "p", "completion": "c", "label": 0.5}, "field 'label' must be 0 or 1"),
    ({"prompt": "p", "chosen": "c"}, "field 'rejected'"),
    (
        {"prompt": "p", "completion": "a. b", "label": 1, "step_labels": [1]},
        "has 1 values but the completion has 2",
    ),
    (
        {"prompt": "p", "completion": "a", "label": 1, "step_labels": [2]},
        "field 'step_labels' must be 0 or 1",
    ),
    ({"prompt": "p", "completions": [{"text": "c"}]}, "no 'answer'"),
    ([1, 2], "must be a JSON object"),
]


@pytest.mark.parametrize("row,message", BAD_ROWS)
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    good = {"prompt": "p", "completion": "c", "label": 1, "step_labels": [1]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    kind = "process" if "step_labels" in str(row) else "outcome"
    with pytest.raises(RMDataError) as e:
        read_samples(path, kind=kind, step_separator=SEP)
    assert (
        str(e.value).startswith(f"{path} line 2: ") and message in str(e.value) and "\n" not in str(e.value)
    )


def test_not_json_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "p", "completion": "c", "label": 1}\n{"prompt": \n')
    with pytest.raises(RMDataError, match=r"bad.jsonl line 2: is not valid JSON"):
        read_samples(path, kind="outcome", step_separator=SEP)


# ---- the command --------------------------------------------------------------------------


def write_toy(path, n: int = 12):
    write_samples(path, toy_samples(n))
    return str(path)


def test_rm_train_then_eval(tmp_path, capsys):
    data, out = write_toy(tmp_path / "toy.jsonl"), tmp_path / "rm"
    assert (
        cli_main(
            [
                "rm",
                "train",
                "--data",
                data,
                "--init",
                "builtin:tiny-random",
                "--out",
                str(out),
                "--epochs",
                "2",
                "--learning-rate",
                "3e-3",
                "--batch-size",
                "8",
                "--eval-share",
                "0.25",
            ]
        )
        == 0
    )
    report = json.loads((out / "grpokit_rm.json").read_text())["report"]
    assert report["num_held_out"] == 6 and report["num_train"] == 18 and len(report["history"]) == 2
    assert 0.0 <= report["held_out"]["auc"] <= 1.0
    printed = capsys.readouterr().out
    assert "held out: AUC" in printed
    assert cli_main(["rm", "eval", "--rm", str(out), "--data", data]) == 0
    assert "outcome RM" in capsys.readouterr().out
    # a reward-model folder can start another: its backbone is copied, the head is new
    again = tmp_path / "rm2"
    assert cli_main(["rm", "train", "--data", data, "--init", str(out), "--out", str(again),
                     "--epochs", "1"]) == 0
    assert json.loads((again / "grpokit_rm.json").read_text())["init"] == str(out)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["train", "--data", "{tmp}/missing.jsonl", "--init", "builtin:tiny-random", "--out", "{tmp}/o"],
            "missing.jsonl",
        ),
        (
            ["train", "--data", "{data}", "--init", "builtin:tiny-random", "--out", "{tmp}/full"],
            "--overwrite",
        ),
        (["train", "--data", "{data}", "--init", "builtin:tiny-random", "--out", "{tmp}/o",
          "--eval-share", "1.5"],
         "--eval-share"),
        (["train", "--data", "{data}", "--init", "{tmp}/nowhere", "--out", "{tmp}/o"], "does not exist"),
        (["train", "--data", "{data}", "--init", "builtin:tiny-random", "--out", "{tmp}/o",
          "--kind", "process"],
         "step_labels"),
        (["train", "--data", "{data}", "--init", "builtin:tiny-random", "--out", "{tmp}/o",
          "--max-groups", "-1"],
         "--max-groups must be >= 0"),
        (["eval", "--rm", "{tmp}/nowhere", "--data", "{data}"], "does not exist"),
        (["collect", "lr=1", "--out", "{tmp}/s.jsonl"], "YAML config first"),
        (["fit"], "unknown rm command"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, args, message):
    data = write_toy(tmp_path / "toy.jsonl", 4)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    argv = ["rm"] + [a.format(tmp=tmp_path, data=data) for a in args]
    assert cli_main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert (tmp_path / "full" / "x").read_text() == "keep" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("step_labels", ["verifier", "mc"])
def test_rm_collect_writes_labeled_rows(tmp_path, capsys, step_labels):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {name_or_path: 'builtin:tiny-random', device: cpu}\n"
        "task: {name: arithmetic, operators: '+', num_train: 20, num_eval: 5}\n"
        "rollout: {max_completion_length: 12}\n"
    )
    out = tmp_path / "s.jsonl"
    assert (
        cli_main(
            [
                "rm",
                "collect",
                str(config),
                "--out",
                str(out),
                "--num-prompts",
                "3",
                "--num-generations",
                "2",
                "--step-labels",
                step_labels,
                "rm.mc_rollouts=2",
                "rm.step_separator=x",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and len({r["group"] for r in rows}) == 3
    for r in rows:
        assert r["label"] in (0, 1) and len(r["step_labels"]) == len(split_steps(r["completion"], "x"))
        assert r["prompt"].startswith("What is ")
    assert "wrote 6 samples (3 problems x 2" in capsys.readouterr().out
    assert read_samples(out, kind="process", step_separator="x")
