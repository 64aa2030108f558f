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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100


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


LAYOUT = ROOT / "docs" / "layout.md"
MARKERS = re.compile(r"(<!-- layout:begin -->\n```text\n)(.*?)(```\n<!-- layout:end -->)", re.S)


def documented_block() -> str:
    """The block between the layout markers of docs/layout.md."""
    m = MARKERS.search(LAYOUT.read_text())
    return m.group(2) if m else ""


def write() -> None:
    """Rewrites the block between the markers of docs/layout.md with the current one."""
    text = LAYOUT.read_text()
    LAYOUT.write_text(MARKERS.sub(lambda m: m.group(1) + block() + m.group(3), text, count=1))


def main() -> int:
    """Prints the block; ``--write`` rewrites docs/layout.md; ``--check`` exits 1 when it differs."""
    if "--check" in sys.argv:
        return 0 if documented_block() == block() else 1
    if "--write" in sys.argv:
        write()
        return 0
    sys.stdout.write(block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
