"""Exploration for docs/theory/one_run.md (run with /tmp/jpvenv/bin/python; needs jax-privacy)."""

import numpy as np
from jax_privacy import auditing as jpa

from cbdp_jax._src.mechanism_auditor import one_run as o


def fam(m, ratio, smallest=8, shapes=("two", "one")):
    counts, r = [], float(m)
    while r >= smallest and int(round(r)) not in counts:
        counts.append(int(round(r)))
        r /= ratio
    out = []
    for r in counts:
        if "two" in shapes:
            out.append(((r + 1) // 2, r // 2))
        if "one" in shapes:
            out.append((r, 0))
    return out


rng = np.random.default_rng(8)
for mu, m in [(0.5, 1000), (1, 1000), (2, 1000), (1, 10000)]:
    fams = {
        "s2": fam(m, 2**0.5),
        "r2": fam(m, 2.0),
        "r2two": fam(m, 2.0, shapes=("two",)),
        "r2one": fam(m, 2.0, shapes=("one",)),
        "r3": fam(m, 3.0),
    }
    acc = {}
    for _ in range(12 if m == 1000 else 6):
        inc = rng.random(m) < 0.5
        s = rng.normal(size=m) + mu * inc
        a = jpa.CanaryScoreAuditor(s[inc], s[~inc])
        acc.setdefault("jp_st", []).append(a.epsilon_one_run(0.05, 1e-5))
        acc.setdefault("jp_fdp", []).append(a.epsilon_one_run_fdp(0.05, 1e-5))
        for name, ch in fams.items():
            for meth in ("steinke", "gdp"):
                acc.setdefault(f"{name}_{meth}", []).append(
                    o.one_run_audit(s, inc, delta=1e-5, method=meth, choices=ch).epsilon
                )
    print(
        mu,
        m,
        {k: (round(np.mean(v), 3)) for k, v in acc.items()},
        {k: len(v) for k, v in fams.items()},
    )
    print(
        "   ge:",
        {
            k: np.mean(np.array(v) >= np.array(acc["jp_st" if "steinke" in k else "jp_fdp"]))
            for k, v in acc.items()
            if not k.startswith("jp")
        },
    )
