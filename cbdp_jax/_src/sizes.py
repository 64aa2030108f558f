"""Sample sizes and values checked before anything is drawn or cast: memory, and the dtype's range.

A sample count whose arrays would not fit is refused in one line naming the parameter, the bytes
needed and the bytes available (instead of an allocation failure inside XLA), and sample values a
float32 cannot hold are refused instead of turning into infinities with a NumPy warning.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cbdp_jax._src.validation import InvalidParameterError

# Of the memory a check finds available, at most this share may hold the samples.
_MEMORY_SHARE = 0.8


def available_bytes() -> int | None:
    """Memory available to hold samples, in bytes; None when unknown.

    The default device's free memory where it reports it, else the host's ``MemAvailable``.
    """
    try:
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


def _check_memory(parameter: str, value: Any, needed: int) -> None:
    """Refuses ``value`` of ``parameter`` in one line when ``needed`` bytes would not fit."""
    free = available_bytes()
    if free is None or needed <= _MEMORY_SHARE * free:
        return
    raise InvalidParameterError(
        f"{parameter}={value!r} is invalid: its samples need about {_gib(needed)} of memory, "
        f"more than {_MEMORY_SHARE:.0%} of the {_gib(free)} available; use fewer samples"
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def check_memory_for_draws(pair, samples: int, val_samples: int, config, dtype) -> None:
    """Before drawing: the training and validation samples of both sides must fit.

    Counted with the training arrays' padding to a bucket; test samples are drawn chunk by chunk.
    """
    dim = _output_dim(pair, dtype)
    rows = 2 * (2 * samples + val_samples) + 2 * min(samples, config.eval_chunk)
    _check_memory("samples", samples, rows * dim * jnp.dtype(dtype).itemsize)


def _output_dim(pair, dtype) -> int:
    """The dimension of one output of the pair's mechanism (traced, never run)."""
    shape = jax.eval_shape(lambda k: pair.sample(k, 1, dtype=dtype)[0], jax.random.key(0)).shape
    return int(np.prod(shape[1:])) if len(shape) > 1 else 1


def check_memory_for_arrays(p: np.ndarray, q: np.ndarray, config) -> None:
    """The arrays' copies in the configured dtype (shuffled parts, padding) must fit."""
    itemsize = jnp.dtype(config.dtype).itemsize
    rows = 3 * (p.shape[0] + q.shape[0])
    _check_memory("p_samples", f"<array of shape {p.shape}>", rows * p.shape[1] * itemsize)


def check_representable(p: tuple[str, np.ndarray], q: tuple[str, np.ndarray], config) -> None:
    """Samples beyond the configured dtype's range would become infinite when cast: refused."""
    largest = float(np.finfo(np.dtype(config.dtype)).max)
    for name, arr in (p, q):
        if arr.dtype.kind == "f" and arr.size and float(np.max(np.abs(arr))) > largest:
            raise InvalidParameterError(
                f"{name} is invalid: a value of magnitude {float(np.max(np.abs(arr))):.3g} exceeds "
                f"the largest {config.dtype} ({largest:.3g}); rescale the samples, or use "
                "dtype='float64' (with jax_enable_x64)"
            )


__all__ = [
    "available_bytes",
    "check_memory_for_arrays",
    "check_memory_for_draws",
    "check_representable",
]
