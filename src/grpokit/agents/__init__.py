"""Agents: multi-turn rollouts with tools and environments (docs/agents.md).

    tools        a function as a `Tool` (schema from type hints and docstring); running calls concurrently
    formats      where a turn ends, reading its calls, rendering results as tokens (chat / plain)
    tool_parsers each chat-template family's call syntax read into calls (Hermes, XML, GLM-4, Llama 3, ...)
    driver       the tool loop's rules for one batch (`ToolDriver`, consulted by rollout/turns.py)
    environments TRL's environment_factory: a pool of instances, reset per rollout, get_reward columns
    agent        `Agent`: a run's tools, environments and limits; `agent_from_config`
    custom_rollout  TRL's rollout_func as a Rollout
    builtin      offline environments: calculator, guess_number
"""
