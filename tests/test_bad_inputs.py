"""Bad input never corrupts a run: every user error below makes `grpokit train` print exactly one line
`error: ...` naming the thing and what to change, exit 2, and no traceback (--debug shows it).

Each row: (id, setup(tmp) -> argv after `train`, expected text in the error line).
"""

import json
from pathlib import Path

import pytest
import torch

from grpokit.cli import main as cli
from grpokit.config.schema import ConfigError

BASE = ["model.name_or_path=builtin:tiny-random", "task.num_train=40", "task.num_eval=8",
        "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_completion_length=8",
        "run.eval_limit=0", "run.progress=false", "run.max_steps=1"]


def args(*extra):
    """argv for a small run in tmp/run plus `extra`."""
    return lambda tmp: BASE + [f"run.output_dir={tmp / 'run'}", *extra]


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def reward_file(tmp: Path, body: str) -> str:
    """A user reward module; returns its 'path.py:fn' spec."""
    source = "def fn(prompts, completions, **kw):\n    " + body + "\n"
    return f"{write(tmp, 'user_reward.py', source)}:fn"


def user_reward(body: str):
    """argv with a user reward function whose body is `body`."""
    return lambda tmp: args("reward.funcs={" + reward_file(tmp, body) + ": 1.0}")(tmp)


def saved_model(tmp: Path, eos: bool = True, tokenizer: bool = True) -> Path:
    """A tiny model folder as save_pretrained writes it (optionally without EOS or without a tokenizer)."""
    from grpokit.model.loading import build_char_tokenizer, tiny_random_model

    tok = build_char_tokenizer()
    model = tiny_random_model(tok)
    folder = tmp / "model"
    model.save_pretrained(folder)
    if tokenizer:
        if not eos:
            tok.eos_token = None
        tok.save_pretrained(folder)
    return folder


def previous_run(tmp: Path) -> Path:
    """A finished 1-step run with a checkpoint in tmp/run."""
    assert cli.main(["train", *args("run.save_steps=1")(tmp)]) == 0
    return tmp / "run"


def damage_all_checkpoints(tmp: Path) -> None:
    out = previous_run(tmp)
    (out / "checkpoint-1" / "trainer_state.pt").write_bytes(b"")


CASES = [
    # --- config: unknown keys, types, ranges, choices, conflicts, files ---
    ("unknown-key", args("loss.betta=0.1"), "unknown config key 'loss.betta' (did you mean 'loss.beta'?)"),
    ("section-as-key", args("loss=3"), "'loss' is a section: set its fields as loss.<field>=value"),
    ("wrong-type", args("rollout.num_generations=many"), "rollout.num_generations must be a int, got 'many'"),
    ("group-of-one", args("rollout.num_generations=1"), "rollout.num_generations must be >= 2"),
    ("zero-temperature", args("rollout.temperature=0"), "rollout.temperature must be > 0, got 0.0"),
    ("top-p-above-1", args("rollout.top_p=1.5"), "rollout.top_p must be in (0, 1], got 1.5"),
    ("unknown-loss-type", args("loss.loss_type=grpo2"),
     "loss.loss_type must be one of grpo, bnpo, dr_grpo, dapo"),
    ("kl-in-reward-no-beta", args("loss.kl_in_reward=true", "loss.beta=0"),
     "loss.kl_in_reward needs loss.beta > 0"),
    ("micro-batch-not-dividing", args("optim.micro_batch_size=3"), "optim.micro_batch_size (3) must divide"),
    ("epsilon-high-below-low", args("loss.epsilon_high=0.1"),
     "loss.epsilon_high (0.1) must be >= loss.epsilon (0.2)"),
    ("few-shot-traces-without-few-shot", args("task.few_shot_traces=calculator"),
     "task.few_shot_traces needs task.name=arithmetic and task.few_shot > 0"),
    ("unknown-preset", args("preset=dapx"), "unknown preset 'dapx' (did you mean 'dapo'?)"),
    ("negative-save-limit", args("run.save_total_limit=-1"), "run.save_total_limit must be >= 0, got -1"),
    ("reward-weight-not-number", args("reward.funcs={rule: lots}"),
     "reward.funcs.rule weight must be a number"),
    ("resume-and-overwrite", lambda t: args()(t) + ["--resume", "--overwrite"],
     "run.resume and run.overwrite conflict"),
    ("resume-bad-word", args("run.resume=maybe"), "run.resume must be true, false or auto, got 'maybe'"),
    ("config-file-missing", lambda t: [str(t / "nope.yaml")], "config file"),
    ("config-file-bad-yaml", lambda t: [str(write(t, "bad.yaml", "loss: [beta: 0.1\n"))],
     "is not valid YAML"),
    ("config-file-not-mapping", lambda t: [str(write(t, "list.yaml", "- 1\n- 2\n"))], "must hold a mapping"),
    ("override-without-equals", lambda t: [str(write(t, "ok.yaml", "loss:\n  beta: 0.0\n")), "beta"],
     "override 'beta' is not key=value"),
    # --- model ---
    ("model-path-missing", args("model.name_or_path=/nonexistent/model"),
     "model path '/nonexistent/model' does not exist"),
    ("model-folder-no-config",
     lambda t: args(f"model.name_or_path={(t / 'empty').mkdir() or t / 'empty'}")(t),
     "has no config.json: it is not a transformers model folder"),
    ("model-not-causal-lm",
     lambda t: args("model.name_or_path="
                    f"{write(t, 'vit/config.json', json.dumps({'model_type': 'vit'})).parent}")(t),
     "is not a causal LM that transformers can load"),
    ("gguf-file-missing", lambda t: args(f"model.name_or_path={t}", "model.gguf_file=model.gguf")(t),
     "GGUF file 'model.gguf' not found"),
    pytest.param("device-cuda-without-gpu", args("model.device=cuda"),
                 "no CUDA device is visible: use model.device=cpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")),
    # --- tokenizer ---
    ("tokenizer-without-eos", lambda t: args(f"model.name_or_path={saved_model(t, eos=False)}")(t),
     "the tokenizer has no EOS token"),
    ("tokenizer-missing", lambda t: args(f"model.name_or_path={saved_model(t, tokenizer=False)}")(t),
     "encodes text to no tokens (no tokenizer files in the folder?)"),
    # --- data ---
    ("unknown-task", args("task.name=gsm9k"), "task.name must be one of arithmetic, gsm8k, math500, jsonl"),
    ("jsonl-without-path", args("task.name=jsonl"), "task.path is required for task.name=jsonl"),
    ("data-path-missing", lambda t: args("task.name=jsonl", f"task.path={t / 'none.jsonl'}")(t),
     "does not exist"),
    ("empty-dataset", lambda t: args("task.name=jsonl", f"task.path={write(t, 'e.jsonl', '')}")(t),
     "has no examples"),
    ("malformed-json-line",
     lambda t: args("task.name=jsonl", f"task.path={write(t, 'm.jsonl', jsonl('{oops'))}")(t),
     "not valid JSON"),
    ("missing-prompt-column",
     lambda t: args("task.name=jsonl",
                    f"task.path={write(t, 'c.jsonl', jsonl({'q': '1+1', 'answer': '2'}))}")(t),
     "missing field 'prompt'"),
    ("smaller-than-one-batch",
     lambda t: args("task.name=jsonl",
                    f"task.path={write(t, 'one.jsonl', jsonl({'prompt': '1+1?', 'answer': '2'}))}")(t),
     "the training split has 1 examples, fewer than one batch (rollout.prompts_per_step=2)"),
    ("empty-eval-split", args("task.num_eval=0", "run.eval_limit=5"), "has no examples"),
    ("prompt-too-long", args("rollout.max_prompt_length=3", "rollout.truncate_prompt=error"),
     "40 of 40 training prompts have more than rollout.max_prompt_length=3 tokens (longest 14): "
     "raise the limit"),
    # --- reward ---
    ("unknown-reward", args("reward.funcs={acc: 1.0}"), "unknown reward 'acc'"),
    ("reward-import-fails", args("reward.funcs={no_such_module_xyz:fn: 1.0}"), "cannot import"),
    ("reward-wrong-count", user_reward("return [1.0]"),
     "returned 1 scores for 8 completions"),
    ("reward-not-a-number", user_reward("return ['x'] * len(completions)"),
     "returned str for completion 0"),
    ("reward-infinite", user_reward("return [float('inf')] * len(completions)"),
     "returned inf for completion 0"),
    ("reward-raises", user_reward("raise KeyError('answer')"),
     "failed on completion 0"),
    # --- output directory ---
    ("output-dir-is-a-file", lambda t: args()(t)[:-1] + [f"run.output_dir={write(t, 'file', 'x')}"],
     "is a file: give a folder path"),
    ("output-dir-not-writable",
     lambda t: args()(t)[:-1] + [f"run.output_dir={write(t, 'file', 'x') / 'run'}"],
     "cannot write to run.output_dir"),
    ("output-dir-holds-a-run", lambda t: (previous_run(t), args()(t))[1],
     "already holds a run: pass --resume"),
    ("resume-without-checkpoint", lambda t: args()(t) + ["--resume"], "holds no complete checkpoint"),
    ("resume-all-checkpoints-damaged", lambda t: (damage_all_checkpoints(t), args()(t) + ["--resume"])[1],
     "(damaged: checkpoint-1: trainer_state.pt has 0 bytes"),
    ("resume-with-another-group-size",
     lambda t: (previous_run(t), args("rollout.num_generations=2")(t) + ["--resume"])[1],
     "the config differs where it matters: rollout.num_generations 4 -> 2"),
]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_table_covers_every_category():
    ids = [c.values[0] if hasattr(c, "values") else c[0] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("name, setup, expected", CASES,
                         ids=[c.values[0] if hasattr(c, "values") else c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_fix(name, setup, expected, tmp_path, capsys):
    argv = setup(tmp_path)
    capsys.readouterr()
    rc = cli.main(["train", *argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 2, err
    assert len(errors) == 1, err
    assert expected in errors[0], errors[0]
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError, match="rollout.num_generations must be >= 2"):
        cli.main(["train", *args("rollout.num_generations=1")(tmp_path), "--debug"])


def test_an_overlong_prompt_is_truncated_from_the_left_with_a_warning(tmp_path, caplog):
    assert cli.main(["train", *args("rollout.max_prompt_length=3")(tmp_path)]) == 0
    assert "keeping its last 3 (rollout.max_prompt_length)" in caplog.text
