"""Shared plumbing for experiments: output folder, atomic outputs, claim checks, stored estimates."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cbdp_jax._src.infra.io import (
    atomic_savefig,
    atomic_write_csv,
    atomic_write_json,
    environment_info,
)


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (experiments write files, never windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def estimator_config(quick: bool, *, full_steps: int, family_size: int = 1):
    """The estimator budget shared by the theorem experiments.

    Quick: 400 Adam steps, 2 adversaries, minibatch 1024 (a minute or so per experiment on 2 CPU cores).
    Full: ``full_steps`` steps, 4 adversaries, minibatch 4096. Validation every 100 steps in both.
    ``family_size`` is the number of simultaneous bounds an experiment compares (Bonferroni: each
    estimate's lower bound is then taken at level 1 - 0.05 / family_size by the estimator).
    ``guarantee='class'``: the experiments compare each bound with values of the class they name
    (exact restricted values, the theorems' bounds on D^H), so every bound must be on that class.
    """
    from cbdp_jax.estimator import EstimatorConfig

    if quick:
        return EstimatorConfig(
            steps=400, eval_every=100, ensemble=2, batch_size=1024, family_size=family_size,
            guarantee="class",
        )  # fmt: skip
    return EstimatorConfig(
        steps=full_steps, eval_every=100, ensemble=4, batch_size=4096, family_size=family_size,
        guarantee="class",
    )  # fmt: skip


def config_from_dict(d: dict[str, Any]):
    """The :class:`~cbdp_jax.estimator.EstimatorConfig` a unit recorded with :func:`estimator_dict`."""
    from cbdp_jax.estimator import EstimatorConfig

    return EstimatorConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def estimator_dict(config: Any) -> dict[str, Any]:
    """Every setting of an :class:`~cbdp_jax.estimator.EstimatorConfig` (a unit's fingerprint input)."""
    out = {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "progress"
    }
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def budget_summary(config: Any) -> dict[str, Any]:
    """The part of an :class:`~cbdp_jax.estimator.EstimatorConfig` a summary JSON records."""
    return {"steps": config.steps, "ensemble": config.ensemble, "batch": config.batch_size}


# What a failed check means. SOFTWARE: this library (or its statistics) is wrong -- a failure is a bug,
# and `cbdp reproduce` exits non-zero. PAPER: a claim printed in the paper, checked against exact values;
# a failure is a finding ("the paper's claim does not hold here"), reported with its numbers, not a bug.
SOFTWARE = "software"
PAPER = "paper"
CHECK_KINDS = (SOFTWARE, PAPER)


def check(claim: str, holds: bool, detail: str = "", *, kind: str = SOFTWARE) -> dict[str, Any]:
    """One claim an experiment tests, with whether it held, the numbers behind it and its kind.

    Args:
      claim: The claim, in words.
      holds: Whether it held.
      detail: The numbers behind the verdict.
      kind: ``'software'`` (a failure is a bug) or ``'paper'`` (a claim printed in the paper: a
        failure is a finding about the paper, not a bug).

    """
    if kind not in CHECK_KINDS:
        raise ValueError(f"kind={kind!r} is invalid: must be one of {CHECK_KINDS}")
    return {"claim": claim, "holds": bool(holds), "detail": detail, "kind": kind}


def paper_claim(claim: str, holds: bool, detail: str = "") -> dict[str, Any]:
    """A claim printed in the paper, checked here: if it does not hold, that is a finding, not a bug."""
    return check(claim, holds, detail, kind=PAPER)


def is_finding(c: Mapping[str, Any]) -> bool:
    """A paper claim that does not hold here (reported with its numbers; not a software failure)."""
    return c.get("kind", SOFTWARE) == PAPER and not c["holds"]


def is_failure(c: Mapping[str, Any]) -> bool:
    """A software check that failed (a bug, or a statistical check outside its stated error rate)."""
    return c.get("kind", SOFTWARE) == SOFTWARE and not c["holds"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoredEstimate:
    """The part of an :class:`~cbdp_jax.estimator.EstimateResult` an experiment keeps in a unit file.

    Attribute names match the result's, so the code that reads a result reads this too.
    """

    estimate: float
    lower_bound: float
    std_error: float
    bound_reliable: bool
    divergence: str
    adversary: str
    warnings: tuple[str, ...]
    seconds: float
    guarantee: str = ""

    @classmethod
    def from_result(cls, res: Any) -> StoredEstimate:
        """Keeps the fields of an estimate result (or of another StoredEstimate)."""
        return cls(
            estimate=float(res.estimate),
            lower_bound=float(res.lower_bound),
            std_error=float(res.std_error),
            bound_reliable=bool(getattr(res, "bound_reliable", True)),
            divergence=str(res.divergence),
            adversary=str(res.adversary),
            warnings=tuple(res.warnings),
            seconds=float(res.seconds),
            guarantee=str(getattr(res, "guarantee", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (infinite values stay floats; the unit store writes them as strings)."""
        out = dataclasses.asdict(self)
        out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StoredEstimate:
        """Reads back :meth:`to_dict` after a JSON round trip ('inf' strings become floats)."""
        return cls(
            estimate=_number(d["estimate"]),
            lower_bound=_number(d["lower_bound"]),
            std_error=_number(d["std_error"]),
            bound_reliable=bool(d["bound_reliable"]),
            divergence=str(d["divergence"]),
            adversary=str(d["adversary"]),
            warnings=tuple(d["warnings"]),
            seconds=_number(d["seconds"]),
            guarantee=str(d.get("guarantee", "")),
        )


def _number(x: Any) -> float:
    return math.nan if x is None else float(x)


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


def check_line(name: str, c: Mapping[str, Any]) -> str:
    """One check as a line: ``HOLDS`` / ``FAILS`` for software checks; paper claims as findings."""
    if c.get("kind", SOFTWARE) == PAPER:
        mark = "paper's claim holds" if c["holds"] else "FINDING, paper's claim does not hold here"
    else:
        mark = "HOLDS" if c["holds"] else "FAILS"
    return f"[{name}] {mark}: {c['claim']}" + (f" -- {c['detail']}" if c.get("detail") else "")


def print_checks(name: str, checks: Sequence[Mapping[str, Any]]) -> None:
    """Prints each claim with its verdict and detail (see :func:`check_line`)."""
    for c in checks:
        print(check_line(name, c))


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
