"""docs/layout.md lists every module with a current line count; nothing under ``cbdp_jax/_src``
imports upward, and no import of the package, lazy or for type checking only, closes a circle."""

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


def _package_graph(root: Path, package: str = "cbdp_jax") -> dict[str, set[str]]:
    """Every module of ``package`` under ``root`` -> the modules it imports ANYWHERE in its text.

    Function-level (lazy) imports and ``if TYPE_CHECKING:`` imports count too: a cycle through them is
    still two modules that each need the other to be read. An imported name resolves to the module
    that defines it (``cbdp_jax._src.exact.grids._Grid`` -> ``cbdp_jax._src.exact.grids``).
    """
    mods = {}
    for p in (root / package).rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    return {
        name: {owner(m) for m in _imports(path, top_level_only=False)} - {name, ""}
        for name, path in mods.items()
    }


def test_the_package_import_graph_has_no_circle_counting_lazy_and_type_checking_imports(tmp_path):
    assert _cycle(_package_graph(ROOT)) is None, _cycle(_package_graph(ROOT))
    # Negative control: a circle closed only by a TYPE_CHECKING import is found.
    pkg = tmp_path / "cbdp_jax"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cbdp_jax.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cbdp_jax.a import A\nB = 1\n"
    )
    assert _cycle(_package_graph(tmp_path)) in (
        ["cbdp_jax.a", "cbdp_jax.b", "cbdp_jax.a"],
        ["cbdp_jax.b", "cbdp_jax.a", "cbdp_jax.b"],
    )


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
