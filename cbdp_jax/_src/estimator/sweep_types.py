"""The sweep's types: its configuration, its members and what training a sweep leaves for evaluation.

:class:`SweepConfig` (frozen, checked), :class:`Member` (one point of the grid), the traced per-member
inputs and training settings the compiled programs take, and :class:`SweepTraining` (the trained
batches, evaluated by :func:`~cbdp_jax._src.estimator.sweep.evaluate_sweep`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator.adversaries import AdversarySpec
from cbdp_jax._src.estimator.adversary_fitting_ensemble import apply_fn
from cbdp_jax._src.estimator.certification import GUARANTEE_CHOICES
from cbdp_jax._src.estimator.core import Trainer
from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
    check_positive,
)
from cbdp_jax._src.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
)
from cbdp_jax._src.privacy.divergences import Divergence
from cbdp_jax._src.statistics.held_out import TAIL_MARGIN

SWEEP_DIVERGENCES = ("kl", "renyi", "alpha")


MEMBER_AXIS = "members"


# The training-stream index of the draw the closed-form fit uses: no optimiser step reaches it.
FIT_INDEX = 2**32 - 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """How every member of a sweep is trained and evaluated. Frozen and hashable.

    Attributes:
      steps: Optimiser steps per member (rounded down to a multiple of ``eval_every``).
      eval_every: Steps between validation checks (early stopping granularity).
      batch_size: Fresh minibatch size per side per step.
      learning_rate: Adam's step size when the sweep gives no ``learning_rates`` grid.
      val_samples: Validation samples per side per member (early stopping and the closed-form fit).
      test_samples: Held-out samples per side per member.
      eval_chunk: Held-out rows per side per member in one compiled evaluation call (the last chunk
        is masked, so every sample size shares one compilation). Memory of a call grows like
        ``max_batch * eval_chunk * (d + hidden width)``; it also fixes which samples chunk i draws,
        so results depend on it (not on ``max_batch``).
      confidence: Level 1 - delta of the one-sided lower confidence bound.
      family_size: Each member's bound is one of ``family_size`` simultaneous bounds, taken at level
        1 - delta / family_size (Bonferroni).
      tight: Train with the tight forms of docs/theory/objectives.md where the class allows it.
      dtype: ``'float32'`` or ``'float64'`` (needs ``jax_enable_x64``).
      guarantee: ``'asymptotic'`` (the CLT bound, refused when the held-out tails look infinite),
        ``'finite-sample'`` (bounded classes only: ``bound=B``; no assumption), or ``'auto'`` /
        ``'class'`` (finite-sample for bounded classes, asymptotic otherwise: every member's bound
        is on its own class; unlike the estimator's ``'auto'``, the sweep never falls back to the
        bounded version of an unbounded class). See docs/theory/bounds.md.
      finite_sample_method: ``'berry-esseen'`` (streams: moments only), ``'betting'`` (keeps a
        batch's paired differences on the host: ``max_batch x test_samples`` floats), or ``'auto'``
        (per member, the one predicted tighter from its validation differences).
      tail_margin: The asymptotic bound's tail check needs index >= 2 + tail_margin. For a cone, each
        member's critic is first shrunk on validation data (t * h, as in the estimator) until it
        clears the check; rows report ``tail_shrink``.
      shared_noise: All members draw the same standard noise at a given training step, each scaling
        it by its own noise scale and shifting it to its own centre -- as the estimator's ensemble
        shares its minibatches. vmap then computes the draw once per step for the whole batch (the
        random numbers dominate the cost of small adversaries). False: every member draws its own
        (seeds are then independent replicates of the training data too, at one draw per member).
        Validation and test samples are always the member's own.

    """

    steps: int = 2000
    eval_every: int = 100
    batch_size: int = 4096
    learning_rate: float = 1e-2
    val_samples: int = 8192
    test_samples: int = 100_000
    eval_chunk: int = 16384
    confidence: float = 0.95
    family_size: int = 1
    tight: bool = True
    dtype: str = "float32"
    shared_noise: bool = True
    guarantee: str = "auto"
    finite_sample_method: str = "auto"
    tail_margin: float = TAIL_MARGIN

    def __post_init__(self):
        check_int_at_least("steps", self.steps, 1)
        check_int_at_least("eval_every", self.eval_every, 1)
        check_int_at_least("batch_size", self.batch_size, 2)
        check_positive("learning_rate", self.learning_rate)
        check_int_at_least("val_samples", self.val_samples, 2)
        check_int_at_least("test_samples", self.test_samples, 2)
        check_int_at_least("eval_chunk", self.eval_chunk, 1)
        check_in_range("confidence", self.confidence, 0.5, 1.0, high_open=True)
        check_int_at_least("family_size", self.family_size, 1)
        check_choice("dtype", self.dtype, ("float32", "float64"))
        check_choice("guarantee", self.guarantee, GUARANTEE_CHOICES)
        check_choice(
            "finite_sample_method", self.finite_sample_method, ("auto", "berry-esseen", "betting")
        )
        check_in_range("tail_margin", self.tail_margin, 0.0, 10.0)
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise InvalidParameterError(
                "dtype='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) first"
            )

    @property
    def blocks(self) -> int:
        """The number of evaluation blocks."""
        return max(self.steps // self.eval_every, 1)

    @property
    def block_steps(self) -> int:
        """Optimiser steps per block."""
        return min(self.eval_every, self.steps)


class Member(NamedTuple):
    """One point of the sweep grid.

    Attributes:
      index: Position in the sweep (the row order of the result table).
      mechanism: A Laplace or Gaussian mechanism; P = M(0), Q = M(v) with v its sensitivity.
      adversary: The adversary class.
      adversary_index: Its position in the sweep's ``adversaries`` (labels need not be unique, e.g.
        random features of two bandwidths).
      alpha: The order (None for KL).
      learning_rate: Adam's step size.
      seed: The seed; the member's keys derive from ``fold_in(k_members, seed)`` (module docstring).
      note: Why the class is trained reduced (``objectives.kl_domain_reduction``), else None; the
        member's row starts its warnings with it.

    """

    index: int
    mechanism: LaplaceMechanism | GaussianMechanism
    adversary: AdversarySpec
    adversary_index: int
    alpha: float | None
    learning_rate: float
    seed: int
    note: str | None = None


class _Static(NamedTuple):
    """Everything static about a group's compiled programs (hashable; no values that vary per member)."""

    trainer: Trainer
    graphdef: Any
    family: str
    divergence: str
    convention: str
    objective: str
    dim: int
    dtype: str
    key_impl: str
    blocks: int
    block_steps: int
    batch_size: int
    val_samples: int
    shared_noise: bool
    tail_need: float = 0.0


# --------------------------------------------------------------------------------------------------
# The divergence of a group (each member's order is traced)
# --------------------------------------------------------------------------------------------------


def _divergence(static: _Static) -> Divergence:
    """The group's divergence; its order is a placeholder (each member passes its own, traced)."""
    return Divergence(
        static.divergence, 2.0 if static.divergence != "kl" else None, static.convention
    )


class MemberInputs(NamedTuple):
    """Per-member arrays of a batch (leading axis = members).

    Attributes:
      key_data: Raw key data of ``fold_in(key, seed)``, ``[M, k]`` uint32.
      alpha: The order, ``[M]`` (NaN for KL, unused).
      noise_scale: Laplace scale 1/epsilon or Gaussian sigma, ``[M]``.
      sensitivity: The centre v of Q, ``[M, d]``.
      learning_rate: Adam's step size, ``[M]``.
      gaussian: Whether the member's noise is Gaussian (else Laplace), ``[M]`` bool.

    """

    key_data: Any
    alpha: Any
    noise_scale: Any
    sensitivity: Any
    learning_rate: Any
    gaussian: Any


class MemberTraining(NamedTuple):
    """Output of the training program (leading axis = members).

    Attributes:
      params: Trainable parameters at the best validation value.
      rest: Non-trainable state (input standardisation, fixed random features).
      scale: Fitted scale of the evaluated function ``scale * h + shift``, ``[M]``.
      shift: Fitted shift, ``[M]``.
      best_value: Best validation value of the training objective, ``[M]``.
      finite: Whether training stayed finite, ``[M]``.
      train_curve: Training objective at the end of each block, ``[M, blocks]``.
      val_curve: Validation objective after each block, ``[M, blocks]``.
      centres: Validation medians of the two f-form terms of the fitted function (the centres of the
        held-out tail sketches), ``[M, 2]``.
      val_z: Moments and pair moments of the fitted function's paired validation differences (to
        choose each member's finite-sample method before the test samples are drawn).
      tail_shrink: The factor t applied to the fitted critic on validation data so that its tails
        clear the asymptotic bound's check (``scale`` and ``shift`` are after it), ``[M]``; 1: none.
      plain: The closed-form ``(scale, shift)`` of each member, ``([M], [M])``: the critic the
        row's estimate is reported for (``scale`` / ``shift`` are the certified critic's).

    """

    params: Any
    rest: Any
    scale: Any
    shift: Any
    best_value: Any
    finite: Any
    train_curve: Any
    val_curve: Any
    centres: Any
    val_z: Any
    tail_shrink: Any
    plain: Any


class TrainedBatch(NamedTuple):
    """One trained batch: its members (padding included) and device-resident, sharded results."""

    static: _Static
    members: tuple[int, ...]
    n_real: int
    inputs: MemberInputs
    output: MemberTraining


@dataclasses.dataclass(frozen=True)
class SweepTraining:
    """Result of :func:`train_sweep`: trained members, still on their devices.

    Attributes:
      members: The grid points, in sweep order.
      batches: The trained batches (each sharded over ``devices`` along the member axis).
      divergence: The divergence name.
      convention: The alpha family's conjugate convention.
      config: The configuration used.
      devices: The devices of the mesh.
      seconds: Wall time of the training, compilation included.

    """

    members: tuple[Member, ...]
    batches: tuple[TrainedBatch, ...]
    divergence: str
    convention: str
    config: SweepConfig
    devices: tuple[Any, ...]
    seconds: float

    def _locate(self, index: int) -> tuple[TrainedBatch, int]:
        for batch in self.batches:
            if index in batch.members[: batch.n_real]:
                return batch, batch.members.index(index)
        raise IndexError(f"member {index} is not in this sweep")

    def function(self, index: int) -> Callable[[jax.Array], jax.Array]:
        """The fixed evaluated function ``x [n, d] -> scale * h(x) + shift [n]`` of member ``index``."""
        batch, pos = self._locate(index)
        take = lambda tree: jax.tree.map(lambda x: jnp.asarray(_to_host(x)[pos]), tree)  # noqa: E731
        out = batch.output
        params, rest = take(out.params), take(out.rest)
        scale, shift = take(out.scale), take(out.shift)
        graphdef = batch.static.graphdef
        return lambda x: scale * apply_fn(graphdef, params, rest, jnp.asarray(x)) + shift

    def best_values(self) -> np.ndarray:
        """The best validation objective of every member, ``[members]`` (host array)."""
        out = np.empty(len(self.members))
        for batch in self.batches:
            vals = _to_host(batch.output.best_value)
            out[list(batch.members[: batch.n_real])] = vals[: batch.n_real]
        return out


# --------------------------------------------------------------------------------------------------
# Host side: the grid, groups, batches, sharding
# --------------------------------------------------------------------------------------------------


def _to_host(x: jax.Array) -> np.ndarray:
    """A global array on this host (gathered across processes when it spans several hosts)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
