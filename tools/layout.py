"""The layout block of docs/layout.md: every module of the package with its line count and one sentence.

    python tools/layout.py            # print the block
    python tools/layout.py --write    # rewrite the block in docs/layout.md
    python tools/layout.py --check    # exit 1 if docs/layout.md's block differs (the test allows 10% drift)

The sentence is the first sentence of the module docstring, so a module describes itself in one place.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 110


def modules() -> list[Path]:
    """Every module of the package: the public layer first, then its packages (_src, cli, experiments)."""
    files = sorted((ROOT / "cbdp_jax").rglob("*.py"))

    def order(p: Path):
        rel = p.relative_to(ROOT / "cbdp_jax")
        return (len(rel.parts) > 1, rel.parts[0] if len(rel.parts) > 1 else "", str(rel))

    return sorted(files, key=order)


def sentence(path: Path) -> str:
    """The first sentence of the module docstring (or a note that it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?\.)(\s|$)", first)
    text = (m.group(1) if m else first).rstrip(".:;")
    return text or "(no module docstring)"


def block() -> str:
    """The layout block (without the fences)."""
    paths = modules()
    names = [str(p.relative_to(ROOT / "cbdp_jax")) for p in paths]
    column = max(map(len, names))
    lines = []
    for path, rel in zip(paths, names, strict=True):
        n = len(path.read_text().splitlines())
        head = f"{rel:<{column}} {n:>5}  "
        wrapped = textwrap.wrap(sentence(path), WIDTH - len(head), break_long_words=False) or [""]
        lines.append(head + wrapped[0])
        lines.extend(" " * len(head) + more for more in wrapped[1:])
    return "\n".join(lines) + "\n"


# The parts of ``cbdp_jax/_src``, lowest first: a module imports its own part and the parts listed
# before it, never one listed after it (tests/test_layout.py). The first five are the shared core
# the three products stand on; the products come in the order in which each uses the one before.
PARTS = (
    (
        "infra",
        "shared infrastructure: validation, keys, progress, interrupts, sizes, files, "
        "the program store, runs over devices and their checkpoints",
    ),
    ("statistics", "the statistics behind every bound: tails, betting, Berry-Esseen, selection"),
    (
        "privacy",
        "what privacy loss is measured in: f-divergences, the accountant, neighbouring relations",
    ),
    ("mechanisms", "randomized mechanisms with exact densities, and neighbouring pairs"),
    ("exact", "exact numerical divergences: quadrature and a concave solve"),
    ("estimator", "product 1, the capacity-bounded divergence estimator: plan, fit, certify"),
    ("mechanism_auditor", "product 2, the mechanism auditor: claims, pairs, critics, certificates"),
    ("training_auditor", "product 3, the DP-training auditor: prepare, probe, run, score, certify"),
)
PART_NAMES = tuple(name for name, _ in PARTS)


def part_of(module: str) -> str | None:
    """The part of a dotted module under ``cbdp_jax._src`` (None outside the parts)."""
    bits = module.split(".")
    if bits[:2] != ["cbdp_jax", "_src"] or len(bits) < 3:
        return None
    return bits[2] if bits[2] in PART_NAMES else None


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Part -> the other parts its modules import, from a module graph (dotted names)."""
    out: dict[str, set[str]] = {name: set() for name in PART_NAMES}
    for module, imported in graph.items():
        me = part_of(module)
        if me is None:
            continue
        out[me] |= {p for m in imported if (p := part_of(m)) not in (None, me)}
    return out


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (module, imported module) pair in which a part imports a part above it."""
    rank = {name: i for i, name in enumerate(PART_NAMES)}
    return sorted(
        (module, m)
        for module, imported in graph.items()
        if (me := part_of(module)) is not None
        for m in imported
        if (p := part_of(m)) is not None and rank[p] > rank[me]
    )


def parts_block(graph: dict[str, set[str]]) -> str:
    """The parts, lowest first: how many modules, and the parts each imports (from the code)."""
    src = ROOT / "cbdp_jax" / "_src"
    imports = part_graph(graph)
    lines = []
    for name, says in PARTS:
        files = sorted((src / name).rglob("*.py"))
        below = ", ".join(p for p in PART_NAMES if p in imports[name]) or "nothing"
        lines.append(f"{name + '/':<20} {len(files):>3} modules  imports: {below}")
        lines.extend(
            textwrap.wrap(says, WIDTH, initial_indent=" " * 21, subsequent_indent=" " * 21)
        )
    return "\n".join(lines) + "\n"


def imports(path: Path, top_level_only: bool) -> set[str]:
    """The ``cbdp_jax`` names one file imports, each as a dotted path (``package.module.name``).

    ``from P import x`` gives ``P.x`` alone: where x is a submodule that is the module imported, and
    where it is a name :func:`package_graph` resolves it to the module that defines it.
    """
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cbdp_jax"):
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("cbdp_jax"))
    return out


def package_graph(
    root: Path = ROOT, package: str = "cbdp_jax", *, top_level_only: bool = False
) -> dict[str, set[str]]:
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
        name: {owner(m) for m in imports(path, top_level_only)} - {name, ""}
        for name, path in mods.items()
    }


LAYOUT = ROOT / "docs" / "layout.md"
MARKERS = re.compile(r"(<!-- layout:begin -->\n```text\n)(.*?)(```\n<!-- layout:end -->)", re.S)


def documented_block() -> str:
    """The block between the layout markers of docs/layout.md."""
    m = MARKERS.search(LAYOUT.read_text())
    return m.group(2) if m else ""


PARTS_MARKERS = re.compile(r"(<!-- parts:begin -->\n```text\n)(.*?)(```\n<!-- parts:end -->)", re.S)


def documented_parts() -> str:
    """The block between the parts markers of docs/layout.md."""
    m = PARTS_MARKERS.search(LAYOUT.read_text())
    return m.group(2) if m else ""


def write() -> None:
    """Rewrites the blocks between the markers of docs/layout.md with the current ones."""
    text = LAYOUT.read_text()
    text = MARKERS.sub(lambda m: m.group(1) + block() + m.group(3), text, count=1)
    parts = parts_block(package_graph())
    LAYOUT.write_text(PARTS_MARKERS.sub(lambda m: m.group(1) + parts + m.group(3), text, count=1))


def main() -> int:
    """Prints the block; ``--write`` rewrites docs/layout.md; ``--check`` exits 1 when it differs."""
    if "--check" in sys.argv:
        same = documented_parts() == parts_block(package_graph())
        return 0 if same and documented_block() == block() else 1
    if "--write" in sys.argv:
        write()
        return 0
    sys.stdout.write(block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
