"""Compares two accuracy-benchmark JSONs row by row: the same estimates within their standard errors?

Each row of ``benchmarks/accuracy.py`` is one (mechanism, class, divergence, n, seed) estimate with its
standard error. For two runs (e.g. the previous release and the current code, the same keys) this prints
per row both estimates, their difference and the difference in units of the combined standard error
sqrt(SE_a^2 + SE_b^2), and summarises by (class, divergence) the mean of the estimates over seeds.
Rows whose estimate is not finite in either run are listed apart.

    python benchmarks/compare_accuracy.py OLD.json NEW.json [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def _rows(path: str) -> dict[tuple, dict]:
    data = json.loads(Path(path).read_text())
    data = data.get("payload", data)
    return {
        (r["mechanism"], r["class"], r["divergence"], r["n"], r["seed"]): r for r in data["rows"]
    }


def compare(old: str, new: str) -> list[dict]:
    a, b = _rows(old), _rows(new)
    out = []
    for key in sorted(set(a) & set(b), key=str):
        ra, rb = a[key], b[key]
        ea, eb, sa, sb = (
            float(x) for x in (ra["estimate"], rb["estimate"], ra["std_error"], rb["std_error"])
        )
        finite = all(math.isfinite(x) for x in (ea, eb, sa, sb))
        z = (eb - ea) / math.hypot(sa, sb) if finite and math.hypot(sa, sb) > 0 else float("nan")
        out.append(
            {
                "mechanism": key[0],
                "class": key[1],
                "divergence": key[2],
                "n": key[3],
                "seed": key[4],
                "reference": float(ra["reference"]),
                "old": ea,
                "old_se": sa,
                "new": eb,
                "new_se": sb,
                "diff_over_se": z,
            }
        )
    return out


def markdown(rows: list[dict]) -> str:
    lines = [
        "| mechanism | class | divergence | n | seed | reference | old (SE) | new (SE) | diff / SE |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['class']} | {r['divergence']} | {r['n']} | {r['seed']} | "
            f"{r['reference']:.4g} | {r['old']:.4g} ({r['old_se']:.2g}) | {r['new']:.4g} "
            f"({r['new_se']:.2g}) | {r['diff_over_se']:+.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--markdown", default=None, help="also write the table here")
    args = p.parse_args(argv)
    rows = compare(args.old, args.new)
    table = markdown(rows)
    print(table)
    finite = [r for r in rows if math.isfinite(r["diff_over_se"])]
    big = [r for r in finite if abs(r["diff_over_se"]) > 3]
    print(
        f"{len(rows)} rows; {len(finite)} with finite estimates in both runs; |diff| > 3 SE: "
        f"{len(big)}; max |diff| / SE: {max(abs(r['diff_over_se']) for r in finite):.2f}"
    )
    if args.markdown:
        Path(args.markdown).write_text(table)
    return rows


if __name__ == "__main__":
    main()
