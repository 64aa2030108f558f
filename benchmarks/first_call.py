"""The estimator's first call in a fresh process, empty program store and JAX cache: trees alternated.

Each unit is one fresh process with ``CBDP_JAX_CACHE_DIR`` set to a new empty folder: import (timed
apart), the first ``estimate_from_samples`` call at the library's defaults (what
``benchmarks/vs_dp_auditorium.py --ours-settings default`` runs: ``EstimatorConfig()``, the default
class, Renyi alpha = 2, one direction), then ``--repeats`` warm calls. The process counts XLA's
backend compiles of the first call and their seconds (JAX's compile-duration events; ``programs``:
each compile's program, wall seconds and the process's CPU seconds meanwhile). With several
``--trees`` (source trees put first on ``PYTHONPATH``: a commit before and after a change), the trees
alternate unit by unit, so both see the same load; ``uptime``'s 1-minute load is recorded per unit.

The samples are those of ``vs_dp_auditorium.py``'s cases (numpy, seeded): Laplace(0, 1) against
Laplace(1, 1), N(0, 1) against N(1, 1), and ``mean-v2``, DP-Auditorium's ``non_private_mean_v2``
mean mechanism at eps = 1 on D1 = [0] and D2 = [0, 1] (values in [0, 1]: the mean plus Laplace noise
of scale 2 / (|D| + Lap(2)), clamped at 1e-12), drawn here by numpy from that definition, so that
DP-Auditorium's venv is not needed. DP-Auditorium's own times are not measured here: the summary puts
beside ours the medians of its first and warm calls from ``measured/vs-dp-auditorium-default/``
(same cases and sizes, same machine; its README gives the commit and the load).

Usage:
  python benchmarks/first_call.py --trees /tmp/base1 . --out DIR
  python benchmarks/first_call.py --cases laplace --sizes 10000 --seeds 0 --trees . --out DIR
  python benchmarks/first_call.py --summarize --out DIR
"""

from __future__ import annotations

import time

T_START = time.perf_counter()
CPU_START = time.process_time()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
PEER_SUMMARY = HERE / "measured" / "vs-dp-auditorium-default" / "summary.json"
UNITS = (("laplace", 10_000), ("laplace", 100_000), ("gaussian", 100_000), ("mean-v2", 100_000))


def draw(case: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples per side of the case (see the module docstring)."""
    rng = np.random.default_rng(seed)
    if case == "laplace":
        return rng.laplace(0.0, 1.0, n), rng.laplace(1.0, 1.0, n)
    if case == "gaussian":
        return rng.normal(0.0, 1.0, n), rng.normal(1.0, 1.0, n)

    def mean_v2(data: np.ndarray) -> np.ndarray:
        noisy_count = len(data) + rng.laplace(0.0, 2.0, n)
        scale = np.maximum(1e-12, 2.0 / noisy_count)
        return np.sum(data) / len(data) + rng.laplace(0.0, scale, n)

    return mean_v2(np.array([0.0])), mean_v2(np.array([0.0, 1.0]))


def worker(args: argparse.Namespace) -> None:
    """One fresh process: import, the first call (its compiles counted), warm calls; JSON to stdout."""
    import jax

    from cbdp_jax.estimator import estimate_from_samples

    import_s, import_cpu = time.perf_counter() - T_START, time.process_time() - CPU_START
    compiles: list[float] = []
    programs: list[dict] = []  # each backend compile: the program, its wall and the process's CPU
    cpu_at_start: dict = {}

    def started(event: str, value: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            cpu_at_start[kwargs.get("fun_name")] = time.process_time()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)
            name = kwargs.get("fun_name")
            cpu = time.process_time() - cpu_at_start.pop(name, math.nan)
            programs.append({"program": name, "wall_s": duration, "cpu_s": cpu})

    jax.monitoring.register_scalar_listener(started)
    jax.monitoring.register_event_duration_secs_listener(listener)
    p, q = draw(args.case, args.n, args.seed)

    def call() -> dict:
        w0, c0 = time.perf_counter(), time.process_time()
        res = estimate_from_samples(jax.random.key(args.seed), p, q, divergence="renyi", alpha=2.0)
        return {
            "wall_s": time.perf_counter() - w0,
            "cpu_s": time.process_time() - c0,
            "bound": res.lower_bound,
            "input_map": res.input_map,
        }

    first = call()
    first.update(compiles=len(compiles), compile_s=sum(compiles), programs=list(programs))
    warm = [call() for _ in range(args.repeats)]
    print(
        json.dumps({"import_s": import_s, "import_cpu_s": import_cpu, "first": first, "warm": warm})
    )


def run_unit(tree: str, case: str, n: int, seed: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cbdp-first-") as cache:
        env = {**os.environ, "CBDP_JAX_CACHE_DIR": cache, "PYTHONPATH": str(Path(tree).resolve())}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--case", case]
        cmd += ["--n", str(n), "--seed", str(seed), "--repeats", str(repeats)]
        load = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree} {case} {n} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(
        tree=tree, case=case, n=n, seed=seed, load_before=load, load_after=os.getloadavg()[0]
    )
    return out


def peer_medians() -> dict:
    """DP-Auditorium's first-call and warm wall medians per (case, n) from the committed summary."""
    if not PEER_SUMMARY.exists():
        return {}
    runs = json.loads(PEER_SUMMARY.read_text())["runs"]
    out: dict = {}
    for r in runs:
        out.setdefault(f"{r['case']} {r['n_per_side']}", []).append(r)
    return {
        k: {
            "first_call_s": statistics.median(r["theirs_cold_call_s"] for r in rs),
            "warm_s": statistics.median(r["theirs_warm_s"] for r in rs),
            "bounds": [r["theirs_bound"] for r in rs],
            "load": [round(r["load"], 2) for r in rs],
        }
        for k, rs in out.items()
    }


def summarize(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    peer = peer_medians()
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["tree"], f"{r['case']} {r['n']}"), []).append(r)
    table = {}
    for (tree, unit), rs in sorted(groups.items()):
        med = statistics.median
        first = med(r["first"]["wall_s"] for r in rs)
        warm = med(med(w["wall_s"] for w in r["warm"]) for r in rs) if rs[0]["warm"] else None
        entry = {
            "runs": len(rs),
            "first_call_s": [round(r["first"]["wall_s"], 2) for r in rs],
            "first_call_cpu_s": [round(r["first"]["cpu_s"], 2) for r in rs],
            "first_call_median_s": round(first, 2),
            "compiles": [r["first"]["compiles"] for r in rs],
            "compile_s": [round(r["first"]["compile_s"], 2) for r in rs],
            "warm_median_s": None if warm is None else round(warm, 3),
            "warm_cpu_s": [round(med(w["cpu_s"] for w in r["warm"]), 3) for r in rs if r["warm"]],
            "bounds": [round(r["first"]["bound"], 4) for r in rs],
            "input_map": sorted({r["first"]["input_map"] for r in rs}),
            "load": [round(r["load_before"], 2) for r in rs],
        }
        if unit in peer:
            entry["dp_auditorium_first_call_over_ours"] = round(
                peer[unit]["first_call_s"] / first, 3
            )
            if warm:
                entry["dp_auditorium_warm_over_ours"] = round(peer[unit]["warm_s"] / warm, 2)
        table.setdefault(tree, {})[unit] = entry
    summary = {"ours": table, "dp_auditorium_committed": peer}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=["."], help="source trees, alternated")
    ap.add_argument("--cases", nargs="+", default=None, help="case names (default: all four units)")
    ap.add_argument("--sizes", nargs="+", type=int, default=None)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=2, help="warm calls after the first")
    ap.add_argument("--out", default="benchmarks/results/first-call")
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summarize:
        units = [
            (c, n)
            for c, n in UNITS
            if (args.cases is None or c in args.cases) and (args.sizes is None or n in args.sizes)
        ]
        with (out / "runs.jsonl").open("a") as f:
            for case, n in units:
                for seed in args.seeds:
                    for tree in args.trees:
                        r = run_unit(tree, case, n, seed, args.repeats)
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        w = r["warm"][-1]["wall_s"] if r["warm"] else float("nan")
                        print(
                            f"{Path(tree).resolve().name:10s} {case:8s} n={n:>7d} seed={seed} "
                            f"first {r['first']['wall_s']:6.2f} s ({r['first']['compiles']} "
                            f"compiles, {r['first']['compile_s']:.2f} s) warm {w:5.2f} s "
                            f"bound {r['first']['bound']:.4f} load {r['load_before']:.2f}",
                            flush=True,
                        )
    summarize(out)


if __name__ == "__main__":
    main()
