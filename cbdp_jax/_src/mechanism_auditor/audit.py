"""Auditing a mechanism's privacy claim from samples: screen neighbouring pairs, certify on fresh ones.

1. **Screen.** Candidate pairs (given, generated from a :class:`DatasetSpace` by random and local
   search, or from the user's generator) are scored on a small budget: a half-space and a histogram
   critic fitted on half the screening samples, evaluated on the other half, at the claim's gamma.
2. **Certify.** The best pair is certified on FRESH samples never used in screening, so the search
   is a data-dependent choice of *which* pair to test and costs no multiplicity: conditionally on the
   screening data, the certification samples are independent draws. Every (class, direction, grid
   point) bound of the certification is one member of a Bonferroni family of size K.
3. **Verdict.** A violation is certified only when a certified lower bound exceeds the claimed value;
   otherwise the strongest certified bound is reported with how many samples a violation of a given
   size would need.

The stages live in modules of their own, read in this order: the claim (``audit_claims``, with the
curves it allows in ``audit_epsilon``), the budgets (``audit_config``), the pair (``audit_pairs``),
its certified rows (``audit_certify``), the verdict (``audit_verdict``) and what is reported
(``audit_results``). This module runs them in turn (:func:`audit`).

Claims (docs/theory/auditing.md): ``pure:EPS`` and ``approx:EPS:DELTA`` are checked with the
hockey-stick divergence (pure eps-DP as its delta = 0 case), and the audit reports the empirical
epsilon: the largest eps whose (eps, delta) claim the certified curve refutes, and the largest GDP mu
it refutes. ``renyi:ALPHA:EPS`` is checked with the estimator's finite-sample bound (any critic's bound
is a bound on the unrestricted divergence). ``capacity:CLASS:DIV[:ALPHA]:VALUE`` is a claim about D^H for
that class, so it is checked only with bounds on a subset of H: the finite-sample bound of a bounded
class, and for an unbounded class the asymptotic bound on the class itself (its assumption stated) --
never the finite-sample bound of ``B tanh(H / B)``, which is not inside H and has a larger divergence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from cbdp_jax._src.infra.validation import check_choice, check_key
from cbdp_jax._src.mechanism_auditor.certify import _estimator_rows, _hockey_rows
from cbdp_jax._src.mechanism_auditor.claims import Claim, parse_claim
from cbdp_jax._src.mechanism_auditor.config import AuditConfig
from cbdp_jax._src.mechanism_auditor.epsilon import empirical_epsilon
from cbdp_jax._src.mechanism_auditor.loading import (
    AuditMechanism,
    finite_or,
    load_mechanism,
    refuse_non_finite,
)
from cbdp_jax._src.mechanism_auditor.pairs import DatasetSpace, search_pair
from cbdp_jax._src.mechanism_auditor.results import AuditResult
from cbdp_jax._src.mechanism_auditor.verdict import _verdict


def audit(
    key: jax.Array,
    mechanism: AuditMechanism | str | Callable,
    claim: Claim | str,
    *,
    pair: tuple[Any, Any] | None = None,
    space: DatasetSpace | None = None,
    candidates: Iterable | None = None,
    config: AuditConfig = AuditConfig(),  # noqa: B008 (a frozen dataclass)
    progress: Callable | None = None,
) -> AuditResult:
    """Audits ``claim`` for ``mechanism``: screens pairs, certifies the best on fresh samples.

    Args:
      key: A typed PRNG key; split into a screening key and a certification key (never reused).
      mechanism: An :class:`AuditMechanism`, ``'file.py:function'`` / ``'module:function'``, or a
        callable ``(key_or_rng, dataset, n) -> n outputs``.
      claim: A :class:`Claim` or its text (:func:`parse_claim`).
      pair: A given neighbouring pair ``(D, D')``; no search then.
      space: A :class:`DatasetSpace` to search when ``pair`` is None.
      candidates: Candidate pairs (e.g. the user's generator), screened with the space's.
      config: Budgets and levels.
      progress: Called with a :class:`~cbdp_jax._src.infra.sharded_runs.Progress` counting the
        certification samples of D and D' (``total`` = 2 ``config.samples``): at 0 once the pair is
        chosen, then after each side's draw (a :class:`cbdp_jax._src.infra.progress.Progress` bar takes it).

    Returns:
      An :class:`AuditResult`; ``violation`` is True only when a certified bound exceeds the claim.

    """
    check_key(key)
    start = time.perf_counter()
    mech = mechanism if isinstance(mechanism, AuditMechanism) else load_mechanism(mechanism)
    claim = claim if isinstance(claim, Claim) else parse_claim(claim)
    _check_memory(mech, pair, space, config)
    k_screen, k_cert, k_fit = jax.random.split(key, 3)
    screened: list[dict] = []
    if pair is None:
        eps = claim.epsilon if math.isfinite(claim.epsilon) else 1.0
        pair, screened = search_pair(
            k_screen, mech, math.exp(eps), config, space=space, candidates=candidates
        )
    d, d2 = (np.asarray(x) for x in pair)
    groups = _chosen_groups(mech, config)  # checked before any sample is drawn
    kp, kq = jax.random.split(k_cert)
    tell = _progress_teller(progress, 2 * config.samples)
    tell(0)
    xp = mech.sample(kp, d, config.samples)
    tell(config.samples)
    xq = mech.sample(kq, d2, config.samples)
    tell(2 * config.samples)
    # a run it could not check is never a pass: NaN or inf outputs refuse the audit
    refuse_non_finite(mech.name, xp, "D")
    refuse_non_finite(mech.name, xq, "D'")
    if claim.kind in ("pure", "approx"):
        rows, family = _hockey_rows(k_fit, xp, xq, claim, config, groups)
        grid_name = "epsilon"
    else:
        if groups:  # the estimator sees the first group (a mechanism's own score)
            xp, xq = groups[0].features(xp), groups[0].features(xq)
        rows, family = _estimator_rows(k_fit, xp, xq, claim, config)
        grid_name = "alpha"
    n_test = config.samples - int(config.samples * config.train_fraction)
    noun = getattr(mech, "sample_noun", "samples")
    violation, text, needed, point, guarantee = _verdict(rows, claim, family, config, n_test, noun)
    claimed = {"kind": claim.kind, "epsilon": claim.epsilon, "delta": claim.delta}
    if claim.kind == "capacity":
        claimed |= {"architecture": claim.architecture, "default": claim.architecture_default}
        default = " (the default architecture of class " + claim.adversary + ")"
        text = (
            f"capacity claim on {claim.architecture}"
            f"{default if claim.architecture_default else ''}: {text}"
        )
    if claim.source is not None:
        claimed["source"] = claim.source._asdict()
        text = (
            f"claim {claim.text} = ({claim.epsilon:.4g}, {claim.delta:g})-DP by the accountant "
            f"({claim.source.accountant}). {text}"
        )
    empirical = None
    if grid_name == "epsilon":
        empirical = empirical_epsilon(rows, claim.delta, config.confidence)
        text += (
            f". Empirical epsilon at delta = {claim.delta:g}: every eps below "
            f"{empirical.epsilon:.4g} is refuted (GDP: every mu below {empirical.gdp_mu:.4g})"
        )
    return AuditResult(
        mech.name, claim.text, violation, text, (d.tolist(), d2.tolist()), tuple(rows), family,
        config.confidence, tuple(screened), config.samples, finite_or(needed),
        config.violation_size, time.perf_counter() - start, grid_name, empirical,
        {k: finite_or(v) if isinstance(v, float) else v for k, v in claimed.items()}, point,
        guarantee,
    )  # fmt: skip


def _check_memory(mech, pair, space, config: AuditConfig) -> None:
    """The samples of one pair must fit in memory (one line naming the bytes, before any draw)."""
    from cbdp_jax._src.infra import sizes

    dataset = pair[0] if pair is not None else np.zeros(space.shape) if space is not None else None
    # a training mechanism knows its width without tracing (tracing would trace the whole training)
    known = dataset is not None or hasattr(mech, "problem")
    dim = mech.output_dim(dataset) if known else 1
    noun = getattr(mech, "sample_noun", "samples")
    advice, needed = "", None
    if hasattr(mech, "problem") and dim > 1:  # a training's release: the score alone is one value
        advice = (
            f"use fewer {noun}, or audit the score alone (feature_groups=('score',); the command "
            "line's --critics score), which records one value a run"
        )
        learned = _learned_inputs(_chosen_groups(mech, config), dim)
        needed = lambda n: sizes.training_audit_bytes(n, dim, learned)  # noqa: E731
    sizes.check_memory_for_audit(
        config.samples, config.screen_samples, dim, noun, advice, needed=needed
    )


def _learned_inputs(groups: tuple, dim: int) -> int:
    """The inputs of the groups' learned critic (0 without one), from one row of zeros."""
    learned = [g for g in groups if g.learned]
    row = np.zeros((1, dim), np.float32)
    return max(
        (int(np.asarray(g.features(row)).reshape(1, -1).shape[1]) for g in learned), default=0
    )


def _chosen_groups(mech, config: AuditConfig) -> tuple:
    """The mechanism's feature groups the config names (all of them by default; none: no groups)."""
    groups = tuple(getattr(mech, "feature_groups", ()) or ())
    if config.feature_groups is None or not groups:
        return groups
    known = {g.name: g for g in groups}
    for name in config.feature_groups:
        check_choice("feature_groups", name, tuple(known))
    return tuple(known[name] for name in config.feature_groups)


def _progress_teller(progress: Callable | None, total: int) -> Callable[[int], None]:
    """``tell(done)``: reports ``done`` of ``total`` samples to ``progress`` (nothing when None)."""
    from cbdp_jax._src.infra.sharded_runs import Progress

    start = time.perf_counter()

    def tell(done: int) -> None:
        if progress is None:
            return
        seconds = time.perf_counter() - start
        eta = seconds * (total - done) / done if done else math.nan
        progress(Progress(done, total, seconds, eta))

    return tell
