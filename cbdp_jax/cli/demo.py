"""``cbdp demo``: capacity-bounded privacy of Laplace and Gaussian against several classes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cbdp_jax._src.infra.validation import check_output_folder


def demo_cmd(
    samples: Annotated[int, typer.Option(help="training (and test) samples per side")] = 100_000,
    steps: Annotated[int, typer.Option(help="optimiser steps per class")] = 1000,
    seed: Annotated[int, typer.Option(help="PRNG seed")] = 0,
    out: Annotated[Path | None, typer.Option(help="folder for demo.json")] = None,
) -> None:
    """Capacity-bounded privacy of Laplace and Gaussian against several adversary classes."""
    from cbdp_jax._src.estimator.demo import run_demo
    from cbdp_jax._src.infra.sizes import check_fits, estimate_bytes

    # the widest of its classes, mlp(32x2), four at once, on float32 samples of one value
    needed = estimate_bytes(samples, None, 1, 4, ensemble=4, units=32)
    check_fits("samples", samples, needed, "its samples and 4 critics' 32 hidden units")
    if out is not None:
        check_output_folder("out", out)
    run_demo(samples=samples, steps=steps, seed=seed, out=out)
