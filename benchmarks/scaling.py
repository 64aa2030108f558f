"""How vmapped training scales with the ensemble size and the adversary's width, against the device's peak.

For each class (linear; ReLU MLPs of two hidden layers of width 8, 32, 128 and 512) and each ensemble
size M = 1, 4, 16, ..., 4096 (quick: up to 256, widths up to 128) this times ONE compiled sweep training
program (``cbdp_jax._src.estimator.sweep_programs._train_program``: fresh Laplace minibatches of ``batch`` samples per side
drawn inside the compiled step, Adam, one shared noise draw per step, one validation pass at the end).
Times are warm (best of ``repeats`` calls, after one untimed call); compile times are separate.

Reported per setting: adversary-steps per second (members x optimiser steps / s), samples per second
(x 2 sides x batch), the program's memory from XLA's own analysis (arguments + outputs + temporaries),
and for the MLPs the achieved FLOP rate.

FLOPs are counted from the shapes, as the usual "6 x parameters x tokens" rule for dense networks: a
forward pass over n inputs costs 2 n sum_l (fan_in_l x fan_out_l) multiply-add FLOPs in the matrix
products; a training step (forward, and backward to the weights and the activations) costs 3 times the
forward. Elementwise work (ReLU, Adam, the noise, the objective) and the one validation pass are NOT
counted, so the achieved rate is a lower bound on the work done. The rate is compared with

- ``matmul_peak_measured``: a large square matrix product (8192^3) in the same dtype and the same default
  matrix-product precision, timed on this device: the rate dense matrix products actually reach here;
- ``spec_peak``: the vendor's dense peak for that precision, where the device is known (H100 / H200
  SXM: 66.9 TFLOP/s FP32, 494.7 TFLOP/s TF32 tensor cores); ``null`` otherwise.

Which precision the default is (on NVIDIA GPUs JAX's default float32 matrix product may use TF32 tensor
cores) is measured, not assumed: the relative error of the big product against a float64 product says
``fp32`` (about 1e-6) or ``tf32`` (about 1e-3).

The largest ensemble that fits: for the widest MLP and for the linear class, M doubles past the grid
(few steps) until XLA reports that the device is out of memory or a limit is reached; the last M that
ran and the error of the first that did not are recorded.

    python benchmarks/scaling.py --device gpu --out DIR/scaling.json
    python benchmarks/scaling.py --quick --device cpu --out DIR/scaling.json   # smoke test, minutes
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import throughput  # noqa: E402

from cbdp_jax._src.estimator import sweep_programs  # noqa: E402

# Vendor dense peaks in FLOP/s (NVIDIA H100 SXM5 / H200 SXM datasheets; no sparsity).
SPEC_PEAKS = {
    "H100": {"fp32": 66.9e12, "tf32": 494.7e12},
    "H200": {"fp32": 66.9e12, "tf32": 494.7e12},
}
# Vendor memory bandwidth in bytes/s, for context in the JSON (not used in a ratio here).
SPEC_BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H200": 4.8e12}


def mlp_matmul_flops(width: int, depth: int = 2, dim: int = 1) -> int:
    """Multiply-add FLOPs of one forward pass of one input through the MLP's matrix products."""
    sizes = [dim] + [width] * depth + [1]
    return 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def step_flops(members: int, width: int | None, batch: int) -> float:
    """Counted FLOPs of one training step of the whole ensemble (0 for the linear class)."""
    if width is None:
        return 0.0
    return 3.0 * members * 2 * batch * mlp_matmul_flops(width)


def matmul_peak(dtype=jnp.float32, n: int = 8192, repeats: int = 5) -> dict[str, Any]:
    """Rate of a large dense matrix product in the default precision, and which precision it used."""
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dtype)
    b = jax.random.normal(kb, (n, n), dtype)
    f = jax.jit(jnp.dot)
    _common.block(f(a, b))
    best, out = _common.timed(f, a, b, repeats=repeats)
    # Precision actually used: compare a corner with a float64 product on the host.
    m = 256
    ref = np.asarray(a[:m], np.float64) @ np.asarray(b[:, :m], np.float64)
    err = float(np.max(np.abs(np.asarray(out[:m, :m], np.float64) - ref)) / np.max(np.abs(ref)))
    return {
        "n": n,
        "seconds": best,
        "flops_per_s": 2.0 * n**3 / best,
        "relative_error": err,
        "precision": "fp32" if err < 1e-5 else "tf32" if err < 1e-2 else "bf16-or-lower",
    }


def spec_peak(device_kind: str, precision: str) -> float | None:
    """The vendor's dense peak for ``precision`` on this device, if the device is known."""
    for name, peaks in SPEC_PEAKS.items():
        if name in device_kind:
            return peaks.get(precision)
    return None


def _is_oom(err: BaseException) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _memory_bytes(compiled) -> int | None:
    try:
        m = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        return None
    if m is None:
        return None
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def measure(
    members: int, width: int | None, *, batch: int, steps: int, repeats: int
) -> dict[str, Any]:
    """Warm time of the vmapped training program for ``members`` adversaries of one class."""
    adversary = "linear" if width is None else "mlp"
    prep = throughput.prepare(members, adversary, batch=batch, steps=steps, width=width)
    static, args = prep["static"], prep["args"]
    t0 = time.perf_counter()
    compiled = sweep_programs._train_program.lower(*args, static=static).compile()
    compile_s = time.perf_counter() - t0
    _common.block(compiled(*args))
    seconds, out = _common.timed(compiled, *args, repeats=repeats)
    finite = bool(np.all(np.isfinite(np.asarray(out.best_value))))
    flops = step_flops(members, width, batch) * steps
    return {
        "adversary": "linear" if width is None else f"mlp({width}x2)",
        "width": width,
        "ensemble": members,
        "batch": batch,
        "steps": steps,
        "compile_s": compile_s,
        "seconds": seconds,
        "adv_steps_per_s": members * steps / seconds,
        "samples_per_s": members * steps * 2 * batch / seconds,
        "counted_flops": flops,
        "flops_per_s": flops / seconds if flops else None,
        "program_bytes": _memory_bytes(compiled),
        "all_finite": finite,
    }


def largest_fitting(
    width: int | None,
    *,
    start: int,
    limit: int,
    batch: int,
    steps: int,
    time_limit_s: float = 60.0,
) -> dict[str, Any]:
    """Doubles the ensemble from ``start`` until the device runs out of memory, ``limit`` is passed or
    one try (compile and run) takes longer than ``time_limit_s``."""
    last_ok, last_row, failure, stopped_by, m = None, None, None, "limit", start
    while m <= limit:
        t0 = time.perf_counter()
        try:
            row = measure(m, width, batch=batch, steps=steps, repeats=1)
        except Exception as err:  # noqa: BLE001 - an OOM ends the search; anything else is reported
            failure = {"ensemble": m, "oom": _is_oom(err), "error": str(err).splitlines()[0][:300]}
            stopped_by = "out of memory" if failure["oom"] else "error"
            break
        last_ok, last_row = m, row
        took = time.perf_counter() - t0
        print(f"    fits: M={m} ({row['program_bytes'] or 0:.3e} bytes, {took:.1f} s)", flush=True)
        if took > time_limit_s:
            stopped_by = "time"
            break
        m *= 2
    return {
        "adversary": "linear" if width is None else f"mlp({width}x2)",
        "batch": batch,
        "steps": steps,
        "largest_ensemble_run": last_ok,
        "largest_row": last_row,
        "first_failure": failure,
        "search_limit": limit,
        "time_limit_s": time_limit_s,
        "stopped_by": stopped_by,
    }


def run(quick: bool, checkpoint=None) -> dict[str, Any]:
    """The whole grid; returns the JSON payload.

    ``checkpoint(payload)``, when given, is called with the grid's payload before the (open-ended)
    search for the largest ensemble, so the grid is saved even if that search is interrupted.
    """
    ensembles = (1, 4, 16, 64, 256) if quick else (1, 4, 16, 64, 256, 1024, 4096)
    widths = (8, 32, 128) if quick else (8, 32, 128, 512)
    repeats = 2 if quick else 3
    lin = {"batch": 16, "steps": 200 if quick else 1000}
    mlp = {"batch": 64 if quick else 256, "steps": 20 if quick else 100}
    kind = jax.devices()[0].device_kind
    peak = matmul_peak(n=1024 if quick else 8192)
    spec = spec_peak(kind, peak["precision"])
    print(
        f"device {kind}: 8192^3 matmul {peak['flops_per_s'] / 1e12:.1f} TFLOP/s "
        f"(precision {peak['precision']}, rel. error {peak['relative_error']:.1e}); spec {spec}",
        flush=True,
    )
    rows = []
    for width in (None, *widths):
        cfg = lin if width is None else mlp
        for m in ensembles:
            row = measure(m, width, repeats=repeats, **cfg)
            if row["flops_per_s"]:
                row["fraction_of_measured_matmul_peak"] = row["flops_per_s"] / peak["flops_per_s"]
                row["fraction_of_spec_peak"] = row["flops_per_s"] / spec if spec else None
            rows.append(row)
            extra = ""
            if row["flops_per_s"]:
                extra = (
                    f", {row['flops_per_s'] / 1e12:.2f} TFLOP/s = "
                    f"{row['fraction_of_measured_matmul_peak']:.1%} of the measured matmul peak"
                )
            print(
                f"  {row['adversary']:>11s} M={m:5d}: {row['seconds'] * 1e3:9.1f} ms, "
                f"{row['adv_steps_per_s']:.3e} adv-steps/s, {row['samples_per_s']:.3e} samples/s"
                f"{extra}",
                flush=True,
            )
    best = max((r for r in rows if r["flops_per_s"]), key=lambda r: r["flops_per_s"])
    payload = {
        "device_kind": kind,
        "matmul_peak_measured": peak,
        "spec_peak_flops_per_s": spec,
        "spec_bandwidth_bytes_per_s": next(
            (v for k, v in SPEC_BANDWIDTH.items() if k in kind), None
        ),
        "flop_count_rule": "3 x forward matmul FLOPs per sample, 2 x batch samples per member-step",
        "best_mlp": {
            k: best[k] for k in ("adversary", "ensemble", "batch", "flops_per_s", "samples_per_s")
        }
        | {
            "fraction_of_measured_matmul_peak": best["fraction_of_measured_matmul_peak"],
            "fraction_of_spec_peak": best.get("fraction_of_spec_peak"),
        },
        "rows": rows,
        "largest_fitting": [],
    }
    if quick:
        return payload
    if checkpoint is not None:
        checkpoint(payload)
    print("largest ensemble that fits:", flush=True)
    payload["largest_fitting"] = [
        largest_fitting(widths[-1], start=ensembles[-1], limit=2**16, batch=mlp["batch"], steps=5),
        largest_fitting(None, start=ensembles[-1], limit=2**22, batch=16, steps=20),
    ]
    return payload


COLUMNS = (
    "adversary",
    "ensemble",
    "batch",
    "steps",
    "compile_s",
    "seconds",
    "adv_steps_per_s",
    "samples_per_s",
    "flops_per_s",
    "fraction_of_measured_matmul_peak",
    "fraction_of_spec_peak",
    "program_bytes",
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _common.parser(__doc__.splitlines()[0], "benchmarks/results/scaling.json").parse_args(
        argv
    )
    _common.setup_device(args.device)
    payload = run(args.quick, checkpoint=lambda p: _common.write(args.out, "scaling", args, p))
    _common.print_table(
        "vmapped training: scaling with ensemble and width", payload["rows"], COLUMNS
    )
    b = payload["best_mlp"]
    print(
        f"best MLP throughput: {b['flops_per_s'] / 1e12:.2f} TFLOP/s ({b['adversary']}, M = "
        f"{b['ensemble']}) = {b['fraction_of_measured_matmul_peak']:.1%} of the measured "
        f"{payload['matmul_peak_measured']['precision']} matmul rate"
        + (
            f", {b['fraction_of_spec_peak']:.1%} of the spec peak"
            if b["fraction_of_spec_peak"]
            else ""
        )
    )
    for f in payload["largest_fitting"]:
        print(
            f"largest {f['adversary']} ensemble that ran: {f['largest_ensemble_run']} "
            f"(stopped by {f['stopped_by']}: {f['first_failure']})"
        )
    _common.write(args.out, "scaling", args, payload)
    return payload


if __name__ == "__main__":
    main()
