"""``cbdp reproduce``: run registered experiments, resumably.

Each experiment is one unit of a :class:`~cbdp_jax._src.checkpoint.UnitStore` kept in
``OUT/.units/reproduce-{quick,full}``: a run killed partway resumes with the experiments not yet done,
and finished experiments are not run twice (``restart=True`` forgets them).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from cbdp_jax._src.checkpoint import UnitStore
from cbdp_jax._src.io import to_json
from cbdp_jax._src.validation import check_choice
from cbdp_jax.experiments import EXPERIMENTS, PAPER_FIGURES, available, load
from cbdp_jax.experiments._common import print_checks


def resolve(name: str) -> list[str]:
    """Experiment names for ``name``: one experiment, ``'paper'`` (figures + Table 1) or ``'all'``."""
    check_choice("experiment", name, [*EXPERIMENTS, "paper", "all"])
    present = available()
    if name == "all":
        return present
    if name == "paper":
        return [n for n in PAPER_FIGURES if n in present]
    return [name]


def reproduce(name: str, out: str | Path, *, quick: bool = False, restart: bool = False) -> bool:
    """Runs the experiments named by ``name`` into ``out``; returns False if one raised."""
    names = resolve(name)
    out = Path(out)
    units = out / ".units" / f"reproduce-{'quick' if quick else 'full'}"
    if restart and units.exists():
        shutil.rmtree(units)
    store = UnitStore(units)
    ok = True

    def compute(exp: str):
        t0 = time.perf_counter()
        summary = load(exp).run(out, quick=quick)
        summary = json.loads(to_json(summary))
        summary["seconds"] = time.perf_counter() - t0
        return summary

    for exp in names:
        cached = store.done(exp)
        print(f"== {exp}: {EXPERIMENTS[exp][1]}" + (" (done earlier, skipped)" if cached else ""))
        try:
            summary = store.run([exp], compute)[0]
        except Exception as exc:  # keep going: one broken experiment must not lose the others
            ok = False
            print(f"[{exp}] ERROR: {type(exc).__name__}: {exc}")
            continue
        print_checks(exp, summary.get("checks", []))
        print(f"[{exp}] {summary.get('seconds', 0.0):.1f} s -> {out}")
    return ok
