"""Exploration for docs/theory/one_run.md (run with /tmp/jpvenv/bin/python; needs jax-privacy)."""

import dp_accounting
import numpy as np
from jax_privacy import auditing as jpa

from cbdp_jax._src.mechanism_auditor import one_run as o

m, k, c = 1000, 100, 93
tau = 0.05 / 1001
e = jpa._epsilon_one_run_fdp(0, m, k, c, tau, 1e-5)
sig = dp_accounting.get_sigma_gaussian(e, 1e-5)
print("jp eps", e, "mu", 1 / sig, "our eps from that mu", o.gdp_epsilon(1 / sig, 1e-5))
mu, _ = o.fdp_gdp_mu(m, np.array([k]), np.array([c]), beta=tau)
print("our mu", mu, o.gdp_epsilon(mu, 1e-5))
for mm in [0.5, 0.6, 0.7, 0.8, 1 / sig]:
    print(
        mm,
        o.fdp_refutes(
            m, np.array([k]), np.array([c]), tau, lambda r, mm=mm: o.gdp_false_rate(r, mm)
        ),
    )
