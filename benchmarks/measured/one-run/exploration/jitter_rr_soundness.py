"""Exploration for docs/theory/one_run.md (run with /tmp/jpvenv/bin/python; needs jax-privacy)."""

import math
import time

import numpy as np
from jax_privacy import auditing as jpa

from cbdp_jax._src.mechanism_auditor import one_run as o

rng = np.random.default_rng(7)
m, eps, delta, n = 1000, 1.0, 1e-10, 200
truth = math.log(math.exp(eps) - delta * (1 + math.exp(eps)))
over = {"jp_steinke": 0, "jp_fdp": 0, "ours_steinke": 0, "ours_fdp": 0}
hull = []
t = time.time()
for _ in range(n):
    inc = rng.random(m) < 0.5
    keep = rng.random(m) < 1 / (1 + math.exp(-eps))
    s = np.where(keep, inc, ~inc) + 1e-3 * rng.random(m)
    a = jpa.CanaryScoreAuditor(s[inc], s[~inc])
    hull.append(len(a._fn_counts))
    over["jp_steinke"] += a.epsilon_one_run(0.05, delta) > truth
    over["jp_fdp"] += 0  # GDP-shaped: not valid for RR
    over["ours_steinke"] += o.one_run_audit(s, inc, delta=delta, method="steinke").epsilon > truth
    over["ours_fdp"] += o.one_run_audit(s, inc, delta=delta, method="fdp").epsilon > truth
print(over, "of", n, "hull sizes", np.mean(hull), time.time() - t)
