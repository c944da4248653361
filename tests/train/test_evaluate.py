"""grpokit.train.evaluate: the unbiased pass@k estimator, greedy/sampled evaluation, the `grpokit eval`
report."""

import json
import math

import pytest
import torch

from grpokit.cli.eval import main
from grpokit.config.schema import build_config
from grpokit.tasks import Example
from grpokit.train.evaluate import evaluate, pass_at_k


def test_pass_at_k_hand_computed():
    # n = 5 samples, c = 2 correct, k = 2: P(both drawn samples wrong) = C(3,2)/C(5,2) = 3/10, so 0.7.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k = 1 is the fraction correct: c / n.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n = 10, c = 3, k = 5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12.
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12)
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 5, 4) == 1.0  # only 3 wrong samples: any 4 drawn contain a right one


def test_pass_at_k_matches_binomial_formula_on_a_grid():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c,
                                 k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)


def _cfg(tmp_path, **kw):
    values = {"model.device": "cpu", "rollout.max_completion_length": 6, "run.output_dir": str(tmp_path),
              "run.progress": False, **kw}
    return build_config(values)


def _examples(n: int) -> list[Example]:
    return [Example(f"What is {i}+1?", str(i + 1),
                    {"answer": str(i + 1), "task_format": "boxed"}) for i in range(n)]


def test_greedy_eval_matches_a_plain_loop(tmp_path, tiny_model, char_tokenizer):
    from grpokit.rewards.scoring import REWARDS
    from grpokit.rollout.groups import sample_groups

    cfg = _cfg(tmp_path)
    examples = _examples(7)
    ro = sample_groups(tiny_model, char_tokenizer, [e.prompt for e in examples[:5]], 1, 6, greedy=True)
    texts, answers = ro.completions, [e.answer for e in examples[:5]]

    out = evaluate(tiny_model, char_tokenizer, examples, cfg, limit=5)
    assert out["num_problems"] == 5.0
    assert out["completion_length_mean"] == pytest.approx(float(ro.completion_mask.sum(-1).float().mean()))
    assert out["frac_truncated"] == pytest.approx(float(ro.truncated.float().mean()))
    assert out["accuracy"] == pytest.approx(sum(REWARDS["accuracy"]([""] * 5, texts, answer=answers)) / 5)
    assert out["reward_mean"] == pytest.approx(sum(REWARDS["rule"]([""] * 5, texts, answer=answers)) / 5)
    assert out["format_rate"] == pytest.approx(sum(REWARDS["format"]([""] * 5, texts)) / 5)
    assert out == evaluate(tiny_model, char_tokenizer, examples, cfg, limit=5)  # greedy: deterministic


def test_greedy_accuracy_counts_right_answers(tmp_path, tiny_model, char_tokenizer, monkeypatch):
    """Completions forced to known text: 2 of 4 right, 3 of 4 boxed."""
    import grpokit.train.evaluate as ev_mod

    real = ev_mod.sample_groups
    texts = ["\\boxed{1}", "\\boxed{5}", "3", "so \\boxed{4}"]

    def fake(*args, **kw):
        ro = real(*args, **kw)
        ro.completions = texts[:len(ro.completions)]
        return ro

    monkeypatch.setattr(ev_mod, "sample_groups", fake)
    out = evaluate(tiny_model, char_tokenizer, _examples(4), _cfg(tmp_path))
    # answers are 1, 2, 3, 4: right on problems 0 and 3 (a bare "3" is no extractable final answer)
    assert out["format_rate"] == pytest.approx(0.75)
    assert out["reward_mean"] == pytest.approx((1.5 + 0.5 + 0.0 + 1.5) / 4)
    assert out["accuracy"] == pytest.approx(0.5)


def test_sampled_pass_at_k_properties(tmp_path, tiny_model, char_tokenizer, monkeypatch):
    """With correctness forced to a known pattern, pass@k is the estimator averaged over problems."""
    import grpokit.train.evaluate as ev

    real = ev._score
    # sampled: problem 0 has 1/4 right, 1 has 2/4
    pattern = {1: [1.0], 4: [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]}

    def fake(cfg, tok, rollout, examples, group_size, *rest):
        out = real(cfg, tok, rollout, examples, group_size, *rest)
        if group_size == 4:
            out["correct"] = torch.tensor(pattern[4], dtype=torch.float32)
        return out

    monkeypatch.setattr(ev, "_score", fake)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    out = evaluate(tiny_model, char_tokenizer, _examples(3), _cfg(tmp_path), num_samples=4, ks=(1, 2, 4))
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert out["pass@1"] == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    assert out["pass@1"] == pytest.approx(out["sampled_accuracy"])
    assert out["pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 3)
    assert out["pass@4"] == pytest.approx(2 / 3)


def test_eval_command_writes_a_json_report(tmp_path, tiny_model, char_tokenizer, monkeypatch):
    import grpokit.cli.eval as ev_mod

    monkeypatch.setattr(ev_mod, "load_model_and_tokenizer", lambda cfg, seed=0: (tiny_model, char_tokenizer))
    out = tmp_path / "report.json"
    rc = main(["rollout.max_completion_length=8", "--limit", "6", "--samples", "2", "--k", "1,2",
               "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["num_problems"] == 6 and report["task"] == "arithmetic" and report["split"] == "test"
    assert {"accuracy", "reward_mean", "format_rate", "completion_length_mean", "pass@1",
            "pass@2"} <= set(report)
    assert main(["--samples", "2", "--k", "3", "--out", str(out)]) == 2  # k > n: a one-line error
