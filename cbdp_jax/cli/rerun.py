"""``cbdp rerun``: an estimate re-run from its result.json, and whether the numbers are identical."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice, check_output_folder
from cbdp_jax.cli._common import FORMATS
from cbdp_jax.cli.estimate import _emit, _result_record, run_estimate


def rerun_cmd(
    result_json: Annotated[Path, typer.Argument(help="a result.json written by cbdp estimate")],
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    out: Annotated[Path | None, typer.Option(help="folder for the new result.json")] = None,
) -> None:
    """Re-run an estimate exactly from its result.json; report whether the numbers are identical."""
    check_choice("format", output_format, FORMATS)
    if out is not None:
        check_output_folder("out", out)
    record, args = _read_result(result_json)
    result = run_estimate(args)
    differing = _differing_fields(record, _result_record(result, args))
    _emit(result, args, output_format, out, title="cbdp rerun (held-out)")
    if differing:
        typer.echo(f"rerun DIFFERS from {result_json} in: {', '.join(differing)}", err=True)
        raise typer.Exit(1)
    typer.echo(f"rerun identical to {result_json}", err=True)


# The arguments a `cbdp estimate` result records, without which it cannot be rerun.
_RERUN_KEYS = (
    "mechanism",
    "adversary",
    "divergence",
    "samples",
    "steps",
    "ensemble",
    "batch_size",
    "learning_rate",
    "confidence",
    "both_directions",
    "dtype",
    "seed",
)


def _read_result(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A result.json written by ``cbdp estimate`` and its arguments, or one clear error saying why not."""

    def bad(why: str) -> InvalidParameterError:
        return InvalidParameterError(
            f"result_json={str(path)!r} is invalid: not a result.json written by 'cbdp estimate' "
            f"({why})"
        )

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise bad(exc.strerror or type(exc).__name__) from None
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise bad(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise bad(f"a JSON {type(record).__name__}, not an object")
    args = record.get("cli_args")
    if not isinstance(args, dict):
        keys = ", ".join(list(record)[:6]) or "none"
        raise bad(
            f"it has no 'cli_args' field, which every estimate result records; its fields: {keys}"
        )
    missing = [k for k in _RERUN_KEYS if k not in args]
    if missing:
        raise bad("its 'cli_args' lack " + ", ".join(missing))
    if args.get("sensitivity") is not None:
        args["sensitivity"] = tuple(args["sensitivity"])
    return record, args


# Fields of a result record that legitimately change between runs of the same computation.
_VOLATILE = ("seconds", "environment")


def _canonical(obj: Any) -> Any:
    """The record as JSON would store it, without wall times and environment, at every level."""
    if isinstance(obj, dict):
        return {k: _canonical(v) for k, v in obj.items() if k not in _VOLATILE}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def _differing_fields(stored: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Top-level keys whose values differ between a stored record and a new one.

    Every number counts: estimates, bounds, diagnostics and training curves.
    """
    from cbdp_jax._src.infra.io import to_json

    a, b = _canonical(stored), _canonical(json.loads(to_json(new)))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
