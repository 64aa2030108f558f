"""Empirical capacity-bounded privacy: adversaries trained on samples, evaluated on held-out samples.

The estimate of D^H(P, Q) is the plain f-form of ONE fixed trained adversary on samples it never saw
(docs/theory/bounds.md): training samples fit the ensemble, validation samples pick the member and the
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cbdp_jax._src import certification, input_maps, keys, sizes, threads
from cbdp_jax._src.adversaries import AdversarySpec, CustomAdversary, make_adversary
from cbdp_jax._src.budget import (
    AUTO,
    check_auto_int,
    derived_fields,
    resolve_budget,
)
from cbdp_jax._src.core import Trainer, cached_trainer, fit_outputs
from cbdp_jax._src.divergences import Divergence, get_divergence
from cbdp_jax._src.evaluation import (
    EVAL_ROWS,
    Critic,
    array_chunks,
    evaluate_fixed,
    readout_host,
    rowwise_outputs,
)
from cbdp_jax._src.io import environment_info, to_json
from cbdp_jax._src.objectives import kl_domain_reduction
from cbdp_jax._src.programs import persistent_jit, served
from cbdp_jax._src.statistics import betting
from cbdp_jax._src.statistics.bounds import (
    Bound,
    f_from_renyi,
    family_confidence,
    to_reported,
    z_quantile,
)
from cbdp_jax._src.statistics.held_out import (
    TAIL_MARGIN,
    HeldOut,
    certify,
    tail_check,
)
from cbdp_jax._src.training import (
    bucket_rows,
    init_standardised_ensemble,
    pad_validation,
    standardisation,
    train_ensemble,
)
from cbdp_jax._src.validation import (
    InvalidParameterError,
    check_choice,
    check_finite_scalar,
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
      steps: Optimiser steps per adversary; ``'auto'`` (default): :func:`default_budget`'s, from
        the number of training samples.
      eval_every: Steps between validation checks (early stopping and the training curve);
        ``'auto'``: :func:`default_budget`'s. A check evaluates the first 16,384 validation pairs
        at most (the bound's plan uses them all).
      patience: Stop training early once every adversary of the ensemble has gone ``patience``
        validation checks in a row without a new best validation value; None trains all ``steps``;
        ``'auto'`` (default): :func:`default_budget`'s when ``steps`` is ``'auto'`` too, else None
        (steps given are trained in full). The best parameters are kept either way; a
        stop only skips blocks that could still have found a better one, so it trades a little of
        the estimate for time (on small samples, where the validation value peaks early, most of
        it). The curves then end where training did.
      batch_size: Minibatch size per side (None: full batch; ``'auto'``: :func:`default_budget`'s).
      learning_rate: The default optimiser's step size (divided by 10 on each restart after a
        divergence; it lives in the optimiser state, so a restart does not recompile).
      optimizer: ``'adam'`` (Adam with gradient clipping), ``'lbfgs'`` (full batch; for classes
        linear in their parameters), or any ``optax.GradientTransformation`` (its own step size;
        ``learning_rate`` and the restarts' smaller steps then do not apply).
      ensemble: Adversaries trained at once from different initialisations (vmapped); the one with
        the best validation value is evaluated (``'auto'``: :func:`default_budget`'s).
      confidence: Level 1 - delta of the one-sided lower confidence bound.
      family_size: The bound is one of ``family_size`` simultaneous bounds (several classes, orders
        or settings checked at once): it is taken at level 1 - delta / family_size (Bonferroni), so
        all of them hold together with probability >= confidence.
      tight: Train with the tighter forms of docs/theory/objectives.md where the class allows it.
      dtype: ``'float32'`` (default) or ``'float64'`` (needs ``jax_enable_x64``).
      split: Train / validation / test fractions for :func:`estimate_from_samples`.
      both_directions: Also estimate D^H(Q, P) and report the maximum with a Bonferroni bound.
      eval_chunk: Rows per chunk in held-out evaluation (bounds memory).
      max_restarts: Restarts with a 10x smaller step size when training diverges (NaN).
      guarantee: The kind of bound (docs/theory/bounds.md): ``'asymptotic'`` (the CLT bound on D^H,
        refused when the held-out tails point to an infinite variance), ``'finite-sample'`` (valid
        at every n with no assumption: the critic is bounded, ``B tanh(h / B)`` with B chosen on
        validation data unless the class is bounded already, and the bound is on that bounded
        class), ``'class'`` (a bound on the class itself, whatever the data: finite-sample for a
        bounded class, asymptotic otherwise; what a claim about D^H of this class needs), or
        ``'auto'`` (finite-sample for bounded classes; for an unbounded class the asymptotic bound
        on the class itself when the critic's validation tails clear the check the test will apply,
        else the finite-sample bound of its bounded version, a bound on that bounded class and on
        the unrestricted divergence; ``guarantee_choice`` says which and why).
      finite_sample_method: ``'berry-esseen'``, ``'betting'`` or ``'auto'`` (the one predicted
        tighter at the test size, chosen on validation data).
      tail_margin: The asymptotic bound needs both f-form terms' tail index (Hill) to be shown
        above 2 + tail_margin on held-out data (default 1: a finite third moment); on validation
        data a cone's KL critic is first shrunk (t * h, t < 1) until it is.
      target: Sequential mode: held-out samples are drawn chunk by chunk (``eval_chunk`` per side)
        and the evaluation stops as soon as the lower bound reaches ``target`` (reported scale), or
        when the test budget is spent. The bound is then the anytime-valid betting confidence
        sequence (finite-sample; valid under this optional stopping). None: one fixed-size test set.
      input_map: The fixed map the critic sees its inputs through, fitted on the pooled training
        samples and applied unchanged to validation and test samples (:mod:`input_maps`,
        docs/theory/bounds.md "Input maps"): ``'standard'`` (none: the class's own mean / std
        standardisation), ``'robust'`` (asinh of the median / IQR-scaled input), ``'rank'`` (the
        training samples' empirical CDF), or ``'auto'`` (``'standard'`` unless the training samples'
        standard deviation exceeds 5 times their robust scale in a coordinate with many distinct
        values; then all three train for one validation block (minibatch at most 512), and the one
        with the best validation objective is trained in full and evaluated). With a map other
        than the identity the bound is on the class composed with the map (``certified_class``
        says so) and on the unrestricted divergence. :func:`estimate` supports the robust maps
        without ``fresh_samples`` only.

    """

    steps: int | str = AUTO
    eval_every: int | str = AUTO
    patience: int | str | None = AUTO
    batch_size: int | str | None = AUTO
    learning_rate: float = 1e-2
    optimizer: Any = "adam"
    ensemble: int | str = AUTO
    confidence: float = 0.95
    family_size: int = 1
    tight: bool = True
    dtype: str = "float32"
    split: tuple[float, float, float] = (0.5, 0.25, 0.25)
    both_directions: bool = False
    eval_chunk: int = 65536
    max_restarts: int = 2
    guarantee: str = "auto"
    finite_sample_method: str = "auto"
    tail_margin: float = TAIL_MARGIN
    target: float | None = None
    input_map: str = "auto"
    progress: Callable[[Any], None] | None = dataclasses.field(default=None, compare=True)

    def __post_init__(self):
        check_auto_int("steps", self.steps, 1)
        check_auto_int("eval_every", self.eval_every, 1)
        if self.patience is not None:
            check_auto_int("patience", self.patience, 1)
        if self.batch_size is not None:
            check_auto_int("batch_size", self.batch_size, 2)
        check_positive("learning_rate", self.learning_rate)
        if isinstance(self.optimizer, str):
            check_choice("optimizer", self.optimizer, ("adam", "lbfgs"))
        elif not isinstance(self.optimizer, optax.GradientTransformation):
            raise InvalidParameterError(
                f"optimizer={self.optimizer!r} is invalid: must be 'adam', 'lbfgs' or an "
                "optax.GradientTransformation"
            )
        check_auto_int("ensemble", self.ensemble, 1)
        check_in_range("confidence", self.confidence, 0.5, 1.0, high_open=True)
        check_int_at_least("family_size", self.family_size, 1)
        check_choice("dtype", self.dtype, DTYPES)
        if len(self.split) != 3 or any(not (0 < s < 1) for s in self.split):
            raise InvalidParameterError(
                f"split={self.split!r} is invalid: must be three fractions in (0, 1) (train, val, test)"
            )
        if abs(sum(self.split) - 1.0) > 1e-9:
            raise InvalidParameterError(f"split={self.split!r} is invalid: fractions must sum to 1")
        check_int_at_least("eval_chunk", self.eval_chunk, 1)
        check_int_at_least("max_restarts", self.max_restarts, 0)
        check_choice("guarantee", self.guarantee, certification.GUARANTEE_CHOICES)
        check_choice(
            "finite_sample_method", self.finite_sample_method, certification.METHOD_CHOICES
        )
        check_in_range("tail_margin", self.tail_margin, 0.0, 10.0)
        check_choice("input_map", self.input_map, input_maps.INPUT_MAP_CHOICES)
        if self.guarantee == "class" and self.input_map in ("robust", "rank"):
            raise InvalidParameterError(
                f"input_map={self.input_map!r} is invalid with guarantee='class': a bound on the "
                "class itself needs input_map 'standard' or 'auto' (which then keeps 'standard')"
            )
        if self.target is not None:
            check_finite_scalar("target", self.target)
            if self.both_directions:
                raise InvalidParameterError(
                    "both_directions=True is invalid with target set: run one direction per call"
                )
            if self.guarantee == "asymptotic":
                raise InvalidParameterError(
                    "guarantee='asymptotic' is invalid with target set: stopping when a CLT bound "
                    "looks good enough is not valid; a target needs guarantee 'finite-sample' (or "
                    "'auto'), whose betting confidence sequence allows it"
                )
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise InvalidParameterError(
                "dtype='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) first"
            )


@dataclasses.dataclass(frozen=True)
class EstimateResult:
    """A held-out estimate of a restricted divergence, with its uncertainty and diagnostics.

    Values named without prefix are on the reported scale (Renyi for ``'renyi'``); ``f_*`` values are on
    the f-divergence scale. ``lower_bound`` is a one-sided ``confidence`` lower bound whose kind is
    ``guarantee`` and whose target is ``bounds`` (docs/theory/bounds.md).

    Attributes:
      estimate: Held-out f-form value of the selected adversary, the fitted member of the class
        (reported scale): the estimate of D^H, never shrunk or bounded for the sake of the bound.
      lower_bound: One-sided lower confidence bound on the quantity named by ``bounds`` (reported
        scale; clamped at 0 since every class here contains constants, so D^H >= 0); the trivial
        bound 0 when the bound was refused (``bound_reliable`` False, ``refusal`` says why).
      std_error: Standard error of ``estimate`` (delta method for the Renyi map); unreliable
        when ``heavy_tail_share`` is large.
      confidence: The level of ``lower_bound``.
      f_estimate: The estimate on the f-divergence scale.
      f_lower_bound: The unclamped bound on the f-divergence scale.
      f_std_error: Standard error on the f-divergence scale.
      divergence: Label of the divergence, e.g. ``'Renyi(alpha=4)'``.
      adversary: Label of the class, e.g. ``'poly_3'``.
      direction: ``'PQ'`` (D(P, Q)) or ``'QP'``.
      samples: Sample counts used for training, validation and test, per side.
      train_value: In-sample f-form of the same fixed function on the training samples (diagnostic
        only; never an estimate): on the first 65,536 training pairs at most (a random subsample;
        the overfitting warning allows for its standard error).
      objective: The training objective (``'dv'``, ``'renyi_scale_free'``, ``'fform'``).
      curves: Validation and training objective per evaluation block of the selected member.
      warnings: Human-readable warnings (convergence, heavy tails, gaps, restarts).
      bound_reliable: False when the bound was refused: an asymptotic bound whose held-out tails point
        to an infinite variance (tail index below 2 + margin, or one sample carrying half the
        variance) or that exceeds what the sample size can certify, or an infeasible finite-sample
        bound. ``lower_bound`` is then the trivial bound 0.
      refusal: Why the bound was refused, or None.
      guarantee: ``'finite-sample'``, ``'asymptotic'`` or ``'exact'`` (a +inf from the mechanism's law).
      bound_method: ``'clt'``, ``'berry-esseen'``, ``'betting'`` or ``'exact'``.
      certified_class: The class the bound is on: the adversary class, or ``B*tanh(class/B)`` for a
        finite-sample bound built from an unbounded class.
      named_class: The class the user named (``adversary`` is the class trained, which may be a
        subset of it: poly_3 under KL is trained as poly_2, see ``warnings``).
      bound_on_named_class: Whether ``lower_bound`` is also a lower bound on D^H for the named
        class: True when the certified class lies inside it (the class itself, a shrunk member of a
        cone, a lower degree); False for ``B*tanh(class/B)`` of an unbounded class, which bounds only
        its own D^H and the unrestricted divergence.
      bounds: In words, what ``lower_bound`` bounds.
      assumption: What the bound rests on: none for a finite-sample bound; the CLT with finite
        variances (beyond the sampled range too) for an asymptotic one.
      guarantee_choice: Why this guarantee was used (for ``'auto'``: which, and why).
      input_map: The input map the evaluated critic saw its inputs through (``'standard'``,
        ``'robust'`` or ``'rank'``; fitted on training samples only).
      input_map_choice: Why that map (for ``'auto'``: the screen's ratio and, when several maps
        raced, each one's validation objective after one block; where all were trained in full,
        each one's predicted bound on validation samples, f-scale).
      critic_bound: B of the bounded critic, or None.
      tail_index_p: Hill's tail index of h(X) under P on held-out samples.
      tail_index_q: Hill's tail index of f*(h(Y)) under Q on held-out samples.
      tail_shrink: The factor t < 1 applied on validation data to clear the tail check (1: none).
      certifiable_max: The largest value (reported scale) any finite-sample bound could certify from
        this many held-out samples per side; roughly log(n) - 1.8 for KL and Renyi.
      f_clt_lower_bound: The CLT bound on the same held-out data (f-scale), for comparison only: it
        is neither tail-checked nor certified.
      certified_estimate: The held-out value of the critic the bound is for (reported scale): equal
        to ``estimate`` unless that critic is a shrunk (``tail_shrink``) or bounded
        (``critic_bound``) version of the estimate's.
      heavy_tail_share: The largest single held-out Q-term's share of the variance of f*(h) (the
        estimate's critic).
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
    refusal: str | None = None
    guarantee: str = "asymptotic"
    bound_method: str = "clt"
    certified_class: str = ""
    named_class: str = ""
    bound_on_named_class: bool = True
    bounds: str = ""
    assumption: str = ""
    guarantee_choice: str = ""
    input_map: str = "standard"
    input_map_choice: str = ""
    critic_bound: float | None = None
    tail_index_p: float = math.inf
    tail_index_q: float = math.inf
    tail_shrink: float = 1.0
    certifiable_max: float = math.inf
    f_clt_lower_bound: float = -math.inf
    certified_estimate: float = -math.inf
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


def _as_spec(adversary: AdversarySpec | CustomAdversary | str, options: dict[str, Any]):
    if isinstance(adversary, (AdversarySpec, CustomAdversary)):
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
        f"adversary={adversary!r} is invalid: must be an AdversarySpec, a CustomAdversary (a user's "
        "nnx.Module class with declared properties) or a class name"
    )


def _trainer(spec: AdversarySpec, div: Divergence, dim: int, config: EstimatorConfig) -> Trainer:
    """The class's pure training functions, built once per (class, divergence, optimiser)."""
    return cached_trainer(
        spec,
        div,
        dim=dim,
        optimizer=config.optimizer,
        tight=config.tight,
        dtype=jnp.dtype(config.dtype),
    )


def _key_data(key: jax.Array) -> list[int]:
    return np.asarray(jax.random.key_data(key)).ravel().tolist()


class _Problem:
    """Everything one direction of an estimate needs: data access, class, objective."""

    def __init__(
        self,
        *,
        spec: AdversarySpec,
        divergence: Divergence,
        trainer: Trainer,
        config: EstimatorConfig,
        dim: int,
        train: tuple[np.ndarray, np.ndarray] | None,
        val: tuple[np.ndarray, np.ndarray],
        test_chunks: Callable[[], tuple[Iterator[jax.Array], Iterator[jax.Array]]],
        n_test: tuple[int, int],
        sampler: Callable | None = None,
        stats_sample: tuple[np.ndarray, np.ndarray],
        named_class: str | None = None,
        input_map: input_maps.InputMap = input_maps.IDENTITY,
        map_choice: str = "asked for",
    ):
        self.spec, self.divergence, self.trainer = spec, divergence, trainer
        # The fixed map the samples went through (fitted on training samples) and why it was used.
        self.input_map, self.map_choice = input_map, map_choice
        # The class the user named (the trained ``spec`` may be a subset of it: kl_domain_reduction).
        self.named_class = spec.label if named_class is None else named_class
        self.config, self.dim = config, dim
        # Host arrays of the samples (training None in fresh-sample mode).
        self.train, self.val, self.test_chunks, self.n_test = train, val, test_chunks, n_test
        self.sampler, self.stats_sample = sampler, stats_sample
        # Training's validation checks use the first CHECK_PAIRS validation pairs at most, padded to a
        # bucket of rows and put on the device once.
        self.val_padded, self.val_counts = pad_validation(*(x[:CHECK_PAIRS] for x in val))
        # The input standardisation of every member, from the pooled sample (training samples).
        self.standardisation = standardisation(stats_sample, jnp.dtype(config.dtype))

    @property
    def fit_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples the closed-form fit uses: the training samples (or the reference draw)."""
        return self.train if self.train is not None else self.stats_sample


# Training's validation checks (the stopping point, the ensemble member, the input-map screen) use
# the first this many validation pairs at most (a random subsample: the samples are shuffled or
# i.i.d. draws); the fit, the plan of the bound and every other choice made on validation samples
# use them all. At 10^6 samples per side (250,000 validation pairs) the checks took a third of a
# warm estimate; the objective's standard error on 16,384 pairs is a few thousandths of its value.
CHECK_PAIRS = 1 << 14


class _Trained(NamedTuple):
    """The selected member of a trained ensemble, with its fitted affine maps and its curves.

    ``scale`` / ``shift``: the conservative fit (best validation bound), where the certified critic
    starts; ``plain``: the closed-form ``(scale, shift)``, the estimate's critic. ``h_val`` and
    ``h_fit``: the member's raw outputs on the validation and fitting samples (host, float32).
    """

    graphdef: Any
    params: Any
    rest: Any
    scale: float
    shift: float
    plain: tuple[float, float]
    val_curve: np.ndarray
    train_curve: np.ndarray
    restarts: int
    warnings: tuple[str, ...]
    h_val: tuple[np.ndarray, np.ndarray]
    h_fit: tuple[np.ndarray, np.ndarray]


# The outputs the fit program reduces are padded to powers of two from this many rows (reductions
# of a few hundred thousand floats: the padding costs nothing that matters).
_MIN_FIT_ROWS = 1 << 16


@persistent_jit(static_argnames=("objective", "divergence"))
def _fit_program(h_fit, h_val, counts, z, *, objective: str, divergence: Divergence):
    """The conservative and the closed-form ``(scale, shift)`` from the member's outputs, one program.

    ``h_fit`` and ``h_val`` are ``(P, Q)`` outputs padded to buckets of rows, ``counts`` their sample
    counts (fit P, fit Q, validation P, validation Q): no program depends on the sample size, and
    none on the class (the outputs are computed by the row-wise program).
    """
    masks = [jnp.arange(h.shape[0]) < c for h, c in zip((*h_fit, *h_val), counts, strict=True)]
    return fit_outputs(
        objective, divergence, h_fit, h_val, z, masks_fit=tuple(masks[:2]),
        masks_val=tuple(masks[2:]),
    )  # fmt: skip


def _padded_outputs(h: np.ndarray) -> np.ndarray:
    """Outputs zero-padded to a power-of-two bucket of rows (:data:`_MIN_FIT_ROWS` at least)."""
    out = np.zeros(bucket_rows(h.shape[0], _MIN_FIT_ROWS), h.dtype)
    out[: h.shape[0]] = h
    return out


def _member(tree, member: int):
    """Member ``member`` of a stacked pytree, on the host (no indexing program per leaf)."""
    return jax.tree.map(lambda x: np.asarray(x)[member], jax.device_get(tree))


def _train(key: jax.Array, prob: _Problem, z: float) -> _Trained:
    """Trains the ensemble (restarting with a smaller step on divergence) and fixes one member."""
    config, trainer = prob.config, prob.trainer
    member_keys, k_train = _ensemble_keys(key, config.ensemble)
    warnings: list[str] = []
    lr = config.learning_rate
    restarts = 0
    while True:
        # The step size lives in the optimiser state: a restart with a smaller one does not recompile.
        state, out = _run_ensemble(
            member_keys, keys.fold_in(k_train, restarts), prob, lr, steps=config.steps,
            batch_size=config.batch_size, progress=config.progress, patience=config.patience,
        )  # fmt: skip
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
    params_m, rest_m = _member(out.best_params, member), _member(state.rest, member)
    raw = _typed_critic(params_m, rest_m, 1.0, 0.0)
    h_fit = tuple(rowwise_outputs(trainer.graphdef, raw, x)[0] for x in prob.fit_batch)
    h_val = tuple(rowwise_outputs(trainer.graphdef, raw, x)[0] for x in prob.val)
    counts = np.array([h.shape[0] for h in (*h_fit, *h_val)], np.int32)
    (fscale, fshift), (pscale, pshift) = _fit_program(
        tuple(_padded_outputs(h) for h in h_fit), tuple(_padded_outputs(h) for h in h_val),
        counts, np.asarray(z, h_val[0].dtype), objective=trainer.objective,
        divergence=prob.divergence,
    )  # fmt: skip
    # Blocks a patience stop skipped have NaN rows (training never makes NaN: a diverged member's
    # value is -inf); the curves end where training did.
    ran = int(np.sum(~np.isnan(np.asarray(out.trace.val_value)[:, member])))
    return _Trained(
        trainer.graphdef,
        params_m,
        rest_m,
        float(fscale),
        float(fshift),
        (float(pscale), float(pshift)),
        np.asarray(out.trace.val_value)[:ran, member],
        np.asarray(out.trace.train_value)[:ran, member],
        restarts,
        tuple(warnings),
        h_val,
        h_fit,
    )


def _ensemble_keys(key: jax.Array, ensemble: int) -> tuple[jax.Array, jax.Array]:
    """``(member initialisation keys [ensemble], training key)`` of one ensemble run from ``key``."""
    k_init, k_train = keys.split(key)
    return keys.split_array(k_init, num=ensemble), k_train


def _run_ensemble(
    member_keys, key, prob: _Problem, lr: float, *, steps: int, batch_size, progress, patience
):
    """``(initial state, TrainOutput)``: the problem's ensemble initialised and trained ``steps`` steps."""
    config, trainer = prob.config, prob.trainer
    loc, scale = prob.standardisation
    state = init_standardised_ensemble(member_keys, trainer, loc, scale, learning_rate=lr)
    out = train_ensemble(
        key,
        trainer,
        state,
        val_p=prob.val_padded[0],
        val_q=prob.val_padded[1],
        val_counts=prob.val_counts,
        train_p=None if prob.train is None else prob.train[0],
        train_q=None if prob.train is None else prob.train[1],
        sampler=prob.sampler,
        steps=steps,
        eval_every=config.eval_every,
        batch_size=None if trainer.line_search else batch_size,
        progress=progress,
        patience=patience,
        cancelled=threads.cancelled,
    )
    return state, out


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


# The screen's key is ``fold_in(map key, _SCREEN_STREAM)``: the map's full training only splits the
# map key, and a fold-in with this constant hashes the key with a different input.
_SCREEN_STREAM = 0x5C4EE2


# The screen's minibatch per side, at most: its one block only has to rank the maps, not fit a critic.
# Against the side-by-side benchmark's batch of 2048 it cut the screen of a warm mean-v2 call at 10^5
# per side from about 225 to 70-74 ms of each direction's wall time (its table in
# benchmarks/measured/profile-warm/README.md), with the same maps and bounds in all 64 units of
# benchmarks/measured/map-race/README.md.
_SCREEN_BATCH = 512


def _screen_steps(config: EstimatorConfig) -> int:
    """The screen's steps per map: one validation block, at least a third of the steps up to 100.

    Short budgets validate often (:func:`default_budget`'s 10 checks); the screen still trains each
    map as long as it did at the fixed budget's 100-step blocks, or a third of the budget if less.
    """
    return max(config.eval_every, min(100, config.steps // 3))


def _screen_batch(config: EstimatorConfig) -> int | None:
    """The screen's minibatch: the configured one, at most ``_SCREEN_BATCH`` (None: full batch)."""
    return None if config.batch_size is None else min(config.batch_size, _SCREEN_BATCH)


def _screen(map_keys, probs: list[_Problem]) -> tuple[int, list[float]] | None:
    """``(leader, values)``: every map trained for one validation block, from a key of its own.

    The block runs at a minibatch of at most ``_SCREEN_BATCH`` per side (:func:`_screen_batch`).

    The value of a map is its ensemble's best validation objective (training's own early-stopping
    value, the initial critic included), so the screen costs one block of training per map and no
    evaluation beyond it. Of equal values the first map (``'standard'``) leads. None where the
    budget has fewer than two blocks (the screen would cost as much as the training) or no map's
    value is finite (all diverged: the full selection restarts them).
    """
    config = probs[0].config
    if config.steps // config.eval_every < 2:
        return None
    values = []
    for k, prob in zip(map_keys, probs, strict=True):
        member_keys, k_train = _ensemble_keys(keys.fold_in(k, _SCREEN_STREAM), config.ensemble)
        _, out = _run_ensemble(
            member_keys, k_train, prob, config.learning_rate, steps=_screen_steps(config),
            batch_size=_screen_batch(config), progress=None, patience=None,
        )  # fmt: skip
        best = np.where(np.asarray(out.finite), np.asarray(out.best_value), -np.inf)
        values.append(float(np.max(best)))
    if not any(math.isfinite(v) for v in values):
        return None
    return int(np.argmax(values)), values


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


def _typed_critic(params, rest, scale, shift, bound=math.inf) -> Critic:
    """A :class:`Critic` whose numbers are scalars of the outputs' dtype (one program for all)."""
    dtype = np.asarray(jax.tree.leaves(params)[0]).dtype
    return Critic(params, rest, *(np.asarray(v, dtype) for v in (scale, shift, bound)))


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


def _known_infinite(pair, spec: AdversarySpec, div) -> str | None:
    """Why D^H is +inf for this pair and class, from the mechanism's law (never from samples)."""
    from cbdp_jax._src.mechanisms import NonPrivateRelease

    if not isinstance(pair.mechanism, NonPrivateRelease):
        return None
    if spec.bound is not None or div.conjugate_sup < math.inf:
        return None  # bounded critics, or f* with a bounded domain: a finite value
    key = jax.random.key(0)  # a point mass: the draw does not depend on the key
    a, b = pair.sample(key, 1)
    if np.array_equal(np.asarray(a), np.asarray(b)):
        return None  # the same point mass on both sides: P = Q
    return (
        "the mechanism is a NonPrivateRelease: its outputs on D and D' are two distinct point "
        "masses, so the divergence is +inf for any unbounded class that separates them (paper "
        "Lemma 2); this comes from the mechanism's law, not from samples"
    )


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


# From this many samples per side the two sides are shuffled in two threads (below it a thread costs
# more than the sort).
_SPLIT_THREADS = 50_000


def _split(name: str, arr: np.ndarray, key: jax.Array, config: EstimatorConfig):
    """``arr`` shuffled by ``key`` and cut into (train, validation, test) by ``config.split`` (host arrays)."""
    fracs = config.split
    need = math.ceil(2 / min(fracs))
    n = arr.shape[0]
    if n < need:
        raise InvalidParameterError(
            f"{name} has {n} samples: the split {fracs} needs at least {need} per side (two in each "
            "of train, validation and test)"
        )
    idx = keys.permutation(key, n)  # = jax.random.permutation(key, n), sorted on the host
    n_tr, n_va = int(fracs[0] * n), int(fracs[1] * n)
    x = arr[idx]
    return x[:n_tr], x[n_tr : n_tr + n_va], x[n_tr + n_va :]


def _fitted_maps(config: EstimatorConfig, train_p, train_q) -> tuple[list, str]:
    """The candidate maps of ``config.input_map``, fitted on the pooled training samples; and why.

    ``train_p`` and ``train_q`` are host arrays of the TRAINING samples only: the maps never see
    validation or test samples, so the bound evaluated through them stays valid.
    """
    names, why = input_maps.candidates(
        config.input_map, train_p, train_q, class_bound=config.guarantee == "class"
    )
    return [input_maps.fit(name, train_p, train_q) for name in names], why


def _mapped_candidates(config: EstimatorConfig, p_host: tuple, q_host: tuple) -> tuple[list, str]:
    """Per candidate input map, ``(map, mapped P parts, mapped Q parts)``; and why these maps.

    Each map is fitted on the pooled training parts only and applied to all three parts; the maps
    and sides are applied in threads (NumPy releases the GIL in the rank map's search), the same
    arrays as one after the other.
    """
    maps, why = _fitted_maps(config, p_host[0], q_host[0])
    jobs = [(m, parts, config) for m in maps for parts in (p_host, q_host)]
    # The identity alone (ordinary samples) is two array copies: no threads for them.
    mapping = any(m.kind != "standard" for m in maps)
    done = threads.map_concurrently(_mapped, jobs, concurrent=mapping)
    return [(m, done[2 * i], done[2 * i + 1]) for i, m in enumerate(maps)], why


def _mapped(imap: input_maps.InputMap, parts: tuple, config: EstimatorConfig) -> tuple:
    """Host parts through the fitted input map, as host arrays of the configured dtype.

    Cast on the host (an eager cast would compile a program per shape); the programs that use them
    take padded copies (training, validation) or fixed-size pieces (outputs, evaluation).
    """
    dtype = jnp.dtype(config.dtype)
    return tuple(np.asarray(imap(x), dtype) for x in parts)


def _mechanism_problem(
    pair, swap: bool, *, spec, div, config, train, val, k_test, test_samples: int,
    fresh_samples: bool, named_class: str, input_map: tuple = (input_maps.IDENTITY, "asked for"),
) -> _Problem:  # fmt: skip
    """One direction of a mechanism estimate: drawn training / validation samples, streamed tests."""
    mech, dtype = pair.mechanism, jnp.dtype(config.dtype)
    d_a, d_b = (pair.dataset, pair.neighbour) if not swap else (pair.neighbour, pair.dataset)
    tr = train if not swap else (train[1], train[0])
    va = val if not swap else (val[1], val[0])
    kp, kq = keys.split(keys.fold_in(k_test, int(swap)))
    chunk = config.eval_chunk
    imap, choice = input_map
    dim = va[0].shape[1]  # the mapped dimension (the rank map adds atom indicators)
    return _Problem(
        spec=spec,
        divergence=div,
        trainer=_trainer(spec, div, dim, config),
        config=config,
        dim=dim,
        train=None if fresh_samples else tr,
        val=va,
        test_chunks=lambda: (
            _mapped_chunks(imap, _sample_chunks(mech, d_a, kp, test_samples, chunk, dtype), dtype),
            _mapped_chunks(imap, _sample_chunks(mech, d_b, kq, test_samples, chunk, dtype), dtype),
        ),
        n_test=(test_samples, test_samples),
        sampler=None if not fresh_samples else _pair_sampler(pair, swap),
        stats_sample=tr,
        named_class=named_class,
        input_map=imap,
        map_choice=choice,
    )


def _mapped_chunks(imap: input_maps.InputMap, chunks: Iterator, dtype) -> Iterator:
    """Test chunks through the input map (on the host); the identity passes them through untouched."""
    if imap.kind == "standard":
        yield from chunks
        return
    for c in chunks:
        yield np.asarray(imap(np.asarray(c)), dtype)


def _mechanism_maps(config: EstimatorConfig, train, val, *, fresh_samples: bool) -> list:
    """``[(input map, why), (mapped train, mapped val)]`` per candidate map of a mechanism estimate.

    Maps are fitted on the drawn training samples; in fresh-sample mode the training minibatches are
    drawn inside the compiled loop, where no host map applies, so only the standard map is possible.
    """
    if fresh_samples:
        return [((input_maps.IDENTITY, "fresh samples: the standard map"), (train, val))]
    maps, why = _fitted_maps(config, *train)
    out = []
    for imap in maps:
        if imap.kind == "standard":
            out.append(((imap, why), (train, val)))
            continue
        out.append(((imap, why), tuple(_mapped(imap, part, config) for part in (train, val))))
    return out


def _counts(train: tuple, val: tuple, test: tuple) -> dict[str, int]:
    """The per-side sample counts of a result, from (P, Q) pairs."""
    return {
        f"{part}_{side}": int(n)
        for part, pair in (("train", train), ("val", val), ("test", test))
        for side, n in zip("pq", pair, strict=True)
    }


def _with_note(result: EstimateResult, note: str | None) -> EstimateResult:
    """The result with ``note`` as its first warning (the domain rule's), if there is one."""
    if note is None:
        return result
    return dataclasses.replace(result, warnings=(note, *result.warnings))


def _config_dict(config: EstimatorConfig, entry: str = "samples") -> dict[str, Any]:
    """The configuration settings that applied to an estimate.

    ``split`` applies only to :func:`estimate_from_samples` (``entry='samples'``): a mechanism estimate
    draws its train / validation / test samples separately and records their counts instead.
    """
    d = dataclasses.asdict(config)
    d.pop("progress")
    if not isinstance(config.optimizer, str):
        d["optimizer"] = f"custom {type(config.optimizer).__name__}"
    if entry == "samples":
        d["split"] = list(config.split)
    else:
        d.pop("split")
    return d


def _frozen(tree) -> tuple:
    """A hashable fingerprint of a dataset (a pytree of numbers or arrays): shapes, dtypes, bytes."""
    leaves, treedef = jax.tree.flatten(tree)
    return (
        str(treedef),
        tuple((np.shape(x), str(np.asarray(x).dtype), np.asarray(x).tobytes()) for x in leaves),
    )


_SAMPLERS: dict[tuple, Callable] = {}


def _pair_sampler(pair, swap: bool) -> Callable:
    """A stable ``(key, n) -> (p, q)`` for a pair.

    Equal pairs get the same function object, so the compiled training program (which takes it as a
    static argument) is reused, not retraced.
    """
    fingerprint = (pair.mechanism, _frozen(pair.dataset), _frozen(pair.neighbour), swap)
    if fingerprint not in _SAMPLERS:
        _SAMPLERS[fingerprint] = (pair.swapped() if swap else pair).sample
    return _SAMPLERS[fingerprint]


def _prefix_stable(mechanism) -> bool:
    """Whether the first n of N draws of ``mechanism`` under one key are its n draws under that key.

    True for the Laplace and Gaussian mechanisms under partitionable threefry (JAX's default): each
    output entry is a function of the key and its own counter, so a draw of N rows starts with the
    draw of n (``tests/test_estimator.py`` checks it). Their samples are then drawn for a bucket of
    rows and cut on the host: one compiled sampler serves every sample size.
    """
    from cbdp_jax._src.mechanisms import GaussianMechanism, LaplaceMechanism

    return type(mechanism) in (LaplaceMechanism, GaussianMechanism) and bool(
        jax.config.jax_threefry_partitionable
    )


# Prefix-stable mechanisms draw training and validation samples for a power-of-two bucket of rows
# from this many (the held-out chunks' default size: one sampler program for all of them).
_MIN_DRAW_ROWS = 1 << 16


def _draw_rows(
    mechanism, key: jax.Array, dataset, n: int, dtype, rows: int | None = None
) -> np.ndarray:
    """``np.asarray(mechanism.sample(key, dataset, n))``, drawn for ``rows`` rows where that is the same.

    ``rows`` defaults to the bucket of ``n`` (:data:`_MIN_DRAW_ROWS` at least) for a prefix-stable
    mechanism (:func:`_prefix_stable`), else ``n``.
    """
    if not _prefix_stable(mechanism):
        rows = n
    elif rows is None:
        rows = bucket_rows(n, _MIN_DRAW_ROWS)
    return np.asarray(mechanism.sample(key, dataset, max(rows, n), dtype=dtype))[:n]


def _draw_pair(pair, key: jax.Array, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``pair.sample(key, n)`` as host arrays (:func:`_draw_rows` of each side, its keys split alike)."""
    k_p, k_q = keys.split(key)
    mech = pair.mechanism
    return _draw_rows(mech, k_p, pair.dataset, n, dtype), _draw_rows(
        mech, k_q, pair.neighbour, n, dtype
    )


def _sample_chunks(mechanism, dataset, key: jax.Array, n: int, chunk: int, dtype) -> Iterator:
    """Streams ``n`` samples of M(dataset) in chunks (host arrays); chunk i uses ``fold_in(key, i)``.

    A prefix-stable mechanism draws every chunk at ``chunk`` rows (the last one cut): one compiled
    sampler serves every test size.
    """
    dtype = jnp.dtype(dtype)
    for i, start in enumerate(range(0, n, chunk)):
        m = min(chunk, n - start)
        yield _draw_rows(mechanism, keys.fold_in(key, i), dataset, m, dtype, rows=chunk)


def _as_pair(pair: Any):
    """A :class:`~cbdp_jax.mechanisms.NeighbouringPair` (a mechanism stands for its canonical pair)."""
    from cbdp_jax._src.mechanisms import Mechanism, NeighbouringPair, canonical_pair

    if isinstance(pair, Mechanism):
        pair = canonical_pair(pair)
    if not isinstance(pair, NeighbouringPair):
        raise InvalidParameterError(
            f"pair={pair!r} is invalid: must be a NeighbouringPair or a Mechanism"
        )
    return pair


def _sample_sizes(samples: Any, val_samples: Any, test_samples: Any) -> tuple[int, int, int]:
    """Training, validation and test samples per side, checked (defaults max(samples // 4, 1000), samples)."""
    samples = check_int_at_least("samples", samples, 2)
    val_samples = max(samples // 4, 1000) if val_samples is None else val_samples
    val_samples = check_int_at_least("val_samples", val_samples, 2)
    test_samples = samples if test_samples is None else test_samples
    test_samples = check_int_at_least("test_samples", test_samples, 2)
    return samples, val_samples, test_samples


def _resolved(
    config: EstimatorConfig, n_train: int, *, pair=None, val_samples: int = 0
) -> tuple[EstimatorConfig, dict[str, Any]]:
    """The configuration with its derived budget (:func:`resolve_budget`), and what was derived.

    With a mechanism's ``pair``, first checks that its training and validation draws fit in memory.
    """
    if pair is not None:
        sizes.check_memory_for_draws(pair, n_train, val_samples, config, jnp.dtype(config.dtype))
    derived = derived_fields(config)
    out = resolve_budget(config, n_train)
    return out, {"derived": derived, "n_train": int(n_train), "rule": "default_budget"}


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
