"""Reward models that read the question only (`--last-turn`) and train under bf16 autocast (`--precision`)."""

import json

import pytest
import torch
from test_rm_train import SEP, train_kwargs

from grpokit.cli.main import main as cli_main
from grpokit.rewards.outcome_rm import load_reward_model
from grpokit.rewards.rm_data import RMDataError, RMSample, write_samples
from grpokit.rewards.rm_text import question_turns, rm_input
from grpokit.rewards.rm_train import (
    init_reward_model,
    make_rm_optimizer,
    save_reward_model,
    score_samples,
    train_reward_model,
)


class PlainTokenizer:
    chat_template = None      # rm_input joins the messages' contents with newlines


def few_shot(question: str, demo: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"demo question {demo}"}, {"role": "assistant", "content": demo},
            {"role": "user", "content": question}]


def test_last_turn_keeps_the_system_message_and_the_question():
    prompt = few_shot("What is 2+2?", "1+1=2")
    assert question_turns(prompt) == [prompt[0], prompt[-1]]
    text, start = rm_input(PlainTokenizer(), prompt, "4", last_turn=True)
    assert text == "Be brief.\nWhat is 2+2?\n4" and text[start:] == "4"
    full, _ = rm_input(PlainTokenizer(), prompt, "4")
    assert "demo question" in full and "demo question" not in text
    assert rm_input(PlainTokenizer(), "plain prompt ", "4", last_turn=True) == ("plain prompt 4", 13)


def chat_samples() -> list[RMSample]:
    return [RMSample(few_shot(f"Q{i}?", "d"), ans, float(ans == " yes"), None, f"g{i}")
            for i in range(6) for ans in (" yes", " no")]


def test_a_last_turn_folder_scores_the_question_whatever_the_demonstrations(tmp_path):
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    samples = chat_samples()
    train_reward_model(model, tok, samples, optimizer=make_rm_optimizer(model, 1e-3),
                       **train_kwargs(last_turn=True))
    out = save_reward_model(model, tok, tmp_path / "rm", kind="outcome", step_separator=SEP,
                            init="builtin:tiny-random", report={}, last_turn=True)
    assert json.loads((out / "grpokit_rm.json").read_text())["last_turn"] is True
    loaded = load_reward_model(out, None, device="cpu")
    assert loaded.last_turn is True
    expected, _ = score_samples(model, tok, samples, kind="outcome", batch_size=4, step_separator=SEP,
                                last_turn=True)
    got = loaded([s.prompt for s in samples], [s.completion for s in samples])
    assert got == pytest.approx(expected, abs=1e-5)
    other_demo = loaded([few_shot("Q0?", "a different demonstration")], [" yes"])
    question_only = loaded([[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q0?"}]],
                           [" yes"])
    assert other_demo == pytest.approx(got[:1], abs=1e-5)
    assert question_only == pytest.approx(got[:1], abs=1e-5)
    full, _ = score_samples(model, tok, samples[:1], kind="outcome", batch_size=4, step_separator=SEP)
    assert full != pytest.approx(got[:1], abs=1e-5)     # the demonstrations do change a full-prompt score


def test_bf16_training_moves_the_weights_and_scores_near_fp32():
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = train_reward_model(model, tok, chat_samples(), optimizer=make_rm_optimizer(model, 1e-3),
                               **train_kwargs(precision="bf16"))
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())    # weights stay fp32
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    fp32, _ = score_samples(model, tok, chat_samples(), kind="outcome", batch_size=4, step_separator=SEP)
    bf16, _ = score_samples(model, tok, chat_samples(), kind="outcome", batch_size=4, step_separator=SEP,
                            precision="bf16")
    assert bf16 == pytest.approx(fp32, abs=0.05) and bf16 != fp32


def test_an_unknown_precision_is_refused():
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    with pytest.raises(RMDataError, match="unknown precision 'fp16': use fp32 or bf16"):
        train_reward_model(model, tok, chat_samples(), optimizer=make_rm_optimizer(model, 1e-3),
                           **train_kwargs(precision="fp16"))


def test_cli_train_last_turn_bf16_is_recorded_and_eval_reads_it(tmp_path, capsys):
    data, out = tmp_path / "chat.jsonl", tmp_path / "rm"
    write_samples(data, chat_samples())
    assert cli_main(["rm", "train", "--data", str(data), "--init", "builtin:tiny-random", "--out", str(out),
                     "--epochs", "1", "--batch-size", "4", "--last-turn", "--precision", "bf16"]) == 0
    meta = json.loads((out / "grpokit_rm.json").read_text())
    assert meta["last_turn"] is True and meta["report"]["precision"] == "bf16"
    assert cli_main(["rm", "eval", "--rm", str(out), "--data", str(data)]) == 0
    assert "outcome RM" in capsys.readouterr().out


def test_max_groups_keeps_whole_problems_chosen_by_the_seed(tmp_path, capsys):
    from grpokit.rewards.rm_data import keep_groups

    samples = chat_samples()                                        # 6 groups of 2
    kept = keep_groups(samples, 3, torch.Generator().manual_seed(0))
    groups = {s.group for s in kept}
    assert len(groups) == 3 and len(kept) == 6                      # whole groups, both samples each
    assert kept == [s for s in samples if s.group in groups]        # file order kept
    assert kept == keep_groups(samples, 3, torch.Generator().manual_seed(0))
    assert keep_groups(samples, 0, torch.Generator()) == samples == keep_groups(samples, 9, torch.Generator())
    data, out = tmp_path / "chat.jsonl", tmp_path / "rm"
    write_samples(data, samples)
    assert cli_main(["rm", "train", "--data", str(data), "--init", "builtin:tiny-random", "--out", str(out),
                     "--epochs", "1", "--max-groups", "4", "--eval-share", "0.25"]) == 0
    report = json.loads((out / "grpokit_rm.json").read_text())["report"]
    assert report["num_train"] + report["num_held_out"] == 8 and report["max_groups"] == 4
