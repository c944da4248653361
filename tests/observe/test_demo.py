"""The built-in demo: shipped warm-start checkpoint, `grpokit train` with no config, eval agreement, SFT."""

import json

import pytest
import torch

from grpokit.model.loading import DEMO_CHECKPOINT

needs_checkpoint = pytest.mark.skipif(not (DEMO_CHECKPOINT / "model.safetensors").is_file(),
                                      reason="the demo checkpoint is not built (grpokit sft)")


@needs_checkpoint
def test_shipped_checkpoint_is_small_and_loads_as_the_demo_model():
    from grpokit.cli.main import DEMO, train_config
    from grpokit.model.loading import load_model_and_tokenizer

    size = sum(p.stat().st_size for p in DEMO_CHECKPOINT.iterdir())
    assert size < 20 * 2**20
    cfg = train_config(None, [], resume=False, overwrite=False)
    assert cfg.model.name_or_path == DEMO["model.name_or_path"] == "builtin:arith-demo"
    model, tok = load_model_and_tokenizer(cfg.model)
    assert model.config.model_type == "qwen2" and sum(p.numel() for p in model.parameters()) < 5_000_000
    # the char tokenizer round-trips the task's text exactly, spaces included
    text = "What is 37+58?37+58=95. \\boxed{95}"
    assert tok.decode(tok(text)["input_ids"]) == text
    report = json.loads((DEMO_CHECKPOINT / "sft_report.json").read_text())
    assert 0.2 <= report["eval"]["accuracy"] <= 0.5  # imperfect on purpose: mixed groups for GRPO


@needs_checkpoint
def test_demo_train_two_steps_then_eval_agrees_with_step_zero(tmp_path, capsys):
    from grpokit.cli.main import main as cli_main
    from grpokit.observe.metrics import read_metrics

    out = tmp_path / "demo"
    args = ["train", f"run.output_dir={out}", "run.max_steps=2", "run.eval_limit=20",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4", "run.progress=false", "model.device=cpu"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed and "greedy accuracy" in printed
    assert (out / "demo_plot.png").stat().st_size > 10_000
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    evals = {r["tag"]: r for r in read_metrics(out, "eval.jsonl")}
    assert set(evals) == {"before", "after"} and evals["before"]["num_problems"] == 20

    report = tmp_path / "report.json"
    assert cli_main(["eval", "--limit", "20", "--out", str(report), "model.device=cpu"]) == 0
    standalone = json.loads(report.read_text())
    for key in ("accuracy", "reward_mean", "format_rate", "completion_length_mean"):
        assert standalone[key] == evals["before"][key], key


def test_sft_learns_the_format_on_a_few_steps(char_tokenizer):
    """A few supervised steps on the arithmetic solutions lower the completion loss (shape-checked)."""
    from grpokit.config.schema import TaskConfig
    from grpokit.model.loading import tiny_random_model
    from grpokit.tasks import load_examples
    from grpokit.train.sft import encode_pairs, sft_loss, train_sft

    examples = load_examples(TaskConfig(num_train=64, num_eval=8), "train")
    ids, att, mask = encode_pairs(char_tokenizer, ["What is 1+2?"], ["1+2=3. \\boxed{3}"])
    n_prompt = len("What is 1+2?")
    assert mask[0, :n_prompt].sum() == 0 and mask[0].sum() == len("1+2=3. \\boxed{3}") + 1  # + EOS
    assert ids[0, n_prompt + mask[0].sum().long() - 1] == char_tokenizer.eos_token_id
    model = tiny_random_model(char_tokenizer, seed=0)
    batch = encode_pairs(char_tokenizer, [e.prompt for e in examples[:16]],
                         [e.columns["solution"] for e in examples[:16]])
    with torch.no_grad():
        before = float(sft_loss(model, *batch))
    train_sft(model, char_tokenizer, examples, steps=30, batch_size=16, learning_rate=3e-3,
              warmup_steps=3, seed=0)
    with torch.no_grad():
        after = float(sft_loss(model, *batch))
    assert after < 0.6 * before


@needs_checkpoint
def test_periodic_evaluation_is_skipped_when_eval_limit_is_zero(tmp_path):
    """run.eval_steps with run.eval_limit=0 (no held-out problems): training runs on, nothing is evaluated."""
    from grpokit.cli.main import main as cli_main
    from grpokit.observe.metrics import read_metrics

    out = tmp_path / "noeval"
    args = ["train", f"run.output_dir={out}", "run.max_steps=3", "run.eval_steps=1", "run.eval_limit=0",
            "rollout.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false",
            "model.device=cpu"]
    assert cli_main(args) == 0
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert not (out / "eval.jsonl").exists()


@needs_checkpoint
def test_two_demo_runs_with_two_threads_are_bit_identical(tmp_path):
    """Same seed, same thread count -> the same losses and weights (docs/reliability.md, Determinism).

    With two threads, a backward that accumulates with atomic adds (advanced-index gathers of the shared
    prompt) made two identical runs part ways after a few steps; the gathers now use index_select."""
    from safetensors.torch import load_file

    from grpokit.cli.main import main as cli_main
    from grpokit.observe.metrics import read_metrics

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for name in ("a", "b"):
            assert cli_main(["train", f"run.output_dir={tmp_path / name}", "run.max_steps=8",
                             "rollout.prompts_per_step=8", "run.eval_limit=0", "run.progress=false",
                             "model.device=cpu"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows_a, rows_b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert len(rows_a) == 8 and [(r["step"], r["loss"], r["reward_mean"]) for r in rows_a] == \
        [(r["step"], r["loss"], r["reward_mean"]) for r in rows_b]
    wa = load_file(tmp_path / "a" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "final" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
