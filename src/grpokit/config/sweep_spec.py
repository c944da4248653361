"""The sweep file of `grpokit sweep`: parsed, checked and expanded into its cells before anything runs.

    name: k                                   # optional; default: the file's stem
    output_dir: runs/sweeps/k                 # optional; default: runs/sweeps/<name>
    base:                                     # the config every cell starts from (as `grpokit train`)
      config: configs/demo.yaml               # optional YAML config (relative to the current folder);
                                              #   omitted: the built-in demo of `grpokit train`
      overrides: {run.max_steps: 200}         # optional dotted keys, as on the command line
    variants:                                 # optional: named sets of overrides, one axis "variant"
      plain: {}
      dynamic: {rollout.dynamic_sampling: true}
    axes:                                     # optional: dotted key -> list of values; grid = product
      rollout.num_generations: [2, 4, 8]
    derived:                                  # optional: key -> arithmetic on the cell's config
      run.max_steps: "25600 // (rollout.prompts_per_step * rollout.num_generations)"
    seeds: [0, 1, 2]                          # run.seed of each repeat
    plot: [eval/accuracy, mean/frac_zero_std] # optional: results columns plotted against the axes

A cell is one product of (variant, axis values, seed); its overrides apply in the order base file,
base overrides, variant, axis values, derived keys. A derived expression is evaluated on the config
the earlier layers resolved (defaults included), in the file's order, each seeing the derived keys
above it; it may use numbers, dotted config keys, + - * / // % ** and
min / max / abs / round / int; nothing else parses. run.seed, run.output_dir, run.resume and
run.overwrite belong to the sweep and may not be set in it. Every cell's config is built (and so
validated) by `expand`, so a bad value stops the sweep before its first cell.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import itertools
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.config.schema import SECTIONS, ConfigError, GRPOConfig, build_config, load_config

TOP_KEYS = ("name", "output_dir", "base", "variants", "axes", "derived", "seeds", "plot")
BASE_KEYS = ("config", "overrides")
SWEEP_OWNED = ("run.seed", "run.output_dir", "run.resume", "run.overwrite")
DEFAULT_PLOT = ("eval/accuracy", "mean/frac_zero_std", "wall_s")
CONFIG_KEYS = tuple(f"{s}.{f.name}" for s, cls in SECTIONS.items()
                    for f in dataclasses.fields(cls)) + ("preset",)


@dataclass
class Cell:
    """One run of the grid: its labels (axis key -> value, 'variant' first if any), seed, config, folder."""

    labels: dict[str, Any]
    seed: int
    cfg: GRPOConfig
    folder: Path


@dataclass
class Sweep:
    """A checked sweep file: the layers every cell is built from."""

    name: str
    path: Path
    output_dir: Path
    base_config: str | None
    base_overrides: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    axes: dict[str, list]
    derived: dict[str, str]
    seeds: list[int]
    plot: list[str]

    @property
    def label_keys(self) -> list[str]:
        return (["variant"] if self.variants else []) + list(self.axes)


def _suggest(word: str, options: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _mapping(value: Any, where: str, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: '{what}' must be a mapping, got {type(value).__name__}: "
                          "write it as key: value lines")
    return value


def _check_keys(keys: Any, where: str, what: str) -> None:
    for key in keys:
        if key not in CONFIG_KEYS:
            hint = _suggest(str(key), CONFIG_KEYS)
            raise ConfigError(f"{where}: {what} '{key}' is not a config key{hint}: "
                              "use a dotted key such as rollout.num_generations")
        if key in SWEEP_OWNED:
            hint = "list the seeds under 'seeds'" if key == "run.seed" else "the sweep sets it for each cell"
            raise ConfigError(f"{where}: {what} '{key}' belongs to the sweep ({hint}): remove it")


def _read_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise ConfigError(f"sweep file '{path}' does not exist: give the path of a sweep YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"sweep file '{path}' is not UTF-8 text: save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"sweep file '{path}'{where} is not valid YAML: fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"sweep file '{path}' must hold a mapping (base, axes, seeds, ...), "
                          f"not {type(data).__name__}")
    return data


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (every key, every axis, every expression); nothing runs.

    Raises:
        ConfigError: one line naming the bad key or value and what to write instead.
    """
    path = Path(path)
    data = _read_yaml(path)
    where = f"sweep file '{path}'"
    for key in data:
        if key not in TOP_KEYS:
            raise ConfigError(f"{where}: unknown key '{key}'{_suggest(str(key), TOP_KEYS)}: "
                              f"use {', '.join(TOP_KEYS)}")
    base = _mapping(data.get("base"), where, "base")
    for key in base:
        if key not in BASE_KEYS:
            raise ConfigError(f"{where}: unknown key 'base.{key}'{_suggest(str(key), BASE_KEYS)}: "
                              "use base.config (a YAML file) and base.overrides (dotted keys)")
    overrides = _mapping(base.get("overrides"), where, "base.overrides")
    _check_keys(overrides, where, "base.overrides key")
    variants = _mapping(data.get("variants"), where, "variants")
    for label, keys in variants.items():
        _check_keys(_mapping(keys, where, f"variants.{label}"), where, f"variants.{label} key")
    axes = _axes(data, where, bool(variants))
    derived = _mapping(data.get("derived"), where, "derived")
    _check_keys(derived, where, "derived key")
    for key, expr in derived.items():
        check_expression(str(expr), f"{where}: derived.{key}")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                         for s in seeds):
        raise ConfigError(f"{where}: 'seeds' must be a non-empty list of integers, got {seeds!r}: "
                          "write e.g. seeds: [0, 1, 2]")
    plot = data.get("plot", list(DEFAULT_PLOT))
    if not isinstance(plot, list) or not all(isinstance(p, str) for p in plot):
        raise ConfigError(f"{where}: 'plot' must be a list of results columns, got {plot!r}: "
                          "write e.g. plot: [eval/accuracy, wall_s]")
    name = str(data.get("name") or path.stem)
    config = base.get("config")
    return Sweep(name=name, path=path, output_dir=Path(str(data.get("output_dir") or f"runs/sweeps/{name}")),
                 base_config=None if config is None else str(config), base_overrides=dict(overrides),
                 variants={str(k): dict(v or {}) for k, v in variants.items()}, axes=axes,
                 derived={k: str(v) for k, v in derived.items()}, seeds=list(seeds), plot=list(plot))


def _axes(data: dict, where: str, has_variants: bool) -> dict[str, list]:
    if "axes" not in data:
        return {}
    axes = data["axes"]
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(f"{where}: 'axes' must map config keys to lists of values, got {axes!r}: "
                          "write e.g. axes: {rollout.num_generations: [4, 8]}, or leave 'axes' out"
                          + (" (the variants make the grid)" if has_variants else " (a grid of seeds only)"))
    _check_keys(axes, where, "axis")
    for key, values in axes.items():
        if not isinstance(values, list):
            raise ConfigError(f"{where}: axis '{key}' must be a list of values, got {values!r}: "
                              f"write {key}: [{values!r}]")
        if not values:
            raise ConfigError(f"{where}: axis '{key}' has no values: give at least one, or remove the axis")
        if len({repr(v) for v in values}) < len(values):
            raise ConfigError(f"{where}: axis '{key}' repeats a value ({values!r}): list each value once")
    return {str(k): list(v) for k, v in axes.items()}


# ---- derived expressions: a small, closed arithmetic ------------------------------------------
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CALLS = {"min": min, "max": max, "abs": abs, "round": round, "int": int}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _eval(node: ast.AST, lookup) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, lookup)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not True / False
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left, lookup), _eval(node.right, lookup))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, lookup))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
            and not node.keywords):
        return _CALLS[node.func.id](*(_eval(a, lookup) for a in node.args))
    key = _dotted(node)
    if key is not None:
        return lookup(key)
    raise ValueError(f"'{ast.unparse(node)}' is not allowed")


def check_expression(expr: str, where: str) -> None:
    """Parse a derived expression and check its names are config keys (evaluated later, per cell)."""
    def known(key: str) -> int:
        if key not in CONFIG_KEYS:
            raise ValueError(f"'{key}' is not a config key{_suggest(key, CONFIG_KEYS)}")
        return 1

    try:
        _eval(ast.parse(expr, mode="eval"), known)
    except SyntaxError:
        raise ConfigError(f"{where} '{expr}' is not an expression: write arithmetic on dotted config keys, "
                          "e.g. 25600 // (rollout.prompts_per_step * rollout.num_generations)") from None
    except ValueError as e:
        raise ConfigError(f"{where} '{expr}': {e}: use numbers, dotted config keys, + - * / // % ** "
                          "and min/max/abs/round/int") from None
    except (ArithmeticError, TypeError):
        pass  # 1 in place of every key can divide by zero; the real values are checked per cell


def evaluate_expression(expr: str, cfg: GRPOConfig) -> Any:
    """The value of a derived expression on a built config (dotted keys read from it)."""
    def lookup(key: str) -> Any:
        section, name = key.split(".", 1)
        return getattr(getattr(cfg, section), name)

    return _eval(ast.parse(expr, mode="eval"), lookup)


# ---- expansion ------------------------------------------------------------------------------------
def _base_values(sweep: Sweep) -> tuple[dict[str, Any], bool]:
    """(flat keys of the base config file, whether the built-in demo is the starting point)."""
    if sweep.base_config is None:
        return {}, True
    import yaml

    load_config(sweep.base_config)  # its own one-line errors: missing file, bad YAML, bad key
    tree = yaml.safe_load(Path(sweep.base_config).read_text(encoding="utf-8")) or {}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key in SECTIONS:
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat, False


def folder_name(labels: dict[str, Any], seed: int) -> str:
    """'num_generations-8__seed-0': each label's field name (the dotted key when two share it)."""
    short = [k.split(".")[-1] for k in labels]
    parts = []
    for key, name in zip(labels, short):
        value = re.sub(r"[^A-Za-z0-9.+-]", "_", str(labels[key]))
        parts.append(f"{key if short.count(name) > 1 else name}-{value}")
    return "__".join(parts + [f"seed-{seed}"])


def expand(sweep: Sweep, build) -> list[Cell]:
    """Every cell of the grid, its config built and validated (variant x axes product x seeds).

    build(values) -> GRPOConfig builds a config from flat dotted values on the built-in demo
    (`grpokit.config.run_config.demo_config`); with a base config file, the file's keys come first.
    """
    file_values, on_demo = _base_values(sweep)
    make = build if on_demo else build_config
    variants = list(sweep.variants.items()) or [(None, {})]
    combos = list(itertools.product(*sweep.axes.values())) if sweep.axes else [()]
    cells = []
    for (label, variant), combo, seed in itertools.product(variants, combos, sweep.seeds):
        labels = ({"variant": label} if label is not None else {}) | dict(zip(sweep.axes, combo))
        folder = sweep.output_dir / folder_name(labels, seed)
        values = {**file_values, **sweep.base_overrides, **variant, **dict(zip(sweep.axes, combo)),
                  "run.seed": seed, "run.output_dir": str(folder)}
        where = f"sweep '{sweep.name}' cell {folder.name}"
        try:
            cfg = make(values)
            for key, expr in sweep.derived.items():  # in order: each sees the derived keys before it
                values[key] = evaluate_expression(expr, cfg)
                cfg = make(values)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        except (ArithmeticError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: a derived expression failed ({e}): fix 'derived'") from None
        cells.append(Cell(labels=labels, seed=seed, cfg=cfg, folder=folder))
    return cells
