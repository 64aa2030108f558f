"""``cbdp sweep``: a grid of mechanisms, orders and seeds in sharded programs, here or launched."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cbdp_jax._src.infra.display import number
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_output_folder,
)
from cbdp_jax.cli._common import (
    FORMATS,
    _check_adversary_flags,
    _echo_wrapped,
    _fail,
    _given,
    _parse_floats,
    _parse_sensitivity,
)


def _sweep_job(mechanism, epsilon, sigma, sensitivity, adversary, options, divergence, alpha,
               seeds, seed, config):  # fmt: skip
    from cbdp_jax._src.estimator.sweep_job import SweepJob

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
    from cbdp_jax._src.estimator import sweep_job
    from cbdp_jax._src.infra import launch

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


def sweep_cmd(
    ctx: typer.Context,
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

    Give the grid: --epsilon (laplace) or --sigma (gaussian), and --out, the folder the results go
    to. For example: cbdp sweep --mechanism laplace --epsilon 0.5,1,2 --divergence renyi --alpha 2,4
    --seeds 2 --out sweep_out (writes sweep_out/sweep.json).

    The member axis is sharded over every device; --processes N starts N local processes joined by
    jax.distributed (free loopback port, gloo CPU collectives) and gathers their results. Resumable:
    one unit per mechanism parameter under OUT/.units/sweep; files are written by process 0 only.
    """
    from cbdp_jax._src.infra.launch import DistributedError

    check_choice("format", output_format, FORMATS)
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
    check_int_at_least("processes", processes, 1)
    if coordinator is not None and processes != 1:
        raise InvalidParameterError(
            f"processes={processes} is invalid with --coordinator: each host runs one process "
            "(--process-id); --processes launches local processes"
        )
    _check_asked(mechanism, epsilon, sigma, ctx)
    _check_fits(job)
    check_output_folder("out", out)
    try:
        record = _run_sweep_here_or_launch(job, out, processes, devices_per_process, given,
                                           timeout, heartbeat_timeout)  # fmt: skip
    except DistributedError as exc:
        _fail(f"distributed sweep failed: {exc}", code=1)
    if record["written_by_process"] != 0:
        return
    _print_sweep(record, output_format, out)


def _check_asked(mechanism: str, epsilon, sigma, ctx) -> None:
    """A sweep writes files: it runs only on a grid and a folder the user named (no default run)."""
    name = "epsilon" if mechanism == "laplace" else "sigma"
    missing = [n for n, v in ((name, epsilon if name == "epsilon" else sigma),
                              ("out", "out" in _given(ctx, ("out",)) or None)) if v is None]  # fmt: skip
    if missing:
        raise InvalidParameterError(
            f"{', '.join(n + '=None' for n in missing)} is invalid: cbdp sweep runs only the grid "
            f"you give and writes only to the folder you name: give --{name} (mechanism "
            f"{mechanism!r}) and --out, e.g. cbdp sweep --mechanism laplace --epsilon 0.5,1,2 --out "
            "sweep_out (see cbdp sweep --help)"
        )


def _check_fits(job) -> None:
    """The sweep's members, one compiled batch of them at a time, must fit in memory (before work)."""
    from cbdp_jax._src.estimator.adversaries import make_adversary
    from cbdp_jax._src.infra.sizes import check_fits, critic_units, sweep_bytes

    dim = len(job.sensitivity) if job.sensitivity else 1
    units = critic_units(make_adversary(job.adversary, **job.adversary_options), dim)
    members = len(job.params) * len(job.alphas or (None,)) * job.seeds
    c = job.config
    needed = sweep_bytes(
        members, batch_size=c["batch_size"], val_samples=c["val_samples"],
        eval_chunk=c["eval_chunk"], dim=dim, units=units, max_batch=job.max_batch,
    )  # fmt: skip
    what = (
        f"{members} members (a compiled batch of at most {job.max_batch} at once: minibatch "
        f"{c['batch_size']}, {c['val_samples']} validation samples and a test chunk of "
        f"{c['eval_chunk']} per side, {units} hidden unit{'s' if units > 1 else ''}; a result row each)"
    )
    batch = min(members, job.max_batch)
    share = {  # what each option holds: the largest is named
        "seeds": 1024 * members,
        "batch_size": batch * c["batch_size"] * (2 * dim + 3 * units),
        "val_samples": batch * c["val_samples"] * (2 * dim + 3 * units),
        "eval_chunk": batch * c["eval_chunk"] * 2 * dim,
    }
    name = max(share, key=share.get)
    value = job.seeds if name == "seeds" else c[name]
    # the host's memory: asking a device would start JAX before --devices-per-process sets it up
    advice = f"use a smaller --{name.replace('_', '-')}"
    check_fits(name, value, needed, what, advice, host_only=True)


def _print_sweep(record: dict[str, Any], output_format: str, out: Path) -> None:
    if output_format == "json":
        typer.echo(json.dumps(record, indent=2))
        return
    for r in record["rows"]:
        alpha = "" if r["alpha"] is None else f" alpha={r['alpha']:g}"
        _echo_wrapped(
            f"{r['mechanism']} {r['adversary']}{alpha} seed {r['seed']}: estimate "
            f"{number(r['estimate'])}, lower bound {number(r['lower_bound'])}"
        )
    _echo_wrapped(
        f"{len(record['rows'])} members, {record['units']} units ({record['units_reused']} "
        f"reused), {record['processes']} processes x {record['devices']} devices in all, "
        f"{record['seconds']:.1f} s -> {out / 'sweep.json'}"
    )
