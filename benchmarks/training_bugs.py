"""Every planted bug against every threat model, everything else at the command line's defaults.

``cbdp audit-training --bug X --threat Y`` with every other option at its default is
``build_problem(bug=X, threat=Y)``: logistic regression on scikit-learn's digits, Poisson q = 0.01,
T = 100, S = 1, C = 1, learning rate 0.5, the library's DP-SGD step, 10^4 runs per side, the run's
own ``dpsgd:`` claim under add/remove (the accountant's default), level 0.95, key 0. For each cell:
the exit status the command would give (1: violation certified, 0: none, 2: refused), the empirical
eps at delta = 1e-5, the violation's point, and what the audit names as not seen by construction
(``blind_spots``). The gradient threat's canary is 4 C by default (clipping binds, so ``no-clip``
shows).

    python benchmarks/training_bugs.py --device cpu --out benchmarks/measured/training-bugs/summary.json

or in shards run side by side, then merged (the rows in the order of ``BUGS`` and ``THREATS``):

    python benchmarks/training_bugs.py --bugs none no-clip mean-over-batch --out /tmp/a.json &
    python benchmarks/training_bugs.py --bugs noise-after-averaging noise-on-subset \
        mean-over-dataset --out /tmp/b.json; wait
    python benchmarks/training_bugs.py --merge /tmp/a.json /tmp/b.json \
        --out benchmarks/measured/training-bugs/summary.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax import InvalidParameterError  # noqa: E402
from cbdp_jax.audit import parse_claim  # noqa: E402
from cbdp_jax.training_audit import (  # noqa: E402
    BUGS,
    THREATS,
    audit_training,
    build_problem,
    default_claim,
    training_audit_config,
)


def one(bug: str, threat: str, runs: int, seed: int) -> dict:
    t0 = time.perf_counter()
    try:
        problem = build_problem(bug=bug, threat=threat, seed=seed)
        claim = default_claim(problem)
        config = training_audit_config(parse_claim(claim).epsilon, samples=runs)
        res = audit_training(jax.random.key(seed), problem, claim, config=config)
    except InvalidParameterError as exc:  # the command line's exit 2
        return {"bug": bug, "threat": threat, "exit": 2, "error": str(exc)}
    point = res.violation_point
    return {
        "bug": bug,
        "threat": threat,
        "exit": int(res.violation),
        "empirical_epsilon": float(res.empirical.epsilon),
        "claim_epsilon": float(res.claimed["epsilon"]),
        "violation_point": None if point is None else point.describe("runs"),
        "blind_spots": [b.kind for b in res.blind_spots],
        "blind_spot_messages": [b.message for b in res.blind_spots],
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/training-bugs/summary.json")
    ap.add_argument("--runs", type=int, default=10_000, help="runs per side (the default)")
    ap.add_argument("--bugs", nargs="*", default=list(BUGS))
    ap.add_argument("--threats", nargs="*", default=list(THREATS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--merge", nargs="*", default=None, help="shard outputs to merge into --out")
    args = ap.parse_args()
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(Path(f).read_text())["rows"]]
        order = {(b, t): i for i, (b, t) in enumerate((b, t) for b in BUGS for t in THREATS)}
        rows.sort(key=lambda r: order[(r["bug"], r["threat"])])
        write(args.out, "training_bugs", args, {"rows": rows, "shards": args.merge})
        return
    setup_device(args.device)
    rows = []
    for bug in args.bugs:
        for threat in args.threats:
            row = one(bug, threat, args.runs, args.seed)
            rows.append(row)
            print(
                f"{bug:<22} {threat:<10} exit {row['exit']}  eps "
                f"{row.get('empirical_epsilon', float('nan')):.3f} / {row.get('claim_epsilon', 0):.3f}"
                f"  blind: {row.get('blind_spots')}  {row.get('violation_point') or ''}"
                f"  ({row.get('seconds', 0):.0f} s)",
                flush=True,
            )
    write(args.out, "training_bugs", args, {"rows": rows})


if __name__ == "__main__":
    main()
