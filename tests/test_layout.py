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
            m
            for m in layout.imports(path, top_level_only=False)
            if not m.startswith("cbdp_jax._src")
        )
        for name, path in _src_modules().items()
    }
    assert not {k: v for k, v in upward.items() if v}


def test_src_modules_have_no_import_cycles():
    graph = {
        name: {m for m in imported if m.startswith("cbdp_jax._src")}
        for name, imported in layout.package_graph(top_level_only=True).items()
        if name.startswith("cbdp_jax._src")
    }
    # Negative control: the cycle finder sees a planted cycle.
    assert _cycle({"a": {"b"}, "b": {"a"}})
    assert _cycle(graph) is None, _cycle(graph)


def test_the_package_import_graph_has_no_circle_counting_lazy_and_type_checking_imports(tmp_path):
    assert _cycle(layout.package_graph(ROOT)) is None, _cycle(layout.package_graph(ROOT))
    # Negative control: a circle closed only by a TYPE_CHECKING import is found.
    pkg = tmp_path / "cbdp_jax"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cbdp_jax.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cbdp_jax.a import A\nB = 1\n"
    )
    assert _cycle(layout.package_graph(tmp_path)) in (
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


def test_each_part_imports_only_the_parts_below_it():
    graph = layout.package_graph(ROOT)
    assert not layout.upward(graph), f"a part imports a part above it: {layout.upward(graph)}"
    # Every module of _src lies in a part (a new top-level module must choose one).
    loose = [m for m in graph if m.startswith("cbdp_jax._src.") and layout.part_of(m) is None]
    assert not loose, f"put these in a part folder (tools/layout.py PARTS): {loose}"
    # docs/layout.md draws the parts and their imports as the code has them today.
    assert layout.documented_parts() == layout.parts_block(graph), (
        "run `python tools/layout.py --write`"
    )
    # Negative controls: the estimator importing the training auditor is caught, and so is the
    # shared core (statistics) importing a product; the auditor importing the estimator is allowed.
    est, aud = "cbdp_jax._src.estimator.fit", "cbdp_jax._src.mechanism_auditor.audit"
    planted = {est: {"cbdp_jax._src.training_auditor.runs"}, aud: {est}}
    assert layout.upward(planted) == [(est, "cbdp_jax._src.training_auditor.runs")]
    core = {"cbdp_jax._src.statistics.tails": {aud}}
    assert layout.upward(core) == [("cbdp_jax._src.statistics.tails", aud)]


LONGEST_MODULE = 600  # lines: a module does one job; past this it is two


def _long_modules(paths) -> list[str]:
    return [
        f"{p} ({n} lines)" for p in paths if (n := len(p.read_text().splitlines())) > LONGEST_MODULE
    ]


def test_no_module_in_the_package_is_longer_than_its_cap(tmp_path):
    long = _long_modules(layout.modules())
    assert not long, f"split these by job: {long}"
    # negative control: a module of 601 lines is caught
    big = tmp_path / "big.py"
    big.write_text("x = 0\n" * (LONGEST_MODULE + 1))
    assert _long_modules([big]) == [f"{big} (601 lines)"]
