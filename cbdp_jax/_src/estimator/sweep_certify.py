"""The sweep's certification: each member's held-out statistics turned into a bound and a result row.

Host-side: the chunk moments merged in float64 into a :class:`~cbdp_jax._src.statistics.held_out.HeldOut`,
the bound's method and support chosen per member, the bound certified with the estimator's checks and
written as one row per member.

References:
  docs/theory/bounds.md.

"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from cbdp_jax._src.estimator.adversaries import AdversarySpec
from cbdp_jax._src.estimator.certification import (
    bound_fields,
    cap_for,
    describe,
    diagnostics,
    interval_support,
    predicted_bound_from_moments,
    resolve_guarantee,
)
from cbdp_jax._src.estimator.sweep_plan import _key_data, _model_static, _Plan, _put
from cbdp_jax._src.estimator.sweep_programs import _evaluate_program
from cbdp_jax._src.estimator.sweep_types import Member, SweepConfig, TrainedBatch, _to_host
from cbdp_jax._src.privacy.divergences import get_divergence
from cbdp_jax._src.statistics import berry_esseen, held_out, tails
from cbdp_jax._src.statistics import moments as mom
from cbdp_jax._src.statistics.bounds import Bound, family_confidence


def _host_held_out(stats, n_valid: int) -> held_out.HeldOut:
    """Device chunk statistics of a batch ``[M, ...]`` as float64 host held-out statistics."""
    stats = jax.tree.map(_to_host, stats)
    p, q, z, pairs, tail_p, tail_q, named_p, named_q = stats[:8]
    z_samples = np.asarray(stats[8][:, :n_valid], np.float64) if len(stats) > 8 else None
    f64 = lambda m: mom.Moments(*(np.asarray(f, np.float64) for f in m))  # noqa: E731
    return held_out.HeldOut(
        f64(p),
        f64(q),
        f64(z),
        berry_esseen.PairMoments(f64(pairs.w), f64(pairs.v)),
        tails.TailSketch(np.asarray(tail_p.top, np.float64), np.asarray(tail_p.count)),
        tails.TailSketch(np.asarray(tail_q.top, np.float64), np.asarray(tail_q.count)),
        z_samples,
        held_out.Terms(f64(named_p), f64(named_q)),
    )


def _evaluate_batch(
    batch: TrainedBatch,
    plan: _Plan,
    test_key: jax.Array,
    n: int,
    chunk: int,
    sharding: NamedSharding,
) -> held_out.HeldOut:
    """Streams ``n`` held-out samples per side per member; returns the merged statistics ``[M, ...]``."""
    seeds = [plan.members[i].seed for i in batch.members]
    test_kd = _put(_key_data(test_key, seeds), sharding)
    keep = "betting" in _member_methods(batch, plan)
    # Always the full chunk shape (the last chunk masked), so every sample size shares one compilation.
    acc = None
    for index, start in enumerate(range(0, n, chunk)):
        valid = min(chunk, n - start)
        stats = _evaluate_program(
            batch.inputs,
            test_kd,
            batch.output,
            np.int32(index),
            np.int32(valid),
            static=_model_static(batch.static),
            chunk=chunk,
            keep=keep,
        )
        part = _host_held_out(stats, valid)
        acc = part if acc is None else held_out.merge(acc, part)
    return acc


def _member_methods(batch: TrainedBatch, plan: _Plan) -> list[str]:
    """Each real member's bound method, decided from its validation statistics (never the test data)."""
    config = plan.config
    out = batch.output
    scale, shift = _to_host(out.scale), _to_host(out.shift)
    zm, zp = jax.tree.map(_to_host, out.val_z)
    methods = []
    for j, i in enumerate(batch.members[: batch.n_real]):
        member = plan.members[i]
        if resolve_guarantee(config.guarantee, member.adversary) != "finite-sample":
            methods.append("clt")
            continue
        if config.finite_sample_method != "auto":
            methods.append(config.finite_sample_method)
            continue
        div = get_divergence(plan.divergence, alpha=member.alpha, convention=plan.convention)
        lo, hi = _member_support(div, member.adversary, float(scale[j]), float(shift[j]))
        pairs = berry_esseen.PairMoments(mom.take(zp.w, j), mom.take(zp.v, j))
        level = family_confidence(config.confidence, config.family_size)
        _, method = predicted_bound_from_moments(
            mom.take(zm, j), pairs, lo, hi, config.test_samples, level
        )
        methods.append(method)
    return methods


def _member_support(div, spec: AdversarySpec, scale: float, shift: float) -> tuple[float, float]:
    """The range of the paired differences of a bounded member's fitted critic scale * h + shift."""
    lo_h, hi_h = shift - abs(scale) * spec.bound, shift + abs(scale) * spec.bound
    return interval_support(div, lo_h, hi_h)


def _certify_member(
    member: Member,
    held: held_out.HeldOut,
    scale: float,
    shift: float,
    config: SweepConfig,
    div,
    method: str,
) -> tuple[Bound, held_out.TailCheck, float]:
    """A member's bound under the sweep's guarantee; returns it, the tail check and the cap."""
    guarantee = resolve_guarantee(config.guarantee, member.adversary)
    n = int(min(float(held.p.count), float(held.q.count)))
    cap = cap_for(div, n, config.confidence)
    support = None
    if guarantee == "finite-sample":
        support = _member_support(div, member.adversary, scale, shift)
    bound, check = held_out.certify(
        held,
        guarantee=guarantee,
        confidence=config.confidence,
        family_size=config.family_size,
        method=method,
        support=support,
        cap=cap,
        tail_margin=config.tail_margin,
    )
    return bound, check, cap


def _row(
    member: Member,
    held: held_out.HeldOut,
    *,
    scale: float,
    shift: float,
    best_value: float,
    finite: bool,
    val_curve: np.ndarray,
    plan: _Plan,
    objective: str,
    method: str,
    tail_shrink: float,
) -> dict[str, Any]:
    config = plan.config
    div = get_divergence(plan.divergence, alpha=member.alpha, convention=plan.convention)
    bound, check, cap = _certify_member(member, held, scale, shift, config, div, method)
    warnings: list[str] = [member.note] if member.note else []
    if not finite:
        warnings.append("training diverged (NaN or inf); lower the learning rate")
    fields = bound_fields(div, held, bound, member.adversary, cap, warnings)
    warnings.extend(diagnostics(div, held, fields, val_curve))
    mech = member.mechanism
    param_name = "epsilon" if mech.family == "laplace" else "sigma"
    return {
        "member": member.index,
        "mechanism": mech.label,
        "family": mech.family,
        "param_name": param_name,
        "param": float(getattr(mech, param_name)),
        "noise_scale": float(mech.noise_scale),
        "adversary": member.adversary.label,
        "adversary_index": member.adversary_index,
        "adversary_spec": member.adversary.to_dict(),
        "divergence": div.label,
        "alpha": member.alpha,
        "learning_rate": member.learning_rate,
        "seed": member.seed,
        **fields,
        "guarantee": bound.kind,
        "bound_method": bound.method,
        "bounds": describe(div, member.adversary.label),
        "tail_index_p": check.index_p,
        "tail_index_q": check.index_q,
        "tail_shrink": tail_shrink,
        "confidence": config.confidence,
        "test_samples": int(min(float(held.p.count), float(held.q.count))),
        "val_objective": best_value,
        "objective": objective,
        "finite": finite,
        "warnings": warnings,
    }


def _batch_rows(batch: TrainedBatch, plan: _Plan, held: held_out.HeldOut) -> list[dict[str, Any]]:
    out = batch.output
    best, finite, curves = _to_host(out.best_value), _to_host(out.finite), _to_host(out.val_curve)
    scale, shift = _to_host(out.scale), _to_host(out.shift)
    shrink = _to_host(out.tail_shrink)
    methods = _member_methods(batch, plan)
    return [
        _row(
            plan.members[i],
            held_out.take(held, j),
            scale=float(scale[j]),
            shift=float(shift[j]),
            best_value=float(best[j]),
            finite=bool(finite[j]),
            val_curve=curves[j],
            plan=plan,
            objective=batch.static.objective,
            method=methods[j],
            tail_shrink=float(shrink[j]),
        )
        for j, i in enumerate(batch.members[: batch.n_real])
    ]
