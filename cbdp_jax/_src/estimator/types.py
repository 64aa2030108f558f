"""The estimator's configuration and result types: :class:`EstimatorConfig` and :class:`EstimateResult`.

The configuration checks its own fields (names, ranges, the budget's ``'auto'`` settings); the result
holds the values, bounds, diagnostics and curves of one estimate (both directions with
``both_directions``), and writes itself as a dict or strict JSON.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import optax

from cbdp_jax._src.estimator import certification, input_maps
from cbdp_jax._src.estimator.budget import (
    AUTO,
    check_auto_int,
)
from cbdp_jax._src.infra.io import to_json
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_finite_scalar,
    check_in_range,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.statistics.held_out import TAIL_MARGIN

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
