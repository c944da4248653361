"""The package's import structure: no cycles, every module importable alone, the pure math light.

The graph is read from the source (AST), so it counts every import statement: those inside functions
and those under `if TYPE_CHECKING:` too. A type-only import never runs, but it still ties the two files
together for a reader (each must be understood with the other), so a cycle through one is a cycle.
Function-level imports are kept for optional or heavy third-party packages only (matplotlib, tqdm, vllm,
wandb, math-verify, ...): a grpokit module imported inside a function would hide a cycle, so there is
none, bar the allow-list below.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "grpokit"

# (importer, imported): grpokit-internal imports allowed inside a function, each with its reason.
FUNCTION_LEVEL_ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The grpokit modules an import statement loads (a `from pkg import name` of a submodule counts it)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        out.add(sub if sub in modules else prefix)
    return out & modules


def import_graph(package: Path = PACKAGE) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """({module: modules it imports}, [(importer, imported, line) of imports inside a function])."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    modules = set(paths)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    inside: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, module: str, is_package: bool, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_package, child, modules) - {module}:
                    graph[module].add(target)
                    if in_function:
                        inside.append((module, target, child.lineno))
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, module, is_package, nested)

    for module, path in paths.items():
        visit(ast.parse(path.read_text(encoding="utf-8")), module, path.name == "__init__.py", False)
    return graph, inside


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other (directly or round a loop), each sorted: the strongly
    connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def test_circles_finds_planted_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_graph_reads_function_level_and_relative_imports():
    graph, _ = import_graph()
    assert "grpokit.core.loss" in graph["grpokit.train.update"]           # `from ... import` at module level
    assert len(graph) > 40 and all(m.startswith("grpokit") for m in graph)


def test_graph_counts_type_checking_and_function_level_imports(tmp_path):
    """A cycle closed by an import under `if TYPE_CHECKING:` or inside a function is a cycle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg.a import X\n")
    (pkg / "c.py").write_text("import pkg.d\n")
    (pkg / "d.py").write_text("def f():\n    from . import c\n    return c\n")
    graph, inside = import_graph(pkg)
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert inside == [("pkg.d", "pkg.c", 2)]


def test_no_import_cycles():
    """No two modules import each other, at any depth, counting type-only and function-level imports."""
    graph, _ = import_graph()
    found = circles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_grpokit_imports_inside_functions():
    _, inside = import_graph()
    bad = [f"{a} imports {b} inside a function (line {n})" for a, b, n in inside
           if (a, b) not in FUNCTION_LEVEL_ALLOWED]
    assert not bad, "\n".join(bad)


_ISOLATION = """
import importlib, json, sys, traceback
before = set(sys.modules)
failed = {}
for name in json.loads(sys.argv[1]):
    for m in [m for m in sys.modules if m not in before]:
        del sys.modules[m]
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_each_module_imports_alone():
    """A fresh interpreter, then each module with every module the previous one loaded forgotten.

    torch and friends stay loaded (forgetting them breaks their C extensions); grpokit's own modules
    and everything else imported after start-up are dropped between modules.
    """
    graph, _ = import_graph()
    # vllm_*: need vllm to run; __main__ runs the command line
    optional = {"grpokit.rollout.vllm_backend", "grpokit.rollout.vllm_engine", "grpokit.cli.vllm_serve",
                "grpokit.__main__"}
    names = sorted(m for m in graph if m not in optional)
    warm = "import torch, transformers, safetensors.torch\n"
    out = subprocess.run([sys.executable, "-c", warm + _ISOLATION, json.dumps(names)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{k}:\n{v}" for k, v in failed.items())


HEAVY = ("grpokit.train", "grpokit.rollout", "grpokit.fast", "grpokit.model", "transformers")


def test_pure_math_pulls_in_no_kernel_sampler_trainer_or_transformers():
    """`import grpokit.core.*` loads the pure math and the choices it is typed with, and nothing else."""
    probe = ("import sys, json, grpokit.core.loss, grpokit.core.advantages, grpokit.core.ppo\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('grpokit', 'transformers')))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout)
    assert not [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)], loaded
    assert set(loaded) == {"grpokit", "grpokit.core", "grpokit.core.advantages", "grpokit.core.loss",
                           "grpokit.core.ppo", "grpokit.core.policy_terms", "grpokit.core.entropy",
                           "grpokit.core.token_masks", "grpokit.config", "grpokit.config.choices"}


def test_core_imports_only_core_and_the_choices():
    graph, _ = import_graph()
    for module in (m for m in graph if m.startswith("grpokit.core")):
        outside = {t for t in graph[module] if not t.startswith("grpokit.core")} - {"grpokit.config.choices"}
        assert not outside, f"{module} imports {sorted(outside)}: grpokit.core is pure tensor math"


def test_speed_ups_are_reached_only_through_the_one_switch():
    """Outside grpokit.fast, one module imports it or any of its modules: the one switch, grpokit.switch.
    The readable path (sampler, update, log-probs) asks grpokit.model.speedups, which imports none of it."""
    graph, _ = import_graph()
    bad = [f"{m} imports {t}" for m, targets in graph.items()
           if not m.startswith("grpokit.fast") and m != "grpokit.switch"
           for t in targets if t == "grpokit.fast" or t.startswith("grpokit.fast.")]
    assert not bad, "\n".join(bad)
    assert "grpokit.fast" in graph["grpokit.switch"]                      # the graph sees the switch's import
    protocol_users = {m for m, targets in graph.items() if "grpokit.model.speedups" in targets}
    assert {"grpokit.rollout.sampler", "grpokit.train.update", "grpokit.model.logprobs"} <= protocol_users
    assert not {t for t in graph["grpokit.model.speedups"] if t.startswith("grpokit")}   # it needs nothing


def test_the_readable_path_loads_no_speed_up():
    """The sampler, the update and the log-probs are written against grpokit.model.speedups: with
    `grpokit.switch` kept out of the process, they import, and none of grpokit.fast is loaded."""
    probe = ("import sys, json\nsys.modules['grpokit.switch'] = None\n"
             "import grpokit.rollout.sampler, grpokit.rollout.groups, grpokit.train.update, "
             "grpokit.model.logprobs\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('grpokit'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout)
    assert "grpokit.rollout.sampler" in loaded and "grpokit.model.speedups" in loaded
    assert not [m for m in loaded if m == "grpokit.fast" or m.startswith("grpokit.fast.")], loaded


def test_each_subpackage_says_what_it_holds():
    """Every subpackage's docstring names each of its modules (the README's code map points at them)."""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        missing = [p.stem for p in init.parent.glob("*.py") if p.stem != "__init__" and p.stem not in doc]
        assert doc and not missing, f"{init.parent.name}/__init__.py does not name {missing}"


def test_no_module_over_400_lines_and_no_function_over_80():
    """The house style's size guide, kept by a test: a file that outgrows it is split by responsibility."""
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 400:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and node.end_lineno - node.lineno >= 80:
                long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: "
                                      f"{node.end_lineno - node.lineno + 1} lines")
    assert not long_modules and not long_functions, "\n".join(long_modules + long_functions)

