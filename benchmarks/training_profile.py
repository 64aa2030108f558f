"""Where a training audit's run time goes, against the machine's own ceilings, and runs per CPU-second.

Three parts, one JSON:

* **Ceilings.** The machine's FLOP/s (a float32 matmul of 2048 x 2048) and memory bandwidth (a
  256 MB array read and written once), measured here, in this process, with every thread XLA uses.
* **Parts.** 256 vmapped runs of the engine (``make_run``, logistic regression and the 2-layer MLP
  on the digits, Poisson q = 0.01, T steps, the gradient canary, the library's DP-SGD), compiled
  once as they are and once with each part replaced by a constant (the Poisson batch by slots
  0 .. capacity - 1, the DP noise by zeros, the clipped gradient sum by zeros, the score by 0); a
  part's time is the full program's minus the program without it (the programs timed alternately,
  wall and process CPU time). XLA's cost analysis of the full program gives its FLOPs and bytes per
  run, so runs/s is set against the roofline: the time the FLOPs take at the measured FLOP/s, or the
  bytes at the measured bandwidth, whichever is longer.
* **Processes** (``--trees A B``). One fresh process per tree and model runs ``training_runs`` on D
  and D' (``--process-runs`` each, twice, the second time with another key): the whole process's CPU
  time (user + sys, imports and compilation included) and wall time, alternated between the trees,
  and the runs per CPU-second; the marginal rate (the second call's runs over its CPU time) beside.

    PYTHONPATH=. python benchmarks/training_profile.py --device cpu --steps 20
    git worktree add /tmp/base0 0af88ae
    PYTHONPATH=. python benchmarks/training_profile.py --device cpu --skip-parts \
        --trees /tmp/base0 . --process-runs 20000 --repeats 2
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax._src.training_auditor import batch_sampling, ghost_clipping
from cbdp_jax._src.training_auditor import runs as training_runs  # noqa: E402

PARTS = ("sampling", "noise", "gradients and clipping", "score")


def ceilings(repeats: int = 5) -> dict:
    """Measured float32 matmul FLOP/s and read+write bytes/s of this machine (best of ``repeats``)."""
    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    _common.block(mm(a))
    t_mm, _ = _common.timed(mm, a, repeats=repeats)
    big = jnp.ones(64 * 1024 * 1024, jnp.float32)  # 256 MB
    scale = jax.jit(lambda x: x * 1.0001)
    _common.block(scale(big))
    t_copy, _ = _common.timed(scale, big, repeats=repeats)
    return {"flops_per_s": 2 * n**3 / t_mm, "bytes_per_s": 2 * big.nbytes / t_copy}


@contextlib.contextmanager
def without(part: str | None):
    """Traces the engine with ``part`` replaced by a constant (None: as it is)."""
    saved = []

    def patch(obj, name, value):
        if hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    if part == "sampling":
        orig = batch_sampling.BatchSampler.batch

        def batch(self, plan, t, n, size=None, slots=None):
            idx, valid, over = orig(self, plan, t, n, size, slots)  # the shapes; draws discarded
            fixed = jnp.arange(idx.shape[0], dtype=jnp.int32)
            return fixed, jnp.ones_like(valid), jnp.zeros_like(over)

        # the draws are made but unused: XLA removes them as dead code
        patch(batch_sampling.BatchSampler, "batch", batch)
    elif part == "noise":
        zeros = lambda key, shape, dtype=jnp.float32: jnp.zeros(shape, dtype)
        with contextlib.suppress(ImportError):
            from cbdp_jax._src.training_auditor import normal_draws

            patch(normal_draws, "normal", zeros)
        patch(jax.random, "normal", zeros)
    elif part == "gradients and clipping":

        def summed(plan, graphdef, params, x, y, weights, clip, loss_on_logits):
            zero = jax.tree.map(jnp.zeros_like, params)
            return zero, jnp.ones(x.shape[0]) + 0.0 * jnp.sum(weights)

        patch(ghost_clipping, "clipped_sum", summed)
        patch(training_runs, "batch_grads", lambda prep, params, idx, valid, present: jax.tree.map(
            lambda p: jnp.zeros((idx.shape[0], *p.shape), p.dtype), params))  # fmt: skip
    elif part == "score":
        patch(training_runs, "_llr", lambda sampler, n, q, z, s2, m: jnp.sum(z) * 0.0)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def parts(model: str, steps: int, runs: int, repeats: int) -> dict:
    """The engine's time per run, whole and less each part (module docstring)."""
    problem = ta.build_problem(model=model, data="digits", rate=0.01, steps=steps, chunk=runs)
    prep = ta.prepare(problem)
    keys = jax.random.split(jax.random.key(0), runs)
    side = jnp.float32(1.0)
    programs, compile_s = {}, {}
    for part in (None, *PARTS):
        with without(part):
            run = ta.make_run(problem, prep)
            t0 = time.perf_counter()
            programs[part] = jax.jit(jax.vmap(run, in_axes=(0, None))).lower(keys, side).compile()
            compile_s[part] = time.perf_counter() - t0
        _common.block(programs[part](keys, side))
    wall = dict.fromkeys(programs, 0.0)
    cpu = dict.fromkeys(programs, 0.0)
    for _ in range(repeats):  # alternated: the load moves all of them alike
        for part, program in programs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            _common.block(program(keys, side))
            wall[part] += time.perf_counter() - w0
            cpu[part] += time.process_time() - c0
    per_run = lambda t: 1e6 * t / (repeats * runs)
    cost = scan_cost(model, steps, runs)
    row = {
        "model": model, "steps": steps, "runs": runs, "repeats": repeats,
        "physical_batch": problem.sampler.capacity(problem.examples),
        "parameters": int(sum(a.size for a in jax.tree.leaves(prep.params))),
        "flops_per_run": cost.get("flops", 0.0) / runs,
        "bytes_per_run": cost.get("bytes accessed", 0.0) / runs,
        "us_per_run": per_run(wall[None]), "cpu_us_per_run": per_run(cpu[None]),
        "runs_per_s": repeats * runs / wall[None], "runs_per_cpu_s": repeats * runs / cpu[None],
        "compile_s": compile_s[None],
    }  # fmt: skip
    for part in PARTS:
        row[f"{part} us"] = per_run(wall[None] - wall[part])
        row[f"{part} cpu us"] = per_run(cpu[None] - cpu[part])
    others = sum(row[f"{p} cpu us"] for p in PARTS)
    row["rest (scan, gather, update) cpu us"] = row["cpu_us_per_run"] - others
    return row


def _cost(model: str, steps: int, runs: int) -> dict:
    problem = ta.build_problem(model=model, data="digits", rate=0.01, steps=steps, chunk=runs)
    run = ta.make_run(problem, ta.prepare(problem))
    keys = jax.random.split(jax.random.key(0), runs)
    program = jax.jit(jax.vmap(run, in_axes=(0, None))).lower(keys, jnp.float32(1.0)).compile()
    cost = program.cost_analysis()
    return cost[0] if isinstance(cost, list) else cost


def scan_cost(model: str, steps: int, runs: int) -> dict:
    """XLA's FLOPs and bytes of ``runs`` runs of ``steps`` steps: T times a one-step program's.

    XLA's cost analysis counts a while loop's body once, whatever its trip count (a program of 20
    steps reports about what one of 2 steps does), so the run's cost is taken as T times that of a
    one-step run (an upper bound: the run's few operations outside the loop are counted T times).
    """
    one = _cost(model, 1, runs)
    return {name: steps * one.get(name, 0.0) for name in ("flops", "bytes accessed")}


def roofline(row: dict, ceil: dict) -> None:
    """Adds the roofline time per run and runs/s as a fraction of it."""
    t_flops = row["flops_per_run"] / ceil["flops_per_s"]
    t_bytes = row["bytes_per_run"] / ceil["bytes_per_s"]
    row["roofline_us"] = 1e6 * max(t_flops, t_bytes)
    row["bound"] = "FLOPs" if t_flops >= t_bytes else "bytes"
    row["fraction_of_roofline"] = row["roofline_us"] / row["us_per_run"]
    # the ceilings are measured with every core: the CPU time of a run spread over them
    cores = os.cpu_count() or 1
    row["fraction_of_roofline_cpu"] = row["roofline_us"] * cores / row["cpu_us_per_run"]


_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
import jax
jax.config.update('jax_platforms', 'cpu')
from cbdp_jax import training_audit as ta
model, steps, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
problem = ta.build_problem(model=model, data='digits', rate=0.01, steps=steps)
prep = ta.prepare(problem)
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
for side in (True, False):
    ta.training_runs(jax.random.key(0), problem, n, canary=side, prep=prep)
c1, w1 = cpu(), time.perf_counter()
for side in (True, False):
    ta.training_runs(jax.random.key(1), problem, n, canary=side, prep=prep)
c2, w2 = cpu(), time.perf_counter()
print(json.dumps({'cpu_s': c2, 'wall_s': w2 - t0, 'second_cpu_s': c2 - c1,
                  'second_wall_s': w2 - w1}))
"""


def process(tree: str, model: str, steps: int, n: int) -> dict:
    """One fresh process on ``tree``: 2 x 2 x n runs (D, D', two keys), its whole CPU and wall time."""
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), JAX_PLATFORMS="cpu")
    env["CBDP_JAX_COMPILATION_CACHE"] = "0"  # every process compiles: no tree reads a warm cache
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, model, str(steps), str(n)], env=env,
        capture_output=True, text=True, check=True, cwd=str(Path(tree).resolve()),
    )  # fmt: skip
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    total = 4 * n
    return {
        "tree": tree, "model": model, "steps": steps, "runs": total,
        "process_cpu_s": rec["cpu_s"], "process_wall_s": rec["wall_s"],
        "runs_per_cpu_s": total / rec["cpu_s"],
        "marginal_runs_per_cpu_s": 2 * n / rec["second_cpu_s"],
        "marginal_runs_per_s": 2 * n / rec["second_wall_s"], "load": os.getloadavg()[0],
    }  # fmt: skip


def processes(trees: list[str], models, steps: int, n: int, repeats: int) -> list[dict]:
    rows = []
    for rep in range(repeats):
        for model in models:
            order = trees if rep % 2 == 0 else trees[::-1]  # alternated: neither tree always first
            for t in order:  # each row printed as it comes (a run cut short keeps them)
                rows.append(process(t, model, steps, n) | {"repeat": rep})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = _common.parser(__doc__.splitlines()[0], "training_profile.json")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--runs", type=int, default=256, help="vmapped runs per program timed")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--models", nargs="+", default=["logreg", "mlp"])
    p.add_argument("--skip-parts", action="store_true", help="only the processes (--trees)")
    p.add_argument("--trees", nargs="*", default=[], help="source trees to compare (processes)")
    p.add_argument("--process-runs", type=int, default=20_000, help="runs per side and key")
    args = p.parse_args()
    _common.setup_device(args.device)
    load = os.getloadavg()
    payload: dict = {"load_before": load}
    if not args.skip_parts:
        ceil = ceilings()
        rows = [parts(m, args.steps, args.runs, args.repeats) for m in args.models]
        for row in rows:
            roofline(row, ceil)
        payload |= {"ceilings": ceil, "parts": rows}
        print(json.dumps(ceil))
        cols = ["model", "us_per_run", "cpu_us_per_run", *(f"{p} cpu us" for p in PARTS)]
        _common.print_table("CPU time per run (us), by part", rows,
                            [*cols, "rest (scan, gather, update) cpu us"])  # fmt: skip
        _common.print_table("against the roofline", rows, [
            "model", "flops_per_run", "bytes_per_run", "runs_per_s", "runs_per_cpu_s", "roofline_us",
            "bound", "fraction_of_roofline", "fraction_of_roofline_cpu", "compile_s"])  # fmt: skip
    if args.trees:
        rows = processes(args.trees, args.models, args.steps, args.process_runs, args.repeats)
        payload["processes"] = rows
        _common.print_table("whole processes", rows, [
            "tree", "model", "runs", "process_cpu_s", "process_wall_s", "runs_per_cpu_s",
            "marginal_runs_per_cpu_s", "load"])  # fmt: skip
    payload["load_after"] = os.getloadavg()
    _common.write(args.out, "training_profile", args, payload)


if __name__ == "__main__":
    main()
