"""Cold start of the command line: a first process, a second process on the same cache, a warm call.

The DP-Auditorium case as one ``cbdp estimate`` (Laplace eps = 1, MLP 32x2, Renyi alpha = 2, 100k
training and 100k held-out samples per side, 1000 steps, ensemble 2). With a FRESH compilation-cache
folder (``CBDP_JAX_CACHE_DIR``) it runs:

1. a first process (every program compiled and written to the caches: JAX's compilation cache and
   the package's program store, ``cbdp_jax/_src/infra/programs.py``);
2. a second process (programs loaded from the store);
3. inside one process, the same estimate twice: the second call is the warm call;
4. the installed ``cbdp`` executable itself on the same cache (a cross-check of process 2).

Processes 1 and 2 run the command as the executable does (``cbdp_jax.cli.console_main``, which leaves
without interpreter teardown) with a listener that adds up the seconds JAX spent compiling
(``jax.monitoring``'s backend-compile events). Each reports its wall time, start to exit, imports
included. The target: the second process within 2x of the warm call.

    python benchmarks/cold_start.py --out DIR/cold_start.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

ARGS = [
    "estimate",
    "--mechanism", "laplace", "--epsilon", "1", "--adversary", "mlp", "--width", "32",
    "--divergence", "renyi", "--alpha", "2", "--samples", "100000", "--test-samples", "100000",
    "--steps", "1000", "--ensemble", "2", "--batch-size", "2048", "--format", "json",
]  # fmt: skip

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import jax
compile_s = [0.0]
def listener(event, duration, **kw):
    if "backend_compile" in event:
        compile_s[0] += duration
jax.monitoring.register_event_duration_secs_listener(listener)
from cbdp_jax import cli
calls = int(sys.argv[1])
times = []
def report():
    print(json.dumps({"process_s": time.perf_counter() - t0, "calls_s": times,
                      "compile_s": compile_s[0]}), file=sys.stderr)
if calls == 1:  # as the executable: console_main, which exits without teardown
    main = cli.main
    def timed():
        t = time.perf_counter()
        try:
            main()
        finally:
            times.append(time.perf_counter() - t)
            report()
    cli.main = timed
    sys.argv = ["cbdp", *sys.argv[2:]]
    cli.console_main()
for _ in range(calls):
    t = time.perf_counter()
    try:
        cli.app(sys.argv[2:], standalone_mode=False)
    except SystemExit:
        pass
    times.append(time.perf_counter() - t)
report()
"""


def _env(cache: str) -> dict[str, str]:
    """The children's environment: the fresh cache folder, and Python's bytecode cache as a user has it.

    ``PYTHONDONTWRITEBYTECODE`` (set on some build machines) would make every process compile the
    package's modules from source again; without it the first process writes them, as a user's
    first import does.
    """
    env = dict(os.environ, CBDP_JAX_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def child(calls: int, cache: str) -> dict[str, Any]:
    env = _env(cache)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(calls), *ARGS],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    info = json.loads(proc.stderr.strip().splitlines()[-1])
    return {"wall_s": wall, **info}


def executable(cache: str) -> float:
    """Wall seconds of the installed ``cbdp`` executable running the case on the cache ``cache``."""
    exe = Path(sys.executable).with_name("cbdp")
    env = _env(cache)
    t0 = time.perf_counter()
    subprocess.run([str(exe), *ARGS], capture_output=True, env=env, check=True)
    return time.perf_counter() - t0


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        first = child(1, cache)
        second = child(1, cache)
        warm = child(2, cache)
        exe = executable(cache)
    warm_call = warm["calls_s"][1]
    return {
        "case": "cbdp " + " ".join(ARGS),
        "first_process": first,
        "second_process": second,
        "one_process_two_calls": warm,
        "executable_second_process_s": exe,
        "warm_call_s": warm_call,
        "second_process_over_warm_call": second["wall_s"] / warm_call,
        "first_process_over_warm_call": first["wall_s"] / warm_call,
        "target": "second process within 2x of a warm call",
        "meets_target": second["wall_s"] <= 2.0 * warm_call,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _common.parser(__doc__.splitlines()[0], "benchmarks/results/cold_start.json").parse_args(
        argv
    )
    _common.setup_device(args.device)
    payload = run()
    f, s, w = payload["first_process"], payload["second_process"], payload["warm_call_s"]
    print(
        f"first process {f['wall_s']:.1f} s (compiling {f['compile_s']:.1f} s), second process "
        f"{s['wall_s']:.2f} s (compiling {s['compile_s']:.1f} s), warm call {w:.2f} s: second / warm "
        f"= {payload['second_process_over_warm_call']:.2f}; the cbdp executable on the same cache "
        f"{payload['executable_second_process_s']:.2f} s"
    )
    _common.write(args.out, "cold_start", args, payload)
    return payload


if __name__ == "__main__":
    main()
