"""Several JAX processes on one machine: start them, join them into one job, and watch them.

:func:`launch` starts N copies of a worker (``python -m MODULE ARGS``) with the coordinates of a
``jax.distributed`` job in their environment -- a free loopback port, ``num_processes`` and each
``process_id`` -- and watches them. Each worker calls :func:`initialize` before any other JAX call: CPU
collectives over gloo, ``devices_per_process`` virtual CPU devices, and ``jax.distributed.initialize``
with an initialisation timeout and a heartbeat timeout. Together they give the failure behaviour a job
needs:

* a worker that dies stops sending heartbeats; after ``heartbeat_timeout`` seconds the coordination
  service tells every other worker, which then ends itself with an error naming the dead task;
* the launcher notices the first worker to exit with a failure, gives the others ``grace`` seconds to
  end themselves, then kills what is left, and raises :class:`DistributedError` naming the dead process,
  how it ended, what each other process did, and the tail of the dead process's log;
* a worker whose launcher is gone (killed) ends itself within a second, so no orphan keeps running.

Every process writes its output to ``log_dir/process-I.log``; the launcher writes ``log_dir/pids.json``
(the workers' pids) so that tests and operators can find them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from cbdp_jax._src.infra.io import atomic_write_text
from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least, check_positive

ENV_COORDINATOR = "CBDP_COORDINATOR"
ENV_NUM_PROCESSES = "CBDP_NUM_PROCESSES"
ENV_PROCESS_ID = "CBDP_PROCESS_ID"
ENV_DEVICES = "CBDP_DEVICES_PER_PROCESS"
ENV_HEARTBEAT = "CBDP_HEARTBEAT_TIMEOUT"
ENV_PARENT = "CBDP_LAUNCHER_PID"
# What the coordination service prints when it finds a task dead (the line after names the tasks).
_UNHEALTHY = "tasks are unhealthy"
_LOST_COORDINATOR = "Failed to send RPC to coordination service"


class DistributedError(RuntimeError):
    """A process of a multi-process job failed; the message names it and says how it ended."""


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One process's place in a ``jax.distributed`` job.

    Attributes:
      coordinator: ``host:port`` of process 0's coordination service.
      num_processes: Processes in the job.
      process_id: This process, ``0 .. num_processes - 1``.
      devices_per_process: Virtual CPU devices of this process (None: the platform's devices).
      initialization_timeout: Seconds to wait for every process to join.
      heartbeat_timeout: Seconds without a heartbeat after which a process counts as dead.

    """

    coordinator: str
    num_processes: int
    process_id: int
    devices_per_process: int | None = None
    initialization_timeout: int = 60
    heartbeat_timeout: int = 10

    def __post_init__(self):
        n = check_int_at_least("num_processes", self.num_processes, 1)
        pid = check_int_at_least("process_id", self.process_id, 0)
        if pid >= n:
            raise InvalidParameterError(
                f"process_id={pid} is invalid: must be in 0 .. num_processes - 1 = {n - 1}"
            )
        if self.devices_per_process is not None:
            check_int_at_least("devices_per_process", self.devices_per_process, 1)
        check_int_at_least("initialization_timeout", self.initialization_timeout, 1)
        check_int_at_least("heartbeat_timeout", self.heartbeat_timeout, 2)
        host, _, port = self.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidParameterError(
                f"coordinator={self.coordinator!r} is invalid: must be host:port with port in "
                "1 .. 65535, e.g. 127.0.0.1:12345"
            )

    def env(self) -> dict[str, str]:
        """The environment variables that hand this spec to a worker (read by :meth:`from_env`)."""
        env = {
            ENV_COORDINATOR: self.coordinator,
            ENV_NUM_PROCESSES: str(self.num_processes),
            ENV_PROCESS_ID: str(self.process_id),
            ENV_HEARTBEAT: str(self.heartbeat_timeout),
        }
        if self.devices_per_process is not None:
            env[ENV_DEVICES] = str(self.devices_per_process)
        return env

    @classmethod
    def from_env(cls) -> ProcessSpec | None:
        """The spec a launcher put in the environment (None outside a launched worker)."""
        if ENV_COORDINATOR not in os.environ:
            return None
        devices = os.environ.get(ENV_DEVICES)
        return cls(
            coordinator=os.environ[ENV_COORDINATOR],
            num_processes=int(os.environ[ENV_NUM_PROCESSES]),
            process_id=int(os.environ[ENV_PROCESS_ID]),
            devices_per_process=None if devices is None else int(devices),
            heartbeat_timeout=int(os.environ.get(ENV_HEARTBEAT, "10")),
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the OS picks it; never a fixed number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def configure_cpu_devices(devices_per_process: int | None) -> None:
    """Asks for ``devices_per_process`` virtual CPU devices; must precede JAX's backend start."""
    import jax

    if devices_per_process is not None:
        jax.config.update("jax_num_cpu_devices", devices_per_process)


def initialize(spec: ProcessSpec) -> None:
    """Joins this process to the job of ``spec``: gloo CPU collectives, devices, jax.distributed.

    Must run before any other JAX call of the process. With one process it only sets the devices.

    Args:
      spec: Where the coordinator is, how many processes, which one this is, the timeouts.

    """
    import jax

    configure_cpu_devices(spec.devices_per_process)
    if spec.num_processes == 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=spec.coordinator,
        num_processes=spec.num_processes,
        process_id=spec.process_id,
        initialization_timeout=spec.initialization_timeout,
        heartbeat_timeout_seconds=spec.heartbeat_timeout,
        shutdown_timeout_seconds=spec.heartbeat_timeout,
    )


def exit_with_launcher(poll: float = 1.0) -> None:
    """In a launched worker: a daemon thread that ends this process once its launcher is gone."""
    parent = os.environ.get(ENV_PARENT)
    if parent is None:
        return
    parent_pid = int(parent)

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(poll)

    threading.Thread(target=watch, daemon=True, name="cbdp-launcher-watch").start()


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit status {returncode}"


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in text if ln.strip() and "Warning" not in ln and "[Gloo]" not in ln]
    return "\n".join(keep[-lines:])


def _reported_dead(path: Path) -> str | None:
    """The tasks the coordination service reported dead in a survivor's log, if it did."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(text):
        if _UNHEALTHY in line and i + 1 < len(text):
            return text[i + 1].strip()
        if _LOST_COORDINATOR in line:
            return "0 (it lost contact with the coordination service)"
    return None


@dataclasses.dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    log: Path
    ended: float | None = None  # seconds after the start
    by_launcher: bool = False


def _start(
    argv: Sequence[str], spec: ProcessSpec, log: Path, env: dict[str, str] | None
) -> subprocess.Popen:
    full_env = {**os.environ, **(env or {}), **spec.env(), ENV_PARENT: str(os.getpid())}
    full_env["PYTHONUNBUFFERED"] = "1"
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, *argv], env=full_env, stdout=fh, stderr=subprocess.STDOUT
        )


def _stop(workers: list[_Worker], t0: float) -> None:
    """Terminates every worker still running (SIGTERM, then SIGKILL after 5 s) and reaps them all."""
    for w in workers:
        if w.proc.poll() is None:
            w.by_launcher = True
            w.proc.terminate()
    deadline = time.monotonic() + 5.0
    for w in workers:
        try:
            w.proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        if w.ended is None:
            w.ended = time.monotonic() - t0


def _failure_message(workers: list[_Worker], dead: _Worker, grace: float) -> str:
    n = len(workers)
    lines = [
        f"process {dead.index} of {n} (pid {dead.proc.pid}) died: {_how(dead.proc.returncode)}, "
        f"{dead.ended:.1f} s after the start."
    ]
    for w in workers:
        if w is dead:
            continue
        after = w.ended - dead.ended
        if w.by_launcher:
            what = f"did not end within {grace:.0f} s and was stopped by the launcher"
        elif w.proc.returncode == 0:
            what = "had finished"
        else:
            what = f"ended by itself {after:.1f} s later ({_how(w.proc.returncode)})"
        reported = _reported_dead(w.log)
        if reported is not None:
            what += f"; its coordination service reported dead: process {reported}"
        lines.append(f"process {w.index} (pid {w.proc.pid}) {what}.")
    tail = _tail(dead.log)
    if tail:
        lines.append(f"last lines of {dead.log}:\n{tail}")
    return "\n".join(lines)


def launch(
    argv: Sequence[str],
    processes: int,
    *,
    devices_per_process: int | None = None,
    log_dir: str | Path,
    timeout: float = 3600.0,
    heartbeat_timeout: int = 10,
    grace: float | None = None,
    env: dict[str, str] | None = None,
    echo: TextIO | None = None,
) -> float:
    """Runs ``python ARGV`` as ``processes`` workers of one ``jax.distributed`` job on this machine.

    Args:
      argv: The worker's arguments after ``python`` (e.g. ``['-m', 'pkg.worker', 'job.json']``); the
        worker calls :func:`initialize` with ``ProcessSpec.from_env()`` first.
      processes: Workers to start (>= 1).
      devices_per_process: Virtual CPU devices per worker (None: the platform's devices).
      log_dir: Folder for ``process-I.log`` and ``pids.json``.
      timeout: Seconds the whole job may take before every worker is stopped.
      heartbeat_timeout: Seconds without a heartbeat after which JAX counts a worker as dead.
      grace: Seconds the other workers get to end themselves after one fails (default: twice the
        heartbeat timeout plus 10).
      env: Extra environment variables for the workers.
      echo: Where process 0's log is copied as it grows (None: nowhere).

    Returns:
      The job's wall time in seconds.

    Raises:
      DistributedError: A worker failed (the message names it and what the others did), or the job
        ran past ``timeout``.

    """
    processes = check_int_at_least("processes", processes, 1)
    timeout = check_positive("timeout", timeout)
    grace = 2.0 * heartbeat_timeout + 10.0 if grace is None else check_positive("grace", grace)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    coordinator = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    workers: list[_Worker] = []
    try:
        for i in range(processes):
            spec = ProcessSpec(
                coordinator, processes, i, devices_per_process, 60, heartbeat_timeout
            )
            log = log_dir / f"process-{i}.log"
            workers.append(_Worker(i, _start(argv, spec, log, env), log))
        atomic_write_text(log_dir / "pids.json", json.dumps([w.proc.pid for w in workers]))
        _watch(workers, t0, timeout, grace, _Echo(workers[0].log, echo))
    finally:
        _stop(workers, t0)
    return time.monotonic() - t0


class _Echo:
    """Copies the complete lines a log file gains to a stream."""

    def __init__(self, path: Path, stream: TextIO | None):
        self.path, self.stream, self.offset = path, stream, 0

    def __call__(self) -> None:
        if self.stream is None:
            return
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode(errors="replace").splitlines():
            if line.strip() and "Warning" not in line and not line.startswith("[Gloo]"):
                print(line, file=self.stream, flush=True)
        self.offset += end


def _watch(workers: list[_Worker], t0: float, timeout: float, grace: float, echo: _Echo) -> None:
    """Waits for every worker; raises once one fails (after the grace period) or on the timeout."""
    dead: _Worker | None = None
    while True:
        echo()
        now = time.monotonic() - t0
        for w in workers:
            if w.ended is None and w.proc.poll() is not None:
                w.ended = now
                if w.proc.returncode != 0 and dead is None:
                    dead = w
        running = [w for w in workers if w.ended is None]
        if dead is not None and (not running or now - dead.ended > grace):
            _stop(workers, t0)
            raise DistributedError(_failure_message(workers, dead, grace))
        if not running:
            echo()
            return
        if now > timeout:
            _stop(workers, t0)
            raise DistributedError(
                f"the job ran past timeout={timeout:.0f} s; stopped processes "
                f"{[w.index for w in running]} (logs in {workers[0].log.parent})"
            )
        time.sleep(0.1)
