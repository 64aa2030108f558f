"""Experiments as units of work: plan, compute each unit (checkpointed), finish.

A long experiment module defines

* ``plan(quick) -> list[Unit]``: its independent units of work, each with a stable id, a JSON
  configuration (everything the unit's result depends on) and a cost ``kind`` (the per-unit cost table,
  :mod:`cbdp_jax.experiments._costs`, gives its expected run time);
* ``compute(config) -> dict``: one unit of work, a module-level function of the configuration alone (so
  a worker process can run it);
* ``finish(out_dir, results, *, quick, seconds) -> dict``: checks, figure and outputs from the units'
  results (``unit id -> result``);
* ``run(out_dir, *, quick=False)``: :func:`run_experiment` on the module.

:func:`run_experiment` keeps each finished unit in a :class:`~cbdp_jax.checkpoint.UnitStore` under
``out_dir/.units/NAME-{quick,full}``, so a run killed at any point resumes with the units not yet done; a
unit stored with another configuration or by another version of the package is recomputed (stale).
With ``processes > 1`` the missing units run in that many worker processes (``spawn``), each writing its
own unit file atomically; results are read back in plan order, so the outputs do not depend on it.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import ModuleType
from typing import Any

from cbdp_jax._src.infra.checkpoint import COMPUTED, REUSED, STALE, UnitReport, UnitStore
from cbdp_jax._src.infra.validation import check_int_at_least


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unit:
    """One independent unit of work of an experiment.

    Attributes:
      id: Stable id, unique within the experiment (also the checkpoint's name).
      config: Everything the result depends on, JSON-able; fingerprinted with the package version.
      kind: Which row of the per-unit cost table this unit's run time is estimated from.

    """

    id: str
    config: Mapping[str, Any]
    kind: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitEvent:
    """One unit finished (or found on disk), as reported to a progress callback.

    Attributes:
      experiment: The experiment's name.
      unit: The unit.
      index: 1-based position among the experiment's units in the order they finished.
      total: The experiment's number of units.
      report: What happened (computed, reused, stale) and how long it took.

    """

    experiment: str
    unit: Unit
    index: int
    total: int
    report: UnitReport


def has_units(module: ModuleType) -> bool:
    """Whether an experiment module is split into units (defines ``plan``, ``compute``, ``finish``)."""
    return all(hasattr(module, name) for name in ("plan", "compute", "finish"))


def unit_store(out_dir: str | Path, name: str, quick: bool, *, clean: bool = True) -> UnitStore:
    """The checkpoint folder of experiment ``name``: ``out_dir/.units/NAME-{quick,full}``."""
    return UnitStore(
        Path(out_dir) / ".units" / f"{name}-{'quick' if quick else 'full'}", clean=clean
    )


def _compute_in_worker(module_name: str, folder: str, unit_id: str, config: dict) -> float:
    """Worker process: computes one unit and writes its checkpoint; returns the compute time."""
    module = importlib.import_module(module_name)
    t0 = time.perf_counter()
    result = module.compute(config)
    seconds = time.perf_counter() - t0
    UnitStore(folder, clean=False).save(unit_id, result, config=config, seconds=seconds)
    return seconds


def run_units(
    module: ModuleType,
    units: list[Unit],
    store: UnitStore,
    *,
    processes: int = 1,
    on_event: Callable[[UnitEvent], None] | None = None,
) -> dict[str, Any]:
    """Computes every unit that is missing or stale, and returns ``unit id -> result`` in plan order.

    Args:
      module: The experiment module (its ``compute`` and ``NAME``).
      units: The experiment's plan.
      store: Where finished units are kept.
      processes: Worker processes for the missing units (1: in this process, in plan order).
      on_event: Called after each unit with a :class:`UnitEvent`.

    Returns:
      The results, keyed by unit id, in plan order.

    """
    processes = check_int_at_least("processes", processes, 1)
    name = getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1])
    ids = [u.id for u in units]
    if len(set(ids)) != len(ids):
        raise ValueError(f"experiment {name!r} plans duplicate unit ids")
    count = [0]

    def emit(unit: Unit, report: UnitReport) -> None:
        count[0] += 1
        if on_event is not None:
            on_event(
                UnitEvent(
                    experiment=name, unit=unit, index=count[0], total=len(units), report=report
                )
            )

    todo = []
    for unit in units:
        state, reason = store.status(unit.id, unit.config)
        if state == "done":
            emit(
                unit,
                UnitReport(unit_id=unit.id, status=REUSED, seconds=store.stored_seconds(unit.id)),
            )
        else:
            todo.append((unit, state, reason))
    if processes == 1 or len(todo) <= 1:
        for unit, _, _ in todo:
            report = store.ensure(
                unit.id, lambda _uid, u=unit: module.compute(dict(u.config)), config=unit.config
            )
            emit(unit, report)
    else:
        _run_in_workers(module, todo, store, processes, emit)
    return {u.id: store.load(u.id) for u in units}


def _run_in_workers(module, todo, store, processes, emit) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(todo)), mp_context=context) as pool:
        futures = {
            pool.submit(
                _compute_in_worker, module.__name__, str(store.folder), unit.id, dict(unit.config)
            ): (unit, state, reason)
            for unit, state, reason in todo
        }
        try:
            for future in as_completed(futures):
                unit, state, reason = futures[future]
                seconds = future.result()
                status = COMPUTED if state == "missing" else STALE
                emit(
                    unit, UnitReport(unit_id=unit.id, status=status, seconds=seconds, reason=reason)
                )
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def run_experiment(
    module: ModuleType,
    out_dir: str | Path,
    *,
    quick: bool = False,
    processes: int = 1,
    on_event: Callable[[UnitEvent], None] | None = None,
) -> dict[str, Any]:
    """Plans, computes (resumably) and finishes a unit-based experiment.

    Args:
      module: The experiment module (``plan``, ``compute``, ``finish``).
      out_dir: Output folder; units are kept under ``out_dir/.units/NAME-{quick,full}``.
      quick: The experiment's quick mode.
      processes: Worker processes for the units not yet done.
      on_event: Progress callback, one :class:`UnitEvent` per unit.

    Returns:
      The experiment's summary, with ``units`` (how many) and ``units_reused`` (found on disk) added.

    """
    units = module.plan(quick)
    store = unit_store(out_dir, module.NAME, quick)
    statuses: list[str] = []

    def track(event: UnitEvent) -> None:
        statuses.append(event.report.status)
        if on_event is not None:
            on_event(event)

    results = run_units(module, units, store, processes=processes, on_event=track)
    compute_seconds = sum(store.stored_seconds(u.id) or 0.0 for u in units)
    summary = dict(module.finish(out_dir, results, quick=quick, seconds=compute_seconds))
    summary["units"] = len(units)
    summary["units_reused"] = statuses.count(REUSED)
    summary["units_stale"] = statuses.count(STALE)
    summary["unit_store"] = str(store.folder)
    return summary
