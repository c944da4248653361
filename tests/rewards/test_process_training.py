"""Process supervision end to end, and a user reward function given by import path on the CLI."""

import json
from pathlib import Path

import torch

from grpokit.cli.main import main
from grpokit.config.schema import build_config
from grpokit.observe.metrics import PhaseTimer
from grpokit.train import collect
from grpokit.train import step as step_mod
from grpokit.train.loop import build_state
from grpokit.train.step import train_step

TINY = {"model.name_or_path": "builtin:tiny-random", "rollout.prompts_per_step": 2,
        "rollout.num_generations": 4,
        "rollout.max_completion_length": 12, "run.max_steps": 2, "run.eval_limit": 0, "run.progress": False}


def test_process_rewards_train_end_to_end(tmp_path, monkeypatch):
    cfg = build_config({**TINY, "reward.funcs": {"steps": 1.0, "accuracy": 1.0},
                        "run.output_dir": str(tmp_path)})
    state = build_state(cfg)
    # Make the sampled completions contain equations (a random model writes none): one right, one wrong.
    texts = ["1+1=2, 2+2=4.", "1+1=3.", "3*3=9", "no steps"]
    real_sample = collect.sample_groups

    def sample_with_equations(model, tok, prompts, G, *a, **k):
        r = real_sample(model, tok, prompts, G, *a, **k)
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts] * (len(prompts))
        T = max(map(len, ids))
        r.completion_ids = torch.tensor([x + [tok.pad_token_id] * (T - len(x)) for x in ids])
        r.completion_mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in ids])
        r.completions = texts * len(prompts)
        r.truncated = torch.zeros(len(ids), dtype=torch.bool)
        r.sampling_logprobs = None
        return r

    monkeypatch.setattr(collect, "sample_groups", sample_with_equations)
    rollout, scores, _ = collect.generate_and_score(state, state.stream.take(2), PhaseTimer())
    assert scores.step_rewards[0] == [(4, 1.0), (11, 1.0)] and scores.step_rewards[1] == [(4, -1.0)]
    adv = step_mod.compute_advantages(cfg, rollout, scores.total, scores.step_rewards)
    assert adv.shape == rollout.completion_ids.shape           # per-token advantages
    # the wrong step pulls its completion's early tokens below the right ones'
    assert adv[1, 0] < adv[0, 0]
    m = train_step(state)
    assert "rewards/steps" in m and torch.isfinite(torch.tensor(m["loss"]))


def test_user_reward_by_import_path_from_the_cli(tmp_path, capsys):
    path = Path(__file__).resolve().parents[1] / "easy_rewards.py"
    out = tmp_path / "run"
    overrides = [f"{k}={v}" for k, v in TINY.items()]
    rc = main(["train", f'reward.funcs={{"{path}:share_of_a": 1.0}}', f"run.output_dir={out}", *overrides])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert f"rewards/{path}:share_of_a" in rows[-1]
    assert len(rows) == 2
