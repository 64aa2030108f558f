"""Shared plumbing for experiments: output folder, atomic outputs, claim checks."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbdp_jax._src.io import atomic_savefig, atomic_write_csv, atomic_write_json, environment_info


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (experiments write files, never windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def estimator_config(quick: bool, *, full_steps: int):
    """The estimator budget shared by the theorem experiments.

    Quick: 400 Adam steps, 2 adversaries, minibatch 1024 (a minute or so per experiment on 2 CPU cores).
    Full: ``full_steps`` steps, 4 adversaries, minibatch 4096. Validation every 100 steps in both.
    """
    from cbdp_jax.estimator import EstimatorConfig

    if quick:
        return EstimatorConfig(steps=400, eval_every=100, ensemble=2, batch_size=1024)
    return EstimatorConfig(steps=full_steps, eval_every=100, ensemble=4, batch_size=4096)


def budget_summary(config: Any) -> dict[str, Any]:
    """The part of an :class:`~cbdp_jax.estimator.EstimatorConfig` a summary JSON records."""
    return {"steps": config.steps, "ensemble": config.ensemble, "batch": config.batch_size}


def check(claim: str, holds: bool, detail: str = "") -> dict[str, Any]:
    """One claim an experiment tests, with whether it held and the numbers behind it."""
    return {"claim": claim, "holds": bool(holds), "detail": detail}


def result_row(res: Any, **extra: Any) -> dict[str, Any]:
    """One table row for an :class:`~cbdp_jax.estimator.EstimateResult`, with extra columns first."""
    return {
        **extra,
        "estimate": res.estimate,
        "lower_bound": res.lower_bound,
        "std_error": res.std_error,
        "bound_reliable": res.bound_reliable,
        "divergence": res.divergence,
        "adversary": res.adversary,
        "warnings": " | ".join(res.warnings),
    }


def save_outputs(
    out_dir: str | Path,
    name: str,
    *,
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    figure: Any | None = None,
) -> dict[str, Any]:
    """Writes ``NAME.csv``, ``NAME.json`` (summary + rows + environment) and ``NAME.png`` atomically.

    Returns the summary with the written paths added under ``files``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": str(atomic_write_csv(out / f"{name}.csv", rows))}
    if figure is not None:
        import matplotlib.pyplot as plt

        files["png"] = str(atomic_savefig(figure, out / f"{name}.png", bbox_inches="tight"))
        plt.close(figure)
    full = dict(summary)
    full["files"] = files
    payload = {"experiment": name, **full, "rows": list(rows), "environment": environment_info()}
    files["json"] = str(atomic_write_json(out / f"{name}.json", payload))
    return full


def print_checks(name: str, checks: Sequence[Mapping[str, Any]]) -> None:
    """Prints each claim with HOLDS / FAILS and its detail."""
    for c in checks:
        mark = "HOLDS" if c["holds"] else "FAILS"
        print(f"[{name}] {mark}: {c['claim']}" + (f" -- {c['detail']}" if c.get("detail") else ""))


class Timer:
    """Context manager measuring wall time in seconds (``.seconds``)."""

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0


def script_main(name: str) -> None:
    """Entry point shared by the scripts in the repository's ``experiments/`` folder.

    Usage: ``python experiments/NAME.py [--quick] [--out DIR]``.
    """
    import argparse

    from cbdp_jax.experiments import EXPERIMENTS, load

    parser = argparse.ArgumentParser(description=EXPERIMENTS[name][1])
    parser.add_argument("--out", default=f"results/{name}", help="output folder")
    parser.add_argument("--quick", action="store_true", help="small, fast version")
    args = parser.parse_args()
    summary = load(name).run(Path(args.out), quick=args.quick)
    print_checks(name, summary.get("checks", []))
