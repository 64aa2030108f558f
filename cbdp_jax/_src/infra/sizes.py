"""Sample counts checked against the memory available, before any sample is drawn.

A sample count too large for the machine otherwise ends deep inside XLA: an out-of-memory traceback
of seventy lines, a C++ abort (``Check failed: buffer_.IsConcrete()``, exit 134) past 2^32 elements,
or the kernel's out-of-memory killer. The command line checks first and refuses in one line naming
the option, the bytes needed and the bytes available (exit status 2).

What an estimate holds at once: the training and validation samples of both sides, the training
arrays again padded to their bucket, and one chunk of test samples per side, each row ``dim`` values
of the run's dtype (test samples are drawn and evaluated chunk by chunk, so their total does not
count); and, the larger part for a neural critic, the critics' hidden units on the whole validation
set, about three arrays of ``validation rows x ensemble x units`` in one program. Measured on CPU
(load 10, 2 cores; ``/usr/bin/time`` maximum resident size of ``cbdp estimate --steps 10`` at the
default mlp(64x2), ensemble 4): 0.82 GB at 5 x 10^5 samples, 1.99 GB at 2 x 10^6, 780 bytes per
sample, against 786 by this count (18 for the samples, 768 for the hidden units); at 3 x 10^8
samples XLA asked for 234 GB in one allocation (780 bytes per sample).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from cbdp_jax._src.infra.validation import InvalidParameterError

# Of the memory found available, at most this share may hold the samples (the rest: programs,
# intermediates, the interpreter).
MEMORY_SHARE = 0.8
EVAL_CHUNK = 16384  # test rows evaluated at once (EstimatorConfig.eval_chunk's default)


def available_bytes(*, host_only: bool = False) -> int | None:
    """Memory free for samples, in bytes; None when unknown (then nothing is refused).

    The default device's free memory where it reports it, else the host's ``MemAvailable``.
    ``host_only`` asks the host alone: it does not start JAX's backend, which a command that still
    has to set its devices (``cbdp sweep --devices-per-process``) must not do.
    """
    stats = {}
    try:
        if not host_only:
            import jax

            stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 -- a backend without memory statistics
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def estimate_bytes(
    samples: int,
    val_samples: int | None,
    dim: int,
    itemsize: int,
    *,
    ensemble: int = 1,
    units: int = 1,
    eval_chunk: int = EVAL_CHUNK,
) -> int:
    """Bytes an estimate with ``samples`` training samples per side holds at once (see module doc).

    Args:
      samples: Training samples per side.
      val_samples: Validation samples per side (None: the estimator's default, samples / 4).
      dim: Values per sample.
      itemsize: Bytes per value (the run's dtype).
      ensemble: Critics trained at once.
      units: Hidden units of one critic evaluated per sample (:func:`critic_units`).
      eval_chunk: Test rows evaluated at once.

    """
    val = max(samples // 4, 1000) if val_samples is None else val_samples
    rows = 2 * (2 * samples + val) + 2 * min(samples, eval_chunk)
    return (rows * dim + 3 * val * ensemble * units) * itemsize


def critic_units(spec, dim: int) -> int:
    """Hidden units one critic of ``spec`` (an ``AdversarySpec``) computes per sample."""
    if spec.name in ("mlp", "relu2"):
        return int(spec.width)
    if spec.name == "rff":
        return int(spec.features)
    if spec.name == "poly":
        return math.comb(dim + int(spec.degree), int(spec.degree))
    return max(dim, 1)


def size_text(n: float) -> str:
    """Bytes for people: ``'12.3 GiB'``, ``'450 MiB'``."""
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def check_fits(option: str, value: object, needed: int, what: str, advice: str = "", *,
               host_only: bool = False) -> None:  # fmt: skip
    """Refuses ``value`` of ``option`` in one line when ``needed`` bytes would not fit in memory.

    Raises:
      InvalidParameterError: ``option=value is invalid: <what> need about X of memory and Y is
        available ...``.

    """
    free = available_bytes(host_only=host_only)
    if free is None or needed <= MEMORY_SHARE * free:
        return
    raise InvalidParameterError(
        f"{option}={value!r} is invalid: {what} need about {size_text(needed)} of memory and "
        f"{size_text(free)} is available (a run may use at most {MEMORY_SHARE:.0%} of it); "
        f"{advice or ('use fewer runs' if option == 'runs' else 'use fewer samples')}"
    )


def check_representable(option: str, shown: str, arr, dtype: str) -> None:
    """Refuses samples beyond ``dtype``'s range (they would turn into inf when cast), naming ``option``."""
    largest = float(np.finfo(np.dtype(dtype)).max)
    if arr.size == 0:
        return
    biggest = float(np.max(np.abs(arr)))
    if biggest > largest:
        rows = int(np.sum(np.any(np.abs(arr) > largest, axis=tuple(range(1, arr.ndim)))))
        raise InvalidParameterError(
            f"{option}={shown} is invalid: {rows} of its rows hold values beyond {dtype}'s range "
            f"(largest magnitude {biggest:.3g} > {largest:.3g}); rescale the samples, or use "
            "--dtype float64"
        )


def out_of_memory_text(exc: BaseException) -> str | None:
    """One line for an XLA out-of-memory error (``RESOURCE_EXHAUSTED``), or None for another error."""
    text = str(exc)
    if type(exc).__name__ != "JaxRuntimeError" or "RESOURCE_EXHAUSTED" not in text:
        return None
    first = text.strip().splitlines()[0].strip()
    return (
        f"out of memory: {first}; the run holds too much at once: use fewer samples (--samples, "
        "--test-samples, --runs), a smaller --batch-size or --chunk where the command has one"
    )


def check_memory_for_draws(pair, samples: int, val_samples: int, config, dtype) -> None:
    """Before an estimator draws: the training and validation samples of both sides must fit.

    Counts the samples (:func:`estimate_bytes` with one unit per value); the command line adds the
    critics' hidden units, which it knows from the class.
    """
    dim = _output_dim(pair, dtype)
    itemsize = np.dtype(dtype).itemsize
    needed = estimate_bytes(
        samples, val_samples, dim, itemsize, units=0, eval_chunk=config.eval_chunk
    )
    check_fits("samples", samples, needed, "its samples")


# An audit holds both sides' samples as float64 [n, d] (with the float32 draw they came from and the
# critics' copies): 24 bytes per value, and about 120 bytes per sample for the critics' values,
# sort orders and training batches. Measured (``/usr/bin/time`` maximum resident size of ``cbdp audit
# mech.py:noisy_count_right --claim pure:0.5`` at the default classes, load 11): 0.64 GB at 2 x 10^5
# samples per side, 1.16 GB at 2 x 10^6, 293 bytes per sample per side pair, against 288 here.
AUDIT_BYTES_PER_VALUE = 24
AUDIT_BYTES_PER_SAMPLE = 120


def audit_bytes(samples: int, dim: int = 1) -> int:
    """Bytes an audit holds at once for ``samples`` outputs per side of ``dim`` values each.

    Only the certification (or screening) samples of one pair are held at once; a training audit's
    runs are trained in chunks, so its runs count here only as their scores (``dim`` = 1).
    """
    return 2 * int(samples) * (AUDIT_BYTES_PER_VALUE * max(int(dim), 1) + AUDIT_BYTES_PER_SAMPLE)


# A training audit whose runs record a release holds it as float32 (the values as recorded) and
# computes its feature groups a block of rows at a time (mechanism_auditor/blocks.py). Its peak is
# the larger of two phases, with n runs per side of w values and a learned critic of L inputs:
# - drawing D' (the second side): D's sample, D''s pieces and their concatenation, 3 x 4 w n bytes;
# - certifying: both samples (2 x 4 w n), the float32 features of the learned critic's training
#   split (TRAIN_SHARE n runs per side, and one side's copy again while it moves into JAX,
#   3 x 0.3 x 4 L n), and per run the groups' values, the critics' values and their sort orders
#   (TRAINING_BYTES_PER_RUN, measured).
# Measured (``/usr/bin/time -v`` maximum resident size of ``cbdp audit-training --data synthetic
# --examples 63 --sampler poisson --rate 0.125 --steps 16 --noise 0.5 --format json``, w = 81,
# L = 65, 2 cores shared, load 4 - 14, 2026-12-06): 1.075 GB at 10^5 runs per side, 2.120 GB at
# 10^6: 1161 bytes a run per side, against 12 w = 972 drawing and 8 w + 3.6 L = 882 certifying,
# so 280 bytes a run more for the certification's own arrays (benchmarks/training_audit_memory.py,
# the certification alone on stand-in rows: 537 bytes a run above the drawn samples, against
# 3.6 L + 280 = 514). The rest, about 0.96 GB, is the interpreter, JAX and the compiled programs:
# the 20% of the memory the check leaves free. At 10^7 runs per side (same command, --runs 10000000,
# 7020bea, load 1.3 - 3.1) the peak was 14.71 GB, 1375 bytes a run per side above the 0.96 GB: the
# critics' arrays at that size take 493 bytes a run, not 280 (larger sort and index dtypes, numpy's
# temporaries), so the constant is the larger, measured value. The model then gives 13.8 GB + 0.96.
TRAINING_BYTES_PER_RUN = 493
TRAIN_SHARE = 0.3  # AuditConfig.train_fraction's default: the learned critic's training split


def training_audit_bytes(runs: int, width: int, learned: int = 0) -> int:
    """Bytes a training audit holds at once for ``runs`` runs per side (see the comment above).

    Args:
      runs: Runs per side.
      width: Values each run records (the score and the release, float32).
      learned: Inputs of the learned critic (0: no learned group).

    """
    n, w = int(runs), max(int(width), 1)
    drawing = 12 * w * n
    learned_bytes = round(3 * TRAIN_SHARE * 4 * int(learned) * n)
    certifying = 8 * w * n + learned_bytes + TRAINING_BYTES_PER_RUN * n
    return max(drawing, certifying)


def check_memory_for_audit(
    samples: int, screen_samples: int, dim: int, noun: str = "samples", advice: str = "",
    needed: Callable[[int], int] | None = None,
) -> None:  # fmt: skip
    """Before an audit draws: the larger of its certification and screening samples must fit.

    ``needed(n)`` counts the bytes of ``n`` samples per side (default :func:`audit_bytes` of
    ``dim`` values; a training audit's release: :func:`training_audit_bytes`).
    """
    count = needed or (lambda n: audit_bytes(n, dim))
    for option, n in (("samples", samples), ("screen_samples", screen_samples)):
        each = f"{dim} value{'s' if dim > 1 else ''} each"
        check_fits(option, n, count(n), f"{n} {noun} per side ({each})", advice)


def sweep_bytes(members: int, *, batch_size: int, val_samples: int, eval_chunk: int, dim: int,
                units: int, itemsize: int = 4, max_batch: int = 256) -> int:  # fmt: skip
    """Bytes a sweep holds at once: one batch of members' samples and hidden units, every member's row.

    A compiled call trains at most ``max_batch`` members, each on a minibatch, its validation
    samples and one chunk of test samples per side (test samples stream chunk by chunk), with about
    three arrays of hidden units on the minibatch and the validation samples; each member's result
    row (about 1 KiB) stays on the host to the end.
    """
    batch = min(int(members), int(max_batch))
    rows = 2 * (int(batch_size) + int(val_samples) + int(eval_chunk))
    hidden = 3 * (int(batch_size) + int(val_samples)) * int(units)
    return batch * itemsize * (rows * int(dim) + hidden) + 1024 * int(members)


def _output_dim(pair, dtype) -> int:
    """The dimension of one output of the pair's mechanism (traced, never run)."""
    import jax

    from cbdp_jax._src.infra import keys

    shape = jax.eval_shape(lambda k: pair.sample(k, 1, dtype=dtype)[0], keys.from_seed(0)).shape
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


def check_memory_for_arrays(p: np.ndarray, q: np.ndarray, config) -> None:
    """Sample arrays: their copies in the configured dtype (shuffled parts, padding) must fit."""
    itemsize = np.dtype(config.dtype).itemsize
    needed = 3 * (p.shape[0] + q.shape[0]) * p.shape[1] * itemsize
    check_fits("p_samples", f"<array of shape {p.shape}>", needed, "the samples' copies")


__all__ = [
    "MEMORY_SHARE",
    "audit_bytes",
    "available_bytes",
    "check_fits",
    "check_memory_for_audit",
    "check_memory_for_arrays",
    "check_memory_for_draws",
    "check_representable",
    "critic_units",
    "estimate_bytes",
    "out_of_memory_text",
    "size_text",
    "sweep_bytes",
    "training_audit_bytes",
]
