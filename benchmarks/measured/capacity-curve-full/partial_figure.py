"""The capacity-curve figure from the units of an unfinished full run, for the mechanisms it completed.

    python benchmarks/measured/capacity-curve-full/partial_figure.py UNITS_DIR OUT_DIR

UNITS_DIR holds the unit files (``OUT/.units/capacity_curve-full`` of ``cbdp reproduce capacity_curve``).
Only mechanisms with all 48 units (3 divergences x 16 classes) are drawn; the per-unit bounds are those
of the full run (family-wise over all 180 units). The finished run's own figure replaces this one.
"""

from __future__ import annotations

import sys

from cbdp_jax._src.checkpoint import UnitStore
from cbdp_jax.experiments import capacity_curve as cc


def main(units_dir: str, out_dir: str) -> None:
    store = UnitStore(units_dir, clean=False)
    units = cc.plan(quick=False)
    done = {u.id: store.load(u.id) for u in units if store.done(u.id, u.config)}
    complete = [
        m
        for m in cc._mechanisms(False)
        if all(u.id in done for u in units if (u.config["family"], u.config["param"]) == m)
    ]
    print(f"{len(done)} of {len(units)} units done; complete mechanisms: {complete}")
    cc._mechanisms = lambda quick: complete  # draw only the completed mechanisms
    wanted = {cc._mech_label(*m) for m in complete}
    results = {k: v for k, v in done.items() if v["mechanism"] in wanted}
    summary = cc.finish(out_dir, results, quick=False)
    checks = summary["checks"]
    print(f"checks: {sum(c['holds'] for c in checks)} of {len(checks)} hold")
    for c in checks:
        if not c["holds"]:
            print("FAILS:", c["claim"], c.get("detail", ""))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
