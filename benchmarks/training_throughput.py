"""Training runs per second: vmapped in one compiled program against a Python loop of the same runs.

Logistic regression and a 2-layer MLP (32 hidden units) on scikit-learn's bundled digits (1797
examples + the canary), the library's DP-SGD step (``cbdp_jax.training_audit.dp_sgd``), Poisson
sampling at q = 0.01 (physical batch 60 for an expected 18), T steps, the gradient canary. Each timing
excludes compilation (a first call compiles; the compile time is reported apart):

* vmapped: ``training_runs(key, problem, R)``, R runs in one jit-compiled program;
* loop: the same run function, jitted once, called R_loop times from Python.

Then the wall time of one ``cbdp audit-training`` process (imports, compilation, 2 x RUNS trainings
and the audit) for logistic regression on digits.

    python benchmarks/training_throughput.py --out benchmarks/measured/training-throughput/summary.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402


def throughput(model: str, steps: int, runs: int, loop_runs: int) -> dict:
    problem = ta.build_problem(model=model, data="digits", rate=0.01, steps=steps, chunk=256)
    prep = ta.prepare(problem)
    t0 = time.perf_counter()
    ta.training_runs(jax.random.key(0), problem, runs, prep=prep)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ta.training_runs(jax.random.key(1), problem, runs, prep=prep)
    vmapped = time.perf_counter() - t0
    run = jax.jit(ta.make_run(problem, prep))
    keys = jax.random.split(jax.random.key(2), loop_runs + 1)
    t0 = time.perf_counter()
    jax.block_until_ready(run(keys[0], jnp.float32(1.0)))
    loop_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in keys[1:]:
        jax.block_until_ready(run(k, jnp.float32(1.0)))
    loop = time.perf_counter() - t0
    return {
        "model": model, "data": "digits", "steps": steps, "rate": 0.01,
        "physical_batch": problem.sampler.capacity(problem.examples),
        "vmapped_runs": runs, "vmapped_seconds": vmapped, "vmapped_runs_per_s": runs / vmapped,
        "vmapped_compile_s": first - vmapped, "loop_runs": loop_runs, "loop_seconds": loop,
        "loop_runs_per_s": loop_runs / loop, "loop_compile_s": loop_first - loop / loop_runs,
        "speedup": (runs / vmapped) / (loop_runs / loop),
    }  # fmt: skip


def programs(steps: int, runs: int, repeats: int = 3) -> list[dict]:
    """D and D' in one shared program against one program per side (a step per data set).

    The same problem (logistic regression on digits, add/remove) with the library's DP-SGD as one
    step for both sides (D' is D with its last slot absent: one program) and as a factory of the
    data set's size (``bug='mean-over-dataset'``: the sizes differ, so each side compiles its own).
    For each: the first call of each side (compile + run) and a second call (run only), the least of
    ``repeats`` fresh problems (the machine's load varies).
    """
    out = []
    for label, bug in (("one shared program", "none"), ("a program per side", "mean-over-dataset")):
        row = {"case": label, "steps": steps, "runs": runs, "repeats": repeats}
        for _ in range(repeats):  # a fresh problem each time: nothing compiled is reused
            problem = ta.build_problem(data="digits", rate=0.01, steps=steps, chunk=256, bug=bug)
            prep = ta.prepare(problem)
            for side in (True, False):
                name = "D" if side else "D'"
                t0 = time.perf_counter()
                ta.training_runs(jax.random.key(0), problem, runs, canary=side, prep=prep)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                ta.training_runs(jax.random.key(1), problem, runs, canary=side, prep=prep)
                second = time.perf_counter() - t0
                for key, value in (
                    (f"first call {name} (s)", first),
                    (f"second call {name} (s)", second),
                ):
                    row[key] = min(row.get(key, value), value)
        out.append(row)
    return out


def cli_call(runs: int, steps: int) -> dict:
    cmd = [
        sys.executable, "-m", "cbdp_jax.cli", "audit-training", "--model", "logreg", "--data",
        "digits", "--rate", "0.01", "--steps", str(steps), "--runs", str(runs), "--format", "json",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"cbdp audit-training failed: {proc.stderr}")
    record = json.loads(proc.stdout)
    return {
        "command": "cbdp " + " ".join(cmd[3:]), "runs_per_side": runs, "steps": steps,
        "wall_seconds": wall, "inside_seconds": record["training"]["seconds"],
        "violation": record["violation"], "claimed_epsilon": record["claimed"]["epsilon"],
        "empirical_epsilon": record["empirical"]["epsilon"],
        "trainings_per_s": 2 * runs / record["training"]["seconds"],
    }  # fmt: skip


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "training_throughput.json")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--runs", type=int, default=1024, help="vmapped runs timed")
    p.add_argument("--loop-runs", type=int, default=32, help="Python-loop runs timed")
    p.add_argument("--cli-runs", type=int, default=100_000, help="runs per side of the CLI call")
    p.add_argument("--cli-steps", type=int, default=100)
    p.add_argument("--programs", action="store_true", help="only: one shared program vs two")
    args = p.parse_args()
    _common.setup_device(args.device)
    if args.quick:
        args.runs, args.loop_runs, args.cli_runs, args.steps = 256, 8, 2000, 20
        args.cli_steps = 20
    if args.programs:
        rows = programs(args.steps, args.runs)
        _common.print_table("D and D': compile and run", rows, list(rows[0]))
        _common.write(args.out, "training_programs", args, {"programs": rows})
        return
    rows = [throughput(m, args.steps, args.runs, args.loop_runs) for m in ("logreg", "mlp")]
    _common.print_table(
        f"training runs per second ({jax.default_backend()})", rows,
        ["model", "steps", "vmapped_runs_per_s", "loop_runs_per_s", "speedup", "vmapped_compile_s"],
    )  # fmt: skip
    cli = cli_call(args.cli_runs, args.cli_steps) if args.cli_runs > 0 else None
    if cli is not None:
        print(json.dumps(cli, indent=2))
    _common.write(args.out, "training_throughput", args, {"throughput": rows, "cli": cli})


if __name__ == "__main__":
    main()
