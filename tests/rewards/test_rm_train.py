"""`grpokit rm` training: losses, AUC, pairs, splits, the training loop and save/load."""

import json
import math

import pytest
import torch

from grpokit.rewards.outcome_rm import load_reward_model
from grpokit.rewards.rm_data import (
    RMDataError,
    RMSample,
    label_samples,
    split_by_group,
)
from grpokit.rewards.rm_train import (
    auc,
    batch_loss,
    encode_samples,
    evaluate_reward_model,
    form_pairs,
    group_auc,
    init_reward_model,
    make_rm_optimizer,
    pairwise_loss,
    pointwise_loss,
    save_reward_model,
    score_samples,
    train_reward_model,
)

SEP = ". "


def toy_samples(n: int = 24) -> list[RMSample]:
    """Separable: ' yes' is right, ' no' is wrong, one of each per problem."""
    return [
        RMSample(f"Q{i}:", ans, float(ans == " yes"), None, f"g{i}")
        for i in range(n)
        for ans in (" yes", " no")
    ]


def train_kwargs(generator_seed: int = 0, **kw):
    base = {
        "kind": "outcome",
        "objective": "pointwise",
        "epochs": 1,
        "batch_size": 8,
        "step_separator": SEP,
        "generator": torch.Generator().manual_seed(generator_seed),
    }
    return {**base, **kw}


# ---- pure math ------------------------------------------------------------------------------


def test_pointwise_loss_by_hand():
    # BCE(0, y=1) = log 2 = 0.693147; BCE(2, y=0) = log(1 + e^2) = 2.126928; mean 1.410038
    loss = pointwise_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log(1 + math.e**2)) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(1.410038, abs=1e-6)


def test_pairwise_loss_by_hand():
    # -log sigmoid(1 - 0) = log(1 + e^-1) = 0.313262; -log sigmoid(0 - 1) = log(1 + e) = 1.313262
    loss = pairwise_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert loss.item() == pytest.approx(0.813262, abs=1e-6)


def test_auc_by_hand_with_ties():
    # positives 0.4, 0.8 vs negatives 0.1, 0.4: (0.4>0.1) 1 + (0.4=0.4) 0.5 + 1 + 1 = 3.5 of 4 pairs
    assert auc([0.1, 0.4, 0.4, 0.8], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert auc([3.0, 2.0, 1.0], [1, 0, 0]) == 1.0
    assert auc([1.0, 2.0, 3.0], [1, 0, 0]) == 0.0
    assert auc([5.0, 5.0, 5.0, 5.0], [1, 0, 1, 0]) == 0.5  # all tied: chance
    assert math.isnan(auc([1.0, 2.0], [1, 1]))


def test_group_auc_ranks_inside_each_group():
    # group a ranks right, group b backwards, group c has one class (left out): mean (1 + 0) / 2
    scores, labels = [1.0, 0.0, 0.0, 1.0, 3.0, 2.0], [1, 0, 1, 0, 1, 1]
    assert group_auc(scores, labels, ["a", "a", "b", "b", "c", "c"]) == 0.5
    assert auc(scores, labels) == pytest.approx(6 / 8)  # across groups the ranking mixes problems
    assert math.isnan(group_auc([1.0, 2.0], [1, 1], ["a", "b"]))


def test_pairs_only_within_a_group_and_right_vs_wrong():
    labels = {"a": [1, 0, 0], "b": [1, 1], "c": [0, 1], "d": [0]}
    samples = [
        RMSample("p", f"{g}{j}", float(y), None, g) for g, ys in labels.items() for j, y in enumerate(ys)
    ]
    pairs = form_pairs(samples)
    assert pairs == [(0, 1), (0, 2), (6, 5)]  # a: right 0 x wrong 1, 2; b: no wrong; c: right 6 x wrong 5
    for chosen, rejected in pairs:
        assert samples[chosen].group == samples[rejected].group
        assert samples[chosen].label == 1.0 and samples[rejected].label == 0.0


def test_held_out_split_keeps_groups_whole():
    samples = [RMSample("p", str(j), float(j % 2), None, f"g{i}") for i in range(30) for j in range(4)]
    train, held = split_by_group(samples, 0.2, torch.Generator().manual_seed(3))
    train_groups, held_groups = {s.group for s in train}, {s.group for s in held}
    assert len(held_groups) == 6 and not train_groups & held_groups
    assert len(train) + len(held) == len(samples) and len(held) == 24
    again = split_by_group(samples, 0.2, torch.Generator().manual_seed(3))[1]
    assert again == held
    with pytest.raises(RMDataError, match="at least 2 groups"):
        split_by_group(samples[:4], 0.2, torch.Generator())


# ---- training -----------------------------------------------------------------------------


def test_same_generator_gives_bit_identical_weights():
    def run(seed: int) -> dict:
        model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
        train_reward_model(
            model,
            tok,
            toy_samples(8),
            optimizer=make_rm_optimizer(model, 1e-3),
            **train_kwargs(seed, epochs=2),
        )
        return model.state_dict()

    first, second, other = run(5), run(5), run(6)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)  # the order does matter


@pytest.mark.parametrize("objective", ["pointwise", "pairwise"])
def test_training_on_a_separable_set_raises_auc(objective):
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=1)
    samples = toy_samples()
    before = evaluate_reward_model(model, tok, samples, kind="outcome", batch_size=16, step_separator=SEP)
    stats = train_reward_model(
        model,
        tok,
        samples,
        optimizer=make_rm_optimizer(model, 3e-3),
        **train_kwargs(objective=objective, epochs=4),
    )
    after = evaluate_reward_model(model, tok, samples, kind="outcome", batch_size=16, step_separator=SEP)
    assert stats["steps"] == 4 * (
        6 if objective == "pointwise" else 3
    )  # 48 samples or 24 pairs, batches of 8
    assert after["auc"] > before["auc"] and after["auc"] >= 0.95 and after["accuracy"] >= 0.9
    assert after["num_samples"] == 48 and after["positive_share"] == 0.5


def test_pairwise_needs_a_pair():
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    samples = [RMSample("p", "x", 1.0, None, "a"), RMSample("p", "y", 0.0, None, "b")]
    with pytest.raises(RMDataError, match="no group has both"):
        train_reward_model(
            model,
            tok,
            samples,
            optimizer=make_rm_optimizer(model, 1e-3),
            **train_kwargs(objective="pairwise"),
        )


def test_scores_ignore_right_padding():
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    samples = [
        RMSample("What is 1+2?", "1+2=3. \\boxed{3}", 1.0, None, "a"),
        RMSample("Q", "7", 0.0, None, "b"),
    ]
    batched, _ = score_samples(model, tok, samples, kind="outcome", batch_size=2, step_separator=SEP)
    alone = [
        score_samples(model, tok, [s], kind="outcome", batch_size=1, step_separator=SEP)[0][0]
        for s in samples
    ]
    assert batched == pytest.approx(alone, abs=1e-5)


def test_process_bce_reads_each_steps_last_token():
    model, tok = init_reward_model("builtin:tiny-random", "process", seed=0)
    prompt, completion = "What is 12+34?", "12+34=46. \\boxed{46}"
    samples = [RMSample(prompt, completion, 1.0, [1.0, 0.0], "a"), RMSample("Q", "5", 0.0, [0.0], "b")]
    encoded = encode_samples(tok, samples, kind="process", step_separator=SEP, limit=128)
    text = prompt + completion  # the char tokenizer: one token per character
    assert encoded[0][1] == [
        text.index(". "),
        len(text) - 1,
    ]  # the '.' of step 1 (not the space), the final '}'
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([encoded[0][0]])).logits[0, :, 0]
        other = model(input_ids=torch.tensor([encoded[1][0]])).logits[0, :, 0]
        manual = torch.nn.functional.binary_cross_entropy_with_logits(
            torch.stack([logits[encoded[0][1][0]], logits[encoded[0][1][1]], other[-1]]),
            torch.tensor([1.0, 0, 0]),
        )
        loss = batch_loss(model, encoded, [0, 1], "process", objective="pointwise", pad_id=tok.pad_token_id)
    assert loss.item() == pytest.approx(manual.item(), abs=1e-5)
    steps = evaluate_reward_model(model, tok, samples, kind="process", batch_size=2, step_separator=SEP)
    assert steps["num_samples"] == 3  # over steps, not completions


def test_over_long_input_is_refused_in_one_line():
    model, tok = init_reward_model("builtin:tiny-random", "outcome", seed=0)
    with pytest.raises(RMDataError) as e:
        train_reward_model(
            model,
            tok,
            [RMSample("p" * 40, "c" * 30, 1.0, None, "a")],
            optimizer=make_rm_optimizer(model, 1e-3),
            max_length=64,
            **train_kwargs(),
        )
    assert (
        "70 reward-model tokens" in str(e.value)
        and "limit of 64" in str(e.value)
        and "\n" not in str(e.value)
    )


# ---- save / load --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["outcome", "process"])
def test_save_then_load_round_trips(tmp_path, kind):
    model, tok = init_reward_model("builtin:tiny-random", kind, seed=0)
    prompts, completions = ["What is 1+2?", "What is 5+5?"], ["1+2=3. \\boxed{3}", "5+5=11. \\boxed{11}"]
    samples = label_samples(prompts, completions, ["3", "10"], ["a", "b"], kind=kind, step_separator=SEP)
    train_reward_model(
        model, tok, samples, optimizer=make_rm_optimizer(model, 1e-3), **train_kwargs(kind=kind)
    )
    report = {"held_out": {"auc": 0.75, "accuracy": float("nan")}}
    out = save_reward_model(
        model, tok, tmp_path / "rm", kind=kind, step_separator=SEP, init="builtin:tiny-random", report=report
    )
    meta = json.loads((out / "grpokit_rm.json").read_text())
    assert meta == {
        "kind": kind,
        "step_separator": SEP,
        "init": "builtin:tiny-random",
        "report": {"held_out": {"auc": 0.75, "accuracy": None}},
        "last_turn": False,
    }
    loaded = load_reward_model(out, None, device="cpu")
    assert loaded.kind == kind
    expected, _ = score_samples(model, tok, samples, kind=kind, batch_size=2, step_separator=SEP)
    if kind == "outcome":
        got = loaded(prompts=prompts, completions=completions)
    else:
        assert loaded.step_separator == SEP
        got = [r for steps in loaded.score_steps(prompts, completions) for _, r in steps]
    assert got == pytest.approx(expected, abs=1e-5)

