"""The estimator's certification: the bound planned on validation samples, evaluated on held-out ones.

:func:`_plan_certificate` decides everything the bound depends on from validation samples (the
guarantee, the method, a bounded or shrunk critic); :func:`_evaluate` makes one pass over the test
samples (and one over training samples, a diagnostic); :func:`_certify` turns the held-out statistics
into the lower confidence bound, and :func:`_fields` into the result's fields for one direction.

References:
  docs/theory/bounds.md.

"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from cbdp_jax._src.estimator import certification
from cbdp_jax._src.estimator.evaluation import (
    EVAL_ROWS,
    Critic,
    array_chunks,
    evaluate_fixed,
    readout_host,
)
from cbdp_jax._src.estimator.fit import _Trained, _typed_critic
from cbdp_jax._src.estimator.plan import _Problem
from cbdp_jax._src.estimator.types import EstimatorConfig
from cbdp_jax._src.statistics import betting
from cbdp_jax._src.statistics.bounds import (
    Bound,
    f_from_renyi,
    to_reported,
)
from cbdp_jax._src.statistics.held_out import (
    HeldOut,
    certify,
    tail_check,
)


def _plan_certificate(prob: _Problem, trained: _Trained, confidence: float) -> certification.Plan:
    """Everything the bound depends on, decided on validation samples (never the test samples).

    ``'auto'`` for an unbounded class: the asymptotic bound on the class itself when the critic (after
    any KL shrink) clears on validation data the tail check the test will apply, else the finite-sample
    bound of its bounded version. The choice is made before the test samples are seen, so the bound
    keeps its full level (a fallback after a refusal on the test samples would not).
    """
    config, spec = prob.config, prob.spec
    requested = "finite-sample" if config.target is not None else config.guarantee
    guarantee = certification.resolve_guarantee(requested, spec)
    hv_p, hv_q = (np.asarray(h, np.float64) for h in trained.h_val)
    if guarantee == "finite-sample":
        why = "asked for" if requested == "finite-sample" else f"{requested}: the class is bounded"
        return _finite_sample_plan(prob, trained, hv_p, hv_q, confidence)._replace(choice=why)
    plan = _asymptotic_plan(prob, trained, hv_p, hv_q)
    if requested == "asymptotic":
        return plan._replace(choice="asked for")
    if requested == "class":
        return plan._replace(
            choice="class: the class is unbounded, so the bound on it is asymptotic"
        )
    n_test = min(prob.n_test)
    crit_p, crit_q = plan.scale * hv_p + plan.shift, plan.scale * hv_q + plan.shift
    if certification.clears_tails(
        prob.divergence, crit_p, crit_q, n_test=n_test, margin=config.tail_margin
    ):
        return plan._replace(
            choice="auto: the critic's validation tails clear the asymptotic bound's check, so "
            "the bound is on the class itself"
        )
    fallback = _finite_sample_plan(prob, trained, hv_p, hv_q, confidence)
    return fallback._replace(
        choice="auto: the critic's validation tails do not clear the asymptotic bound's check "
        f"(tail index above {2 + config.tail_margin:g}), so the finite-sample bound of its bounded "
        "version is used (a bound on that class and on the unrestricted divergence)"
    )


def _finite_sample_plan(prob: _Problem, trained: _Trained, hv_p, hv_q, confidence: float):
    """A bounded critic: the class's own bound, or ``B tanh(h / B)`` with B chosen on validation data."""
    config, spec, div = prob.config, prob.spec, prob.divergence
    scale, shift = trained.scale, trained.shift
    n_test = min(prob.n_test)
    if spec.bound is None and prob.input_map.kind != "standard":
        t = _critic_multiplier(prob, scale * hv_p + shift, scale * hv_q + shift, confidence)
        scale, shift = t * scale, t * shift
    crit_p, crit_q = scale * hv_p + shift, scale * hv_q + shift
    fixed = None
    if spec.bound is not None:
        # A bounded class: the fitted affine map keeps the critic inside a known interval.
        lo_h, hi_h = shift - abs(scale) * spec.bound, shift + abs(scale) * spec.bound
        fixed = max(abs(lo_h), abs(hi_h))
    bound, method, support = certification.choose_bound(
        div,
        crit_p,
        crit_q,
        n_test=n_test,
        confidence=confidence,
        method=_method(config),
        fixed_bound=fixed,
    )
    method = _sequential_or(method, config)
    if fixed is not None:  # the class's own bound: the critic is used as it is
        return certification.Plan(
            "finite-sample", method, math.inf, scale, shift, 1.0, support, spec.label
        )
    label = f"{bound:.4g}*tanh({spec.label}/{bound:.4g})"
    return certification.Plan(
        "finite-sample", method, bound, scale, shift, 1.0, support, label, False
    )


# Multipliers t of a mapped critic tried before B is chosen (t = 1: the fitted critic as it is), and
# the candidate B each t is scored with (B itself is then chosen on the full grid at the chosen t).
_MULTIPLIERS = tuple(float(t) for t in np.geomspace(1.0, 1e-3, 10))


_MULTIPLIER_GRID = 16


# At most this many validation pairs score the multipliers (B is then chosen on all of them).
_MULTIPLIER_PAIRS = 1 << 15


def _critic_multiplier(prob: _Problem, crit_p, crit_q, confidence: float) -> float:
    """The factor t of ``B tanh(t h / B)`` with the best predicted bound on validation samples.

    Used behind a non-identity input map, where a critic that separates an atom from everything else
    is fitted with a huge scale (the divergence it sees may be infinite), so that every B either cuts
    the atom's value or leaves Q's other values large; scaling it down first lets B do its job. Each
    t is a fixed choice made on validation samples, like B: every t is scored by its best of
    ``_MULTIPLIER_GRID`` candidate B, all at once (:func:`certification.choose_bounds`); of equal
    predictions the largest t wins.

    The scores use the first ``_MULTIPLIER_PAIRS`` validation pairs at most. The validation samples
    are shuffled, so these are a random subsample; t is a coarse choice (ten values over three
    decades), and scoring its 160 candidates on 111,111 pairs (1M per side) took 0.9 s of a
    direction's 4 s. B is then chosen at the chosen t on every validation pair.
    """
    n = min(np.size(crit_p), np.size(crit_q), _MULTIPLIER_PAIRS)
    found = certification.choose_bounds(
        prob.divergence, crit_p[:n], crit_q[:n], _MULTIPLIERS, n_test=min(prob.n_test),
        confidence=confidence, method=_method(prob.config), grid=_MULTIPLIER_GRID,
    )  # fmt: skip
    best = (-math.inf, 1.0)  # choose_bounds gives -inf for a prediction that is not finite
    for t, (*_, score) in zip(_MULTIPLIERS, found, strict=True):
        best = max(best, (score, t))
    return best[1]


def _asymptotic_plan(prob: _Problem, trained: _Trained, hv_p, hv_q) -> certification.Plan:
    """The CLT bound on the class itself; a KL critic of a cone is shrunk until its tails clear."""
    config, spec, div = prob.config, prob.spec, prob.divergence
    scale, shift = trained.scale, trained.shift
    shrink = 1.0
    if spec.is_cone and certification.shrink_changes_tails(div):
        scale, shift, shrink = certification.shrink_for_tails(
            div,
            prob.trainer.objective,
            h_val_p=hv_p,
            h_val_q=hv_q,
            h_fit_q=np.asarray(trained.h_fit[1], np.float64),
            scale=scale,
            shift=shift,
            need=certification.tail_target(min(prob.n_test), config.tail_margin),
        )
    return certification.Plan("asymptotic", "clt", math.inf, scale, shift, shrink, None, spec.label)


def _method(config: EstimatorConfig) -> str:
    return "betting" if config.target is not None else config.finite_sample_method


def _sequential_or(method: str, config: EstimatorConfig) -> str:
    return "betting-sequence" if config.target is not None else method


class _Sequence:
    """Feeds held-out chunks to a betting confidence sequence; stops once it reaches the target."""

    def __init__(self, div, plan: certification.Plan, z_val: np.ndarray, target: float, confidence):
        self.lo, self.hi = plan.support
        self.confidence = confidence
        self.target_f = _f_from_reported(div, target)
        u = (np.asarray(z_val, np.float64) - self.lo) / (self.hi - self.lo)
        spread = float(np.std(u)) if u.size > 1 else 0.1
        centre = float(np.mean(u)) if u.size else 0.5
        fine = centre + spread * np.linspace(-0.5, 0.05, 1024)
        self.state = betting.sequence_init(np.concatenate([np.linspace(0, 1, 257)[1:], fine]))

    @property
    def lower(self) -> float:
        return self.lo + (self.hi - self.lo) * self.state.lower

    def __call__(self, chunk: HeldOut) -> bool:
        u = (chunk.z_samples - self.lo) / (self.hi - self.lo)
        self.state = betting.sequence_update(self.state, np.clip(u, 0.0, 1.0), self.confidence)
        return self.lower >= self.target_f


def _f_from_reported(div, value: float) -> float:
    if div.name == "renyi":
        return f_from_renyi(value, div.alpha)
    return float(div.from_reported(value))


class _Evaluated(NamedTuple):
    """The held-out and in-sample statistics of one trained critic, with its live sequence (if any)."""

    held: HeldOut
    insample: HeldOut
    sequence: _Sequence | None


def _validation_score(prob: _Problem, trained: _Trained, plan, confidence: float) -> float:
    """The bound the planned critic is predicted to certify at the test size (validation samples)."""
    crit_p, crit_q = _critic_values(trained, plan)
    crit_p, crit_q = np.asarray(crit_p, np.float64), np.asarray(crit_q, np.float64)
    return certification.validation_score(
        prob.divergence, crit_p, crit_q, plan.support,
        n_test=min(prob.n_test), confidence=confidence,
    )  # fmt: skip


def _mapped_plan(prob: _Problem, plan: certification.Plan) -> certification.Plan:
    """The plan's class composed with the input map: ``H o T`` is not inside H unless T is the identity."""
    imap = prob.input_map
    if imap.kind == "standard":
        return plan
    return plan._replace(
        certified_class=f"{plan.certified_class} o {imap.label}", inside_trained_class=False
    )


def _evaluate(prob: _Problem, trained: _Trained, plan, confidence: float) -> _Evaluated:
    """One pass over the test samples (and one over the training samples, a diagnostic).

    The estimate is reported for the fitted member of the class itself (``trained.plain``), the bound
    for the certified critic (a shrunk or bounded version of it); each pass evaluates both.
    """
    config, div = prob.config, prob.divergence
    critic = _critic(trained, plan)
    val_crit_p, val_crit_q = _critic_values(trained, plan)
    centres = certification.tail_centres(div, np.asarray(val_crit_p), np.asarray(val_crit_q))
    sequence = None
    if plan.method == "betting-sequence":
        z_val = np.asarray(val_crit_p, np.float64) - np.asarray(
            div.conjugate(val_crit_q), np.float64
        )
        sequence = _Sequence(div, plan, z_val, config.target, confidence)
    # Every pass runs in pieces of EVAL_ROWS rows: one compiled program serves the held-out and the
    # in-sample pass and every sample size.
    common = dict(divergence=div, centres=centres, named=trained.plain)
    held = evaluate_fixed(
        trained.graphdef, critic, *prob.test_chunks(), keep_samples=plan.method == "betting",
        on_chunk=sequence, **common,
    )  # fmt: skip
    fit_p, fit_q = (np.asarray(x)[:INSAMPLE_PAIRS] for x in prob.fit_batch)
    chunks = (array_chunks(fit_p, config.eval_chunk), array_chunks(fit_q, config.eval_chunk))
    insample = evaluate_fixed(trained.graphdef, critic, *chunks, **common)
    return _Evaluated(held, insample, sequence)


# The in-sample diagnostic (``train_value``) uses the first this many training pairs at most: a
# random subsample (the training samples are shuffled or i.i.d. draws), whose estimate's standard
# error is part of the overfitting check (certification.diagnostics); evaluating 5 x 10^5 training
# pairs took a third of a warm 10^6-per-side estimate's evaluation.
INSAMPLE_PAIRS = 4 * EVAL_ROWS


def _critic(trained: _Trained, plan) -> Critic:
    return _typed_critic(trained.params, trained.rest, plan.scale, plan.shift, plan.bound)


def _critic_values(trained: _Trained, plan) -> tuple[np.ndarray, np.ndarray]:
    """The planned critic's values on the validation samples (host, from the member's outputs)."""
    critic = _critic(trained, plan)
    return tuple(readout_host(critic, h) for h in trained.h_val)


def _certify(prob: _Problem, plan, ev: _Evaluated, confidence: float):
    """``(bound, tail check, Bonferroni bound for both directions or None, ceiling)`` on test data."""
    config, div, held = prob.config, prob.divergence, ev.held
    n_test = int(min(float(held.p.count), float(held.q.count)))
    cap = certification.cap_for(div, n_test, confidence)
    if ev.sequence is not None:
        bound = Bound(ev.sequence.lower, "finite-sample", "betting-sequence", confidence)
        return bound, tail_check(held, config.tail_margin), None, cap
    kw = {
        "guarantee": plan.guarantee,
        "confidence": confidence,
        "method": plan.method,
        "support": plan.support,
        "cap": cap,
        "tail_margin": config.tail_margin,
    }
    bound, check = certify(held, **kw)
    family = certify(held, family_size=2, **kw)[0] if config.both_directions else None
    return bound, check, family, cap


def _fields(prob, trained, plan, ev, bound, check, family, cap, direction) -> dict[str, Any]:
    """The result's fields for one direction: values, what the bound is on, diagnostics, curves."""
    config, div, held = prob.config, prob.divergence, ev.held
    warnings = list(trained.warnings)
    if (
        div.conjugate_sup < math.inf
        and prob.spec.bound is None
        and plan.guarantee != "finite-sample"
    ):
        warnings.append(
            f"{div.label}: f* is +inf above {div.conjugate_sup:.4g}, so an unbounded class is degenerate "
            "(docs/theory/divergences.md); use a bounded class (bound=B) or guarantee='finite-sample'"
        )
    target = certification.target(
        div, guarantee=plan.guarantee, certified_class=plan.certified_class,
        named_class=prob.named_class, inside=plan.inside_trained_class, margin=config.tail_margin,
    )  # fmt: skip
    fields = certification.bound_fields(div, held, bound, prob.spec, cap, warnings)
    warnings.extend(certification.diagnostics(div, held, fields, trained.val_curve, ev.insample))
    blocks = len(trained.val_curve)
    fields.update(
        {
            "train_value": float(to_reported(div, ev.insample.estimate_terms.estimate)),
            "objective": prob.trainer.objective,
            "curves": {
                "block_step": [
                    (i + 1) * min(config.eval_every, config.steps) for i in range(blocks)
                ],
                "val_objective": _finite_or_neg_inf(trained.val_curve),
                "train_objective": _finite_or_neg_inf(trained.train_curve),
            },
            "warnings": tuple(warnings),
            "restarts": trained.restarts,
            "direction": direction,
            "guarantee": plan.guarantee,
            "bound_method": bound.method,
            "certified_class": target.certified_class,
            "named_class": target.named_class,
            "bound_on_named_class": target.on_named_class,
            "bounds": target.bounds,
            "assumption": target.assumption,
            "guarantee_choice": plan.choice,
            "critic_bound": None if math.isinf(plan.bound) else plan.bound,
            "tail_index_p": check.index_p,
            "tail_index_q": check.index_q,
            "tail_shrink": plan.tail_shrink,
            "test_used": (int(held.p.count), int(held.q.count)),
        }
    )
    if family is not None:
        fields["bonferroni"] = certification.reported_bound(div, family, prob.spec)
    return fields


def _finite_or_neg_inf(values: np.ndarray) -> list[float]:
    """A training curve for the result: a diverged (NaN) step is reported as -inf, never NaN."""
    return [float(v) if np.isfinite(v) else -math.inf for v in np.asarray(values, np.float64)]
