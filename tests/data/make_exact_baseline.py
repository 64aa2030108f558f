"""Records exact restricted values of the polynomial classes, degrees 1..8, from the current code.

The file it writes, ``tests/data/exact_baseline.json``, was produced by the solver as it stood before the
orthogonal-basis rewrite (commit 05f252f, monomial features), with

    python tests/data/make_exact_baseline.py

so that tests/test_exact_degree.py can check that the rewrite leaves every value that solver certified
(``converged``) unchanged to 1e-9. Values it did not certify are recorded too, with their reason, and are
not held against the new solver (several are provably wrong: below a lower degree's value).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cbdp_jax import exact

PAIRS = {
    "laplace(eps=0.5)": exact.laplace_pair(0.5),
    "laplace(eps=1)": exact.laplace_pair(1.0),
    "laplace(eps=2)": exact.laplace_pair(2.0),
    "gaussian(sigma=0.5)": exact.gaussian_pair(0.5),
    "gaussian(sigma=1)": exact.gaussian_pair(1.0),
    "gaussian(sigma=2)": exact.gaussian_pair(2.0),
}
SETTINGS = [("kl", None), ("renyi", 2.0), ("renyi", 4.0), ("alpha", 3.0), ("chi2", None)]


def main() -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = []
    for label, pair in PAIRS.items():
        for div, alpha in SETTINGS:
            for k in range(1, 9):
                r = exact.restricted_divergence(pair, div, "poly", degree=k, alpha=alpha)
                rows.append(
                    {
                        "pair": label,
                        "family": exact.output_laws(pair).family,
                        "scale": exact.output_laws(pair).scale,
                        "divergence": div,
                        "alpha": alpha,
                        "degree": k,
                        "value": r.value,
                        "converged": bool(r.converged),
                        "reason": r.reason,
                    }
                )
                print(label, div, alpha, k, r.value, r.converged, r.reason, flush=True)
    out = Path(__file__).with_name("exact_baseline.json")
    payload = {
        "produced_by": "python tests/data/make_exact_baseline.py",
        "commit": commit,
        "rows": rows,
    }
    out.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
