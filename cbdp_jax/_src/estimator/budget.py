"""The default training budget: how much an estimate trains, derived from the number of samples.

``EstimatorConfig``'s training settings (steps, adversaries, minibatch, validation interval, patience)
default to ``'auto'``: :func:`default_budget` derives them from the number of training samples per
side, and :func:`resolve_budget` fills in whichever the user left at ``'auto'``. The library and the
command line both call them, and an estimate records what they gave. The rule and its measurements:
docs/guide/scaling.md, benchmarks/README.md "The default budget".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least

# A training setting derived from the number of training samples (:func:`default_budget`).
AUTO = "auto"
BUDGET_FIELDS = ("steps", "ensemble", "batch_size", "eval_every", "patience")


class Budget(NamedTuple):
    """The training work of one adversary ensemble (what :func:`default_budget` derives).

    Attributes:
      steps: Optimiser steps.
      ensemble: Adversaries trained at once.
      batch_size: Minibatch size per side.
      eval_every: Steps between validation checks.
      patience: Validation checks without a new best after which training stops.

    """

    steps: int
    ensemble: int
    batch_size: int
    eval_every: int
    patience: int


# The default budget's constants (benchmarks/budget_rule.py measured the rule against the fixed
# budget it replaced: benchmarks/README.md "The default budget").
BUDGET_PASSES = 4  # passes over the training samples per side, within the bounds on steps below
BUDGET_MIN_STEPS = 400
BUDGET_MAX_STEPS = 2000
BUDGET_BATCH_SHARE = 64  # the minibatch is about this fraction of the training samples ...
BUDGET_MIN_BATCH = 512  # ... a power of two within these bounds
BUDGET_MAX_BATCH = 4096
BUDGET_CHECKS = 10  # validation checks in a full run
BUDGET_PATIENCE = 5  # checks without a new best after which training stops


def default_budget(n_train: int) -> Budget:
    """The default training budget for ``n_train`` training samples per side.

    The minibatch is about 1/64 of the training samples (a power of two in [512, 4096]); the steps
    make ``BUDGET_PASSES`` passes over them, at least ``BUDGET_MIN_STEPS`` and at most
    ``BUDGET_MAX_STEPS``; one adversary; ``BUDGET_CHECKS`` validation checks, and training stops
    after ``BUDGET_PATIENCE`` checks without a new best. Up to about 10^5 samples per side that is
    400 steps of 512 (the validation objective peaks within a few hundred steps there); at 10^6, 489
    steps of 4096; from about 4 million per side, 2000 steps of 4096. A pure function of ``n_train``: the library and the command line both use it, and
    a result records what it gave (``config``).

    Args:
      n_train: Training samples per side (the smaller side's count).

    Returns:
      A :class:`Budget`.

    Examples:
      >>> default_budget(5_000)
      Budget(steps=400, ensemble=1, batch_size=512, eval_every=40, patience=5)
      >>> default_budget(500_000)
      Budget(steps=489, ensemble=1, batch_size=4096, eval_every=48, patience=5)

    """
    n = max(int(n_train), 1)
    batch = 1 << max(n // BUDGET_BATCH_SHARE, 1).bit_length() - 1
    batch = min(max(batch, BUDGET_MIN_BATCH), BUDGET_MAX_BATCH)
    steps = math.ceil(BUDGET_PASSES * n / batch)
    steps = min(max(steps, BUDGET_MIN_STEPS), BUDGET_MAX_STEPS)
    every = max(steps // BUDGET_CHECKS, 1)
    return Budget(steps, 1, batch, every, BUDGET_PATIENCE)


def check_auto_int(name: str, value: Any, low: int) -> None:
    """``value`` is ``'auto'`` or an integer >= ``low`` (else :class:`InvalidParameterError`)."""
    if isinstance(value, str):
        if value != AUTO:
            raise InvalidParameterError(
                f"{name}={value!r} is invalid: must be 'auto' or an integer >= {low}"
            )
        return
    check_int_at_least(name, value, low)


def resolve_budget(config: Any, n_train: int) -> Any:
    """``config`` with every ``'auto'`` training setting replaced by :func:`default_budget`'s.

    A setting the user gave is kept. With ``steps`` given, the steps are what the user asked for:
    ``patience`` left at ``'auto'`` then trains them all (None: no early stop, as before the rule),
    and a derived ``eval_every`` is a tenth of them, at most 100 (what ``cbdp estimate`` always used,
    and the fixed default of 100 from 1000 steps up).
    """
    auto = [f for f in BUDGET_FIELDS if getattr(config, f) == AUTO]
    if not auto:
        return config
    rule = default_budget(n_train)._asdict()
    if config.steps != AUTO:
        rule["eval_every"] = max(1, min(100, int(config.steps) // BUDGET_CHECKS))
        rule["patience"] = None
    return dataclasses.replace(config, **{f: rule[f] for f in auto})


def derived_fields(config: Any) -> list[str]:
    """The training settings of ``config`` left at ``'auto'``."""
    return [f for f in BUDGET_FIELDS if getattr(config, f) == AUTO]


__all__ = [
    "AUTO",
    "BUDGET_FIELDS",
    "Budget",
    "check_auto_int",
    "default_budget",
    "derived_fields",
    "resolve_budget",
]
