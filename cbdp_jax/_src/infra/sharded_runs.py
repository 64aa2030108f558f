"""Many independent runs of a pure function, sharded over every device and process, in short calls.

:func:`sharded_runs` evaluates ``run(key_i, *args)`` for i = 0 .. n - 1, with key_i the i-th key of
``jax.random.split(key, n)``, and returns the outputs stacked along a leading axis of n (numpy).
What it adds to one ``jit(vmap(run))``:

* **Devices.** Each call evaluates a block of ``chunk x devices`` runs, sharded along the run axis
  over a one-dimensional mesh of ``jax.devices()`` (``NamedSharding``); runs never communicate, so
  the program has no collectives. A run's key depends only on its index, so the outputs are the
  same whatever the number of devices or the chunk (to float reassociation inside a vmapped run).
* **Processes.** After ``jax.distributed.initialize()`` (:mod:`~cbdp_jax._src.infra.launch` starts such a
  job on one machine), ``jax.devices()`` spans every process: each process builds and runs only the
  shards of its own devices (``jax.make_array_from_callback``) and the outputs are gathered to every
  process (``multihost_utils.process_allgather``). Every process must make the same call.
* **Short calls.** The block is sized so that one call takes about ``target_seconds`` (timed on the
  second call, the first compiles; the size is process 0's, broadcast, so every process runs the
  same program), up to ``max_chunk`` runs per device (the memory bound). CPUs start from 8 runs per
  device; accelerators from ``max_chunk``, shrunk only when a call takes longer than the target. The host loops over the
  blocks, one call in flight while the previous one's outputs come back, so Ctrl-C
  (``KeyboardInterrupt``) lands within about two calls, and ``progress`` hears after every block.

The keys of a block are computed from the counters of ``jax.random.split`` (threefry's
"partitionable" split: key i is threefry(key, (0, i)), so n does not enter), checked against
``jax.random.split`` itself once per process; with another PRNG implementation the n keys are
split once on the host.

**Lean blocks.** A run that has a cheaper form for whole blocks (``run.lean(per)`` returns a
function of the same keys, or None; :mod:`~cbdp_jax._src.training_auditor.lean_batches`) is
evaluated by it, and the runs it flags (``run.overflowed(outputs)``) are recomputed by ``run``
itself with their own keys, in blocks of ``run.repair`` runs per device (the program of the first,
probing call on a CPU: no extra compilation), before the block is collected: a block's outputs
are those of ``run`` (checkpoints and keys unchanged).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from cbdp_jax._src.infra.validation import InvalidParameterError, check_int_at_least, check_positive

RUN_AXIS = "runs"


class Progress(NamedTuple):
    """What a progress hook hears after each block.

    Attributes:
      done: Runs finished so far.
      total: Runs asked for.
      seconds: Wall time since the first call, compilation included.
      eta: Seconds still to go, at the rate of the blocks since the last compilation (0 at the end).

    """

    done: int
    total: int
    seconds: float
    eta: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """How the runs are cut: devices, runs per device per call.

    Attributes:
      devices: The mesh's devices (all processes' devices).
      chunk: Runs per device in one call.

    """

    devices: tuple[Any, ...]
    chunk: int

    @property
    def block(self) -> int:
        """Runs per call: chunk x devices."""
        return self.chunk * len(self.devices)


@functools.lru_cache(maxsize=1)
def _counter_keys_agree() -> bool:
    """Whether key i of ``split(key, n)`` is threefry(key, (0, i)) in this JAX (checked once)."""
    try:
        key = jax.random.key(12345)
        want = np.asarray(jax.random.key_data(jax.random.split(key, 37))[5:37])
        got = np.asarray(jax.random.key_data(_block_keys(key, 5, 32)))
    except Exception:  # another PRNG implementation: split on the host instead
        return False
    return bool(np.array_equal(want, got))


def _block_keys(key: jax.Array, start: int, size: int) -> jax.Array:
    """Keys start .. start + size - 1 of ``jax.random.split(key, n)`` (any n > start + size - 1)."""
    return _index_keys(key, np.arange(start, start + size, dtype=np.uint64))


def _index_keys(key: jax.Array, index: np.ndarray) -> jax.Array:
    """Keys ``index`` of ``jax.random.split(key, n)`` (any n > max(index))."""
    from jax.extend.random import threefry_2x32

    index = np.asarray(index, dtype=np.uint64)
    counts = jnp.asarray(np.stack([(index >> 32).astype(np.uint32), index.astype(np.uint32)]))
    bits = threefry_2x32(jax.random.key_data(key), counts)
    return jax.random.wrap_key_data(jnp.stack([bits[0], bits[1]], axis=-1), impl="threefry2x32")


class _Keys:
    """The keys of blocks of runs, as uint32 key data ``[size, 2]`` on the host."""

    def __init__(self, key: jax.Array, n: int, padded: int):
        self.key, self.all = key, None
        if not _counter_keys_agree():
            self.all = np.asarray(jax.random.key_data(jax.random.split(key, padded)))

    def data(self, start: int, size: int) -> np.ndarray:
        if self.all is not None:
            return self.all[start : start + size]
        return np.asarray(jax.random.key_data(_block_keys(self.key, start, size)))

    def at(self, index: np.ndarray) -> np.ndarray:
        """The keys of the runs ``index`` (any order)."""
        if self.all is not None:
            return self.all[index]
        return np.asarray(jax.random.key_data(_index_keys(self.key, index)))


def _mesh(devices) -> tuple[tuple[Any, ...], NamedSharding, NamedSharding]:
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise InvalidParameterError("devices=() is invalid: give at least one device")
    mesh = Mesh(np.asarray(devices, dtype=object), (RUN_AXIS,))
    return (
        devices,
        NamedSharding(mesh, PartitionSpec(RUN_AXIS)),
        NamedSharding(mesh, PartitionSpec()),
    )


_BARRIERS = [0]
BARRIER_MINUTES = 30


def _barrier() -> None:
    """Waits until every process gets here (the coordination service's barrier, 30 minutes).

    Before each collective: gloo sets up a collective's context with a fixed 30 s timeout, which
    a process still compiling a program on a loaded machine can miss (measured: two processes on 2
    shared cores at load 15 died so). The barrier holds the first process until the others have
    compiled and dispatched theirs. Outside a multi-process job, or without the coordination
    client, it does nothing.
    """
    if jax.process_count() == 1:
        return
    try:
        from jax._src import distributed

        client = distributed.global_state.client
    except ImportError:  # pragma: no cover - another JAX layout: gloo's own timeout then
        return
    if client is None:
        return
    _BARRIERS[0] += 1
    client.wait_at_barrier(f"cbdp-sharded-runs-{_BARRIERS[0]}", BARRIER_MINUTES * 60_000)


def _to_host(tree) -> Any:
    """Outputs as numpy on every process (gathered when they span several)."""

    def one(x):
        if getattr(x, "is_fully_addressable", True):
            return np.asarray(x)
        from jax.experimental import multihost_utils

        _barrier()
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def _agree(value: int) -> int:
    """Process 0's value in every process (the block size every process must use)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    _barrier()
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _program(run: Callable, sharded, replicated, impl: str, nargs: int) -> Callable:
    def many(key_data, *args):
        keys = jax.random.wrap_key_data(key_data, impl=impl)
        return jax.vmap(lambda k: run(k, *args))(keys)

    shardings = (sharded, *([replicated] * nargs))
    return jax.jit(many, in_shardings=shardings, out_shardings=sharded)


def _impl_name(key: jax.Array) -> str:
    impl = jax.random.key_impl(key)
    return getattr(impl, "name", None) or str(impl)


def _global(x: np.ndarray, sharding) -> jax.Array:
    """A host array (the same in every process) as a global array of ``sharding``."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def sharded_runs(
    run: Callable, key: jax.Array, n: int, *args: Any, devices=None, chunk: int | None = None,
    max_chunk: int = 4096, target_seconds: float = 0.5,
    progress: Callable[[Progress], None] | None = None, programs: dict | None = None,
    blocks: Any = None,
) -> Any:  # fmt: skip
    """``run(key_i, *args)`` for the n keys of ``jax.random.split(key, n)``, stacked ``[n, ...]``.

    Args:
      run: A pure function of a typed key and ``args`` (jit and vmap ready), returning a pytree.
      key: A typed PRNG key.
      n: The number of runs, >= 1.
      *args: Arguments shared by every run (replicated to every device; arrays or scalars).
      devices: The mesh's devices (default ``jax.devices()``, every process's).
      chunk: Runs per device per call; None sizes it to ``target_seconds`` (module docstring).
      max_chunk: The most runs per device per call (the memory bound).
      target_seconds: The duration of one call when ``chunk`` is None.
      progress: Called with a :class:`Progress` after every block.
      programs: A dict that keeps compiled programs across calls (keyed by block size) and the
        block size chosen by the first call that sized one (later calls start from it, without
        timing or compiling again); default a fresh one.
      blocks: A checkpoint of this call (:class:`~cbdp_jax._src.infra.run_blocks.BlockPart`), or None:
        the runs it holds are loaded, not run, and the outputs are written into it in blocks as
        they come back (process 0 writes). The chunk is then fixed (the stored one, else
        :func:`steady_chunk`), so a resumed call gives the outputs of one left alone, bit for bit.

    Returns:
      The outputs as numpy arrays with a leading axis of n, the same in every process.

    """
    n = check_int_at_least("runs", n, 1)
    check_int_at_least("max_chunk", max_chunk, 1)
    check_positive("target_seconds", target_seconds)
    devices, sharded, replicated = _mesh(devices)
    ndev = len(devices)
    programs = {} if programs is None else programs
    impl = _impl_name(key)
    args = tuple(_global(np.asarray(a), replicated) for a in args)
    done, stored, stored_chunk = (0, [], None) if blocks is None else blocks.load()
    if blocks is not None and chunk is None:  # a fixed chunk: the same bits whenever resumed
        chunk = stored_chunk or steady_chunk(devices, max_chunk)
    fixed = chunk is not None or "chunk" in programs  # a size chosen before is kept: no recompiling
    if chunk is not None:
        c = min(check_int_at_least("chunk", chunk, 1), max_chunk)
    else:  # CPU: probe with 8 runs; an accelerator: start at the memory bound (calls are short)
        first = min(8, max_chunk) if devices[0].platform == "cpu" else max_chunk
        c = programs.get("chunk", first)
    c = min(c, -(-n // ndev))
    keys = _Keys(key, n, n + max_chunk * ndev)
    t0 = time.perf_counter()
    pieces = _stored_pieces(run, key, args, stored)
    state = {"done": done, "steady": None}
    write = _BlockWriter(blocks, done, len(pieces), c)

    engine = _Calls(run, programs, devices, (sharded, replicated), impl, args, keys)
    dispatch = engine.dispatch

    def collect(item) -> None:
        start, block, out, _, lean = item
        keep = min(block, n - start)
        out = jax.tree.map(lambda a: a[:keep], _to_host(out))
        pieces.append(engine.repair(out, start) if lean else out)
        state["done"] += keep
        write(pieces, state["done"], state["done"] >= n)
        if progress is not None:
            done, elapsed, steady = state["done"], time.perf_counter() - t0, state["steady"]
            since = steady if steady is not None and done > steady[0] else (0, 0.0)
            rate = (done - since[0]) / max(elapsed - since[1], 1e-9)
            eta = 0.0 if done >= n else (n - done) / rate if rate > 0 else math.inf
            progress(Progress(done, n, elapsed, eta))

    start, calls, pending = done, 0, None
    while start < n:
        t_call = time.perf_counter()
        item = dispatch(start, c)
        start, calls = start + item[1], calls + 1
        timed = not fixed and calls == 2
        if not (item[3] or timed):  # one call in flight while the previous one's outputs come back
            if pending is not None:
                collect(pending)
            pending = item
            continue
        # alone: a call that compiles (so the rate excludes compilation), and the timed second one
        if pending is not None:
            collect(pending)
            pending = None
        collect(item)
        if timed and n - start > 2 * c * ndev:  # resize (one more compilation) only when it pays
            grow = target_seconds / max(time.perf_counter() - t_call, 1e-6)
            new = int(min(max_chunk, max(1.0, c * grow)))
            new = 1 << (new.bit_length() - 1)  # a power of two: few programs
            c = programs["chunk"] = _agree(new)
        state["steady"] = (state["done"], time.perf_counter() - t0)
    if pending is not None:
        collect(pending)
    return jax.tree.map(lambda *a: np.concatenate(a)[:n], *pieces)


class _Calls:
    """The block programs of one :func:`sharded_runs` call (kept in ``programs``), and the repair."""

    def __init__(self, run, programs: dict, devices, shardings, impl: str, args: tuple, keys):
        self.run, self.programs, self.devices, self.shardings = run, programs, devices, shardings
        self.impl, self.args, self.keys, self.ndev = impl, args, keys, len(devices)
        self.lean_of = getattr(run, "lean", None)  # a lean form per block size, or None

    def program(self, per: int, fn=None):
        name = (per, tuple(d.id for d in self.devices), fn is not None)
        fresh = name not in self.programs
        if fresh:
            sharded, replicated = self.shardings
            self.programs[name] = _program(
                fn or self.run, sharded, replicated, self.impl, len(self.args)
            )
        return self.programs[name], fresh

    def dispatch(self, start: int, per: int):
        """Runs start .. start + per x devices - 1 dispatched: (start, block, outputs, fresh, lean)."""
        data = self.keys.data(start, per * self.ndev)
        lean = None if self.lean_of is None else self.lean_of(per)
        call, fresh = self.program(per, lean)
        out = call(_global(data, self.shardings[0]), *self.args)
        return start, per * self.ndev, out, fresh, lean is not None

    def repair(self, out, start: int):
        """The runs of a lean block that overflowed, recomputed by the run itself (same keys)."""
        bad, per = np.flatnonzero(self.run.overflowed(out)), self.run.repair
        for i in range(0, len(bad), per * self.ndev):
            rows = bad[i : i + per * self.ndev]
            index = np.resize(rows, per * self.ndev) + start  # padded with repeats: a full block
            call, _ = self.program(per)
            redo = _to_host(call(_global(self.keys.at(index), self.shardings[0]), *self.args))
            out = jax.tree.map(lambda a, r, rows=rows: _put(a, rows, r[: len(rows)]), out, redo)
        return out


def _put(a: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    a = np.array(a)  # host arrays may be read-only views of device buffers
    a[rows] = values
    return a


def steady_chunk(devices, max_chunk: int) -> int:
    """The fixed chunk of a checkpointed call (runs per device per call).

    256 on a CPU (about half a second of a small model's runs), ``max_chunk`` on an accelerator (the
    memory bound); at most ``max_chunk``.
    """
    return max_chunk if devices[0].platform != "cpu" else min(256, max_chunk)


class _BlockWriter:
    """Writes the outputs collected since the last block into a new block of the checkpoint.

    Every ``every_seconds`` of the checkpoint, and at the end; process 0 only (every process holds
    every output).
    """

    def __init__(self, blocks, done: int, pieces: int, chunk: int):
        self.blocks = blocks if jax.process_index() == 0 else None
        self.saved, self.saved_pieces, self.chunk, self.at = (
            done,
            pieces,
            chunk,
            time.perf_counter(),
        )

    def __call__(self, pieces: list, done: int, last: bool) -> None:
        now = time.perf_counter()
        if self.blocks is None or done == self.saved:
            return
        if not (last or now - self.at >= self.blocks.every_seconds):
            return
        new = [jax.tree.leaves(p) for p in pieces[self.saved_pieces :]]
        leaves = [np.concatenate(a) for a in zip(*new, strict=True)]
        self.blocks.save(self.saved, done, leaves, chunk=self.chunk)
        self.saved, self.saved_pieces, self.at = done, len(pieces), now


def _stored_pieces(run: Callable, key: jax.Array, args: tuple, stored: list) -> list:
    """The stored blocks' leaves as output pytrees (the structure from tracing one run)."""
    if not stored:
        return []
    treedef = jax.tree.structure(jax.eval_shape(lambda k: run(k, *args), key))
    return [jax.tree.unflatten(treedef, leaves) for leaves in stored]
