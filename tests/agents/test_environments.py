"""Environments: one per rollout, reset with the row, methods as tools, get_reward as a reward column, the
environment's random state in checkpoints (a resumed run is bit-identical)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from agent_envs import AsyncCalculator, DiceCalculator, Greeter
from agent_models import PROMPTS, plain_caller
from safetensors.torch import load_file

from grpokit.agents.agent import Agent, agent_from_config
from grpokit.agents.builtin import GuessNumber, guesses_after_yes
from grpokit.agents.environments import EnvironmentPool
from grpokit.config.schema import ConfigError, build_config
from grpokit.tasks import load_examples
from grpokit.tasks.base import Example
from grpokit.train.loop import train_grpo

BASE = {"rollout.max_completion_length": 120, "model.device": "cpu"}


def _sample(agent, cfg, examples, G=2, **kw):
    model, tok = plain_caller()
    torch.manual_seed(0)
    return agent.sample(model, tok, examples, G, cfg, **kw), tok


def test_each_rollout_gets_its_own_environment_whose_methods_are_its_tools():
    cfg = build_config({**BASE, "rollout.environment": "agent_envs:DiceCalculator", "reward.funcs": {}})
    agent = agent_from_config(cfg)
    assert [n for n, _, _ in agent.reward_funcs] == ["DiceCalculator"]     # TRL: named after the class
    r, _ = _sample(agent, cfg, [Example(p, "", {}) for p in PROMPTS])
    envs = r.reward_kwargs["environments"]
    assert len(envs) == 8 and len({id(e) for e in envs}) == 8 and all(type(e) is DiceCalculator for e in envs)
    for env, traj in zip(envs, r.trajectories):      # each row's calls went to its own instance
        assert env.calls == sum(c.error is None for c in traj.calls)
    _, fn, _ = agent.reward_funcs[0]
    assert fn(environments=envs) == [e.calls + e.roll for e in envs]


def test_reset_text_is_appended_to_the_prompt():
    agent = Agent([], {None: Greeter}, seed=0)
    cfg = build_config(BASE)
    r, tok = _sample(agent, cfg, [Example("What is 12*34?", "", {"name": "Ada"})], G=2)
    assert r.prompts[0] == "What is 12*34? Hello Ada."
    assert tok.decode(r.prompt_ids[0][r.prompt_mask[0].bool()]) == "What is 12*34? Hello Ada."


def test_a_dict_of_factories_routes_rows_and_offers_only_their_environment_tools():
    agent = Agent([], {"calc": DiceCalculator, "greet": Greeter}, seed=0)
    cfg = build_config(BASE)
    rows = [Example("What is 12*34?", "", {"environment": "calc"}),
            Example("What is 56*78?", "", {"environment": "greet"})]
    r, _ = _sample(agent, cfg, rows)
    kinds = [type(e).__name__ for e in r.reward_kwargs["environments"]]
    assert kinds == ["DiceCalculator"] * 2 + ["Greeter"] * 2
    assert r.prompts[2] == "What is 56*78?"        # 'environment' routes; reset does not receive it
    calls = [c for t in r.trajectories[2:] for c in t.calls]        # Greeter's tool is wave, not multiply
    assert calls and all("no tool named 'multiply'" in c.error for c in calls)
    assert all(c.error is None for t in r.trajectories[:2] for c in t.calls)
    with pytest.raises(ConfigError, match="rows name environment nowhere"):
        agent.sample(*plain_caller(), [Example("x", "", {"environment": "nowhere"})], 2, cfg)


def test_environment_rng_is_seeded_per_instance_and_round_trips():
    pool = EnvironmentPool({None: GuessNumber}, seed=3)
    envs = pool.take([None] * 3)
    secrets = [e.reset() and e.secret for e in envs]
    state = pool.rng_state()
    after = [e.reset() and e.secret for e in envs]
    again = EnvironmentPool({None: GuessNumber}, seed=3)
    again.set_rng_state(state)
    assert [e.reset() and e.secret for e in again.take([None] * 3)] == after
    fresh = EnvironmentPool({None: GuessNumber}, seed=3)
    assert [e.reset() and e.secret for e in fresh.take([None] * 3)] == secrets


def test_guess_number_answers_higher_lower_yes_and_rewards_finding_it():
    env = GuessNumber()
    assert env.reset(secret=9) == "Guess my number from 1 to 15."
    assert [env.guess(4), env.guess(12), env.get_reward(), env.guess(9), env.get_reward()] == \
        ["higher", "lower", 0.0, "yes", 1.0]
    other = GuessNumber()
    other.rng.seed(99)                      # an episode number fixes the secret, whatever the rng
    env.reset(episode=7)
    other.reset(episode=7)
    assert env.secret == other.secret


def test_guesses_after_the_yes_are_counted_and_cost_reward():
    stopped, went_on, lost = GuessNumber(), GuessNumber(), GuessNumber()
    for env in (stopped, went_on, lost):
        env.reset(secret=5)
    assert [stopped.guess(8), stopped.guess(5)] == ["lower", "yes"]
    assert [went_on.guess(5), went_on.guess(5), went_on.guess(2)] == ["yes", "found already", "found already"]
    assert [lost.guess(1), lost.guess(9)] == ["higher", "lower"]
    envs = [stopped, went_on, lost]
    assert [e.get_reward() for e in envs] == [1.0, 1.0, 0.0]                 # success is untouched
    assert guesses_after_yes(["a", "b", "c"], environments=envs) == [0.0, -2.0, 0.0]
    went_on.reset(secret=3)
    assert went_on.after_found == 0


def test_async_environment_tools_of_a_step_overlap():
    AsyncCalculator.log.clear()
    agent = Agent([], {None: AsyncCalculator}, seed=0)
    r, _ = _sample(agent, build_config(BASE), [Example(p, "", {}) for p in PROMPTS], G=2, greedy=True)
    assert len(AsyncCalculator.log) >= 4           # greedy: every row calls at the same step
    assert max(b for b, _ in AsyncCalculator.log) < min(e for _, e in AsyncCalculator.log)


def test_task_environment_makes_empty_prompts_for_reset_to_fill():
    cfg = build_config({"task.name": "environment", "rollout.environment": "guess_number",
                        "task.num_train": 5, "task.num_eval": 3, "reward.funcs": {}})
    assert [ex.prompt for ex in load_examples(cfg.task, "train")] == [""] * 5
    assert [ex.columns["episode"] for ex in load_examples(cfg.task, "test")] == [5, 6, 7]   # held out
    with pytest.raises(ConfigError, match="task.name=environment has no data"):
        build_config({"task.name": "environment"})


def _run(out: Path, steps: int, resume: bool) -> dict:
    model, tok = plain_caller()
    cfg = build_config({**BASE, "rollout.environment": "agent_envs:DiceCalculator", "reward.funcs": {},
                        "rollout.num_generations": 2, "rollout.prompts_per_step": 2, "run.max_steps": steps,
                        "run.save_steps": 2, "run.output_dir": str(out), "run.progress": False,
                        "run.resume": resume, "optim.learning_rate": 3e-3, "loss.beta": 0.0})
    train_grpo(cfg, model, tok, train_examples=[Example(p, "", {}) for p in PROMPTS])
    return load_file(out / "final" / "model.safetensors")


def test_a_resumed_run_with_an_environment_is_bit_identical(tmp_path, one_thread):
    straight = _run(tmp_path / "a", 4, False)
    _run(tmp_path / "b", 2, False)
    state = torch.load(tmp_path / "b" / "checkpoint-2" / "trainer_state.pt", weights_only=True)
    assert state["env_rng"] and state["env_rng"][0][1] == "rng"
    resumed = _run(tmp_path / "b", 4, True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    rows = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "ab"]
    keep = ("rewards/DiceCalculator", "loss", "grad_norm", "turns/mean", "tools/call_frequency")
    assert [[r[k] for k in keep] for r in rows[0]] == [[r[k] for k in keep] for r in rows[1]]


def test_an_async_get_reward_is_awaited_and_other_classes_score_none():
    from grpokit.agents.environments import reward_function
    from grpokit.rewards.scoring import score_responses

    class Judge:
        def reset(self, **row):
            return None

        async def get_reward(self) -> float:
            return 0.75

    envs = [Judge(), Greeter(), Judge()]
    scores = score_responses([("Judge", reward_function(Judge), 1.0)], ["p"] * 3, ["c"] * 3, {},
                             environments=envs)
    assert scores.per_func["Judge"][0] == 0.75 and scores.per_func["Judge"][2] == 0.75
    assert torch.isnan(scores.per_func["Judge"][1])     # a rollout of another environment: no score
