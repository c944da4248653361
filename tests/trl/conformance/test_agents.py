"""Agent behaviours TRL's GRPOTrainer tests check: tools (sync and async), environment_factory (one, a
dict of them, owning the reward or the data), rollout_func, malformed tool calls.

TRL's tests fix the generated ids by replacing `model.generate`; grpokit samples in its own decode loop,
so here a tiny model taught the same turns plays them (agent_fixtures.py) and both implementations
sample for real. Each prompt fixes what the first turn does, so the tool metrics are TRL's exact values;
an environment's reset() hands its rollouts the prompts in turn ("A", "B", "C", ...), as TRL's mock hands
each row of a batch its own completion.
"""

from __future__ import annotations

import asyncio
import functools
import itertools

import pytest
from agent_fixtures import agent_model, agent_tokenizer
from conformance_helpers import SKIP, text_of, train_and_check, unique_letters
from transformers import AutoTokenizer

datasets = pytest.importorskip("datasets")

# a small step keeps the taught turns intact for step 2; temperature 0.5 keeps them exact when sampled (the
# last turn's "!"s, equally likely, still differ within a group)
AGENT_ARGS = {"learning_rate": 1e-5, "temperature": 0.5, "per_device_train_batch_size": 9,
              "num_generations": 3, "max_completion_length": 256}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return agent_model(tmp_path_factory.mktemp("agent-model"))


@pytest.fixture(autouse=True)
def _quiet_trl(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")   # TRL's notice that environments are experimental


def conversation_length(completions, **kwargs):
    """The characters of every message of each completion (its turns differ within a group)."""
    return [float(sum(len(str(m.get("content") or "")) for m in c)) for c in completions]


def chat_rows(*texts: str):
    return datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": t}]} for t in texts])


def last_row(trainer) -> dict:
    return trainer.state.log_history[-1]


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def async_multiply_tool():
    """The same tool as an `async def` (named like the sync one: the model calls it by that name)."""

    async def multiply_tool(a: int, b: int) -> int:
        """
        Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product of the two integers.
        """
        await asyncio.sleep(0)
        return a * b

    return multiply_tool


def counter_environment(prompts: str = "ABC", reward: bool = False):
    """TRL's DummyEnvironment (an `increment` tool), whose reset() gives its rollouts `prompts` in turn:
    "A" calls increment(step=1), "B" calls an unknown `decrement`, "C" answers without a call."""
    turn = itertools.count()

    class DummyEnvironment:
        def reset(self, **kwargs):
            self.prompt, self._counter, self.kwargs = prompts[next(turn) % len(prompts)], 0, kwargs
            return self.prompt

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self._counter += step
            return self._counter

    if reward:
        DummyEnvironment.get_reward = lambda self: float(self._counter)
    return DummyEnvironment


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_train_with_tools(impl, agent, kind):
    """Two of the three prompts make the model call the tool, one of them with a wrong argument name: 2/3
    calls per trajectory, half of them failed (TRL's figures)."""
    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
        train_dataset=chat_rows("Use it.", "Misuse it.", "Skip it."), processing_class=agent_tokenizer(),
        tools=[multiply_tool if kind == "sync" else async_multiply_tool()])
    train_and_check(trainer)
    assert last_row(trainer)["tools/call_frequency"] == pytest.approx(2 / 3)
    assert last_row(trainer)["tools/failure_frequency"] == pytest.approx(1 / 2)


def test_setting_trainer_tools_to_none_turns_the_tool_loop_off(impl, agent):
    """TRL's `trainer.tools = []` after construction: the prompts show no tools and no call runs, so the
    rollouts are single turns and no tool metric is logged."""
    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
        train_dataset=chat_rows("Use it.", "Misuse it.", "Skip it."), processing_class=agent_tokenizer(),
        tools=[multiply_tool])
    assert trainer.tools == [multiply_tool]
    trainer.tools = []
    assert trainer.tools == []
    trainer.train()
    assert not [k for k in last_row(trainer) if k.startswith("tools/")]


def test_setting_trainer_tools_replaces_the_schemas_and_keeps_the_calls(impl, agent):
    """`trainer.tools = [schema]` (a program showing the schemas its SFT data used): the calls still run
    the tools given at construction, with TRL's figures."""
    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
        train_dataset=chat_rows("Use it.", "Misuse it.", "Skip it."), processing_class=agent_tokenizer(),
        tools=[multiply_tool])
    schema = {"type": "function", "function": {"name": "multiply_tool", "description": "Multiplies.",
                                               "parameters": {"type": "object", "properties": {
                                                   "a": {"type": "integer"}, "b": {"type": "integer"}},
                                                   "required": ["a", "b"]}}}
    trainer.tools = [schema]
    assert trainer.tools == [schema]
    trainer.train()
    assert last_row(trainer)["tools/call_frequency"] == pytest.approx(2 / 3)
    assert last_row(trainer)["tools/failure_frequency"] == pytest.approx(1 / 2)


def test_train_with_environment_factory(impl, agent):
    """No dataset: the environment gives the prompts; a valid call, a call to an unknown tool, no call."""
    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
        processing_class=agent_tokenizer(), environment_factory=counter_environment())
    train_and_check(trainer)
    assert last_row(trainer)["tools/call_frequency"] == pytest.approx(2 / 3)
    assert last_row(trainer)["tools/failure_frequency"] == pytest.approx(1 / 2)
    assert [e._counter for e in trainer.environments[:3]] == [1, 0, 0]


def test_tool_calls_run_in_their_own_rollouts_environment(impl, agent):
    """Completion i's tool calls run on environment i, and reward functions get them in that order."""
    seen = []

    def aligned(completions, environments, **kwargs):
        seen.extend(zip(completions, environments, strict=True))
        return conversation_length(completions)

    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=aligned, args=impl.args(**AGENT_ARGS), processing_class=agent_tokenizer(),
        environment_factory=counter_environment())
    trainer.train()
    assert len(seen) == 2 * 9
    for completion, env in seen:
        results = [m["content"] for m in completion if m["role"] == "tool"]
        assert env._counter == (1 if env.prompt == "A" else 0)
        assert (results == ["1"]) == (env.prompt == "A")
    assert [e._counter for e in trainer.environments] == [1, 0, 0] * 3


def test_train_with_multiple_environments(impl, agent):
    """A dict of factories: each row's `environment` picks its environment, whose tool alone it is offered
    (the model calls `increment` only after a prompt that lists it alone, `shout` likewise); `environment`
    is not passed to reset()."""
    calls, resets = {"increment": [], "shout": []}, {"counter": [], "echo": []}
    turns = {"counter": itertools.count(), "echo": itertools.count()}

    class CounterEnvironment:
        def reset(self, **kwargs):
            resets["counter"].append(kwargs)
            return ["Count.", "Count?"][next(turns["counter"]) % 2]

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            calls["increment"].append(step)
            return step

    class EchoEnvironment:
        def reset(self, **kwargs):
            resets["echo"].append(kwargs)
            return ["Echo.", "Echo?"][next(turns["echo"]) % 2]

        def shout(self, text: str) -> str:
            """
            Shout the given text.

            Args:
                text: Text to shout.

            Returns:
                The text in upper case.
            """
            calls["shout"].append(text)
            return text.upper()

    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length,
        args=impl.args(**{**AGENT_ARGS, "per_device_train_batch_size": 4, "num_generations": 2},
                       shuffle_dataset=False),
        train_dataset=datasets.Dataset.from_dict({"environment": ["counter", "echo"] * 8}),
        processing_class=agent_tokenizer(),
        environment_factory={"counter": CounterEnvironment, "echo": EchoEnvironment})
    train_and_check(trainer)
    assert calls["increment"] and calls["shout"]
    assert last_row(trainer)["tools/call_frequency"] == pytest.approx(2 / 4)
    assert last_row(trainer)["tools/failure_frequency"] == pytest.approx(0.0)
    assert resets["counter"] and resets["echo"]
    assert all("environment" not in kw for kw in resets["counter"] + resets["echo"])


def test_train_with_unknown_environment_raises(impl, agent):
    dataset = chat_rows("Count.", "Count.", "Count.").map(lambda row: {"environment": "unknown"})
    with pytest.raises(ValueError, match="unknown"):
        impl.GRPOTrainer(model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
                         train_dataset=dataset, processing_class=agent_tokenizer(),
                         environment_factory={"counter": counter_environment()}).train()


def test_train_with_environment_owned_reward(impl, agent):
    """get_reward() alone is the reward: one column named after the class, weight 1, not a tool."""
    trainer = impl.GRPOTrainer(model=agent, args=impl.args(**AGENT_ARGS), processing_class=agent_tokenizer(),
                               environment_factory=counter_environment(reward=True))
    assert trainer.reward_func_names == ["DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0]
    names = [tool.__name__ for tool in trainer.tools]
    assert "increment" in names and "get_reward" not in names and "reset" not in names
    train_and_check(trainer)
    assert last_row(trainer)["rewards/DummyEnvironment/mean"] == pytest.approx(1 / 3)   # counters 1, 0, 0


def test_environment_owned_reward_coexists_with_reward_funcs(impl, agent):
    env = counter_environment(reward=True)

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = impl.GRPOTrainer(model=agent, reward_funcs=format_reward,
                               args=impl.args(**AGENT_ARGS, reward_weights=[0.5]),
                               processing_class=agent_tokenizer(), environment_factory=env)
    assert trainer.reward_func_names == ["format_reward", "DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert len(trainer.reward_funcs) == 2
    names = [tool.__name__ for tool in trainer.tools]
    assert "increment" in names and "get_reward" not in names


def test_environment_owned_reward_mixed_environments(impl, agent):
    """Only the classes with get_reward get a column (one per class, however many names map to it); a
    rollout of another environment gets None from it."""
    scored, plain = counter_environment(reward=True), counter_environment()
    plain.__name__ = "PlainEnvironment"

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=format_reward, args=impl.args(**AGENT_ARGS),
        train_dataset=datasets.Dataset.from_dict({"environment": ["scored", "scored2", "plain"]}),
        processing_class=agent_tokenizer(),
        environment_factory={"scored": scored, "scored2": scored, "plain": plain})
    assert trainer.reward_func_names == ["format_reward", "DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    one, other = scored(), plain()
    one.reset()
    assert trainer.reward_funcs[-1](environments=[one, other]) == [0.0, None]


def test_environment_owned_data_requires_max_steps(impl, agent):
    with pytest.raises(ValueError, match="max_steps"):
        impl.GRPOTrainer(model=agent, reward_funcs=conversation_length, args=impl.args(max_steps=-1),
                         processing_class=agent_tokenizer(), environment_factory=counter_environment())


def test_multiple_environments_without_dataset_raises(impl, agent):
    with pytest.raises(ValueError, match="train_dataset"):
        impl.GRPOTrainer(model=agent, reward_funcs=conversation_length, args=impl.args(max_steps=1),
                         processing_class=agent_tokenizer(),
                         environment_factory={"a": counter_environment(), "b": counter_environment()})


def test_train_with_environment_owned_data(impl, agent):
    """reset() returns the prompt; no dataset, max_steps sets the length of the run."""

    class GuessTheWordEnvironment:
        def reset(self, **kwargs):
            return "Guess the 5-letter word."

    def reward_len(completions, **kwargs):
        return [float(len(completion[-1]["content"])) for completion in completions]

    train_and_check(impl.GRPOTrainer(
        model=agent, reward_funcs=reward_len, args=impl.args(max_completion_length=8),
        processing_class=agent_tokenizer(), environment_factory=GuessTheWordEnvironment))


def test_train_with_malformed_tool_calls(impl, agent):
    """A call without a name, an unknown tag, arguments that are not JSON: read as plain answers, the tool
    never runs, training goes on."""
    ran = []

    @functools.wraps(multiply_tool)          # the same name, schema and docstring, recording its calls
    def recording_tool(a: int, b: int) -> int:
        ran.append((a, b))
        return a * b

    trainer = impl.GRPOTrainer(
        model=agent, reward_funcs=conversation_length, args=impl.args(**AGENT_ARGS),
        train_dataset=chat_rows("Break it.", "Break it.", "Break it."), processing_class=agent_tokenizer(),
        tools=[recording_tool])
    train_and_check(trainer)
    assert ran == []
    assert last_row(trainer)["tools/call_frequency"] == 0


def rollout_func_of(tokenizer, calls: list, keys=("prompt_ids", "completion_ids", "logprobs", "env_mask")):
    """A rollout_func returning a completion of 1 + row % 3 copies of 'ab' per prompt (its last token the
    environment's), and an extra column."""

    def rollout_func(prompts, trainer):
        calls.append((list(prompts), trainer))
        prompt_ids = [tokenizer(text_of(p), add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = [tokenizer("ab" * (1 + i % 3), add_special_tokens=False)["input_ids"]
                          for i in range(len(prompts))]
        out = {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
               "logprobs": [[-0.5] * len(c) for c in completion_ids],
               "env_mask": [[1] * (len(c) - 1) + [0] for c in completion_ids],
               "source": ["rollout_func"] * len(prompts)}
        return {k: v for k, v in out.items() if k in (*keys, "source")}

    return rollout_func


def test_generate_prefers_rollout_func(impl, models, data):
    """rollout_func(prompts, trainer) replaces the generation: its completions are the ones scored, its
    extra keys reach the reward functions."""
    calls, seen = [], []

    def reward(completions, source, **kwargs):
        seen.append((list(completions), list(source)))
        return unique_letters(completions)

    tokenizer = AutoTokenizer.from_pretrained(models.qwen2)
    trainer = impl.GRPOTrainer(model=models.qwen2, reward_funcs=reward, args=impl.args(),
                               train_dataset=data.train, rollout_func=rollout_func_of(tokenizer, calls))
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert len(calls) == 2 and all(t is trainer and len(p) == 3 and len(set(p)) == 1 for p, t in calls)
    assert [c for c, _ in seen] == [["ab", "abab", "ababab"]] * 2
    assert all(s == ["rollout_func"] * 3 for _, s in seen)


def test_generate_rollout_func_raises_when_required_keys_are_missing(impl, models, data):
    tokenizer = AutoTokenizer.from_pretrained(models.qwen2)
    trainer = impl.GRPOTrainer(
        model=models.qwen2, reward_funcs=unique_letters, args=impl.args(), train_dataset=data.train,
        rollout_func=rollout_func_of(tokenizer, [], keys=("prompt_ids", "completion_ids")))
    with pytest.raises(ValueError, match="rollout_func must return.*logprobs"):
        trainer.train()


@pytest.mark.skip(reason=SKIP["gpu"])
def test_generate_rollout_func_syncs_vllm_weights_when_needed():
    """rollout_func with use_vllm: the vLLM weights are synced once per step before it runs."""


@pytest.mark.skip(reason=SKIP["vlm"])
def test_train_with_tools_multimodal_response():
    """A tool returning an image block, on a vision-language model."""
