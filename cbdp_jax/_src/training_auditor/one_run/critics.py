"""The one-run audit's critics: several scores of each canary, one Bonferroni family.

A critic is a fixed function of one canary's own released series (under the gradient threat, the
per-step updates along its direction z_1 .. z_T), chosen before any coin is drawn, whose larger
values mean "in". Every one-run method is applied to every critic's scores, each at level
1 - beta / K for a family of K critics (Bonferroni), so the largest bound over the family holds at
level 1 - beta, and the result names the critic that gave it.

* ``'score'``: the audit's score, the sum of the updates along the canary (or, for the finite-sample
  methods with ``score='llr'``, their likelihood ratio); an input canary's loss drop. Every audit
  has it.
* ``'steps-max'``: max_t |z_t - z_{t-1}|, the largest step-to-step change of the canary's update.
  A correct step adds fresh Gaussian noise at every step, so dz_t is noise on both sides and the
  critic is nearly blind (it costs the family its share of beta). A step that reuses its noise
  key adds the SAME noise at every step: it cancels in dz, an excluded canary that no example
  moves has dz exactly 0 and an included one dz in {-1, 0, +1} (its batch membership changing),
  so the critic separates in from out perfectly, whatever the noise's size.
* ``'steps-sq'``: sum_t (z_t - z_{t-1})^2, the same differences' energy.

The step critics need the per-step updates along each canary, which the engine reads as a gather of
the canary coordinates (coordinate canaries only); dense directions and input canaries have the
score alone. The default family is ``('score', 'steps-max')`` where the step critics exist, else
``('score',)``: a correct run pays beta / 2 instead of beta on its score (measured in
docs/theory/one_run.md, section 8).

References:
  Steinke, Nasr, Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS 2023 (the
  guesses may be any post-processing of the run's output).

"""

from __future__ import annotations

import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError
from cbdp_jax._src.mechanism_auditor.one_run import METHODS, one_run_audit

CRITICS = ("score", "steps-max", "steps-sq")
STEP_CRITICS = ("steps-max", "steps-sq")
DEFAULT_STEP_CRITIC = "steps-max"


def resolve_critics(critics, *, has_steps: bool) -> tuple[str, ...]:
    """The family: ``'auto'`` is ``('score', 'steps-max')`` with per-step series, else ``('score',)``.

    An explicit family is a non-empty sequence of distinct names of ``CRITICS``; a step critic
    without per-step series (dense directions, input canaries) is one clear error.
    """
    if isinstance(critics, str) and critics == "auto":
        return ("score", DEFAULT_STEP_CRITIC) if has_steps else ("score",)
    names = (critics,) if isinstance(critics, str) else tuple(critics)
    bad = [c for c in names if c not in CRITICS]
    if not names or bad or len(set(names)) != len(names):
        raise InvalidParameterError(
            f"critics={critics!r} is invalid: 'auto' or distinct names among {CRITICS}"
        )
    if not has_steps and any(c in STEP_CRITICS for c in names):
        raise InvalidParameterError(
            f"critics={critics!r} is invalid here: the step critics {STEP_CRITICS} need the "
            "per-step updates along each canary (gradient canaries with coordinate directions)"
        )
    return names


def critic_scores(critic: str, out, *, finite: bool, use_llr: bool) -> tuple[str, np.ndarray]:
    """The name of the score a method gets from ``critic`` and its ``[m]`` values (one run's out)."""
    if critic == "score":
        if use_llr and finite:
            return "llr", np.asarray(out.llr)
        return "sum", np.asarray(out.scores)
    return critic, np.asarray(out.step_max if critic == "steps-max" else out.step_sq)


def family_bounds(out, coins, critics, *, delta: float, level: float, use_llr: bool):
    """Each method's best bound over the critics, each at level 1 - (1 - level) / K.

    Returns:
      ``(bounds, by_critic)``: method -> the best bound's fields (``OneRunBound._asdict()``) plus
      ``score`` (the score it got), ``critic`` (the critic that gave it), ``family`` (K) and
      ``kind``; a method every critic refused has ``epsilon`` None and ``refused`` (the reasons).
      ``by_critic``: critic -> method -> epsilon (None where refused).

    """
    each = 1.0 - (1.0 - level) / len(critics)
    bounds, by_critic = {}, {c: {} for c in critics}
    for method in METHODS:
        finite = method != "gaussian-scores"
        best, reasons = None, []
        for critic in critics:
            which, s = critic_scores(critic, out, finite=finite, use_llr=use_llr)
            try:
                b = one_run_audit(s, coins, delta=delta, level=each, method=method)._asdict()
            except InvalidParameterError as exc:
                by_critic[critic][method] = None
                reasons.append(f"{critic}: {exc}")
                continue
            by_critic[critic][method] = b["epsilon"]
            b |= {"score": which, "critic": critic}
            if best is None or b["epsilon"] > best["epsilon"]:
                best = b
        if best is None:
            best = {"epsilon": None, "refused": "; ".join(reasons), "score": None, "critic": None}
        kind = "finite-sample" if finite else "asymptotic"
        bounds[method] = best | {"family": len(critics), "kind": kind}
    return bounds, by_critic
