"""Empirical capacity-bounded privacy: adversaries trained on samples, evaluated on held-out samples.

The estimate of D^H(P, Q) is the plain f-form of ONE fixed trained adversary on samples it never saw
(MATH.md section 9): training samples fit the ensemble, validation samples pick the member and the
early-stopping point, and held-out test samples give the estimate, its standard error and a one-sided
lower confidence bound. Because the evaluated h is one member of H, the estimate is (in expectation) a
lower bound on D^H, and its confidence bound is a certified (asymptotically, by the CLT) lower bound.

Two entry points: :func:`estimate` draws samples from a mechanism's neighbouring pair (optionally fresh
samples at every training step), and :func:`estimate_from_samples` takes two arrays a user already has.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.adversaries import AdversarySpec, make_adversary
from cbdp_jax._src.divergences import get_divergence
from cbdp_jax._src.evaluation import (
    HeldOut,
    array_chunks,
    evaluate_fixed,
    point_mass_reason,
    summarize,
    to_reported,
    z_quantile,
)
from cbdp_jax._src.io import environment_info, to_json
from cbdp_jax._src.objectives import conservative_fit, objective_functions
from cbdp_jax._src.training import (
    OPTIMIZERS,
    ObjectiveKey,
    apply_fn,
    init_ensemble,
    train_ensemble,
)
from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_key,
    check_positive,
    check_same_dim,
    check_samples,
)

DTYPES = ("float32", "float64")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EstimatorConfig:
    """How adversaries are trained and evaluated. Frozen and hashable.

    Attributes:
      steps: Optimiser steps per adversary.
      eval_every: Steps between validation checks (early stopping and the training curve).
      batch_size: Minibatch size per side (None: full batch).
      learning_rate: Adam's step size (halved by 10 on each restart after a divergence).
      optimizer: ``'adam'`` or ``'lbfgs'`` (full batch; for classes linear in their parameters).
      ensemble: Adversaries trained at once from different initialisations (vmapped); the one with
        the best validation value is evaluated.
      confidence: Level 1 - delta of the one-sided lower confidence bound.
      tight: Train with the tighter forms of MATH.md section 3 where the class allows it.
      dtype: ``'float32'`` (default) or ``'float64'`` (needs ``jax_enable_x64``).
      split: Train / validation / test fractions for :func:`estimate_from_samples`.
      both_directions: Also estimate D^H(Q, P) and report the maximum with a Bonferroni bound.
      eval_chunk: Rows per chunk in held-out evaluation (bounds memory).
      max_restarts: Restarts with a 10x smaller step size when training diverges (NaN).

    """

    steps: int = 2000
    eval_every: int = 100
    batch_size: int | None = 4096
    learning_rate: float = 1e-2
    optimizer: str = "adam"
    ensemble: int = 4
    confidence: float = 0.95
    tight: bool = True
    dtype: str = "float32"
    split: tuple[float, float, float] = (0.5, 0.25, 0.25)
    both_directions: bool = False
    eval_chunk: int = 65536
    max_restarts: int = 2
    progress: Callable[[Any], None] | None = dataclasses.field(default=None, compare=True)

    def __post_init__(self):
        check_int_at_least("steps", self.steps, 1)
        check_int_at_least("eval_every", self.eval_every, 1)
        if self.batch_size is not None:
            check_int_at_least("batch_size", self.batch_size, 2)
        check_positive("learning_rate", self.learning_rate)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_int_at_least("ensemble", self.ensemble, 1)
        check_in_range("confidence", self.confidence, 0.5, 1.0, high_open=True)
        check_choice("dtype", self.dtype, DTYPES)
        if len(self.split) != 3 or any(not (0 < s < 1) for s in self.split):
            raise InvalidParameterError(
                f"split={self.split!r} is invalid: must be three fractions in (0, 1) (train, val, test)"
            )
        if abs(sum(self.split) - 1.0) > 1e-9:
            raise InvalidParameterError(f"split={self.split!r} is invalid: fractions must sum to 1")
        check_int_at_least("eval_chunk", self.eval_chunk, 1)
        check_int_at_least("max_restarts", self.max_restarts, 0)
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise InvalidParameterError(
                "dtype='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) first"
            )


@dataclasses.dataclass(frozen=True)
class EstimateResult:
    """A held-out estimate of a restricted divergence, with its uncertainty and diagnostics.

    Values named without prefix are on the reported scale (Renyi for ``'renyi'``); ``f_*`` values are on
    the f-divergence scale. ``lower_bound`` is a one-sided ``confidence`` lower bound (asymptotic, CLT).

    Attributes:
      estimate: Held-out f-form value of the selected adversary (reported scale).
      lower_bound: One-sided lower confidence bound on D^H (reported scale; clamped at 0 since every
        class here contains constants, so D^H >= 0).
      std_error: Standard error of ``estimate`` (delta method for the Renyi map).
      confidence: The level of ``lower_bound``.
      f_estimate: The estimate on the f-divergence scale.
      f_lower_bound: The unclamped bound on the f-divergence scale.
      f_std_error: Standard error on the f-divergence scale.
      divergence: Label of the divergence, e.g. ``'Renyi(alpha=4)'``.
      adversary: Label of the class, e.g. ``'poly_3'``.
      direction: ``'PQ'`` (D(P, Q)) or ``'QP'``.
      samples: Sample counts used for training, validation and test, per side.
      train_value: In-sample f-form of the same fixed function on the training samples (diagnostic
        only; never an estimate).
      objective: The training objective (``'dv'``, ``'renyi_scale_free'``, ``'fform'``).
      curves: Validation and training objective per evaluation block of the selected member.
      warnings: Human-readable warnings (convergence, heavy tails, gaps, restarts).
      bound_reliable: False when one held-out sample carries half or more of the variance of f*(h):
        the CLT bound is then meaningless and ``lower_bound`` is the trivial bound 0.
      heavy_tail_share: The largest single held-out Q-term's share of the variance of f*(h).
      unbounded: True when the divergence is +inf (then ``estimate`` and ``lower_bound`` are inf).
      reason: Why the result is unbounded, if it is.
      restarts: Training restarts after divergence.
      seconds: Wall time of the whole estimate.
      environment: Versions, device and commit.
      config: The configuration and call parameters, enough to rerun.
      reverse: The (Q, P) direction when ``both_directions`` was set.
      max_estimate: max of both directions' estimates (if both were run).
      max_lower_bound: max of both directions' bounds at level 1 - delta/2 each (Bonferroni), a
        ``confidence``-level lower bound on max(D(P,Q), D(Q,P)).

    """

    estimate: float
    lower_bound: float
    std_error: float
    confidence: float
    f_estimate: float
    f_lower_bound: float
    f_std_error: float
    divergence: str
    adversary: str
    direction: str
    samples: dict[str, int]
    train_value: float
    objective: str
    curves: dict[str, list[float]]
    warnings: tuple[str, ...]
    bound_reliable: bool = True
    heavy_tail_share: float = 0.0
    unbounded: bool = False
    reason: str | None = None
    restarts: int = 0
    seconds: float = 0.0
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    reverse: EstimateResult | None = None
    max_estimate: float | None = None
    max_lower_bound: float | None = None

    @property
    def device(self) -> str:
        """The device the estimate ran on."""
        return str(self.environment.get("device", "unknown"))

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (nested results included), with ``device`` at the top level."""
        out = dataclasses.asdict(self)
        out["device"] = self.device
        out["warnings"] = list(self.warnings)
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON (infinite values become the strings 'inf' / '-inf')."""
        return to_json(self.to_dict(), indent=indent)


def _as_spec(adversary: AdversarySpec | str, options: dict[str, Any]) -> AdversarySpec:
    if isinstance(adversary, AdversarySpec):
        given = {k: v for k, v in options.items() if v is not None}
        if given:
            option, value = next(iter(given.items()))
            raise InvalidParameterError(
                f"{option}={value!r} is invalid with adversary={adversary.label!r}: options complete "
                "a class given by name; set them on the AdversarySpec instead"
            )
        return adversary
    if isinstance(adversary, str):
        return make_adversary(adversary, **options)
    raise InvalidParameterError(
        f"adversary={adversary!r} is invalid: must be an AdversarySpec or a class name"
    )


def _key_data(key: jax.Array) -> list[int]:
    return np.asarray(jax.random.key_data(key)).ravel().tolist()


class _Problem:
    """Everything one direction of an estimate needs: data access, class, objective."""

    def __init__(
        self,
        *,
        spec: AdversarySpec,
        objective_key: ObjectiveKey,
        config: EstimatorConfig,
        dim: int,
        train: tuple[jax.Array, jax.Array] | None,
        val: tuple[jax.Array, jax.Array],
        test_chunks: Callable[[], tuple[Iterator[jax.Array], Iterator[jax.Array]]],
        n_test: tuple[int, int],
        sampler: Callable | None = None,
        stats_sample: tuple[jax.Array, jax.Array],
    ):
        self.spec, self.objective_key, self.config, self.dim = spec, objective_key, config, dim
        self.train, self.val, self.test_chunks, self.n_test = train, val, test_chunks, n_test
        self.sampler, self.stats_sample = sampler, stats_sample


def _run(key: jax.Array, prob: _Problem, *, direction: str, delta: float) -> dict[str, Any]:
    config = prob.config
    div, objective = prob.objective_key.build()
    dtype = jnp.dtype(config.dtype)
    pooled = jnp.concatenate(prob.stats_sample, axis=0)
    loc = jnp.mean(pooled, axis=0)
    scale = jnp.std(pooled, axis=0)
    scale = jnp.where(scale > 0, scale, 1.0)
    k_init, k_train = jax.random.split(key)
    graphdef, params, rest = init_ensemble(
        jax.random.split(k_init, config.ensemble), prob.spec, prob.dim, loc, scale, dtype
    )
    warnings: list[str] = []
    lr = config.learning_rate
    restarts = 0
    while True:
        out = train_ensemble(
            jax.random.fold_in(k_train, restarts),
            graphdef,
            params,
            rest,
            objective_key=prob.objective_key,
            val_p=prob.val[0],
            val_q=prob.val[1],
            train_p=None if prob.train is None else prob.train[0],
            train_q=None if prob.train is None else prob.train[1],
            sampler=prob.sampler,
            optimizer=config.optimizer,
            learning_rate=lr,
            steps=config.steps,
            eval_every=config.eval_every,
            batch_size=config.batch_size,
            progress=config.progress,
        )
        finite = np.asarray(out.finite)
        if finite.all() or restarts >= config.max_restarts:
            break
        restarts += 1
        lr = lr / 10.0
        warnings.append(
            f"training diverged (NaN or inf) in {int((~finite).sum())} of {finite.size} adversaries; "
            f"restarted with learning rate {lr:g}"
        )
    if not finite.any():
        warnings.append("training diverged in every adversary even after restarts")
    best_values = np.where(finite, np.asarray(out.best_value), -np.inf)
    member = int(np.argmax(best_values))
    take = lambda tree: jax.tree.map(lambda x: x[member], tree)  # noqa: E731
    params_m, rest_m = take(out.best_params), take(rest)

    # Fit the constant / scale on training outputs (MATH.md section 3), then freeze the function.
    fit_p, fit_q = prob.train if prob.train is not None else prob.stats_sample
    h_p = apply_fn(graphdef, params_m, rest_m, fit_p)
    h_q = apply_fn(graphdef, params_m, rest_m, fit_q)
    fscale, fshift = objective.fit(h_p, h_q)
    z = z_quantile(1.0 - delta)
    fscale, fshift = conservative_fit(
        objective.kind,
        objective_functions(objective.kind, div.name, div.convention).conjugate,
        apply_fn(graphdef, params_m, rest_m, prob.val[0]),
        apply_fn(graphdef, params_m, rest_m, prob.val[1]),
        fscale,
        fshift,
        z,
        div.alpha,
    )

    def evaluate(p_chunks, q_chunks) -> HeldOut:
        return evaluate_fixed(
            params_m,
            rest_m,
            fscale,
            fshift,
            p_chunks,
            q_chunks,
            graphdef=graphdef,
            objective_key=prob.objective_key,
        )

    held = evaluate(*prob.test_chunks())
    insample = evaluate(
        array_chunks(fit_p, config.eval_chunk), array_chunks(fit_q, config.eval_chunk)
    )
    val_curve = np.asarray(out.trace.val_value)[:, member]
    if div.conjugate_sup < math.inf and prob.spec.bound is None:
        warnings.append(
            f"{div.label}: f* is +inf above {div.conjugate_sup:.4g}, so an unbounded class is degenerate "
            "(MATH.md section 6); use a bounded class (bound=B with B below that level)"
        )
    summary = summarize(
        div, held, z=z, contains_constants=prob.spec.contains_constants, val_curve=val_curve
    )
    warnings.extend(summary.pop("warnings"))
    f_est, f_se = summary["f_estimate"], summary["f_std_error"]
    blocks = len(val_curve)
    gap = insample.estimate - f_est
    if math.isfinite(gap) and gap > 3.0 * f_se + 0.01 * abs(f_est) + 1e-3:
        warnings.append(
            f"train/test gap: in-sample value exceeds the held-out estimate by {gap:.3g} "
            f"(> 3 standard errors); the adversary overfits -- use more samples or a smaller class"
        )
    curves = {
        "block_step": [(i + 1) * min(config.eval_every, config.steps) for i in range(blocks)],
        "val_objective": _finite_or_neg_inf(val_curve),
        "train_objective": _finite_or_neg_inf(np.asarray(out.trace.train_value)[:, member]),
    }
    return {
        **summary,
        "train_value": float(to_reported(div, insample.estimate)),
        "objective": objective.kind,
        "curves": curves,
        "warnings": tuple(warnings),
        "restarts": restarts,
        "direction": direction,
    }


def _finite_or_neg_inf(values: np.ndarray) -> list[float]:
    """A training curve for the result: a diverged (NaN) step is reported as -inf, never NaN."""
    return [float(v) if np.isfinite(v) else -math.inf for v in np.asarray(values, np.float64)]


def _unbounded(reason: str, direction: str) -> dict[str, Any]:
    return {
        "estimate": math.inf,
        "lower_bound": math.inf,
        "std_error": 0.0,
        "f_estimate": math.inf,
        "f_lower_bound": math.inf,
        "f_std_error": 0.0,
        "train_value": math.inf,
        "objective": "none",
        "curves": {},
        "warnings": (reason,),
        "restarts": 0,
        "direction": direction,
        "unbounded": True,
        "reason": reason,
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
) -> EstimateResult:
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


def _directions(key, make_problem, *, config, point_mass: str | None) -> tuple[dict, dict | None]:
    delta = 1.0 - config.confidence
    k_pq, k_qp = jax.random.split(key)
    results = []
    for k, direction in ((k_pq, "PQ"), (k_qp, "QP")):
        if direction == "QP" and not config.both_directions:
            results.append(None)
            break
        if point_mass is not None:
            fields = _unbounded(point_mass, direction)
            fields["bonferroni"] = math.inf
        else:
            prob = make_problem(swap=direction == "QP")
            fields = _run(k, prob, direction=direction, delta=delta)
            if config.both_directions:
                fields["bonferroni"] = _run_bonferroni(fields, prob, delta)
        results.append(fields)
    return results[0], results[1]


def _run_bonferroni(fields: dict[str, Any], prob: _Problem, delta: float) -> float:
    """The same direction's bound at level 1 - delta/2 (for the maximum over two directions)."""
    div, _ = prob.objective_key.build()
    f_est, f_se = fields["f_estimate"], fields["f_std_error"]
    if not math.isfinite(f_est):
        return f_est
    if not fields["bound_reliable"]:
        return 0.0 if prob.spec.contains_constants else -math.inf
    lb = to_reported(div, f_est - z_quantile(1.0 - delta / 2.0) * f_se)
    return max(lb, 0.0) if prob.spec.contains_constants else lb


def estimate_from_samples(
    key: jax.Array,
    p_samples: Any,
    q_samples: Any,
    *,
    adversary: AdversarySpec | str = "mlp",
    divergence: str = "kl",
    alpha: float | None = None,
    convention: str = "abs",
    config: EstimatorConfig = EstimatorConfig(),
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
      MATH.md section 9; paper eq. (1)-(3).

    """
    t0 = time.perf_counter()
    key = check_key(key)
    spec = _as_spec(adversary, adversary_options)
    div = get_divergence(divergence, alpha=alpha, convention=convention)
    p = check_samples("p_samples", p_samples)
    q = check_samples("q_samples", q_samples)
    check_same_dim(p, q)
    fracs = config.split
    for name, arr in (("p_samples", p), ("q_samples", q)):
        need = math.ceil(2 / min(fracs))
        if arr.shape[0] < need:
            raise InvalidParameterError(
                f"{name} has {arr.shape[0]} samples: the split {fracs} needs at least {need} per side "
                "(two in each of train, validation and test)"
            )
    dtype = jnp.dtype(config.dtype)
    k_perm, k_fit = jax.random.split(key)
    kp, kq = jax.random.split(k_perm)

    def parts(arr, k):
        n = arr.shape[0]
        idx = np.asarray(jax.random.permutation(k, n))
        n_tr, n_va = int(fracs[0] * n), int(fracs[1] * n)
        x = jnp.asarray(arr[idx], dtype)
        return x[:n_tr], x[n_tr : n_tr + n_va], x[n_tr + n_va :]

    p_tr, p_va, p_te = parts(p, kp)
    q_tr, q_va, q_te = parts(q, kq)
    objective_key = ObjectiveKey(div.name, div.alpha, div.convention, config.tight, spec)

    def make_problem(swap: bool) -> _Problem:
        a = (p_tr, p_va, p_te) if not swap else (q_tr, q_va, q_te)
        b = (q_tr, q_va, q_te) if not swap else (p_tr, p_va, p_te)
        return _Problem(
            spec=spec,
            objective_key=objective_key,
            config=config,
            dim=p.shape[1],
            train=(a[0], b[0]),
            val=(a[1], b[1]),
            test_chunks=lambda: (
                array_chunks(a[2], config.eval_chunk),
                array_chunks(b[2], config.eval_chunk),
            ),
            n_test=(a[2].shape[0], b[2].shape[0]),
            stats_sample=(a[0], b[0]),
        )

    point_mass = point_mass_reason(p, q)
    pq, qp = _directions(k_fit, make_problem, config=config, point_mass=point_mass)
    samples = {
        "train_p": int(p_tr.shape[0]),
        "train_q": int(q_tr.shape[0]),
        "val_p": int(p_va.shape[0]),
        "val_q": int(q_va.shape[0]),
        "test_p": int(p_te.shape[0]),
        "test_q": int(q_te.shape[0]),
    }
    call = {
        "entry": "samples",
        "key_data": _key_data(key),
        "adversary_spec": spec.to_dict(),
        "divergence": divergence,
        "alpha": alpha,
        "convention": convention,
    }
    return _assemble(
        pq,
        qp,
        div=div,
        spec=spec,
        config=config,
        samples=samples,
        seconds=time.perf_counter() - t0,
        call=call,
    )


def _config_dict(config: EstimatorConfig, entry: str = "samples") -> dict[str, Any]:
    """The configuration settings that applied to an estimate.

    ``split`` applies only to :func:`estimate_from_samples` (``entry='samples'``): a mechanism estimate
    draws its train / validation / test samples separately and records their counts instead.
    """
    d = dataclasses.asdict(config)
    d.pop("progress")
    if entry == "samples":
        d["split"] = list(config.split)
    else:
        d.pop("split")
    return d


def _sample_chunks(
    mechanism, dataset, key: jax.Array, n: int, chunk: int, dtype
) -> Iterator[jax.Array]:
    """Streams ``n`` samples of M(dataset) in chunks; chunk i uses ``fold_in(key, i)``."""
    draw = jax.jit(lambda k, m: mechanism.sample(k, dataset, m, dtype=dtype), static_argnums=1)
    for i, start in enumerate(range(0, n, chunk)):
        yield draw(jax.random.fold_in(key, i), min(chunk, n - start))


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
    config: EstimatorConfig = EstimatorConfig(),
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
    from cbdp_jax._src.mechanisms import Mechanism, NeighbouringPair, canonical_pair

    t0 = time.perf_counter()
    key = check_key(key)
    if isinstance(pair, Mechanism):
        pair = canonical_pair(pair)
    if not isinstance(pair, NeighbouringPair):
        raise InvalidParameterError(
            f"pair={pair!r} is invalid: must be a NeighbouringPair or a Mechanism"
        )
    samples = check_int_at_least("samples", samples, 2)
    val_samples = max(samples // 4, 1000) if val_samples is None else val_samples
    val_samples = check_int_at_least("val_samples", val_samples, 2)
    test_samples = samples if test_samples is None else test_samples
    test_samples = check_int_at_least("test_samples", test_samples, 2)
    spec = _as_spec(adversary, adversary_options)
    div = get_divergence(divergence, alpha=alpha, convention=convention)
    dtype = jnp.dtype(config.dtype)
    objective_key = ObjectiveKey(div.name, div.alpha, div.convention, config.tight, spec)
    k_train, k_val, k_test, k_fit = jax.random.split(key, 4)
    train = pair.sample(k_train, samples, dtype=dtype)
    val = pair.sample(k_val, val_samples, dtype=dtype)
    point_mass = point_mass_reason(np.asarray(train[0]), np.asarray(train[1]))
    mech = pair.mechanism

    def make_problem(swap: bool) -> _Problem:
        d_a, d_b = (pair.dataset, pair.neighbour) if not swap else (pair.neighbour, pair.dataset)
        tr = train if not swap else (train[1], train[0])
        va = val if not swap else (val[1], val[0])
        kp, kq = jax.random.split(jax.random.fold_in(k_test, int(swap)))
        chunk = config.eval_chunk
        return _Problem(
            spec=spec,
            objective_key=objective_key,
            config=config,
            dim=pair.dim,
            train=None if fresh_samples else tr,
            val=va,
            test_chunks=lambda: (
                _sample_chunks(mech, d_a, kp, test_samples, chunk, dtype),
                _sample_chunks(mech, d_b, kq, test_samples, chunk, dtype),
            ),
            n_test=(test_samples, test_samples),
            sampler=None if not fresh_samples else (pair if not swap else pair.swapped()).sample,
            stats_sample=tr,
        )

    pq, qp = _directions(k_fit, make_problem, config=config, point_mass=point_mass)
    n_train = config.steps * (config.batch_size or 0) if fresh_samples else samples
    counts = {
        "train_p": n_train,
        "train_q": n_train,
        "val_p": val_samples,
        "val_q": val_samples,
        "test_p": test_samples,
        "test_q": test_samples,
    }
    call = {
        "entry": "mechanism",
        "key_data": _key_data(key),
        "mechanism": getattr(mech, "label", type(mech).__name__),
        "adversary_spec": spec.to_dict(),
        "divergence": divergence,
        "alpha": alpha,
        "convention": convention,
        "samples": samples,
        "val_samples": val_samples,
        "test_samples": test_samples,
        "fresh_samples": fresh_samples,
    }
    return _assemble(
        pq,
        qp,
        div=div,
        spec=spec,
        config=config,
        samples=counts,
        seconds=time.perf_counter() - t0,
        call=call,
    )
