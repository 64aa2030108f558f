"""Would one vmapped program train the candidate input maps faster than one training each? (issue 26)

Under ``input_map='auto'`` an outlier-heavy sample gets three candidate maps (standard, robust, rank),
each trained as its own problem: three training programs per direction. This times the same three
trainings two ways, alternated: three calls of the library's training program (as the estimator runs
them today), and one program that vmaps the same training body over a leading "view" axis (each view
with its own key, state and data, so it computes what the separate calls compute, up to float
rounding). Settings of ``vs_dp_auditorium.py --ours-settings short`` at 100k samples per side (MLP
32x2, 300 Adam steps, batch 2048, validation every 100 steps; 44,444 training and 11,111 validation
samples per side); synthetic data (the cost does not depend on the values).

Usage: python benchmarks/candidate_maps_training.py [--views 3] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, setup_device, write  # noqa: E402

from cbdp_jax._src.estimator import adversary_fitting, adversary_fitting_ensemble
from cbdp_jax._src.estimator import plan as estimator_plan
from cbdp_jax._src.infra import keys  # noqa: E402
from cbdp_jax.divergences import get_divergence  # noqa: E402
from cbdp_jax.estimator import EstimatorConfig  # noqa: E402


def main() -> None:
    ap = parser(__doc__.splitlines()[0], "benchmarks/measured/profile-warm/candidate-maps.json")
    ap.add_argument("--views", type=int, default=3, help="candidate maps trained")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each way, alternated")
    args = ap.parse_args()
    setup_device(args.device)
    config = EstimatorConfig(steps=300, ensemble=1, batch_size=2048, learning_rate=3e-3)
    spec = estimator_plan._as_spec("mlp", {"width": 32, "depth": 2})
    trainer = estimator_plan._trainer(spec, get_divergence("renyi", alpha=2.0), 1, config)
    rng = np.random.default_rng(0)

    def data(n: int, shift: float) -> jax.Array:
        return jnp.asarray(rng.normal(shift, 1.0, (args.views, n, 1)), jnp.float32)

    tp, tq, vp, vq = data(44_444, 0.0), data(44_444, 0.5), data(11_111, 0.0), data(11_111, 0.5)
    view_keys = keys.split(jax.random.key(0), num=args.views)
    states = [
        adversary_fitting_ensemble.init_ensemble(keys.split_array(view_keys[i], num=1), trainer, (tp[i], tq[i]),
                               learning_rate=config.learning_rate)
        for i in range(args.views)
    ]  # fmt: skip
    static = dict(
        trainer=trainer, steps=config.steps, eval_every=config.eval_every,
        batch_size=config.batch_size, sampler=None, progress=None, patience=config.patience,
    )  # fmt: skip

    def separate():
        return [
            adversary_fitting._train_jit(
                view_keys[i], states[i], tp[i], tq[i], vp[i], vq[i], **static
            )
            for i in range(args.views)
        ]

    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
    one_program = jax.jit(jax.vmap(functools.partial(adversary_fitting._train_body, **static)))

    def vmapped():
        return one_program(jnp.stack(list(view_keys)), stacked, tp, tq, vp, vq)

    times: dict[str, list[float]] = {"separate": [], "vmapped": []}
    cpu: dict[str, list[float]] = {"separate": [], "vmapped": []}
    for fn in (separate, vmapped):
        jax.block_until_ready(fn())  # compile
    for _ in range(args.repeats):
        for name, fn in (("separate", separate), ("vmapped", vmapped)):
            w0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    sep_best = np.array([float(o.best_value[0]) for o in separate()])
    vm_best = np.asarray(vmapped().best_value)[:, 0]
    med = {k: statistics.median(v) for k, v in times.items()}
    summary = {
        "views": args.views,
        "settings": {"steps": config.steps, "batch_size": config.batch_size, "mlp": "32x2"},
        "wall_s": times,
        "cpu_s": cpu,
        "median_wall_s": med,
        "speedup_vmapped_over_separate": med["separate"] / med["vmapped"],
        "max_abs_difference_best_value": float(np.max(np.abs(sep_best - vm_best))),
    }
    print(
        f"{args.views} trainings: separate {med['separate']:.3f} s, one vmapped program "
        f"{med['vmapped']:.3f} s (median of {args.repeats}): {summary['speedup_vmapped_over_separate']:.2f}x; "
        f"best validation values differ by up to {summary['max_abs_difference_best_value']:.2g}"
    )
    write(args.out, "candidate_maps_training", args, summary)


if __name__ == "__main__":
    main()
