"""Environments: one instance per rollout, reset with its dataset row; its public methods are its tools.

TRL's `environment_factory` contract, which grpokit follows:

    env = factory()                 # constructed once, kept in a pool, reset for every rollout
    text = env.reset(**row)         # the row's fields by keyword; returned text (or None) is appended to
                                    # the last user message (a text prompt: to the prompt)
    env.some_tool(...)              # every public method but reset / get_reward is a tool of that rollout
    env.get_reward()                # optional, maybe async: a reward column named after the class

A dict of factories routes each row by its `environment` column (only that environment's tools are
offered to it). Instances are taken from the pool in order (the k-th rollout of a batch that uses
environment e gets e's k-th instance), so which instance serves which row is deterministic.

Randomness: an environment that keeps its random state in an attribute `rng` (a `random.Random`) gets it
seeded by grpokit from the pool's seed, its name and its index when created, and saved in every
checkpoint (`rng_state` / `set_rng_state`), so a resumed run draws the same episodes; an environment may
instead define state_dict() / load_state_dict(state). The evaluation pool has its own fixed seed and is
re-seeded before every evaluation, so each evaluation plays the same episodes.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any

from grpokit.agents.tools import Tool, as_tool
from grpokit.errors import ConfigError

RESERVED = ("reset", "get_reward")


def tool_methods(env: Any) -> list[Callable]:
    """The environment's tools: its public methods (listed on the class: properties are not evaluated)."""
    return [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if n not in RESERVED and not n.startswith("_") and n not in ("state_dict", "load_state_dict")]


def _seed_for(seed: int, name: str | None, index: int) -> int:
    return (seed * 1_000_003 + index * 7919 + sum(map(ord, str(name)))) % 2**63


class EnvironmentPool:
    """The environment instances of one run (or of its evaluation), by environment name.

    Args:
        factories: {name: factory}; a single factory is {None: factory}.
        seed: seeds each instance's `rng` (see the module docstring).
    """

    def __init__(self, factories: dict[str | None, Callable[[], Any]], seed: int) -> None:
        self.factories, self.seed = factories, seed
        self.instances: dict[str | None, list[Any]] = {name: [] for name in factories}
        self.reward_classes: list[type] = []      # classes with get_reward, one reward column each
        self.tool_names: dict[str | None, list[str]] = {}
        self._schemas: dict[tuple[type, str], dict] = {}   # (class, method) -> its schema, built once
        for name in factories:   # probe one instance of each: it must reset; its methods are the tools
            env = self._new(name)
            if not callable(getattr(env, "reset", None)):
                raise ConfigError(f"environment {type(env).__name__} has no reset() method: define "
                                  "reset(self, **row) returning the text to append to the prompt (or None)")
            self.tool_names[name] = [t.name for t in self.tools_of(env)]
            if callable(getattr(env, "get_reward", None)) and type(env) not in self.reward_classes:
                self.reward_classes.append(type(env))

    def _new(self, name: str | None) -> Any:
        env = self.factories[name]()
        self._seed(env, name, len(self.instances[name]))
        self.instances[name].append(env)
        return env

    def _seed(self, env: Any, name: str | None, index: int) -> None:
        if isinstance(getattr(env, "rng", None), random.Random):
            env.rng.seed(_seed_for(self.seed, name, index))

    def reseed(self) -> None:
        """Every instance's rng back to its initial seed (the evaluation pool, before each evaluation)."""
        for name, envs in self.instances.items():
            for k, env in enumerate(envs):
                self._seed(env, name, k)

    def take(self, names: list[str | None]) -> list[Any]:
        """One instance per row (rows naming the same environment get its instances in order)."""
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise ConfigError(f"rows name environment {', '.join(unknown)}, which is not among the "
                              f"environments passed ({', '.join(map(str, self.factories))}): fix the "
                              "'environment' column")
        cursor: dict[str | None, int] = {}
        out = []
        for name in names:
            k = cursor.get(name, 0)
            if k == len(self.instances[name]):
                self._new(name)
            cursor[name] = k + 1
            out.append(self.instances[name][k])
        return out

    def tools_of(self, env: Any) -> list[Tool]:
        """The environment's methods as tools (their schemas read once per class)."""
        out = []
        for method in tool_methods(env):
            key = (type(env), method.__name__)
            if key not in self._schemas:
                self._schemas[key] = as_tool(method).schema
            schema = self._schemas[key]
            out.append(Tool(schema["function"]["name"], method, schema, inspect.iscoroutinefunction(method)))
        return out

    def rng_state(self) -> list[Any]:
        """Every instance's random state, in pool order (a checkpoint entry: plain tuples and lists)."""
        out = []
        for name, envs in self.instances.items():
            for env in envs:
                if callable(getattr(env, "state_dict", None)):
                    out.append([str(name), "state_dict", env.state_dict()])
                elif isinstance(getattr(env, "rng", None), random.Random):
                    version, internal, gauss = env.rng.getstate()
                    out.append([str(name), "rng", [version, list(internal), gauss]])
                else:
                    out.append([str(name), "none", None])
        return out

    def set_rng_state(self, state: list[Any] | None) -> None:
        """Restore `rng_state` (instances are created as needed, in the same order)."""
        if not state:
            return
        cursor: dict[str | None, int] = {}
        names = {str(n): n for n in self.factories}
        for key, kind, value in state:
            name = names[key]
            k = cursor.get(name, 0)
            while len(self.instances[name]) <= k:
                self._new(name)
            cursor[name] = k + 1
            env = self.instances[name][k]
            if kind == "state_dict":
                env.load_state_dict(value)
            elif kind == "rng":
                env.rng.setstate((value[0], tuple(value[1]), value[2]))


def reward_function(cls: type) -> Callable[..., list]:
    """TRL's reward column for an environment class with get_reward: each rollout whose environment is
    exactly that class is scored by its get_reward() (awaited when async), the others get None."""
    is_async = inspect.iscoroutinefunction(cls.get_reward)
    if is_async:
        async def env_reward(environments=None, **_: Any) -> list:
            return [await e.get_reward() if type(e) is cls else None for e in environments or []]
    else:
        def env_reward(environments=None, **_: Any) -> list:
            return [e.get_reward() if type(e) is cls else None for e in environments or []]
    env_reward.__name__ = cls.__name__
    return env_reward
