"""``cbdp audit-training --one-run``: canaries inserted into one training, the model trained once."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice, check_int_at_least
from cbdp_jax.cli._common import _echo_wrapped

ONE_RUN_OPTIONS = ("canaries", "directions", "score")
_KIND_OF_THREAT = {"gradient": "gradient", "black-box": "input"}


def check_one_run_options(o: dict[str, Any], given: list[str]) -> None:
    """Refuses the one-run options without ``--one-run`` and the many-run ones with it."""
    if not o["one_run"]:
        for name in ONE_RUN_OPTIONS:
            if name in given:
                raise InvalidParameterError(
                    f"{name}={o[name]!r} is invalid without --one-run: it sets the one-run audit"
                )
        return
    if "runs" in given:
        raise InvalidParameterError(
            f"runs={o['runs']!r} is invalid with --one-run: the one-run audit trains once "
            "(set --canaries)"
        )
    check_int_at_least("canaries", o["canaries"], 2)
    check_choice("directions", o["directions"], ("auto", "coordinate", "dense"))
    check_choice("score", o["score"], ("sum", "llr"))


def one_run_cmd(problem, setup: dict, o: dict[str, Any], claim, output_format: str, out) -> None:
    """Runs the one-run audit of ``problem`` and prints it.

    Exit status as the many-run audit's: 1 a certified violation (with or without a defect), 3 a
    defect named by the noise probes and no certified violation, 0 neither.
    """
    import jax

    from cbdp_jax._src.training_auditor.one_run.audit import one_run_training

    kind = _KIND_OF_THREAT.get(problem.threat)
    if kind is None:
        raise InvalidParameterError(
            f"threat={problem.threat!r} is invalid with --one-run: gradient (gradient canaries, "
            "every update seen) or black-box (input canaries, the final model's losses)"
        )
    if claim.kind not in ("approx", "pure"):
        raise InvalidParameterError(
            f"claim={claim.text!r} is invalid with --one-run: give an (eps, delta) claim "
            "(approx:EPS:DELTA or dpsgd:...)"
        )
    delta = claim.delta if claim.kind == "approx" else 1e-5
    result = one_run_training(
        jax.random.key(o["seed"]), problem, canaries=o["canaries"], kind=kind,
        directions=o["directions"], score=o["score"], delta=delta, level=o["confidence"],
        claim=claim.epsilon, critics=_one_run_critics(o["critics"]),
    )  # fmt: skip
    setup = setup | {"one_run": True, "claim": claim.text}
    _emit(result, problem, setup, output_format, out)
    if result.violation:
        raise typer.Exit(1)
    if result.defects:
        raise typer.Exit(3)


def _one_run_critics(text: str):
    """``--critics`` with ``--one-run``: 'all' is the default family, else a comma list."""
    return "auto" if text == "all" else tuple(c.strip() for c in text.split(",") if c.strip())


def _emit(result, problem, setup: dict, output_format: str, out) -> None:
    from cbdp_jax._src.infra.io import to_json

    record = result.to_dict() | {"training": setup}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "audit.json").write_text(
            to_json(result.to_dict(arrays=True) | {"training": setup})
        )
    if output_format == "json":
        typer.echo(to_json(record))
        return
    _echo_wrapped(
        f"cbdp audit-training --one-run: {problem.name}, {result.examples} examples + "
        f"{result.canaries} {result.kind} canaries ({result.directions}; {result.included} in by "
        f"their coins), {result.steps} steps, q = {result.sampling_rate:.4g}, trained once"
    )
    size = (
        "a fixed step"
        if result.step_size is None
        else f"a step built for {result.step_size} examples"
    )
    _echo_wrapped(
        f"the step: {size}; canaries held by {result.hit_rate:.4g} of the steps (q); "
        f"{result.seconds:.1f} s"
    )
    claim = "none" if result.claim_epsilon is None else f"{result.claim_epsilon:.4g}"
    family = ", ".join(result.critics)
    typer.echo(
        f"claim: eps {claim} at delta {result.delta:g}; level {result.level:g} over the critics "
        f"({family}), each at {1 - (1 - result.level) / len(result.critics):g}"
    )
    for name, b in result.bounds.items():
        eps = b["epsilon"]
        text = f"refused: {b['refused']}" if eps is None else f"eps >= {eps:.4g}"
        where = "" if eps is None else f", {b['score']} score, {b['critic']} critic"
        _echo_wrapped(f"  {name:16s} {text}  [{b['kind']}{where}]")
    name, eps = result.best()
    if eps > 0:
        _echo_wrapped(f"best finite-sample bound: {name} by the {result.certified_by()} critic")
    if not math.isnan(result.noise_ratio):
        _echo_wrapped(
            f"interference: excluded canaries' score spread {result.noise_ratio:.3f} x the noise's "
            "alone (1 = none)"
        )
    what = "accuracy" if not math.isnan(result.accuracy_with) else "loss"
    a, b = (
        (result.accuracy_with, result.accuracy_without)
        if what == "accuracy"
        else (result.loss_with, result.loss_without)
    )
    _echo_wrapped(f"price of the audit: {what} {a:.4g} with the canaries, {b:.4g} without")
    for defect in result.defects:
        _echo_wrapped(f"defect ({defect.kind}): {defect.message}")
    _echo_wrapped(result.verdict)
