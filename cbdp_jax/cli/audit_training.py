"""``cbdp audit-training``: DP training audited as it is run, many trainings in one program."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cbdp_jax._src.infra.progress import Progress
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.privacy.accounting import ACCOUNTANTS, RELATIONS
from cbdp_jax._src.training_auditor.planted_bugs import BUGS, visibility_text
from cbdp_jax.cli._common import _echo_wrapped, _given, check_format_and_out, progress_hook
from cbdp_jax.cli.audit import _emit_audit

INITS = ("default", "worst-case", "average-case")  # default + crafted_init.INITS (a test checks)
_Opt = typer.Option

_DATA = (
    "digits (the 8x8 handwritten digits, bundled, 1797 examples), synthetic (256 examples, two "
    "Gaussian blobs), or worst-case (Chua et al.'s data for shuffled batches and batch "
    "normalisation: one weight, every clipped gradient -C; --steps batches of --batch-size, "
    "default 4 shuffled, 8 Poisson at q = 1 / steps; --model and --learning-rate do not apply)"
)
_MODEL = (
    "logreg (one linear layer), mlp (Linear(32) -> ReLU -> Linear) or cnn (two 3x3 convolutions of "
    "4 and 8 channels, each with ReLU and 2x2 average pooling, then Linear; square images: digits)"
)
_RELATION = (
    "the neighbouring relation audited and accounted: add-remove (D' has no canary: absent from "
    "every batch and from the data set's size), zero-out (D' keeps the canary's slot with a zero "
    "gradient) or replace-one (the canary replaces one example). Default: the claim's relation "
    "(add-remove, dp_accounting's default). A relation the accountant cannot account is refused"
)
_CANARY_NORM = (
    "the gradient canary's raw norm in units of C; above 1 clipping binds on it, so a step that "
    "does not clip is seen (at 1 it is not)"
)
_BUG = (
    f"plant a bug in dp-sgd: {', '.join(BUGS)}. The threats blind to each at the defaults (the "
    f"audit's own probes, named in its output): {visibility_text()} Not blind is not certified: "
    "a threat may still miss a bug at 10^4 runs (each bug against each threat at the defaults: "
    "benchmarks/measured/training-bugs in the repository)"
)
_PROBLEM = (
    "audit the TrainingProblem that FACTORY in FILE.py (or MODULE) returns, given as FILE.py:FACTORY "
    "(called with no arguments; your model, data, loss_fn, DP step, sampler and canary). The options that build "
    "a problem (--model to --init) are refused with it; --relation, --claim, --delta, "
    "--accountant, --runs, --confidence, --chunk, --seed, --format and --out apply"
)
_INIT = (
    "the initial parameters: default (the model's own initialisation, the input canary at every "
    "feature's maximum), worst-case (fitted, then rescaled so that the final loss on a canary "
    "along the blank pixels is Gaussian: Annamalai & De Cristofaro 2024) or average-case (the "
    "default initialisation, that canary). worst-case and average-case are for --threat "
    "black-box (their default) or white-box; they train with the clipped gradients summed, "
    "--rate default 1 (full batch) and --learning-rate default 5e-4; --sampler poisson only"
)
_THREAT = (
    "gradient (a gradient canary, every update seen), white-box (the final parameters) or "
    "black-box (the canary's final loss); default gradient, black-box with --init worst-case or "
    "average-case"
)

_ONE_RUN = (
    "audit in ONE training: --canaries canaries inserted, each with probability 1/2, the model "
    "trained once, and the one-run bounds (steinke, fdp, gdp, gaussian-scores) on their scores. "
    "--threat gradient: gradient canaries; black-box: input canaries scored by the final loss"
)
_DIRECTIONS = (
    "--one-run gradient canaries: coordinate (coordinates no example moves), dense (random unit "
    "vectors, regenerated from keys) or auto (coordinates when the model has enough)"
)
_SCORE = (
    "--one-run: sum (the updates along each canary) or llr (their likelihood ratio for the "
    "finite-sample methods; coordinate canaries); gaussian-scores always gets the sum"
)
_CRITICS = (
    "the critics certified, one family: all (default: the threat's score and every group of "
    "critics of the release), or a comma list of score, sum, steps, twins, exact, learned, "
    "coordinates. 'score' alone records nothing beyond the score: one value a run instead of "
    "1 + T k, for audits of 10^7 runs. With --one-run: all (default: score and steps-max for "
    "coordinate gradient canaries, else score) or a comma list of score, steps-max, steps-sq"
)
_CHECKPOINT = (
    "folder the runs' outputs are written into in blocks as they finish (about every 10 s), so "
    "a killed audit can resume (--resume); about 4 (T (k + 1) + 3) bytes a run, k the coordinates the release records. Default: none"
)
_RESUME = (
    "continue the audit whose blocks are in the checkpoint folder: the runs done are loaded, the "
    "rest run (same keys: the same scores and verdict as a run left alone). A folder written for "
    "another problem, claim, setting or cbdp_jax version is refused"
)

# the options that build a problem: refused with --problem (the factory builds it)
_BUILDERS = (
    "model", "data", "examples", "sampler", "noise", "clip", "rate", "batch_size", "steps",
    "learning_rate", "threat", "step", "bug", "canary_norm", "init",
)  # fmt: skip


def audit_training_cmd(
    ctx: typer.Context,
    model: Annotated[str, _Opt(help=_MODEL)] = "logreg",
    data: Annotated[str, _Opt(help=_DATA)] = "digits",
    examples: Annotated[int | None, _Opt(help="use the first N examples (default: all)")] = None,
    sampler: Annotated[str, _Opt(help="poisson, shuffle or fixed")] = "poisson",
    noise: Annotated[float, _Opt(help="noise multiplier S (std S * clip)")] = 1.0,
    clip: Annotated[float, _Opt(help="per-example l2 clipping norm C")] = 1.0,
    rate: Annotated[float, _Opt(help="poisson: sampling rate q in (0, 1]")] = 0.01,
    batch_size: Annotated[int | None, _Opt(help="shuffle / fixed: batch size b")] = None,
    steps: Annotated[int, _Opt(help="training steps T")] = 100,
    learning_rate: Annotated[float, _Opt(help="SGD step size")] = 0.5,
    runs: Annotated[int, _Opt(help="trainings per side (D and D')")] = 10_000,
    threat: Annotated[str, _Opt(help=_THREAT)] = "gradient",
    step: Annotated[
        str, _Opt(help="dp-sgd (cbdp_jax's) or optax (optax.contrib.dpsgd)")
    ] = "dp-sgd",
    bug: Annotated[str, _Opt(help=_BUG)] = "none",
    canary_norm: Annotated[float, _Opt(help=_CANARY_NORM)] = 4.0,
    init: Annotated[str, _Opt(help=_INIT)] = "default",
    problem: Annotated[str | None, _Opt(help=_PROBLEM)] = None,
    relation: Annotated[str | None, _Opt(help=_RELATION)] = None,
    claim: Annotated[
        str | None, _Opt(help="the claim; default the run's own dpsgd:noise=S,rate=q,steps=T,...")
    ] = None,
    delta: Annotated[float, _Opt(help="delta of the default claim")] = 1e-5,
    accountant: Annotated[str, _Opt(help="the default claim's accountant: pld or rdp")] = "pld",
    confidence: Annotated[float, _Opt(help="family-wise level")] = 0.95,
    chunk: Annotated[int, _Opt(help="runs vmapped at once (memory bound)")] = 2048,
    seed: Annotated[int, _Opt(help="PRNG seed (model init, data, runs)")] = 0,
    output_format: Annotated[str, _Opt("--format", help="table or json")] = "table",
    out: Annotated[Path | None, _Opt(help="folder for audit.json and report.png")] = None,
    one_run: Annotated[bool, _Opt("--one-run", help=_ONE_RUN)] = False,
    canaries: Annotated[
        int, _Opt(help="--one-run: canaries m, each in with probability 1/2")
    ] = 1000,
    directions: Annotated[str, _Opt(help=_DIRECTIONS)] = "auto",
    score: Annotated[str, _Opt(help=_SCORE)] = "sum",
    critics: Annotated[str, _Opt(help=_CRITICS)] = "all",
    checkpoint: Annotated[Path | None, _Opt(help=_CHECKPOINT)] = None,
    resume: Annotated[bool, _Opt("--resume", help=_RESUME)] = False,
) -> None:
    """Audit DP training as it is run: many trainings on D and on its neighbour D', in one program.

    Each run trains the model from the same initialisation with the DP step, the sampler's batches
    and fresh noise; D has the canary, D' is its neighbour under the relation audited (--relation).
    Runs are vmapped over keys (lax.scan over steps) in one jit-compiled program, scored by the
    threat model, and the scores audited like `cbdp audit`. The default claim is the run's own
    accountant (dp_accounting PLD, Poisson-subsampled Gaussian, under the relation audited;
    shuffled or fixed batches accounted as Poisson at q = b / examples), its whole delta(eps)
    curve. A run whose parameters or score are NaN or inf refuses the audit: never a clean bill.

    Reading the verdict: a certified violation names its point ("at eps 0.25 the runs certify
    delta >= x, the claim allows y"). It is usually far below the claimed eps, where a few thousand
    runs certify a gap of a few hundredths, while the empirical eps at the claim's delta (1e-5)
    needs the far tail, which 10^4 - 10^5 runs reach only partly: so a violated claim can sit
    above the empirical eps, both true at different points of the curve. A verdict resting on an
    asymptotic bound says so on its line. What the audit cannot see by construction (a canary the
    clipping does not bind on, parameters without noise, a normalisation the relation or the
    canary hides) is named after the verdict ("blind spot") and in the JSON's blind_spots.

    Beyond the threat's score, the gradient threat records every update along the canary's
    coordinate, dead twins (coordinates no example moves) and a few moved ones, and the white-box
    threat several final coordinates; critics of that release (rows named group:critic: sum, steps,
    twins, exact, learned, coordinates) are certified in the same family, so a step whose noise
    is repeated across steps, shared across coordinates or missing at some steps is seen.

    With --one-run: m canaries (--canaries), each in by its own coin, are inserted into ONE
    training of the same problem, and the one-run bounds (steinke, fdp, gdp: finite-sample;
    gaussian-scores: asymptotic) are checked against the claim (docs/theory/one_run.md, section 8).

    Before training, the step is also run on zero gradients under 64 keys to probe what the
    accountant assumes of its noise: fresh at every step, independent across coordinates and runs,
    present at every step, of the claimed size S C on every parameter (momentum, Adam, schedules
    and weight decay are post-processing and pass). A failed probe is a defect, one line each
    ("defect (noise-not-fresh): ...") and in the JSON's defects, at a family-wise level of 1e-6.

    Exit status: 0 clean (no violation certified, no defect named); 1 a violation certified, with
    or without a defect; 2 bad input or a refused audit; 3 a defect named and no violation
    certified (the claim's accountant does not describe the step: not a clean bill).
    """
    import jax

    from cbdp_jax import audit as au
    from cbdp_jax.cli.one_run_training import ONE_RUN_OPTIONS, check_one_run_options, one_run_cmd

    opts = dict(locals())
    check_format_and_out(output_format, out)
    _check_options(opts)
    given = _given(ctx, (*_BUILDERS, "claim", "delta", "accountant", "chunk", "runs",
                         *ONE_RUN_OPTIONS))  # fmt: skip
    check_one_run_options(opts, given)
    built, setup = _problem(opts, given)
    text = _claim_text(built, opts, given)
    parsed = au.parse_claim(text)
    if one_run:
        return one_run_cmd(built, setup, opts, parsed, output_format, out)
    _many_runs(jax.random.key(seed), built, setup, opts, text, parsed.epsilon)


def _many_runs(key, built, setup: dict, opts: dict[str, Any], text: str, epsilon: float) -> None:
    """The many-run audit: runs, certifies, prints; exits 1 on a violation, 3 on a defect alone."""
    runs = opts["runs"]
    config = _training_config(epsilon, runs, opts["confidence"], opts["critics"])
    blocks = _checkpoint(opts, text, config)
    start = time.perf_counter()
    result = _audit_with_progress(key, built, text, config, runs, blocks)
    setup |= {
        "relation": result.relation, "accountant": _accountant_of(result), "runs_per_side": runs,
        "seconds": time.perf_counter() - start, "pair": _pair_text(built, result.relation),
    }  # fmt: skip
    _emit_training_audit(result, built, setup, opts["output_format"], opts["out"])
    if result.violation:
        raise typer.Exit(1)
    if result.defects:
        raise typer.Exit(3)


def _checkpoint(o: dict[str, Any], claim: str, config) -> Any:
    """The run blocks of ``--checkpoint``, fingerprinted by every option and the claim."""
    folder = o["checkpoint"]
    if folder is None:
        return None
    from cbdp_jax._src.infra.run_blocks import RunBlocks

    skip = ("output_format", "out", "checkpoint", "resume")
    plain = (str, int, float, bool, type(None))
    identity = {k: v for k, v in o.items() if k not in skip and isinstance(v, plain)}
    return RunBlocks(
        folder, identity | {"claim": claim, "config": repr(config)}, resume=o["resume"]
    )


def _accountant_of(result) -> str | None:
    """The accountant of a ``dpsgd:`` claim (``'pld'`` or ``'rdp'``), None for other claims."""
    return ((result.claimed or {}).get("source") or {}).get("method")


def _training_config(epsilon: float, runs: int, confidence: float, critics: str = "all"):
    from cbdp_jax._src.training_auditor.audit_training import training_audit_config

    groups = None if critics == "all" else _critic_groups(critics)
    return training_audit_config(
        epsilon, samples=runs, confidence=confidence, feature_groups=groups
    )


def _critic_groups(text: str) -> tuple[str, ...]:
    """``--critics`` as feature-group names (each one of the release's groups, 'score' first)."""
    from cbdp_jax._src.training_auditor.critics import GROUPS

    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in GROUPS]
    if bad or not names:
        raise InvalidParameterError(
            f"critics={text!r} is invalid: give all, or a comma list of {', '.join(GROUPS)}"
        )
    return names


def _check_options(o: dict[str, Any]) -> None:
    """Every option's range, before any work (the library's errors would name other parameters)."""
    from cbdp_jax._src.privacy.accounting import check_accountable

    check_int_at_least("runs", o["runs"], 100)
    _check_runs_fit(o["runs"])
    if o["critics"] != "all":
        _critic_groups(o["critics"])
    if o["resume"] and o["checkpoint"] is None:
        raise InvalidParameterError(
            "resume=True is invalid without a checkpoint folder: give --checkpoint FOLDER"
        )
    check_in_range("noise", o["noise"], 0.0, math.inf)
    if o["examples"] is not None:
        check_int_at_least("examples", o["examples"], 2)
    check_positive("canary_norm", o["canary_norm"])
    check_choice("bug", o["bug"], BUGS)
    check_choice("init", o["init"], INITS)
    check_choice("accountant", o["accountant"], ACCOUNTANTS)
    if o["relation"] is not None:
        check_choice("relation", o["relation"], RELATIONS)
    check_accountable(o["relation"] or "add-remove", o["accountant"])


def _check_runs_fit(runs: int) -> None:
    """``--runs`` by the memory its scores hold at once (the trainings stream in chunks)."""
    from cbdp_jax._src.infra.sizes import audit_bytes, check_fits

    check_fits("runs", runs, audit_bytes(runs, 1), f"the scores of {runs} runs per side")


def _problem(o: dict[str, Any], given: list[str]) -> tuple[Any, dict]:
    """The problem the options describe and the settings the output records."""
    if o["problem"] is not None:
        return _user_problem(o, given)
    if o["init"] != "default":
        return _crafted_problem(o, given)
    from cbdp_jax._src.training_auditor.setups import build_problem

    worst = o["data"] == "worst-case"
    if worst:
        _refuse(o, given, ("model", "learning_rate"), "data='worst-case'", "its one weight")
    if o["sampler"] != "poisson":
        _refuse(o, given, ("rate",), f"sampler={o['sampler']!r}", "give --batch-size")
    elif not worst:
        _refuse(o, given, ("batch_size",), "sampler='poisson'", "give --rate")
    rate = o["rate"] if o["sampler"] == "poisson" and ("rate" in given or not worst) else None
    built = build_problem(
        model=o["model"], data=o["data"], sampler=o["sampler"], noise=o["noise"], clip=o["clip"],
        rate=rate, batch_size=o["batch_size"], steps=o["steps"], learning_rate=o["learning_rate"],
        threat=o["threat"], step=o["step"], bug=o["bug"], n=o["examples"], seed=o["seed"],
        chunk=o["chunk"], relation=o["relation"], canary_norm=o["canary_norm"],
    )  # fmt: skip
    keys = ("model", "data", "sampler", "noise", "clip", "steps", "learning_rate", "threat")
    setup = {k: o[k] for k in keys} | {"step": o["step"], "bug": o["bug"], "init": "default"}
    if worst:  # the setup's own model and step size
        setup |= {"model": "single-weight", "learning_rate": 1e-6}
    if o["threat"] == "gradient":
        setup["canary_norm"] = built.canary_norm() / o["clip"]
    return built, setup | _shape(built)


def _shape(problem) -> dict:
    import numpy as np

    n = int(np.shape(problem.data[0])[0])
    return {"examples": n, "sampling_rate": problem.sampling_rate, "steps": problem.steps}


def _refuse(o: dict, given: list[str], names: tuple[str, ...], where: str, why: str) -> None:
    """Raises for the first of ``names`` the user set: it does not apply ``where``."""
    for name in names:
        if name in given:
            raise InvalidParameterError(
                f"{name}={o[name]!r} is invalid with {where}: it does not apply ({why})"
            )


def _user_problem(o: dict[str, Any], given: list[str]) -> tuple[Any, dict]:
    """``--problem FILE.py:FACTORY``: the factory's TrainingProblem, with --relation and --chunk."""
    import dataclasses

    from cbdp_jax._src.training_auditor.problem import load_problem

    spec = o["problem"]
    _refuse(o, given, _BUILDERS, f"problem={spec!r}", "the factory's TrainingProblem fixes it")
    built = load_problem(spec)
    changes = {"relation": o["relation"]} if o["relation"] is not None else {}
    if "chunk" in given:
        changes["chunk"] = o["chunk"]
    if changes:
        built = dataclasses.replace(built, **changes)
    setup = {"problem": spec, "name": built.name, "threat": built.threat}
    return built, setup | _shape(built)


def _crafted_problem(o: dict[str, Any], given: list[str]) -> tuple[Any, dict]:
    """``--init worst-case / average-case``: crafted initial parameters (black-box or white-box)."""
    from cbdp_jax._src.training_auditor.crafted_init import crafted_problem

    init = o["init"]
    threat = o["threat"] if "threat" in given else "black-box"
    if threat == "gradient":
        raise InvalidParameterError(
            f"threat='gradient' is invalid with init={init!r}: crafted initial parameters make the "
            "final model's loss on an input canary Gaussian; use --threat black-box (the default "
            "with --init) or white-box"
        )
    why = "crafted starts train dp-sgd with Poisson batches, summed clipped gradients"
    _refuse(o, given, ("batch_size", "step", "bug", "canary_norm"), f"init={init!r}", why)
    if o["sampler"] != "poisson" or o["data"] == "worst-case":
        name = "sampler" if o["sampler"] != "poisson" else "data"
        raise InvalidParameterError(
            f"{name}={o[name]!r} is invalid with init={init!r}: crafted starts take --sampler "
            "poisson and --data digits or synthetic"
        )
    kw = {k: o[k] for k in ("rate", "learning_rate") if k in given}  # else the construction's
    built, report = crafted_problem(
        model=o["model"], data=o["data"], n=o["examples"], init=init, noise=o["noise"],
        steps=o["steps"], clip=o["clip"], threat=threat, relation=o["relation"], seed=o["seed"],
        chunk=o["chunk"], **kw,
    )  # fmt: skip
    setup = {k: o[k] for k in ("model", "data", "sampler", "noise", "clip")} | {
        "threat": threat, "step": "dp-sgd (summed)", "bug": "none", "init": init,
        "learning_rate": kw.get("learning_rate", _crafted_default("learning_rate")),
        "start": report.to_dict(),
    }  # fmt: skip
    return built, setup | _shape(built)


def _crafted_default(name: str) -> Any:
    import inspect

    from cbdp_jax._src.training_auditor.crafted_init import crafted_problem

    return inspect.signature(crafted_problem).parameters[name].default


def _claim_text(problem, o: dict[str, Any], given: list[str]) -> str:
    """``--claim``, or the run's own dpsgd: claim at ``--delta`` under ``--accountant``."""
    from cbdp_jax._src.training_auditor import audit_training as ta

    if o["claim"] is not None:
        _refuse(o, given, ("delta", "accountant"), "--claim", "the claim names its own")
        return o["claim"]
    text = ta.default_claim(problem, o["delta"])
    return text if o["accountant"] == "pld" else f"{text},accountant={o['accountant']}"


def _pair_text(problem, relation: str) -> str:
    """What D and D' are under ``relation``, in words."""
    if relation == "add-remove":
        return "D: the canary in; D': its add-remove neighbour, the canary absent"
    if relation == "zero-out":
        return "D: the canary in; D': its zero-out neighbour, the canary's gradient zeroed"
    index = problem.canary.replaces
    if index is None and problem.canary.kind == "input":
        import numpy as np

        index = int(np.shape(problem.data[0])[0]) - 1
    other = "the opposite canary" if index is None else f"example {index}"
    return f"D: the canary in; D': its replace-one neighbour, {other} in its place"


def _audit_with_progress(key, problem, claim: str, config, runs: int, blocks=None):
    """``training_audit.audit_training`` under a progress line (runs done where it reports them)."""
    from cbdp_jax._src.training_auditor import audit_training as ta

    with Progress("cbdp audit-training", total=2 * runs, unit="runs") as bar:
        hook = progress_hook(ta.audit_training, bar)
        if not hook:  # no count from the library: the bar shows the elapsed time only
            bar.total = None
        return ta.audit_training(key, problem, claim, config=config, checkpoint=blocks, **hook)


def _emit_training_audit(result, problem, training: dict, output_format: str, out) -> None:
    """Writes ``--out`` (report and audit.json with the training's settings) and prints the audit."""
    from cbdp_jax._src.infra.io import to_json

    record = result.to_dict() | {"training": training}
    if out is not None:
        from cbdp_jax._src.mechanism_auditor.report import write_report

        write_report(result, Path(out), extra={"training": training})
    if output_format == "json":
        typer.echo(to_json(record))
        return
    _echo_wrapped(
        f"cbdp audit-training: {problem.name}, {training['examples']} examples + canary, "
        f"{training['steps']} steps, q = {problem.sampling_rate:.4g}, {training['threat']} threat, "
        f"{training['relation']}"
    )
    if "start" in training:
        from cbdp_jax._src.training_auditor.crafted_init import StartReport, describe

        _echo_wrapped(describe(StartReport(**training["start"])))
    _echo_wrapped(
        f"{2 * training['runs_per_side']} trainings and audit: {training['seconds']:.1f} s"
    )
    _emit_audit(result, "table", None, pair=training["pair"])
    beside = ", beside the certified violation" if result.violation else ""
    for spot in result.blind_spots:
        _echo_wrapped(f"blind spot ({spot.kind}){beside}: {spot.message}")
    for defect in getattr(result, "defects", ()):
        _echo_wrapped(f"defect ({defect.kind}): {defect.message}")
