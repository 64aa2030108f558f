"""Resumable sweeps with atomic, fingerprinted per-unit checkpoints (public API)."""

from cbdp_jax._src.infra.checkpoint import UnitReport as UnitReport
from cbdp_jax._src.infra.checkpoint import UnitStore as UnitStore
from cbdp_jax._src.infra.checkpoint import fingerprint as fingerprint

__all__ = ["UnitReport", "UnitStore", "fingerprint"]
