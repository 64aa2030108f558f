"""False alarms of the noise probes: how often a correct DP step is named a defect.

The probes (``cbdp_jax/_src/training_auditor/noise_probes.py``, docs/theory/training_audit.md section 11) run at a
family-wise level of 1e-6, so a correct step should practically never be named. This script probes
correct steps that vary the parameter shapes (logistic regression on digits and on the synthetic
blobs, an MLP, a CNN), the noise multiplier, T, and the post-processing after the DP aggregation
(none, momentum, Nesterov, Adam, AdamW (weight decay), RMSProp, exponential and cosine
learning-rate schedules, ``optax.contrib.dpsgd`` with and without momentum, the library's
``dp_sgd``, a user's step with a typed key and one with a raw ``jax.random.PRNGKey``). Each of the
``--steps-count`` steps (default 20) is probed under ``--keys`` independent probe keys (default 10,
so 200 probe runs): one compiled program per step, its keys an argument. It reports the number of
probe runs that named any defect, per step and in all, with the time per step.

    python benchmarks/noise_probes_false_alarms.py --device cpu \\
        --out benchmarks/measured/noise-probes/summary.json
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax._src.training_auditor.noise_probes import noise_defects  # noqa: E402


def _aggregate(then, noise):
    dp = optax.contrib.differentially_private_aggregate(
        l2_norm_clip=1.0, noise_multiplier=noise, seed=0
    )
    return optax.chain(dp, then)


def _users_step(noise, *, raw):
    """A user's correct step: clip to 1, sum, add N(0, S^2), divide by 8 (typed or raw key)."""

    def init(params):
        del params
        return (jax.random.PRNGKey(3) if raw else jax.random.key(3),)

    def update(grads, state, params=None):
        del params
        norms = jax.vmap(optax.tree.norm)(grads)
        scale = jnp.minimum(1.0, 1.0 / jnp.where(norms > 0, norms, 1.0))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, 1), grads)
        key = jax.random.wrap_key_data(state[0]) if raw else state[0]
        leaves, treedef = jax.tree.flatten(summed)
        nxt, *keys = jax.random.split(key, len(leaves) + 1)
        out = [-0.3 * (s + noise * jax.random.normal(k, s.shape)) / 8.0
               for s, k in zip(leaves, keys, strict=True)]  # fmt: skip
        return jax.tree.unflatten(treedef, out), (jax.random.key_data(nxt) if raw else nxt,)

    return optax.GradientTransformation(init, update)


# (name, build_problem options, the step from S (None: build_problem's own), S)
CASES = [  # the most varied first: --steps-count N probes the first N
    ("dp_sgd logreg/digits", dict(n=127), None, 1.0),
    ("adam logreg/digits", dict(n=127), lambda s: _aggregate(optax.adam(1e-2), s), 1.0),
    ("momentum logreg/digits", dict(n=127),
     lambda s: _aggregate(optax.sgd(0.5, momentum=0.9), s), 1.0),
    ("sgd exp-decay schedule logreg/digits", dict(n=127),
     lambda s: _aggregate(optax.sgd(optax.exponential_decay(1.0, 1, 0.7)), s), 1.0),
    ("adamw logreg/synthetic", dict(data="synthetic"),
     lambda s: _aggregate(optax.adamw(1e-2, weight_decay=0.1), s), 1.0),
    ("optax dpsgd logreg/synthetic", dict(data="synthetic", step="optax"), None, 1.0),
    ("user raw key logreg/digits", dict(n=127), lambda s: _users_step(s, raw=True), 1.0),
    ("user typed key logreg/digits", dict(n=127), lambda s: _users_step(s, raw=False), 1.0),
    ("dp_sgd logreg/digits S=0.5", dict(n=127), None, 0.5),
    ("dp_sgd mlp/digits S=2", dict(model="mlp", n=127), None, 2.0),
    ("dp_sgd cnn/digits", dict(model="cnn", n=64), None, 1.0),
    ("optax dpsgd momentum mlp/synthetic", dict(data="synthetic", model="mlp"),
     lambda s: optax.contrib.dpsgd(0.1, 1.0, s, seed=0, momentum=0.9), 1.0),
    ("sgd logreg/digits", dict(n=127), lambda s: _aggregate(optax.sgd(0.5), s), 1.0),
    ("nesterov mlp/digits", dict(model="mlp", n=127),
     lambda s: _aggregate(optax.sgd(0.5, momentum=0.9, nesterov=True), s), 1.5),
    ("adam mlp/synthetic S=0.7", dict(data="synthetic", model="mlp"),
     lambda s: _aggregate(optax.adam(1e-3), s), 0.7),
    ("rmsprop logreg/digits", dict(n=127), lambda s: _aggregate(optax.rmsprop(1e-2), s), 1.0),
    ("adam cosine schedule mlp/digits", dict(model="mlp", n=127),
     lambda s: _aggregate(optax.adam(optax.cosine_decay_schedule(1e-2, 8)), s), 1.0),
    ("sgd + weight decay cnn/digits", dict(model="cnn", n=64),
     lambda s: _aggregate(optax.chain(optax.add_decayed_weights(0.05), optax.sgd(0.3)), s), 1.0),
    ("user raw key mlp/synthetic S=3", dict(data="synthetic", model="mlp"),
     lambda s: _users_step(s, raw=True), 3.0),
    ("adam logreg/synthetic S=1 T=16", dict(data="synthetic", steps=16),
     lambda s: _aggregate(optax.adam(1e-2), s), 1.0),
]  # fmt: skip


def _problem(options: dict, make, noise: float, steps: int):
    base = dict(rate=0.125, steps=steps, noise=noise) | options
    problem = ta.build_problem(**base)
    if make is not None:
        problem = dataclasses.replace(problem, step=make(noise))
    return problem


def main() -> None:
    p = parser("False alarms of the noise probes on correct steps", "noise-probes-summary.json")
    p.add_argument("--keys", type=int, default=10, help="probe keys per step")
    p.add_argument(
        "--steps", type=int, default=8, help="T of each probe run (a case may set its own)"
    )
    p.add_argument("--steps-count", type=int, default=len(CASES), help="how many of the steps")
    args = p.parse_args()
    setup_device(args.device)
    load = os.getloadavg()
    rows, named, total = [], 0, 0
    for i, (name, options, make, noise) in enumerate(CASES[: args.steps_count]):
        start = time.perf_counter()
        problem = _problem(options, make, noise, options.get("steps", args.steps))
        prep = ta.prepare(problem, noise_probes=False)
        tx = problem.step_for(problem.examples)
        kinds = []
        for k in range(args.keys):
            found = noise_defects(jax.random.fold_in(jax.random.key(2026), 100 * i + k), problem,
                                  tx, prep)  # fmt: skip
            kinds.append([d.kind for d in found])
        seconds = time.perf_counter() - start
        hits = sum(bool(k) for k in kinds)
        named, total = named + hits, total + len(kinds)
        rows.append({"step": name, "runs": len(kinds), "named": hits, "kinds": kinds,
                     "raw_keys": list(prep.raw_keys), "parameters": int(sum(
                         a.size for a in jax.tree.leaves(prep.params))),
                     "T": problem.steps, "seconds": round(seconds, 2)})  # fmt: skip
        print(f"{name:<40} named {hits}/{len(kinds)}  {seconds:6.1f} s", flush=True)
        write(args.out, "noise_probes_false_alarms", args, {  # after each step: a partial record
            "level": 1e-6, "probe_runs": total, "named": named, "load_before": load,
            "load_after": os.getloadavg(), "steps": rows,
        })  # fmt: skip
    print(f"named: {named} of {total} probe runs of correct steps")


if __name__ == "__main__":
    main()
