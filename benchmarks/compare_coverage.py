"""Compares two coverage-benchmark JSONs case by case: coverage, certified fraction, mean bound / truth.

Each case of ``benchmarks/coverage.py`` is one (class, mechanism, divergence) with its coverage over many
runs. For two runs of the same cases (the same seed: the same samples, so a difference comes from the
code) this prints a Markdown table with both values of each per-case summary and the Wilson interval of
the new coverage, for the cases present in both files.

    python benchmarks/compare_coverage.py OLD.json NEW.json [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FIELDS = ("coverage", "certified_fraction", "mean_bound_over_truth")


def _cases(path: str) -> dict[tuple, dict]:
    data = json.loads(Path(path).read_text())
    data = data.get("payload", data)
    return {(s["class"], s["mechanism"], s["divergence"]): s for s in data["summary"]}


def table(old: str, new: str) -> str:
    a, b = _cases(old), _cases(new)
    lines = [
        "| class | mechanism | divergence | runs | coverage (Wilson 95%) | certified | bound / truth |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        lo, hi = y["coverage_interval_95"]
        cov = f"{x['coverage']:.3f} -> {y['coverage']:.3f} ([{lo:.3f}, {hi:.3f}])"
        cert = f"{x['certified_fraction']:.3f} -> {y['certified_fraction']:.3f}"
        ratio = f"{x['mean_bound_over_truth']:.3f} -> {y['mean_bound_over_truth']:.3f}"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {y['runs']} | {cov} | {cert} | {ratio} |")
    changed = sum(any(abs(a[k][f] - b[k][f]) > 1e-9 for f in FIELDS) for k in set(a) & set(b))
    below = sum(not b[k]["meets_target"] for k in set(a) & set(b))
    lines.append("")
    lines.append(
        f"{len(set(a) & set(b))} cases in both; {changed} changed; {below} below target in the new run"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--markdown", help="also write the table to this file")
    args = p.parse_args(argv)
    text = table(args.old, args.new)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return text


if __name__ == "__main__":
    main()
