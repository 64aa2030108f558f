"""Batch samplers of DP training: Poisson, shuffled epochs and fixed-size batches, as fixed-shape masks.

A sampler is a frozen value object. ``plan(key, n, steps)`` is what a run draws once from its typed key
(the key itself, or the shuffled epochs' permutations), and ``batch(plan, t, n)`` is a pure function
of it and the step t that returns the step's batch as ``capacity`` indices into the n examples and a
validity mask, so a training loop under ``jit`` / ``vmap`` / ``lax.scan`` has static shapes whatever
the batch size. ``masks(key, n, steps)`` gives the same batches as ``[steps, n]`` inclusion masks.

The n slots may hold fewer examples: ``size`` (a traced integer is fine) says that only slots
``0 .. size - 1`` hold one, and the batches are those the sampler draws from those ``size`` examples
alone (the add/remove neighbour of a data set, whose last slot is absent, runs in the same program
as the data set itself). Each sampler's law on ``size`` examples is exactly its law on a data set of
that size: Poisson draws over the n slots and drops the absent ones (independent inclusions);
``'fixed'`` takes the b largest uniforms among the present slots; ``'shuffle'`` orders the present
slots by a uniform permutation and cuts ``size // b`` batches an epoch from it.

* ``'poisson'``: each example is in each batch independently with probability ``rate`` (what the
  DP-SGD accountant assumes), drawn as the positions of i.i.d. Geometric(q) gaps (capacity 32-bit
  words per step, half as many Threefry blocks, not n Bernoullis; a gap's tail is cut at
  probability 2^-33). The
  capacity is ``min(n, ceil(qn + 8 sqrt(qn(1-q)) + 8))``; a batch larger than that (probability
  below 1e-12 for qn >= 1) is truncated, and a full last slot is counted in ``overflow``. ``slots``
  draws fewer: the first members of the same batch (the gaps' words are a prefix of the full
  capacity's), exact where the last of them stays empty
  (:mod:`~cbdp_jax._src.training_auditor.lean_batches`).
* ``'shuffle'``: a fresh permutation of the n examples at each epoch, cut into consecutive batches of
  ``batch_size`` (the last ``n mod batch_size`` examples of each epoch's permutation are dropped, as
  with ``drop_remainder``). Each example is in exactly one batch of every epoch when batch_size | n.
* ``'fixed'``: each step a uniform subset of exactly ``batch_size`` examples, independently (the
  ``batch_size`` largest of n uniforms).
* ``'custom'``: the user's own ``function(key, step, n)`` (:mod:`~cbdp_jax._src.training_auditor.user_sampler`): the
  batch of a data pipeline the library never sees, audited like a step (accounted as Poisson at
  ``rate``, default ``batch_size / n``).

References:
  Abadi et al. 2016, "Deep learning with differential privacy" (Poisson sampling, the moments
  accountant); Chua et al. 2024, "How private are DP-SGD implementations?" (shuffling accounted as
  Poisson); jax_privacy's ``batch_selection`` (the same three strategies, read for semantics).

"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.infra.validation import (
    InvalidParameterError,
    check_choice,
    check_in_range,
    check_int_at_least,
)
from cbdp_jax._src.training_auditor import normal_draws, user_sampler

SAMPLERS = ("poisson", "shuffle", "fixed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSampler:
    """How each step's batch is drawn.

    Attributes:
      kind: ``'poisson'``, ``'shuffle'`` or ``'fixed'``.
      rate: The Poisson inclusion probability q in (0, 1] (``'poisson'`` only).
      batch_size: The batch size b >= 1 (``'shuffle'`` and ``'fixed'``; ``'custom'``: the most
        examples a step's mask may hold, when ``function`` returns a mask).
      function: ``'custom'`` only: the user's sampler ``function(key, step, n)`` returning step's
        batch as indices ``[b]`` (entries outside [0, n) are empty slots) or a mask ``[n]`` bool,
        traceable by JAX (:mod:`~cbdp_jax._src.training_auditor.user_sampler`). ``rate`` is then the q it is
        accounted at (default ``batch_size / n``).

    Examples:
      >>> import jax
      >>> s = BatchSampler(kind="fixed", batch_size=3)
      >>> s.masks(jax.random.key(0), 10, 4).sum(axis=1).tolist()
      [3, 3, 3, 3]

    """

    kind: str
    rate: float | None = None
    batch_size: int | None = None
    function: Any = None

    def __post_init__(self):
        if self.kind == "custom" or self.function is not None:
            return user_sampler.check(self)
        check_choice("sampler", self.kind, SAMPLERS)
        if self.kind == "poisson":
            if self.rate is None:
                raise InvalidParameterError("rate=None is invalid: a Poisson sampler needs a rate")
            check_in_range("rate", self.rate, 0.0, 1.0, low_open=True)
        else:
            if self.batch_size is None:
                raise InvalidParameterError(
                    f"batch_size=None is invalid: a {self.kind} sampler needs a batch size >= 1"
                )
            check_int_at_least("batch_size", self.batch_size, 1)

    def check_size(self, n: int, *, what: str = "the examples, canary included") -> None:
        """Raises unless the sampler can draw batches from ``n`` examples (``what`` names them)."""
        if self.kind == "custom":
            return user_sampler.check_size(self, n, what)
        if n < 1 or (self.kind != "poisson" and self.batch_size > n):
            raise InvalidParameterError(
                f"batch_size={self.batch_size!r} is invalid: must be in [1, {n}] ({what})"
                if n >= 1
                else f"examples={n} is invalid: a data set needs at least 1 example ({what})"
            )

    @property
    def accounted_as(self) -> str:
        """The sampling a claim names: the kind, or ``'poisson'`` for a user's sampler (its q)."""
        return "poisson" if self.kind == "custom" else self.kind

    def sampling_rate(self, n: int) -> float:
        """q: the rate, or b / n for the fixed-size samplers (what implementations account)."""
        if self.kind == "custom":
            return user_sampler.rate(self, n)
        return float(self.rate) if self.kind == "poisson" else self.batch_size / n

    def expected_batch(self, n: int) -> float:
        """The expected batch size: qn, or b."""
        if self.kind == "custom":
            return user_sampler.rate(self, n) * n
        return float(self.rate) * n if self.kind == "poisson" else float(self.batch_size)

    def capacity(self, n: int) -> int:
        """The physical batch: the static number of slots ``indices`` returns."""
        if self.kind == "custom":
            return user_sampler.capacity(self, n)
        if self.kind != "poisson":
            return int(self.batch_size)
        qn = float(self.rate) * n
        return min(n, math.ceil(qn + 8.0 * math.sqrt(qn * (1.0 - float(self.rate))) + 8.0))

    def steps_per_epoch(self, n: int) -> int:
        """Steps of one pass over the data: floor(n / b) for shuffle, else ceil(1 / q)."""
        if self.kind == "shuffle":
            return n // self.batch_size
        return math.ceil(1.0 / self.sampling_rate(n))

    def plan(self, key: jax.Array, n: int, steps: int, *, min_size: int | None = None) -> Any:
        """What a run draws once: its key, and for ``'shuffle'`` every epoch's permutation ``[E, n]``.

        ``min_size`` (static, default n) is the fewest examples a ``batch`` call will be told are
        present: the shuffled plan holds enough epochs for it.
        """
        if self.kind != "shuffle":
            return key
        fewest = n if min_size is None else min_size
        epochs = -(-steps // max(self.steps_per_epoch(fewest), 1))
        keys = jax.random.split(key, epochs)
        return jax.vmap(lambda k: jax.random.permutation(k, n).astype(jnp.int32))(keys)

    def batch(
        self, plan: Any, t: jax.Array, n: int, size: jax.Array | int | None = None,
        slots: int | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
        """Step t's batch: indices ``[capacity]`` int32, valid ``[capacity]`` bool, overflow ``[]``.

        Pure in (plan, t): the same run key gives the same batches. Invalid slots hold index 0.
        ``size`` (default n; may be traced) is the number of examples present, in slots
        ``0 .. size - 1``; the batch is drawn from those alone. ``slots`` (Poisson only; default
        the capacity) draws only the first ``slots`` members: the same members as at the full
        capacity whenever this step's overflow (the last of the ``slots`` used) is 0
        (:mod:`~cbdp_jax._src.training_auditor.lean_batches`).
        """
        cap = self.capacity(n)
        none = jnp.zeros((), jnp.int32)
        size = n if size is None else size
        if slots is not None and slots != cap:
            if self.kind != "poisson" or not 1 <= slots <= cap:
                raise InvalidParameterError(
                    f"slots={slots!r} is invalid: only a Poisson sampler draws fewer slots, "
                    f"in [1, {cap}]"
                )
            return self._poisson(plan, t, n, size, slots, cap)
        if self.kind == "shuffle":
            return self._shuffled(plan, t, n, size, cap)
        if self.kind == "custom":
            return user_sampler.batch(self, plan, t, n, size, cap)
        k_t = jax.random.fold_in(plan, t)
        if self.kind == "fixed":  # the b largest of the present slots' uniforms: a uniform b-subset
            u = jax.random.uniform(k_t, (n,))
            u = jnp.where(jnp.arange(n) < size, u, -1.0)
            _, idx = jax.lax.top_k(u, cap)
            return idx.astype(jnp.int32), jnp.ones(cap, bool), none
        return self._poisson(plan, t, n, size, cap, cap)

    def _poisson(self, plan, t, n: int, size, cap: int, layout: int):
        """The first ``cap`` members of the Poisson batch whose full capacity is ``layout``."""
        # the members' positions: i.i.d. Geometric(q) gaps from -1, which is Bernoulli(q) inclusion
        # of each slot; capacity uniforms per step instead of n Bernoullis and a compaction. The
        # gaps' words are a prefix of the full capacity's, so fewer slots see the same members.
        q, k_t = float(self.rate), jax.random.fold_in(plan, t)
        if q == 1.0:
            idx = jnp.arange(cap, dtype=jnp.int32)
            return idx, idx < size, jnp.asarray(int(cap < n), jnp.int32)  # all n: cap < n cut some
        gaps = geometric_gaps(k_t, cap, q, layout=layout)
        pos = jnp.cumsum(jnp.minimum(gaps, n + 1.0)) - 1.0
        overflow = ((pos[-1] < n) & (cap < n)).astype(jnp.int32)  # last slot used: maybe truncated
        valid = pos < size
        return jnp.where(valid, pos, 0).astype(jnp.int32), valid, overflow

    def _shuffled(self, plan, t, n: int, size, cap: int):
        """Epoch t // (size // b)'s permutation of the present slots, its (t mod that)-th batch."""
        if isinstance(size, int) and size == n:  # every slot present: the permutation's slice
            per_epoch = self.steps_per_epoch(n)
            idx = jax.lax.dynamic_slice(plan[t // per_epoch], ((t % per_epoch) * cap,), (cap,))
        else:  # the present slots in the permutation's order: a uniform permutation of them
            per_epoch = jnp.maximum(size // cap, 1)
            perm = plan[t // per_epoch]
            # The batch's positions j among the present slots, found by the running count of present
            # slots along the permutation (a cumulative sum and a search: no sort of n per step).
            count = jnp.cumsum((perm < size).astype(jnp.int32))
            j = (t % per_epoch) * cap + jnp.arange(cap, dtype=jnp.int32)
            idx = perm[jnp.searchsorted(count, j + 1, method="compare_all")]
        return idx, jnp.ones(cap, bool), jnp.zeros((), jnp.int32)

    def masks(self, key: jax.Array, n: int, steps: int, size: int | None = None) -> jax.Array:
        """The batches of ``steps`` steps as inclusion masks ``[steps, n]`` bool (same as ``batch``).

        ``size`` (default n): only slots ``0 .. size - 1`` hold an example.
        """
        size = n if size is None else int(size)
        self.check_size(size, what=f"the {size} examples present")
        return _masks(self, key, n, steps, size)


def geometric_gaps(key: jax.Array, count: int, q: float, *, layout: int | None = None) -> jax.Array:
    """``count`` i.i.d. Geometric(q) gaps on {1, 2, ...} ``[count]`` float32, one 32-bit word each.

    A gap is ``floor(log(u) / log(1 - q)) + 1`` for u uniform on (0, 1): ``u = (w + 1/2) 2^-32`` from
    a uniform 32-bit word w (both words of each Threefry block, :func:`normal_draws.uniform_words`:
    half the hashes of ``jax.random.uniform``). The smallest u, 2^-33, cuts the gap's tail at
    probability 2^-33 (about 1e-10) beyond ``23 / -log(1 - q)``; float32 rounds u to 24 bits.
    ``layout``: the first ``count`` of the gaps drawn for ``layout`` (the same words).
    """
    words = normal_draws.uniform_words(key, count, layout)
    u = (words.astype(jnp.float32) + 0.5) * np.float32(2.0**-32)
    return jnp.floor(jnp.log(u) / np.float32(math.log1p(-q))) + 1.0


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def _masks(sampler: BatchSampler, key: jax.Array, n: int, steps: int, size: int) -> jax.Array:
    plan = sampler.plan(key, n, steps, min_size=size)

    def one(t):
        idx, valid, _ = sampler.batch(plan, t, n, size)
        return jnp.zeros(n, bool).at[idx].max(valid)

    return jax.vmap(one)(jnp.arange(steps))
