"""Lean Poisson batches: runs computed with fewer slots, the few that overflowed recomputed in full.

A Poisson batch over n examples at rate q holds Binomial(n, q) members, but the engine's batch has
a static shape, the sampler's capacity C = ceil(qn + 8 sd + 8) slots (sd = sqrt(qn(1 - q))), so
that no batch is ever cut in practice; every run computes the per-example gradients of all C slots.
For n = 1797 and q = 0.01 that is 60 slots for batches of 18 on average.

This module computes a block of B runs with c < C slots instead, and then recomputes at the full
capacity, with the same key, every run whose batch filled all c slots at some step. The sampler
draws a batch's members as the positions of i.i.d. geometric gaps whose uniform words for c slots
are the first c words drawn for C (:func:`~cbdp_jax._src.training_auditor.batch_sampling.geometric_gaps`),
so a run whose c-th slot stayed empty at every step had exactly the full capacity's batches: its
outputs are those of the full-capacity run (to the order of a sum over zero-padded slots). The
others are replaced by the full-capacity run's outputs. The law of the block's outputs is therefore
the full capacity's, and no batch loses a member the full capacity keeps.

The repair is on the host, between a block's return and its collection
(:func:`~cbdp_jax._src.infra.sharded_runs.sharded_runs`): the lean runs are vmapped over the block
in one program; the overflowing ones (few, often none) are recomputed by the full run's program at
8 runs per device, the program a CPU's first, probing block already compiled, so the lean engine
compiles no more programs than the full one (measured: a second program inside the block, a
``lax.while_loop`` over the repairs, cost more compilation than a 20,000-run audit saved). Run i
keeps key i, so checkpoints and the sharding over devices are unchanged.

c minimises the expected cost of a block of B runs in slots, B c + E[ceil(X / 8)] (8 + 8) C, with X
~ Binomial(B, p) the overflowing runs and p = 1 - (1 - P(Binomial(n, q) >= c))^T a run's chance to
fill its c slots at one of its T steps (exact binomial tails, ``scipy.stats.binom``; a repair call
costs about 8 runs more than its runs: dispatch and transfers). For n = 1797, q = 0.01, T = 20 and
B = 256, c = 33 (about qn + 3.6 sd), p = 0.017: 0.61 of the full capacity's expected slots.

It applies to the built-in Poisson sampler with the library's DP-SGD step (a step that exposes
``update.summed_form`` sums its slots, so the padded length does not enter it); other samplers and
one's own steps (which may use the padded length) keep the full capacity. ``CBDP_JAX_LEAN_BATCHES=0``
turns it off (the full capacity everywhere), for same-numbers checks.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from scipy import stats

ENV = "CBDP_JAX_LEAN_BATCHES"
REPAIR = 8  # runs per device recomputed per call: the CPU's probing block (its program exists)
CALL_RUNS = 8  # a repair call's fixed cost, in full-capacity runs (dispatch, transfers)


class LeanPlan(NamedTuple):
    """The lean capacity of a block and its repair.

    Attributes:
      slots: c, the batch slots of the lean runs.
      repair: K, the runs recomputed at the full capacity per repair call, per device.
      overflow: p, a run's probability to fill its c slots at some step.
      saving: The expected cost of the block over its cost at the full capacity (slots).

    """

    slots: int
    repair: int
    overflow: float
    saving: float


def enabled() -> bool:
    """Whether lean batches are on (``CBDP_JAX_LEAN_BATCHES`` unset, or anything but ``0``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def eligible(sampler: Any, steps: Any) -> bool:
    """Whether a problem's runs may be lean: the built-in Poisson sampler, summed-form steps only."""
    if getattr(sampler, "kind", None) != "poisson" or sampler.function is not None:
        return False
    return all(getattr(tx.update, "summed_form", None) is not None for tx in steps)


def run_overflow(n: int, q: float, steps: int, slots: int) -> float:
    """p: the probability that a run's Poisson batch fills ``slots`` slots at one of ``steps`` steps.

    Exact: one minus the probability that Binomial(n, q) < slots at every step.
    """
    per_step = float(stats.binom.sf(slots - 1, n, q))
    return -math.expm1(steps * math.log1p(-per_step)) if per_step < 1.0 else 1.0


@functools.lru_cache(maxsize=64)
def plan(n: int, q: float, steps: int, full: int, block: int) -> LeanPlan | None:
    """The c of the least expected cost for a block of ``block`` runs (None: full is best).

    Args:
      n: The sampler's examples (slots it draws over).
      q: The Poisson rate.
      steps: T.
      full: C, the sampler's capacity.
      block: B, the runs of one block (per device).

    Returns:
      The :class:`LeanPlan`, or None when no c < C is expected to cost less than C.

    """
    best, x = None, np.arange(block + 1)
    for c in range(max(1, math.floor(q * n)), full):
        p = run_overflow(n, q, steps, c)
        calls = float(np.sum(stats.binom.pmf(x, block, p) * np.ceil(x / REPAIR)))
        cost = block * c + calls * (REPAIR + CALL_RUNS) * full
        if best is None or cost < best[0]:
            best = (cost, c, p)
    if best is None or best[0] >= block * full:
        return None
    cost, c, p = best
    return LeanPlan(c, REPAIR, p, cost / (block * full))


class LeanRun:
    """A run function with a lean form for blocks of runs (``lean``), the full run when called.

    :func:`~cbdp_jax._src.infra.sharded_runs.sharded_runs` evaluates a block of ``per`` runs by
    ``lean(per)`` where it returns a function, and recomputes by the call itself (the full
    capacity, the same keys) the runs ``overflowed`` flags, ``repair`` runs per device at a time.
    """

    def __init__(self, full: Callable, lean_for: Callable[[int], Callable], plan_for: Callable):
        self.full, self._lean_for, self._plan_for, self._leans = full, lean_for, plan_for, {}
        self.repair = REPAIR

    def __call__(self, key: jax.Array, *args: Any) -> Any:
        return self.full(key, *args)

    def plan(self, block: int) -> LeanPlan | None:
        """The lean plan of a block of ``block`` runs (None: the full capacity)."""
        return self._plan_for(block) if block > self.repair else None

    def lean(self, block: int) -> Callable | None:
        """The lean run of a block of ``block`` runs, or None (the full run is cheaper there)."""
        lean = self.plan(block)
        if lean is None:
            return None
        if lean.slots not in self._leans:
            self._leans[lean.slots] = self._lean_for(lean.slots)
        return self._leans[lean.slots]

    @staticmethod
    def overflowed(out: Any) -> np.ndarray:
        """Which runs of a lean block filled their slots at some step ``[B]`` bool."""
        return np.asarray(out.overflow) > 0
