"""Certifying one pair on its fresh samples: every row of the audit's Bonferroni family.

A pure or approximate claim is checked with hockey-stick critics of each feature group, fitted on
the training split and certified on the held-out split (:func:`_hockey_rows`); a Renyi or capacity
claim with the estimator's bounds (:func:`_estimator_rows`), a capacity claim only with bounds on
its own class.
"""

from __future__ import annotations

import math

import jax

from cbdp_jax._src.mechanism_auditor import blocks
from cbdp_jax._src.mechanism_auditor import hockey_stick as hs
from cbdp_jax._src.mechanism_auditor.claims import Claim, architecture_kwargs
from cbdp_jax._src.mechanism_auditor.config import AuditConfig
from cbdp_jax._src.mechanism_auditor.results import Row
from cbdp_jax._src.statistics.bounds import family_confidence


def _hockey_rows(key, xp, xq, claim: Claim, config: AuditConfig,
                 groups: tuple = ()) -> tuple[list[Row], int]:  # fmt: skip
    """The certified rows of every feature group (the whole sample without groups), one family."""
    n = min(len(xp), len(xq))
    n_train = int(n * config.train_fraction)
    # 12 significant digits: a grid point eps * (e / eps) reads e, not 0.9999999999999999, in the JSON
    grid = (
        [float(f"{claim.epsilon * g:.12g}") for g in config.eps_grid]
        if claim.epsilon > 0
        else [0.0]
    )
    groups = tuple(groups) or (hs.FeatureGroup("score", lambda x: x),)
    plans = [_group_plan(g, grid, claim, config) for g in groups]
    family = sum(len(points) * len(classes) * 2 + tails for points, classes, tails in plans)
    rows = []
    for g_i, (group, plan) in enumerate(zip(groups, plans, strict=True)):
        k = key if g_i == 0 else jax.random.fold_in(key, 10_000 + g_i)
        rows += _group_rows(k, group, plan, xp[:n], xq[:n], n_train, claim, config, family)
    return rows, family


def _group_plan(group, grid: list[float], claim: Claim, config: AuditConfig):
    """A group's grid points, critic classes and tail rows (its share of the family)."""
    points = grid if group.grid else sorted({grid[0], claim.epsilon})
    classes = config.classes if group.classes is None else group.classes
    return points, classes, 2 if config.tail_bounds and group.tails else 0


def _group_rows(key, group, plan, xp, xq, n_train: int, claim: Claim, config: AuditConfig,
                family: int) -> list[Row]:  # fmt: skip
    """One group's rows: critics fitted on the training split, certified on the held-out split."""
    points, classes, tails = plan
    if group.learned:  # a learned logit of the features, fitted on the training split only
        key, k_logit = jax.random.split(key)
        g, _ = hs.fit_logit(k_logit, xp[:n_train], xq[:n_train], "mlp", width=32, depth=2,
                            steps=_LEARNED_STEPS, batch=1024, features=group.features)  # fmt: skip
        xp, xq = g(xp)[:, None], g(xq)[:, None]  # held: one logit a run, not the features
    else:  # the features of every run (feature functions are row-wise: a block at a time)
        xp, xq = blocks.in_blocks(group.features, xp), blocks.in_blocks(group.features, xq)
    prefix = "" if group.name == "score" else f"{group.name}:"
    n, rows = len(xp), []
    for i, eps in enumerate(points):
        for j, (name, a, b) in enumerate((("P||Q", xp, xq), ("Q||P", xq, xp))):
            for c_i, kind in enumerate(classes):
                k = jax.random.fold_in(key, 100 * i + 10 * j + c_i)
                critic = hs.fit_critic(k, kind, a[:n_train], b[:n_train], math.exp(eps))
                critic = critic._replace(label=prefix + critic.label)
                rows.append(
                    _row(critic, (a[n_train:n], b[n_train:n]), eps, name, claim, config, family)
                )
    # tail rows: the set refuting the largest eps at the claim's delta, certified at the claim's eps
    per_side = 1.0 - (1.0 - family_confidence(config.confidence, family)) / 2.0
    for name, a, b in (("P||Q", xp, xq), ("Q||P", xq, xp)) if tails else ():
        critic = hs.fit_tail(a[:n_train], b[:n_train], claim.delta, n - n_train, per_side)
        critic = critic._replace(label=prefix + critic.label)
        held = (a[n_train:n], b[n_train:n])
        rows.append(
            _row(critic, held, claim.epsilon, name, claim, config, family, betting_too=False)
        )
    return rows


_LEARNED_STEPS = 300  # Adam steps of a learned group's logit (batches of 1024 per side)


def _row(critic, held, eps: float, name: str, claim: Claim, config: AuditConfig, family: int,
         *, betting_too: bool = True) -> Row:  # fmt: skip
    """One certified row: the critic's held-out bound at gamma = e^eps against the claim there."""
    gamma, claimed = math.exp(eps), claim.claimed_delta(eps)
    a, b = held
    if config.tail_bounds and critic.indicator:
        res = hs.certify_indicator(
            critic.fn(a), critic.fn(b), gamma, confidence=config.confidence, family_size=family,
            betting_too=betting_too,
        )  # fmt: skip
    else:
        res = hs.certify(
            critic.fn(a), critic.fn(b), gamma, confidence=config.confidence, family_size=family
        )
    return Row(
        critic.label, name, eps, claimed, res.estimate, res.bound.value,
        res.std_error * math.sqrt(res.n), res.bound.value > claimed,
        p_lower=res.p_lower, q_upper=res.q_upper,
    )  # fmt: skip


_ESTIMATOR_CLASSES = {
    "linear": {"adversary": "linear"},
    "poly": {"adversary": "poly", "degree": 3},
    "mlp": {"adversary": "mlp", "width": 32, "depth": 2},
    "bounded-mlp": {"adversary": "mlp", "width": 32, "depth": 2, "bound": 2.0},
}


def _estimator_rows(key, xp, xq, claim: Claim, config: AuditConfig) -> tuple[list[Row], int]:
    from cbdp_jax._src.estimator.estimate import EstimatorConfig, estimate_from_samples

    if claim.kind == "capacity":
        classes, divergence, alphas = [claim.adversary], claim.divergence, [claim.alpha]
        # A bound on D^H of the claimed class itself: a bounded class's finite-sample bound; for an
        # unbounded class the asymptotic one (the finite-sample bound of B tanh(H / B) is on another
        # class), its assumption stated in the rows.
        guarantee = "class"
    else:
        classes = [c if c in _ESTIMATOR_CLASSES else "bounded-mlp" for c in config.classes]
        classes, divergence = list(dict.fromkeys(classes)), "renyi"
        alphas = sorted({a for a in (claim.alpha, 1.0 + (claim.alpha - 1.0) / 2) if a > 1.01})
        guarantee = "finite-sample"
    family = len(classes) * len(alphas) * 2
    est_config = EstimatorConfig(
        steps=config.estimator_steps, ensemble=2, batch_size=2048, guarantee=guarantee,
        family_size=family, confidence=config.confidence,
    )  # fmt: skip
    claimed = claim.value if claim.kind == "capacity" else claim.epsilon
    rows = []
    for i, alpha in enumerate(alphas):
        for j, (name, a, b) in enumerate((("P||Q", xp, xq), ("Q||P", xq, xp))):
            for c_i, cls in enumerate(classes):
                k = jax.random.fold_in(key, 100 * i + 10 * j + c_i)
                kwargs = (
                    architecture_kwargs(claim.architecture)
                    if claim.kind == "capacity"
                    else _ESTIMATOR_CLASSES[cls]
                )
                r = estimate_from_samples(
                    k, a, b, divergence=divergence, alpha=alpha, config=est_config, **kwargs
                )  # fmt: skip
                rows.append(_estimator_row(r, claim, name, alpha, claimed))
    return rows, family


def _estimator_row(r, claim: Claim, direction: str, alpha, claimed: float) -> Row:
    """One estimator result as a row; a capacity claim counts only a bound on its own class."""
    low, note = r.lower_bound, ""
    if not r.bound_reliable:
        low, note = -math.inf, f"bound refused: {r.refusal}"
    elif claim.kind == "capacity" and not r.bound_on_named_class:
        low, note = -math.inf, f"not counted: {r.bounds}"
    elif r.guarantee == "asymptotic":
        note = f"asymptotic bound; assumption: {r.assumption}"
    return Row(
        r.certified_class or r.adversary, direction, alpha if alpha else 1.0, claimed, r.estimate,
        low, r.std_error * math.sqrt(r.samples["test_p"]), low > claimed, r.guarantee, note,
    )  # fmt: skip
