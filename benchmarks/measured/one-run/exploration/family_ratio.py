"""Exploration for docs/theory/one_run.md (run with /tmp/jpvenv/bin/python; needs jax-privacy)."""

import sys

import numpy as np

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import one_run_vs_jax_privacy as B
from jax_privacy import auditing as jpa

from cbdp_jax._src.mechanism_auditor import one_run as o

rng = np.random.default_rng(10)
for case in [
    ("gdp", 1.0, 1000, 1e-5),
    ("gdp", 4.0, 1000, 1e-5),
    ("gdp", 0.5, 10000, 1e-5),
    ("rr", 1.0, 1000, 1e-5),
    ("rr", 2.0, 10000, 1e-5),
]:
    kind, p, m, d = case
    acc = {}
    for _ in range(10 if m == 1000 else 5):
        s, inc = B.draw(rng, kind, p, m)
        a = jpa.CanaryScoreAuditor(s[inc], s[~inc])
        acc.setdefault("jp_st", []).append(a.epsilon_one_run(0.05, d))
        acc.setdefault("jp_fdp", []).append(a.epsilon_one_run_fdp(0.05, d))
        for ratio in (2.0, 3.0, 4.0):
            ch = o.guess_candidates(m, ratio=ratio)
            for meth in ("steinke", "gdp"):
                acc.setdefault(f"r{ratio:g}_{meth}", []).append(
                    o.one_run_audit(s, inc, delta=d, method=meth, choices=ch).epsilon
                )
    print(case, {k: round(np.mean(v), 3) for k, v in acc.items()})
    print(
        "   ge:",
        {
            k: np.mean(np.array(v) >= np.array(acc["jp_st" if "steinke" in k else "jp_fdp"]))
            for k, v in acc.items()
            if not k.startswith("jp")
        },
    )
