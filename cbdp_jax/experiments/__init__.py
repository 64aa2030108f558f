"""Runnable experiments reproducing the papers' figures, tables and theorems.

Each experiment is a module here exposing ``run(out_dir, *, quick=False) -> dict``; it writes a PNG plot
and a CSV/JSON table into ``out_dir`` (atomically) and returns a summary with a ``checks`` list, one entry
per claim it tests: ``{"claim": str, "holds": bool, "detail": str, "kind": "software" | "paper"}`` (a
failed software check is a bug; a failed paper check is a finding about a claim printed in the paper).
The long experiments are split into units of work (``plan`` / ``compute`` / ``finish``, see
:mod:`cbdp_jax.experiments._units`), checkpointed one by one. The scripts under the repository's
``experiments/`` folder and ``cbdp reproduce NAME`` (:mod:`cbdp_jax.experiments._reproduce`) both call
these functions.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> (module, one-line description). Order is the order `cbdp reproduce all` runs them in.
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "fig1a": (
        "fig1a",
        "Laplace eps=1: exact (lin, Renyi), its upper bounds and Renyi-DP over alpha",
    ),
    "fig1b": ("fig1b", "Laplace eps=1: exact (poly_k, Renyi), k = 1, 2, 3, beside Renyi-DP"),
    "fig2a": ("fig2a", "Gaussian sigma=1: exact (lin, Renyi), its upper bounds and Renyi-DP"),
    "fig2b": ("fig2b", "Gaussian sigma=1: exact (poly_k, Renyi), k = 1, 2, 3, beside Renyi-DP"),
    "table1": ("table1", "Table 1: every row, closed form beside the exact numerical value"),
    "coverage": ("coverage", "Coverage of the 95% lower bound over repeated estimator runs"),
    "post_processing": ("post_processing", "Thm 1 and Thm 5: matrix mechanism as post-processing"),
    "convexity": ("convexity", "Thm 2: restricted KL of a coin-flip mixture is convex"),
    "composition": ("composition", "Thms 3 and 4: parallel and sequential composition"),
    "pinsker_generalization": (
        "pinsker_generalization",
        "Thms 6 and 7: IPM vs 8 sqrt(KL^H) and an adaptive-query generalization gap",
    ),
    "capacity_curve": ("capacity_curve", "Privacy loss growing with adversary capacity"),
    "on_average_kl": ("on_average_kl", "On-Average KL privacy = gamma x generalization gap"),
    "calibration": (
        "calibration",
        "Noise needed per adversary class vs the unrestricted requirement; DP-SGD table",
    ),
    "adaptive_composition": (
        "adaptive_composition",
        "Do adaptive 2- and 3-step releases exceed the sum of per-step values (network adversaries)?",
    ),
}

PAPER_FIGURES = ("fig1a", "fig1b", "fig2a", "fig2b", "table1")


def load(name: str) -> ModuleType:
    """Imports the experiment module registered under ``name``."""
    from cbdp_jax._src.infra.validation import check_choice

    check_choice("experiment", name, list(EXPERIMENTS))
    return importlib.import_module(f"cbdp_jax.experiments.{EXPERIMENTS[name][0]}")


def available() -> list[str]:
    """The registered experiments whose module exists in this installation."""
    names = []
    for name, (module, _) in EXPERIMENTS.items():
        if importlib.util.find_spec(f"cbdp_jax.experiments.{module}") is not None:
            names.append(name)
    return names
