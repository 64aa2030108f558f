"""The DP-training auditor: a DP step and its sampler, prepared, probed, run many times, scored, certified.

An audit reads in stages, each a module: ``problem`` (what is audited) -> ``prepare`` (slots, canary,
unit) -> ``probes`` and ``noise_probes`` (what the step is, what the audit cannot see, the noise's
law) -> ``runs`` (the run engine) -> ``release`` and ``critics`` (what a run releases, and its critics)
-> ``audit_training`` (certified by the mechanism auditor). The one-run audit is in ``one_run/``.
"""
