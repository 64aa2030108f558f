"""The budgets and levels of an audit (:class:`AuditConfig`)."""

from __future__ import annotations

import dataclasses

from cbdp_jax._src.infra.validation import check_in_range, check_int_at_least


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Budgets and levels of an audit.

    Attributes:
      samples: Certification samples per side per certified pair (fresh; never used in screening).
      train_fraction: Share of them that fits the critics; the rest is held out for the bound.
      screen_samples: Samples per side for each screened candidate pair.
      random_pairs: Random candidates drawn from the dataset space.
      local_steps: Local-search moves from the best candidate.
      classes: Critic classes certified (hockey-stick: linear, poly, mlp, histogram; Renyi and capacity
        claims: linear, poly, mlp, bounded-mlp).
      eps_grid: Multiples of the claimed eps at which a pure / approximate claim is checked.
      confidence: Family-wise level of the certified bounds.
      violation_size: The size of violation for which "samples needed" is reported.
      estimator_steps: Training steps of the estimator for Renyi and capacity claims.
      gradient_steps: Gradient-ascent steps on the datasets after the local search, for mechanisms
        that trace under jit and are differentiable in the dataset (0: off).
      tail_bounds: Hockey-stick audits only. Indicator critics (half-spaces, histograms) also get
        exact binomial bounds on their set's two probabilities (the better of those and the betting
        bound, the level split between them in advance), and each direction gets one more critic,
        the half-space chosen on training samples to refute the largest eps at the claim's delta
        (:func:`~cbdp_jax._src.mechanism_auditor.hockey_stick.fit_tail`; two more members of the family). This is
        what makes eps at a small delta certifiable (docs/theory/training_audit.md, section 8).
      feature_groups: Hockey-stick audits of a mechanism whose samples name feature groups
        (:class:`~cbdp_jax._src.mechanism_auditor.hockey_stick.FeatureGroup`, e.g. a training run's score and
        statistics of its release): the names of the groups certified, in one family (None: all
        the mechanism names). A mechanism without groups certifies its whole output.

    """

    samples: int = 1_000_000
    train_fraction: float = 0.3
    screen_samples: int = 20_000
    random_pairs: int = 12
    local_steps: int = 12
    classes: tuple[str, ...] = ("linear", "poly", "mlp", "histogram")
    eps_grid: tuple[float, ...] = (0.5, 1.0, 1.5)
    confidence: float = 0.95
    violation_size: float = 0.01
    estimator_steps: int = 600
    gradient_steps: int = 0
    tail_bounds: bool = False
    feature_groups: tuple[str, ...] | None = None

    def __post_init__(self):
        check_int_at_least("samples", self.samples, 100)
        check_int_at_least("screen_samples", self.screen_samples, 100)
        check_in_range(
            "train_fraction", self.train_fraction, 0.0, 1.0, low_open=True, high_open=True
        )
        check_in_range("confidence", self.confidence, 0.0, 1.0, low_open=True, high_open=True)
        check_int_at_least("gradient_steps", self.gradient_steps, 0)
        if self.feature_groups is not None:
            object.__setattr__(self, "feature_groups", tuple(self.feature_groups))
