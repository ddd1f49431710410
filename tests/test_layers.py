"""Imports run one way: from the façade and the plugin down through the stages to the format.

Every module of the package belongs to exactly one layer below; a module may import its own layer's
modules and any lower layer's, never a higher one (imports inside functions count too). Units joined
by ``+`` share a layer but do not import each other. Module-level imports form no cycle.
"""
from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest_ptdbg

PKG = "pytest_ptdbg"
ROOT = os.path.dirname(pytest_ptdbg.__file__)

#: lowest first
LAYERS = [
    "errors",
    "format",
    "runtime",
    "capture",
    "dump",
    "comparison",
    "replayer",
    "judge",
    "repro",
    "sinks",
    "advise",
    "report",
    "api+parsing+debugger",
    "plugin",
    "cli",
]


def _unit_layers() -> Dict[str, int]:
    return {f"{PKG}.{u}": i for i, layer in enumerate(LAYERS) for u in layer.split("+")}


def _modules() -> Iterator[Tuple[str, str, bool]]:
    """(dotted name, path, is package __init__) of every module under the package."""
    for root, _dirs, files in os.walk(ROOT):
        if "__pycache__" in root:
            continue
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                yield ".".join(rel), path, f == "__init__.py"


def _imports(path: str, mod: str, is_pkg: bool, top_level_only: bool = False) -> Iterator[Tuple[int, str]]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                yield node.lineno, f"{target}.{a.name}"


def _unit_of(name: str, units: Dict[str, int]) -> Optional[str]:
    best = None
    for u in units:
        if (name == u or name.startswith(u + ".")) and (best is None or len(u) > len(best)):
            best = u
    return best


def test_every_module_has_a_layer():
    units = _unit_layers()
    orphans = [m for m, _p, _ in _modules() if m != PKG and _unit_of(m, units) is None]
    assert not orphans, f"modules outside every layer (add them to LAYERS or move them): {orphans}"


def test_imports_run_one_way():
    units = _unit_layers()
    bad: List[str] = []
    for mod, path, is_pkg in _modules():
        src = _unit_of(mod, units)
        if src is None:
            continue
        for line, target in _imports(path, mod, is_pkg):
            dst = _unit_of(target, units)
            if dst is None or dst == src:
                continue
            if units[dst] > units[src]:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {src} (layer {units[src]}) imports {target} (layer {units[dst]})")
            elif units[dst] == units[src]:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {src} imports {target} of the same layer")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycles():
    mods = {m: (p, is_pkg) for m, p, is_pkg in _modules()}
    graph: Dict[str, Set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        deps = set()
        for _line, target in _imports(path, mod, is_pkg, top_level_only=True):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != mod and target != PKG:
                deps.add(target)
        graph[mod] = deps
    cycles: List[List[str]] = []
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "module-level import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The check itself: an import from a lower layer to a higher one is reported."""
    units = _unit_layers()
    f = tmp_path / "bad.py"
    f.write_text("def f():\n    from pytest_ptdbg.plugin import options\n")
    found = [(line, t) for line, t in _imports(str(f), f"{PKG}.format.bad", False)]
    assert found == [(2, "pytest_ptdbg.plugin.options")]
    assert units[_unit_of(found[0][1], units)] > units[_unit_of(f"{PKG}.format.bad", units)]
