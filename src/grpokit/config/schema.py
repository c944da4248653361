"""One typed config tree for grpokit: defaults, YAML load, dotted CLI overrides, presets, validation.

Defaults are the DeepSeekMath paper's (beta 0.04, epsilon 0.2, one update per generation batch,
group-std scaling, token-level ratio, per-completion token mean). Field names follow Hugging Face
TRL where TRL has the concept (num_generations, beta, epsilon, loss_type, scale_rewards, ...).

    cfg = load_config("cfg.yaml", ["loss.beta=0.0", "preset=dapo"])

Every error raised here is a `ConfigError` whose message is one line naming the field and what to
change, so the CLI can print it without a traceback.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# the sections: public here too (grpokit.config.schema.ModelConfig, ...)
from grpokit.config.sections import (
    LossConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RMConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
)
from grpokit.config.validation import validate  # the range and consistency checks, one function per concern
from grpokit.errors import (  # ConfigError: public here too (grpokit.config.schema.ConfigError)
    ConfigError,
    suggest,
)

SECTIONS = {"model": ModelConfig, "task": TaskConfig, "rollout": RolloutConfig,
            "reward": RewardConfig, "loss": LossConfig, "optim": OptimConfig, "run": RunConfig,
            "rm": RMConfig}

# Presets fill defaults before the user's keys: an explicit key always wins.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"loss.loss_type": "grpo", "loss.importance_sampling_level": "token", "loss.beta": 0.04,
              "loss.epsilon": 0.2, "loss.num_iterations": 1, "loss.scale_rewards": "group"},
    "dr_grpo": {"loss.loss_type": "dr_grpo", "loss.scale_rewards": "none", "loss.beta": 0.0},
    "dapo": {"loss.loss_type": "dapo", "loss.epsilon": 0.2, "loss.epsilon_high": 0.28, "loss.beta": 0.0,
             "loss.importance_sampling_level": "token", "rollout.dynamic_sampling": True,
             "loss.mask_truncated_completions": False, "reward.overlong_buffer": 64},
    "gspo": {"loss.importance_sampling_level": "sequence", "loss.epsilon": 3e-4, "loss.epsilon_high": 4e-4,
             "loss.beta": 0.0, "loss.loss_type": "grpo"},
}

@dataclass
class GRPOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    rm: RMConfig = field(default_factory=RMConfig)
    preset: str | None = None

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def batch_size(self) -> int:
        """Completions per generation batch: B * G."""
        return self.rollout.prompts_per_step * self.rollout.num_generations

    @property
    def epsilon_high(self) -> float:
        return self.loss.epsilon if self.loss.epsilon_high is None else self.loss.epsilon_high


def _all_keys() -> dict[str, str]:
    """Every dotted key 'section.field', and each field's bare name when it is unambiguous."""
    dotted = {f"{s}.{f.name}": f"{s}.{f.name}"
              for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    bare: dict[str, list[str]] = {}
    for key in dotted:
        bare.setdefault(key.split(".", 1)[1], []).append(key)
    return {**dotted, **{k: v[0] for k, v in bare.items() if len(v) == 1}}


# dotted groups inside a section: `rollout.async.max_staleness` is the field rollout.async_max_staleness
SUBSECTIONS = {"rollout.async": "rollout.async_", "rollout.tree": "rollout.tree_",
               "rollout.mcts": "rollout.mcts_"}


def _resolve_key(key: str) -> str:
    if key == "preset":
        return key
    for group, prefix in SUBSECTIONS.items():
        if key.startswith(group + "."):
            key = prefix + key[len(group) + 1:]
    keys = _all_keys()
    if key in keys:
        return keys[key]
    if key in SECTIONS:
        raise ConfigError(f"'{key}' is a section: set its fields as {key}.<field>=value")
    raise ConfigError(f"unknown config key '{key}'{suggest(key, list(keys) + ['preset'])}")


def _field_type(section: str, name: str) -> Any:
    hints = typing.get_type_hints(SECTIONS[section])
    return hints[name]


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML/CLI value to the field's declared type, or raise a one-line ConfigError."""
    section, name = key.split(".", 1)
    tp = _field_type(section, name)
    # a declared choice (grpokit.config.choices): one of its values
    if typing.get_origin(tp) is Literal:
        options = [str(a) for a in typing.get_args(tp)]
        if str(value) in options:
            return str(value)
        raise ConfigError(f"{key} must be one of {', '.join(options)}, got {value!r}"
                          f"{suggest(str(value), options)}")
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    base = typing.get_origin(base) or base
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and base is not str):
        if optional:
            return None
        if base is list:  # `run.report_to: none` (TRL's spelling) = the empty list
            return []
        raise ConfigError(f"{key} cannot be empty: give a {getattr(base, '__name__', base)}")
    try:
        if base is bool:
            if isinstance(value, str):
                low = value.lower()
                if low in ("true", "1", "yes", "on"):
                    return True
                if low in ("false", "0", "no", "off"):
                    return False
                if str in args:  # a `bool | str` field (run.resume): validate checks the word
                    return low
                raise ValueError
            if isinstance(value, (bool, int)) and value in (0, 1):
                return bool(value)
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if base is list:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v] if value.lower() != "none" else []
            if not isinstance(value, list):
                raise ValueError
            return value
        if base is dict:
            if isinstance(value, str):
                import yaml

                value = yaml.safe_load(value)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except (TypeError, ValueError):
        pass
    else:
        return value
    want = getattr(base, "__name__", str(base))
    raise ConfigError(f"{key} must be a {want}, got {value!r}: change it to a {want}")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'loss': {'beta': 0}} -> {'loss.beta': 0}; dict-valued fields (reward.funcs) stay whole."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix and key in SECTIONS:
            out.update(_flatten(value, prefix=f"{key}."))
        elif isinstance(value, dict) and f"{prefix}{key}" in SUBSECTIONS:   # rollout: {async: {...}}
            out.update({f"{full}.{k}": v for k, v in value.items()})
        else:
            out[full] = value
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """CLI `key=value` strings to a flat dict; values are parsed as YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value: write it as e.g. loss.beta=0.0")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def build_config(values: dict[str, Any] | None = None) -> GRPOConfig:
    """A validated config from a (nested or dotted) dict: preset first, then explicit keys."""
    flat = _flatten(dict(values or {}))
    preset = flat.pop("preset", None)
    resolved: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset '{preset}'{suggest(str(preset), PRESETS)}: "
                              f"choose one of {', '.join(PRESETS)}")
        resolved.update(PRESETS[preset])
    for key, value in flat.items():
        resolved[_resolve_key(key)] = value
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, value in resolved.items():
        section, name = key.split(".", 1)
        sections[section][name] = _coerce(key, value)
    return GRPOConfig(**{s: SECTIONS[s](**kw) for s, kw in sections.items()}, preset=preset)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> GRPOConfig:
    """Load YAML (optional), apply `key=value` overrides, validate. Raises ConfigError."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file '{p}' is a folder: give the path of a YAML file in it")
        if not p.is_file():
            raise ConfigError(f"config file '{p}' does not exist: give the path of a YAML file")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file '{p}' is not UTF-8 text (byte {e.start}): "
                              "save it as UTF-8") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file '{p}'{where} is not valid YAML: fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file '{p}' must hold a mapping of sections, "
                              f"not {type(loaded).__name__}")
        values = _flatten(loaded or {})
    values.update(_flatten(parse_overrides(overrides or [])) if overrides else {})
    return build_config(values)


def explicit_preset_conflicts(cfg: GRPOConfig) -> dict[str, tuple[Any, Any]]:
    """Keys where the resolved value differs from what the preset would set: {key: (preset, now)}."""
    if cfg.preset is None:
        return {}
    out = {}
    for key, want in PRESETS[cfg.preset].items():
        section, name = key.split(".", 1)
        have = getattr(getattr(cfg, section), name)
        if have != want:
            out[key] = (want, have)
    return out


def config_reference() -> str:
    """Markdown table of every key, its default and meaning (used to write the README)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for s, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meaning = f.metadata["help"].replace("|", "\\|")  # a bare | would split the table cell
            if isinstance(default, str) and any(c in default for c in "\n\t\r"):
                default = repr(default)  # a newline (rm.step_separator) would end the table row
            rows.append(f"| `{s}.{f.name}` | `{default}` | {meaning} |")
    return "\n".join(rows)
