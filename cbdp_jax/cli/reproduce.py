"""``cbdp reproduce``: the papers' figures, tables and theorem experiments, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_int_at_least,
    check_output_folder,
)
from cbdp_jax.cli._common import _echo_wrapped


def reproduce_cmd(
    name: Annotated[
        str | None,
        typer.Argument(help="an experiment name (--list shows them), 'paper' (figures) or 'all'"),
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="list the experiments with what each shows, and exit")
    ] = False,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results"),
    quick: Annotated[bool, typer.Option("--quick", help="small, fast versions")] = False,
    restart: Annotated[
        bool,
        typer.Option("--restart", help="forget the named experiments' stored units and rerun them"),
    ] = False,
    processes: Annotated[
        int, typer.Option(help="worker processes for the units of an experiment")
    ] = 1,
) -> None:
    """Reproduce the papers' figures, tables and theorem experiments into OUT.

    Resumable: every finished unit of work is kept under OUT/.units, and a rerun after a kill continues
    where it stopped. Prints a run-time estimate before it starts and an ETA after each unit. Exits 1
    only for software failures; a claim printed in the paper that does not hold is reported as a
    finding, with its numbers.
    """
    from cbdp_jax.experiments._reproduce import reproduce, resolve

    if list_:
        _echo_experiments()
        return
    if name is None:
        raise InvalidParameterError(
            "name=None is invalid: give an experiment name, 'paper' or 'all' (cbdp reproduce --list)"
        )
    resolve(name)
    check_int_at_least("processes", processes, 1)
    check_output_folder("out", out)
    outcome = reproduce(name, out, quick=quick, restart=restart, processes=processes)
    if not outcome.ok:
        raise typer.Exit(1)


def _experiment_lines() -> list[str]:
    """``name: what it shows`` for every registered experiment, then the two groups."""
    from cbdp_jax.experiments import EXPERIMENTS, PAPER_FIGURES

    lines = [f"{name}: {about}" for name, (_, about) in EXPERIMENTS.items()]
    lines.append(f"paper: the figures and Table 1 ({', '.join(PAPER_FIGURES)})")
    lines.append("all: every experiment above, in this order")
    return lines


def _echo_experiments() -> None:
    for line in _experiment_lines():
        _echo_wrapped(line)
