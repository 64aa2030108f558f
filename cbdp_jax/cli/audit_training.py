"""``cbdp audit-training``: DP training audited as it is run, many trainings in one program."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

import typer

from cbdp_jax._src.progress import Progress
from cbdp_jax._src.validation import (
    check_in_range,
    check_int_at_least,
)
from cbdp_jax.cli._common import _echo_wrapped, check_format_and_out, progress_hook
from cbdp_jax.cli.audit import _emit_audit


def _emit_training_audit(result, problem, training: dict, output_format: str, out) -> None:
    """Writes ``--out`` (report and audit.json with the training's settings) and prints the audit."""
    from cbdp_jax._src.io import to_json

    record = result.to_dict() | {"training": training}
    if out is not None:
        from cbdp_jax._src.audit_report import write_report

        write_report(result, Path(out), extra={"training": training})
    if output_format == "json":
        typer.echo(to_json(record))
        return
    _echo_wrapped(
        f"cbdp audit-training: {problem.name}, {problem.examples - 1} examples + canary, "
        f"{training['steps']} steps, q = {problem.sampling_rate:.4g}, {training['threat']} threat"
    )
    _echo_wrapped(
        f"{2 * training['runs_per_side']} trainings (D: canary in, D': canary zeroed) and audit: "
        f"{training['seconds']:.1f} s"
    )
    _emit_audit(result, "table", None)


def _check_counts(runs: int, noise: float, examples: int | None) -> None:
    """The options under their own names (the library's errors name noise_multiplier, n)."""
    check_int_at_least("runs", runs, 100)
    check_in_range("noise", noise, 0.0, math.inf)
    if examples is not None:
        check_int_at_least("examples", examples, 2)


def _audit_with_progress(key, problem, claim: str, config, runs: int):
    """``training_audit.audit_training`` under a progress line (runs done where it reports them)."""
    from cbdp_jax._src import training_audit as ta

    with Progress("cbdp audit-training", total=2 * runs, unit="runs") as bar:
        hook = progress_hook(ta.audit_training, bar)
        if not hook:  # no count from the library: the bar shows the elapsed time only
            bar.total = None
        return ta.audit_training(key, problem, claim, config=config, **hook)


def audit_training_cmd(
    model: Annotated[
        str, typer.Option(help="logreg or mlp (2 layers, 32 hidden units)")
    ] = "logreg",
    data: Annotated[
        str,
        typer.Option(
            help="digits (the 8x8 handwritten digits, bundled), synthetic, or worst-case (Chua et "
            "al.'s data for shuffled batches: one weight, every clipped gradient -C, one epoch of "
            "--steps batches of --batch-size (default 4); --model, --rate and --learning-rate do "
            "not apply, Poisson is at q = 1 / steps)"
        ),
    ] = "digits",
    examples: Annotated[
        int | None, typer.Option(help="use the first N examples (default: all)")
    ] = None,
    sampler: Annotated[str, typer.Option(help="poisson, shuffle or fixed")] = "poisson",
    noise: Annotated[float, typer.Option(help="noise multiplier S (std S * clip)")] = 1.0,
    clip: Annotated[float, typer.Option(help="per-example l2 clipping norm C")] = 1.0,
    rate: Annotated[float, typer.Option(help="poisson: sampling rate q in (0, 1]")] = 0.01,
    batch_size: Annotated[
        int | None, typer.Option(help="shuffle / fixed: batch size b (q = b / examples)")
    ] = None,
    steps: Annotated[int, typer.Option(help="training steps T")] = 100,
    learning_rate: Annotated[float, typer.Option(help="SGD step size")] = 0.5,
    runs: Annotated[
        int, typer.Option(help="trainings per side (with and without the canary)")
    ] = 10_000,
    threat: Annotated[
        str,
        typer.Option(
            help="gradient (gradient canary, every update seen), white-box (final parameters) or "
            "black-box (the canary's final loss)"
        ),
    ] = "gradient",
    step: Annotated[
        str, typer.Option(help="dp-sgd (cbdp_jax's) or optax (optax.contrib.dpsgd)")
    ] = "dp-sgd",
    bug: Annotated[
        str,
        typer.Option(
            help="plant a bug in dp-sgd: none, noise-after-averaging, no-clip, noise-on-subset"
        ),
    ] = "none",
    claim: Annotated[
        str | None,
        typer.Option(help="the claim; default the run's own dpsgd:noise=S,rate=q,steps=T,delta=D"),
    ] = None,
    delta: Annotated[float, typer.Option(help="delta of the default claim")] = 1e-5,
    confidence: Annotated[float, typer.Option(help="family-wise level")] = 0.95,
    chunk: Annotated[int, typer.Option(help="runs vmapped at once (memory bound)")] = 2048,
    seed: Annotated[int, typer.Option(help="PRNG seed (model init, data, runs)")] = 0,
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    out: Annotated[Path | None, typer.Option(help="folder for audit.json and report.png")] = None,
) -> None:
    """Audit DP training as it is run: many trainings with and without a canary, in one program.

    Each run trains the model from the same initialisation with the DP step, the sampler's batches
    and fresh noise; D has the canary as one more example, D' the same with its gradient zeroed.
    Runs are vmapped over keys (lax.scan over steps) in one jit-compiled program, scored by the
    threat model, and the scores audited like `cbdp audit` (hockey-stick rows, empirical epsilon).
    The default claim is the run's own accountant (dp_accounting PLD, Poisson-subsampled Gaussian,
    shuffled or fixed batches accounted as Poisson at q = b / examples).

    Exit status: 0 when no violation is certified, 1 when one is, 2 for bad input.
    """
    import jax

    from cbdp_jax._src import audit as au
    from cbdp_jax._src import training_audit as ta
    from cbdp_jax._src.training_setups import build_problem

    check_format_and_out(output_format, out)
    _check_counts(runs, noise, examples)
    problem = build_problem(
        model=model, data=data, sampler=sampler, noise=noise, clip=clip,
        rate=rate if sampler == "poisson" else None, batch_size=batch_size, steps=steps,
        learning_rate=learning_rate, threat=threat, step=step, bug=bug, n=examples, seed=seed,
        chunk=chunk,
    )  # fmt: skip
    text = ta.default_claim(problem, delta) if claim is None else claim
    parsed = au.parse_claim(text)
    config = ta.training_audit_config(parsed.epsilon, samples=runs, confidence=confidence)
    start = time.perf_counter()
    result = _audit_with_progress(jax.random.key(seed), problem, text, config, runs)
    seconds = time.perf_counter() - start
    if data == "worst-case":  # the setup's own model and step size
        model, learning_rate = "single-weight", 1e-6
    training = {
        "model": model, "data": data, "examples": problem.examples - 1, "sampler": sampler,
        "sampling_rate": problem.sampling_rate, "noise": noise, "clip": clip,
        "steps": steps, "learning_rate": learning_rate, "threat": threat, "step": step,
        "bug": bug, "runs_per_side": runs, "seconds": seconds,
        "pair": "D = [1]: the canary in; D' = [0]: its gradient zeroed",
    }  # fmt: skip
    _emit_training_audit(result, problem, training, output_format, out)
    if result.violation:
        raise typer.Exit(1)
