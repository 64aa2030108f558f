"""Deterministic GPU kernels for a process, asked of XLA before JAX starts its backend.

On a GPU, XLA's autotuning picks kernels by timing them, and reductions and scatters may use atomics,
so the last bits of a result can change from one compilation or run to the next; a trained critic
amplifies them. ``--xla_gpu_deterministic_ops=true`` in ``XLA_FLAGS`` makes them the same. The ``cbdp``
command sets it for its processes (so ``cbdp rerun`` is bit-identical) and the test suite for its own
(tests/conftest.py); a user's own process sets it itself (docs/guide/scaling.md, "On a GPU"). CPU
programs are unaffected.
"""

from __future__ import annotations

import os

FLAG = "xla_gpu_deterministic_ops"


def request_deterministic_gpu_ops() -> None:
    """Adds ``--xla_gpu_deterministic_ops=true`` to ``XLA_FLAGS`` unless the flag is there already.

    A value the user gave (``=false`` too) is kept. Takes effect only if called before JAX initialises
    its backend (importing ``cbdp_jax`` does not).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --{FLAG}=true".strip()
