"""Peak memory of fresh-sample training does not grow with the number of optimiser steps.

Each setting runs in its own subprocess (so peaks do not mix): a sweep of ``members`` linear adversaries
trained for 1k, 4k and 16k steps on fresh Laplace minibatches of a fixed size, drawn inside the compiled
loop. The child reports its peak resident set size (VmHWM from /proc/self/status, falling back to
``resource.getrusage``), its RSS after importing JAX and, on an accelerator, the device's peak memory in
use (``Device.memory_stats()['peak_bytes_in_use']``; the host RSS then holds the runtime, not the data). Training on a materialised dataset of the same
size would need ``steps x batch x 2 x d x 4`` bytes per member on top: that column shows what fresh
sampling saves.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    kb = _status_kb("VmHWM")
    if kb is None:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kb / 1024.0


def device_peak_mb() -> float | None:
    """Peak memory in use on the accelerator (MiB), where the backend reports it (GPU); else None."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def child(steps: int, batch: int, members: int, device: str) -> dict[str, Any]:
    """Runs one training in this process and measures it (called in a subprocess)."""
    _common.setup_device(device)
    import jax

    from cbdp_jax.mechanisms import LaplaceMechanism
    from cbdp_jax.sweep import SweepConfig, train_sweep

    rss_import = (_status_kb("VmRSS") or 0) / 1024.0
    config = SweepConfig(steps=steps, eval_every=500, batch_size=batch, val_samples=4096)
    t0 = time.perf_counter()
    training = train_sweep(
        jax.random.key(0),
        LaplaceMechanism(epsilon=1.0),
        adversaries="linear",
        seeds=members,
        config=config,
        max_batch=members,
    )
    seconds = time.perf_counter() - t0
    return {
        "steps": steps,
        "batch": batch,
        "members": members,
        "seconds": seconds,
        "rss_after_import_mb": rss_import,
        "peak_rss_mb": peak_rss_mb(),
        "device_peak_mb": device_peak_mb(),
        "best_value_mean": float(training.best_values().mean()),
        "materialised_dataset_mb": steps * batch * 2 * 1 * 4 * members / 2**20,
    }


def run(quick: bool, device: str, repeats: int = 3) -> dict[str, Any]:
    """``repeats`` subprocesses per step count; the median peak is reported (the allocator adds a few
    tens of MiB of run-to-run noise)."""
    batch, members = (4096, 4) if quick else (4096, 16)
    rows = []
    for steps in (1000, 4000, 16000):
        runs = []
        for _ in range(repeats):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                str(steps),
                str(batch),
                str(members),
                device,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child failed:\n{proc.stderr}")
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        runs.sort(key=lambda r: r["peak_rss_mb"])
        row = {**runs[len(runs) // 2], "peak_rss_mb_runs": [r["peak_rss_mb"] for r in runs]}
        rows.append(row)
        print(
            f"  steps {steps:6d}: peak RSS {row['peak_rss_mb']:.1f} MiB (median of "
            f"{', '.join(f'{p:.1f}' for p in row['peak_rss_mb_runs'])}; {row['seconds']:.1f} s)",
            flush=True,
        )
    peaks = [r["peak_rss_mb"] for r in rows]
    return {
        "batch": batch,
        "members": members,
        "rows": rows,
        "peak_rss_mb_min": min(peaks),
        "peak_rss_mb_max": max(peaks),
        "peak_rss_growth_mb_1k_to_16k": peaks[-1] - peaks[0],
        "minibatch_working_set_mb": members * 2 * batch * 1 * 4 / 2**20,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        steps, batch, members, device = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
        print(json.dumps(child(steps, batch, members, device)))
        return {}
    args = _common.parser(__doc__.splitlines()[0], "benchmarks/results/memory.json").parse_args(
        argv
    )
    _common.setup_device(args.device)
    payload = run(args.quick, args.device)
    columns = (
        "steps",
        "batch",
        "members",
        "seconds",
        "rss_after_import_mb",
        "peak_rss_mb",
        "device_peak_mb",
        "materialised_dataset_mb",
    )
    _common.print_table("peak memory of fresh-sample training", payload["rows"], columns)
    print(
        f"peak RSS {payload['peak_rss_mb_min']:.1f}..{payload['peak_rss_mb_max']:.1f} MiB for 1k..16k "
        f"steps (growth {payload['peak_rss_growth_mb_1k_to_16k']:+.1f} MiB); a materialised dataset "
        f"would need {payload['rows'][-1]['materialised_dataset_mb']:.0f} MiB at 16k steps"
    )
    _common.write(args.out, "memory", args, payload)
    return payload


if __name__ == "__main__":
    main()
