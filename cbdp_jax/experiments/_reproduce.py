"""``cbdp reproduce``: run registered experiments, resumably, with a time estimate and an ETA.

Two levels of checkpoints, both :class:`~cbdp_jax.checkpoint.UnitStore` folders under ``OUT/.units``:

* each long experiment is split into units of work (one estimate, one lambda, one alpha, ...) kept in
  ``OUT/.units/NAME-{quick,full}`` (:mod:`cbdp_jax.experiments._units`): a run killed inside an experiment
  resumes with the units not yet done;
* each finished experiment's summary is a unit of ``OUT/.units/reproduce-{quick,full}``, fingerprinted
  with the fingerprints of its units: a finished experiment is not finished twice.

Before it starts, the run prints the number of units and an estimate of its run time from the per-unit
cost table (:mod:`cbdp_jax.experiments._costs`); after each unit, a line with the elapsed time and an ETA
(the table's remainder scaled by the measured/tabled ratio so far). At the end it prints a summary that
keeps two kinds of check apart: software checks (a failure is a bug; the exit status is 1) and the paper's
printed claims (a claim that does not hold is a finding, listed with its numbers; exit status 0).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from cbdp_jax._src.infra.checkpoint import REUSED, STALE, UnitReport, UnitStore, fingerprint
from cbdp_jax._src.infra.io import to_json
from cbdp_jax._src.infra.progress import Progress
from cbdp_jax._src.infra.validation import check_choice, check_int_at_least
from cbdp_jax.experiments import EXPERIMENTS, PAPER_FIGURES, available, load
from cbdp_jax.experiments._common import check_line, is_failure, is_finding
from cbdp_jax.experiments._costs import unit_seconds
from cbdp_jax.experiments._units import Unit, UnitEvent, has_units, run_experiment, unit_store


def resolve(name: str) -> list[str]:
    """Experiment names for ``name``: one experiment, ``'paper'`` (figures + Table 1) or ``'all'``."""
    check_choice("experiment", name, [*EXPERIMENTS, "paper", "all"])
    present = available()
    if name == "all":
        return present
    if name == "paper":
        return [n for n in PAPER_FIGURES if n in present]
    return [name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a ``cbdp reproduce`` run found.

    Attributes:
      failures: ``(experiment, check)`` for every software check that failed (bugs).
      findings: ``(experiment, check)`` for every paper claim that does not hold here (not bugs).
      errors: ``(experiment, message)`` for every experiment that raised.
      passed: Software checks that held.
      paper_holds: Paper claims that held.
      computed: Units computed in this run (stale ones included).
      reused: Units found on disk from earlier runs.
      stale: Units recomputed because their stored fingerprint differed.
      estimated_seconds: The estimate printed before the run.
      seconds: Wall time of this run.

    """

    failures: list[tuple[str, dict[str, Any]]]
    findings: list[tuple[str, dict[str, Any]]]
    errors: list[tuple[str, str]]
    passed: int
    paper_holds: int
    computed: int
    reused: int
    stale: int
    estimated_seconds: float
    seconds: float

    @property
    def ok(self) -> bool:
        """No software failure and no experiment error (findings about the paper do not count)."""
        return not self.failures and not self.errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Plan:
    """One experiment of a run: its units, the summary's checkpoint config, what is left to do."""

    name: str
    module: ModuleType
    units: list[Unit]  # a single 'all' unit for experiments that are not split
    split: bool
    config: dict[str, Any]
    done: bool
    todo: list[Unit]
    estimate: float  # seconds left, from the cost table


def _plan(name: str, quick: bool, out: Path, top: UnitStore) -> _Plan:
    module = load(name)
    mode = "quick" if quick else "full"
    split = has_units(module)
    if split:
        units = module.plan(quick)
        config = {
            "experiment": name,
            "mode": mode,
            "units": {u.id: fingerprint(u.id, u.config) for u in units},
        }
    else:
        units = [Unit(id=name, config={"experiment": name, "mode": mode}, kind="all")]
        config = {"experiment": name, "mode": mode}
    done = top.done(name, config)
    if done:
        todo = []
    elif split:
        store = unit_store(out, name, quick, clean=False)
        todo = [u for u in units if not store.done(u.id, u.config)]
    else:
        todo = units
    estimate = sum(unit_seconds(name, quick, u.kind) for u in todo)
    if not done and split:
        estimate += unit_seconds(name, quick, "finish")
    return _Plan(
        name=name,
        module=module,
        units=units,
        split=split,
        config=config,
        done=done,
        todo=todo,
        estimate=estimate,
    )


def duration(seconds: float) -> str:
    """A duration for people: ``'42 s'``, ``'3 min 05 s'``, ``'1 h 02 min'``."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class _Progress:
    """Prints one line per unit with the elapsed time and an ETA; counts units by status."""

    def __init__(self, estimate: float, quick: bool, stream: TextIO):
        self.t0 = time.perf_counter()
        self.left = estimate  # tabled seconds of the units not yet done
        self.tabled_done = 0.0  # tabled seconds of the units done in this run
        self.quick, self.stream = quick, stream
        self.counts = {"computed": 0, "reused": 0, "stale": 0}
        self._reused_pending: dict[str, int] = {}
        self.bar: Progress | None = None  # the live line on a terminal (units done, the ETA)

    def say(self, line: str) -> None:
        """Prints ``line`` wrapped at the terminal's width (at most 80 columns when piped)."""
        width = shutil.get_terminal_size((80, 24)).columns
        text = "\n".join(
            textwrap.wrap(line, max(width, 40), subsequent_indent="    ", break_on_hyphens=False)
        )
        if self.bar is not None:
            self.bar.say(text, stream=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def eta(self) -> float:
        # The table's remainder, scaled by how long this run took per tabled second so far.
        ratio = self.elapsed() / self.tabled_done if self.tabled_done > 0 else 1.0
        return max(self.left, 0.0) * ratio

    def flush_reused(self, experiment: str, total: int) -> None:
        n = self._reused_pending.pop(experiment, 0)
        if n:
            self.say(f"[{experiment}] {n} of {total} units done earlier (reused, not recomputed)")

    def event(self, event: UnitEvent) -> None:
        report = event.report
        if report.status == REUSED:
            self.counts["reused"] += 1
            self._reused_pending[event.experiment] = (
                self._reused_pending.get(event.experiment, 0) + 1
            )
            return
        self.flush_reused(event.experiment, event.total)
        self.unit_done(event.experiment, event.unit, report, f"{event.index}/{event.total}")

    def unit_done(self, experiment: str, unit: Unit, report: UnitReport, position: str) -> None:
        tabled = unit_seconds(experiment, self.quick, unit.kind)
        self.left -= tabled
        self.tabled_done += tabled
        self.counts["computed"] += 1
        if self.bar is not None:
            self.bar.advance()
        what = "computed"
        if report.status == STALE:
            self.counts["stale"] += 1
            what = f"STALE ({report.reason}), recomputed"
        took = duration(report.seconds or 0.0)
        self.say(
            f"[{experiment} {position}] {what} {unit.id} in {took} (table {duration(tabled)}) | "
            f"elapsed {duration(self.elapsed())}, about {duration(self.eta())} left"
        )

    def finished_experiment(self, plan: _Plan) -> None:
        """Books an experiment's finishing step (checks, figure) against the estimate."""
        if plan.split:
            tabled = unit_seconds(plan.name, self.quick, "finish")
            self.left -= tabled
            self.tabled_done += tabled


def _run_one(plan: _Plan, out: Path, quick: bool, processes: int, progress: _Progress) -> dict:
    """Runs (or resumes) one experiment and returns its summary as JSON would store it."""
    t0 = time.perf_counter()
    if plan.split:
        summary = run_experiment(
            plan.module, out, quick=quick, processes=processes, on_event=progress.event
        )
        progress.flush_reused(plan.name, len(plan.units))
    else:
        summary = plan.module.run(out, quick=quick)
        report = UnitReport(unit_id=plan.name, status="computed", seconds=time.perf_counter() - t0)
        progress.unit_done(plan.name, plan.units[0], report, "1/1")
    progress.finished_experiment(plan)
    summary = json.loads(to_json(summary))
    summary["seconds"] = summary.get("seconds", time.perf_counter() - t0)
    return summary


def _forget(out: Path, names: list[str], quick: bool) -> None:
    """``restart``: removes the stored summaries and units of the named experiments."""
    mode = "quick" if quick else "full"
    top = out / ".units" / f"reproduce-{mode}"
    if top.exists():
        store = UnitStore(top)
        for name in names:
            store.path(name).unlink(missing_ok=True)
    for name in names:
        shutil.rmtree(out / ".units" / f"{name}-{mode}", ignore_errors=True)


def reproduce(
    name: str,
    out: str | Path,
    *,
    quick: bool = False,
    restart: bool = False,
    processes: int = 1,
    stream: TextIO | None = None,
) -> Outcome:
    """Runs the experiments named by ``name`` into ``out``, resuming whatever an earlier run finished.

    Args:
      name: An experiment, ``'paper'`` or ``'all'``.
      out: Output folder (figures, CSV, JSON; checkpoints under ``out/.units``).
      quick: The experiments' quick modes.
      restart: Forget the named experiments' stored units and summaries first.
      processes: Worker processes for the units of a split experiment (1: this process only).
      stream: Where progress goes (default: stdout).

    Returns:
      The :class:`Outcome`; ``outcome.ok`` is False only for software failures and errors.

    """
    stream = sys.stdout if stream is None else stream
    processes = check_int_at_least("processes", processes, 1)
    names = resolve(name)
    out = Path(out)
    if restart:
        _forget(out, names, quick)
    mode = "quick" if quick else "full"
    top = UnitStore(out / ".units" / f"reproduce-{mode}")
    plans = [_plan(n, quick, out, top) for n in names]
    estimate = sum(p.estimate for p in plans)
    todo = sum(len(p.todo) for p in plans)
    progress = _Progress(estimate, quick, stream)
    # the live line's ETA: the cost table's remainder, rescaled by this run's speed
    with Progress(f"cbdp reproduce {name}", total=todo, unit="units", eta=progress.eta) as bar:
        progress.bar = bar
        _announce(name, mode, out, plans, processes, progress.say)
        tally = _Tally()
        for plan in plans:
            summary = _run_plan(plan, top, out, quick, processes, progress, tally)
            if summary is not None:
                tally.add(plan.name, summary, progress.say)
                progress.say(f"[{plan.name}] {summary.get('seconds', 0.0):.1f} s -> {out}")
    outcome = Outcome(
        failures=tally.failures,
        findings=tally.findings,
        errors=tally.errors,
        passed=tally.passed,
        paper_holds=tally.paper_holds,
        computed=progress.counts["computed"],
        reused=progress.counts["reused"],
        stale=progress.counts["stale"],
        estimated_seconds=estimate,
        seconds=progress.elapsed(),
    )
    print_summary(name, mode, outcome, progress.say)
    return outcome


def _announce(
    name: str, mode: str, out: Path, plans: list[_Plan], processes: int, say: Callable[[str], None]
) -> None:
    """The run's first lines: its units of work and the estimated run time."""
    estimate = sum(p.estimate for p in plans)
    n_units = sum(len(p.units) for p in plans)
    n_todo = sum(len(p.todo) for p in plans)
    say(
        f"cbdp reproduce {name} ({mode}) into {out}: {len(plans)} experiments, {n_units} units of "
        f"work, {n_units - n_todo} done earlier, {n_todo} to run."
    )
    say(
        f"Estimated run time: about {duration(estimate)} on the reference machine (2-core CPU; "
        "per-unit table in cbdp_jax/experiments/_costs.py)"
        + (
            f"; {processes} worker processes divide it by up to {processes}"
            if processes > 1
            else ""
        )
        + ". The ETA after each unit rescales it by this run's own speed."
    )


@dataclasses.dataclass
class _Tally:
    """The checks and errors of a run so far, sorted by kind."""

    failures: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    findings: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    errors: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    passed: int = 0
    paper_holds: int = 0

    def add(self, experiment: str, summary: dict, say: Callable[[str], None]) -> None:
        """Prints an experiment's checks and counts each by kind and verdict."""
        for c in summary.get("checks", []):
            say(check_line(experiment, c))
            if is_failure(c):
                self.failures.append((experiment, c))
            elif is_finding(c):
                self.findings.append((experiment, c))
            elif c.get("kind") == "paper":
                self.paper_holds += 1
            else:
                self.passed += 1


def _run_plan(
    plan: _Plan,
    top: UnitStore,
    out: Path,
    quick: bool,
    processes: int,
    progress: _Progress,
    tally: _Tally,
) -> dict | None:
    """Announces and runs (or reuses) one experiment; None if it raised (the error is tallied)."""
    desc = EXPERIMENTS[plan.name][1]
    if plan.done:
        progress.say(f"== {plan.name}: {desc} (done earlier, skipped)")
        progress.counts["reused"] += len(plan.units)
    else:
        progress.say(
            f"== {plan.name}: {desc} [{len(plan.todo)} of {len(plan.units)} units to run, "
            f"about {duration(plan.estimate)}]"
        )
    try:
        return top.run(
            [plan.name],
            lambda _uid, p=plan: _run_one(p, out, quick, processes, progress),
            configs={plan.name: plan.config},
        )[0]
    except Exception as exc:  # keep going: one broken experiment must not lose the others
        tally.errors.append((plan.name, f"{type(exc).__name__}: {exc}"))
        progress.say(f"[{plan.name}] ERROR: {type(exc).__name__}: {exc}")
        return None


def print_summary(name: str, mode: str, outcome: Outcome, say) -> None:
    """The end-of-run summary: software checks, the paper's claims (findings), units, errors."""
    say(
        f"== summary of cbdp reproduce {name} ({mode}): {duration(outcome.seconds)} "
        f"(estimated {duration(outcome.estimated_seconds)})"
    )
    say(f"software checks: {outcome.passed} hold, {len(outcome.failures)} fail")
    for exp, c in outcome.failures:
        say("  " + check_line(exp, c))
    say(
        f"paper's claims: {outcome.paper_holds} hold, {len(outcome.findings)} do not hold here "
        "(findings about the paper, with the measured numbers; not software failures)"
    )
    for exp, c in outcome.findings:
        say(f"  [{exp}] {c['claim']} -- {c.get('detail', '')}")
    say(
        f"units: {outcome.computed} computed in this run ({outcome.stale} of them stale), "
        f"{outcome.reused} reused from earlier runs"
    )
    for exp, message in outcome.errors:
        say(f"experiment error: [{exp}] {message}")
    status = "exit status 0" if outcome.ok else "exit status 1 (software failures or errors)"
    say(status)
