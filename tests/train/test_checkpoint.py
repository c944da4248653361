"""Checkpoints: layout, manifest, exact resume, fallback from a damaged checkpoint, config-diff refusal,
save failures that leave the previous checkpoint intact (CPU, tiny random model, seconds)."""

import errno
import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from grpokit.config.schema import build_config
from grpokit.observe.metrics import read_metrics
from grpokit.train import checkpoint, run_dir
from grpokit.train.checkpoint import CheckpointError, rng_state, set_rng_state
from grpokit.train.loop import build_state, save_final, train_grpo
from grpokit.train.resume import verify_checkpoint

# a reward with signal: weights move
EASY = str(Path(__file__).resolve().parents[1] / "easy_rewards.py") + ":share_of_a"


def tiny(out: Path, **over):
    values = {"model.name_or_path": "builtin:tiny-random", "task.name": "arithmetic", "task.num_train": 64,
              "task.num_eval": 8, "reward.funcs": {EASY: 1.0}, "rollout.prompts_per_step": 2,
              "rollout.num_generations": 4, "rollout.max_completion_length": 8, "optim.learning_rate": 3e-3,
              "run.eval_limit": 0, "run.progress": False, "run.output_dir": str(out), "run.max_steps": 6,
              "run.save_steps": 2, "run.save_total_limit": 2}
    values.update(over)
    return build_config(values)


def weights(folder: Path) -> dict:
    name = "model.safetensors"
    return load_file(folder / name)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# one torch thread (tests/conftest.py): the same reductions in every run, bit-identical on CPU
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted 6-step run: checkpoints at 2, 4, 6 (the last 2 kept) and the final export."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("full") / "run"
    state = train_grpo(tiny(out))
    torch.set_num_threads(n)
    return out, state


def test_layout_manifest_latest_and_save_total_limit(full_run):
    out, state = full_run
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]
    assert (out / "latest").read_text() == "checkpoint-6"
    ckpt = out / "checkpoint-6"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "ref_model.safetensors",
                                      "trainer_state.pt", "config.json"}
    assert verify_checkpoint(ckpt) is None
    blob = torch.load(ckpt / "trainer_state.pt", weights_only=True)  # no pickled code needed to resume
    assert (blob["step"], blob["cursor"]) == (6, 12)
    assert set(blob["rng"]) >= {"python", "numpy", "torch"}
    assert blob["metrics_offset"]["rows"] == 5  # the loop writes step 6's row after the save ...
    assert json.loads(blob["metrics_row"])["step"] == 6  # ... so the checkpoint keeps a copy of it
    assert json.loads((ckpt / "config.json").read_text()) == state.cfg.to_dict()
    assert not list(out.glob(".tmp-*"))


def test_final_export_loads_with_plain_transformers(full_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, state = full_run
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tok = AutoTokenizer.from_pretrained(out / "final")
    assert tok.eos_token is not None
    assert json.loads((out / "final" / "grpokit_config.json").read_text()) == state.cfg.to_dict()
    for (name, p), q in zip(model.named_parameters(), state.model.parameters()):
        assert torch.equal(p, q), name


def test_resume_is_bit_identical_to_an_uninterrupted_run(full_run, tmp_path):
    ref_out, ref_state = full_run
    out = tmp_path / "run"
    train_grpo(tiny(out, **{"run.max_steps": 4}))
    # two fresh runs with the same seed: identical weights at step 4
    assert_same(weights(out / "checkpoint-4"), weights(ref_out / "checkpoint-4"))
    # resume with harmless changes (more steps, other logging): the rest of the run is the same too
    state = train_grpo(tiny(out, **{"run.resume": True, "run.logging_steps": 3}))
    assert_same(weights(out / "final"), weights(ref_out / "final"))
    for name, value in ref_state.optimizer.state_dict()["state"].items():
        for k, v in value.items():
            assert torch.equal(v, state.optimizer.state_dict()["state"][name][k])
    rows, ref_rows = read_metrics(out), read_metrics(ref_out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [(r["reward_mean"], r["loss"]) for r in rows] == [(r["reward_mean"], r["loss"]) for r in ref_rows]
    assert any(r["grad_norm"] > 0 for r in rows)  # the weights did move: identity is not trivial


def test_truncated_newest_checkpoint_falls_back_with_a_warning(full_run, tmp_path, caplog):
    ref_out, _ = full_run
    out = tmp_path / "run"
    shutil.copytree(ref_out, out)
    shutil.rmtree(out / "final")
    weights_file = out / "checkpoint-6" / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:1000])  # a kill or a full disk mid-copy
    with caplog.at_level(logging.INFO, logger="grpokit"):
        state = train_grpo(tiny(out, **{"run.resume": True}))
    assert "checkpoint-6 is damaged (model.safetensors has 1000 bytes" in caplog.text
    assert "resumed from" in caplog.text and "checkpoint-4 (step 4)" in caplog.text
    assert (out / "checkpoint-6.corrupt").is_dir() and verify_checkpoint(out / "checkpoint-6") is None
    assert state.step == 6
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]  # rows 5, 6 cut, then written again
    assert_same(weights(out / "final"), weights(ref_out / "final"))


def test_a_kill_between_rename_and_pointer_is_repaired_on_resume(full_run, tmp_path, caplog):
    ref_out, _ = full_run
    out = tmp_path / "run"
    shutil.copytree(ref_out, out)
    shutil.rmtree(out / "final")
    (out / "latest").write_text("checkpoint-4")  # checkpoint-6 renamed into place, `latest` not yet rewritten
    with caplog.at_level(logging.INFO, logger="grpokit"):
        train_grpo(tiny(out, **{"run.resume": True, "run.max_steps": 6}))
    assert "checkpoint-6 (step 6)" in caplog.text  # the newest complete folder wins, not the stale pointer
    assert (out / "latest").read_text() == "checkpoint-6"
    assert not (out / "latest.tmp").exists()


def test_tampered_or_missing_files_are_detected(full_run, tmp_path):
    ckpt = tmp_path / "checkpoint-6"
    shutil.copytree(full_run[0] / "checkpoint-6", ckpt)
    data = bytearray((ckpt / "trainer_state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    (ckpt / "trainer_state.pt").write_bytes(bytes(data))
    assert "trainer_state.pt does not match its sha256" in verify_checkpoint(ckpt)
    (ckpt / "config.json").unlink()
    assert verify_checkpoint(ckpt) == "config.json is missing"
    (ckpt / "manifest.json").write_text("{not json")
    assert verify_checkpoint(ckpt) == "manifest.json is unreadable"
    (ckpt / "manifest.json").unlink()
    assert verify_checkpoint(ckpt) == "no manifest.json"


def test_config_change_that_matters_is_refused_with_the_differences(full_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(full_run[0], out)
    cfg = tiny(out,
               **{"run.resume": True, "rollout.num_generations": 2, "loss.beta": 0.0, "run.max_steps": 9})
    with pytest.raises(CheckpointError) as err:
        train_grpo(cfg)
    msg = str(err.value)
    assert "\n" not in msg
    assert "loss.beta 0.04 -> 0.0" in msg and "rollout.num_generations 4 -> 2" in msg
    assert "run.max_steps" not in msg  # harmless: allowed
    assert verify_checkpoint(out / "checkpoint-6") is None


def test_a_kill_between_save_and_metrics_write_still_logs_the_step_once(full_run, tmp_path):
    ref_out, _ = full_run
    out = tmp_path / "run"
    shutil.copytree(ref_out, out)
    metrics = out / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()[:5]))  # row 6 lost
    train_grpo(tiny(out, **{"run.resume": True, "run.max_steps": 7}))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert rows[5]["reward_mean"] == read_metrics(ref_out)[5]["reward_mean"]


def test_resume_true_needs_a_checkpoint_and_auto_starts_fresh(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')  # killed before its first checkpoint
    with pytest.raises(CheckpointError, match="holds no complete checkpoint: set run.resume=auto"):
        train_grpo(tiny(out, **{"run.resume": True}))
    state = train_grpo(tiny(out, **{"run.resume": "auto", "run.max_steps": 1}))
    assert state.step == 1 and [r["step"] for r in read_metrics(out)] == [1]


@pytest.fixture()
def saved_state(tmp_path):
    cfg = tiny(tmp_path / "run")
    run_dir.prepare_output_dir(cfg)
    state = build_state(cfg)
    first = checkpoint.save_checkpoint(state, cfg.run.output_dir)
    state.step = 2
    return state, first


@pytest.mark.parametrize("failure, expected", [
    (OSError(errno.ENOSPC, "No space left on device"), "(No space left on device): free disk space"),
    (PermissionError(errno.EACCES, "Permission denied"), "(Permission denied): free disk space or fix write"),
])
def test_a_failed_save_is_one_line_and_leaves_the_previous_checkpoint(saved_state, monkeypatch,
                                                                      failure, expected):
    state, first = saved_state
    out = first.parent

    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(checkpoint.torch, "save", fail)  # fails after the weights were written
    with pytest.raises(CheckpointError) as err:
        checkpoint.save_checkpoint(state, out)
    assert expected in str(err.value) and "checkpoint-0 is intact" in str(err.value)
    assert "\n" not in str(err.value)
    assert not list(out.glob(".tmp-*")) and not (out / "checkpoint-2").exists()
    assert (out / "latest").read_text() == "checkpoint-0" and verify_checkpoint(first) is None


def test_too_little_disk_space_is_refused_before_writing(saved_state, monkeypatch):
    state, first = saved_state
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(CheckpointError, match=r"needs about \d+\.\d MiB but only 0\.0 MiB is free"):
        checkpoint.save_checkpoint(state, first.parent)
    assert checkpoint.list_checkpoints(first.parent) == [first]


def test_rng_states_round_trip():
    saved = rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(7)
    set_rng_state(saved)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])


def test_a_kill_while_pruning_old_checkpoints_leaves_every_checkpoint_whole(saved_state, monkeypatch):
    state, first = saved_state
    out = first.parent
    for step in (2, 4):
        state.step = step
        checkpoint.save_checkpoint(state, out)  # limit 2: saving 4 prunes checkpoint-0
    real_rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):  # deletes one file, then the process dies
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else []
        if files:
            files[0].unlink()
            raise SystemExit("SIGKILL")
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    state.step = 6
    with pytest.raises(SystemExit):
        checkpoint.save_checkpoint(state, out)  # prunes checkpoint-2 and is killed inside the delete
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in checkpoint.list_checkpoints(out)] == ["checkpoint-4", "checkpoint-6"]
    assert all(verify_checkpoint(p) is None for p in checkpoint.list_checkpoints(out))
    assert (out / ".old-checkpoint-2").is_dir()  # the half-deleted one is hidden, not a checkpoint
    run_dir.prepare_output_dir(tiny(out, **{"run.resume": True}))
    assert not list(out.glob(".old-*"))  # and the next start removes it


def test_the_final_export_is_swapped_in_whole(full_run, tmp_path, monkeypatch):
    out, state = full_run
    final = tmp_path / "final"
    save_final(state, final)
    before = weights(final)

    def killed(*args, **kwargs):  # the process dies while the new export is being written
        raise SystemExit("SIGKILL")

    monkeypatch.setattr(state.tokenizer, "save_pretrained", killed)
    with pytest.raises(SystemExit):
        save_final(state, final)
    assert_same(weights(final), before)  # the previous export is untouched, the partial one hidden
    assert ((tmp_path / ".tmp-final").is_dir()
            and sorted(p.name for p in tmp_path.iterdir()) == [".tmp-final", "final"])

    def fails(*args, **kwargs):  # an ordinary write error: the partial folder is removed, the error raised
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state.tokenizer, "save_pretrained", fails)
    with pytest.raises(OSError, match="No space"):
        save_final(state, final)
    assert_same(weights(final), before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_adaptive_entropy_resumes_bit_identically(tmp_path):
    """The adaptive entropy coefficient and its last measurement are checkpointed: a resumed run applies
    the same bonus as an uninterrupted one."""
    adaptive = {"loss.entropy_coef": 0.05, "loss.use_adaptive_entropy": True, "loss.entropy_target": 9.0,
                "loss.entropy_coef_delta": 0.01, "run.max_steps": 4}
    whole = train_grpo(tiny(tmp_path / "whole", **adaptive))
    assert whole.entropy_coef == pytest.approx(0.05 + 4 * 0.01) and whole.last_entropy < 9.0
    out = tmp_path / "split"
    train_grpo(tiny(out, **{**adaptive, "run.max_steps": 2}))
    resumed = train_grpo(tiny(out, **{**adaptive, "run.resume": True}))
    assert (resumed.entropy_coef, resumed.last_entropy) == (whole.entropy_coef, whole.last_entropy)
    assert_same(weights(out / "final"), weights(tmp_path / "whole" / "final"))
    assert [r["entropy_coef"] for r in read_metrics(out)] == pytest.approx([0.06, 0.07, 0.08, 0.09])
