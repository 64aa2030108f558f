"""The cost of the noise probes on the command line's default problem (digits, logreg, T = 100).

Times ``prepare`` without and with the probes in one fresh process (compilation cache off, so the
first probe includes its compilation), then the probes again on the kept program (their run alone).

    CBDP_JAX_COMPILATION_CACHE=0 python benchmarks/noise_probes_cost.py --device cpu \\
        --out benchmarks/measured/noise-probes/cost.json
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax import training_audit as ta  # noqa: E402
from cbdp_jax._src.training_auditor.noise_probes import noise_defects  # noqa: E402


def main() -> None:
    args = parser("The cost of the noise probes", "noise-probes-cost.json").parse_args()
    setup_device(args.device)
    load = os.getloadavg()
    problem = ta.build_problem()
    start = time.perf_counter()
    prep = ta.prepare(problem, noise_probes=False)
    without = time.perf_counter() - start
    tx = problem.step_for(problem.examples)
    times = []
    for i in range(2):  # the first compiles, the second reuses the program
        start = time.perf_counter()
        noise_defects(jax.random.key(i), problem, tx, prep)
        times.append(time.perf_counter() - start)
    cpu = time.process_time()
    out = {"prepare_without_probes_s": without, "probes_first_s": times[0],
           "probes_again_s": times[1], "process_cpu_s": cpu, "load_before": load,
           "load_after": os.getloadavg()}  # fmt: skip
    print(out)
    write(args.out, "noise_probes_cost", args, out)


if __name__ == "__main__":
    main()
