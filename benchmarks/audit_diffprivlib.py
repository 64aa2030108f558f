"""IBM diffprivlib audited as a black box: its stated guarantees, and the same claims with eps halved.

Writes benchmarks/measured/audit_suite/diffprivlib.json. Needs the ``audit`` extra.

Usage: python benchmarks/audit_diffprivlib.py [--samples 200000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

from cbdp_jax import audit as au
from cbdp_jax._src.infra.io import atomic_write_json, environment_info
from cbdp_jax.audit_suite import diffprivlib_cases

OUT = Path(__file__).parent / "measured" / "audit_suite" / "diffprivlib.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    config = au.AuditConfig(samples=args.samples, classes=("halfspace", "histogram"))
    rows = []
    for i, case in enumerate(diffprivlib_cases()):
        mech = au.load_mechanism(case.fn, case.name)
        for j, claim in enumerate((case.claim, case.understated)):
            key = jax.random.fold_in(jax.random.key(i), j)
            r = au.audit(key, mech, claim, pair=case.pair, config=config)
            best = r.strongest()
            rows.append({
                "mechanism": case.name, "claim": claim, "stated": j == 0,
                "violation": r.violation, "strongest_certified": best.lower_bound,
                "claimed_there": best.claimed, "epsilon_there": best.grid,
                "family_size": r.family_size, "seconds": r.seconds, "verdict": r.verdict,
            })  # fmt: skip
            print(f"{case.name:<30} {claim:<18} violation={r.violation!s:<5} "
                  f"certified {best.lower_bound:.4g} vs {best.claimed:.4g} {r.seconds:.0f}s")  # fmt: skip
    atomic_write_json(
        args.out, {"config": vars(args), "environment": environment_info(), "rows": rows}
    )


if __name__ == "__main__":
    main()
