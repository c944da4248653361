"""The code tasks' and the sandbox's settings (grpokit.rewards.code, grpokit.sandbox), checked with the rest
by `grpokit.config.validation.validate`."""

from __future__ import annotations

from typing import Any

from grpokit.errors import ConfigError

CODE_TASKS = ("functions", "humaneval", "mbpp", "code")
CODE_REWARDS = ("code_tests", "code_all", "code_format")


def check_code(cfg: Any) -> None:
    """A code task is graded by running programs; the sandbox's bounds and its server's URL."""
    rw, funcs = cfg.reward, set(cfg.reward.funcs)
    graded = bool(funcs & set(CODE_REWARDS)) and not funcs & {"rule", "accuracy"}
    if cfg.task.name in CODE_TASKS and not graded:
        raise ConfigError(f"task.name={cfg.task.name} is graded by running programs: set reward.funcs to "
                          "{code_tests: 1.0} (or code_all, plus code_format)")
    if rw.sandbox_workers < 1 or rw.sandbox_timeout_s <= 0 or rw.sandbox_memory_mib < 64:
        raise ConfigError("reward.sandbox_workers must be >= 1, reward.sandbox_timeout_s > 0 and "
                          "reward.sandbox_memory_mib >= 64")
    if rw.sandbox_url is not None and not rw.sandbox_url.startswith(("http://", "https://")):
        raise ConfigError(f"reward.sandbox_url must start with http:// or https://, got {rw.sandbox_url!r}")
