"""A sweep as a resumable job, run by one process or by several processes of one ``jax.distributed`` job.

A :class:`SweepJob` is a sweep grid written as plain data (JSON), so that a launcher can hand it to its
workers. :func:`run_job` cuts it into units, one per mechanism (a member's result does not depend on
which other members are in its sweep, :mod:`cbdp_jax._src.estimator.sweep`), and runs them one after another with
:func:`~cbdp_jax._src.estimator.sweep.estimate_sweep` over *every* device of the job: in a multi-process job the
member axis is sharded over all processes' devices and the results are gathered to every process.

Files are written by process 0 only: each finished unit goes to ``OUT/.units/sweep`` (a
:class:`~cbdp_jax._src.infra.checkpoint.UnitStore`, fingerprinted), and the table to ``OUT/sweep.json``. On a
rerun process 0 reads which units are stored and broadcasts it to the others, so every process skips the
same units -- the other processes never read the disk, so hosts need no shared filesystem.

:func:`run_sweep` runs a job in this process (``processes=1``) or launches ``processes`` local workers
(``python -m cbdp_jax._src.estimator.sweep_job JOB.json OUT``, :mod:`cbdp_jax._src.infra.launch`) and reads the table
process 0 wrote.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from cbdp_jax._src.infra.io import atomic_write_text
from cbdp_jax._src.infra.launch import (
    ProcessSpec,
    configure_cpu_devices,
    exit_with_launcher,
    launch,
)
from cbdp_jax._src.infra.progress import duration
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_int_at_least,
    check_output_folder,
)

RESULT_FILE = "sweep.json"
UNITS_FOLDER = "sweep"
FAMILIES = ("laplace", "gaussian")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepJob:
    """A sweep grid as plain data.

    Attributes:
      family: ``'laplace'`` (``params`` are epsilons) or ``'gaussian'`` (``params`` are sigmas).
      params: The mechanism parameters; one unit of work each.
      sensitivity: The shift of Q (default 1 in one dimension).
      adversary: The adversary class name.
      adversary_options: Its options (``width``, ``depth``, ``degree``, ``features``, ``bound``).
      divergence: ``'kl'``, ``'renyi'`` or ``'alpha'``.
      alphas: The orders (None for KL).
      seeds: Seeds per grid point (``range(seeds)``).
      seed: The PRNG seed of the whole sweep (``jax.random.key(seed)``).
      config: Fields of :class:`~cbdp_jax._src.estimator.sweep_types.SweepConfig`.
      max_batch: Most members per compiled call.

    """

    family: str
    params: tuple[float, ...]
    sensitivity: tuple[float, ...] | None = None
    adversary: str = "linear"
    adversary_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    divergence: str = "kl"
    alphas: tuple[float, ...] | None = None
    seeds: int = 1
    seed: int = 0
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_batch: int = 256

    def __post_init__(self):
        from cbdp_jax._src.estimator.sweep_types import SweepConfig

        check_choice("family", self.family, FAMILIES)
        if not self.params:
            raise InvalidParameterError("params=() is invalid: give at least one epsilon or sigma")
        object.__setattr__(self, "params", tuple(float(p) for p in self.params))
        if self.alphas is not None:
            object.__setattr__(self, "alphas", tuple(float(a) for a in self.alphas))
        if self.sensitivity is not None:
            object.__setattr__(self, "sensitivity", tuple(float(v) for v in self.sensitivity))
        check_int_at_least("seeds", self.seeds, 1)
        check_int_at_least("seed", self.seed, 0)
        check_int_at_least("max_batch", self.max_batch, 1)
        SweepConfig(**self.config)  # validates the fields now, not in a worker

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-able data (read back by :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepJob:
        """A job from :meth:`to_dict`'s data."""
        return cls(**data)

    def mechanism(self, param: float):
        """The mechanism of one unit."""
        from cbdp_jax._src.mechanisms import GaussianMechanism, LaplaceMechanism

        sens = {} if self.sensitivity is None else {"sensitivity": self.sensitivity}
        if self.family == "laplace":
            return LaplaceMechanism(epsilon=param, **sens)
        return GaussianMechanism(sigma=param, **sens)

    def units(self) -> list[tuple[str, dict[str, Any]]]:
        """``(unit id, fingerprinted configuration)`` per mechanism parameter."""
        common = {k: v for k, v in self.to_dict().items() if k != "params"}
        name = "epsilon" if self.family == "laplace" else "sigma"
        return [(f"{self.family} {name}={p:g}", {**common, "param": p}) for p in self.params]


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        print(line, file=stream, flush=True)


def _unit_rows(job: SweepJob, param: float) -> list[dict[str, Any]]:
    """One unit: the sweep of one mechanism over every device of the job, as JSON-able rows."""
    import jax

    from cbdp_jax._src.estimator.sweep import SweepConfig, estimate_sweep
    from cbdp_jax._src.infra.io import to_json

    rows = estimate_sweep(
        jax.random.key(job.seed),
        [job.mechanism(param)],
        adversaries=job.adversary,
        divergence=job.divergence,
        alphas=job.alphas,
        seeds=job.seeds,
        config=SweepConfig(**job.config),
        max_batch=job.max_batch,
        **job.adversary_options,
    )
    return json.loads(to_json(rows))


def _stored_units(store, units) -> np.ndarray:
    """Which units process 0 has on disk, the same answer in every process."""
    import jax

    done = np.array([store is not None and store.done(u, c) for u, c in units], dtype=np.int32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        done = np.asarray(multihost_utils.broadcast_one_to_all(done))
    return done.astype(bool)


def run_job(job: SweepJob, out: str | Path | None, *, stream: TextIO | None = None) -> dict:
    """Runs (or resumes) ``job`` with every device of this process's JAX job.

    Args:
      job: The sweep.
      out: Folder for ``sweep.json`` and the unit files (None: keep nothing; no resume).
      stream: Where progress lines go (None: nowhere).

    Returns:
      The record process 0 writes to ``OUT/sweep.json``: ``rows`` (one per member, in unit order, each
      with its ``unit``), ``units``, ``units_reused``, ``processes``, ``devices``, ``seconds``. In other
      processes ``rows`` holds only the units computed in this run.

    """
    import jax

    from cbdp_jax._src.infra.checkpoint import UnitStore
    from cbdp_jax._src.infra.io import atomic_write_json

    t0 = time.perf_counter()
    main = jax.process_index() == 0
    units = job.units()
    store = UnitStore(Path(out) / ".units" / UNITS_FOLDER) if main and out is not None else None
    done = _stored_units(store, units)
    tag = f"process {jax.process_index()}/{jax.process_count()}"
    _say(stream, f"{tag}: {len(jax.local_devices())} local of {jax.device_count()} devices; "
                 f"{len(units)} units, {int(done.sum())} done earlier")  # fmt: skip
    rows: list[dict[str, Any]] = []
    spent: list[float] = []  # seconds of the units computed in this run
    for k, ((uid, cfg), param, stored) in enumerate(zip(units, job.params, done, strict=True)):
        if stored:
            unit_rows = store.load(uid) if store is not None else []
            _say(stream, f"{tag}: unit {k + 1}/{len(units)} {uid}: done earlier (reused)")
        else:
            t1 = time.perf_counter()
            unit_rows = _unit_rows(job, param)
            seconds = time.perf_counter() - t1
            spent.append(seconds)
            if store is not None:
                store.save(uid, unit_rows, config=cfg, seconds=seconds)
            left = int((~done[k + 1 :]).sum())  # units still to compute after this one
            eta = f", about {duration(sum(spent) / len(spent) * left)} left" if left else ""
            _say(
                stream, f"{tag}: unit {k + 1}/{len(units)} {uid}: computed in {seconds:.1f} s{eta}"
            )
        rows.extend({**r, "unit": uid} for r in unit_rows)
    for i, r in enumerate(rows):
        r["member"] = i
    record = {
        "job": job.to_dict(),
        "rows": rows,
        "units": len(units),
        "units_reused": int(done.sum()),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "written_by_process": jax.process_index(),
        "seconds": time.perf_counter() - t0,
    }
    if main and out is not None:
        atomic_write_json(Path(out) / RESULT_FILE, record)
    return record


def run_sweep(
    job: SweepJob,
    out: str | Path,
    *,
    processes: int = 1,
    devices_per_process: int | None = None,
    timeout: float = 3600.0,
    heartbeat_timeout: int = 10,
    stream: TextIO | None = None,
) -> dict:
    """Runs ``job`` into ``out`` in this process or in ``processes`` local processes of one JAX job.

    Args:
      job: The sweep.
      out: Output folder (``sweep.json``, units under ``.units/sweep``, worker logs under ``.launch``).
      processes: 1: this process. N > 1: N workers joined by ``jax.distributed`` on a free loopback
        port, with gloo CPU collectives; the member axis is sharded over all their devices.
      devices_per_process: Virtual CPU devices per process (None: the platform's devices). With
        ``processes=1`` JAX's backend must not have started yet.
      timeout: Seconds the whole multi-process job may take.
      heartbeat_timeout: Seconds after which a silent worker counts as dead.
      stream: Where progress goes (with N > 1, process 0's log as it grows).

    Returns:
      The record of ``OUT/sweep.json`` (see :func:`run_job`).

    Raises:
      DistributedError: A worker died (the message names it), or the job ran past ``timeout``.

    """
    processes = check_int_at_least("processes", processes, 1)
    out = check_output_folder("out", out)
    if processes == 1:
        try:
            configure_cpu_devices(devices_per_process)
        except RuntimeError as exc:
            raise InvalidParameterError(
                f"devices_per_process={devices_per_process} is invalid here: JAX already started "
                f"its backend ({exc}); set it before any JAX call, or use processes > 1"
            ) from None
        return run_job(job, out, stream=stream)
    launch_dir = out / ".launch"
    launch_dir.mkdir(exist_ok=True)
    job_file = launch_dir / "job.json"
    atomic_write_text(job_file, json.dumps(job.to_dict()))
    launch(
        ["-m", "cbdp_jax._src.estimator.sweep_job", str(job_file), str(out)],
        processes,
        devices_per_process=devices_per_process,
        log_dir=launch_dir,
        timeout=timeout,
        heartbeat_timeout=heartbeat_timeout,
        echo=stream,
        env={"JAX_PLATFORMS": "cpu"} if devices_per_process is not None else None,
    )
    return json.loads((out / RESULT_FILE).read_text())


def worker_main(argv: list[str]) -> int:
    """A launched worker: ``python -m cbdp_jax._src.estimator.sweep_job JOB.json OUT``; returns the exit status."""
    exit_with_launcher()
    spec = ProcessSpec.from_env()
    if spec is None:
        print(
            "error: not launched by cbdp_jax._src.infra.launch (no CBDP_COORDINATOR)",
            file=sys.stderr,
        )
        return 2
    from cbdp_jax._src.infra.launch import initialize

    try:
        initialize(spec)
        job = SweepJob.from_dict(json.loads(Path(argv[0]).read_text()))
        run_job(job, argv[1], stream=sys.stdout)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
