"""Compiles at a second sample size, and the first call at an empty store, this tree against another.

Two measurements of issue 41's "no compile a user waits for twice", each process fresh:

1. ``--cli``: ``cbdp estimate --mechanism laplace --epsilon 1 --adversary mlp --divergence renyi
   --alpha 2 --samples 10000``, then the same with ``--samples 20000``, in two processes on one
   program store and JAX cache (``CBDP_JAX_CACHE_DIR``, emptied before the first). Each process counts
   the programs XLA compiled or JAX took from its own cache (``jax.monitoring``'s backend-compile
   events, with their seconds; a program run from the package's store raises none) and records
   ``JAX_LOG_COMPILES=1``'s "Finished XLA compilation" lines (the same programs, by name).
2. ``--first-call``: the first ``estimate_from_samples`` in a fresh process with an empty store and
   JAX cache, at the library's defaults (``EstimatorConfig()``, the default class; the samples of
   ``benchmarks/vs_dp_auditorium.py``'s Laplace case: Lap(0, 1) against Lap(1, 1), n per side, the
   seed's NumPy draw, Renyi alpha = 2), import excluded: wall and CPU seconds of the call, and the
   compiles in it. With ``--other TREE`` the same child runs from that tree (``PYTHONPATH``), the two
   trees alternated, so both see the same load.

    python benchmarks/second_size.py --cli --first-call --other /tmp/main-tree --seeds 0 1 2 \
        --out benchmarks/results/second_size.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
CLI = ["estimate", "--mechanism", "laplace", "--epsilon", "1", "--adversary", "mlp",
       "--divergence", "renyi", "--alpha", "2", "--format", "json"]  # fmt: skip

# Counts backend compiles and their seconds in the process; prints one JSON line on stderr at exit.
COUNTER = r"""
import atexit, json, sys, time
import jax
compiles = {"count": 0, "seconds": 0.0}
def listener(event, duration, **kw):
    if "backend_compile" in event:
        compiles["count"] += 1
        compiles["seconds"] += duration
jax.monitoring.register_event_duration_secs_listener(listener)
"""

CLI_CHILD = (
    COUNTER
    + r"""
from cbdp_jax import cli
try:
    cli.app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps({"compiles": compiles}), file=sys.stderr)
"""
)

FIRST_CALL_CHILD = (
    COUNTER
    + r"""
import numpy as np
from cbdp_jax.estimator import estimate_from_samples
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(seed)
p, q = rng.laplace(0.0, 1.0, n), rng.laplace(1.0, 1.0, n)
w0, c0 = time.perf_counter(), time.process_time()
res = estimate_from_samples(jax.random.key(seed), p, q, divergence="renyi", alpha=2.0)
print(json.dumps({
    "call_wall_s": time.perf_counter() - w0, "call_cpu_s": time.process_time() - c0,
    "compiles": compiles, "lower_bound": res.lower_bound,
    "budget": {k: res.config.get(k) for k in ("steps", "ensemble", "batch_size")},
}), file=sys.stderr)
"""
)


def _child(code: str, args: list[str], cache: str, tree: Path) -> dict[str, Any]:
    env = dict(os.environ, CBDP_JAX_CACHE_DIR=cache, PYTHONPATH=str(tree), JAX_LOG_COMPILES="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
        cwd=tempfile.gettempdir(), check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    info = json.loads(proc.stderr.strip().splitlines()[-1])
    # JAX_LOG_COMPILES's lines: one per program JAX compiled or took from its own cache (a program
    # run from the package's store is neither), as the counter's events.
    logged = [line for line in proc.stderr.splitlines() if "Finished XLA compilation of" in line]
    info["logged_compiles"] = [
        line.split("Finished XLA compilation of ")[1][:80] for line in logged
    ]
    return {**info, "process_wall_s": time.perf_counter() - t0, "load_1min": load}


def cli_sizes(tree: Path) -> list[dict[str, Any]]:
    """``cbdp estimate`` at 10k then 20k per side, two fresh processes on one emptied store."""
    with tempfile.TemporaryDirectory() as cache:
        return [
            {"samples": n, **_child(CLI_CHILD, [*CLI, "--samples", str(n)], cache, tree)}
            for n in (10_000, 20_000)
        ]


def first_calls(trees: dict[str, Path], n: int, seeds: list[int]) -> list[dict[str, Any]]:
    """The first call at an empty store, per seed, the trees alternated (which runs first, too)."""
    rows = []
    for i, seed in enumerate(seeds):
        order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
        for name, tree in order:
            with tempfile.TemporaryDirectory() as cache:
                out = _child(FIRST_CALL_CHILD, [str(n), str(seed)], cache, tree)
            rows.append({"tree": name, "seed": seed, "n_per_side": n, **out})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(payload: dict[str, Any]) -> dict[str, Any]:
    """The committed summary: compiles per CLI process, and the first calls per tree (medians, seeds)."""
    out: dict[str, Any] = {k: payload[k] for k in ("commit", "trees", "environment")}
    for name, rows in payload.get("cli", {}).items():
        out.setdefault("cli", {})[name] = [{
            "samples": r["samples"], "compiles": r["compiles"]["count"],
            "compile_s": round(r["compiles"]["seconds"], 2), "process_wall_s": round(r["process_wall_s"], 2),
            "programs": [c.split(" in ")[0] for c in r["logged_compiles"]], "load_1min": round(r["load_1min"], 2),
        } for r in rows]  # fmt: skip
    for name in payload["trees"]:
        rows = [r for r in payload.get("first_call", []) if r["tree"] == name]
        if not rows:
            continue
        out.setdefault("first_call", {})[name] = {
            "median_call_wall_s": round(statistics.median(r["call_wall_s"] for r in rows), 2),
            "median_call_cpu_s": round(statistics.median(r["call_cpu_s"] for r in rows), 2),
            "per_seed": [{
                "seed": r["seed"], "call_wall_s": round(r["call_wall_s"], 2),
                "call_cpu_s": round(r["call_cpu_s"], 2), "compiles": r["compiles"]["count"],
                "compile_s": round(r["compiles"]["seconds"], 2), "lower_bound": r["lower_bound"],
                "budget": r["budget"], "load_1min": round(r["load_1min"], 2),
            } for r in rows],
        }  # fmt: skip
    return out


def _commit(tree: Path) -> str:
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return proc.stdout.strip() or "unknown (not a git tree)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", action="store_true", help="compiles of cbdp estimate at 10k, then 20k")
    ap.add_argument("--first-call", action="store_true", help="the first call at an empty store")
    ap.add_argument(
        "--other", help="another tree (a checkout of the package) to run beside this one"
    )
    ap.add_argument("--other-name", default="other")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=10_000, help="samples per side of --first-call")
    ap.add_argument("--out", default="benchmarks/results/second_size.json", help="the summary")
    ap.add_argument("--raw", help="every process's record, too (a JSON file)")
    args = ap.parse_args()
    trees = {"this": TREE}
    if args.other:
        trees[args.other_name] = Path(args.other).resolve()
    payload: dict[str, Any] = {
        "commit": _commit(TREE),
        "trees": {k: str(v) for k, v in trees.items()},
        "environment": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    if args.cli:
        payload["cli"] = {name: cli_sizes(tree) for name, tree in trees.items()}
        print(json.dumps(payload["cli"]), flush=True)
    if args.first_call:
        payload["first_call"] = first_calls(trees, args.n, args.seeds)
    if args.raw:
        Path(args.raw).write_text(json.dumps(payload, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summarize(payload), indent=1))


if __name__ == "__main__":
    main()
