"""Resumable sweeps with atomic per-unit checkpoints (public API)."""

from cbdp_jax._src.checkpoint import UnitStore as UnitStore

__all__ = ["UnitStore"]
