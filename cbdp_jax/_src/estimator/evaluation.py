"""Held-out evaluation of one fixed critic: streams test samples in chunks into held-out statistics.

For a fixed critic (trained elsewhere) and independent held-out samples x_1..x_n ~ P, y_1..y_m ~ Q, the
f-form value mean(h(x_i)) - mean(f*(h(y_j))) is an unbiased estimate of v(h) = E_P[h] - E_Q[f*(h)] <=
D_f^H (docs/theory/bounds.md). This module computes, chunk by chunk in one compiled program, everything
:mod:`cbdp_jax._src.statistics` needs to certify a bound on v(h): the moments of both terms, of their
paired differences and of the pair statistics, tail sketches, and (for the betting bound) the paired
differences themselves. Every chunk is cut on the host into pieces of one row count
(:data:`EVAL_ROWS`, the last piece padded and masked), so every sample size, every pass and every
chunk size shares one compiled program; the statistics are merged on the host in float64. A
padding row adds an exact zero to each sum, so the statistics of a piece do not depend on how much
padding it holds.

The critic is ``B * tanh((scale * h + shift) / B)`` when a finite-sample guarantee bounds it at B, and
``scale * h + shift`` otherwise. The same pass can also evaluate a second critic of the same network,
``named_scale * h + named_shift`` (the member of the class the user named, before any tail shrink or
bounding): the estimate is reported for it, the bound for the certified one (docs/theory/bounds.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.estimator.adversary_fitting_ensemble import apply_fn
from cbdp_jax._src.estimator.core import outputs_of
from cbdp_jax._src.infra import threads
from cbdp_jax._src.infra.programs import persistent_jit
from cbdp_jax._src.privacy.divergences import Divergence
from cbdp_jax._src.statistics import berry_esseen, held_out, tails
from cbdp_jax._src.statistics import moments as mom
from cbdp_jax._src.statistics.bounds import z_quantile

__all__ = [
    "EVAL_ROWS",
    "Critic",
    "Padded",
    "array_chunks",
    "critic_outputs",
    "evaluate_fixed",
    "outputs",
    "pad_rows",
    "readout_host",
    "rowwise_outputs",
    "z_quantile",
]

# The rows of every chunk the row-wise programs (evaluation, outputs) take: one compiled program per
# class serves every sample size. Inside, the network runs on pieces of EVAL_PIECE rows, only on
# those that hold samples (core.outputs_of), so a short last chunk costs what its samples need.
EVAL_ROWS = 1 << 16
EVAL_PIECE = 1 << 12


class Padded(NamedTuple):
    """A chunk zero-padded to the evaluation program's row count; its first ``count`` rows are samples.

    A sampler that pads inside its own compiled program spares an eager padding program.
    """

    x: jax.Array
    count: int


class Critic(NamedTuple):
    """A fixed function of the class: the selected member, its fitted affine map and its bound.

    Attributes:
      params: The member's trainable parameters.
      rest: Its other state (standardisation, fixed features).
      scale: The fitted scale.
      shift: The fitted constant.
      bound: B of the bounded critic ``B tanh(. / B)``, or ``inf`` for none.

    """

    params: Any
    rest: Any
    scale: Any
    shift: Any
    bound: Any = math.inf


@persistent_jit(static_argnames=("graphdef",))
def critic_outputs(graphdef, critic: Critic, x: jax.Array) -> jax.Array:
    """The critic's values on ``x`` ``[n, d]`` (one compiled program; traceable)."""
    return _readout(critic, apply_fn(graphdef, critic.params, critic.rest, x))


@persistent_jit(static_argnames=("graphdef",))
def outputs(graphdef, critic: Critic, x: jax.Array, n) -> tuple[jax.Array, jax.Array]:
    """The network's raw outputs on the first ``n`` rows of ``x`` ``[rows, d]`` and the critic's values.

    One program; rows past the pieces that hold the ``n`` samples are not computed (their outputs
    are meaningless).
    """
    raw = _raw(graphdef, critic, x, n)
    return raw, _readout(critic, raw)


def _raw(graphdef, critic: Critic, x: jax.Array, n) -> jax.Array:
    net = functools.partial(apply_fn, graphdef, critic.params, critic.rest)
    return outputs_of(net, x, n, EVAL_PIECE)


def rowwise_outputs(graphdef, critic: Critic, x) -> tuple[np.ndarray, np.ndarray]:
    """:func:`outputs` of every row of ``x`` (host or device), in pieces of :data:`EVAL_ROWS` rows.

    Each output row depends on its input row alone, so the rows kept are what one call on all of
    ``x`` gives, and one compiled program serves every row count. Host arrays ``(raw, critic)``.
    """
    host = np.asarray(x)
    n = int(host.shape[0])
    raws, crits = [], []
    for start in range(0, max(n, 1), EVAL_ROWS):
        piece, count = _pad(host[start : start + EVAL_ROWS], EVAL_ROWS, host)
        raw, crit = outputs(graphdef, critic, jax.device_put(piece), np.int32(count))
        raws.append(np.asarray(raw)[:count])
        crits.append(np.asarray(crit)[:count])
    return np.concatenate(raws), np.concatenate(crits)


def readout_host(critic: Critic, raw: np.ndarray) -> np.ndarray:
    """The critic's values from the network's raw outputs, on the host in the outputs' dtype.

    :func:`_readout`'s arithmetic in NumPy (the last bit may differ where the compiled program
    fuses a multiply-add): for choices made on validation samples (tail centres, predicted
    bounds), which then need no second pass of the network.
    """
    raw = np.asarray(raw)
    dt = raw.dtype.type
    h = dt(critic.scale) * raw + dt(critic.shift)
    bound = float(critic.bound)
    if math.isfinite(bound):
        h = dt(bound) * np.tanh(h / dt(bound))
    return h


def _readout(critic: Critic, raw: jax.Array) -> jax.Array:
    """The critic's values from the network's raw outputs (its affine map, then its bound)."""
    h = critic.scale * raw + critic.shift
    b = jnp.asarray(critic.bound, h.dtype)
    finite = jnp.isfinite(b)
    safe = jnp.where(finite, b, 1.0)
    return jnp.where(finite, safe * jnp.tanh(h / safe), h)


@persistent_jit(static_argnames=("graphdef", "divergence", "capacity"))
def _chunk(critic, named, x_p, x_q, n_p, n_q, centres, **static):
    """The compiled evaluation program: :func:`_chunk_body`, looked up when traced.

    The lookup lets a test wrap the body with ``chex.assert_max_traces``.
    """
    return _chunk_body(critic, named, x_p, x_q, n_p, n_q, centres, **static)


def _chunk_body(
    critic, named, x_p, x_q, n_p, n_q, centres, *, graphdef, divergence: Divergence, capacity
):
    div = divergence
    raw_p, raw_q = _raw(graphdef, critic, x_p, n_p), _raw(graphdef, critic, x_q, n_q)
    t_p = _readout(critic, raw_p)
    t_q = div.conjugate(_readout(critic, raw_q))
    rows = jnp.arange(x_p.shape[0])
    mask_p, mask_q = rows < n_p, rows < n_q
    mask_z = rows < jnp.minimum(n_p, n_q)
    z = jnp.where(mask_z, t_p - t_q, 0.0)
    named_critic = critic._replace(scale=named[0], shift=named[1], bound=jnp.inf)
    named_p = _readout(named_critic, raw_p)
    named_q = div.conjugate(_readout(named_critic, raw_q))
    # Computed once: without the barrier XLA fuses f* (exp, log, tanh) into every statistic's kernel,
    # which multiplies the code it compiles and the transcendentals it evaluates.
    t_p, t_q, z, named_p, named_q = jax.lax.optimization_barrier((t_p, t_q, z, named_p, named_q))
    return (
        mom.of(t_p, mask_p),
        mom.of(t_q, mask_q),
        mom.of(z, mask_z),
        berry_esseen.pair_moments(z, mask_z),
        tails.sketch(t_p, centres[0], capacity, mask_p),
        tails.sketch(t_q, centres[1], capacity, mask_q),
        z,
        mom.of(named_p, mask_p),
        mom.of(named_q, mask_q),
    )


def _pad(x, rows: int, like) -> tuple[Any, int]:
    """A chunk as ``rows`` rows and its sample count.

    ``x`` is an array, a :class:`Padded` chunk or None (an exhausted side: all padding). A chunk with
    fewer rows is padded on the host (no program of its own to compile for each shape).
    """
    if isinstance(x, Padded):
        if int(x.x.shape[0]) == rows:
            return x.x, int(x.count)
        x = np.asarray(x.x)[: int(x.count)]
    if x is None:
        return np.zeros((rows,) + tuple(like.shape[1:]), like.dtype), 0
    n = int(x.shape[0])
    if n == rows:
        return x, n
    host = np.asarray(x)
    return np.concatenate([host, np.zeros((rows - n,) + host.shape[1:], host.dtype)]), n


def pad_rows(x: jax.Array, rows: int) -> jax.Array:
    """``x`` zero-padded along its first axis to ``rows`` rows (traceable; the chunk padding rule)."""
    n = x.shape[0]
    return jnp.pad(x, ((0, rows - n),) + ((0, 0),) * (x.ndim - 1)) if rows > n else x


def evaluate_fixed(
    graphdef,
    critic: Critic,
    p_chunks: Iterator[jax.Array],
    q_chunks: Iterator[jax.Array],
    *,
    divergence: Divergence,
    centres: tuple[float, float] = (0.0, 0.0),
    keep_samples: bool = False,
    capacity: int = tails.DEFAULT_CAPACITY,
    on_chunk: Callable[[held_out.HeldOut], bool] | None = None,
    named: tuple[float, float] | None = None,
    rows: int = EVAL_ROWS,
) -> held_out.HeldOut:
    """Streams held-out chunks of P and Q through the fixed critic; returns the merged statistics.

    Args:
      graphdef: The class's graph definition.
      critic: The fixed critic.
      p_chunks: Chunks ``[c, d]`` of held-out samples of P (arrays or :class:`Padded`).
      q_chunks: Chunks of Q, paired with those of P in order.
      divergence: The divergence (its conjugate f*).
      centres: Centres of the tail sketches of the two terms (fixed on validation data).
      keep_samples: Keep the paired differences (for the betting bound).
      capacity: Tail sketch size.
      on_chunk: Called with each chunk's statistics (paired differences included) in order; when it
        returns True the stream stops there (sequential testing: the caller's bound must be valid
        under optional stopping, as a confidence sequence is).
      named: ``(scale, shift)`` of a second, unbounded critic ``scale * h + shift`` of the same
        network whose terms are recorded too (``HeldOut.named``): the member of the named class the
        estimate is reported for. None: not recorded.
      rows: The row count of the pieces each chunk is cut into on the host (even; the last piece
        of a chunk is padded): one compiled program serves every chunk and sample size.

    Returns:
      :class:`~cbdp_jax._src.statistics.held_out.HeldOut` statistics (float64, on the host).

    """
    acc = held_out.empty(keep_samples, capacity, named=named is not None)
    named_map = (critic.scale, critic.shift) if named is None else named
    keep = keep_samples or on_chunk is not None
    sentinel = object()
    p_iter, q_iter = iter(p_chunks), iter(q_chunks)
    while True:
        if threads.cancelled():
            raise KeyboardInterrupt("evaluation cancelled")
        xp, xq = next(p_iter, sentinel), next(q_iter, sentinel)
        if xp is sentinel and xq is sentinel:
            break
        xp, xq = (
            _host_rows(None if xp is sentinel else xp),
            _host_rows(None if xq is sentinel else xq),
        )
        like = xp if xp is not None else xq
        chunk = held_out.empty(keep, capacity, named=named is not None)
        longest = max(0 if x is None else x.shape[0] for x in (xp, xq))
        for start in range(0, max(longest, 1), rows):
            pieces = [None if x is None or start >= x.shape[0] else x[start : start + rows]
                      for x in (xp, xq)]  # fmt: skip
            (pp, n_p), (pq, n_q) = (_pad(x, rows, like) for x in pieces)
            stats = jax.device_get(_chunk(
                critic, named_map, pp, pq, np.int32(n_p), np.int32(n_q),
                np.asarray(centres, np.dtype(like.dtype)), graphdef=graphdef,
                divergence=divergence, capacity=capacity,
            ))  # fmt: skip
            chunk = held_out.merge(chunk, _held(stats, min(n_p, n_q), keep, named is not None))
        stop = on_chunk is not None and on_chunk(chunk)
        if not keep_samples:
            chunk = chunk._replace(z_samples=None)
        acc = held_out.merge(acc, chunk)
        if stop:
            break
    return acc


def _host_rows(x) -> np.ndarray | None:
    """A chunk's sample rows as a host array (a :class:`Padded` chunk cut to its count)."""
    if x is None:
        return None
    if isinstance(x, Padded):
        return np.asarray(x.x)[: int(x.count)]
    return np.asarray(x)


def _held(stats, n_z: int, keep: bool, named: bool) -> held_out.HeldOut:
    """One piece's statistics (the compiled program's outputs) as host :class:`HeldOut` statistics."""
    return held_out.HeldOut(
        mom.to_host(stats[0]),
        mom.to_host(stats[1]),
        mom.to_host(stats[2]),
        berry_esseen.PairMoments(mom.to_host(stats[3].w), mom.to_host(stats[3].v)),
        tails.TailSketch(np.asarray(stats[4].top, np.float64), np.asarray(stats[4].count)),
        tails.TailSketch(np.asarray(stats[5].top, np.float64), np.asarray(stats[5].count)),
        np.asarray(stats[6][:n_z], np.float64) if keep else None,
        held_out.Terms(mom.to_host(stats[7]), mom.to_host(stats[8])) if named else None,
    )


def array_chunks(x: jax.Array, chunk: int) -> Iterator[jax.Array]:
    """Yields consecutive row blocks of ``x`` of ``chunk`` rows (``x`` itself if it fits).

    A device array longer than a chunk is read to the host once and cut there: no slicing program
    to compile for each shape (the evaluation pads the last, shorter block on the host too).
    """
    n = int(x.shape[0])
    if n <= chunk:
        yield x
        return
    host = np.asarray(x)
    for start in range(0, n, chunk):
        yield host[start : start + chunk]
