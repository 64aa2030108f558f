"""The ``cbdp`` command line: exact values, estimates, the demo, paper reproductions, reruns.

Every bad input exits with status 2 and one line ``error: <parameter>=<value> is invalid: <range>`` on
stderr, without a traceback.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

# `cbdp rerun` promises bit-identical numbers on the same device: ask XLA for deterministic GPU kernels
# before JAX initialises its backend (importing the package does not initialise it).
from cbdp_jax._src.determinism import request_deterministic_gpu_ops

request_deterministic_gpu_ops()

import typer  # noqa: E402

from cbdp_jax._src.validation import (  # noqa: E402
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_output_folder,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Capacity bounded differential privacy: exact, analytic and learned restricted divergences.",
)

EXACT_ADVERSARIES = ("linear", "poly", "unrestricted")
ESTIMATE_MECHANISMS = ("laplace", "gaussian", "randomized_response", "nonprivate")
FORMATS = ("table", "json")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


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

    from cbdp_jax._src.tables import render_record

    typer.echo(render_record(title, fields, Console().width).rstrip("\n"))


def _echo_wrapped(text: str, err: bool = False) -> None:
    """A line of prose wrapped at the terminal's width (continuation lines indented by two)."""
    import textwrap

    from rich.console import Console

    width = max(Console().width, 40)
    typer.echo(textwrap.fill(text, width, subsequent_indent="  ", break_on_hyphens=False), err=err)


def _noise_pair(
    mechanism: str,
    epsilon: float | None,
    sigma: float | None,
    sensitivity,
    sampling_rate: float | None = None,
    direction: str = "remove",
):
    from cbdp_jax import exact

    check_choice("mechanism", mechanism, ("laplace", "gaussian", "subsampled-gaussian"))
    sens = 1.0 if sensitivity is None else sensitivity
    if mechanism != "subsampled-gaussian" and sampling_rate is not None:
        raise InvalidParameterError(
            f"sampling_rate={sampling_rate!r} is invalid for mechanism {mechanism!r}: only "
            "'subsampled-gaussian' takes --sampling-rate"
        )
    if mechanism == "laplace":
        if sigma is not None:
            raise InvalidParameterError(
                f"sigma={sigma!r} is invalid for mechanism 'laplace': it takes --epsilon, --sensitivity"
            )
        return exact.laplace_pair(1.0 if epsilon is None else epsilon, sens)
    if epsilon is not None:
        raise InvalidParameterError(
            f"epsilon={epsilon!r} is invalid for mechanism {mechanism!r}: it takes --sigma, "
            "--sensitivity"
        )
    if mechanism == "subsampled-gaussian":
        if sampling_rate is None:
            raise InvalidParameterError(
                "sampling_rate=None is invalid for mechanism 'subsampled-gaussian': give "
                "--sampling-rate q in (0, 1]"
            )
        s = 1.0 if sigma is None else sigma
        return exact.subsampled_gaussian_pair(s, sampling_rate, sens, direction)
    return exact.gaussian_pair(1.0 if sigma is None else sigma, sens)


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
    from cbdp_jax._src.adversaries import ADVERSARY_NAMES, ADVERSARY_OPTIONS

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


@app.command("exact")
def exact_cmd(
    mechanism: Annotated[
        str, typer.Option(help="laplace, gaussian or subsampled-gaussian")
    ] = "laplace",
    epsilon: Annotated[float | None, typer.Option(help="Laplace: noise scale 1/epsilon")] = None,
    sigma: Annotated[float | None, typer.Option(help="Gaussian: noise standard deviation")] = None,
    sensitivity: Annotated[
        str | None, typer.Option(help="per-coordinate shift, e.g. 1,0.5")
    ] = None,
    sampling_rate: Annotated[
        float | None, typer.Option(help="subsampled-gaussian: Poisson sampling rate q")
    ] = None,
    direction: Annotated[
        str, typer.Option(help="subsampled-gaussian: remove (P is the mixture) or add")
    ] = "remove",
    adversary: Annotated[str, typer.Option(help="linear, poly or unrestricted")] = "linear",
    degree: Annotated[
        int | None, typer.Option(help="polynomial degree for --adversary poly (default 2)")
    ] = None,
    divergence: Annotated[str, typer.Option(help="kl, renyi, tv, hellinger, chi2, js")] = "kl",
    alpha: Annotated[float | None, typer.Option(help="Renyi order, > 1")] = None,
    convention: Annotated[str, typer.Option(help="abs (paper) or nonneg")] = "abs",
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
) -> None:
    """Exact restricted (or unrestricted) divergence by quadrature and a concave solver."""
    from cbdp_jax import exact
    from cbdp_jax._src.io import to_json

    check_choice("format", output_format, FORMATS)
    check_choice("adversary", adversary, EXACT_ADVERSARIES)
    check_choice("divergence", divergence, ("kl", "renyi", "tv", "hellinger", "chi2", "js"))
    if degree is not None and adversary != "poly":
        raise InvalidParameterError(
            f"degree={degree!r} is invalid for adversary {adversary!r}: only --adversary poly takes "
            "--degree"
        )
    degree = 2 if degree is None else check_int_at_least("degree", degree, 1)
    sens = _parse_sensitivity(sensitivity)
    pair = _noise_pair(mechanism, epsilon, sigma, sens, sampling_rate, direction)
    t0 = time.perf_counter()
    if adversary == "unrestricted":
        value = float(exact.unrestricted_divergence(pair, divergence, alpha=alpha))
        extra: dict[str, Any] = {"converged": True, "reason": None}
    else:
        res = exact.restricted_divergence(
            pair,
            divergence,
            adversary,
            degree=degree if adversary == "poly" else 1,
            alpha=alpha,
            convention=convention,
        )
        value = float(res.value)
        extra = {
            "converged": bool(res.converged),
            "reason": res.reason,
            "newton_decrement": res.newton_decrement,
            "gradient_norm": res.gradient_norm,
            "monotone_checked": res.monotone_checked,
            "previous_value": res.previous_value,
            "theta": [float(t) for t in res.theta] if res.theta is not None else None,
        }
    record = {
        "value": value,
        "divergence": divergence,
        "alpha": alpha,
        "adversary": adversary if adversary != "poly" else f"poly_{degree}",
        "degree": degree if adversary == "poly" else None,
        "mechanism": mechanism,
        "epsilon": (1.0 if epsilon is None else epsilon) if mechanism == "laplace" else None,
        "sigma": (1.0 if sigma is None else sigma) if mechanism != "laplace" else None,
        "sampling_rate": sampling_rate,
        "sensitivity": list(sens) if sens is not None else [1.0],
        "convention": convention,
        **extra,
        "seconds": time.perf_counter() - t0,
    }
    if output_format == "json":
        typer.echo(to_json(record))
    else:
        # Fields that do not apply (None: sigma for Laplace, alpha for KL, no reason) and the solver's
        # internals (--format json has them) are left out.
        hidden = ("theta", "newton_decrement", "gradient_norm", "previous_value")
        shown = [(k, v) for k, v in record.items() if v is not None and k not in hidden]
        _print_record("cbdp exact", shown)


@app.command("calibrate")
def calibrate_cmd(
    mechanism: Annotated[
        str, typer.Option(help="laplace, gaussian or subsampled-gaussian")
    ] = "gaussian",
    target: Annotated[float, typer.Option(help="the target privacy loss, > 0")] = 1.0,
    adversary: Annotated[str, typer.Option(help="linear, poly or unrestricted")] = "linear",
    degree: Annotated[int, typer.Option(help="polynomial degree for --adversary poly")] = 1,
    divergence: Annotated[str, typer.Option(help="kl or renyi")] = "renyi",
    alpha: Annotated[float | None, typer.Option(help="Renyi order, > 1")] = None,
    sensitivity: Annotated[float, typer.Option(help="the shift v (clipping norm), > 0")] = 1.0,
    sampling_rate: Annotated[
        float | None, typer.Option(help="subsampled-gaussian: Poisson sampling rate q")
    ] = None,
    steps: Annotated[int, typer.Option(help="T non-adaptive steps composed")] = 1,
    direction: Annotated[
        str, typer.Option(help="subsampled-gaussian: remove (P is the mixture) or add")
    ] = "remove",
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
) -> None:
    """The least noise whose exact restricted privacy loss meets the target, beside the unrestricted."""
    from cbdp_jax._src.io import to_json
    from cbdp_jax.calibration import calibrate

    check_choice("format", output_format, FORMATS)
    check_choice("mechanism", mechanism, ("laplace", "gaussian", "subsampled-gaussian"))
    family = mechanism.replace("-", "_")
    if family == "subsampled_gaussian" and sampling_rate is None:
        raise InvalidParameterError(
            "sampling_rate=None is invalid for mechanism 'subsampled-gaussian': give "
            "--sampling-rate q in (0, 1]"
        )
    t0 = time.perf_counter()
    res = calibrate(
        family,
        target,
        adversary,
        divergence,
        alpha=alpha,
        degree=degree,
        sensitivity=sensitivity,
        sampling_rate=sampling_rate,
        steps=steps,
        direction=direction,
    )
    record = {**res.to_dict(), "seconds": time.perf_counter() - t0}
    record["mechanism"] = mechanism
    if output_format == "json":
        typer.echo(to_json(record))
        return
    name = res.calibration.parameter
    columns = ["adversary", "divergence", "target", name, f"unrestricted_{name}", "noise_saved"]
    _print_record("cbdp calibrate", [(k, record[k]) for k in columns])


def _make_mechanism(mechanism: str, epsilon, sigma, sensitivity, k: int):
    from cbdp_jax.mechanisms import make_mechanism

    check_choice("mechanism", mechanism, ESTIMATE_MECHANISMS)
    takes = {
        "laplace": ("epsilon", "sensitivity"),
        "gaussian": ("sigma", "sensitivity"),
        "randomized_response": ("epsilon", "k"),
        "nonprivate": ("sensitivity",),
    }[mechanism]
    given = {"epsilon": epsilon, "sigma": sigma, "sensitivity": sensitivity, "k": k}
    for option, value in given.items():
        if value is not None and option not in takes:
            raise InvalidParameterError(
                f"{option}={value!r} is invalid for mechanism {mechanism!r}: it takes "
                + ", ".join(f"--{t}" for t in takes)
            )
    params: dict[str, Any] = {}
    if mechanism in ("laplace", "randomized_response"):
        params["epsilon"] = 1.0 if epsilon is None else epsilon
    if mechanism == "gaussian":
        params["sigma"] = 1.0 if sigma is None else sigma
    if mechanism in ("laplace", "gaussian") and sensitivity is not None:
        params["sensitivity"] = sensitivity
    if mechanism == "randomized_response":
        params["k"] = 2 if k is None else k
    if mechanism == "nonprivate":
        if sensitivity is None:
            params["dim"] = 1
        else:
            params["sensitivity"] = sensitivity
    return make_mechanism(mechanism, **params), params


def run_estimate(args: dict[str, Any], *, progress: bool = False):
    """Runs ``cbdp estimate`` from a plain dict of its arguments (also used by ``cbdp rerun``)."""
    import jax

    from cbdp_jax._src import keys, programs
    from cbdp_jax.estimator import EstimatorConfig, estimate

    sens = args.get("sensitivity")
    mech = None
    if args.get("p_samples") is None:
        mech, _ = _make_mechanism(
            args["mechanism"], args.get("epsilon"), args.get("sigma"), sens, args.get("k")
        )
    options = {
        k: args[k]
        for k in ("width", "depth", "degree", "features", "bandwidth", "bound")
        if args.get(k) is not None
    }
    _check_adversary_flags(args["adversary"], options)
    bar = None
    # Budget settings not given come from the library's rule (estimator.default_budget), resolved
    # once the number of training samples is known; the result records what ran.
    patience = args.get("patience")
    cfg_kwargs = dict(
        steps=_or_auto(args["steps"]),
        ensemble=_or_auto(args["ensemble"]),
        batch_size=_or_auto(args["batch_size"]),
        learning_rate=args["learning_rate"],
        confidence=args["confidence"],
        both_directions=args["both_directions"],
        guarantee=args.get("guarantee", "auto"),
        input_map=args.get("input_map", "auto"),
        target=args.get("target"),
        dtype=args["dtype"],
        patience="auto" if patience is None else (None if patience == 0 else patience),
    )
    if args["dtype"] == "float64":
        jax.config.update("jax_enable_x64", True)
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("training adversaries", total=None)
        cfg_kwargs["progress"] = _ProgressHook(bar, task)
        bar.start()
    try:
        config = EstimatorConfig(**cfg_kwargs)
        # Every CLI call is a cold start: run the compiled programs a previous process stored.
        if mech is None:
            return programs.run(_estimate_from_files, args, config, options)
        result = programs.run(
            lambda: estimate(
                keys.from_seed(args["seed"]),
                mech,
                samples=args["samples"],
                test_samples=args.get("test_samples"),
                adversary=args["adversary"],
                divergence=args["divergence"],
                alpha=args.get("alpha"),
                config=config,
                **options,
            )
        )
    finally:
        if bar is not None:
            bar.stop()
    return result


def _estimate_from_files(args: dict[str, Any], config, options: dict[str, Any]):

    from cbdp_jax._src import keys
    from cbdp_jax._src.audit_io import load_samples
    from cbdp_jax.estimator import estimate_from_samples

    p = load_samples("p_samples", args["p_samples"])
    q = load_samples("q_samples", args["q_samples"])
    if p.shape[1] != q.shape[1]:
        raise InvalidParameterError(
            f"q_samples={args['q_samples']!r} is invalid: its rows have {q.shape[1]} values, "
            f"those of p_samples {p.shape[1]}"
        )
    return estimate_from_samples(
        keys.from_seed(args["seed"]),
        p,
        q,
        adversary=args["adversary"],
        divergence=args["divergence"],
        alpha=args.get("alpha"),
        config=config,
        **options,
    )


def _or_auto(value):
    """A budget option: the value given, or 'auto' (the library's rule) when not given."""
    return "auto" if value is None else value


class _ProgressHook:
    """A host callback showing a training run's steps done and total on a rich progress bar.

    The bar's default columns include the time remaining; each training run (a direction) restarts it.
    """

    def __init__(self, bar, task):
        self.bar, self.task = bar, task

    def __call__(self, info) -> None:
        self.bar.update(self.task, completed=info.step, total=info.steps)


_OPTION_KEYS = ("width", "depth", "degree", "features", "bandwidth", "bound")


def _mechanism_label(args: dict[str, Any], params: dict[str, Any]) -> str:
    """E.g. ``'laplace eps=1, sensitivity 1'`` or ``'randomized_response eps=1, k=2'``."""
    parts = []
    if "epsilon" in params:
        parts.append(f"eps={params['epsilon']:g}")
    if "sigma" in params:
        parts.append(f"sigma={params['sigma']:g}")
    if "k" in params:
        parts.append(f"k={params['k']}")
    if args["mechanism"] in ("laplace", "gaussian", "nonprivate"):
        sens = params.get("sensitivity") or (1.0,)
        parts.append("sensitivity " + ",".join(f"{v:g}" for v in sens))
    return f"{args['mechanism']} " + ", ".join(parts)


def reference_of(result, args: dict[str, Any], params: dict[str, Any], *, exact_allowed=True):
    """The known value an estimate is compared with (exact restricted, or unrestricted), or None.

    ``exact_allowed=False``: the unrestricted value (for a bound that is not on the named class).
    """
    from cbdp_jax._src.adversaries import make_adversary
    from cbdp_jax._src.reference import reference_for

    spec = make_adversary(args["adversary"], **{k: args.get(k) for k in _OPTION_KEYS})
    return reference_for(
        args["mechanism"],
        params,
        spec,
        args["divergence"],
        args.get("alpha"),
        result.divergence,
        exact_allowed=exact_allowed,
    )


def _references(result, args: dict[str, Any], params: dict[str, Any]) -> tuple[Any, Any]:
    """``(reference beside the bound, reference beside the estimate)``.

    The same value unless the bound is not on the named class (``B tanh(H / B)``): the bound is then
    shown beside the unrestricted divergence and the estimate beside the exact value of H.
    """
    reference = reference_of(result, args, params)
    if result.bound_on_named_class or reference is None or reference.kind != "exact restricted":
        return reference, None
    return reference_of(result, args, params, exact_allowed=False), reference


def _result_record(result, args: dict[str, Any]) -> dict[str, Any]:
    if args.get("p_samples") is not None:
        rec = result.to_dict()
        rec.update(samples=args["samples"], sample_counts=result.samples, cli_args=args)
        rec["mechanism"] = "samples"
        rec["mechanism_label"] = f"samples {args['p_samples']} vs {args['q_samples']}"
        rec["reference"] = None
        rec["estimate_reference"] = None
        return rec
    _, params = _make_mechanism(
        args["mechanism"],
        args.get("epsilon"),
        args.get("sigma"),
        args.get("sensitivity"),
        args.get("k"),
    )
    reference, estimate_reference = _references(result, args, params)
    rec = result.to_dict()
    rec["samples"] = args["samples"]
    rec["sample_counts"] = result.samples
    rec["cli_args"] = args
    rec["mechanism"] = args["mechanism"]
    rec["mechanism_label"] = _mechanism_label(args, params)
    rec["reference"] = None if reference is None else reference.to_dict()
    rec["estimate_reference"] = None if estimate_reference is None else estimate_reference.to_dict()
    return rec


def curve_values(record: dict[str, Any]) -> dict[str, Any]:
    """What ``curve.png`` draws, from a result record: the values of its horizontal lines and curves."""
    curves = record.get("curves") or {}
    reference = record.get("reference")
    return {
        "title": f"{record['mechanism_label']}: {record['adversary']}, {record['divergence']}",
        "estimate": record["estimate"],
        "lower_bound": record["lower_bound"],
        "confidence": record["confidence"],
        "reference": None if reference is None else reference["value"],
        "reference_label": None if reference is None else reference["label"],
        "steps": curves.get("block_step", []),
        "val_objective": curves.get("val_objective", []),
        "train_objective": curves.get("train_objective", []),
        "objective": record.get("objective"),
    }


def _plot_curve(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """Writes curve.png and returns what it drew (:func:`curve_values`).

    Top: the held-out estimate, its lower bound and the reference value (exact restricted, or the
    unrestricted ceiling) as lines over the training steps; bottom: the training and validation
    objectives of the selected adversary.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cbdp_jax._src.io import atomic_savefig

    v = curve_values(record)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 5.4), sharex=True)
    steps = v["steps"] or [0, 1]
    span = [steps[0], steps[-1]]
    top.plot(span, [v["estimate"]] * 2, "C0-", lw=2, label=f"held-out estimate {v['estimate']:.4g}")
    top.plot(span, [v["lower_bound"]] * 2, "C0--", lw=1.5,
             label=f"{v['confidence']:.0%} lower bound {v['lower_bound']:.4g}")  # fmt: skip
    if v["reference"] is not None:
        top.plot(span, [v["reference"]] * 2, "k:", lw=1.5, label=v["reference_label"])
    top.set_ylabel(record["divergence"])
    top.legend(fontsize=7, loc="lower right")
    top.set_title(v["title"], fontsize=9)
    if v["val_objective"]:
        bottom.plot(v["steps"], v["train_objective"], "C1-", label="training objective")
        bottom.plot(v["steps"], v["val_objective"], "C2-", label="validation objective")
        bottom.legend(fontsize=7)
    bottom.set_xlabel("optimiser step")
    bottom.set_ylabel(f"objective ({v['objective']})")
    atomic_savefig(fig, path, bbox_inches="tight")
    plt.close(fig)
    return v


@app.command("estimate")
def estimate_cmd(
    ctx: typer.Context,
    mechanism: Annotated[str, typer.Option(help=", ".join(ESTIMATE_MECHANISMS))] = "laplace",
    epsilon: Annotated[float | None, typer.Option(help="Laplace / randomized response")] = None,
    sigma: Annotated[float | None, typer.Option(help="Gaussian noise std")] = None,
    sensitivity: Annotated[
        str | None, typer.Option(help="per-coordinate shift, e.g. 1,0.5")
    ] = None,
    k: Annotated[
        int | None, typer.Option(help="randomized response categories (default 2)")
    ] = None,
    adversary: Annotated[str, typer.Option(help="linear, poly, mlp, relu2, rff")] = "mlp",
    width: Annotated[int | None, typer.Option(help="hidden width (mlp, relu2)")] = None,
    depth: Annotated[int | None, typer.Option(help="hidden layers (mlp)")] = None,
    degree: Annotated[int | None, typer.Option(help="polynomial degree (poly)")] = None,
    features: Annotated[int | None, typer.Option(help="random features (rff)")] = None,
    bound: Annotated[float | None, typer.Option(help="wrap as bound*tanh(h)")] = None,
    divergence: Annotated[
        str, typer.Option(help="kl, renyi, alpha, chi2, tv, hellinger, js")
    ] = "kl",
    alpha: Annotated[float | None, typer.Option(help="Renyi order, > 1")] = None,
    samples: Annotated[int, typer.Option(help="training samples per side")] = 100_000,
    test_samples: Annotated[int | None, typer.Option(help="held-out samples per side")] = None,
    steps: Annotated[int | None, typer.Option(help="optimiser steps (default: by size)")] = None,
    patience: Annotated[
        int | None,
        typer.Option(
            help="stop once every adversary has gone this many validation checks without a new "
            "best; 0 trains all steps (default: by size)"
        ),
    ] = None,
    ensemble: Annotated[int | None, typer.Option(help="adversaries (default: by size)")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="minibatch/side (default: by size)")
    ] = None,
    learning_rate: Annotated[float, typer.Option(help="Adam step size")] = 1e-2,
    confidence: Annotated[float, typer.Option(help="level of the lower bound")] = 0.95,
    both_directions: Annotated[bool, typer.Option(help="also D(Q,P); report the max")] = False,
    guarantee: Annotated[
        str,
        typer.Option(
            help="kind of lower bound: finite-sample (no assumption; the critic is bounded, "
            "B*tanh(h/B), B chosen on validation data: a bound on that class), asymptotic (CLT "
            "on the class itself, refused when the held-out tails look too heavy), class (a bound "
            "on the class itself: finite-sample if it is bounded, else asymptotic), or auto "
            "(class, falling back to finite-sample when the validation tails are too heavy)"
        ),
    ] = "auto",
    input_map: Annotated[
        str,
        typer.Option(
            help="the critic's input map, fitted on training samples: standard, robust (asinh of "
            "median/IQR-scaled x), rank (training ECDF) or auto (standard unless outliers set the "
            "spread; then the three race on validation data and the leader is trained in full)"
        ),
    ] = "auto",
    target: Annotated[
        float | None,
        typer.Option(
            help="sequential mode: stop drawing held-out samples once the finite-sample bound "
            "reaches this value (anytime-valid); --test-samples is the budget"
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    out: Annotated[Path | None, typer.Option(help="folder for result.json and curve.png")] = None,
    p_samples: Annotated[
        Path | None,
        typer.Option(help="outputs of M(D) produced elsewhere (.npy, .npz or .csv), [n] or [n, d]"),
    ] = None,
    q_samples: Annotated[
        Path | None, typer.Option(help="outputs of M(D') (.npy, .npz or .csv), with --p-samples")
    ] = None,
) -> None:
    """Estimate capacity-bounded privacy by training adversaries; report a held-out lower bound.

    The result names the kind of its bound (finite-sample or asymptotic) and what it bounds. With
    --p-samples and --q-samples the samples come from files and no mechanism is run.

    The compiled programs are kept in the cache folder, so the next call with the same shapes starts
    without compiling (CBDP_JAX_PROGRAM_CACHE=0 turns that off).
    """
    check_choice("format", output_format, FORMATS)
    if out is not None:
        check_output_folder("out", out)
    args = dict(
        mechanism=mechanism, epsilon=epsilon, sigma=sigma,
        sensitivity=_parse_sensitivity(sensitivity), k=k, adversary=adversary, width=width,
        depth=depth, degree=degree, features=features, bound=bound, divergence=divergence,
        alpha=alpha, samples=samples, test_samples=test_samples, steps=steps, ensemble=ensemble,
        batch_size=batch_size, learning_rate=learning_rate, confidence=confidence,
        both_directions=both_directions, guarantee=guarantee, target=target, dtype=dtype, seed=seed,
        input_map=input_map, patience=patience,
    )  # fmt: skip
    if p_samples is not None or q_samples is not None:
        args.update(p_samples=_path_or_none(p_samples), q_samples=_path_or_none(q_samples))
        _check_sample_files(args, _given(ctx, ("mechanism", "samples", "test_samples")))
    result = run_estimate(args, progress=output_format == "table" and sys.stderr.isatty())
    _emit(result, args, output_format, out)


def _path_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` the user set (on the command line or in the environment)."""
    # compared by name: typer may vendor click, so the enum's module varies between versions
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return [
        n
        for n, src in sources.items()
        if getattr(src, "name", "") in ("COMMANDLINE", "ENVIRONMENT")
    ]


def _check_sample_files(args: dict[str, Any], given: list[str] = ()) -> None:
    """Both sample files, and no mechanism parameter or sample size beside them.

    ``given``: options the user set whose defaults would otherwise hide them (``--samples``,
    ``--test-samples``, ``--mechanism``): the files fix the samples, so they do not apply.
    """
    for option in given:
        raise InvalidParameterError(
            f"{option}={args[option]!r} is invalid with --p-samples: the files hold the samples "
            "(split into train / validation / test), no mechanism is run"
        )
    for name in ("p_samples", "q_samples"):
        if args.get(name) is None:
            other = "q_samples" if name == "p_samples" else "p_samples"
            raise InvalidParameterError(
                f"{name}=None is invalid: must be given with --{other.replace('_', '-')}"
            )
    for option in ("epsilon", "sigma", "sensitivity", "k"):
        if args.get(option) is not None:
            raise InvalidParameterError(
                f"{option}={args[option]!r} is invalid with --p-samples: the samples come from "
                "files, no mechanism is run"
            )


def _emit(
    result, args, output_format: str, out: Path | None, title: str = "cbdp estimate (held-out)"
) -> None:
    from cbdp_jax._src.io import atomic_write_json, to_json

    record = _result_record(result, args)
    if out is not None:
        atomic_write_json(Path(out) / "result.json", record)
        if result.curves:
            _plot_curve(record, Path(out) / "curve.png")
    if output_format == "json":
        typer.echo(to_json(record))
        return
    _print_record(title, _estimate_fields(record))
    _echo_wrapped(f"lower bound: {result.guarantee} ({result.bound_method}) on {result.bounds}")
    _echo_wrapped(f"assumption: {result.assumption}")
    if result.guarantee_choice:
        _echo_wrapped(f"guarantee: {result.guarantee_choice}")
    if result.input_map != "standard" or " trained" in result.input_map_choice:
        _echo_wrapped(f"input map: {result.input_map} ({result.input_map_choice})")
    if not result.bound_reliable and result.refusal:
        typer.echo(f"bound refused: {result.refusal}", err=True)
    for w in result.warnings:
        typer.echo(f"warning: {w}", err=True)


def _estimate_fields(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """The fields of an estimate's table (``--format json`` has every field)."""
    counts = record["sample_counts"]
    fields = [
        ("mechanism", record["mechanism_label"]),
        ("adversary", record["adversary"]),
        ("divergence", record["divergence"]),
        ("estimate", record["estimate"]),
        ("lower_bound", record["lower_bound"]),
        ("bound on class", record.get("certified_class")),
        ("bounds D^H of named", record.get("bound_on_named_class")),
        ("guarantee", record.get("guarantee")),
        ("confidence", record["confidence"]),
        ("std_error", record["std_error"]),
        ("bound_reliable", record["bound_reliable"]),
    ]
    if record.get("max_estimate") is not None:
        fields += [
            ("max_estimate", record["max_estimate"]),
            ("max_lower_bound", record["max_lower_bound"]),
        ]
    reference = record.get("reference")
    if reference is not None:
        fields.append((reference["kind"], reference["value"]))
    estimate_reference = record.get("estimate_reference")
    if estimate_reference is not None:
        fields.append((f"{estimate_reference['kind']} (estimate)", estimate_reference["value"]))
    fields += [
        ("train samples", [counts["train_p"], counts["train_q"]]),
        ("validation", [counts["val_p"], counts["val_q"]]),
        ("test samples", [counts["test_p"], counts["test_q"]]),
        ("device", record["device"]),
        ("seconds", record["seconds"]),
    ]
    return fields


@app.command("audit")
def audit_cmd(
    mechanism: Annotated[
        str | None,
        typer.Argument(
            help="FILE.py:FUNCTION or MODULE:FUNCTION; the function takes (key or numpy "
            "Generator, dataset, n) and returns n outputs"
        ),
    ] = None,
    claim: Annotated[
        str | None,
        typer.Option(help="the claim to check; its forms are listed above"),
    ] = None,
    d: Annotated[str | None, typer.Option("--d", help="dataset D as JSON, e.g. [0,1,1]")] = None,
    d_prime: Annotated[str | None, typer.Option("--d-prime", help="neighbour D' as JSON")] = None,
    space: Annotated[
        str | None,
        typer.Option(
            help='dataset space to search as JSON: {"shape": [5], "low": 0, "high": 1, '
            '"integer": false, "relation": "replace-one" | "zero-out" | "linf", "radius": 1}'
        ),
    ] = None,
    pairs: Annotated[
        str | None,
        typer.Option(help="FILE.py:FUNCTION returning candidate pairs (D, D') to screen"),
    ] = None,
    samples: Annotated[
        int, typer.Option(help="fresh certification samples per side for the chosen pair")
    ] = 1_000_000,
    screen_samples: Annotated[
        int, typer.Option(help="samples per side per screened pair")
    ] = 20_000,
    random_pairs: Annotated[int, typer.Option(help="random candidates from --space")] = 12,
    local_steps: Annotated[int, typer.Option(help="local-search moves from the best")] = 12,
    gradient_steps: Annotated[
        int,
        typer.Option(help="then gradient ascent on the datasets (differentiable JAX mechanisms)"),
    ] = 0,
    classes: Annotated[
        str,
        typer.Option(
            help="critic classes, comma-separated: halfspace, linear, poly, mlp, histogram, "
            "bounded-mlp"
        ),
    ] = "linear,poly,mlp,histogram",
    confidence: Annotated[float, typer.Option(help="family-wise level")] = 0.95,
    suite: Annotated[
        bool, typer.Option(help="audit the built-in suite of flawed and correct mechanisms")
    ] = False,
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    out: Annotated[Path | None, typer.Option(help="folder for audit.json and report.png")] = None,
) -> None:
    """Audit a mechanism's privacy claim: search a worst pair, certify it on fresh samples.

    A violation is reported only when a certified (family-wise) lower bound exceeds the claim;
    otherwise the strongest certified bound and what the audit could have detected. Pure and
    approximate claims also report the empirical epsilon (the largest eps the certified curve
    refutes) and GDP mu. A capacity claim on class H is checked only with bounds on H itself.

    Claims (--claim): pure:EPS (pure eps-DP), approx:EPS:DELTA ((eps, delta)-DP), renyi:ALPHA:EPS
    (Renyi DP of order ALPHA), capacity:CLASS:kl:VALUE or capacity:CLASS:renyi:ALPHA:VALUE (the
    restricted divergence of CLASS = linear, poly, mlp or bounded-mlp is at most VALUE).

    DP-SGD claims: dpsgd:noise=S,rate=Q,steps=T,delta=D, optionally followed by ,sampling=poisson (or
    shuffle, or fixed): the (eps, delta) the run's accountant reports (dp_accounting's PLD accountant,
    Poisson-subsampled Gaussian).

    Exit status: 0 when no violation is certified, 1 when a violation is certified, 2 for bad input.
    """
    from cbdp_jax._src import audit as au
    from cbdp_jax._src.io import to_json

    check_choice("format", output_format, FORMATS)
    if out is not None:
        check_output_folder("out", out)
    config = au.AuditConfig(
        samples=samples, screen_samples=screen_samples, random_pairs=random_pairs,
        local_steps=local_steps, classes=_parse_classes(classes), confidence=confidence,
        gradient_steps=gradient_steps,
    )  # fmt: skip
    if suite:
        return _audit_suite(config, seed, output_format, out)
    result = _audit_one(mechanism, claim, (d, d_prime, space, pairs), config, seed)
    _emit_audit(result, output_format, out)
    if output_format == "json":
        typer.echo(to_json(result.to_dict()))
    if result.violation:
        raise typer.Exit(1)  # a script can tell: 1 = violation certified (0 = none, 2 = bad input)


def _audit_one(mechanism, claim, where, config, seed):
    """Audits one user mechanism: checks the arguments, finds or takes the pair, certifies."""
    import jax

    from cbdp_jax._src import audit as au

    if mechanism is None:
        raise InvalidParameterError(
            "mechanism=None is invalid: give FILE.py:FUNCTION or MODULE:FUNCTION, or --suite"
        )
    if claim is None:
        raise InvalidParameterError("claim=None is invalid: must be given, e.g. --claim pure:1")
    parsed = au.parse_claim(claim)
    mech = au.load_mechanism(mechanism)
    pair, space_obj, candidates = _audit_pairs(*where)
    return au.audit(
        jax.random.key(seed), mech, parsed, pair=pair, space=space_obj, candidates=candidates,
        config=config,
    )  # fmt: skip


def _parse_classes(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    allowed = ("linear", "halfspace", "poly", "mlp", "histogram", "bounded-mlp")
    for name in names or ("",):
        check_choice("classes", name, allowed)
    return names


def _audit_pairs(d, d_prime, space, pairs):
    """The given pair, or the space and candidates to search."""
    from cbdp_jax._src import audit as au
    from cbdp_jax._src.audit_io import load_mechanism, parse_dataset

    if (d is None) != (d_prime is None):
        missing = "d_prime" if d_prime is None else "d"
        raise InvalidParameterError(f"{missing}=None is invalid: --d and --d-prime go together")
    if d is not None:
        return (parse_dataset("d", d), parse_dataset("d_prime", d_prime)), None, None
    space_obj = None
    if space is not None:
        try:
            spec = json.loads(space)
            missing = [k for k in ("shape", "low", "high") if k not in spec]
            if missing:
                raise InvalidParameterError(
                    f"space={space!r} is invalid: must give {', '.join(missing)} (the datasets' "
                    "shape and the range [low, high] of their entries; no range is assumed)"
                )
            space_obj = au.DatasetSpace(**spec)
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise InvalidParameterError(
                f"space={space!r} is invalid: must be a JSON object with keys shape, low, high, "
                f"integer, relation, radius ({exc})"
            ) from exc
    candidates = None
    if pairs is not None:
        gen = load_mechanism(pairs).fn
        try:
            candidates = [tuple(c) for c in gen()]
        except Exception as exc:  # noqa: BLE001 - report against the generator
            raise InvalidParameterError(
                f"pairs={pairs!r} is invalid: calling it failed or did not give pairs ({exc})"
            ) from exc
        if not candidates or any(len(c) != 2 for c in candidates):
            raise InvalidParameterError(
                f"pairs={pairs!r} is invalid: must return a non-empty iterable of (D, D') pairs"
            )
    if space_obj is None and candidates is None:
        raise InvalidParameterError(
            "d=None is invalid: give --d and --d-prime, or --space / --pairs to search"
        )
    return None, space_obj, candidates


def _emit_audit(result, output_format: str, out: Path | None) -> None:
    if out is not None:
        from cbdp_jax._src.audit_report import write_report

        write_report(result, Path(out))
    if output_format == "json":
        return
    typer.echo(f"cbdp audit: {result.mechanism}, claim {result.claim}")
    typer.echo(f"pair: D = {_rounded(result.pair[0])}, D' = {_rounded(result.pair[1])}")
    typer.echo(f"{'class':<22} {'dir':<5} {result.grid_name:>8} {'claimed':>10} {'certified':>10}")
    for r in result.rows:
        typer.echo(
            f"{r.critic[:22]:<22} {r.direction:<5} {r.grid:>8.3g} {r.claimed:>10.4g} "
            f"{r.lower_bound:>10.4g}" + ("  VIOLATION" if r.violation else "")
        )
    notes = dict.fromkeys(r.note for r in result.rows if r.note)
    for note in notes:
        _echo_wrapped(f"note: {note}")
    _echo_wrapped(result.verdict)


def _rounded(x) -> list:
    import numpy as np

    return np.round(np.asarray(x, np.float64), 3).tolist()


def _audit_suite(config, seed: int, output_format: str, out: Path | None) -> None:
    import jax

    from cbdp_jax._src import audit as au
    from cbdp_jax._src.audit_suite import SUITE, as_arrays
    from cbdp_jax._src.io import to_json

    records = []
    for i, case in enumerate(SUITE):
        result = au.audit(
            jax.random.fold_in(jax.random.key(seed), i), au.load_mechanism(case.fn, case.name),
            case.claim, space=case.space, candidates=[as_arrays(case.paper_pair)], config=config,
        )  # fmt: skip
        rec = result.to_dict() | {"flawed": case.flawed, "beyond_sampling": case.beyond_sampling}
        records.append(rec)
        if out is not None:
            _emit_audit(result, "json", Path(out) / case.name)
        if output_format == "table":
            flag = "VIOLATION" if result.violation else "no violation"
            best = result.strongest()
            typer.echo(
                f"{case.name:<28} flawed={case.flawed!s:<5} {flag:<13} "
                f"certified {best.lower_bound:.4g} vs {best.claimed:.4g}  {result.seconds:.0f} s"
            )
    if output_format == "json":
        typer.echo(to_json({"suite": records}))


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
    typer.echo(
        f"cbdp audit-training: {problem.name}, {problem.examples - 1} examples + canary, "
        f"{training['steps']} steps, q = {problem.sampling_rate:.4g}, {training['threat']} threat"
    )
    typer.echo(
        f"{2 * training['runs_per_side']} trainings (D: canary in, D': canary zeroed) and audit: "
        f"{training['seconds']:.1f} s"
    )
    _emit_audit(result, "table", None)


@app.command("audit-training")
def audit_training_cmd(
    model: Annotated[
        str, typer.Option(help="logreg or mlp (2 layers, 32 hidden units)")
    ] = "logreg",
    data: Annotated[
        str,
        typer.Option(
            help="digits (scikit-learn's bundled 8x8 digits), synthetic, or worst-case (Chua et "
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

    check_choice("format", output_format, FORMATS)
    check_int_at_least("runs", runs, 100)
    if out is not None:
        check_output_folder("out", out)
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
    result = ta.audit_training(jax.random.key(seed), problem, text, config=config)
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


@app.command("rerun")
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
    from cbdp_jax._src.io import to_json

    a, b = _canonical(stored), _canonical(json.loads(to_json(new)))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


@app.command("demo")
def demo_cmd(
    samples: Annotated[int, typer.Option(help="training (and test) samples per side")] = 100_000,
    steps: Annotated[int, typer.Option(help="optimiser steps per class")] = 1000,
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    out: Annotated[Path | None, typer.Option(help="folder for demo.json")] = None,
) -> None:
    """Capacity-bounded privacy of Laplace and Gaussian against several adversary classes."""
    from cbdp_jax._src.demo import run_demo

    if out is not None:
        check_output_folder("out", out)
    run_demo(samples=samples, steps=steps, seed=seed, out=out)


def _sweep_job(mechanism, epsilon, sigma, sensitivity, adversary, options, divergence, alpha,
               seeds, seed, config):  # fmt: skip
    from cbdp_jax._src.sweep_job import SweepJob

    check_choice("mechanism", mechanism, ("laplace", "gaussian"))
    if mechanism == "laplace" and sigma is not None:
        raise InvalidParameterError(
            f"sigma={sigma!r} is invalid for mechanism 'laplace': it takes --epsilon"
        )
    if mechanism == "gaussian" and epsilon is not None:
        raise InvalidParameterError(
            f"epsilon={epsilon!r} is invalid for mechanism 'gaussian': it takes --sigma"
        )
    _check_adversary_flags(adversary, options)
    params = _parse_floats("epsilon" if mechanism == "laplace" else "sigma",
                           epsilon if mechanism == "laplace" else sigma) or (1.0,)  # fmt: skip
    return SweepJob(
        family=mechanism,
        params=params,
        sensitivity=_parse_sensitivity(sensitivity),
        adversary=adversary,
        adversary_options={k: v for k, v in options.items() if v is not None},
        divergence=divergence,
        alphas=_parse_floats("alpha", alpha),
        seeds=seeds,
        seed=seed,
        config=config,
    )


def _run_sweep_here_or_launch(job, out: Path, processes: int, devices: int | None, distributed,
                              timeout: float, heartbeat: int) -> dict:  # fmt: skip
    """Runs the job in this process, as one process of a multi-host job, or launches local workers."""
    from cbdp_jax._src import launch, sweep_job

    coordinator, num_processes, process_id = distributed
    if coordinator is None:
        return sweep_job.run_sweep(
            job, out, processes=processes, devices_per_process=devices, timeout=timeout,
            heartbeat_timeout=heartbeat, stream=sys.stdout,
        )  # fmt: skip
    if processes != 1:
        raise InvalidParameterError(
            f"processes={processes} is invalid with --coordinator: each host runs one process "
            "(--process-id); --processes launches local processes"
        )
    spec = launch.ProcessSpec(
        coordinator, num_processes, process_id, devices, heartbeat_timeout=heartbeat
    )
    launch.initialize(spec)
    return sweep_job.run_job(job, out, stream=sys.stdout)


@app.command("sweep")
def sweep_cmd(
    mechanism: Annotated[str, typer.Option(help="laplace or gaussian")] = "laplace",
    epsilon: Annotated[str | None, typer.Option(help="Laplace epsilons, e.g. 0.5,1,2")] = None,
    sigma: Annotated[str | None, typer.Option(help="Gaussian sigmas, e.g. 1,2")] = None,
    sensitivity: Annotated[str | None, typer.Option(help="shift of Q, e.g. 1,0.5")] = None,
    adversary: Annotated[str, typer.Option(help="linear, poly, mlp, relu2, rff")] = "linear",
    width: Annotated[int | None, typer.Option(help="hidden width (mlp, relu2)")] = None,
    depth: Annotated[int | None, typer.Option(help="hidden layers (mlp)")] = None,
    degree: Annotated[int | None, typer.Option(help="polynomial degree (poly)")] = None,
    features: Annotated[int | None, typer.Option(help="random features (rff)")] = None,
    divergence: Annotated[str, typer.Option(help="kl, renyi or alpha")] = "kl",
    alpha: Annotated[str | None, typer.Option(help="orders, e.g. 2,4,8")] = None,
    seeds: Annotated[int, typer.Option(help="seeds per grid point")] = 1,
    steps: Annotated[int, typer.Option(help="optimiser steps")] = 2000,
    eval_every: Annotated[int, typer.Option(help="steps between validation checks")] = 100,
    batch_size: Annotated[int, typer.Option(help="fresh minibatch per side per step")] = 4096,
    val_samples: Annotated[int, typer.Option(help="validation samples per side")] = 8192,
    test_samples: Annotated[int, typer.Option(help="held-out samples per side")] = 100_000,
    eval_chunk: Annotated[int, typer.Option(help="held-out rows per compiled call")] = 16384,
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    out: Annotated[Path, typer.Option(help="output folder (sweep.json, units)")] = Path("sweep"),
    processes: Annotated[
        int, typer.Option(help="local processes of one jax.distributed job (gloo on CPU)")
    ] = 1,
    devices_per_process: Annotated[
        int | None, typer.Option(help="virtual CPU devices per process (CPU only)")
    ] = None,
    coordinator: Annotated[
        str | None, typer.Option(help="host:port of process 0 (one process of a multi-host job)")
    ] = None,
    num_processes: Annotated[int | None, typer.Option(help="processes of the job")] = None,
    process_id: Annotated[int | None, typer.Option(help="this process, 0 .. N-1")] = None,
    timeout: Annotated[float, typer.Option(help="seconds the launched job may take")] = 3600.0,
    heartbeat_timeout: Annotated[
        int, typer.Option(help="seconds after which a silent process counts as dead")
    ] = 10,
    output_format: Annotated[str, typer.Option("--format", help="table or json")] = "table",
) -> None:
    """Sweep a grid (mechanism parameters x orders x seeds) in one sharded program per unit.

    The member axis is sharded over every device; --processes N starts N local processes joined by
    jax.distributed (free loopback port, gloo CPU collectives) and gathers their results. Resumable:
    one unit per mechanism parameter under OUT/.units/sweep; files are written by process 0 only.
    """
    from cbdp_jax._src.launch import DistributedError

    check_choice("format", output_format, FORMATS)
    check_output_folder("out", out)
    options = {"width": width, "depth": depth, "degree": degree, "features": features}
    config = {"steps": steps, "eval_every": eval_every, "batch_size": batch_size,
              "val_samples": val_samples, "test_samples": test_samples, "eval_chunk": eval_chunk}  # fmt: skip
    job = _sweep_job(mechanism, epsilon, sigma, sensitivity, adversary, options, divergence,
                     alpha, seeds, seed, config)  # fmt: skip
    given = [coordinator, num_processes, process_id]
    if any(v is not None for v in given) and any(v is None for v in given):
        raise InvalidParameterError(
            f"coordinator={coordinator!r}, num_processes={num_processes!r}, "
            f"process_id={process_id!r} is invalid: give all three or none"
        )
    try:
        record = _run_sweep_here_or_launch(job, out, processes, devices_per_process, given,
                                           timeout, heartbeat_timeout)  # fmt: skip
    except DistributedError as exc:
        _fail(f"distributed sweep failed: {exc}", code=1)
    if record["written_by_process"] != 0:
        return
    _print_sweep(record, output_format, out)


def _print_sweep(record: dict[str, Any], output_format: str, out: Path) -> None:
    if output_format == "json":
        typer.echo(json.dumps(record, indent=2))
        return
    for r in record["rows"]:
        alpha = "" if r["alpha"] is None else f" alpha={r['alpha']:g}"
        typer.echo(
            f"{r['mechanism']} {r['adversary']}{alpha} seed {r['seed']}: estimate "
            f"{r['estimate']:.6f}, lower bound {r['lower_bound']:.6f}"
        )
    typer.echo(
        f"{len(record['rows'])} members, {record['units']} units ({record['units_reused']} "
        f"reused), {record['processes']} processes x {record['devices']} devices in all, "
        f"{record['seconds']:.1f} s -> {out / 'sweep.json'}"
    )


@app.command("reproduce")
def reproduce_cmd(
    name: Annotated[
        str | None,
        typer.Argument(help="an experiment name (--list shows them), 'paper' (figures) or 'all'"),
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="list the experiments with what each shows, and exit")
    ] = False,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results"),
    quick: Annotated[bool, typer.Option(help="small, fast versions")] = False,
    restart: Annotated[
        bool, typer.Option(help="forget the named experiments' stored units and rerun them")
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


def _reflowed(doc: str) -> str:
    """A docstring as help text: each paragraph on one line, so the terminal wraps it.

    Typer's rich help keeps single newlines, which broke lines mid-sentence at any width but the
    source's.
    """
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


for _command in app.registered_commands:
    if _command.help is None and _command.callback is not None and _command.callback.__doc__:
        _command.help = _reflowed(_command.callback.__doc__)
        if _command.callback is reproduce_cmd:
            # rich help keeps the blank lines between paragraphs: one experiment per paragraph
            _command.help += "\n\nExperiments:\n\n" + "\n\n".join(_experiment_lines())


def main() -> None:
    """Console entry point: runs the app, turning bad input into a one-line error and exit 2."""
    try:
        code = app(standalone_mode=False)
    except InvalidParameterError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown option, bad type
        typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code or 2)
    sys.exit(code if isinstance(code, int) else 0)


# Commands after which the ``cbdp`` executable skips interpreter teardown (see console_main): they
# start no other process and no jax.distributed job, and write every file before they return.
QUICK_EXIT_COMMANDS = frozenset({"estimate", "exact", "rerun"})


def console_main() -> None:
    """The ``cbdp`` executable: :func:`main`, then, for ``QUICK_EXIT_COMMANDS``, an immediate exit.

    A process that has run JAX spends about 0.2 s tearing the interpreter down after its work is done
    (XLA's runtime, thread pools, module clean-up): a fifth of a warm ``cbdp estimate``. By then every
    output is written and closed (result files atomically; JAX's compilation cache and the program
    store write as they compile), so those commands flush stdout and stderr and leave with
    ``os._exit`` and main's status. Any other command, an uncaught exception, and in-process callers
    of :func:`main` exit normally.
    """
    if len(sys.argv) < 2 or sys.argv[1] not in QUICK_EXIT_COMMANDS:
        main()
        return
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
