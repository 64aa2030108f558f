"""The shuffle finding (issue 25): shuffled-batch DP-SGD audited against its Poisson-accounted claim.

Chua et al. (ICML 2024; NeurIPS 2024 for several epochs) show that one epoch of shuffled batches can
leak far more than the Poisson-subsampled accountant that implementations report, on a worst-case data
set: every other example's clipped gradient is -C along the audited direction and the audited
example's is +C, so zeroing it leaves its batch one -C short of the others (under Poisson sampling it
leaves no trace). ``cbdp_jax.training_audit.worst_case_problem`` builds that data set as TRAINING DATA
for the real training engine (a one-parameter model whose every clipped gradient is -C; the library's
DP-SGD step; a gradient canary of +C; one epoch of T shuffled batches of b, n + 1 = T b), and
``shuffle_lower_epsilon`` is their lower bound on the shuffled run's eps (the sets {max_t x_t > c},
computed by our code). The claim audited is the run's own ``dpsgd:`` claim, accounted as Poisson at
q = 1 / T as implementations report it, under the papers' zero-out relation (dp_accounting's
REPLACE_SPECIAL, the same number as add/remove). The negative control is the same data and step with Poisson
batches at q = 1 / T: the claim is then true, and the audit must not refute it.

For each setting: the Poisson accountant's eps at delta = 1e-5 (dp_accounting's PLD), the papers' lower
bound on the shuffled run's eps, and our audit's certified empirical eps (95 %, delta = 1e-5) with its
verdict, for shuffle and for the Poisson control.

Usage: python benchmarks/shuffle_finding.py [--runs 100000] [--settings "100,0.8" "100,0.8,4" ...]
       [--out FILE]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax._src.privacy.accounting import dpsgd_epsilon  # noqa: E402
from cbdp_jax.audit import parse_claim  # noqa: E402
from cbdp_jax.training_audit import (  # noqa: E402
    TrainingProblem,
    audit_training,
    default_claim,
    shuffle_lower_epsilon,
    training_audit_config,
    worst_case_problem,
)

DELTA = 1e-5


def worst_case(steps: int, noise: float, batch: int, sampler: str, epochs: int) -> TrainingProblem:
    # the papers' pair is zero-out: under add/remove D' would have one example fewer, and a
    # shuffled epoch one batch fewer (docs/theory/training_audit.md, section 2)
    return worst_case_problem(
        steps=steps, noise=noise, batch_size=batch, sampler=sampler, epochs=epochs,
        relation="zero-out",
    )  # fmt: skip


def audit_one(key, prob: TrainingProblem, runs: int) -> dict:
    claim = default_claim(prob, DELTA)
    eps_claim = parse_claim(claim).epsilon
    config = training_audit_config(eps_claim, samples=runs)
    t0 = time.perf_counter()
    res = audit_training(key, prob, claim, config=config)
    return {
        "claim": claim,
        "certified_epsilon": float(res.empirical.epsilon),
        "certified_gdp_mu": float(res.empirical.gdp_mu),
        "violation": bool(res.violation),
        "verdict": res.verdict,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/shuffle-finding/summary.json")
    ap.add_argument("--runs", type=int, default=100_000, help="training runs per side")
    ap.add_argument("--batch", type=int, default=4, help="batch size b (n + 1 = T b)")
    ap.add_argument(
        "--settings", nargs="+", default=["100,0.8", "100,0.6", "1000,0.8", "1000,1.0", "100,0.8,2", "100,0.8,4"],
        help="T,S or T,S,E: batches per epoch, noise multiplier, epochs (default 1; a fresh shuffle each)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    setup_device(args.device)
    key = jax.random.key(args.seed)
    rows = []
    for i, text in enumerate(args.settings):
        parts = text.split(",")
        steps, noise = int(parts[0]), float(parts[1])
        epochs = int(parts[2]) if len(parts) > 2 else 1
        k_shuffle, k_poisson = jax.random.split(jax.random.fold_in(key, i))
        row = {
            "steps": steps, "epochs": epochs, "noise": noise, "batch": args.batch,
            "runs_per_side": args.runs,
            "poisson_accountant_epsilon": dpsgd_epsilon(noise, 1.0 / steps, steps * epochs, DELTA),
            "shuffle_lower_epsilon": shuffle_lower_epsilon(noise, steps, DELTA, epochs=epochs),
            "shuffle": audit_one(k_shuffle, worst_case(steps, noise, args.batch, "shuffle", epochs), args.runs),
            "poisson_control": audit_one(
                k_poisson, worst_case(steps, noise, args.batch, "poisson", epochs), args.runs
            ),
        }  # fmt: skip
        rows.append(row)
        print(
            f"T={steps} x {epochs} epochs, S={noise:g}: Poisson accountant eps {row['poisson_accountant_epsilon']:.3f}; "
            f"shuffled run's eps >= {row['shuffle_lower_epsilon']:.3f} (lower bound); audit "
            f"certifies {row['shuffle']['certified_epsilon']:.3f} "
            f"(violation: {row['shuffle']['violation']}, {row['shuffle']['seconds']:.0f} s); "
            f"Poisson control {row['poisson_control']['certified_epsilon']:.3f} "
            f"(violation: {row['poisson_control']['violation']})",
            flush=True,
        )
    write(args.out, "shuffle_finding", args, {"delta": DELTA, "rows": rows})


if __name__ == "__main__":
    main()
