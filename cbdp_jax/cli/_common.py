"""What several ``cbdp`` commands share: the error exit, number-list options, tables, wrapped prose."""

from __future__ import annotations

from typing import Any

import typer

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice

FORMATS = ("table", "json")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def check_format_and_out(output_format: str, out) -> None:
    """``--format`` is table or json; ``--out`` (if given) is a folder, created before any work."""
    from cbdp_jax._src.infra.validation import check_output_folder

    check_choice("format", output_format, FORMATS)
    if out is not None:
        check_output_folder("out", out)


def _parse_floats(
    name: str, text: str | None, example: str = "0.5,1,2"
) -> tuple[float, ...] | None:
    """Comma-separated numbers of option ``name`` (None stays None); errors name the option."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InvalidParameterError(
            f"{name}={text!r} is invalid: must be comma-separated numbers, e.g. {example}"
        ) from None
    if not values:
        raise InvalidParameterError(f"{name}={text!r} is invalid: must not be empty")
    return values


def _parse_sensitivity(text: str | None) -> tuple[float, ...] | None:
    return _parse_floats("sensitivity", text, example="1,0.5")


def _print_record(title: str, fields: list[tuple[str, Any]]) -> None:
    """One result as a table fitting the terminal (vertical when narrow), every number in full."""
    from rich.console import Console

    from cbdp_jax._src.infra.tables import render_record

    typer.echo(render_record(title, fields, Console().width).rstrip("\n"))


def _echo_wrapped(text: str, err: bool = False) -> None:
    """A line of prose wrapped at the terminal's width (continuation lines indented by two)."""
    from rich.console import Console

    from cbdp_jax._src.infra.display import wrap

    width = max(Console().width, 40)
    typer.echo(wrap(text, width), err=err)  # never inside a word: a claim breaks after a comma


# CLI flags of the adversary options (AdversarySpec fields); feature_map and bandwidth have none.
_ADVERSARY_FLAGS = {
    "width": "--width",
    "depth": "--depth",
    "degree": "--degree",
    "features": "--features",
    "bound": "--bound",
}


def _check_adversary_flags(adversary: str, given: dict[str, Any]) -> None:
    """An option that does not apply to the class is an error naming both (before any work)."""
    from cbdp_jax._src.estimator.adversaries import ADVERSARY_NAMES, ADVERSARY_OPTIONS

    check_choice("adversary", adversary, ADVERSARY_NAMES)
    takes = [_ADVERSARY_FLAGS[o] for o in ADVERSARY_OPTIONS[adversary] if o in _ADVERSARY_FLAGS]
    for option, value in given.items():
        if value is None or option in ADVERSARY_OPTIONS[adversary]:
            continue
        users = [n for n, opts in ADVERSARY_OPTIONS.items() if option in opts]
        raise InvalidParameterError(
            f"{option}={value!r} is invalid for adversary {adversary!r}: it takes "
            + ", ".join(takes)
            + f" ({_ADVERSARY_FLAGS[option]} applies to "
            + ", ".join(users)
            + ")"
        )


def progress_hook(fn, bar) -> dict[str, Any]:
    """``{'progress': bar}`` when the library function ``fn`` takes a ``progress`` callback, else ``{}``.

    The command line shows a count and an ETA wherever the library reports its loop's progress; a
    function that does not (yet) gets only the bar's elapsed time, drawn by the bar itself.
    """
    import inspect

    try:
        takes = "progress" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return {"progress": bar} if takes and bar is not None else {}


def _given(ctx: Any, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` the user set (on the command line or in the environment)."""
    # compared by name: typer may vendor click, so the enum's module varies between versions
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return [
        n
        for n, src in sources.items()
        if getattr(src, "name", "") in ("COMMANDLINE", "ENVIRONMENT")
    ]
