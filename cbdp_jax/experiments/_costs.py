"""Per-unit cost table: expected seconds per unit of work, measured on the reference machine.

``cbdp reproduce`` adds these up before it starts (the run-time estimate it prints) and scales the
remainder by the ratio of measured to tabled time of the units it has finished (the ETA).

Reference machine: a 2-core x86 CPU shared with other jobs (the project's development machine), JAX CPU
backend, float32. Full-mode values are the median per-unit compute times of one complete
``cbdp reproduce all --out DIR`` run; quick-mode values of ``cbdp reproduce all --quick --out DIR``.
Regenerate them from finished runs with::

    python -m cbdp_jax.experiments._costs DIR [--quick]

which prints the median stored compute time per (experiment, kind) found in ``DIR/.units``.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

# experiment -> mode -> unit kind -> seconds. Kind 'all': an experiment that is one unit; 'finish':
# checks, figure and outputs after the units.
UNIT_SECONDS: dict[str, dict[str, dict[str, float]]] = {
    "fig1a": {"quick": {"all": 5.0}, "full": {"all": 20.0}},
    "fig1b": {"quick": {"all": 2.0}, "full": {"all": 10.0}},
    "fig2a": {"quick": {"all": 1.5}, "full": {"all": 8.0}},
    "fig2b": {"quick": {"all": 2.0}, "full": {"all": 10.0}},
    "table1": {"quick": {"all": 5.0}, "full": {"all": 8.0}},
    "coverage": {"quick": {"run": 1.1, "finish": 1.0}, "full": {"run": 1.5, "finish": 1.0}},
    "post_processing": {
        "quick": {"linear": 7.0, "finish": 1.0},
        "full": {"linear": 60.0, "finish": 1.0},
    },
    "convexity": {
        "quick": {"linear": 3.0, "network": 6.0, "renyi_network": 8.0, "finish": 2.0},
        "full": {"linear": 35.0, "network": 110.0, "renyi_network": 120.0, "finish": 3.0},
    },
    "composition": {
        "quick": {"linear": 2.0, "poly": 2.5, "finish": 1.0},
        "full": {"linear": 30.0, "poly": 35.0, "finish": 2.0},
    },
    "pinsker_generalization": {
        "quick": {"setting": 3.0, "finish": 3.0},
        "full": {"setting": 90.0, "finish": 60.0},
    },
    "capacity_curve": {
        "quick": {"linear": 4.0, "poly": 4.0, "relu2": 5.0, "finish": 2.0},
        "full": {
            "linear": 12.0,
            "poly": 14.0,
            "relu2": 25.0,
            "relu2_wide": 60.0,
            "mlp": 90.0,
            "rff": 30.0,
            "finish": 10.0,
        },
    },
    "on_average_kl": {
        "quick": {"gamma": 6.0, "library": 4.0, "finish": 2.0},
        "full": {"gamma": 45.0, "library": 40.0, "finish": 3.0},
    },
    "calibration": {"full": {"all": 15.0}},
    # Full: 36 estimates took 1,181 s as one unit (2026-11-24, 2 loaded cores) before the per-estimate
    # split; the 20 MLP and 16 poly_2 units are tabled to add up to it.
    "adaptive_composition": {
        "quick": {"mlp": 3.0, "poly": 1.5, "finish": 2.0},
        "full": {"mlp": 45.0, "poly": 15.0, "finish": 3.0},
    },
}

DEFAULT_SECONDS = 30.0


def unit_seconds(experiment: str, quick: bool, kind: str) -> float:
    """Expected seconds of one unit of ``kind`` in ``experiment`` (a default where not tabled)."""
    mode = "quick" if quick else "full"
    table = UNIT_SECONDS.get(experiment, {}).get(mode, {})
    if kind in table:
        return table[kind]
    return 1.0 if kind == "finish" else DEFAULT_SECONDS


def measured(out_dir: str | Path, quick: bool) -> dict[str, dict[str, float]]:
    """Median stored compute seconds per (experiment, kind) of a finished run under ``out_dir``."""
    from cbdp_jax.checkpoint import UnitStore
    from cbdp_jax.experiments import available, load
    from cbdp_jax.experiments._units import has_units, unit_store

    out: dict[str, dict[str, float]] = {}
    top = UnitStore(
        Path(out_dir) / ".units" / f"reproduce-{'quick' if quick else 'full'}", clean=False
    )
    for name in available():
        module = load(name)
        if not has_units(module):
            seconds = top.stored_seconds(name)  # an experiment that is one unit: its whole run
            if seconds is not None:
                out[name] = {"all": round(seconds, 1)}
            continue
        store = unit_store(out_dir, name, quick, clean=False)
        times: dict[str, list[float]] = defaultdict(list)
        for unit in module.plan(quick):
            seconds = store.stored_seconds(unit.id)
            if seconds is not None:
                times[unit.kind].append(seconds)
        if times:
            out[name] = {k: round(statistics.median(v), 1) for k, v in sorted(times.items())}
    return out


if __name__ == "__main__":  # pragma: no cover - a maintenance script
    folder, quick_mode = sys.argv[1], "--quick" in sys.argv[2:]
    for name, kinds in measured(folder, quick_mode).items():
        print(name, kinds)
