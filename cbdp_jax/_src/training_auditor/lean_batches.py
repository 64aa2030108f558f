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

The repair is inside the compiled block program: the lean runs are vmapped over the block; then a
``lax.while_loop`` (zero trips when no run overflowed) recomputes the first K overflowing runs at
the full capacity, vmapped over K static slots, scatters them back, and repeats until none is left.
Run i keeps key i, so checkpoints and the sharding over devices are unchanged.

c and K minimise the expected cost of a block in slots, B c + E[ceil(X / K)] (K + 4) C with X ~
Binomial(B, p) the overflowing runs and p = 1 - (1 - P(Binomial(n, q) >= c))^T a run's chance to
fill its c slots at one of its T steps (exact binomial tails, ``scipy.stats.binom``; a trip of the
repair loop costs about 4 runs more than its K runs: a small vmap's fixed overheads). Typically c is
about qn + 3.5 sd: for n = 1797, q = 0.01, T = 20 and B = 256, c = 33 and K = 6.

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
import jax.numpy as jnp
import numpy as np
from scipy import stats

ENV = "CBDP_JAX_LEAN_BATCHES"
TRIP_RUNS = 4  # a repair trip's fixed cost, in full-capacity runs (a small vmap's overheads)


class LeanPlan(NamedTuple):
    """The lean capacity of a block and its repair.

    Attributes:
      slots: c, the batch slots of the lean runs.
      repair: K, the runs recomputed at the full capacity per trip of the repair loop.
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
    """The c and K of the least expected cost for a block of ``block`` runs (None: full is best).

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
        if p >= 0.5:
            continue
        pmf = stats.binom.pmf(x, block, p)
        for k in sorted({*range(1, min(block, 64) + 1), *(2**i for i in range(7, 13))}):
            if k > block:
                break
            trips = float(np.sum(pmf * np.ceil(x / k)))
            cost = block * c + trips * (k + TRIP_RUNS) * full
            if best is None or cost < best[0]:
                best = (cost, c, k, p)
    if best is None or best[0] >= block * full:
        return None
    cost, c, k, p = best
    return LeanPlan(c, k, p, cost / (block * full))


def repaired(lean: Callable, full: Callable, keys: jax.Array, args: tuple, repair: int) -> Any:
    """The block's outputs: ``lean`` vmapped over ``keys``, its overflowing runs redone by ``full``.

    ``lean`` and ``full`` are ``run(key, *args)`` returning a pytree whose ``overflow`` field is
    positive where the lean run filled its slots; ``repair`` runs are recomputed per loop trip.
    """
    b = keys.shape[0]
    k = min(repair, b)
    out = jax.vmap(lambda key: lean(key, *args))(keys)

    def trip(state):
        out, bad = state
        where = jnp.nonzero(bad, size=k, fill_value=b)[0]  # the first k overflowing runs
        redo = jax.vmap(lambda key: full(key, *args))(keys[jnp.minimum(where, b - 1)])
        out = jax.tree.map(lambda a, r: a.at[where].set(r, mode="drop"), out, redo)
        return out, bad.at[where].set(False, mode="drop")

    out, _ = jax.lax.while_loop(lambda s: jnp.any(s[1]), trip, (out, out.overflow > 0))
    return out


class LeanRun:
    """A run function with a lean block evaluation (``chunked``) beside the one-run call.

    Calling it is the full-capacity run. :mod:`~cbdp_jax._src.infra.sharded_runs` evaluates a block
    of keys by ``chunked(keys, *args)`` instead of vmapping the call: the same outputs, cheaper.
    """

    def __init__(self, full: Callable, lean_for: Callable[[int], Callable], plan_for: Callable):
        self.full, self._lean_for, self._plan_for, self._leans = full, lean_for, plan_for, {}

    def __call__(self, key: jax.Array, *args: Any) -> Any:
        return self.full(key, *args)

    def plan(self, block: int) -> LeanPlan | None:
        """The lean plan of a block of ``block`` runs (None: the full capacity)."""
        return self._plan_for(block)

    def chunked(self, keys: jax.Array, *args: Any) -> Any:
        """The outputs of the runs of ``keys`` ``[B]``, stacked (those of the full-capacity runs)."""
        lean = self.plan(keys.shape[0])
        if lean is None:
            return jax.vmap(lambda key: self.full(key, *args))(keys)
        if lean.slots not in self._leans:  # built while tracing a block: its constants eagerly
            with jax.ensure_compile_time_eval():
                self._leans[lean.slots] = self._lean_for(lean.slots)
        return repaired(self._leans[lean.slots], self.full, keys, args, lean.repair)
