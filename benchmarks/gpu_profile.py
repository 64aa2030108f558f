"""Where an MLP ensemble's training time goes: a kernel profile of the compiled training program.

``scaling.py`` reports the FLOP rate of vmapped MLP training as a fraction of the measured matrix-product
rate. This script says where the rest of the time goes. For each setting (width, ensemble size M,
batch per side) it

1. times the sweep's training program (``cbdp_jax._src.estimator.sweep_programs._train_program``: fresh Laplace minibatches
   drawn inside the compiled step, Adam, one validation pass at the end), warm, best of 3, with the FLOPs
   counted from the shapes as in ``scaling.py`` (3 x forward matrix-product FLOPs per sample,
   2 x batch samples per member-step: a lower bound on the work);
2. runs the same compiled call once under ``jax.profiler.trace`` and sums the device's kernel times by
   kind: matrix products (cuBLAS / CUTLASS / Triton GEMM kernels, recognised by name), other kernels
   (XLA's fused elementwise and reduction loops: Adam, ReLU, the noise, the objective), copies and
   memsets; the time the device's streams sat idle is the wall time minus the union of the kernel
   intervals (launch gaps and host work);
3. estimates the per-step memory traffic of the optimiser (Adam reads parameters, gradients and two
   moments and writes three of them back: 7 x 4 bytes per parameter) against the device's bandwidth,
   the part of the step that does not grow with the batch.

The settings: the MLP of 2 hidden layers of width 512 at batch 256 and M = 1024 (the setting of the
best figure in scaling.py), the same network at the library's default batch (4096 per side,
``EstimatorConfig.batch_size``) with M = 256, and the library's default width (64) at the default batch.
The kernel names and their classification are kept in the JSON (the 25 longest kernels), so the
classification can be checked.

``--settings`` picks rows of ``FULL`` by name (``wide-small-batch``, ``wide-library-batch``,
``default-width``); ``--variant`` labels a run made under other ``XLA_FLAGS`` (recorded with the flags
and the JAX matmul precision), so that runs of one setting under several compiler options compare:
benchmarks/gpu_session.sh runs the library's batch under XLA's default GEMM path, cuBLASLt (bias and
ReLU fused into the GEMM's epilogue) and Triton GEMM fusion (element-wise producers and consumers fused
into the GEMM), each in a fresh process.

    python benchmarks/gpu_profile.py --device gpu --out DIR/gpu_profile.json
    python benchmarks/gpu_profile.py --device gpu --settings wide-library-batch --variant cublaslt \
        --out DIR/gpu_profile_cublaslt.json       # with XLA_FLAGS=--xla_gpu_enable_cublaslt=true
    python benchmarks/gpu_profile.py --quick --device cpu --out /tmp/gpu_profile.json   # smoke test
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import scaling  # noqa: E402
import throughput  # noqa: E402

from cbdp_jax._src.estimator import sweep_programs  # noqa: E402

GEMM_MARKERS = ("gemm", "xmma", "cutlass", "cublas", "matmul", "wgmma", "__triton_gemm")
COPY_MARKERS = ("memcpy", "memset", "copy")
ADAM_BYTES_PER_PARAMETER = 7 * 4  # read p, g, m, v; write p, m, v (float32)

FULL = (
    {"name": "wide-small-batch", "width": 512, "members": 1024, "batch": 256, "steps": 100},
    {"name": "wide-library-batch", "width": 512, "members": 256, "batch": 4096, "steps": 50},
    {"name": "default-width", "width": 64, "members": 1024, "batch": 4096, "steps": 100},
)
QUICK = ({"name": "quick", "width": 32, "members": 4, "batch": 64, "steps": 5},)


def kind_of(name: str) -> str:
    """``'matmul'``, ``'copy'`` or ``'other'`` for a kernel name."""
    low = name.lower()
    if any(m in low for m in GEMM_MARKERS):
        return "matmul"
    if any(m in low for m in COPY_MARKERS):
        return "copy"
    return "other"


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals, in the intervals' unit."""
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def device_kernels(trace: dict | list) -> list[dict[str, Any]]:
    """Complete events on the device's kernel streams of a perfetto trace (durations in us).

    Only a GPU's stream lines are read (``Stream #...``); derived lines ("XLA Ops", "XLA Modules")
    would count the same time twice. Without a GPU process (CPU backend) the list is empty.
    """
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu_pids = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "GPU" in str(e.get("args", {}).get("name", ""))
    }
    threads = {
        (e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in gpu_pids
    }
    streams = {t for t, name in threads.items() if name.startswith("Stream")}
    if not streams:  # another trace layout: every line of the GPU but the derived ones
        streams = {t for t, name in threads.items() if not name.startswith("XLA")}
    return [
        e
        for e in events
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in streams and "dur" in e
    ]


def summarise(kernels: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Seconds by kind of kernel, the streams' idle time and the longest kernels."""
    by_kind = {"matmul": 0.0, "other": 0.0, "copy": 0.0}
    by_name: dict[str, float] = {}
    for e in kernels:
        seconds = float(e["dur"]) * 1e-6
        by_kind[kind_of(e["name"])] += seconds
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + seconds
    busy = _union_seconds([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels])
    busy *= 1e-6
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:25]
    return {
        "kernels": len(kernels),
        "seconds_by_kind": by_kind,
        "fraction_of_wall_by_kind": {k: v / wall_s for k, v in by_kind.items()},
        "busy_seconds": busy,
        "idle_seconds": max(wall_s - busy, 0.0),
        "top_kernels": [{"name": n[:200], "kind": kind_of(n), "seconds": s} for n, s in top],
    }


def profile_call(compiled, args, keep: Path | None = None) -> tuple[float, list[dict[str, Any]]]:
    """One traced call of ``compiled(*args)``: its wall time and the device's kernel events.

    ``keep``: where to copy the perfetto trace (for a look in ui.perfetto.dev), if given.
    """
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            t0 = time.perf_counter()
            _common.block(compiled(*args))
            wall = time.perf_counter() - t0
        paths = glob.glob(f"{log_dir}/**/perfetto_trace.json.gz", recursive=True)
        if not paths:
            return wall, []
        if keep is not None:
            shutil.copyfile(paths[0], keep)
        with gzip.open(paths[0], "rt") as fh:
            trace = json.load(fh)
    return wall, device_kernels(trace)


def parameters_per_member(width: int, depth: int = 2, dim: int = 1) -> int:
    sizes = [dim] + [width] * depth + [1]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def _cost(compiled) -> dict[str, float | None]:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # not every backend implements it
        return {"xla_flops": None, "xla_bytes_accessed": None}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return {"xla_flops": cost.get("flops"), "xla_bytes_accessed": cost.get("bytes accessed")}


def measure(
    setting: dict[str, int],
    peak: dict[str, Any],
    bandwidth: float | None,
    trace_dir: Path | None = None,
) -> dict:
    width, members, batch, steps = (setting[k] for k in ("width", "members", "batch", "steps"))
    prep = throughput.prepare(members, "mlp", batch=batch, steps=steps, width=width)
    args = prep["args"]
    t0 = time.perf_counter()
    compiled = sweep_programs._train_program.lower(*args, static=prep["static"]).compile()
    compile_s = time.perf_counter() - t0
    _common.block(compiled(*args))
    seconds, _ = _common.timed(compiled, *args, repeats=3)
    flops = scaling.step_flops(members, width, batch) * steps
    keep = None
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        keep = trace_dir / f"trace_w{width}_m{members}_b{batch}.json.gz"
    traced_wall, kernels = profile_call(compiled, args, keep)
    adam_bytes = ADAM_BYTES_PER_PARAMETER * parameters_per_member(width) * members * steps
    row = {
        **setting,
        "adversary": f"mlp({width}x2)",
        "compile_s": compile_s,
        "seconds": seconds,
        "counted_flops": flops,
        "flops_per_s": flops / seconds,
        "fraction_of_measured_matmul_peak": flops / seconds / peak["flops_per_s"],
        "matmul_floor_seconds": flops / peak["flops_per_s"],
        "adam_bytes": adam_bytes,
        "adam_floor_seconds": adam_bytes / bandwidth if bandwidth else None,
        "traced_wall_seconds": traced_wall,
        **_cost(compiled),
    }
    if kernels:
        row["profile"] = summarise(kernels, traced_wall)
    return row


def report(row: dict[str, Any]) -> str:
    text = (
        f"{row['adversary']} M={row['members']} batch={row['batch']}: {row['seconds']:.3f} s, "
        f"{row['flops_per_s'] / 1e12:.2f} TFLOP/s = {row['fraction_of_measured_matmul_peak']:.1%}"
        " of the measured matmul rate"
    )
    prof = row.get("profile")
    if prof:
        f = prof["fraction_of_wall_by_kind"]
        text += (
            f"; traced {row['traced_wall_seconds']:.3f} s: matmul kernels {f['matmul']:.1%}, "
            f"other kernels {f['other']:.1%}, copies {f['copy']:.1%}, idle "
            f"{prof['idle_seconds'] / row['traced_wall_seconds']:.1%}"
        )
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = _common.parser(__doc__.splitlines()[0], "gpu_profile.json")
    p.add_argument("--trace-dir", type=Path, default=None, help="keep the perfetto traces here")
    p.add_argument("--settings", nargs="+", default=None, help="rows of FULL by name (default all)")
    p.add_argument("--variant", default="default", help="a label for the compiler options in force")
    args = p.parse_args(argv)
    _common.setup_device(args.device)
    kind = jax.devices()[0].device_kind
    peak = scaling.matmul_peak(n=1024 if args.quick else 8192)
    bandwidth = next((v for k, v in scaling.SPEC_BANDWIDTH.items() if k in kind), None)
    print(f"device {kind}: matmul {peak['flops_per_s'] / 1e12:.1f} TFLOP/s ({peak['precision']})")
    rows = []
    chosen = QUICK if args.quick else FULL
    if args.settings and not args.quick:
        chosen = tuple(s for s in FULL if s["name"] in args.settings)
    for setting in chosen:
        rows.append(measure(setting, peak, bandwidth, args.trace_dir))
        print(report(rows[-1]), flush=True)
    payload = {
        "device_kind": kind,
        "variant": args.variant,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "matmul_peak_measured": peak,
        "spec_bandwidth_bytes_per_s": bandwidth,
        "gemm_markers": list(GEMM_MARKERS),
        "rows": rows,
    }
    _common.write(args.out, "gpu_profile", args, payload)
    return payload


if __name__ == "__main__":
    main()
