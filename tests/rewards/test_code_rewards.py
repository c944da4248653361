"""Code rewards (grpokit.rewards.code) through the real sandbox: the share of tests passed, all or nothing,
format; each distinct program runs once per batch; the sandbox's outcomes reach the step's metrics; a real
`grpokit train` on the built-in code task scores by running programs."""

import json
import math

import pytest

from grpokit.config.schema import build_config
from grpokit.rewards.calls import RewardError
from grpokit.rewards.code import CodeRunner, code_format, code_rewards
from grpokit.rewards.scoring import build_reward_funcs, correctness, score_responses
from grpokit.sandbox import Limits, SandboxUnavailable, check_sandbox


def _mode() -> str:
    try:
        check_sandbox("bwrap")
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap unavailable here: {e}")
    return "bwrap"


@pytest.fixture(scope="module")
def runner():
    r = CodeRunner(mode=_mode(), workers=2, limits=Limits(wall_seconds=3.0, cpu_seconds=2.0))
    yield r
    r.close()


TESTS = ["assert inc(1) == 2", "assert inc(-1) == 0", "assert inc(10) == 11"]
RIGHT = "```python\ndef inc(x):\n    return x + 1\n```"
HALF = "```python\ndef inc(x):\n    return x + 1 if x > 0 else 5\n```"
LOOP = ("```python\nprint('draft')\n```\nFinal:\n"                    # the last block: a loop at top level
        "```python\ndef inc(x):\n    while True:\n        pass\n\ninc(0)\n```")
NONE = "I would write inc but will not."


def _score(runner, completions, names=("code_tests", "code_all")):
    rewards = code_rewards(runner)
    funcs = [(n, rewards[n] if n in rewards else code_format, 1.0) for n in names]
    n = len(completions)
    columns = {"tests": [TESTS] * n, "test_setup": [""] * n, "code_style": ["fenced"] * n,
               "code_prompt": [""] * n, "entry_point": ["inc"] * n}
    return score_responses(funcs, ["p"] * n, completions, columns), columns


def test_shares_all_or_nothing_and_the_outcomes_of_the_batch(runner):
    scores, columns = _score(runner, [RIGHT, HALF, LOOP, NONE, RIGHT],
                             ("code_tests", "code_all", "code_format"))
    assert scores.per_func["code_tests"].tolist() == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 1.0])
    assert scores.per_func["code_all"].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert scores.per_func["code_format"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    m = scores.metrics
    assert (m["code/passed"], m["code/failed"], m["code/timeout"], m["code/no_program"]) == (2, 1, 1, 1)
    assert m["code/programs_run"] == 3                                    # RIGHT twice: one run
    assert m["code/sandbox_s"] > 1.0 and m["code/programs_per_s"] > 0    # the loop ran to its CPU limit
    right = correctness(scores.per_func, ["p"] * 5, [RIGHT, HALF, LOOP, NONE, RIGHT], columns)
    assert right.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_code_all_alone_gives_the_same_correctness_and_a_second_batch_reuses_the_runs(runner):
    scores, columns = _score(runner, [RIGHT, HALF], ("code_tests",))
    assert correctness(scores.per_func, ["p"] * 2, [RIGHT, HALF], columns).tolist() == [1.0, 0.0]
    again, _ = _score(runner, [RIGHT, HALF], ("code_tests",))
    assert again.metrics["code/programs_run"] == 0 and again.metrics["code/passed"] == 1   # nothing ran again
    assert again.per_func["code_tests"].tolist() == scores.per_func["code_tests"].tolist()


def test_a_row_without_tests_is_a_clear_error(runner):
    rewards = code_rewards(runner)
    with pytest.raises(Exception, match="needs the task's 'tests' column"):
        score_responses([("code_tests", rewards["code_tests"], 1.0)], ["p"], [RIGHT],
                        {"tests": [[]], "code_style": ["fenced"]})


def test_build_reward_funcs_shares_one_pool_and_a_missing_sandbox_refuses(monkeypatch):
    _mode()
    cfg = build_config({"task.name": "functions", "reward.funcs": {"code_tests": 1.0, "code_all": 0.5}})
    funcs = build_reward_funcs(cfg)
    assert [n for n, _, _ in funcs] == ["code_tests", "code_all"]
    import grpokit.sandbox.check as check

    check._probe_bwrap.cache_clear()                     # the probe that passed is cached: probe again
    monkeypatch.setattr(check.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailable) as e:
            build_reward_funcs(cfg)
        said = str(e.value)
        assert "apt-get install bubblewrap" in said and "reward.sandbox=process" in said and "\n" not in said
        with pytest.warns(UserWarning, match="not isolation"):      # process mode: limits only, warned
            check._warn_process_mode.cache_clear()
            build_reward_funcs(build_config({"task.name": "functions", "reward.sandbox": "process",
                                             "reward.funcs": {"code_tests": 1.0}}))
    finally:
        check._probe_bwrap.cache_clear()


def test_a_real_train_run_on_the_built_in_code_task_scores_by_running_programs(tmp_path):
    """Two GRPO steps of a tiny random model on task.name=functions: every step's row has the sandbox's
    outcomes (a random model writes no fenced block: all no_program), and evaluation counts pass@1."""
    _mode()
    from grpokit.train.loop import train_grpo

    out = tmp_path / "run"
    cfg = build_config({"model.name_or_path": "builtin:tiny-random", "task.name": "functions",
                        "reward.funcs": {"code_tests": 1.0, "code_format": 0.1},
                        "rollout.prompts_per_step": 2, "rollout.num_generations": 2,
                        "rollout.max_completion_length": 8, "rollout.max_prompt_length": 256,
                        "run.max_steps": 2, "run.eval_steps": 0, "run.eval_limit": 4, "run.save_steps": 0,
                        "run.output_dir": str(out), "run.progress": False})
    train_grpo(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "code/no_program" in r]
    assert len(steps) == 2
    for r in steps:
        ran = sum(r[f"code/{o}"] for o in ("passed", "failed", "timeout", "memory", "crash",
                                           "output_too_large"))
        assert ran + r["code/no_program"] == 4 and math.isfinite(r["rewards/code_tests"])


def test_code_rewards_through_a_sandbox_server_with_its_token(monkeypatch):
    """reward.sandbox_url: the programs run on a `grpokit sandbox-serve` (here in a thread on loopback);
    the trainer's client sends $GRPOKIT_SERVE_TOKEN; without it the batch is refused, naming the variable."""
    import threading

    from grpokit.rewards.code import runner_for
    from grpokit.sandbox.remote import make_server
    from grpokit.serve_auth import TOKEN_ENV

    server = make_server("127.0.0.1", 0, token="t0ken", mode=_mode(), workers=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = build_config({"task.name": "functions", "reward.funcs": {"code_tests": 1.0},
                        "reward.sandbox_url": url})
    try:
        monkeypatch.setenv(TOKEN_ENV, "t0ken")
        runner = runner_for(cfg.reward)
        scores, _ = _score(runner, [RIGHT, HALF, NONE], ("code_tests",))
        assert scores.per_func["code_tests"].tolist() == pytest.approx([1.0, 2 / 3, 0.0])
        assert scores.metrics["code/programs_run"] == 2
        runner.close()
        monkeypatch.setenv(TOKEN_ENV, "wrong")
        runner = runner_for(cfg.reward)
        with pytest.raises(RewardError, match=f"code rewards: .*401.*{TOKEN_ENV}"):
            _score(runner, [RIGHT], ("code_tests",))
        runner.close()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="reward.sandbox_url must start with http"):
        build_config({"reward.sandbox_url": "sandbox-host:8130"})
