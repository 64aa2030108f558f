"""``cbdp estimate``: trained adversaries, a held-out lower bound, the result record and its curve.

``cbdp rerun`` runs the same computation from a stored record (:func:`run_estimate`, ``_emit``). Flags
have one name each (``--both-directions``, no ``--no-`` twin): the help's option column stays narrow
enough at 80 columns for the descriptions beside it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice
from cbdp_jax.cli._common import (
    _check_adversary_flags,
    _echo_wrapped,
    _given,
    _parse_sensitivity,
    _print_record,
    check_format_and_out,
)

ESTIMATE_MECHANISMS = ("laplace", "gaussian", "randomized_response", "nonprivate")


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

    from cbdp_jax._src.infra import keys, programs
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
    if mech is not None:
        _check_samples_fit(args, mech.dim)
    if progress:
        from cbdp_jax._src.infra.progress import Progress

        bar = Progress("cbdp estimate: training", unit="steps")  # the library reports the total
        cfg_kwargs["progress"] = _ProgressHook(bar)
        bar.__enter__()
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
            bar.close()
    return result


def _or_auto(value):
    """A budget option: the value given, or 'auto' (the library's rule) when not given."""
    return "auto" if value is None else value


def _estimate_from_files(args: dict[str, Any], config, options: dict[str, Any]):

    from cbdp_jax._src.infra import keys
    from cbdp_jax._src.mechanism_auditor.loading import load_samples
    from cbdp_jax.estimator import estimate_from_samples

    p = load_samples("p_samples", args["p_samples"])
    q = load_samples("q_samples", args["q_samples"])
    if p.shape[1] != q.shape[1]:
        raise InvalidParameterError(
            f"q_samples={args['q_samples']!r} is invalid: its rows have {q.shape[1]} values, "
            f"those of p_samples {p.shape[1]}"
        )
    _check_files_fit(args, p, q)
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


def _check_samples_fit(args: dict[str, Any], dim: int) -> None:
    """``--samples`` refused in one line when the samples cannot fit in memory (before any draw)."""
    import numpy as np

    from cbdp_jax._src.estimator.adversaries import make_adversary
    from cbdp_jax._src.estimator.budget import default_budget
    from cbdp_jax._src.infra.sizes import check_fits, critic_units, estimate_bytes

    spec = make_adversary(args["adversary"], **{k: args.get(k) for k in _OPTION_KEYS})
    itemsize = np.dtype(args["dtype"]).itemsize
    units = critic_units(spec, dim)
    ensemble = args["ensemble"] or default_budget(args["samples"]).ensemble
    needed = estimate_bytes(args["samples"], None, dim, itemsize, ensemble=ensemble, units=units)
    what = (
        f"its samples ({dim} {args['dtype']} value{'s' if dim > 1 else ''} each, both sides: "
        f"training, validation, padded copies, a test chunk) and {ensemble} critics' "
        f"{units} hidden units on the validation samples"
    )
    check_fits("samples", args["samples"], needed, what)


def _check_files_fit(args: dict[str, Any], p, q) -> None:
    """Sample files: every value representable in the run's dtype, and their copies in memory."""
    import numpy as np

    from cbdp_jax._src.infra.sizes import check_fits, check_representable

    check_representable("p_samples", repr(args["p_samples"]), p, args["dtype"])
    check_representable("q_samples", repr(args["q_samples"]), q, args["dtype"])
    itemsize = np.dtype(args["dtype"]).itemsize
    needed = 3 * (p.shape[0] + q.shape[0]) * p.shape[1] * itemsize  # shuffled parts and padding
    check_fits("p_samples", args["p_samples"], needed, "the samples' copies in the run's dtype")


class _ProgressHook:
    """A hashable host callback for the estimator's ``progress`` (one instance per command run).

    Called with a block index (one more block of optimiser steps done: the bar advances by one), or
    with a report of steps done and total (``step`` / ``steps``, or ``done`` / ``total``): the bar
    shows that count.
    """

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, *args) -> None:
        if len(args) == 1 and not hasattr(args[0], "_fields"):
            self.bar.advance()  # a block index from inside the compiled program
        else:
            self.bar(*args)


_OPTION_KEYS = ("width", "depth", "degree", "features", "bandwidth", "bound")


def _mechanism_label(args: dict[str, Any], params: dict[str, Any]) -> str:
    """E.g. ``'laplace eps=1, sensitivity 1'`` or ``'gaussian sigma=1 (default), sensitivity 1'``."""
    parts = []

    def given(name: str) -> str:  # a value the user did not give is labelled as the default
        return "" if args.get(name) is not None else " (default)"

    if "epsilon" in params:
        parts.append(f"eps={params['epsilon']:g}{given('epsilon')}")
    if "sigma" in params:
        parts.append(f"sigma={params['sigma']:g}{given('sigma')}")
    if "k" in params:
        parts.append(f"k={params['k']}{given('k')}")
    if args["mechanism"] in ("laplace", "gaussian", "nonprivate"):
        sens = params.get("sensitivity") or (1.0,)
        parts.append("sensitivity " + ",".join(f"{v:g}" for v in sens))
    return f"{args['mechanism']} " + ", ".join(parts)


def reference_of(result, args: dict[str, Any], params: dict[str, Any], *, exact_allowed=True):
    """The known value an estimate is compared with (exact restricted, or unrestricted), or None.

    ``exact_allowed=False``: the unrestricted value (for a bound that is not on the named class).
    """
    from cbdp_jax._src.estimator.adversaries import make_adversary
    from cbdp_jax._src.estimator.reference import reference_for

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

    from cbdp_jax._src.infra.io import atomic_savefig

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


_GUARANTEE_HELP = (
    "kind of lower bound: finite-sample (no assumption; the critic is bounded, "
    "B*tanh(h/B), B chosen on validation data: a bound on that class), asymptotic (CLT "
    "on the class itself, refused when the held-out tails look too heavy), class (a bound "
    "on the class itself: finite-sample if it is bounded, else asymptotic), or auto "
    "(class, falling back to finite-sample when the validation tails are too heavy)"
)
_INPUT_MAP_HELP = (
    "the critic's input map, fitted on training samples: standard, robust (asinh of "
    "median/IQR-scaled x), rank (training ECDF) or auto (standard unless outliers set the "
    "spread; then the three race on validation data and the leader is trained in full)"
)


def estimate_cmd(
    ctx: typer.Context,
    mechanism: Annotated[str, typer.Option(help=", ".join(ESTIMATE_MECHANISMS))] = "laplace",
    epsilon: Annotated[
        float | None, typer.Option(help="Laplace / randomized response (default 1)")
    ] = None,
    sigma: Annotated[float | None, typer.Option(help="Gaussian noise std (default 1)")] = None,
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
            "best; 0 trains all steps (default: by size with the steps by size, else 0)"
        ),
    ] = None,
    ensemble: Annotated[int | None, typer.Option(help="adversaries (default: by size)")] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="minibatch per side (default: by size)")
    ] = None,
    learning_rate: Annotated[float, typer.Option(help="Adam step size")] = 1e-2,
    confidence: Annotated[float, typer.Option(help="level of the lower bound")] = 0.95,
    both_directions: Annotated[
        bool, typer.Option("--both-directions", help="also D(Q,P); report the max")
    ] = False,
    guarantee: Annotated[
        str,
        typer.Option(help=_GUARANTEE_HELP),
    ] = "auto",
    input_map: Annotated[
        str,
        typer.Option(help=_INPUT_MAP_HELP),
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
    check_format_and_out(output_format, out)
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
    from cbdp_jax._src.infra.io import atomic_write_json, to_json

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
        _echo_wrapped(f"bound refused: {result.refusal}", err=True)
    for w in result.warnings:
        _echo_wrapped(f"warning: {w}", err=True)


def _bound_class_estimate_differs(record: dict[str, Any]) -> bool:
    """Whether the lower bound's class has its own estimate, other than the named class's."""
    value = record.get("certified_estimate")
    if not isinstance(value, float) or not math.isfinite(value):
        return False  # none, or an unbounded result (the estimate says so itself)
    return not record.get("bound_on_named_class", True) or value != record["estimate"]


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
    ]
    if _bound_class_estimate_differs(record):
        # the bound is on another class (B tanh(H / B), or a shrunk critic): its own held-out estimate
        # is what the bound sits under, not the estimate of the named class above
        fields.append(("estimate of bound's class", record["certified_estimate"]))
    fields += [
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
