"""``cbdp exact``: the exact restricted (or unrestricted) divergence of a noise pair."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice, check_int_at_least
from cbdp_jax.cli._common import FORMATS, _parse_sensitivity, _print_record

EXACT_ADVERSARIES = ("linear", "poly", "unrestricted")


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
    from cbdp_jax._src.infra.io import to_json

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
