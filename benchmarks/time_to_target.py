"""Wall time until the held-out estimate is within a target of the true value, cold and warm.

Two targets, both Laplace epsilon = 1, KL:

- ``lin_kl``: the linear class within 1% of the exact (lin, KL) = 0.225987;
- ``mlp_kl``: an MLP (32 x 2 ReLU) within 3% of the unrestricted KL = exp(-1) = 0.367879.

Each runs a schedule of growing budgets (optimiser steps, minibatch size, test samples). One budget is
one :func:`cbdp_jax.sweep.estimate_sweep` call with an ensemble of 4 seeds (shared minibatches, the best
validation member reported, as the estimator's ``ensemble=4``). ``cold`` is the first call with that
budget's shapes (compilation included); ``warm`` is a second call with the same shapes and a new key.
A budget reaches the target when |estimate - true| <= tolerance and 2 SE <= tolerance (so that a hit is
not luck). Reported: the first budget that reaches it and its wall time, cold and warm.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import jax  # noqa: E402

from cbdp_jax import analytic, exact  # noqa: E402
from cbdp_jax.adversaries import AdversarySpec  # noqa: E402
from cbdp_jax.mechanisms import LaplaceMechanism  # noqa: E402
from cbdp_jax.sweep import SweepConfig, estimate_sweep, select_best  # noqa: E402

MECHANISM = LaplaceMechanism(epsilon=1.0)

TARGETS = {
    "lin_kl": {
        "adversary": AdversarySpec(name="linear"),
        "true": exact.restricted_divergence(exact.laplace_pair(1.0), "kl", "linear").value,
        "true_source": "exact (lin, KL)",
        "relative_tolerance": 0.01,
        "schedule": [
            (250, 1024, 30_000),
            (500, 2048, 100_000),
            (1000, 4096, 300_000),
            (2000, 4096, 1_000_000),
            (3000, 8192, 3_000_000),
        ],
    },
    "mlp_kl": {
        "adversary": AdversarySpec(name="mlp", width=32, depth=2),
        "true": analytic.laplace_kl(1.0),
        "true_source": "unrestricted KL",
        "relative_tolerance": 0.03,
        "schedule": [
            (300, 512, 30_000),
            (600, 1024, 100_000),
            (1200, 1024, 200_000),
            (2400, 2048, 400_000),
            (4800, 4096, 1_000_000),
        ],
    },
}


def attempt(name: str, steps: int, batch: int, test: int, key: jax.Array) -> dict[str, Any]:
    """One estimate with the given budget; returns the selected row and the wall time."""
    target = TARGETS[name]
    config = SweepConfig(
        steps=steps, eval_every=max(steps // 20, 1), batch_size=batch, test_samples=test
    )
    t0 = time.perf_counter()
    rows = estimate_sweep(key, MECHANISM, adversaries=target["adversary"], seeds=4, config=config)
    seconds = time.perf_counter() - t0
    (best,) = select_best(rows)
    tol = target["relative_tolerance"] * target["true"]
    err = best["estimate"] - target["true"]
    return {
        "seconds": seconds,
        "estimate": best["estimate"],
        "std_error": best["std_error"],
        "error": err,
        "relative_error": err / target["true"],
        "reached": abs(err) <= tol and 2 * best["std_error"] <= tol,
    }


def first_hit(budgets: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    """The first budget whose ``kind`` ('cold' or 'warm') run reached the target."""
    for b in budgets:
        if b[kind]["reached"]:
            keep = ("steps", "batch", "test_samples")
            return {
                **{k: b[k] for k in keep},
                "seconds": b[kind]["seconds"],
                "estimate": b[kind]["estimate"],
            }
    return None


def run(quick: bool) -> dict[str, Any]:
    """Every target's schedule (quick: stop once both cold and warm reached it)."""
    out: dict[str, Any] = {}
    for t_index, (name, target) in enumerate(TARGETS.items()):
        budgets = []
        for b_index, (steps, batch, test) in enumerate(target["schedule"]):
            key = jax.random.fold_in(jax.random.key(100 + t_index), b_index)
            cold = attempt(name, steps, batch, test, jax.random.fold_in(key, 0))
            warm = attempt(name, steps, batch, test, jax.random.fold_in(key, 1))
            budgets.append(
                {"steps": steps, "batch": batch, "test_samples": test, "cold": cold, "warm": warm}
            )
            print(
                f"  {name}: steps {steps:5d} batch {batch:5d} test {test:8d}: cold "
                f"{cold['seconds']:6.1f} s err {cold['relative_error']:+.2%} "
                f"({'hit' if cold['reached'] else 'miss'}), warm {warm['seconds']:6.1f} s err "
                f"{warm['relative_error']:+.2%} ({'hit' if warm['reached'] else 'miss'})",
                flush=True,
            )
            if quick and cold["reached"] and warm["reached"]:
                break

        out[name] = {
            "true": target["true"],
            "true_source": target["true_source"],
            "relative_tolerance": target["relative_tolerance"],
            "adversary": target["adversary"].label,
            "time_to_target_cold": first_hit(budgets, "cold"),
            "time_to_target_warm": first_hit(budgets, "warm"),
            "budgets": budgets,
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _common.parser(
        __doc__.splitlines()[0], "benchmarks/results/time_to_target.json"
    ).parse_args(argv)
    _common.setup_device(args.device)
    payload = run(args.quick)
    rows = []
    for name, res in payload.items():
        for b in res["budgets"]:
            for kind in ("cold", "warm"):
                rows.append(
                    {
                        "target": name,
                        "kind": kind,
                        "steps": b["steps"],
                        "batch": b["batch"],
                        "test_samples": b["test_samples"],
                        "seconds": b[kind]["seconds"],
                        "estimate": b[kind]["estimate"],
                        "std_error": b[kind]["std_error"],
                        "relative_error": b[kind]["relative_error"],
                        "reached": b[kind]["reached"],
                    }
                )
    columns = (
        "target",
        "kind",
        "steps",
        "batch",
        "test_samples",
        "seconds",
        "estimate",
        "std_error",
        "relative_error",
        "reached",
    )
    _common.print_table("time to target (Laplace eps = 1, KL)", rows, columns)
    for name, res in payload.items():
        for kind in ("cold", "warm"):
            hit = res[f"time_to_target_{kind}"]
            msg = "not reached" if hit is None else f"{hit['seconds']:.1f} s (steps {hit['steps']})"
            print(
                f"{name} within {res['relative_tolerance']:.0%} of {res['true']:.6f}, {kind}: {msg}"
            )
    _common.write(args.out, "time_to_target", args, {"targets": payload})
    return payload


if __name__ == "__main__":
    main()
