"""`Agent`: what a run samples with when it has tools or environments, and `agent_from_config`.

    agent = agent_from_config(cfg)                    # rollout.tools / rollout.environment, or None
    rollout = agent.sample(model, tokenizer, examples, G, cfg)

`Agent.sample` does, per batch: one environment per rollout from the pool, reset with its row (the
returned text appended to the prompt); each row's tools (the standalone ones plus its environment's
methods); the prompts rendered with the tools' schemas (chat format); then grpokit's sampler with a
`ToolDriver`. The rollout's `reward_kwargs` hold what reward functions receive besides the columns:
`environments=` (one per row).
A `rollout_func` (TRL's) replaces all of this (`grpokit.agents.custom_rollout`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from grpokit.agents.builtin import ENVIRONMENTS
from grpokit.agents.custom_rollout import rollout_from_func
from grpokit.agents.driver import ToolDriver
from grpokit.agents.environments import EnvironmentPool, reward_function
from grpokit.agents.formats import ChatFormat, PlainFormat, supports_tool_messages
from grpokit.agents.tools import Tool, as_tool, schema_of
from grpokit.errors import ConfigError
from grpokit.rollout.groups import Rollout, eos_token_ids, sample_groups
from grpokit.rollout.vllm_backend import in_process_backend

EVAL_SEED = 20_241_205   # the evaluation pool's seed: every evaluation of every run plays the same episodes


def load_object(name: str, what: str) -> Any:
    """'package.module:attr' -> the object (for rollout.tools and rollout.environment)."""
    module, _, attr = name.rpartition(":")
    if not module or not attr:
        raise ConfigError(f"{what} '{name}' is not an import path: write it as package.module:name")
    try:
        obj = importlib.import_module(module)
    except Exception as e:   # a broken user module names itself, not a traceback
        raise ConfigError(f"{what} '{name}': cannot import '{module}' ({type(e).__name__}: {e}); check the "
                          "name and that it is importable (PYTHONPATH)") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} '{name}': '{module}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def _with_observation(prompt: Any, observation: Any) -> Any:
    """The prompt with reset()'s text appended to its last user message (a text prompt: to its end)."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + str(observation)
    last = prompt[-1]
    return prompt[:-1] + [{**last, "content": str(last.get("content", "")) + str(observation)}]


class Agent:
    """Tools, environments and the tool-loop limits of a run.

    Args:
        tools: standalone tools (functions, async functions, `Tool`s), offered to every rollout.
        factories: environment factories by name ({None: f} for one), or None.
        seed: the training environment pool's seed (the limits and the format are read from the run's config
            in `sample`).
        rollout_func: TRL's rollout_func(prompts, trainer) replacing grpokit's sampling; trainer: its
            second argument.
    """

    def __init__(self, tools: list[Callable], factories: dict[str | None, Callable] | None, seed: int,
                 rollout_func: Callable | None = None, trainer: Any = None) -> None:
        self.tools = [as_tool(t) for t in tools]
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"two tools are named the same ({', '.join(names)}): give each a distinct name")
        self.multi = factories is not None and list(factories) != [None]
        self.pool = EnvironmentPool(factories, seed) if factories else None
        self.eval_pool = EnvironmentPool(factories, EVAL_SEED) if factories else None
        self.rollout_func, self.trainer = rollout_func, trainer
        self.reward_funcs = [(c.__name__, reward_function(c), 1.0)
                             for c in (self.pool.reward_classes if self.pool else [])]
        self.environments: list | None = None     # the latest batch's, one per rollout (TRL's attribute)
        self.shown: list[dict] | None = None      # TRL's `trainer.tools = [...]`: the schemas prompts show

    def show_tools(self, tools: list | None) -> None:
        """TRL's `trainer.tools = ...` after construction: the tool section every prompt renders from now
        on (functions, by their schema, or JSON schemas as dicts). The functions a call runs stay the
        standalone tools and environment methods given at construction, as in TRL; an empty list shows no
        tools and runs no tool loop (TRL's `if self.tools:`)."""
        self.shown = [schema_of(t) for t in (tools or [])]

    def tool_functions(self) -> list[Callable]:
        """The functions behind the tools: the standalone ones, then each environment's methods (of its
        first instance), each once (TRL's trainer.tools)."""
        out = [t.function for t in self.tools]
        for envs in (self.pool.instances.values() if self.pool is not None else []):
            out += [t.function for t in self.pool.tools_of(envs[0]) if t.function not in out]
        return out

    def rng_state(self) -> list | None:
        return self.pool.rng_state() if self.pool is not None else None

    def set_rng_state(self, state: list | None) -> None:
        if self.pool is not None:
            self.pool.set_rng_state(state)

    def _environments(self, rows: list[dict], evaluation: bool) -> tuple[list | None, list]:
        """(one environment per row or None, the observations reset returned)."""
        if self.pool is None:
            return None, [None] * len(rows)
        pool = self.eval_pool if evaluation else self.pool
        names = [row.get("environment") if self.multi else None for row in rows]
        envs = pool.take(names)
        observations = [env.reset(**({k: v for k, v in row.items() if k != "environment"} if self.multi
                                     else row)) for env, row in zip(envs, rows)]
        return envs, observations

    @staticmethod
    def _format(want: str, tokenizer, eos_ids: list[int], chat: bool, kwargs: dict):
        """The tool format: rollout.tool_format, auto resolved by the prompts (chat messages or text)."""
        if want == "plain" or (want == "auto" and not chat):
            return PlainFormat(tokenizer, eos_ids)
        if not chat:
            raise ConfigError("rollout.tool_format=chat needs chat prompts: set task.chat_template=true, or "
                              "rollout.tool_format=plain")
        if not supports_tool_messages(tokenizer, kwargs):
            raise ConfigError("the chat template does not render tool calls and tool results: use a model "
                              "whose template does (Qwen2.5, Hermes, ...) or rollout.tool_format=plain")
        return ChatFormat(tokenizer, eos_ids, kwargs)

    def sample(self, model, tokenizer, examples: list, group_size: int, cfg: Any, *, greedy: bool = False,
               evaluation: bool = False, sampler: Callable[..., Rollout] | None = None
               ) -> Rollout:
        """G rollouts per example with the tools (and environments); their reward keywords
        (`environments=`) in its `reward_kwargs`.

        sampler: another engine's multi-turn sampler, sampler(prompts, group_size, driver=, tools=) ->
        Rollout (rollout.backend=vllm: `grpokit.rollout.vllm_backend.vllm_agent_sampler`); None: grpokit's
        own decode loop."""
        r = cfg.rollout
        rows = [{"prompt": ex.prompt, **ex.columns} for ex in examples for _ in range(group_size)]
        if self.rollout_func is not None:
            return rollout_from_func(self.rollout_func, self.trainer, rows, tokenizer, group_size,
                                     eos_token_ids(model, tokenizer))
        envs, observations = self._environments(rows, evaluation)
        self.environments = envs
        prompts = [_with_observation(row["prompt"], obs) for row, obs in zip(rows, observations)]
        empty = [i for i, p in enumerate(prompts) if p == ""]
        if empty:
            raise ConfigError(f"prompt {empty[0]} is empty (no data, and reset() returned no text): make the "
                              "environment's reset() return the prompt, or give prompts")
        row_tools = [self._tools_of(env) for env in (envs or [None] * len(rows))]
        kwargs = dict(cfg.task.chat_template_kwargs)
        chat = isinstance(prompts[0], list)
        fmt = self._format(r.tool_format, tokenizer, eos_token_ids(model, tokenizer), chat, kwargs)
        schemas = [[t.schema for t in tools.values()] for tools in row_tools] if fmt.name == "chat" else None
        if self.shown is not None and schemas is not None:
            schemas = [self.shown] * len(rows)
        driver = ToolDriver(fmt, row_tools, max_new_tokens=r.max_completion_length,
                            max_iterations=r.max_tool_calling_iterations, timeout=r.tool_timeout,
                            max_chars=r.max_tool_output_chars)
        if self.shown == []:     # trainer.tools = []: one plain turn, no tool section
            driver = None
        G = group_size
        same = [prompts[i] == prompts[i - i % G] and (schemas is None or schemas[i] == schemas[i - i % G])
                for i in range(len(prompts))]
        shared = all(same)
        # the G rows of a prompt share its prefill when their prompts (and tools) are the same
        pick = slice(None, None, G) if shared else slice(None)
        tools = None if schemas is None or driver is None else schemas[pick]
        if sampler is not None:
            rollout = sampler(prompts[pick], G if shared else 1, driver=driver, tools=tools)
        else:
            backend = in_process_backend() if r.backend == "vllm" else r.backend   # evaluation on vllm runs
            rollout = sample_groups(model, tokenizer, prompts[pick], G if shared else 1,
                                    r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                                    top_k=r.top_k, max_prompt_length=r.max_prompt_length,
                                    truncate_prompt=r.truncate_prompt, backend=backend, greedy=greedy,
                                    chat_template_kwargs=kwargs, tools=tools, driver=driver)
        if not shared:   # one prefill per row; the groups are still the G rows of an example
            group_ids = torch.arange(len(examples), device=rollout.group_ids.device).repeat_interleave(G)
            rollout = dataclasses.replace(rollout, group_size=G, group_ids=group_ids)
        return dataclasses.replace(rollout, reward_kwargs={"environments": envs}) if envs is not None \
            else rollout

    def _tools_of(self, env: Any) -> dict[str, Tool]:
        tools = {t.name: t for t in self.tools}
        if env is not None:
            tools.update({t.name: t for t in self.pool.tools_of(env)})
        return tools


def agent_from_config(cfg: Any) -> Agent | None:
    """The run's `Agent` from rollout.tools and rollout.environment (None when both are empty)."""
    r = cfg.rollout
    if not r.tools and not r.environment:
        return None
    tools = [load_object(name, "rollout.tools entry") for name in r.tools]
    factories = None
    if r.environment:
        cls = ENVIRONMENTS.get(r.environment) or load_object(r.environment, "rollout.environment")
        if not callable(cls):
            raise ConfigError(f"rollout.environment '{r.environment}' is not a class or factory: name one, "
                              f"or a built-in ({', '.join(ENVIRONMENTS)})")
        factories = {None: cls}
    return Agent(tools, factories, cfg.run.seed)
