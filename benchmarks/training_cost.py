"""XLA's cost analysis of the training engine's program: a load-independent side-by-side of two trees.

256 vmapped runs of logistic regression and of the 2-layer MLP on digits (q = 0.01, T = 20), on D and
on D', lowered and compiled; prints the FLOPs and bytes accessed XLA reports for each. Run it under
two checkouts to compare engines (the API it uses, ``build_problem``, ``prepare`` and ``make_run``,
is the same since the training audit was written):

    git archive b366428 | tar -x -C /tmp/old_tree
    PYTHONPATH=/tmp/old_tree python benchmarks/training_cost.py
    python benchmarks/training_cost.py
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp

import cbdp_jax
from cbdp_jax import training_audit as ta


def main() -> None:
    out = {"cbdp_jax": cbdp_jax.__file__}
    for model in ("logreg", "mlp"):
        problem = ta.build_problem(model=model, data="digits", rate=0.01, steps=20, chunk=256)
        prep = ta.prepare(problem)
        run = ta.make_run(problem, prep)
        keys = jax.random.split(jax.random.key(0), 256)
        for side in (1.0, 0.0):
            program = jax.jit(jax.vmap(run, in_axes=(0, None)))
            cost = program.lower(keys, jnp.float32(side)).compile().cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            name = f"{model} {'D' if side else 'Dprime'}"
            out[name] = {"flops": cost.get("flops"), "bytes": cost.get("bytes accessed")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
