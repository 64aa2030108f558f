"""The capacity-bounded divergence estimator: plan, fit the adversaries, certify on held-out samples."""
