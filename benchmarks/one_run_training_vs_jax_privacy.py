"""Our one-run bounds beside jax_privacy's ``CanaryScoreAuditor`` on the SAME scores of real runs.

The scores are those of ``benchmarks/one_run_training.py tightness --score llr`` (digits MLP, q = 0.01,
T = 1,000, m = 1,000 coordinate canaries, 5 runs per accountant eps), saved as
``benchmarks/measured/one-run-training/scores-eps{2,4,8}-llr.npz`` (``sum``, ``llr``, ``coins``).

Two steps, two environments (jax_privacy never enters the project's):

  /work/venvs/jaxp/bin/python benchmarks/one_run_training_vs_jax_privacy.py --theirs
  python benchmarks/one_run_training_vs_jax_privacy.py

The first (numpy and jax_privacy only) writes their bounds per run and score to
``jax-privacy-bounds.json``: ``epsilon_one_run`` (Steinke et al., an (eps, delta) bound) and
``epsilon_one_run_fdp`` (the f-DP audit with the Gaussian curve: the eps at delta of a refuted GDP mu,
an (eps, delta) bound only for a mechanism whose privacy curve is exactly Gaussian), both at their
defaults (one-sided, Bonferroni thresholds), level 0.95. The second adds ours (``steinke`` and ``fdp``
on each score, ``gaussian-scores`` on the sum) and writes ``vs-jax-privacy.json``: the medians over
the runs and the ratio of our best to theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "measured" / "one-run-training"
LEVEL, DELTA = 0.95, 1e-5
SCORES = ("sum", "llr")


def _runs():
    for path in sorted(OUT.glob("scores-eps*-llr.npz")):
        data = np.load(path)
        for r in range(data["coins"].shape[0]):
            yield (
                path.stem,
                r,
                float(data["claim"]),
                {k: data[k][r] for k in SCORES},
                data["coins"][r],
            )


def theirs() -> None:
    from jax_privacy import auditing

    rows = []
    for name, r, claim, sc, coins in _runs():
        row = {"file": name, "run": r, "claim": claim}
        for k in SCORES:
            s = np.asarray(sc[k], np.float64)
            aud = auditing.CanaryScoreAuditor(s[coins], s[~coins])
            row[f"jp_steinke/{k}"] = float(aud.epsilon_one_run(1 - LEVEL, DELTA))
            row[f"jp_fdp/{k}"] = float(aud.epsilon_one_run_fdp(1 - LEVEL, DELTA))
        rows.append(row)
        print(row, flush=True)
    import importlib.metadata as md

    meta = {"command": " ".join(["/work/venvs/jaxp/bin/python", *sys.argv]),
            "jax_privacy": md.version("jax-privacy"), "load": os.getloadavg()}  # fmt: skip
    (OUT / "jax-privacy-bounds.json").write_text(json.dumps({"rows": rows, "meta": meta}, indent=1))


def ours() -> None:
    from cbdp_jax._src.infra.io import git_commit
    from cbdp_jax.one_run import one_run_audit

    jp = {
        (r["file"], r["run"]): r
        for r in json.loads((OUT / "jax-privacy-bounds.json").read_text())["rows"]
    }
    per: dict[str, dict[str, list]] = {}
    for name, r, claim, sc, coins in _runs():
        row = dict(jp[(name, r)])
        for k in SCORES:
            for method in ("steinke", "fdp"):
                b = one_run_audit(sc[k], coins, delta=DELTA, level=LEVEL, method=method)
                row[f"{method}/{k}"] = b.epsilon
        g = one_run_audit(sc["sum"], coins, delta=DELTA, level=LEVEL, method="gaussian-scores")
        row["gaussian-scores/sum"] = g.epsilon
        for key, v in row.items():
            if "/" in key:
                per.setdefault(name, {}).setdefault(key, []).append(v)
        per[name]["claim"] = [claim]
    table = []
    for name, cols in per.items():
        med = {k: float(np.median(v)) for k, v in cols.items()}
        ours_best = max(med[f"{m}/{k}"] for m in ("steinke", "fdp") for k in SCORES)
        jp_eps_delta = max(med[f"jp_steinke/{k}"] for k in SCORES)
        jp_any = max(med[f"jp_{m}/{k}"] for m in ("steinke", "fdp") for k in SCORES)
        table.append({"setting": name, "runs": len(cols["fdp/sum"]), "median": med,
                      "ours_best_finite_sample": ours_best,
                      "theirs_best_eps_delta_bound (epsilon_one_run)": jp_eps_delta,
                      "theirs_best_any (incl. GDP-curve epsilon_one_run_fdp)": jp_any,
                      "ratio_to_their_eps_delta_bound": ours_best / jp_eps_delta if jp_eps_delta else None,
                      "ratio_to_their_best_any": ours_best / jp_any if jp_any else None})  # fmt: skip
        print(json.dumps(table[-1]), flush=True)
    meta = {"command": " ".join(["python", "benchmarks/one_run_training_vs_jax_privacy.py", *sys.argv[1:]]),
            "load": os.getloadavg(), "commit": git_commit(), "level": LEVEL, "delta": DELTA}  # fmt: skip
    (OUT / "vs-jax-privacy.json").write_text(
        json.dumps({"rows": table, "meta": meta}, indent=1, default=float)
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--theirs", action="store_true", help="their bounds (run in jax_privacy's venv)"
    )
    theirs() if ap.parse_args().theirs else ours()
