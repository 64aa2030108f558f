"""``cbdp calibrate``: the least noise whose exact restricted privacy loss meets a target."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from cbdp_jax._src.infra.progress import Progress
from cbdp_jax._src.infra.validation import InvalidParameterError, check_choice
from cbdp_jax.cli._common import FORMATS, _print_record

DEFAULT_ALPHA = 2.0


def calibrate_cmd(
    mechanism: Annotated[
        str, typer.Option(help="laplace, gaussian or subsampled-gaussian")
    ] = "gaussian",
    target: Annotated[float, typer.Option(help="the target privacy loss, > 0")] = 1.0,
    adversary: Annotated[str, typer.Option(help="linear, poly or unrestricted")] = "linear",
    degree: Annotated[int, typer.Option(help="polynomial degree for --adversary poly")] = 1,
    divergence: Annotated[str, typer.Option(help="kl or renyi")] = "renyi",
    alpha: Annotated[
        float | None, typer.Option(help="Renyi order, > 1 (default 2 with --divergence renyi)")
    ] = None,
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
    from cbdp_jax._src.infra.io import to_json
    from cbdp_jax.calibration import calibrate

    check_choice("format", output_format, FORMATS)
    check_choice("mechanism", mechanism, ("laplace", "gaussian", "subsampled-gaussian"))
    family = mechanism.replace("-", "_")
    if family == "subsampled_gaussian" and sampling_rate is None:
        raise InvalidParameterError(
            "sampling_rate=None is invalid for mechanism 'subsampled-gaussian': give "
            "--sampling-rate q in (0, 1]"
        )
    if family != "subsampled_gaussian" and sampling_rate is not None:
        raise InvalidParameterError(
            f"sampling_rate={sampling_rate!r} is invalid for mechanism {mechanism!r}: only "
            "subsampled-gaussian takes it (--mechanism subsampled-gaussian)"
        )
    if divergence == "renyi" and alpha is None:
        alpha = DEFAULT_ALPHA  # shown in the table and the JSON record
    t0 = time.perf_counter()
    with Progress("cbdp calibrate"):
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
    if res.calibration.alpha is not None:
        columns.insert(2, "alpha")
    _print_record("cbdp calibrate", [(k, record[k]) for k in columns])
