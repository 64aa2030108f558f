"""Training throughput: one vmapped program over an ensemble versus a Python loop over its members.

Both sides run the SAME compiled sweep training program (cbdp_jax._src.estimator.sweep_programs._train_program: fresh
Laplace minibatches drawn inside a lax.scan, Adam, early stopping on a validation sample); the vmapped
side calls it once with all M members, the loop side calls the same program compiled for one member M
times (inputs pre-sliced; all calls dispatched, then one block_until_ready). The results are the same
numbers either way (members never interact, and with shared noise each member sees the same step noise
whether it runs alone or in the batch), so the two sides do the same work. Times are warm; compile times
are reported separately. Each repeat times the two sides back to back (interleaved); ``speedup`` is the
ratio of the best times and ``speedup_paired_median`` the median over repeats of the per-repeat ratio,
which cancels slow drifts of the machine's speed. The headline uses the paired median; both are in
the JSON.

Reports adversary-steps/s (members x optimiser steps per second) and samples/s (x 2 x batch) for
ensembles of 1..1024 small adversaries and for MLP widths 8..512, the vmap/loop speedup, the
64-vmapped-versus-64-sequential comparison, and (top-level key ``vmap_over_loop_speedup``) the speedup
for an ensemble of 256 small adversaries.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from cbdp_jax._src.estimator import (
    sweep_plan,
    sweep_programs,
    sweep_types,  # noqa: E402
)
from cbdp_jax.mechanisms import LaplaceMechanism  # noqa: E402
from cbdp_jax.statistics import z_quantile  # noqa: E402

# The headline setting: 256 linear adversaries, 16 fresh samples per side per step, 1000 steps (one
# evaluation block: the validation pass is timed once per call, as in a run with early stopping off).
HEADLINE = {"ensemble": 256, "adversary": "linear", "width": None, "batch": 16, "steps": 1000}


def prepare(
    ensemble: int,
    adversary: str,
    *,
    batch: int,
    steps: int,
    width: int | None = None,
    depth: int = 2,
    shared_noise: bool = True,
    eval_every: int | None = None,
) -> dict[str, Any]:
    """Inputs and initial parameters of ``ensemble`` members of one class (one sweep group)."""
    options = {} if width is None else {"width": width, "depth": depth}
    config = sweep_types.SweepConfig(
        steps=steps,
        eval_every=eval_every or steps,
        batch_size=batch,
        val_samples=256,
        shared_noise=shared_noise,
    )
    key = jax.random.key(0)
    plan = sweep_plan._plan(
        key,
        [LaplaceMechanism(epsilon=1.0)],
        adversaries=adversary,
        divergence="kl",
        alphas=None,
        seeds=ensemble,
        learning_rates=None,
        convention="abs",
        config=config,
        adversary_options=options,
    )
    (group,) = plan.groups
    inputs = jax.tree.map(jax.numpy.asarray, sweep_plan._member_arrays(plan, group.members, key))
    noise = jax.numpy.asarray(jax.random.key_data(jax.random.key(1)))
    z = jax.numpy.asarray(z_quantile(config.confidence), jax.numpy.float32)
    trainer = sweep_plan._spec_trainer(group.specs[0], group.static)
    state = sweep_programs._init_program(
        inputs, trainer=trainer, static=sweep_plan._model_static(group.static)
    )
    return {"static": group.static, "args": (inputs, state, noise, z)}


def measure(
    ensemble: int,
    adversary: str,
    *,
    batch: int,
    steps: int,
    width: int | None = None,
    repeats: int = 2,
    shared_noise: bool = True,
    eval_every: int | None = None,
    check: bool = False,
) -> dict[str, Any]:
    """Times the vmapped program and the loop of single-member programs (same run, same work)."""
    prep = prepare(
        ensemble,
        adversary,
        batch=batch,
        steps=steps,
        width=width,
        shared_noise=shared_noise,
        eval_every=eval_every,
    )
    static, args = prep["static"], prep["args"]
    t0 = time.perf_counter()
    vmapped = sweep_programs._train_program.lower(*args, static=static).compile()
    vmap_compile = time.perf_counter() - t0
    _common.block(vmapped(*args))

    def one(i):
        return jax.tree.map(lambda x: x[i : i + 1], args[:2]) + args[2:]

    singles = _common.block([one(i) for i in range(ensemble)])
    t0 = time.perf_counter()
    single = sweep_programs._train_program.lower(*singles[0], static=static).compile()
    loop_compile = time.perf_counter() - t0
    _common.block(single(*singles[0]))
    # Interleaved repeats, best of each: both sides see the same background load.
    vmap_t, loop_t = [], []
    for _ in range(repeats):
        t, out_v = _common.timed(vmapped, *args)
        vmap_t.append(t)
        t, out_l = _common.timed(lambda: [single(*a) for a in singles])
        loop_t.append(t)
    vmap_s, loop_s = min(vmap_t), min(loop_t)
    # Each repeat times the two sides back to back, so their ratio cancels slow drifts of the machine's
    # speed (other tenants, frequency scaling) that the ratio of the two minima does not.
    paired = float(np.median(np.asarray(loop_t) / np.asarray(vmap_t)))
    row = {
        "ensemble": ensemble,
        "adversary": adversary if width is None else f"mlp({width}x2)",
        "width": width,
        "batch": batch,
        "steps": steps,
        "eval_every": eval_every or steps,
        "shared_noise": shared_noise,
        "repeats": repeats,
        "vmap_compile_s": vmap_compile,
        "loop_compile_s": loop_compile,
        "vmap_s": vmap_s,
        "loop_s": loop_s,
        "speedup": loop_s / vmap_s,
        "speedup_paired_median": paired,
        "vmap_adv_steps_per_s": ensemble * steps / vmap_s,
        "loop_adv_steps_per_s": ensemble * steps / loop_s,
        "vmap_samples_per_s": ensemble * steps * 2 * batch / vmap_s,
        "loop_samples_per_s": ensemble * steps * 2 * batch / loop_s,
    }
    if check:  # the two sides computed the same numbers
        v = np.asarray(out_v.best_value)
        loop_v = np.concatenate([np.asarray(o.best_value) for o in out_l])
        row["max_abs_diff"] = float(np.max(np.abs(v - loop_v)))
    print(
        f"  M={ensemble:5d} {row['adversary']:>11s} B={batch:4d}: vmap {vmap_s * 1e3:9.1f} ms, "
        f"loop {loop_s * 1e3:9.1f} ms, x{row['speedup']:.1f} (paired median x{paired:.1f})",
        flush=True,
    )
    return row


def run(quick: bool) -> dict[str, Any]:
    """All settings; returns the JSON payload."""
    repeats = 3 if quick else 5
    ensembles = (1, 4, 16, 64, 256) if quick else (1, 4, 16, 64, 256, 1024)
    small = {k: HEADLINE[k] for k in ("adversary", "batch", "steps")}
    print("ensemble sizes (small adversaries):", flush=True)
    ens_rows = [
        measure(m, **small, repeats=9 if m == HEADLINE["ensemble"] else repeats, check=m <= 16)
        for m in ensembles
    ]
    print("ensemble sizes, larger minibatch (256 per side):", flush=True)
    big_batch = [
        measure(m, "linear", batch=256, steps=100, repeats=repeats)
        for m in ((64, 256) if quick else (64, 256, 1024))
    ]
    print("independent noise per member (shared_noise=False):", flush=True)
    independent = measure(256, **small, repeats=repeats, shared_noise=False)
    print("MLP widths:", flush=True)
    widths = (8, 32, 128) if quick else (8, 32, 128, 512)
    m_width = 16 if quick else 64
    width_rows = [
        measure(m_width, "mlp", width=w, batch=64, steps=50 if quick else 100, repeats=repeats)
        for w in widths
    ]
    headline = next(r for r in ens_rows if r["ensemble"] == HEADLINE["ensemble"])
    sixty_four = next(r for r in ens_rows if r["ensemble"] == 64)
    return {
        "vmap_over_loop_speedup": headline["speedup_paired_median"],
        "vmap_over_loop_speedup_best_over_best": headline["speedup"],
        "vmap_over_loop_setting": HEADLINE,
        "target_speedup": 20.0,
        "meets_target": headline["speedup_paired_median"] >= 20.0,
        "vmap64_over_sequential64": {
            "speedup": sixty_four["speedup_paired_median"],
            "speedup_best_over_best": sixty_four["speedup"],
            "vmap_s": sixty_four["vmap_s"],
            "sequential_s": sixty_four["loop_s"],
        },
        "independent_noise_speedup": independent["speedup_paired_median"],
        "ensembles": ens_rows,
        "ensembles_batch256": big_batch,
        "independent_noise": independent,
        "widths": width_rows,
    }


COLUMNS = (
    "ensemble",
    "adversary",
    "batch",
    "steps",
    "vmap_compile_s",
    "loop_compile_s",
    "vmap_s",
    "loop_s",
    "speedup",
    "speedup_paired_median",
    "vmap_adv_steps_per_s",
    "loop_adv_steps_per_s",
    "vmap_samples_per_s",
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _common.parser(__doc__.splitlines()[0], "benchmarks/results/throughput.json").parse_args(
        argv
    )
    _common.setup_device(args.device)
    payload = run(args.quick)
    rows = (
        payload["ensembles"]
        + payload["ensembles_batch256"]
        + [payload["independent_noise"]]
        + payload["widths"]
    )
    _common.print_table("training throughput: vmapped vs loop (warm)", rows, COLUMNS)
    verdict = "meets" if payload["meets_target"] else "MISSES"
    print(
        f"vmap_over_loop_speedup (256 small adversaries): {payload['vmap_over_loop_speedup']:.1f}x "
        f"({verdict} the 20x target); 64 vmapped vs 64 sequential: "
        f"{payload['vmap64_over_sequential64']['speedup']:.1f}x"
    )
    _common.write(args.out, "throughput", args, payload)
    return payload


if __name__ == "__main__":
    main()
