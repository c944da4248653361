"""Bad input across every command: one line, exit 2, no traceback, not one byte of the user's files changed.

Each row of CASES: (id, setup(tmp) -> argv of `grpokit`, expected fragment of the `error:` line). The
command runs with tmp as the working folder; every file and folder under tmp (previous runs, models,
data, configs, would-be outputs) is hashed before and after, and the two listings must be equal:
a command that fails on user input writes nothing, deletes nothing and leaves a previous run (even
under --overwrite) byte-identical. Most rows run in-process through `grpokit.cli.main.main`; SUBPROCESS
runs a few through `python -m grpokit` to check what a shell sees. (tests/test_bad_inputs.py has the
train-only table of failures found while training, such as misbehaving reward functions.)
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.cli import main as cli
from grpokit.cli.bench import run_json_side
from grpokit.errors import UserError, run_command

TRACEBACK = "Traceback (most recent call last)"
TRAIN = ["train", "model.name_or_path=builtin:tiny-random", "task.num_train=40", "task.num_eval=8",
         "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_completion_length=8",
         "run.eval_limit=0", "run.progress=false", "run.max_steps=1", "run.output_dir=run"]
EVAL = ["eval", "--model", "builtin:tiny-random", "--limit", "2", "run.progress=false"]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Built once: a finished 1-step run with a checkpoint, a saved tiny model, a fake run for plot/report."""
    from grpokit.model.loading import build_char_tokenizer, tiny_random_model

    root = tmp_path_factory.mktemp("assets")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert cli.main([*TRAIN, "run.save_steps=1"]) == 0
    finally:
        os.chdir(cwd)
    tok = build_char_tokenizer()
    tiny_random_model(tok).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root


def put(tmp: Path, name: str, data: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def copy(assets: Path, tmp: Path, name: str) -> Path:
    shutil.copytree(assets / name, tmp / name)
    return tmp / name


def damaged_model(assets: Path, tmp: Path) -> Path:
    folder = copy(assets, tmp, "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:len(weights.read_bytes()) // 2])
    return folder


def jsonl_task(tmp: Path, text: str | bytes, *extra: str) -> list[str]:
    return [*TRAIN, "task.name=jsonl", f"task.path={put(tmp, 'data.jsonl', text)}", *extra]


def over_previous(*extra: str):
    """`train --overwrite` over the finished run in tmp/run, with `extra` wrong."""
    return lambda tmp, a: (copy(a, tmp, "run"), [*TRAIN, "--overwrite", *extra])[1]


def fake_run(tmp: Path, metrics: str | bytes = '{"step": 1, "reward_mean": 0.5}\n', **files: str) -> Path:
    put(tmp, "fake/metrics.jsonl", metrics)
    for name, text in files.items():
        put(tmp, f"fake/{name.replace('_', '.')}", text)
    return tmp / "fake"


NOT_UTF8 = b'{"prompt": "caf\xe9?", "answer": "1"}\n'
ROW = '{"prompt": "1+1?", "answer": "2"}\n'
CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0
no_pkg = {name: pytest.mark.skipif(importlib.util.find_spec(name) is not None, reason=f"{name} is installed")
          for name in ("bitsandbytes", "vllm", "wandb")}

CASES = [
    # --- a previous run must survive a failed --overwrite, byte for byte ---
    ("overwrite-missing-model", over_previous("model.name_or_path=/no/such/model"),
     "model path '/no/such/model' does not exist"),
    ("overwrite-damaged-weights",
     lambda t, a: over_previous(f"model.name_or_path={damaged_model(a, t)}")(t, a), "are damaged"),
    ("overwrite-missing-data", over_previous("task.name=jsonl", "task.path=nope.jsonl"),
     "'nope.jsonl' does not exist"),
    ("overwrite-empty-data",
     lambda t, a: over_previous("task.name=jsonl", f"task.path={put(t, 'e.jsonl', '')}")(t, a),
     "e.jsonl' has no examples"),
    ("overwrite-unknown-reward", over_previous("reward.funcs={acc: 1.0}"), "unknown reward 'acc'"),
    ("overwrite-missing-reward-model", over_previous("reward.funcs={rm:no/rm: 1.0}"),
     "reward model folder 'no/rm' does not exist"),
    ("reward-model-is-a-causal-lm", lambda t, a: [*TRAIN, f"reward.funcs={{rm:{copy(a, t, 'model')}: 1.0}}"],
     "not a reward model (transformers would attach a random, untrained scoring head): train one with"),
    ("overwrite-lora-typo", over_previous("model.lora_r=4", "model.lora_target_modules=q_proj,v_prj"),
     "v_prj match no module of the model (did you mean v_proj?)"),
    ("overwrite-bad-device", over_previous("model.device=gpu"), "model.device must be auto, cpu, cuda"),
    ("overwrite-no-chat-template", over_previous("task.chat_template=true"), "cannot apply a chat template"),
    ("overwrite-prompt-too-long",
     over_previous("rollout.max_prompt_length=3", "rollout.truncate_prompt=error"),
     "training prompts have more than rollout.max_prompt_length=3 tokens"),
    ("overwrite-and-resume", lambda t, a: over_previous()(t, a) + ["--resume"],
     "run.resume and run.overwrite conflict"),
    ("busy-without-flag", lambda t, a: (copy(a, t, "run"), TRAIN)[1], "already holds a run: pass --resume"),
    ("resume-changed-group",
     lambda t, a: (copy(a, t, "run"), [*TRAIN, "--resume", "rollout.num_generations=2"])[1],
     "the config differs where it matters: rollout.num_generations 4 -> 2"),
    # --- library errors that used to escape as tracebacks ---
    ("damaged-weights", lambda t, a: [*TRAIN, f"model.name_or_path={damaged_model(a, t)}"],
     "incomplete metadata, file not fully covered"),
    ("config-not-utf8", lambda t, a: ["train", str(put(t, "c.yaml", b"loss:\n  beta: 0.1 # \xff\n"))],
     "c.yaml' is not UTF-8 text"),
    ("jsonl-not-utf8", lambda t, a: jsonl_task(t, ROW.encode() + NOT_UTF8),
     "data.jsonl line 2: not UTF-8 text"),
    ("device-gibberish", lambda t, a: [*TRAIN, "model.device=cuda:x"], "got 'cuda:x'"),
    pytest.param("device-missing", lambda t, a: [*TRAIN, f"model.device=cuda:{CUDA_COUNT}"],
                 f"model.device=cuda:{CUDA_COUNT} but", id="device-missing"),
    pytest.param("adamw-8bit-without-bitsandbytes", lambda t, a: [*TRAIN, "optim.optim=adamw_8bit"],
                 "needs bitsandbytes: pip install bitsandbytes", marks=no_pkg["bitsandbytes"]),
    pytest.param("vllm-without-vllm", lambda t, a: [*TRAIN, "rollout.backend=vllm"], "needs vLLM",
                 marks=no_pkg["vllm"]),
    pytest.param("logger-not-installed", lambda t, a: [*TRAIN, "run.report_to=wandb"],
                 "the wandb package is not installed", marks=no_pkg["wandb"]),
    ("lora-target-typo", lambda t, a: [*TRAIN, "model.lora_r=4", "model.lora_target_modules=q_proj,v_prj"],
     "model.lora_target_modules: v_prj match no module"),
    ("lora-targets-none-match", lambda t, a: [*TRAIN, "model.lora_r=4", "model.lora_target_modules=attn"],
     "its linear layers are"),
    ("lora-targets-empty", lambda t, a: [*TRAIN, "model.lora_r=4", "model.lora_target_modules=none"],
     "model.lora_target_modules is empty"),
    # --- accepted before, refused now ---
    ("empty-output-dir", lambda t, a: [*TRAIN, "run.output_dir="], "run.output_dir is empty"),
    ("output-dir-under-a-file", lambda t, a: [*TRAIN, f"run.output_dir={put(t, 'f', 'x') / 'run'}"],
     "cannot write to run.output_dir"),
    ("output-dir-is-a-file", lambda t, a: [*TRAIN, f"run.output_dir={put(t, 'f', 'x')}"],
     "is a file: give a folder"),
    # --- wording that names the culprit ---
    ("empty-jsonl-names-file", lambda t, a: jsonl_task(t, ""), "data.jsonl' has no examples"),
    ("blank-lines-jsonl", lambda t, a: jsonl_task(t, "\n\n  \n"), "holds only blank lines"),
    ("jsonl-row-not-object", lambda t, a: jsonl_task(t, "[1, 2]\n"),
     "line 1: expected a JSON object, got list"),
    ("jsonl-missing-answer", lambda t, a: jsonl_task(t, '{"prompt": "1+1?"}\n'), "missing field 'answer'"),
    ("config-path-is-folder", lambda t, a: ["train", str((t / "cfgs").mkdir() or t / "cfgs")], "is a folder"),
    ("key-space-value", lambda t, a: ["train", "loss.beta", "0.1"],
     "write loss.beta=0.1 (no spaces around '=')"),
    ("bare-key-space-value", lambda t, a: ["train", "beta", "0"], "write beta=0"),
    ("config-bad-yaml", lambda t, a: ["train", str(put(t, "b.yaml", "loss: [beta: 0.1\n"))],
     "is not valid YAML"),
    ("gsm8k-folder-without-split",
     lambda t, a: [*TRAIN, "task.name=gsm8k", f"task.path={put(t, 'g/test.jsonl', ROW).parent}"],
     "no 'train' split"),
    ("unknown-command", lambda t, a: ["trian"], "unknown command 'trian'"),
    # --- eval: wrong out paths are refused before any work; nothing cut silently ---
    ("eval-out-is-folder", lambda t, a: [*EVAL, "--out", str((t / "outdir").mkdir() or t / "outdir")],
     "is a folder: give a file path"),
    ("eval-out-under-a-file", lambda t, a: [*EVAL, "--out", str(put(t, "f", "x") / "r.json")],
     "is a file, not a folder"),
    ("eval-damaged-weights", lambda t, a: ["eval", "--model", str(damaged_model(a, t)), "--limit", "2"],
     "are damaged"),
    ("eval-prompts-cut", lambda t, a: [*EVAL, "rollout.max_prompt_length=4"],
     "evaluation prompts have more than rollout.max_prompt_length=4 tokens"),
    ("eval-unknown-split", lambda t, a: [*EVAL, "--split", "valid8"], "got 'valid8'"),
    ("eval-bad-k", lambda t, a: [*EVAL, "--samples", "2", "--k", "x"],
     "--k must be comma-separated integers"),
    ("eval-k-above-samples", lambda t, a: [*EVAL, "--samples", "2", "--k", "4"],
     "between 1 and --samples (2)"),
    ("eval-negative-samples", lambda t, a: [*EVAL, "--samples", "-1"], "--samples must be >= 0"),
    ("eval-bad-device", lambda t, a: [*EVAL, "model.device=gpu"], "(did you mean 'cpu'?)"),
    ("eval-no-chat-template", lambda t, a: [*EVAL, "task.chat_template=true"],
     "cannot apply a chat template"),
    ("eval-key-space-value", lambda t, a: ["eval", "rollout.max_prompt_length", "512"],
     "write rollout.max_prompt_length=512"),
    ("eval-jsonl-not-utf8",
     lambda t, a: [*EVAL, "task.name=jsonl", f"task.path={put(t, 'd.jsonl', NOT_UTF8)}"],
     "d.jsonl line 1: not UTF-8 text"),
    # --- plot and report ---
    ("plot-out-is-a-file", lambda t, a: ["plot", str(fake_run(t)), "--out", str(put(t, "p.png", "x"))],
     "is a file: give a folder path"),
    ("plot-garbage-metrics", lambda t, a: ["plot", str(fake_run(t, "not json\nat all\n"))],
     "metrics.jsonl is unreadable"),
    ("plot-binary-metrics", lambda t, a: ["plot", str(fake_run(t, b"\x89PNG\xff\x00\n"))], "not UTF-8 text"),
    ("plot-empty-metrics", lambda t, a: ["plot", str(fake_run(t, ""))], "metrics.jsonl is empty"),
    ("plot-not-a-run", lambda t, a: ["plot", str(t)], "has no metrics.jsonl: give a run folder"),
    ("plot-bad-smooth", lambda t, a: ["plot", str(fake_run(t)), "--smooth", "1.5"],
     "smoothing must be in [0, 1)"),
    ("report-out-is-folder", lambda t, a: ["report", str(fake_run(t)), "--out", str(t)],
     "is a folder: give a file path"),
    ("report-garbage-config", lambda t, a: ["report", str(fake_run(t, config_json="{oops"))],
     "config.json is unreadable (not JSON)"),
    ("report-garbage-metrics", lambda t, a: ["report", str(fake_run(t, "{oops\n{oops\n"))], "is unreadable"),
    ("report-bad-smooth", lambda t, a: ["report", str(fake_run(t)), "--smooth", "-1"],
     "--smooth must be in [0, 1)"),
    # --- bench, sft ---
    ("bench-missing-model", lambda t, a: ["bench", "--model", "/no/such/model"],
     "is not a transformers model folder"),
    ("bench-zero-prompts", lambda t, a: ["bench", "--prompts", "0"], "--prompts must be >= 1, got 0"),
    ("sft-bad-override", lambda t, a: ["sft", "task.operators=/", "--out", "sft-out"],
     "task.operators must be"),
]
SUBPROCESS = {"overwrite-missing-model", "config-not-utf8", "eval-out-is-folder", "plot-garbage-metrics",
              "bench-missing-model"}


def _id(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root: a file's sha256, or '<dir>'."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
            for p in sorted(root.rglob("*"))}


def run_grpokit(argv: list[str], capsys, subprocess_run: bool) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `grpokit argv` in the current folder."""
    if subprocess_run:
        proc = subprocess.run([sys.executable, "-m", "grpokit", *argv], check=False, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        return proc.returncode, proc.stdout + proc.stderr
    capsys.readouterr()
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse: usage + one error line, exit 2
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_the_table_is_large_and_its_ids_unique():
    ids = [_id(c) for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids) and SUBPROCESS <= set(ids)


@pytest.mark.parametrize("name, setup, expected", CASES, ids=[_id(c) for c in CASES])
def test_bad_input_is_one_line_and_touches_nothing(name, setup, expected, assets, tmp_path, monkeypatch,
                                                   capsys):
    monkeypatch.chdir(tmp_path)
    argv = setup(tmp_path, assets)
    before = snapshot(tmp_path)
    rc, output = run_grpokit(argv, capsys, name in SUBPROCESS)
    assert TRACEBACK not in output, output[-3000:]
    assert rc == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ") or ": error: " in line]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert snapshot(tmp_path) == before          # byte-identical: nothing written, nothing deleted


def test_a_failed_overwrite_leaves_every_file_of_the_previous_run(assets, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = copy(assets, tmp_path, "run")
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert len(files) >= 9 and (run / "checkpoint-1" / "model.safetensors") in files
    assert cli.main([*TRAIN, "--overwrite", "model.name_or_path=/no/such/model"]) == 2
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    assert cli.main([*TRAIN, "--overwrite"]) == 0  # the same command with a good model does replace it
    assert not (run / "checkpoint-1").exists() and (run / "final").is_dir()


def test_debug_shows_the_traceback_and_internal_errors_keep_theirs(tmp_path):
    with pytest.raises(UserError, match="is a folder"):
        cli.main(["report", str(fake_run(tmp_path)), "--out", str(tmp_path), "--debug"])

    def broken(argv):
        raise KeyError("a bug in grpokit")
    with pytest.raises(KeyError):  # not a user error: its traceback is not swallowed
        run_command(broken, [])


def test_bench_reports_its_childs_one_line_error_as_its_own():
    with pytest.raises(UserError, match=r"^unknown config key 'loss.betta' \(did you mean 'loss.beta'\?\)$"):
        run_json_side([sys.executable, "-m", "grpokit", "train", "loss.betta=0.1"], "bench: the grpokit side")


def test_another_task_brings_its_own_lengths_and_says_what_it_kept(caplog):
    from grpokit.cli.main import demo_config

    with caplog.at_level(logging.INFO, logger="grpokit"):
        cfg = demo_config({"task.name": "gsm8k", "optim.learning_rate": 1e-6})
    assert (cfg.rollout.max_prompt_length, cfg.rollout.max_completion_length) == (512, 512)
    assert cfg.task.num_train == 15000  # the demo's arithmetic problem counts are gone too
    line = next(r.getMessage() for r in caplog.records if "kept from the built-in demo" in r.getMessage())
    assert "run.output_dir=runs/demo" in line and "optim.learning_rate" not in line
    assert demo_config({"task.name": "math500"}).rollout.max_completion_length == 1024
    assert demo_config({}).rollout.max_prompt_length == 64  # the demo itself is unchanged


def test_eval_truncation_is_refused_or_reported_once(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        assert cli.main([*EVAL, "--limit", "6", "rollout.max_prompt_length=4", "--allow-truncation"]) == 0
    lines = [r.getMessage() for r in caplog.records]
    summary = "6 of 6 evaluation prompts have more than rollout.max_prompt_length=4"
    assert sum(summary in m for m in lines) == 1
    assert not [m for m in lines if "keeping its last" in m]  # no per-prompt or per-batch lines on top
    assert json.loads((tmp_path / "eval_report.json").read_text())["num_problems"] == 6
