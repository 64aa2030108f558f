"""Estimates that a change meant to make the library faster may not change: run in two trees, compare.

A fixed set of ``estimate_from_samples`` calls (Laplace, Gaussian, and atoms with outliers; an MLP's
finite-sample Renyi bound with the automatic input map, the linear class's KL, an MLP's asymptotic KL;
one direction and both) and one ``estimate`` of a mechanism. Every field of every result except the
wall time and the environment goes to one JSON file, so two runs compare with ``cmp``:

    git worktree add /tmp/before BASE
    PYTHONPATH=/tmp/before python tools/same_numbers.py /tmp/before.json
    python tools/same_numbers.py /tmp/after.json
    cmp /tmp/before.json /tmp/after.json && echo identical

A few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import numpy as np

from cbdp_jax.estimator import EstimatorConfig, estimate, estimate_from_samples
from cbdp_jax.mechanisms import LaplaceMechanism

# The budget settings every call fixes (the defaults these had before the default budget was derived
# from the sample size), so that the same calls run in a tree before that change and after it.
FIXED = {"eval_every": 100, "patience": None}

CLASSES = (
    ("mlp", "renyi", 2.0, "finite-sample", "auto"),
    ("linear", "kl", None, "auto", "standard"),
    ("mlp", "kl", None, "asymptotic", "standard"),
)


def _samples(case: str, seed: int, n: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if case == "laplace":
        return rng.laplace(0, 1, n), rng.laplace(1, 1, n)
    if case == "gaussian":
        return rng.normal(0, 1, n), rng.normal(1, 1, n)
    spike = rng.random(n) < 0.01  # atoms beside a heavy tail: the input maps' case
    p = np.where(rng.random(n) < 0.3, 0.0, rng.laplace(0, 1, n) * np.where(spike, 1e5, 1))
    q = np.where(rng.random(n) < 0.3, 0.5, rng.laplace(0.5, 1, n) * np.where(spike, 1e5, 1))
    return p, q


def _record(res) -> dict:
    skip = {"seconds", "environment", "reverse"}
    out = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name not in skip}
    if res.reverse is not None:
        out["reverse"] = _record(res.reverse)
    return jax.tree.map(lambda v: np.asarray(v).tolist(), out)


def run() -> list[dict]:
    """Every estimate of the set, as records of all their fields (the reverse direction nested)."""
    rows = []
    for case in ("laplace", "gaussian", "atoms"):
        for seed, both in ((0, True), (1, False)):
            p, q = _samples(case, seed)
            for adversary, divergence, alpha, guarantee, input_map in CLASSES:
                cfg = EstimatorConfig(
                    steps=200, ensemble=2, batch_size=512, both_directions=both,
                    guarantee=guarantee, input_map=input_map, **FIXED,
                )  # fmt: skip
                options = {"width": 16, "depth": 2} if adversary == "mlp" else {}
                res = estimate_from_samples(
                    jax.random.key(seed), p, q, adversary=adversary, divergence=divergence,
                    alpha=alpha, config=cfg, **options,
                )  # fmt: skip
                rows.append({"case": case, "seed": seed, "adversary": adversary,
                             "divergence": divergence, "result": _record(res)})  # fmt: skip
                print(case, seed, adversary, divergence, res.lower_bound, flush=True)
    res = estimate(
        jax.random.key(5), LaplaceMechanism(epsilon=1.0), adversary="mlp", divergence="kl",
        samples=20_000,
        config=EstimatorConfig(steps=200, ensemble=2, batch_size=4096, both_directions=True, **FIXED),
    )  # fmt: skip
    rows.append({"case": "mechanism", "result": _record(res)})
    return rows


def main() -> None:
    """Writes the records to the JSON file named on the command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    args = ap.parse_args()
    with open(args.out, "w") as fh:
        json.dump(run(), fh, default=str, indent=1)


if __name__ == "__main__":
    main()
