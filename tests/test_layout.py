"""docs/layout.md lists every module with a current line count; the import graph has no upward or
circular imports under ``cbdp_jax/_src``."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import layout  # noqa: E402


def _listed() -> dict[str, int]:
    rows = re.findall(r"^(\S+\.py)\s+(\d+)\s", layout.documented_block(), re.M)
    return {name: int(n) for name, n in rows}


def test_layout_lists_every_module_with_its_line_count():
    listed = _listed()
    actual = {
        str(p.relative_to(ROOT / "cbdp_jax")): len(p.read_text().splitlines())
        for p in layout.modules()
    }
    assert set(listed) == set(actual), set(listed) ^ set(actual)
    # Counts drift with every edit; within 10% (or 20 lines) they still describe the module's size.
    stale = {k: (listed[k], n) for k, n in actual.items() if abs(listed[k] - n) > max(20, 0.1 * n)}
    assert not stale, f"run `python tools/layout.py --write`: {stale}"


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cbdp_jax"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("cbdp_jax"))
    return out


def _src_modules() -> dict[str, Path]:
    src = ROOT / "cbdp_jax" / "_src"
    out = {}
    for p in src.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def test_nothing_under_src_imports_the_public_layer():
    upward = {
        name: sorted(
            m for m in _imports(path, top_level_only=False) if not m.startswith("cbdp_jax._src")
        )
        for name, path in _src_modules().items()
    }
    assert not {k: v for k, v in upward.items() if v}


def test_src_modules_have_no_import_cycles():
    mods = _src_modules()
    graph = {
        name: {m for m in _imports(path, top_level_only=True) if m in mods and m != name}
        for name, path in mods.items()
    }
    # Negative control: the cycle finder sees a planted cycle.
    assert _cycle({"a": {"b"}, "b": {"a"}})
    assert _cycle(graph) is None, _cycle(graph)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return path + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (found := visit(node, [node])):
            return found
    return None


LONGEST_FUNCTION = 100  # lines, docstring and option declarations included


def _long_functions(source: str, name: str) -> list[str]:
    return [
        f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]


def test_no_function_in_the_package_is_longer_than_a_screenful_or_two():
    long = [f for p in layout.modules() for f in _long_functions(p.read_text(), p.name)]
    assert not long, f"split these by concern: {long}"
    # negative control: a function of 101 lines is caught
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    assert _long_functions(f"def f():\n{body}", "t.py") == ["t.py:f (101 lines)"]
