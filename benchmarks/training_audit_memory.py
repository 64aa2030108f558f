"""Peak memory of a training audit's certification, without the trainings (issue 51).

A training audit holds its runs' samples, ``[n, 1 + T k]`` float32 per side, then certifies every
feature group of the release (cbdp_jax/_src/training_auditor/critics.py). This script builds the
mechanism of ``cbdp audit-training --data synthetic --examples 63 --sampler poisson --rate 0.125
--steps 16 --noise 0.5`` (the default critics: the richer release), draws stand-in float32 rows of
its width (normal, as the synthetic release roughly is: the memory does not depend on the values),
and runs the certification (``_hockey_rows``) on them, reporting the process's peak resident size
before and after. The trainings themselves are measured with ``/usr/bin/time -v`` of the command
(docs/guide/scaling.md, "What an audit holds in memory").

    PYTHONPATH=$PWD python benchmarks/training_audit_memory.py --runs 3000000
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import numpy as np


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000, help="runs per side")
    args = ap.parse_args()
    from cbdp_jax import training_audit as ta
    from cbdp_jax._src.mechanism_auditor.certify import _hockey_rows
    from cbdp_jax._src.mechanism_auditor.claims import parse_claim
    from cbdp_jax._src.training_auditor.setups import build_problem

    problem = build_problem(data="synthetic", n=63, sampler="poisson", rate=0.125, steps=16,
                            noise=0.5)  # fmt: skip
    mech = ta.training_mechanism(problem)
    width = mech.output_dim([1.0])
    config = ta.training_audit_config(4.0, samples=args.runs)
    rng = np.random.default_rng(0)
    xp = rng.standard_normal((args.runs, width), dtype=np.float32)
    xq = rng.standard_normal((args.runs, width), dtype=np.float32)
    xq[:, 0] += 0.1
    held = _peak_gib()
    start = time.perf_counter()
    rows, family = _hockey_rows(jax.random.key(0), xp, xq, parse_claim("approx:4:1e-5"), config,
                                mech.feature_groups)  # fmt: skip
    print(
        f"runs per side {args.runs}, {width} values a run: samples {xp.nbytes * 2 / 2**30:.2f} GiB;"
        f" peak after drawing {held:.2f} GiB, after certifying {_peak_gib():.2f} GiB "
        f"({family} rows, {time.perf_counter() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
