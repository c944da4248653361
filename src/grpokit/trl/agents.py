"""TRL's agent arguments on grpokit: `GRPOTrainer(tools=..., environment_factory=..., rollout_func=...)`.

    trainer = GRPOTrainer(model, reward_funcs=[...], args=GRPOConfig(max_tool_calling_iterations=4, ...),
                          train_dataset=dataset, tools=[multiply])            # or environment_factory=MyEnv

TRL 1.16's semantics, kept: tools are plain or async functions whose schema comes from their type hints and
docstring; `environment_factory` makes one environment per rollout (a dict of factories routes rows by
their `environment` column), reset(**row) may return text appended to the last user message, its public
methods are that rollout's tools, and an optional (maybe async) get_reward() is one more reward column,
named after the class, weight 1; reward functions receive `environments=`. Without a train_dataset the
environment owns the data: max_steps must be set, and each step's prompts are empty user messages that
reset() fills. `rollout_func(prompts, trainer)` replaces the generation altogether
(`grpokit.agents.custom_rollout`). The tool loop itself is grpokit's (`grpokit.agents`, docs/agents.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from grpokit.agents.agent import Agent
from grpokit.errors import ConfigError
from grpokit.tasks.base import Example
from grpokit.trl.inputs import dataset_examples, is_iterable_dataset

PLACEHOLDER = ({"role": "user", "content": ""},)   # TRL's prompt for rows that reset() fills


def for_tokenizer(examples: list[Example], tokenizer: Any) -> list[Example]:
    """Data-free placeholders as plain text when the tokenizer has no chat template (a base model)."""
    if getattr(tokenizer, "chat_template", None) is None and all(ex.prompt == list(PLACEHOLDER)
                                                                 for ex in examples):
        return [Example("", "", dict(ex.columns)) for ex in examples]
    return examples


def _name(obj: Any) -> str:
    """'module:qualname' of a function or class (what the resolved config and the model card show)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__name__)}"


def factories_of(environment_factory: Any) -> dict[str | None, Callable] | None:
    """TRL's environment_factory as {name: factory}: one callable is {None: it}."""
    if environment_factory is None:
        return None
    if isinstance(environment_factory, dict):
        if not environment_factory or not all(callable(f) for f in environment_factory.values()):
            raise ConfigError("environment_factory is a dict: map each environment name to a callable that "
                              "returns an environment (a class works)")
        return dict(environment_factory)
    if not callable(environment_factory):
        raise ConfigError("environment_factory must be a callable returning an environment (a class works), "
                          "or a dict of them")
    return {None: environment_factory}


def agent_overrides(tools: list | None, environment_factory: Any) -> dict[str, Any]:
    """The grpokit config keys that record the agent arguments (the run's config names them)."""
    out: dict[str, Any] = {}
    if tools:
        out["rollout.tools"] = [_name(t) for t in tools]
    factories = factories_of(environment_factory)
    if factories:
        out["rollout.environment"] = ", ".join(_name(f) for f in factories.values())
    return out


def build_agent(tools: list | None, environment_factory: Any, rollout_func: Callable | None, trainer: Any,
                seed: int) -> Agent | None:
    """The run's Agent from TRL's arguments (None when there is none of them)."""
    if not tools and environment_factory is None and rollout_func is None:
        return None
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise ConfigError("tools must be a list of functions (type hints and a docstring give each schema)")
    if rollout_func is not None and not callable(rollout_func):
        raise ConfigError("rollout_func must be a callable(prompts, trainer) returning prompt_ids, "
                          "completion_ids and logprobs")
    return Agent(list(tools or []), factories_of(environment_factory), seed, rollout_func, trainer)


def check_data(data: Any, environment_factory: Any, max_steps: Any) -> None:
    """No train_dataset is allowed only with one environment factory and max_steps set (TRL's rule)."""
    if data is not None or environment_factory is None:
        return
    if isinstance(environment_factory, dict):
        raise ConfigError("a dict environment_factory (several environments) requires a `train_dataset` "
                          "with an 'environment' column to route each row: give one, or pass one factory")
    if not max_steps or max_steps <= 0:
        raise ConfigError("without a train_dataset the environment owns the data: set "
                          "GRPOConfig(max_steps=...) to say how long to train")


def train_examples(data: Any, environment_factory: Any, prompts_per_step: int,
                   limit: int | None) -> list[Example]:
    """The training examples: the dataset's rows (with an environment, a missing prompt is an empty user
    message), or, without a dataset, one step's worth of empty prompts that the environment fills."""
    if environment_factory is None:
        return dataset_examples(data, limit)
    if data is None:
        return [Example(list(PLACEHOLDER), "", {}) for _ in range(prompts_per_step)]
    rows = itertools.islice(iter(data), limit) if is_iterable_dataset(data) else (
        data.to_list() if hasattr(data, "to_list") else list(data))
    return dataset_examples([{"prompt": [{"role": "user", "content": ""}], **dict(row)} for row in rows])
