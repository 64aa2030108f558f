"""The bugs :func:`~cbdp_jax._src.training_auditor.dp_steps.dp_sgd` can plant, and which threat is blind to which.

Plain data, no JAX, so that the command line's help lists it without starting JAX. ``BUGS`` are the
flaws ``dp_sgd(bug=...)`` plants. ``BLIND_AT_DEFAULTS`` names, for each bug and threat, the blind
spots that the audit's own probes (:func:`cbdp_jax._src.training_auditor.probes.blind_spots`) report when
every other option of ``cbdp audit-training`` is at its default (the digits, Poisson q = 0.01,
add-remove, a gradient canary of norm 4 C on the weight of an always-blank pixel); a threat with none
can see the bug, given runs enough. ``SEEN_WITH`` says what sees a bug where a default threat is
blind. ``DEFECTS_AT_DEFAULTS`` names the defects the noise probes report for each bug (any threat:
they probe the step, not the runs). tests/test_cli_training.py checks the table against the probes, so the help cannot drift from
them (docs/theory/training_audit.md, section 6).
"""

from __future__ import annotations

BUGS = (
    "none",
    "noise-after-averaging",
    "no-clip",
    "noise-on-subset",
    "mean-over-batch",
    "mean-over-dataset",
    "key-reuse",
    "scalar-noise",
    "noise-every-other-step",
    "shared-noise-across-leaves",
)
THREAT_ORDER = ("gradient", "white-box", "black-box")  # training_problem.THREATS (a test checks)

_ALL = dict.fromkeys(THREAT_ORDER)
BLIND_AT_DEFAULTS: dict[str, dict[str, tuple[str, ...]]] = {
    "none": {},
    "noise-after-averaging": {},
    "no-clip": {},
    "noise-on-subset": {t: ("unnoised-parameters",) for t in _ALL},
    "mean-over-batch": {"gradient": ("batch-normalisation",)},
    "mean-over-dataset": {"gradient": ("dataset-size",)},
    "key-reuse": {},
    "scalar-noise": {},
    "noise-every-other-step": {},
    "shared-noise-across-leaves": {},
}
# the defects the noise probes (:mod:`cbdp_jax._src.training_auditor.noise_probes`) name at the defaults, any threat
DEFECTS_AT_DEFAULTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "noise-after-averaging": ("noise-too-small",),
    "no-clip": (),
    "noise-on-subset": ("noise-too-small",),
    "mean-over-batch": (),
    "mean-over-dataset": (),
    "key-reuse": ("noise-not-fresh",),
    "scalar-noise": ("noise-dependent-coordinates",),
    "noise-every-other-step": ("noise-missing",),
    "shared-noise-across-leaves": ("noise-dependent-coordinates",),
}
SEEN_WITH = {
    "no-clip": "the gradient threat at --canary-norm <= 1: clip-not-binding",
    "noise-on-subset": "a gradient canary along a bias sees it: Canary(coordinate=...) in Python",
    "mean-over-batch": (
        "none with --data worst-case under add-remove, expected batch >= 8; zero-out sees only "
        "part of it"
    ),
    "mean-over-dataset": (
        "none with --data worst-case --sampler poisson --rate 1 under add-remove; every threat "
        "under zero-out or replace-one, which keep the size"
    ),
}


def visibility_text() -> str:
    """One paragraph: for each bug, the threats blind to it at the defaults, and what changes that."""
    parts = []
    for bug in BUGS[1:]:
        blind = BLIND_AT_DEFAULTS[bug]
        names = "every threat" if len(blind) == len(THREAT_ORDER) else " and ".join(blind)
        notes = [", ".join(sorted({k for v in blind.values() for k in v}))] if blind else []
        notes += [SEEN_WITH[bug]] if bug in SEEN_WITH else []
        notes += [f"defect named: {', '.join(DEFECTS_AT_DEFAULTS[bug])}"] * bool(
            DEFECTS_AT_DEFAULTS[bug]
        )
        parts.append(f"{bug}: {names or 'none'}" + (f" ({'; '.join(notes)})" if notes else ""))
    return "; ".join(parts) + "."
