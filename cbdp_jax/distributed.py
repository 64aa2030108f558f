"""Sweeps over several processes: a local launcher, one process of a multi-host job, failures (public API).

See ``cbdp sweep --help`` and README.md, "Sweeps, GPUs and several hosts".
"""

from cbdp_jax._src.estimator.sweep_job import SweepJob as SweepJob
from cbdp_jax._src.estimator.sweep_job import run_job as run_job
from cbdp_jax._src.estimator.sweep_job import run_sweep as run_sweep
from cbdp_jax._src.infra.launch import DistributedError as DistributedError
from cbdp_jax._src.infra.launch import ProcessSpec as ProcessSpec
from cbdp_jax._src.infra.launch import free_port as free_port
from cbdp_jax._src.infra.launch import initialize as initialize
from cbdp_jax._src.infra.launch import launch as launch

__all__ = [
    "DistributedError",
    "ProcessSpec",
    "SweepJob",
    "free_port",
    "initialize",
    "launch",
    "run_job",
    "run_sweep",
]
