"""Prints the README's layout block: every module of the package with its line count and one sentence.

    python tools/layout.py            # print the block
    python tools/layout.py --check    # exit 1 if README.md's block differs (the test allows 10% drift)

The sentence is the first sentence of the module docstring, so a module describes itself in one place.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100


def modules() -> list[Path]:
    """Every module of the package, public layer first, then _src, then experiments."""
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
    lines = []
    for path in modules():
        rel = str(path.relative_to(ROOT / "cbdp_jax"))
        n = len(path.read_text().splitlines())
        head = f"{rel:<30} {n:>5}  "
        text = sentence(path)
        room = WIDTH - len(head)
        while len(text) > room:
            cut = text.rfind(" ", 0, room)
            lines.append(head + text[:cut])
            head, text = " " * len(head), text[cut + 1 :]
        lines.append(head + text)
    return "\n".join(lines) + "\n"


def readme_block() -> str:
    """The block between the layout markers of README.md."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- layout:begin -->\n```text\n(.*?)```\n<!-- layout:end -->", text, re.S)
    return m.group(1) if m else ""


def main() -> int:
    """Prints the block, or with ``--check`` exits 1 when README.md's block differs."""
    if "--check" in sys.argv:
        return 0 if readme_block() == block() else 1
    sys.stdout.write(block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
