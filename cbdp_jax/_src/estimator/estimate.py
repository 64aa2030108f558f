"""Empirical capacity-bounded privacy: adversaries trained on samples, evaluated on held-out samples.

The estimate of D^H(P, Q) is the plain f-form of ONE fixed trained adversary on samples it never saw
(docs/theory/bounds.md): training samples fit the ensemble, validation samples pick the member and the
early-stopping point, and held-out test samples give the estimate, its standard error and a one-sided
lower confidence bound. Because the evaluated h is one member of H, the estimate is (in expectation) a
lower bound on D^H, and its confidence bound is a certified (asymptotically, by the CLT) lower bound.

Two entry points: :func:`estimate` draws samples from a mechanism's neighbouring pair (optionally fresh
samples at every training step), and :func:`estimate_from_samples` takes two arrays a user already has.

Each entry runs the stages in order: :mod:`estimator_plan` (budget, samples and their split, input
maps, one problem per direction), :mod:`estimator_fit` (the adversaries trained, one member fixed),
:mod:`estimator_certify` (the bound planned on validation samples, evaluated on held-out ones). The
types are in :mod:`estimator_types`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp

from cbdp_jax._src.estimator.adversaries import AdversarySpec
from cbdp_jax._src.estimator.certify import (
    _certify,
    _evaluate,
    _fields,
    _mapped_plan,
    _plan_certificate,
    _validation_score,
)
from cbdp_jax._src.estimator.evaluation import array_chunks
from cbdp_jax._src.estimator.fit import _screen, _screen_batch, _screen_steps, _train
from cbdp_jax._src.estimator.objectives import kl_domain_reduction
from cbdp_jax._src.estimator.plan import (
    _SPLIT_THREADS,
    _as_pair,
    _as_spec,
    _config_dict,
    _counts,
    _draw_pair,
    _key_data,
    _known_infinite,
    _mapped_candidates,
    _mechanism_maps,
    _mechanism_problem,
    _Problem,
    _resolved,
    _sample_sizes,
    _split,
    _trainer,
)
from cbdp_jax._src.estimator.types import EstimateResult, EstimatorConfig
from cbdp_jax._src.infra import keys, sizes, threads
from cbdp_jax._src.infra.io import environment_info
from cbdp_jax._src.infra.programs import served
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_key,
    check_same_dim,
    check_samples,
)
from cbdp_jax._src.privacy.divergences import get_divergence
from cbdp_jax._src.statistics.bounds import (
    family_confidence,
    z_quantile,
)


def _run(
    key: jax.Array, probs: list[_Problem], *, direction: str, confidence: float
) -> dict[str, Any]:
    """Trains, plans the certificate on validation data, evaluates once on test data, certifies.

    ``probs`` holds one problem per candidate input map (the same samples through different maps);
    with several, one is chosen on validation samples (:func:`_select`) and evaluated, so the test
    samples are used once, by a critic chosen without them.
    """
    prob, trained, plan, choice = _select(key, probs, confidence)
    ev = _evaluate(prob, trained, plan, confidence)
    bound, check, family, cap = _certify(prob, plan, ev, confidence)
    fields = _fields(prob, trained, plan, ev, bound, check, family, cap, direction)
    fields.update(input_map=prob.input_map.kind, input_map_choice=choice)
    return fields


def _select(key: jax.Array, probs: list[_Problem], confidence: float):
    """``(problem, trained, plan, why)`` of the candidate input map chosen on validation samples.

    With several maps, each first trains for one validation block (:func:`_screen`) and only the one
    with the best validation objective is trained in full, with the key it would have had if every
    map were. Where the screen cannot decide, or its leader's planned critic predicts no positive
    bound on validation samples, every map is trained in full and the best predicted bound wins.
    """
    z = z_quantile(confidence)
    if len(probs) == 1:
        trained = _train(key, probs[0], z)
        plan = _plan_certificate(probs[0], trained, confidence)
        return probs[0], trained, _mapped_plan(probs[0], plan), probs[0].map_choice
    map_keys = keys.split(key, num=len(probs))
    screened = _screen(map_keys, probs)
    found: dict[int, tuple] = {}
    if screened is not None:
        lead, values = screened
        found[lead] = _candidate(map_keys[lead], probs[lead], confidence, z)
        raced = ", ".join(f"{p.input_map.kind} {v:.4g}" for v, p in zip(values, probs, strict=True))
        config = probs[0].config
        batch = "" if config.batch_size is None else f" (minibatch {_screen_batch(config)})"
        raced = f"validation objectives after {_screen_steps(config)} steps of each{batch}: {raced}"
        if found[lead][0] > 0:
            _, prob, trained, plan = found[lead]
            why = f"{prob.map_choice}; {raced}; {prob.input_map.kind} trained in full and evaluated"
            return prob, trained, _mapped_plan(prob, plan), why
    for i, (k, prob) in enumerate(zip(map_keys, probs, strict=True)):
        if i not in found:
            found[i] = _candidate(k, prob, confidence, z)
    ordered = [found[i] for i in range(len(probs))]
    _, prob, trained, plan = max(ordered, key=lambda c: c[0])  # the first of equal scores
    scores = ", ".join(f"{p.input_map.kind} {v:.4g}" for v, p, _, _ in ordered)
    lead_failed = "" if screened is None else f"{raced}, but the leader predicts no bound; "
    why = (
        f"{prob.map_choice}; {lead_failed}each trained in full, predicted bounds on validation "
        f"samples (f-scale): {scores}; {prob.input_map.kind} evaluated"
    )
    return prob, trained, _mapped_plan(prob, plan), why


def _candidate(key: jax.Array, prob: _Problem, confidence: float, z: float) -> tuple:
    """``(validation score, problem, trained, plan)`` of one map trained in full."""
    trained = _train(key, prob, z)
    plan = _plan_certificate(prob, trained, confidence)
    return _validation_score(prob, trained, plan, confidence), prob, trained, plan


def _unbounded(reason: str, direction: str) -> dict[str, Any]:
    return {
        "estimate": math.inf,
        "lower_bound": math.inf,
        "std_error": 0.0,
        "f_estimate": math.inf,
        "f_lower_bound": math.inf,
        "f_std_error": 0.0,
        "certified_estimate": math.inf,
        "train_value": math.inf,
        "objective": "none",
        "curves": {},
        "warnings": (reason,),
        "restarts": 0,
        "direction": direction,
        "unbounded": True,
        "reason": reason,
        "guarantee": "exact",
        "bound_method": "exact",
        "bounds": "the law of the mechanism (no samples)",
        "assumption": "none: from the mechanism's law",
        "guarantee_choice": "the divergence is +inf by the mechanism's law",
    }


def _assemble(
    fields_pq: dict[str, Any],
    fields_qp: dict[str, Any] | None,
    *,
    div,
    spec: AdversarySpec,
    config: EstimatorConfig,
    samples: dict[str, int],
    seconds: float,
    call: dict[str, Any],
    named_class: str | None = None,
) -> EstimateResult:
    used = fields_pq.pop("test_used", None)
    if used is not None and "test_p" in samples:
        # Sequential mode may stop before the budget: record what was used.
        samples = {**samples, "test_p": used[0], "test_q": used[1]}
    if fields_qp is not None:
        fields_qp.pop("test_used", None)
    for fields in (fields_pq, fields_qp):
        if fields is not None:
            fields.setdefault("certified_class", spec.label)
            fields.setdefault("named_class", named_class or spec.label)
    common = {
        "confidence": config.confidence,
        "divergence": div.label,
        "adversary": spec.label,
        "samples": samples,
        "environment": environment_info(),
        "config": {**_config_dict(config, call["entry"]), **call},
        "seconds": seconds,
    }
    reverse = None
    extra = {}
    if fields_qp is not None:
        reverse = EstimateResult(
            **{k: v for k, v in fields_qp.items() if k != "bonferroni"}, **common
        )
        extra = {
            "max_estimate": max(fields_pq["estimate"], fields_qp["estimate"]),
            "max_lower_bound": max(fields_pq["bonferroni"], fields_qp["bonferroni"]),
        }
    fields_pq = {k: v for k, v in fields_pq.items() if k != "bonferroni"}
    return EstimateResult(**fields_pq, **common, reverse=reverse, **extra)


def _directions(
    key, make_problem, *, config, known_infinite: str | None
) -> tuple[dict, dict | None]:
    """The fields of D(P, Q) and, with ``both_directions``, of D(Q, P) (else None).

    The two directions are independent pipelines with their own keys; they run side by side in two
    threads where that changes nothing but the wall time (:mod:`threads`), never with a progress
    callback (user code, perhaps not safe to call from two threads).
    """
    k_pq, k_qp = keys.split(key)
    jobs = [(k_pq, "PQ"), (k_qp, "QP")] if config.both_directions else [(k_pq, "PQ")]

    def one(k, direction: str) -> dict:
        if known_infinite is not None:
            fields = _unbounded(known_infinite, direction)
            fields["bonferroni"] = math.inf
            return fields
        probs = make_problem(swap=direction == "QP")
        level = family_confidence(config.confidence, config.family_size)
        return _run(k, probs, direction=direction, confidence=level)

    concurrent = known_infinite is None and config.progress is None
    results = threads.map_concurrently(one, jobs, concurrent=concurrent)
    return results[0], (results[1] if len(results) > 1 else None)


@served
def estimate_from_samples(
    key: jax.Array,
    p_samples: Any,
    q_samples: Any,
    *,
    adversary: AdversarySpec | str = "mlp",
    divergence: str = "kl",
    alpha: float | None = None,
    convention: str = "abs",
    config: EstimatorConfig = EstimatorConfig(),  # noqa: B008 (frozen, immutable)
    **adversary_options: Any,
) -> EstimateResult:
    """Estimates D^H(P, Q) from two arrays of samples a user already has.

    The samples are shuffled and split into train / validation / test parts (``config.split``);
    the estimate is evaluated on the test part only.

    Args:
      key: A typed PRNG key (``jax.random.key(seed)``): shuffling, initialisation and minibatches.
      p_samples: Samples of P, ``[n]`` or ``[n, d]``: numpy, JAX, or anything ``np.asarray`` accepts
        (e.g. a torch CPU tensor or a DLPack-capable array).
      q_samples: Samples of Q, ``[m]`` or ``[m, d]``.
      adversary: An :class:`AdversarySpec` or a class name (``'linear'``, ``'poly'``, ``'relu2'``,
        ``'mlp'``, ``'rff'``); ``adversary_options`` (degree, width, ...) complete a name.
      divergence: ``'kl'``, ``'renyi'``, ``'alpha'``, ``'chi2'``, ``'tv'``, ``'hellinger'``, ``'js'``.
      alpha: The order for ``'renyi'`` / ``'alpha'``.
      convention: Conjugate convention of the alpha family (``'abs'``, the paper's, or ``'nonneg'``).
      config: Training and evaluation settings.
      **adversary_options: Fields of :class:`AdversarySpec` when ``adversary`` is a name; an option
        that does not apply to the class (``width`` for ``'linear'``) is an error.

    Returns:
      An :class:`EstimateResult`.

    Raises:
      InvalidParameterError: Non-finite samples, mismatched dimensions, too few samples for the split,
        unknown names, alpha <= 1.

    Examples:
      >>> import jax, numpy as np
      >>> rng = np.random.default_rng(0)
      >>> p, q = rng.laplace(0, 1, 4000), rng.laplace(1, 1, 4000)
      >>> cfg = EstimatorConfig(steps=200, ensemble=2, batch_size=512)
      >>> res = estimate_from_samples(jax.random.key(0), p, q, adversary="linear", config=cfg)
      >>> 0.1 < res.estimate < 0.35  # (lin, KL) = 0.226 for Laplace eps = 1
      True

    References:
      docs/theory/bounds.md; paper eq. (1)-(3).

    """
    t0 = time.perf_counter()
    key = check_key(key)
    named = _as_spec(adversary, adversary_options)
    div = get_divergence(divergence, alpha=alpha, convention=convention)
    # The law is unknown: the same domain rule as for a mechanism with unbounded noise (a subset of
    # the named class, so the bound holds whatever the law; the note says so).
    spec, domain_note = kl_domain_reduction(None, named, div.name)
    p = check_samples("p_samples", p_samples)
    q = check_samples("q_samples", q_samples)
    check_same_dim(p, q)
    sizes.check_representable("p_samples", f"<array of shape {p.shape}>", p, config.dtype)
    sizes.check_representable("q_samples", f"<array of shape {q.shape}>", q, config.dtype)
    sizes.check_memory_for_arrays(p, q, config)
    config, budget = _resolved(config, int(config.split[0] * min(p.shape[0], q.shape[0])))
    k_perm, k_fit = keys.split(key)  # stored programs: the same keys as jax.random.split's
    kp, kq = keys.split(k_perm)
    # The two shuffles are independent host sorts (NumPy releases the GIL): side by side.
    jobs = [("p_samples", p, kp, config), ("q_samples", q, kq, config)]
    p_host, q_host = threads.map_concurrently(_split, jobs, concurrent=p.shape[0] >= _SPLIT_THREADS)
    mapped, map_choice = _mapped_candidates(config, p_host, q_host)

    def one_problem(imap, p_parts, q_parts, swap: bool) -> _Problem:
        a, b = (p_parts, q_parts) if not swap else (q_parts, p_parts)
        dim = a[0].shape[1]  # the mapped dimension (the rank map adds atom indicators)
        return _Problem(
            spec=spec, divergence=div, trainer=_trainer(spec, div, dim, config), config=config,
            dim=dim,
            train=(a[0], b[0]), val=(a[1], b[1]),
            test_chunks=lambda: (
                array_chunks(a[2], config.eval_chunk), array_chunks(b[2], config.eval_chunk)
            ),
            n_test=(a[2].shape[0], b[2].shape[0]), stats_sample=(a[0], b[0]),
            named_class=named.label, input_map=imap, map_choice=map_choice,
        )  # fmt: skip

    def make_problem(swap: bool) -> list[_Problem]:
        return [one_problem(m, pp, qq, swap) for m, pp, qq in mapped]

    pq, qp = _directions(k_fit, make_problem, config=config, known_infinite=None)
    samples = _counts(*((len(a), len(b)) for a, b in zip(p_host, q_host, strict=True)))
    call = {
        "entry": "samples", "key_data": _key_data(key), "adversary_spec": spec.to_dict(),
        "divergence": divergence, "alpha": alpha, "convention": convention, "budget": budget,
    }  # fmt: skip
    result = _assemble(
        pq, qp, div=div, spec=spec, config=config, samples=samples,
        seconds=time.perf_counter() - t0, call=call, named_class=named.label,
    )  # fmt: skip
    return _with_note(result, domain_note)


def _with_note(result: EstimateResult, note: str | None) -> EstimateResult:
    """The result with ``note`` as its first warning (the domain rule's), if there is one."""
    if note is None:
        return result
    return dataclasses.replace(result, warnings=(note, *result.warnings))


@served
def estimate(
    key: jax.Array,
    pair: Any,
    *,
    samples: int = 100_000,
    val_samples: int | None = None,
    test_samples: int | None = None,
    fresh_samples: bool = False,
    adversary: AdversarySpec | str = "mlp",
    divergence: str = "kl",
    alpha: float | None = None,
    convention: str = "abs",
    config: EstimatorConfig = EstimatorConfig(),  # noqa: B008 (frozen, immutable)
    **adversary_options: Any,
) -> EstimateResult:
    """Estimates D^H(M(D), M(D')) for a mechanism and a neighbouring pair, drawing samples inside.

    Training, validation and test samples are independent draws (separate keys). Test samples are drawn
    and evaluated in chunks of ``config.eval_chunk``, so ``test_samples`` is limited by time, not memory.

    Args:
      key: A typed PRNG key (``jax.random.key(seed)``).
      pair: A :class:`~cbdp_jax.mechanisms.NeighbouringPair`, or a mechanism (its
        :func:`~cbdp_jax.mechanisms.canonical_pair` is used).
      samples: Training samples per side (in fresh-sample mode: only the sample that fixes the input
        standardisation).
      val_samples: Validation samples per side (default ``samples // 4``, at least 1000).
      test_samples: Held-out samples per side (default ``samples``).
      fresh_samples: Draw a fresh minibatch from the mechanism at every training step, inside the
        compiled loop (memory independent of the number of steps).
      adversary: An :class:`AdversarySpec` or a class name; ``adversary_options`` complete a name.
      divergence: The divergence name.
      alpha: The order for ``'renyi'`` / ``'alpha'``.
      convention: The alpha family's conjugate convention.
      config: Training and evaluation settings.
      **adversary_options: Fields of :class:`AdversarySpec` when ``adversary`` is a name; an option
        that does not apply to the class (``degree`` for ``'mlp'``) is an error.

    Returns:
      An :class:`EstimateResult`.

    Raises:
      InvalidParameterError: For bad sizes, names, or parameters, and options that do not apply.

    Examples:
      >>> import jax
      >>> from cbdp_jax.mechanisms import LaplaceMechanism
      >>> cfg = EstimatorConfig(steps=300, ensemble=2, batch_size=1024)
      >>> res = estimate(jax.random.key(0), LaplaceMechanism(epsilon=1.0), samples=20_000,
      ...                adversary="linear", divergence="kl", config=cfg)
      >>> abs(res.estimate - 0.2260) < 5 * res.std_error + 0.01
      True

    """
    t0 = time.perf_counter()
    key = check_key(key)
    pair = _as_pair(pair)
    if fresh_samples and config.input_map in ("robust", "rank"):
        raise InvalidParameterError(
            f"input_map={config.input_map!r} is invalid with fresh_samples=True: the training "
            "minibatches are drawn inside the compiled loop; use input_map 'standard' or 'auto'"
        )
    samples, val_samples, test_samples = _sample_sizes(samples, val_samples, test_samples)
    named = _as_spec(adversary, adversary_options)
    div = get_divergence(divergence, alpha=alpha, convention=convention)
    spec, domain_note = kl_domain_reduction(pair.mechanism, named, div.name)
    dtype = jnp.dtype(config.dtype)
    config, budget = _resolved(config, samples, pair=pair, val_samples=val_samples)
    k_train, k_val, k_test, k_fit = keys.split(key, num=4)
    train = _draw_pair(pair, k_train, samples, dtype)
    val = _draw_pair(pair, k_val, val_samples, dtype)
    mech, known_infinite = pair.mechanism, _known_infinite(pair, spec, div)
    candidates = _mechanism_maps(config, train, val, fresh_samples=fresh_samples)

    def make_problem(swap: bool) -> list[_Problem]:
        return [
            _mechanism_problem(
                pair, swap, spec=spec, div=div, config=config, train=tr, val=va,
                k_test=k_test, test_samples=test_samples, fresh_samples=fresh_samples,
                named_class=named.label, input_map=imap,
            )
            for imap, (tr, va) in candidates
        ]  # fmt: skip

    pq, qp = _directions(k_fit, make_problem, config=config, known_infinite=known_infinite)
    n_train = config.steps * (config.batch_size or 0) if fresh_samples else samples
    counts = _counts((n_train, n_train), (val_samples, val_samples), (test_samples, test_samples))
    call = {
        "entry": "mechanism", "key_data": _key_data(key),
        "mechanism": getattr(mech, "label", type(mech).__name__), "adversary_spec": spec.to_dict(),
        "divergence": divergence, "alpha": alpha, "convention": convention, "samples": samples,
        "val_samples": val_samples, "test_samples": test_samples, "fresh_samples": fresh_samples,
        "budget": budget,
    }  # fmt: skip
    result = _assemble(
        pq, qp, div=div, spec=spec, config=config, samples=counts,
        seconds=time.perf_counter() - t0, call=call, named_class=named.label,
    )  # fmt: skip
    return _with_note(result, domain_note)
