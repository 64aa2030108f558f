"""The DP-training auditor: a DP step and its sampler, prepared, probed, run many times, scored, certified."""
