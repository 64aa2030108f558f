"""Structural noise bugs in a user's DP step, audited from everything the gradient threat releases.

The setting of issue 48: a user's logistic regression on 63 synthetic examples plus the gradient
canary, Poisson q = 1/8, T = 16, S = 1, C = 1, the step dividing by the expected batch 8; the run's
own claim (4.015, 1e-5) under add-remove (dp_accounting PLD); every other option at the command
line's defaults (level 0.95, key 0). The steps (docs/examples/user_noise_bugs.py) are written as a user would write them (optax
transformations with a key in their state), so the same runs are what

    cbdp audit-training --problem benchmarks/release_critics.py:key_reuse --runs 20000

audits (also ``scalar_noise``, ``even_steps``, ``correct``). ``--part bugs`` audits each step once at
``--runs`` per side and reports, per feature group of the critic family, the largest eps it refutes
at 1e-5 (the family's best is the audit's empirical eps), with the ceiling of a statistic constant
under D'. ``--part false-alarms`` audits correct steps with ``--repeats`` keys each and counts the
certified violations.

    python benchmarks/release_critics.py --part bugs --runs 20000 \
        --out benchmarks/measured/release-critics/bugs.json
    python benchmarks/release_critics.py --part false-alarms --runs 2000 --repeats 20 \
        --out benchmarks/measured/release-critics/false_alarms.json
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import jax
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
# The user's steps and the problems (re-exported so that --problem FILE:key_reuse names them here):
from user_noise_bugs import correct, even_steps, key_reuse, scalar_noise, user_step  # noqa: E402, F401
from user_noise_bugs import problem as problem_with  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax._src.mechanism_auditor.hockey_stick import tail_epsilon  # noqa: E402
from cbdp_jax._src.statistics import binomial  # noqa: E402
from cbdp_jax.statistics import family_confidence  # noqa: E402

CLAIM_EPS = 4.015


def _aggregate():
    return optax.contrib.differentially_private_aggregate(1.0, 1.0, 0)


CORRECT_STEPS = {
    "user step": lambda: user_step(),
    "library dp_sgd": lambda: ta.dp_sgd(
        learning_rate=0.5, l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=8.0
    ),
    "optax.contrib.dpsgd": lambda: optax.contrib.dpsgd(0.5, 1.0, 1.0, 0),
    "dp aggregate + momentum": lambda: optax.chain(_aggregate(), optax.sgd(0.5, momentum=0.9)),
    "dp aggregate + adam": lambda: optax.chain(_aggregate(), optax.adam(0.01)),
    "dp aggregate + cosine lr": lambda: optax.chain(
        _aggregate(), optax.sgd(optax.cosine_decay_schedule(0.5, 16))
    ),
}


def row_epsilon(row, delta: float) -> float:
    """The eps one certified row refutes at ``delta`` (as ``audit.empirical_epsilon`` counts it)."""
    eps = 0.0
    if math.isfinite(row.p_lower) and math.isfinite(row.q_upper):
        eps = tail_epsilon(row.p_lower, row.q_upper, delta)
    if math.isfinite(row.lower_bound) and row.lower_bound > delta:
        eps = max(eps, math.log(math.exp(row.grid) + row.lower_bound - delta))
    return eps


def by_group(result) -> dict[str, float]:
    """The largest eps each feature group refutes (its rows' labels are ``'group:critic'``)."""
    best: dict[str, float] = {}
    for r in result.rows:
        group = r.critic.split(":")[0] if ":" in r.critic else "score"
        best[group] = max(best.get(group, 0.0), row_epsilon(r, result.empirical.delta))
    return best


def ceiling(p_in: float, n_test: int, family: int, delta: float = 1e-5) -> float:
    """The eps a set with Q(S) = 0 and P(S) = p_in certifies at the expected count (exact bounds)."""
    share = (1.0 - family_confidence(0.95, family)) / 2.0
    q_up = float(binomial.clopper_pearson_upper(0, n_test, 1.0 - share))
    p_lo = float(binomial.clopper_pearson_lower(round(p_in * n_test), n_test, 1.0 - share))
    return math.log((p_lo - delta) / q_up)


# P(S) of the statistic each bug makes constant under D': the canary in some but not all 16 batches
# (key reuse), in at least one batch (shared noise), in at least one of the 8 odd batches (even steps)
P_IN = {
    "correct": None,
    "key_reuse": 1 - (7 / 8) ** 16 - (1 / 8) ** 16,
    "scalar_noise": 1 - (7 / 8) ** 16,
    "even_steps": 1 - (7 / 8) ** 8,
}


def bugs(runs: int, seed: int) -> list[dict]:
    rows = []
    for name, p_in in P_IN.items():
        problem = globals()[name]()
        t0 = time.perf_counter()
        config = ta.training_audit_config(CLAIM_EPS, samples=runs)
        res = ta.audit_training(jax.random.key(seed), problem, config=config)
        only = ta.training_audit_config(CLAIM_EPS, samples=runs, feature_groups=("score",))
        before = ta.audit_training(jax.random.key(seed), problem, config=only)
        groups = by_group(res)
        best = max(groups, key=groups.get)
        n_test = runs - int(runs * 0.3)
        row = {
            "step": name, "exit": int(res.violation), "epsilon": res.empirical.epsilon,
            "claim_epsilon": res.claimed["epsilon"], "family": res.family_size,
            "by_group": groups, "best_group": best,
            "learned_is_best": groups.get("learned", 0.0) >= groups[best] - 1e-9,
            "ceiling": None if p_in is None else ceiling(p_in, n_test, res.family_size),
            "score_alone": {"exit": int(before.violation), "epsilon": before.empirical.epsilon,
                            "family": before.family_size},
            "verdict": res.verdict, "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        rows.append(row)
        print(
            f"{name:<13} exit {row['exit']} eps {row['epsilon']:.3f} (ceiling {row['ceiling']}) "
            f"best {best}; score alone: exit {before.violation:d} eps "
            f"{before.empirical.epsilon:.3f}; groups { ({k: round(v, 3) for k, v in groups.items()}) }",
            flush=True,
        )
    return rows


def false_alarms(runs: int, repeats: int, seed: int, only=()) -> list[dict]:
    rows = []
    for name, make in CORRECT_STEPS.items():
        if only and name not in only:
            continue
        problem = problem_with(make(), name=name)
        config = ta.training_audit_config(CLAIM_EPS, samples=runs)
        t0, flagged, eps = time.perf_counter(), 0, []
        for i in range(repeats):
            res = ta.audit_training(jax.random.key(seed + 1000 + i), problem, config=config)
            flagged += int(res.violation)
            eps.append(res.empirical.epsilon)
        rows.append({"step": name, "audits": repeats, "certified": flagged,
                     "max_epsilon": max(eps), "mean_epsilon": sum(eps) / len(eps),
                     "seconds": time.perf_counter() - t0})  # fmt: skip
        print(f"{name:<26} {flagged} of {repeats} certified, eps max {max(eps):.3f}", flush=True)
    return rows


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/release-critics/bugs.json")
    ap.add_argument("--part", choices=("bugs", "false-alarms"), default="bugs")
    ap.add_argument("--runs", type=int, default=20_000, help="runs per side")
    ap.add_argument("--repeats", type=int, default=20, help="audits per correct step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", nargs="*", default=(), help="false alarms: these correct steps")
    args = ap.parse_args()
    setup_device(args.device)
    if args.part == "bugs":
        write(args.out, "release_critics", args, {"rows": bugs(args.runs, args.seed)})
    else:
        rows = false_alarms(args.runs, args.repeats, args.seed, args.steps)
        write(args.out, "release_critics_false_alarms", args, {"rows": rows})


if __name__ == "__main__":
    main()
