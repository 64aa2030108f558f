"""Shared helpers of the benchmark scripts: command line, device check, tables and JSON output."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from cbdp_jax._src.infra.io import atomic_write_json, environment_info


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --quick, --device, --out."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes (CPU, minutes)")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="cpu: force the CPU backend; gpu: fail unless JAX sees a GPU; auto: JAX's default",
    )
    p.add_argument("--out", default=default_out, help="JSON output file")
    return p


def setup_device(device: str) -> str:
    """Selects the backend; exits with a clear message when a GPU is requested but absent."""
    if device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    backend = jax.default_backend()
    if device == "gpu" and backend != "gpu":
        sys.exit(
            f"error: --device gpu requested but JAX's backend is {backend!r} "
            f"(devices: {jax.devices()}); install jax[cuda12] and check nvidia-smi"
        )
    return backend


def block(tree: Any) -> Any:
    """Waits for every array in ``tree``."""
    return jax.block_until_ready(tree)


def timed(fn, *args, repeats: int = 1) -> tuple[float, Any]:
    """Best wall time of ``repeats`` runs of ``fn(*args)`` (blocking on the result), and the result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = block(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, out


def fmt(value: Any) -> str:
    """A compact cell."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value == 0:
            return "0"
        a = abs(value)
        if a >= 1e5 or a < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def print_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Prints rows as a rich table when rich is installed, else as aligned plain text."""
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
        print(f"\n{title}")
        print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
        for row in cells:
            print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
        return
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for row in cells:
        table.add_row(*row)
    Console(width=max(120, shutil.get_terminal_size((160, 24)).columns)).print(table)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def write(path: str | Path, name: str, args: argparse.Namespace, payload: dict[str, Any]) -> Path:
    """Writes ``payload`` with the environment (device, jax version, commit) atomically as JSON."""
    out = {
        "benchmark": name,
        "quick": bool(args.quick),
        "environment": environment_info(),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        **payload,
    }
    path = atomic_write_json(path, out)
    print(f"wrote {path}")
    return path


def run_record(t0: float, load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The run's seconds since ``t0``, the load average before and now, and the environment."""
    return {
        "seconds": time.perf_counter() - t0,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": environment_info(),
    }
